"""global-lock: one lock around every insert, sample and update, data copies included."""

from __future__ import annotations

from ..fused import GATHER_LOCKED, LOCKED
from ..policy import Policy, Selection, register

__all__ = ["GlobalLock"]


@register
class GlobalLock(Policy):
    """One lock around every insert, sample and update, data copies included.

    A reader observes the buffer only between whole operations: never a half-written row,
    never inner nodes that disagree with the leaves. Simplest and the baseline: while a
    writer copies an Atari-sized batch, every learner waits.
    """

    name = "global-lock"
    fused_sample = GATHER_LOCKED
    fused_insert = LOCKED
    fused_update = True

    def select(self, n: int, rng) -> Selection:
        with self.tree_lock:
            sel = self.draw(n, rng)
            sel.rows = self.storage.gather(sel.indices)
            return sel
