"""optimistic: lazy writing, and samples that take no lock at all (seqlock-style readers)."""

from __future__ import annotations

import numpy as np

from ..fused import OPTIMISTIC, draw_unlocked
from ..policy import Selection, register
from .lazy_writing import LazyWriting

__all__ = ["Optimistic"]


@register
class Optimistic(LazyWriting):
    """Lazy writing, and samples that take no lock at all (seqlock-style readers).

    Inserts and updates are exactly :class:`LazyWriting`'s, so the tree still has one writer
    at a time. A sample descends while writers may be changing the tree: every node it reads
    is a value that node really held (aligned float loads are atomic), so it always reaches a
    real leaf; a leaf read as 0 (reserved, or mid-update) is drawn again, and so is a slot whose
    stamp says it is being written or changed during the copy, and a draw that overshot its
    leaf (a node on its path read before a decrease below it arrived: the scan's last child
    would otherwise take that mass). What a sampler may observe:
    the probabilities of one draw are off by the deltas in flight at that moment (at most the
    priority changes of one batch), and ``p_min`` for the weights may be one update old. If
    draws keep failing (heavy drift), it falls back to the locked draw, which may rebuild.
    Samplers therefore never wait for writers or for each other; only updates do.
    """

    name = "optimistic"
    fused_sample = OPTIMISTIC
    ROUNDS = 8  # unlocked redraw rounds before falling back to the locked draw

    def select(self, n: int, rng) -> Selection:
        """The fused sample's own unlocked draw (:func:`impl.concurrent.fused.draw_unlocked`:
        overshoots, zero leaves and slots being written drawn again, :attr:`ROUNDS` rounds)
        with a key from ``rng``; if it keeps failing, the locked draw."""
        kind, sums, mins, lay, K, _, touch_from = self.tree.kernel_args[:7]
        idx, prio, stamps = np.empty(n, dtype=np.int64), np.empty(n), np.empty(n, dtype=np.int64)
        pmin = draw_unlocked(kind, sums, mins, lay, K, touch_from, self.ring.arrays["stamps"],
                             rng.bit_generator.random_raw() >> 1, self.stratified, self.ROUNDS, idx, prio, stamps)
        if pmin > 0.0:
            return Selection(idx, prio, stamps, pmin)
        return super().select(n, rng)  # under the lock, with the tree's own redraw and rebuild
