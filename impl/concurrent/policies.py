"""Concurrency policies: how inserts, samples and updates of one shared buffer synchronise.

A policy wraps any structure (it calls the tree's public operations and, for the split
policies, :meth:`~impl.trees.array_trees.ArraySumTree.write_leaves` /
:meth:`~impl.trees.array_trees.ArraySumTree.propagate`), so a variant is structure x
parameters x policy and the policy is a column in results.

Every policy gives these guarantees (tested in tests/test_concurrency.py):

* no sample returns a row that was being written, or was overwritten while it was copied
  (stamps, see :mod:`impl.concurrent.buffer`);
* no sample returns a slot whose priority is 0 (reserved, voided or never written);
* after writers stop, the root equals the sum of the leaves within the tree's drift bound.

They differ in what is done under which lock, i.e. in how long others wait:

================  ==============================================================================
policy            critical sections (``T`` = tree lock, ``L`` = leaf lock; order T then L)
================  ==============================================================================
global-lock       T around all of insert (data copy included), sample (data copy included), update
pal-locks         T around tree work and the data copy of inserts; L around leaf writes and
                  priority reads, so priorities are readable while inner levels are updated;
                  samples copy rows outside the lock
lazy-writing      T to reserve (priority 0) and to publish (true priority); the data copy runs
                  with no lock; samples copy rows outside the lock
optimistic        as lazy-writing, but samples take no lock at all: they validate what they
                  read (no zero leaf, stamps unchanged) and draw again otherwise
deferred          T around inserts and updates that write leaves only and queue the deltas;
                  the next sample (or a full queue) propagates them, under T
================  ==============================================================================

A fully lock-free policy (writers too, with atomic delta propagation; the atomics are in
:mod:`.atomics`) is not offered: re-summing, the minimum tree and crash recovery would each
need a second protocol to stay correct, and the float32 drift bound could no longer be stated
per call. ``optimistic`` takes the lock-free part that is easy to prove safe: the readers.
"""

from __future__ import annotations

import numpy as np

from .buffer import QUEUE_LEN
from .locks import my_token

__all__ = ["Policy", "GlobalLock", "PalLocks", "LazyWriting", "Optimistic", "Deferred", "POLICIES"]


class Policy:
    """Base: holds the buffer and implements the operations most policies share."""

    name = ""
    splits_updates = False  # needs tree.write_leaves / tree.propagate

    def __init__(self, buf):
        self.buf = buf

    @classmethod
    def check_structure(cls, tree) -> None:
        """Raise NotImplementedError when ``tree`` cannot be used with this policy."""
        if cls.splits_updates:
            try:
                tree.write_leaves(np.empty(0, np.int64), np.empty(0, np.float64))
            except (NotImplementedError, AttributeError) as err:
                raise NotImplementedError(f"policy {cls.name!r} cannot wrap {type(tree).__name__}: {err}") from None

    def _apply(self, idx, vals, eps, alpha, n_valid=None) -> float:
        """Under the tree lock: set leaves ``idx`` to ``(vals + eps) ** alpha`` by this policy's
        protocol; returns the largest value set. Here: one whole tree update."""
        pmax = self.buf.tree.update(idx, vals, n_valid=n_valid, eps=eps, alpha=alpha)
        self.buf._count(idx.size)
        return pmax

    def _set_new(self, t0: int, n: int, vals) -> None:
        """Give slots ``t0 .. t0+n-1`` their priority: the max so far (one run-merged fill), or
        ``vals``."""
        b = self.buf
        if vals is None:
            b.tree.fill(t0 % b.capacity, n, b.max_priority)
            b._count(n)
        else:
            b._note_max(self._apply(b._slots(t0, n), vals, b.eps, b.alpha))

    def insert(self, arrays, n, vals) -> int:
        """Copy the rows and set their priorities, all under the tree lock; returns the first
        ticket."""
        b = self.buf
        with b.tree_lock:
            t0, row = b._reserve(n, my_token())
            b.storage.write(t0 % b.capacity, arrays, n)
            self._set_new(t0, n, vals)
            b._finish(row, t0, n)
        return t0

    def flush(self) -> None:
        """Under the tree lock: bring the inner nodes up to date (only deferred has work)."""

    def select(self, n: int, rng):
        """Draw ``n`` rows: ``(indices, priorities, stamps, p_min, data or None)``; None
        means the caller copies the rows (outside the lock) and checks the stamps."""
        with self.buf.tree_lock:
            return (*self.buf._select_locked(n, rng), None)

    def update(self, idx, vals, stamps) -> int:
        b = self.buf
        with b.tree_lock:
            keep = b._fresh(idx, stamps)
            idx, vals = idx[keep], vals[keep]
            if idx.size:
                b._note_max(self._apply(idx, vals, b.eps, b.alpha, n_valid=len(b)))
        return int(idx.size)

    def read_priorities(self, idx) -> np.ndarray:
        with self.buf.tree_lock:
            return self.buf.tree.get(idx)


class GlobalLock(Policy):
    """One lock around every insert, sample and update, data copies included.

    A reader observes the buffer only between whole operations: never a half-written row,
    never inner nodes that disagree with the leaves. Simplest and the baseline: while a
    writer copies an Atari-sized batch, every learner waits.
    """

    name = "global-lock"

    def select(self, n: int, rng):
        b = self.buf
        with b.tree_lock:
            idx, prio, stamps, pmin = b._select_locked(n, rng)
            return idx, prio, stamps, pmin, b.storage.gather(idx)


class _SplitUpdates(Policy):
    """Base of the policies that split each tree change into leaf writes and a propagation of
    their deltas (:meth:`_apply`), so new slots get the max priority through that split too."""

    splits_updates = True

    def _set_new(self, t0: int, n: int, vals) -> None:
        if vals is not None:
            return super()._set_new(t0, n, vals)
        b = self.buf  # no fill: it would write leaves and inner nodes together
        self._apply(b._slots(t0, n), np.full(n, b.max_priority), 0.0, 1.0)


class PalLocks(_SplitUpdates):
    """PAL's tree protection: a global (tree) lock plus a last-level (leaf) lock.

    Tree changes hold the tree lock; their leaf writes also hold the leaf lock, which is
    released before the deltas climb the inner levels. Priority reads (:meth:`read_priorities`)
    take only the leaf lock, so they proceed while inner levels are being updated and observe
    leaves that may be newer than the inner sums (each leaf value is one aligned word: never
    torn). Samples descend under the tree lock, so they see a consistent tree, and copy their
    rows outside it (stamp-checked). Inserts copy data under the tree lock, as PAL does
    without lazy writing.
    """

    name = "pal-locks"

    def _apply(self, idx, vals, eps, alpha, n_valid=None) -> float:
        b = self.buf
        with b.leaf_lock:
            idx, deltas, pmax = b.tree.write_leaves(idx, vals, n_valid=n_valid, eps=eps, alpha=alpha)
        b.tree.propagate(idx, deltas)
        b._count(idx.size)
        return pmax

    def read_priorities(self, idx) -> np.ndarray:
        with self.buf.leaf_lock:
            return self.buf.tree.get(idx)


class LazyWriting(Policy):
    """PAL's lazy writing: reserve at priority 0, copy the data with no lock, then publish.

    Insert: (1) under the tree lock take the slots, set their priority to 0 and their stamps
    to -1; (2) copy the rows with no lock; (3) under the tree lock set the true priority and
    the stamps. A sampler cannot land on a slot between (1) and (3), since its priority is 0
    and the descent never returns a zero leaf; a sampler that drew a slot before (1) detects
    the stamp change after its copy and redraws. Updates skip slots being written. A writer
    never overtakes a slot another writer is still copying (it waits), so two copies never
    race on one slot. Readers observe the tree between whole tree operations; data of
    in-flight slots is invisible. Two tree operations per insert instead of one, but the data
    copy, which dominates for large transitions, overlaps everything else.
    """

    name = "lazy-writing"

    def insert(self, arrays, n, vals) -> int:
        b = self.buf
        token = my_token()
        attempt = 0
        while True:
            with b.tree_lock:
                reserved = b._reserve(n, token, wait_for_lapped=True)
                if reserved is not None:
                    t0, row = reserved
                    b.tree.fill(t0 % b.capacity, n, 0.0)
                    b._count(n)
                    break
            b._backoff(attempt)
            attempt += 1
        b.storage.write(t0 % b.capacity, arrays, n)
        with b.tree_lock:
            self._set_new(t0, n, vals)
            b._finish(row, t0, n)
        return t0


class Optimistic(LazyWriting):
    """Lazy writing, and samples that take no lock at all (seqlock-style readers).

    Inserts and updates are exactly :class:`LazyWriting`'s, so the tree still has one writer
    at a time. A sample descends while writers may be changing the tree: every node it reads
    is a value that node really held (aligned float loads are atomic), so it always reaches a
    real leaf; a leaf read as 0 (reserved, or mid-update) is drawn again, and so is a slot whose
    stamp says it is being written or changed during the copy. What a sampler may observe:
    the probabilities of one draw are off by the deltas in flight at that moment (at most the
    priority changes of one batch), and ``p_min`` for the weights may be one update old. If
    draws keep failing (heavy drift), it falls back to the locked draw, which may rebuild.
    Samplers therefore never wait for writers or for each other; only updates do.
    """

    name = "optimistic"
    ROUNDS = 8

    def select(self, n: int, rng):
        b, tree = self.buf, self.buf.tree
        total = tree.total()
        if total > 0.0:
            us = (np.arange(n) + rng.random(n)) * (total / n) if b.stratified else rng.random(n) * total
            idx, prio = tree.find(us)
            for _ in range(self.ROUNDS):
                stamps = b._stamps[np.maximum(idx, 0)]
                bad = np.flatnonzero((idx < 0) | (stamps < 0))
                if bad.size == 0:
                    pmin = tree.min()
                    if 0.0 < pmin < np.inf:
                        return idx, prio, stamps, pmin, None
                    break
                total = tree.total()
                if not total > 0.0:
                    break
                idx[bad], prio[bad] = tree.find(rng.random(bad.size) * total)
        return super().select(n, rng)  # under the lock, with the tree's own redraw and rebuild


class Deferred(_SplitUpdates):
    """Deferred propagation (cpprb's multi-process scheme): writers set leaves only.

    Inserts and updates write the leaves and append ``(leaf, delta)`` to a shared queue under
    the tree lock, which is therefore held only O(n) per call instead of O(n K D); the next
    sample first propagates the whole queue (and so does a writer that finds the queue full).
    Between the two, the inner nodes lag the leaves: ``total()`` and the minimum are stale,
    but every sample drains first, so a descent always sees a consistent tree. Data is copied
    under the lock, as cpprb does; samples copy rows outside it (stamp-checked).
    """

    name = "deferred"

    def _apply(self, idx, vals, eps, alpha, n_valid=None) -> float:
        idx, deltas, pmax = self.buf.tree.write_leaves(idx, vals, n_valid=n_valid, eps=eps, alpha=alpha)
        self._queue(idx, deltas)
        return pmax

    def _queue(self, idx, deltas) -> None:
        b = self.buf
        q = int(b._ctrl[QUEUE_LEN])
        if q + idx.size > b._queue_idx.size:
            self._drain()
            q = 0
        if idx.size > b._queue_idx.size:
            b.tree.propagate(idx, deltas)
            b._count(idx.size)
            return
        b._queue_idx[q:q + idx.size] = idx
        b._queue_delta[q:q + idx.size] = deltas
        b._ctrl[QUEUE_LEN] = q + idx.size

    def flush(self) -> None:
        self._drain()

    def _drain(self) -> None:
        b = self.buf
        q = int(b._ctrl[QUEUE_LEN])
        if q:
            b.tree.propagate(b._queue_idx[:q], b._queue_delta[:q])
            b._ctrl[QUEUE_LEN] = 0
            b._count(q)

    def select(self, n: int, rng):
        b = self.buf
        with b.tree_lock:
            self._drain()
            return (*b._select_locked(n, rng), None)


POLICIES = {cls.name: cls for cls in (GlobalLock, PalLocks, LazyWriting, Optimistic, Deferred)}
