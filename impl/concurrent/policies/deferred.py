"""deferred: writers set leaves only and queue the deltas; the next sample propagates them."""

from __future__ import annotations

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
    """

    name = "deferred"
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
