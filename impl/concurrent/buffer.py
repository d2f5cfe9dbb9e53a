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

from .. import registry
from ..buffers import PrioritizedReplayBuffer, check_priorities
from ..trees import kernels
from ..trees.base import as_indices, as_priorities, raise_for_status
from .guard import BufferClosed, CallGate, GuardedView, guarded
from .locks import SharedLock
from .policy import Parts, get as get_policy
from .ring import LEAF_LOCK, TREE_LOCK, SharedRing, ring_arrays
from .shm import ArenaSpec, SharedArena

__all__ = ["BufferHandle", "SharedPrioritizedBuffer", "BufferClosed", "MAX_REDRAWS"]

MAX_REDRAWS = 64  # rounds of redrawing rows whose slot changed during a sample's copy
DEFAULT_TIMEOUT = 120.0  # seconds a call waits for a lock, or for a lapped writer, before TimeoutError


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


def _schema(fields: tuple) -> dict:
    return {name: (shape, dtype) for name, shape, dtype in fields}


def _local_buffer(variant: str, capacity: int, fields: dict, params: dict) -> PrioritizedReplayBuffer:
    buf = registry.create(variant, capacity, fields, **params)
    tree = getattr(buf, "tree", None)
    if not isinstance(buf, PrioritizedReplayBuffer) or not hasattr(tree, "shared_arrays"):
        raise ValueError(f"variant {variant!r} cannot be shared: it must be a PrioritizedReplayBuffer over a tree "
                         "with shared_arrays()/bind_arrays() (every array tree has them)")
    return buf


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
        self._tree, self._storage = local.tree, local.storage
        self.alpha, self.beta, self.eps, self.stratified = local.alpha, local.beta, local.eps, local.stratified
        a = arena.arrays
        self._tree.bind_arrays({"sums": a["tree.sums"], "mins": a["tree.mins"]})
        self._tree.resum_every = 2**62  # re-summing is counted in the shared control block instead
        self._storage.bind(a["storage.arena"])
        self._ring = SharedRing({k: a[k] for k in ring_arrays(handle.capacity)}, self._tree, handle.capacity,
                                handle.resum_every)
        self._tree_lock = SharedLock(self._ring.control, TREE_LOCK, "tree", on_recover=self._ring.recover,
                                     timeout=timeout)
        self._leaf_lock = SharedLock(self._ring.control, LEAF_LOCK, "leaves", timeout=timeout)
        self._rng = np.random.default_rng(seed)
        self._policy = get_policy(handle.policy)(Parts(self._tree, self._storage, self._ring, self._tree_lock,
                                                       self._leaf_lock, self.alpha, self.eps, self.stratified))

    # ------------------------------------------------------------------ construction
    @classmethod
    def create(cls, capacity: int, fields, *, variant: str = "kary-aligned", policy: str = "lazy-writing",
               seed=None, resum_every: int | None = None, timeout: float = DEFAULT_TIMEOUT,
               **params) -> "SharedPrioritizedBuffer":
        """Allocate a shared buffer of registered ``variant`` (owned by this process).

        ``params`` go to the variant (K, dtype, alpha, beta, eps, stratified). ``timeout``:
        seconds this object's calls wait for a lock, or for a writer whose slots they would
        overtake, before raising TimeoutError naming the holder's pid. Raises ValueError for
        an unknown policy, a variant that cannot be shared, or a bad argument (named), and
        NotImplementedError when ``policy`` needs a capability the structure lacks
        (pal-locks and deferred need split updates, which kary-prefix lacks).
        """
        timeout = _check_timeout(timeout)
        local = cls._checked_local(capacity, fields, variant, policy, params)
        capacity = local.capacity
        if resum_every is None:
            resum_every = local.tree.resum_every
        if isinstance(resum_every, bool) or not isinstance(resum_every, numbers.Integral) or resum_every < 1:
            raise ValueError(f"resum_every must be a positive integer, got {resum_every!r}")
        tree_arrays = local.tree.shared_arrays()
        layout = {f"tree.{k}": (v.shape, v.dtype) for k, v in tree_arrays.items()}
        layout["storage.arena"] = (local.storage.arena.shape, local.storage.arena.dtype)
        layout.update(ring_arrays(capacity))
        arena = SharedArena.create(layout, tag=policy.replace("-", ""))
        try:
            for k, v in tree_arrays.items():
                arena.arrays[f"tree.{k}"][...] = v
            SharedRing.initialise(arena.arrays)
            fields_t = tuple((s.name, s.shape, s.dtype.str) for s in local.storage.specs.values())
            handle = BufferHandle(arena.spec, variant, tuple(sorted(params.items())), capacity, fields_t, policy,
                                  int(resum_every))
            return cls(handle, arena, local, seed, timeout)
        except BaseException:
            arena.close()
            raise

    @classmethod
    def check(cls, capacity: int, fields, *, variant: str = "kary-aligned", policy: str = "lazy-writing",
              **params) -> None:
        """Raise what :meth:`create` would raise for these arguments, without shared memory.

        The same checks, in the same order (policy name, the variant's own parameter checks
        through ``registry.create``, shareability, the reserved field name, the policy's fit to
        the structure), on an in-process buffer that is then dropped. Cost: one
        ``registry.create`` of ``capacity`` slots (a tree and storage of that size, no kernel
        call); callers check at a small capacity to keep it microseconds.
        """
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
            local = _local_buffer(handle.variant, handle.capacity, _schema(handle.fields), dict(handle.params))
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
        arena.close()

    @property
    def closed(self) -> bool:
        return self._gate.shut_down

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
        """Seconds this object's callers spent waiting for the buffer's locks."""
        return self._tree_lock.wait_seconds + self._leaf_lock.wait_seconds

    @property
    @guarded
    def lock_hold_seconds(self) -> float:
        """Seconds this object's callers held the tree lock (the lock every policy serialises
        its tree work on; the leaf lock is only taken inside it)."""
        return self._tree_lock.hold_seconds

    @guarded
    def counters(self) -> dict:
        """Buffer-wide event counts (all processes): rebuilds, recoveries, stale updates
        skipped, rows redrawn because their slot changed during a copy, slots voided."""
        return self._ring.counters()

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
        keep = min(n, self.handle.capacity)
        if keep < n:
            arrays = {k: v[n - keep:] for k, v in arrays.items()}
            vals = None if vals is None else vals[n - keep:]
        if keep == 0:
            return np.empty(0, dtype=np.int64)
        first = self._policy.insert(arrays, keep, vals)
        return self._ring.slots(first, keep)

    @guarded
    def sample(self, batch_size: int, beta: float | None = None, rng=None) -> dict[str, np.ndarray]:
        """Draw ``batch_size`` rows, ``P(i) = p_i / total``: the fields plus ``indices``,
        ``weights`` (float32, ``(p_i / p_min) ** -beta``) and ``stamps`` (pass them back to
        :meth:`update_priorities`). Raises ValueError when nothing is sampleable yet."""
        beta = self.beta if beta is None else beta
        if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        if isinstance(beta, bool) or not isinstance(beta, numbers.Real) or not 0.0 <= beta <= 1.0:
            raise ValueError(f"beta must be a number in [0, 1], got {beta!r}")
        if self._ring.inserted == 0:
            raise ValueError("cannot sample from an empty buffer: add transitions first")
        rng = self._rng if rng is None else rng
        sel = self._policy.select(int(batch_size), rng)
        out = sel.rows
        if out is None:  # copied outside the lock: redraw rows whose slot changed meanwhile
            out = self._storage.gather(sel.indices)
            self._redraw_changed(sel, out, rng)
        out["indices"] = sel.indices
        out["weights"] = np.power(sel.priorities / sel.p_min, -float(beta)).astype(np.float32)
        out["stamps"] = sel.stamps
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
        check_priorities(idx, vals, self._len())
        if stamps is not None:
            stamps = np.asarray(stamps)
            if stamps.shape != idx.shape or stamps.dtype.kind not in "iu":
                raise ValueError(f"stamps must be an integer array shaped like indices {idx.shape}, got "
                                 f"{stamps.dtype} {stamps.shape}")
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
        local = _local_buffer(h.variant, 64, _schema(h.fields), dict(h.params))
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

    # ------------------------------------------------------------------ helpers (unguarded: called inside calls)
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
