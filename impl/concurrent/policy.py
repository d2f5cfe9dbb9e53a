"""The concurrency policy interface, and the registry of policies.

A policy decides how inserts, samples and updates of one shared buffer synchronise: what is
done under which lock. It is given the buffer's parts (:class:`Parts`: tree, storage, ring,
locks, and the priority transform), never the buffer, and it calls only their public
operations (:class:`~impl.concurrent.ring.SharedRing`, the tree's ``update`` / ``fill`` /
``sample``, and for split policies ``write_leaves`` / ``propagate``). So a variant is
structure x parameters x policy, and the policy is a column in results.

Adding a policy is one class in one module of ``impl/concurrent/policies/``, decorated with
:func:`register`; :func:`names` imports that folder on first use, so the tests and the
concurrency benchmark pick the policy up with no other edit (as ``impl/variants/`` works for
the variant registry).

Every policy must keep these guarantees (tested for every registered name in
tests/test_concurrency.py):

* no sample returns a row that was being written, or was overwritten while it was copied;
* no sample returns a slot whose priority is 0 (reserved, voided or never written);
* after writers stop, the root equals the sum of the leaves within the tree's drift bound;
* a writer that dies anywhere in an insert loses that insert only (see the ring's recovery).
"""

from __future__ import annotations

import importlib
import pkgutil
import time
from dataclasses import dataclass, field

import numpy as np

from replaybench.registry import Registry

from .locks import SharedLock, my_token, token_pid
from .ring import SharedRing

__all__ = ["Parts", "Selection", "Policy", "Backoff", "register", "names", "get"]

FIRST_WAIT = 1e-5  # seconds; a lapping writer's (or an empty-handed sampler's) wait doubles from here ...
LONGEST_WAIT = 1e-3  # ... up to here, so a long wait costs almost no CPU


#: The methods whose work each fused protocol does (see :attr:`Policy.fused_sample`).
_FUSED_COVERS = {"fused_sample": ("select", "draw", "flush"),
                 "fused_insert": ("insert", "apply", "set_new_priorities"),
                 "fused_update": ("update", "apply"),
                 "fused_apply": ("apply", "flush")}


@dataclass(frozen=True)
class Parts:
    """What a policy works on: one process's objects over the shared memory."""

    tree: object  # an impl.trees.ArraySumTree bound to the shared arrays
    storage: object  # an impl.storage.ColumnarStorage over the shared columns
    ring: SharedRing
    tree_lock: SharedLock  # guards the tree and the ring; its holder's death is recovered
    leaf_lock: SharedLock  # taken after the tree lock, by policies that split updates
    alpha: float  # stored priority = (p + eps) ** alpha
    eps: float
    stratified: bool
    arrays: dict = field(default_factory=dict)  # the policy's own shared arrays (Policy.shared_arrays)


@dataclass(slots=True)
class Selection:
    """Rows drawn by :meth:`Policy.select`.

    ``rows`` holds their data when the policy copied it; None means the caller copies the rows
    (outside any lock) and redraws those whose stamp changed meanwhile.
    """

    indices: np.ndarray  # int64 ring slots
    priorities: np.ndarray  # float64 stored priorities of those slots
    stamps: np.ndarray  # int64 tickets the slots held when drawn
    p_min: float  # smallest positive stored priority, for the importance weights
    rows: dict | None = None


class Policy:
    """Base policy: the tree lock around each whole tree operation and each insert's data
    copy; samples copy their rows outside the lock (stamp-checked by the caller).

    Subclasses set :attr:`name` and override what they do differently. The hooks:
    :meth:`insert`, :meth:`select`, :meth:`update`, :meth:`read_priorities`, :meth:`flush`,
    and :meth:`apply` (how one tree change is made, under the tree lock).
    """

    name = ""
    #: The one-kernel-call protocols (:mod:`impl.concurrent.fused`) that do what this policy's
    #: :meth:`select` (``fused_sample``), :meth:`insert` (``fused_insert``) and :meth:`update`
    #: (``fused_update``) do; None / False: the buffer calls the Python method. The buffer also
    #: falls back to the method when a kernel cannot finish alone (a held lock, a wait). A
    #: subclass that overrides one of the methods a protocol stands for (:data:`_FUSED_COVERS`)
    #: without declaring that protocol in its own body gets None / False for it, so an override
    #: is never bypassed by an inherited kernel.
    fused_sample: int | None = None
    fused_insert: int | None = None
    fused_update: bool = False
    #: How the fused insert and update change the tree, the kernels' form of :meth:`apply`
    #: (:data:`~impl.concurrent.fused.APPLY_WHOLE`: one whole tree update, the base class's;
    #: ``APPLY_SPLIT``: leaves under the leaf lock, then the inner levels; ``APPLY_QUEUED``:
    #: leaves, their deltas queued for the next sample). Only the LOCKED insert takes a split
    #: mode (LAZY's zero fill writes the whole tree: the buffer refuses that pair).
    fused_apply: int | None = 0

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        own = vars(cls)
        for attr, methods in _FUSED_COVERS.items():
            if attr not in own and any(m in own for m in methods):
                setattr(cls, attr, False if attr == "fused_update" else None)
        if cls.fused_apply is None:  # an apply the kernels cannot stand for: no fused tree change at all
            cls.fused_insert, cls.fused_update = None, False

    #: True when :meth:`apply` splits tree changes into ``write_leaves`` and ``propagate``;
    #: structures whose ``supports_split_updates`` is False are then refused.
    requires_split_updates = False

    #: The module (or namespace) whose ``sample``, ``add`` and ``update`` run the fused calls;
    #: None: the shared one (:mod:`impl.concurrent.fused`). A policy's own set keeps the one
    #: calling convention (:mod:`impl.concurrent.context`)::
    #:
    #:     sample(ctx, sums, mins, token, key, beta, octx)                      -> status
    #:     add(ctx, sums, mins, token, values, rows, keep)                       -> (status, first ticket, row)
    #:     update(ctx, sums, mins, token, indices, values, sampled, use_sampled) -> (status, position, applied)
    #:
    #: ``ctx`` is the buffer object's context (int64 words, built once per object): read its
    #: arrays and constants with the accessors of :mod:`impl.concurrent.context`
    #: (``mat_i64(ctx, LAY)``, ``vec_i64(ctx, CTRL)``, ``ctx[CAPACITY]``, ``f64(ctx, EPS)``, ...),
    #: and what :meth:`kernel_extra` gave at ``extra(0)``, ``extra(1)``, ... ``sums`` and ``mins``
    #: are the tree's arrays (:meth:`tree_for`'s ``kernel_args[1:3]``: 2-D for a composed tree).
    #: Statuses are :mod:`~impl.concurrent.fused`'s: OK, a check's status (nothing written),
    #: or one that hands the call to the Python methods. Each entry point counts itself,
    #: ``vec_f64(ctx, LOCKSTATS)[fused.KERNEL_CALLS] += 1`` (a sample once it finds the buffer
    #: non-empty): the stress and fuzz tests check every call reached a kernel. Adapting a module written for the old
    #: positional shape (the tree's ``kernel_args``, the ring's ``ctrl, fctrl, stamps``,
    #: :meth:`kernel_extra`, then the call's arguments) is mechanical: a thin entry point per
    #: operation that unpacks ``ctx`` into those arguments and calls the old body (the
    #: sharded module's ``sample``, ``add`` and ``update`` do just that).
    kernels = None

    #: Times a sample whose kernel handed it over waits for the kernels' locks
    #: (:meth:`await_kernel_locks`) and runs the kernel again before :meth:`select` takes the
    #: call: for a policy whose :meth:`select` excludes more than one kernel does (sharded's
    #: takes every shard lock), so that one stalled holder does not send every sampler there.
    #: 0 here: :meth:`select` at once.
    kernel_retries = 0

    #: Whether a fused sample draws exactly what the in-process buffer draws for the same key
    #: and tree (one descent of one tree); a policy that splits the draw (sharded) says False.
    draws_as_one_tree = True

    @classmethod
    def shard_count(cls, shards) -> int:
        """The number of sub-trees a buffer of this policy has, for ``create(..., shards=)``:
        here 1, and any other request than None or 1 is refused by name."""
        if shards is not None and not (type(shards) is int and shards == 1):
            raise ValueError(f"shards must be None or 1 for policy {cls.name!r} (one tree), got {shards!r}")
        return 1

    @classmethod
    def tree_for(cls, tree, make_tree, capacity: int, shards: int):
        """The tree a buffer of this policy works on: the variant's ``tree`` (of ``capacity``
        leaves) here; a sharding policy composes ``shards`` trees from ``make_tree(n_leaves)``."""
        return tree

    @classmethod
    def shared_arrays(cls, capacity: int, shards: int) -> dict:
        """``{name: (shape, dtype)}`` of shared arrays this policy needs beside the ring's (its
        own lock words, say); handed back in :attr:`Parts.arrays`. Here none."""
        return {}

    def __init__(self, parts: Parts):
        self.tree, self.storage, self.ring = parts.tree, parts.storage, parts.ring
        self.tree_lock, self.leaf_lock = parts.tree_lock, parts.leaf_lock
        self.alpha, self.eps, self.stratified = parts.alpha, parts.eps, parts.stratified

    @classmethod
    def check_structure(cls, tree) -> None:
        """Raise NotImplementedError when ``tree`` lacks a capability this policy needs."""
        if cls.requires_split_updates and not tree.supports_split_updates:
            raise NotImplementedError(f"policy {cls.name!r} cannot wrap {type(tree).__name__}: it splits updates "
                                      "into write_leaves and propagate, which this structure does not support")

    # ------------------------------------------------------------------ hooks
    def apply(self, idx, vals, eps: float, alpha: float, n_valid=None) -> float:
        """Under the tree lock: set leaves ``idx`` to ``(vals + eps) ** alpha`` by this policy's
        protocol; returns the largest value set. Here: one whole tree update, counted."""
        pmax = self.tree.update(idx, vals, n_valid=n_valid, eps=eps, alpha=alpha)
        self.ring.count(idx.size)
        return pmax

    def insert(self, arrays: dict, n: int, vals) -> int:
        """Store ``n`` validated rows with priorities ``vals`` (raw; None: the max so far);
        returns the first ticket. Here: everything under the tree lock."""
        with self.tree_lock:
            res = self.ring.reserve(n, my_token())
            self.storage.write(res.first % self.ring.capacity, arrays, n)
            self.set_new_priorities(res.first, n, vals)
            self.ring.publish(res, n)
        return res.first

    def finish_insert(self, res, n: int, vals) -> None:
        """Publish the ``n`` rows of reservation ``res`` (:class:`~impl.concurrent.ring.Reservation`,
        its rows copied) with priorities ``vals`` (raw; None: the max so far): what the buffer
        does when a fused insert reserved and copied but could not publish (a lock held past
        its spins). Here: the priorities and stamps under the tree lock."""
        with self.tree_lock:
            self.set_new_priorities(res.first, n, vals)
            self.ring.publish(res, n)

    def select(self, n: int, rng) -> Selection:
        """Draw ``n`` rows. Here: the descent under the tree lock, rows left to the caller."""
        with self.tree_lock:
            return self.draw(n, rng)

    def update(self, idx, vals, stamps) -> int:
        """Apply validated priorities to the slots that still hold the sampled transitions;
        returns how many were applied."""
        with self.tree_lock:
            keep = self.ring.fresh(idx, stamps)
            idx, vals = idx[keep], vals[keep]
            if idx.size:
                self.ring.note_max(self.apply(idx, vals, self.eps, self.alpha, n_valid=self.ring.inserted))
        return int(idx.size)

    def read_priorities(self, idx) -> np.ndarray:
        """Stored priorities of slots ``idx``."""
        with self.tree_lock:
            return self.tree.get(idx)

    def flush(self) -> None:
        """Under the tree lock: bring the inner nodes up to date (only lagging policies work)."""

    def await_kernel_locks(self) -> None:
        """Before a kernel is run again (:attr:`kernel_retries`): wait until the locks its kernels
        found held are free, holding none on return. Here nothing (no retries)."""

    def lock_wait_seconds(self) -> float:
        """Seconds this process's object waited in Python for locks of the policy's own (beside
        the tree and leaf locks, which the buffer counts). Here none."""
        return 0.0

    def kernel_extra(self) -> tuple:
        """What the policy's own :attr:`kernels` need beyond the context's standard words: ints
        or C-contiguous arrays (kept alive by the context), at ``extra(0)``, ``extra(1)``, ... of
        the kernel context (:mod:`impl.concurrent.context`; at most ``N_EXTRA``). None here."""
        return ()

    def recover(self, dead_token: int) -> None:
        """The tree lock's holder ``dead_token`` died and this process took the lock over:
        make the ring and tree consistent again (here the ring's recovery)."""
        self.ring.recover(dead_token)

    def counters(self) -> dict:
        """Buffer-wide event counts (:meth:`SharedRing.counters`; a policy with control blocks
        of its own adds theirs)."""
        return self.ring.counters()

    # ------------------------------------------------------------------ helpers for subclasses
    def draw(self, n: int, rng) -> Selection:
        """Under the tree lock: one descent for ``n`` rows, with their stamps and ``p_min``."""
        idx, prio = self.tree.sample(n, rng, self.stratified)
        return Selection(idx, prio, self.ring.stamps_at(idx), self.tree.min())

    def select_published(self, n: int, rng, writes, rounds: int) -> Selection:
        """The Python path's draw for a policy whose inserts keep draws off the slots they write
        (their stamps -1; their leaves 0, or the old rows' priorities, which a draw may reach):
        under the tree lock and ``writes()`` (a new context manager each call, excluding the
        policy's own tree writers), dead writers voided, then an exact draw, its stamps checked
        up to ``rounds`` times and the positions that reached a slot being written drawn again
        between checks. When they keep reaching one, or nothing has mass, the live writers in flight are waited for
        (sleeps doubling up to :data:`LONGEST_WAIT`; TimeoutError naming one after the tree
        lock's timeout). With no writer in flight, the tree's own draw and its refusal (nothing
        stored, or no mass). Cost beside the draw: a scan of the in-flight records and a read
        of the drawn slots' stamps."""
        backoff = Backoff(self.tree_lock.timeout)
        while True:
            with self.tree_lock, writes():
                self.ring.void_dead_writers()
                sel = self._draw_published(n, rng, rounds)
                if sel is not None:
                    return sel
                writers = self.ring.in_flight()
                if not writers:
                    return self.draw(n, rng)  # nothing is coming: the tree's own refusal
            token = writers[0][0]
            backoff.pause(lambda waited: f"sample of {n} rows waited {waited:.3g} s for a sampleable slot: the slots "
                                         f"with data are being written by inserts in flight (pid {token_pid(token)}, "
                                         f"token {token}, among {len(writers)}), alive but not progressing")

    def _draw_published(self, n: int, rng, rounds: int) -> Selection | None:
        """Under :meth:`select_published`'s locks: an exact draw whose slots all hold published
        rows, or None."""
        if not self.tree.total() > 0.0:
            return None
        idx, prio = self.tree.sample(n, rng, self.stratified)
        for _ in range(rounds):
            stamps = self.ring.stamps_at(idx)
            bad = np.flatnonzero(stamps < 0)
            if bad.size == 0:
                return Selection(idx, prio, stamps, self.tree.min())
            idx[bad], prio[bad] = self.tree.sample(bad.size, rng)
        return None

    def set_new_priorities(self, first: int, n: int, vals) -> None:
        """Under the tree lock: give tickets ``first .. first+n-1`` their priority, ``vals``
        (raw) or else the max so far (one run-merged fill, or :meth:`apply` when updates are
        split: a fill writes leaves and inner nodes together)."""
        ring = self.ring
        if vals is not None:
            ring.note_max(self.apply(ring.slots(first, n), vals, self.eps, self.alpha))
        elif self.requires_split_updates:
            self.apply(ring.slots(first, n), np.full(n, ring.max_priority), 0.0, 1.0)
        else:
            self.tree.fill(first % ring.capacity, n, ring.max_priority)
            ring.count(n)


class Backoff:
    """Sleeps between tries of a wait that gives up after ``timeout`` seconds."""

    def __init__(self, timeout: float):
        self.timeout, self.started, self.wait = timeout, None, FIRST_WAIT

    def pause(self, describe) -> None:
        """Sleep before the next try (doubling up to :data:`LONGEST_WAIT`); once the wait has
        lasted ``timeout``, raise TimeoutError with ``describe(seconds waited)`` instead."""
        now = time.monotonic()
        self.started = now if self.started is None else self.started
        if now - self.started > self.timeout:
            raise TimeoutError(describe(now - self.started))
        time.sleep(self.wait)
        self.wait = min(2.0 * self.wait, LONGEST_WAIT)


# ---------------------------------------------------------------------------- the registry
def register(cls: type[Policy]) -> type[Policy]:
    """Class decorator: make policy ``cls`` available as ``cls.name``. Registering a taken
    name from another class is an error; re-importing the same module replaces its entry."""
    if not (isinstance(cls, type) and issubclass(cls, Policy)):
        raise TypeError(f"register expects a Policy subclass, got {cls!r}")
    return _policies.register(cls.name, cls, origin=f"{cls.__module__}.{cls.__qualname__}")


def _discover() -> None:
    """Import every module of ``impl/concurrent/policies/`` (once, on the first lookup)."""
    from . import policies

    for module in pkgutil.iter_modules(policies.__path__):
        importlib.import_module(f"{policies.__name__}.{module.name}")


_policies: Registry[type[Policy]] = Registry("policy", _discover)


def names() -> list[str]:
    """Sorted names of every registered policy (imports ``impl/concurrent/policies/`` once)."""
    return _policies.names()


def get(name: str) -> type[Policy]:
    """The policy class registered as ``name``; :class:`~replaybench.registry.UnknownName`
    (a ValueError) naming the registered ones otherwise."""
    return _policies.get(name)
