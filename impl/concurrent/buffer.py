"""A prioritized replay buffer in shared memory, used concurrently by threads and processes.

:class:`SharedPrioritizedBuffer` puts a registered variant's tree and its columnar storage in
one :class:`~impl.concurrent.shm.SharedArena`, next to the ring state
(:class:`~impl.concurrent.ring.SharedRing`: tickets, per-slot stamps, the in-flight writer
table, counters, and the locks' words). How inserts, samples and updates synchronise is the
policy's job (:mod:`impl.concurrent.policy`, one module per policy in
``impl/concurrent/policies/``); this module validates every call, assembles the parts and
hands them to the policy.

What every call guarantees, whatever the policy: bad input raises an error naming the
argument and the value before anything is reserved or written, so a refused call changes
nothing; no sample returns a torn row or a slot being written (the copy is stamp-checked and
redrawn, see :mod:`impl.concurrent.ring`).

One compiled call per operation (:mod:`impl.concurrent.fused`): where the policy declares a
protocol for it (every registered policy, for all three operations), ``sample``, ``add`` and
``update_priorities`` check their arguments in Python and make one ``nogil`` kernel call that
takes the lock, draws, copies and computes the weights (or reserves, copies, publishes; or
drops stale updates and writes the tree). When the kernel cannot finish alone (the lock
stays held past its spin budget, a sample must wait for inserts, an insert would lap a
writer still copying) the call runs the policy's Python methods instead, which sleep, time
out and recover dead holders; :attr:`fallbacks` counts those calls.
``sample(..., out=buf.sample_out(n))`` reuses its output arrays. Each kernel gets the
object's kernel context (:mod:`impl.concurrent.context`, built once here) and the call's own
arguments. A policy may bring its own kernel set in the same calling convention
(:attr:`Policy.kernels`, the sharded one), its own shared arrays and a tree composed of several
(:meth:`Policy.tree_for`, ``shards``).

Closing (:mod:`impl.concurrent.guard`): :meth:`~SharedPrioritizedBuffer.close` refuses new
calls, waits for the calls other threads have in flight on the object, then lets the memory
go. Afterwards every method, and every part the object handed out (``tree``, ``storage``,
``ring``, the locks), raises :class:`~impl.concurrent.guard.BufferClosed` (a ValueError
whose message starts "buffer is closed") naming what was used; raw arrays reached through a
part stay valid memory until dropped (:mod:`impl.concurrent.shm`), so nothing can crash the
interpreter. Each public call pays for the in-flight count: about 0.15-0.3 us.

Usage::

    buf = SharedPrioritizedBuffer.create(capacity, fields, variant="kary-aligned", policy="lazy-writing")
    # in another process (or thread): child = SharedPrioritizedBuffer.attach(buf.handle)
    slots = buf.add({"obs": ..., ...}); batch = buf.sample(256)
    buf.update_priorities(batch["indices"], td_errors, batch["stamps"])
    buf.close()   # the owner's close also frees the shared memory

Thread-safety: every method may be called from any number of processes. Within one process,
give each thread its own object (``attach(handle)`` again): an object's random generator and
lock statistics are not shared between threads. Threads that do share one object may still
close it while the others call: close waits for their calls in flight.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

from .. import machine, registry
from ..buffers import PrioritizedReplayBuffer, SampleOut, make_sample_out
from ..trees import kernels
from ..trees.base import as_indices, as_priorities, raise_for_status
from . import fused
from .context import KernelContext, out_context
from .guard import BufferClosed, CallGate, GuardedView, guarded
from .locks import SharedLock, my_token
from .policy import Parts, get as get_policy
from .ring import LEAF_LOCK, MAX_READERS, READERS_AT, TREE_LOCK, Reservation, SharedRing, ring_arrays
from .shm import ArenaSpec, SharedArena

__all__ = ["BufferHandle", "SharedPrioritizedBuffer", "SharedSampleOut", "BufferClosed", "MAX_REDRAWS"]

MAX_REDRAWS = fused.MAX_CHANGED_ROUNDS  # rounds of redrawing rows whose slot changed during a sample's copy
DEFAULT_TIMEOUT = 120.0  # seconds a call waits for a lock, or for a lapped writer, before TimeoutError


class SharedSampleOut(SampleOut):
    """Reusable output of :meth:`SharedPrioritizedBuffer.sample` (from its ``sample_out``): the
    fields, ``indices``, ``weights`` and ``stamps`` (int64), refilled in place by each call."""

    __slots__ = ("stamp", "octx")  # octx: the sample kernel's output context, made once


_NO_VALUES = np.empty(0, dtype=np.float64)
_INT64 = np.dtype(np.int64)
#: Bytes a sample's output takes per draw beside its row: the index and stamp (int64), the
#: weight (float32) and the kernel's float64 scratch.
_OUT_BYTES_PER_DRAW = 8 + 8 + 4 + 8
#: Outputs smaller than this are not checked against the memory available (that reads
#: /proc/meminfo and the cgroup's files, tens of microseconds: ``sample`` without ``out=``
#: makes an output every call); a failed allocation of one says so itself.
_CHECK_MEMORY_FROM = 2**30
_MOST_BYTES = 2**63 - 1  # what the byte counts (int64) can hold, whatever the memory
_NO_STAMPS = np.empty(0, dtype=np.int64)


@dataclass(frozen=True)
class BufferHandle:
    """Picklable description of a shared buffer: enough for another process to attach."""

    arena: ArenaSpec
    variant: str
    params: tuple  # sorted (name, value) pairs given to registry.create
    capacity: int
    fields: tuple  # ((name, shape, dtype str), ...)
    policy: str
    resum_every: int
    shards: int = 1  # sub-trees of a sharding policy (Policy.shard_count)
    storage: str = ""  # the creator's storage layout, "auto" resolved: attach builds this one, never re-chooses


def _schema(fields: tuple) -> dict:
    return {name: (shape, dtype) for name, shape, dtype in fields}


def _with_layout(variant: str, params: dict, storage: str) -> dict:
    """``params`` with ``storage`` in place of an ``"auto"`` (or absent) storage parameter, where
    the variant takes one; ``params`` themselves otherwise."""
    if storage and params.get("storage", "auto") == "auto" and "storage" in registry.get(variant).accepted():
        return {**params, "storage": storage}
    return params


def _local_buffer(variant: str, capacity: int, fields: dict, params: dict,
                  storage: str = "") -> PrioritizedReplayBuffer:
    """The variant's in-process buffer; ``storage``: the layout it must have (a handle's), which
    replaces an ``"auto"`` storage parameter, so that no process re-chooses it from its own cache
    sizes (mapping rows as columns samples garbage)."""
    params = _with_layout(variant, params, storage)
    buf = registry.create(variant, capacity, fields, **params)
    built = getattr(getattr(buf, "storage", None), "layout", storage)
    if storage and built != storage:
        raise ValueError(f"variant {variant!r} built storage {built!r} for a buffer created with "
                         f"storage {storage!r} (params {params!r}): it cannot be attached")
    tree = getattr(buf, "tree", None)
    if not isinstance(buf, PrioritizedReplayBuffer) or not hasattr(tree, "shared_arrays"):
        raise ValueError(f"variant {variant!r} cannot be shared: it must be a PrioritizedReplayBuffer over a tree "
                         "with shared_arrays()/bind_arrays() (every array tree has them)")
    return buf


#: The storage schema of the throwaway buffers a sharding policy's sub-trees are built from (only
#: their trees are kept): one byte a row, so no row-sized memory is allocated for them.
_TREE_ONLY_FIELDS = {"_": ((), "uint8")}


def _policy_tree(policy_cls, local: PrioritizedReplayBuffer, variant: str, params: dict, shards: int):
    """The tree the buffer works on: the variant's, or what a sharding policy composes from
    ``shards`` trees of the same variant (:meth:`Policy.tree_for`)."""
    def make_tree(n_leaves: int):
        return registry.create(variant, n_leaves, _TREE_ONLY_FIELDS, **params).tree

    return policy_cls.tree_for(local.tree, make_tree, local.capacity, shards)


def _check_timeout(timeout) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or not 0.0 < timeout < math.inf:
        raise ValueError(f"timeout must be a positive finite number of seconds, got {timeout!r}")
    return float(timeout)


class SharedPrioritizedBuffer:
    """Proportional prioritized replay (as :class:`~impl.buffers.PrioritizedReplayBuffer`)
    whose state lives in shared memory; ``policy`` decides the synchronisation.

    Costs are the tree's plus the policy's locking; a sample copies its rows once more only
    when a slot changed during the copy. Memory: the tree, ``capacity`` rows, and 8 bytes of
    stamp per slot, in one shared segment.
    """

    def __init__(self, handle: BufferHandle, arena: SharedArena, local: PrioritizedReplayBuffer, seed=None,
                 timeout: float = DEFAULT_TIMEOUT):
        self.handle = handle
        self._gate = CallGate("the buffer", handle.arena.name)  # every public call is counted on it
        self._timeout = timeout
        self._arena = arena
        policy_cls = get_policy(handle.policy)
        self._tree = _policy_tree(policy_cls, local, handle.variant, dict(handle.params), handle.shards)
        self._storage = local.storage
        self.alpha, self.beta, self.eps, self.stratified = local.alpha, local.beta, local.eps, local.stratified
        self._resolved = dict(local.resolved_params)
        a = arena.arrays
        self._tree.bind_arrays({k[len("tree."):]: v for k, v in a.items() if k.startswith("tree.")})
        self._tree.resum_every = 2**62  # re-summing is counted in the shared control block instead
        self._storage.bind(a["storage.arena"])
        self._ring = SharedRing({k: a[k] for k in ring_arrays(handle.capacity)}, self._tree, handle.capacity,
                                handle.resum_every)
        self._tree_lock = SharedLock(self._ring.control, TREE_LOCK, "tree", on_recover=self._recover_tree_lock,
                                     timeout=timeout, readers=range(READERS_AT, READERS_AT + MAX_READERS))
        self._leaf_lock = SharedLock(self._ring.control, LEAF_LOCK, "leaves", timeout=timeout)
        self._rng = np.random.default_rng(seed)
        self._out_row_bytes = sum(spec.nbytes for spec in self._storage.specs.values()) + _OUT_BYTES_PER_DRAW
        self._out_pad_bytes = 64 * (len(self._storage.specs) + 5)  # each array's alignment, at most a line
        # This object's statistics of the lock taken inside the fused kernels (the SharedLock
        # objects count the rest).
        self._lockstats = np.zeros(fused.LOCKSTATS_SIZE)  # with the clock's scratch: one per object, as the rng
        own = {k[len("policy."):]: v for k, v in a.items() if k.startswith("policy.")}
        self._policy = policy_cls(Parts(self._tree, self._storage, self._ring, self._tree_lock, self._leaf_lock,
                                        self.alpha, self.eps, self.stratified, own))
        self._kernels = self._policy.kernels or fused
        if self._policy.fused_insert == fused.LAZY and self._policy.fused_apply != fused.APPLY_WHOLE:
            raise ValueError(f"policy {handle.policy!r}: the LAZY insert protocol needs fused_apply APPLY_WHOLE (its "
                             f"zero fill writes leaves and inner nodes together), got {self._policy.fused_apply!r}")
        # The kernels' view of this object's state, built once (impl.concurrent.context): every
        # fused call passes it, the tree's sums and mins, the caller's token and its own arguments.
        self._ctx = KernelContext(self._tree.kernel_args, {k: a[k] for k in ring_arrays(handle.capacity)},
                                  self._lockstats, self._storage.arena, self._storage.table,
                                  resum_every=handle.resum_every, capacity=handle.capacity,
                                  stratified=self.stratified, rounds=getattr(self._policy, "ROUNDS", 0),
                                  sample_protocol=self._policy.fused_sample, insert_protocol=self._policy.fused_insert,
                                  apply_mode=self._policy.fused_apply, eps=self.eps, alpha=self.alpha,
                                  vmax=self._tree.max_leaf, extras=self._policy.kernel_extra())
        self._cw, self._sums, self._mins = self._ctx.words, self._ctx.sums, self._ctx.mins

    # ------------------------------------------------------------------ construction
    @classmethod
    def create(cls, capacity: int, fields, *, variant: str = "kary-aligned", policy: str = "lazy-writing",
               seed=None, resum_every: int | None = None, timeout: float = DEFAULT_TIMEOUT, shards=None,
               **params) -> "SharedPrioritizedBuffer":
        """Allocate a shared buffer of registered ``variant`` (owned by this process).

        ``params`` go to the variant (K, dtype, alpha, beta, eps, stratified). ``timeout``:
        seconds this object's calls wait for a lock, or for a writer whose slots they would
        overtake, before raising TimeoutError naming the holder's pid. Raises ValueError for
        an unknown policy, a variant that cannot be shared, or a bad argument (named), and
        NotImplementedError when ``policy`` needs a capability the structure lacks
        (pal-locks and deferred need split updates, which kary-prefix lacks). ``shards``: the
        sub-trees of a sharding policy (None: its default; other policies take None or 1).
        """
        timeout = _check_timeout(timeout)
        policy_cls = get_policy(policy)
        shards = policy_cls.shard_count(shards)
        local = cls._checked_local(capacity, fields, variant, policy, params)
        capacity = local.capacity
        if resum_every is None:
            resum_every = local.tree.resum_every
        if isinstance(resum_every, bool) or not isinstance(resum_every, numbers.Integral) or resum_every < 1:
            raise ValueError(f"resum_every must be a positive integer, got {resum_every!r}")
        tree_arrays = _policy_tree(policy_cls, local, variant, params, shards).shared_arrays()
        layout = {f"tree.{k}": (v.shape, v.dtype) for k, v in tree_arrays.items()}
        layout["storage.arena"] = (local.storage.arena.shape, local.storage.arena.dtype)
        layout.update(ring_arrays(capacity))
        layout.update({f"policy.{k}": v for k, v in policy_cls.shared_arrays(capacity, shards).items()})
        arena = SharedArena.create(layout, tag=policy.replace("-", ""))
        try:
            for k, v in tree_arrays.items():
                arena.arrays[f"tree.{k}"][...] = v
            SharedRing.initialise(arena.arrays)
            fields_t = tuple((s.name, s.shape, s.dtype.str) for s in local.storage.specs.values())
            handle = BufferHandle(arena.spec, variant, tuple(sorted(params.items())), capacity, fields_t, policy,
                                  int(resum_every), shards, local.storage.layout)
            return cls(handle, arena, local, seed, timeout)
        except BaseException:
            arena.close()
            raise

    @classmethod
    def check(cls, capacity: int, fields, *, variant: str = "kary-aligned", policy: str = "lazy-writing",
              shards=None, **params) -> None:
        """Raise what :meth:`create` would raise for these arguments, without shared memory.

        The same checks, in the same order (policy name, the variant's own parameter checks
        through ``registry.create``, shareability, the reserved field name, the policy's fit to
        the structure), on an in-process buffer that is then dropped. Cost: one
        ``registry.create`` of ``capacity`` slots (a tree and storage of that size, no kernel
        call); callers check at a small capacity to keep it microseconds.
        """
        get_policy(policy).shard_count(shards)
        cls._checked_local(capacity, fields, variant, policy, params)

    @staticmethod
    def _checked_local(capacity, fields, variant: str, policy: str, params: dict) -> PrioritizedReplayBuffer:
        policy_cls = get_policy(policy)
        local = _local_buffer(variant, capacity, fields, params)
        if "stamps" in local.storage.specs:
            raise ValueError("field name 'stamps' is reserved for sample() output of shared buffers")
        policy_cls.check_structure(local.tree)
        return local

    @classmethod
    def attach(cls, handle: BufferHandle, seed=None, timeout: float = DEFAULT_TIMEOUT) -> "SharedPrioritizedBuffer":
        """Map an existing shared buffer (in another process, or for another thread).
        ``timeout`` as for :meth:`create`, for this object's calls."""
        if not isinstance(handle, BufferHandle):
            raise TypeError(f"handle must be a BufferHandle, got {type(handle).__name__}")
        timeout = _check_timeout(timeout)
        get_policy(handle.policy)
        arena = SharedArena.attach(handle.arena)
        try:
            local = _local_buffer(handle.variant, handle.capacity, _schema(handle.fields), dict(handle.params),
                                  handle.storage)
            return cls(handle, arena, local, seed, timeout)
        except BaseException:
            arena.close()
            raise

    def close(self) -> None:
        """Refuse new calls, wait for the calls other threads have in flight on this object,
        then unmap; the owner also unlinks the segment (other processes then fail to attach;
        those attached keep their mapping). Idempotent and thread-safe.

        Afterwards every method and every part handed out raises BufferClosed. Raises
        TimeoutError (the object stays open) when calls are still in flight after twice this
        object's ``timeout``, and RuntimeError when called from inside one of this object's
        calls on the same thread (a signal handler), which could never drain.
        """
        # Twice the lock timeout: a call in flight gives up on a lock (or a lapped writer) after
        # one timeout, and may have taken another lock before.
        if not self._gate.shut(2.0 * self._timeout):
            return
        arena = self._arena
        self._arena = self._tree = self._storage = self._ring = self._policy = None
        self._tree_lock = self._leaf_lock = None
        # the kernel context's addresses die with the mapping: drop it first (no call is in flight)
        self._ctx = self._cw = self._sums = self._mins = None
        arena.close()

    @property
    def closed(self) -> bool:
        return self._gate.shut_down

    # A copy would share this object's mapping, locks' statistics and call gate (closing the
    # copy closed the original), and a pickle cannot carry a mapping: the handle is the one
    # way to reach the buffer from elsewhere, so both are refused, saying so.
    def _refuse_copy(self, what: str):
        raise TypeError(f"a SharedPrioritizedBuffer cannot be {what}: pass its handle (buf.handle, picklable) and "
                        f"call SharedPrioritizedBuffer.attach(handle) in the other process or thread")

    def __reduce_ex__(self, protocol):
        self._refuse_copy("pickled or copied")

    def __copy__(self):
        self._refuse_copy("copied")

    def __deepcopy__(self, memo):
        self._refuse_copy("copied")

    @guarded
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # ------------------------------------------------------------------ the parts
    @property
    @guarded
    def tree(self):
        """The tree over the shared arrays (for inspection: use it under :attr:`tree_lock`).

        This and the other parts come wrapped in a :class:`~impl.concurrent.guard.GuardedView`:
        attribute reads and calls work as on the part itself until :meth:`close`, then raise
        BufferClosed naming the part."""
        return GuardedView(self._tree, self._gate, "its tree (buf.tree)")

    @property
    @guarded
    def storage(self):
        """The columnar storage over the shared columns (for inspection)."""
        return GuardedView(self._storage, self._gate, "its storage (buf.storage)")

    @property
    @guarded
    def ring(self):
        """The shared ring state: tickets, stamps, in-flight writers, counters."""
        return GuardedView(self._ring, self._gate, "its ring (buf.ring)")

    @property
    @guarded
    def tree_lock(self):
        return GuardedView(self._tree_lock, self._gate, "its tree_lock (buf.tree_lock)")

    @property
    @guarded
    def leaf_lock(self):
        return GuardedView(self._leaf_lock, self._gate, "its leaf_lock (buf.leaf_lock)")

    # ------------------------------------------------------------------ public API
    @property
    @guarded
    def resolved_params(self) -> dict:
        """The speed parameters this object runs with, ``"auto"`` resolved, as
        :attr:`impl.buffers.ReplayBuffer.resolved_params` (``storage`` is the creator's, from the
        handle, in every process): what a result row records beside the asked-for parameters."""
        return dict(self._resolved)

    @property
    @guarded
    def capacity(self) -> int:
        return self.handle.capacity

    @property
    @guarded
    def owner(self) -> bool:
        return self._arena.owner

    @property
    @guarded
    def inserted(self) -> int:
        """Transitions reserved so far by all writers (tickets handed out)."""
        return self._ring.inserted

    @guarded
    def __len__(self) -> int:
        return self._len()

    @property
    @guarded
    def max_priority(self) -> float:
        return self._ring.max_priority

    @property
    @guarded
    def lock_wait_seconds(self) -> float:
        """Seconds this object's callers spent waiting for the buffer's locks (in kernels and in Python)."""
        return (self._tree_lock.wait_seconds + self._leaf_lock.wait_seconds + self._policy.lock_wait_seconds()
                + float(self._lockstats[fused.WAIT_S]))

    @property
    @guarded
    def kernel_calls(self) -> int:
        """Calls of this object that ran in a fused kernel (each kernel counts itself; a call the
        kernel then handed to Python counts here and in :attr:`fallbacks`). A policy whose
        operations all have kernels runs every call through one, so tests check the fused path,
        not the Python one, is what they exercise."""
        return int(self._lockstats[fused.KERNEL_CALLS])

    @property
    @guarded
    def lock_hold_seconds(self) -> float:
        """Seconds this object's callers held the tree lock exclusively (the lock every policy
        serialises its tree work on; the leaf lock is only taken inside it), in kernels and in
        Python. A draw's shared hold is not counted: it excludes writers only, so it is no
        serial part of two samplers' work."""
        return self._tree_lock.hold_seconds + float(self._lockstats[fused.HOLD_S])

    @property
    @guarded
    def fallbacks(self) -> int:
        """Calls of this object that a fused kernel handed to the policy's Python methods (a
        lock held past the kernel's spin budget, a wait for inserts, a lapped writer)."""
        return int(self._lockstats[fused.FALLBACKS])

    @guarded
    def counters(self) -> dict:
        """Buffer-wide event counts (all processes): rebuilds, recoveries, stale updates
        skipped, rows redrawn because their slot changed during a copy, slots voided."""
        return self._policy.counters()

    @guarded
    def add(self, batch, priorities=None) -> np.ndarray:
        """Append a batch; returns its ring slots. New transitions get the max priority
        unless ``priorities`` (raw, transformed like updates) are given. Everything is
        validated before anything is reserved (fields, and every ``(p + eps) ** alpha``
        against what the tree can hold), so a refused batch changes nothing."""
        arrays, n = self._storage.check_batch(batch)
        vals = None
        if priorities is not None:
            vals = as_priorities(priorities, n)
            self._check_new_priorities(vals)
        cap = self.handle.capacity
        keep = min(n, cap)
        if keep == 0:
            return np.empty(0, dtype=np.int64)
        if vals is not None and keep < n:
            vals = vals[n - keep:]
        protocol = self._policy.fused_insert
        if protocol is not None:
            status, first, row = self._kernels.add(*self._add_args(vals, self._storage.as_bytes(arrays, n - keep, keep),
                                                                   keep))
            if status == fused.STATUS_OK:
                return self._ring.slots(first, keep)
            self._lockstats[fused.FALLBACKS] += 1
            if status == fused.STATUS_LEAF_BUSY:  # reserved and copied, the tree lock still held: finish under it
                try:
                    self._policy.set_new_priorities(first, keep, vals)
                    self._ring.publish(Reservation(first, row, 0), keep)
                finally:
                    fused.release_held(self._cw, my_token())
                return self._ring.slots(first, keep)
            if status == fused.STATUS_PUBLISH_BUSY:  # reserved and copied: publish as the policy does
                self._policy.finish_insert(Reservation(first, row, 0), keep, vals)
                return self._ring.slots(first, keep)
        if keep < n:
            arrays = {k: v[n - keep:] for k, v in arrays.items()}
        first = self._policy.insert(arrays, keep, vals)
        return self._ring.slots(first, keep)

    @guarded
    def sample_out(self, batch_size: int) -> SharedSampleOut:
        """Output arrays for ``sample(batch_size, out=...)``, reused across calls (no allocation
        per call). Belongs to this object. ValueError naming ``batch_size`` for one that is not a
        positive integer, or whose arrays (rows, indices, weights, stamps) need more bytes than
        the memory available (checked from 1 GiB on) or than an int64 counts; nothing is
        allocated then."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        need = int(batch_size) * self._out_row_bytes + self._out_pad_bytes
        if need >= _CHECK_MEMORY_FROM:
            room = machine.available_memory_bytes()
            if need > _MOST_BYTES:
                raise ValueError(f"batch_size={batch_size} is too large: its sample's output arrays would need "
                                 f"{need} bytes ({self._out_row_bytes} a draw), more than an int64 counts "
                                 f"({_MOST_BYTES} bytes)")
            if room is not None and need > room:
                raise ValueError(f"batch_size={batch_size} is too large: its sample's output arrays would need "
                                 f"{need} bytes ({need / 2**30:.3g} GiB, {self._out_row_bytes} a draw), but only "
                                 f"{room} bytes ({room / 2**30:.3g} GiB) of memory are available")
        out = make_sample_out(SharedSampleOut(), self, self._storage, int(batch_size))
        out.stamp = out["stamps"] = np.empty(int(batch_size), dtype=np.int64)
        out.octx = out_context(out.block, out.block_table, out.index, out.weight, out.stamp, out.scratch,
                               out.src_table, False)
        return out

    @guarded
    def sample(self, batch_size: int, beta: float | None = None, rng=None, out=None) -> dict[str, np.ndarray]:
        """Draw ``batch_size`` rows, ``P(i) = p_i / total``: the fields plus ``indices``,
        ``weights`` (float32, ``(p_i / p_min) ** -beta``) and ``stamps`` (pass them back to
        :meth:`update_priorities`). ``rng``: a numpy Generator (default this object's); one key
        per call is taken from it (:mod:`impl.fused_ops`). ``out``: arrays from :meth:`sample_out`,
        refilled and returned. Raises ValueError when nothing is sampleable yet, and for a
        ``batch_size`` whose output could not be held (:meth:`sample_out`), before any draw."""
        beta = self.beta if beta is None else beta
        # The common case (plain int and float in range, this object's generator and out) is
        # checked first: it is the Python every call pays for.
        if not (type(batch_size) is int and batch_size >= 1 and type(beta) is float and 0.0 <= beta <= 1.0):
            if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
                raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
            if isinstance(beta, bool) or not isinstance(beta, numbers.Real) or not 0.0 <= beta <= 1.0:
                raise ValueError(f"beta must be a number in [0, 1], got {beta!r}")
            batch_size, beta = int(batch_size), float(beta)
        if rng is None:
            rng = self._rng
        elif type(rng) is not np.random.Generator and not isinstance(rng, np.random.Generator):
            raise TypeError(f"rng must be a numpy.random.Generator or None, got {rng!r}")
        n = batch_size
        if out is None:
            out = self.sample_out(n)
        elif type(out) is not SharedSampleOut or out.owner is not self or out.batch_size != n:
            raise ValueError(f"out must come from this buffer's sample_out({n}), got {type(out).__name__}"
                             + (f" for batch_size {out.batch_size}" if isinstance(out, SampleOut) else ""))
        protocol = self._policy.fused_sample
        if protocol is not None:  # the kernel says whether the buffer is empty (one load, no Python read)
            status = self._kernels.sample(self._cw, self._sums, self._mins, my_token(),
                                          rng.bit_generator.random_raw() >> 1, beta, out.octx)
            if status == fused.STATUS_OK:
                return out
            if status != fused.STATUS_EMPTY:
                self._lockstats[fused.FALLBACKS] += 1
                for _ in range(self._policy.kernel_retries):
                    self._policy.await_kernel_locks()
                    status = self._kernels.sample(self._cw, self._sums, self._mins, my_token(),
                                                  rng.bit_generator.random_raw() >> 1, beta, out.octx)
                    if status == fused.STATUS_OK:
                        return out
        if self._ring.inserted == 0:
            raise ValueError("cannot sample from an empty buffer: add transitions first")
        return self._sample_python(n, beta, rng, out)

    def _sample_python(self, n: int, beta: float, rng, out: SharedSampleOut) -> SharedSampleOut:
        """The policy's own select (its waits, timeouts and recovery), then the copy and its
        seqlock check, into ``out``."""
        sel = self._policy.select(n, rng)
        rows = sel.rows
        if rows is None:  # copied outside the lock: redraw rows whose slot changed meanwhile
            rows = self._storage.gather(sel.indices)
            self._redraw_changed(sel, rows, rng)
        for name, col in rows.items():
            out[name][...] = col
        out.index[:] = sel.indices
        out.weight[:] = np.power(sel.priorities / sel.p_min, -beta)
        out.stamp[:] = sel.stamps
        return out

    @guarded
    def update_priorities(self, indices, priorities, stamps=None) -> int:
        """Set raw priorities of sampled slots; returns how many were applied.

        With ``stamps`` (from :meth:`sample`), a slot whose transition has since been replaced
        is skipped; without, only slots being written are skipped. Invalid input raises an
        error naming the first bad entry and changes nothing.
        """
        idx = as_indices(indices)
        vals = as_priorities(priorities, idx.shape[0])
        if stamps is not None and not (type(stamps) is np.ndarray and stamps.dtype == _INT64
                                       and stamps.shape == idx.shape and stamps.flags.c_contiguous):
            stamps = np.asarray(stamps)
            if stamps.shape != idx.shape or stamps.dtype.kind not in "iu":
                raise ValueError(f"stamps must be an integer array shaped like indices {idx.shape}, got "
                                 f"{stamps.dtype} {stamps.shape}")
            stamps = np.ascontiguousarray(stamps, dtype=np.int64)
        if self._policy.fused_update:
            status, pos, applied = self._kernels.update(*self._update_args(idx, vals, stamps))
            if status == fused.STATUS_OK:
                return int(applied)
            if status < fused.STATUS_BUSY:  # a bad entry, found before anything was written
                raise_for_status(status, pos, idx, vals, applied, "priorities", eps=self.eps, alpha=self.alpha,
                                 vmax=self._tree.max_leaf)  # (`applied`: here the n_valid checked against)
            self._lockstats[fused.FALLBACKS] += 1
        n_valid = self._len()
        # every entry checked before any state changes, the overflow of (p + eps) ** alpha too:
        # the policy drops stale entries (and counts them) before its tree write would refuse one
        status, pos, _, _ = kernels.checked_values(idx, vals, n_valid, self.eps, self.alpha, self._tree.max_leaf)
        if status != kernels.STATUS_OK:
            raise_for_status(status, pos, idx, vals, n_valid, "priorities", eps=self.eps, alpha=self.alpha,
                             vmax=self._tree.max_leaf)
        return self._policy.update(idx, vals, stamps)

    @guarded
    def total(self) -> float:
        """Root total once pending work has reached the inner nodes (deferred drains first)."""
        with self._tree_lock:
            self._policy.flush()
            return self._tree.total()

    @guarded
    def priorities(self, indices) -> np.ndarray:
        """Stored priorities ``(p + eps) ** alpha`` of ``indices`` (float64)."""
        return self._policy.read_priorities(as_indices(indices))

    @guarded
    def warm_up(self) -> None:
        """Load (or compile) every kernel this buffer's policy calls, on a small private
        buffer of the same variant, so the first timed operation does not pay for it."""
        h = self.handle
        local = _local_buffer(h.variant, 64, _schema(h.fields), dict(h.params), h.storage)
        tree, rng = local.tree, np.random.default_rng(0)
        idx = np.arange(8, dtype=np.int64)
        tree.fill(0, 64, 1.0)
        tree.update(idx, np.ones(8))
        tree.sample(8, rng)
        tree.get(idx)
        tree.rebuild()
        local.storage.write(0, local.storage.gather(idx), 8)  # the storage's copy kernels
        if self._policy.requires_split_updates:
            tree.propagate(*tree.write_leaves(idx, np.ones(8))[:2])
        self._check_new_priorities(np.ones(8))
        self._tree_lock.holder()
        # The fused kernels, through the same calls on a small buffer of the same kind.
        small = SharedPrioritizedBuffer.create(64, _schema(h.fields), variant=h.variant, policy=h.policy, seed=0,
                                               shards=h.shards, **_with_layout(h.variant, dict(h.params), h.storage))
        try:
            rows = {name: np.zeros((8, *shape), dtype) for name, shape, dtype in h.fields}
            small.add(rows)
            small.add(rows, np.ones(8))
            out = small.sample(8)
            small.update_priorities(out["indices"], np.ones(8), out["stamps"])
            with small.tree_lock:  # the Python lock's calls (its scan of the reader words)
                pass
        finally:
            small.close()

    @guarded
    def kernel_args(self, op: str, out=None, beta: float | None = None, key: int = 0, indices=None,
                    priorities=None, stamps=None, batch=None) -> tuple:
        """The argument tuple the fused kernel of ``op`` gets from the call (the calling convention
        of :mod:`impl.concurrent.context`), for measuring the kernel alone: run it as
        ``buf.kernels.<op>(*args)`` or from a compiled loop (:mod:`bench.concurrency_workers`).
        ``"sample"`` into ``out`` (from :meth:`sample_out`) with ``key``: ``(ctx, sums, mins,
        token, key, beta, octx)``; ``"update"`` of ``indices`` to checked ``priorities``
        (``stamps`` optional): ``(ctx, sums, mins, token, indices, values, sampled,
        use_sampled)``; ``"add"`` of ``batch`` (a dict of field arrays, at most ``capacity``
        rows, new rows at the max priority): ``(ctx, sums, mins, token, values, rows, keep)``.
        The token is the calling thread's. The same for every policy, its own kernel set's too
        (:attr:`kernels`). Valid while this object is open. ValueError for another op or a
        policy without that protocol."""
        if op == "sample" and self._policy.fused_sample is not None and isinstance(out, SharedSampleOut):
            return (self._cw, self._sums, self._mins, my_token(), int(key),
                    float(self.beta if beta is None else beta), out.octx)
        if op == "update" and self._policy.fused_update:
            idx = as_indices(indices)
            st = None if stamps is None else np.asarray(stamps, dtype=np.int64)
            return self._update_args(idx, as_priorities(priorities, idx.shape[0]), st)
        if op == "add" and self._policy.fused_insert is not None and batch is not None:
            arrays, n = self._storage.check_batch(batch)
            if not 0 < n <= self.handle.capacity:
                raise ValueError(f"batch must have 1 to capacity={self.handle.capacity} rows, got {n}")
            return self._add_args(None, self._storage.as_bytes(arrays, 0, n), n)
        raise ValueError(f"op must be 'sample' (with out from sample_out), 'update' or 'add' (with batch), for a "
                         f"policy with that fused protocol; got {op!r} for policy {self.handle.policy!r}")

    @property
    def kernels(self):
        """The module (or namespace) whose ``sample``, ``add`` and ``update`` this object's fused
        calls run: :mod:`impl.concurrent.fused`, or the policy's own set."""
        return self._kernels

    # ------------------------------------------------------------------ helpers (unguarded: called inside calls)
    def _recover_tree_lock(self, dead_token: int) -> None:
        """The tree lock's recovery callback (:class:`SharedLock`): the policy's recovery."""
        self._policy.recover(dead_token)

    def _add_args(self, vals, rows: tuple, keep: int) -> tuple:
        return (self._cw, self._sums, self._mins, my_token(), _NO_VALUES if vals is None else vals, rows, keep)

    def _update_args(self, idx: np.ndarray, vals: np.ndarray, stamps) -> tuple:
        return (self._cw, self._sums, self._mins, my_token(), idx, vals, _NO_STAMPS if stamps is None else stamps,
                stamps is not None)

    def _len(self) -> int:
        return min(self._ring.inserted, self.handle.capacity)

    def _check_new_priorities(self, vals: np.ndarray) -> None:
        """Refuse raw priorities that are not finite, negative, or whose ``(p + eps) ** alpha``
        the tree cannot hold, naming the first bad entry (the tree's own check, writing nothing)."""
        slots = np.zeros(vals.shape[0], np.int64)
        status, pos, _, _ = kernels.checked_values(slots, vals, 1, self.eps, self.alpha, self._tree.max_leaf)
        raise_for_status(status, pos, slots, vals, 1, "priorities", eps=self.eps, alpha=self.alpha,
                         vmax=self._tree.max_leaf)

    def _redraw_changed(self, sel, out, rng) -> None:
        """Seqlock check: rows whose slot stamp changed while they were copied are redrawn."""
        for _ in range(MAX_REDRAWS):
            changed = self._ring.stamps_changed(sel.indices, sel.stamps)
            if changed.size == 0:
                return
            sub = self._policy.select(changed.size, rng)
            rows = sub.rows if sub.rows is not None else self._storage.gather(sub.indices)
            sel.indices[changed], sel.priorities[changed], sel.stamps[changed] = sub.indices, sub.priorities, sub.stamps
            for name, col in rows.items():
                out[name][changed] = col
        raise RuntimeError(f"sample: rows kept being overwritten during the copy after {MAX_REDRAWS} redraws")
