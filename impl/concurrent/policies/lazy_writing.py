"""lazy-writing: PAL's lazy writing, reserve at priority 0, copy with no lock, then publish."""

from __future__ import annotations

import time

from ..locks import my_token, token_pid
from ..policy import Policy, register

__all__ = ["LazyWriting"]

FIRST_WAIT = 1e-5  # seconds; a lapping writer's wait doubles from here ...
LONGEST_WAIT = 1e-3  # ... up to here, so a long wait costs almost no CPU


@register
class LazyWriting(Policy):
    """PAL's lazy writing: reserve at priority 0, copy the data with no lock, then publish.

    Insert: (1) under the tree lock take the slots, set their priority to 0 and their stamps
    to -1; (2) copy the rows with no lock; (3) under the tree lock set the true priority and
    the stamps. A sampler cannot land on a slot between (1) and (3), since its priority is 0
    and the descent never returns a zero leaf; a sampler that drew a slot before (1) detects
    the stamp change after its copy and redraws. Updates skip slots being written. A writer
    never overtakes a slot another writer is still copying: it waits, with sleeps that double
    up to :data:`LONGEST_WAIT`, and after the tree lock's ``timeout`` raises TimeoutError
    naming the slow writer's pid (a dead one is voided instead). Readers observe the tree
    between whole tree operations; data of in-flight slots is invisible. Two tree operations
    per insert instead of one, but the data copy, which dominates for large transitions,
    overlaps everything else.
    """

    name = "lazy-writing"

    def insert(self, arrays, n, vals) -> int:
        token = my_token()
        started, wait = None, FIRST_WAIT
        while True:
            with self.tree_lock:
                res = self.ring.reserve(n, token, wait_for_lapped=True)
                if res.row >= 0:
                    self.tree.fill(res.first % self.ring.capacity, n, 0.0)
                    self.ring.count(n)
                    break
            now = time.monotonic()
            started = now if started is None else started
            if now - started > self.tree_lock.timeout:
                raise TimeoutError(f"insert of {n} rows waited {now - started:.3g} s for ring slots still being "
                                   f"written by pid {token_pid(res.blocker)} (token {res.blocker}), which is "
                                   "alive but not progressing")
            time.sleep(wait)
            wait = min(2.0 * wait, LONGEST_WAIT)
        self.storage.write(res.first % self.ring.capacity, arrays, n)
        with self.tree_lock:
            self.set_new_priorities(res.first, n, vals)
            self.ring.publish(res, n)
        return res.first
