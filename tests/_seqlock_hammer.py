"""Child process of tests/test_concurrency_seqlock.py (not a test module): fused samples and
updates of one shared buffer beside a writer thread's inserts and a thread that moves slots
on to their next ticket while samplers copy them. Run it with ``NUMBA_BOUNDSCHECK=1`` (and a
private ``NUMBA_CACHE_DIR``): an out-of-bounds index raises IndexError, a wild write crashes
the process; either way the exit status is not 0.

Usage: ``python _seqlock_hammer.py POLICY CALLS``. Prints ``ok`` and the buffer's counters
when every sample was whole (intact rows, stamps of their own slots, finite positive weights)
or refused as documented because its rows kept being overwritten (at most a tenth of them:
more would mean the slots moved too fast for the run to test anything).
"""

import sys
import threading

import numpy as np
from numba import njit

from replaybench.bench import concurrency_workers as C
from replaybench.impl.concurrent import SharedPrioritizedBuffer
from replaybench.impl.concurrent.atomics import atomic_cas, cpu_relax

NB = C.TRANSITIONS["cartpole"]
JUMP = 1 << 24  # ring laps per bump: real tickets stay below the first bump


@njit(nogil=True)
def bump_stamps(stamps, stop, pauses):
    """Until ``stop[0]``: slot after slot (stride 7), a published stamp moves on to a ticket
    of the same slot far past any the writer will reach (``JUMP`` slots' worth: a bumped stamp
    that a real ticket could later equal would be an ABA the seqlock cannot see) by
    compare-and-swap (a writer's reserve that got there first wins), one every ``pauses``
    spin-wait hints: the overwrite a sampler's seqlock check must catch. The rows stay whole,
    so every check the samples get still holds. Returns how many moved."""
    cap = stamps.shape[0]
    jump = cap * JUMP
    s = 0
    bumps = 0
    while stop[0] == 0:
        s = (s + 7) % cap
        t = stamps[s]
        if t >= 0 and atomic_cas(stamps, s, t, t + jump) == t:
            bumps += 1
        for _ in range(pauses):
            cpu_relax()
    return bumps


def main(policy: str, calls: int) -> None:
    cap, n = 512, 64
    buf = SharedPrioritizedBuffer.create(cap, C.schema(NB), policy=policy, seed=0)
    try:
        C.prefill(buf, cap, NB)
        stamps = buf.ring.arrays["stamps"]
        stop = np.zeros(1, np.int64)
        bump_stamps(stamps, np.ones(1, np.int64), 0)
        done = []

        def write():
            w = SharedPrioritizedBuffer.attach(buf.handle, seed=1)
            seq = 0
            try:
                while stop[0] == 0:
                    w.add(C.make_batch(C.ID_STRIDE + np.arange(seq, seq + 16), NB))
                    seq += 16
            finally:
                w.close()
            done.append(seq)

        threads = [threading.Thread(target=lambda: done.append(bump_stamps(stamps, stop, 8))),
                   threading.Thread(target=write)]
        for t in threads:
            t.start()
        try:
            rng = np.random.default_rng(0)
            out = buf.sample_out(n)
            refused = 0
            for _ in range(calls):
                try:
                    got = buf.sample(n, rng=rng, out=out)
                except RuntimeError as exc:  # the documented refusal when rows keep being overwritten
                    if not str(exc).startswith("sample: rows kept being overwritten"):
                        raise
                    refused += 1
                    continue
                if not np.all(C.intact_rows(got)):
                    raise AssertionError("a torn row was sampled")
                if np.any(got["stamps"] < 0) or np.any(got["stamps"] % cap != got["indices"]):
                    raise AssertionError(f"stamps {got['stamps'][:8]} do not name slots {got['indices'][:8]}")
                if not np.all(np.isfinite(got["weights"]) & (got["weights"] > 0)):
                    raise AssertionError(f"weights {got['weights'][:8]}")
                buf.update_priorities(got["indices"], rng.random(n) + 1e-3, got["stamps"])
        finally:
            stop[0] = 1
            for t in threads:
                t.join()
        if refused > calls // 10:
            raise AssertionError(f"{refused} of {calls} samples refused: the slots moved too fast to test anything")
        print("ok", policy, "refused", refused, "bumped and inserted", done, buf.counters(), "fallbacks", buf.fallbacks)
    finally:
        buf.close()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
