"""lazy-writing: PAL's lazy writing, reserve at priority 0, copy with no lock, then publish."""

from __future__ import annotations

from contextlib import nullcontext

from ..locks import my_token, token_pid
from ..fused import DRAW_LOCKED, LAZY
from ..policy import Backoff, Policy, Selection, register

__all__ = ["LazyWriting"]


@register
class LazyWriting(Policy):
    """PAL's lazy writing: reserve at priority 0, copy the data with no lock, then publish.

    Insert: (1) under the tree lock take the slots, set their priority to 0 and their stamps
    to -1; (2) copy the rows with no lock; (3) under the tree lock set the true priority and
    the stamps. A sampler cannot land on a slot between (1) and (3), since its priority is 0
    and the descent never returns a zero leaf; a sampler that drew a slot before (1) detects
    the stamp change after its copy and redraws. Draws hold the tree lock shared (in the
    fused kernel: :mod:`impl.concurrent.fused`), so samplers draw together and wait only for
    tree writers. Updates skip slots being written. A writer never overtakes a slot another
    writer is still copying: it waits, with sleeps that double up to
    :data:`impl.concurrent.policy.LONGEST_WAIT`, and after the tree lock's ``timeout`` raises
    TimeoutError naming the slow writer's pid (a dead one is voided instead). Readers observe the tree
    between whole tree operations; data of in-flight slots is invisible. Two tree operations
    per insert instead of one, but the data copy, which dominates for large transitions,
    overlaps everything else.

    When every slot with data is reserved by inserts in flight (a small buffer, or one insert
    as large as the capacity), the total priority is 0 and a sample waits for them to publish,
    as a writer waits, rather than fail: bounded by the same ``timeout`` (TimeoutError naming a
    writer's pid); dead writers are voided, and if nothing is left the sample refuses as the
    tree does ("total priority is 0"): :meth:`Policy.select_published`, on the Python path
    (the fused sample draws and checks the stamps itself).
    """

    name = "lazy-writing"
    fused_sample = DRAW_LOCKED
    fused_insert = LAZY
    fused_update = True

    def insert(self, arrays, n, vals) -> int:
        token = my_token()
        backoff = Backoff(self.tree_lock.timeout)
        while True:
            with self.tree_lock:
                res = self.ring.reserve(n, token, wait_for_lapped=True)
                if res.row >= 0:
                    self.tree.fill(res.first % self.ring.capacity, n, 0.0)
                    self.ring.count(n)
                    break
            backoff.pause(lambda waited: f"insert of {n} rows waited {waited:.3g} s for ring slots still being "
                                         f"written by pid {token_pid(res.blocker)} (token {res.blocker}), which "
                                         "is alive but not progressing")
        self.storage.write(res.first % self.ring.capacity, arrays, n)
        with self.tree_lock:
            self.set_new_priorities(res.first, n, vals)
            self.ring.publish(res, n)
        return res.first

    def select(self, n: int, rng) -> Selection:
        # a reserved slot's priority is 0, so no draw reaches one: one check of the stamps
        return self.select_published(n, rng, nullcontext, 1)
