"""deferred: writers set leaves only and queue the deltas; the next sample propagates them."""

from __future__ import annotations

from ..fused import APPLY_QUEUED, DRAIN_LOCKED, LOCKED
from ..policy import Policy, Selection, register

__all__ = ["Deferred"]


@register
class Deferred(Policy):
    """Deferred propagation (cpprb's multi-process scheme): writers set leaves only.

    Inserts and updates write the leaves and append ``(leaf, delta)`` to the ring's shared
    queue under the tree lock, which is therefore held only O(n) per call instead of
    O(n K D); the next sample first propagates the whole queue (and so does a writer that
    finds the queue full). Between the two, the inner nodes lag the leaves: ``total()`` and
    the minimum are stale, but every sample drains first, so a descent always sees a
    consistent tree. Data is copied under the lock, as cpprb does; samples copy rows outside
    it (stamp-checked).

    All three operations run as fused kernels (:mod:`impl.concurrent.fused`): the sample by
    DRAIN_LOCKED (the tree lock held shared, so draws overlap, while the queue is empty;
    exclusively, to propagate the queue first, when it is not), inserts by LOCKED with
    APPLY_QUEUED and updates with APPLY_QUEUED (leaves and the queue under the tree lock). The
    methods below are the slow path for a lock held past a kernel's spins, which sleeps, times
    out and recovers dead holders.
    """

    name = "deferred"
    fused_sample = DRAIN_LOCKED
    fused_insert = LOCKED
    fused_update = True
    fused_apply = APPLY_QUEUED
    requires_split_updates = True

    def apply(self, idx, vals, eps, alpha, n_valid=None) -> float:
        idx, deltas, pmax = self.tree.write_leaves(idx, vals, n_valid=n_valid, eps=eps, alpha=alpha)
        if not self.ring.enqueue(idx, deltas):
            self.flush()
            if not self.ring.enqueue(idx, deltas):  # larger than the whole queue
                self.tree.propagate(idx, deltas)
                self.ring.count(idx.size)
        return pmax

    def flush(self) -> None:
        idx, deltas = self.ring.take_queue()
        if idx.size:
            self.tree.propagate(idx, deltas)
            self.ring.count(idx.size)

    def select(self, n: int, rng) -> Selection:
        with self.tree_lock:
            self.flush()
            return self.draw(n, rng)
