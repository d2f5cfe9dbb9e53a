"""How long one cache line takes to go from one core to another, measured now: the price of
every line that workers on two cores both write (a shared tree's upper nodes, a lock word).

Why it is measured per cell, not once per machine: on a virtual machine the hypervisor places
the vCPUs on physical cores and moves them while the guest runs, and two vCPUs on cores that
share no cache pass a line several times slower than two that do (docs/benchmarks.md gives the
placements seen on this project's VMs and what they did to two learners on one buffer). What a
design that shares lines gets from two workers is then set by where the vCPUs sit at the
moment, while workers that share nothing are not touched. A concurrency cell therefore records
the trip right before and right after its windows (``line_transfer_ns_before`` / ``_after``
rows), and a ratio is read beside them.

Method (:func:`probe`): two threads (the caller's and one more, the GIL released: compiled
with numba, ``nogil``) hand one int64 word back and forth: each waits (spinning with
``pause``, then yielding the core, so a thread that shares a CPU with its partner still makes
progress) until the word's count says it is its turn, then adds one with an atomic
compare-and-swap. Each hand-off moves the line to the other core once, so the time per
hand-off is one one-way transfer plus a load and an atomic on a line already in the cache
(a few ns). A round lasts ``seconds`` (the leader reads the clock every :data:`CLOCK_EVERY`
of its turns and after any wait long enough to yield), ``repeats`` rounds; the figure is the
minimum (what the placement of the moment allows, least disturbed by other work: a partner
descheduled for a time slice makes a round read high, never low) with the median beside it.
Where the threads share one CPU (one usable core) it measures the scheduler's hand-over, not a
cache: :func:`probe` returns None there.

Cost: ``repeats * seconds`` (0.1 s by default) plus starting one thread per round and, the
first time on a machine, numba's compilation (cached on disk). Error bound: a hand-off also
pays a load and a compare-and-swap on a line the core already owns, so the figure is the
transfer plus those (an upper bound on the transfer itself); a round in which the partner was
descheduled reads high, which the minimum over rounds discards unless every round was.
"""

from __future__ import annotations

import statistics
import threading
import time

import numpy as np

__all__ = ["CLOCK_EVERY", "SPINS", "probe"]

#: The leader reads the clock once per this many of its turns.
CLOCK_EVERY = 64
#: Spins with ``pause`` before a waiting thread yields its core each further round.
SPINS = 2000

_KERNEL = None


def _volley():
    """The compiled hand-off loop (made on first use: numba only where it is measured)."""
    global _KERNEL
    if _KERNEL is None:
        from numba import njit

        from replaybench.impl.concurrent.atomics import atomic_cas, atomic_read, cpu_relax, monotonic, yield_core

        @njit(nogil=True, cache=True)
        def volley(word, me, seconds, clk):
            """Player ``me`` (0 leads, 1 follows) of the hand-off on ``word[0]``: a count whose
            parity says whose turn it is; the leader ends the round by writing -1 at its turn
            once ``seconds`` have passed (read every CLOCK_EVERY of its turns, and after every
            wait that had to yield the core: a busy machine still ends the round on time).
            Returns ``(the count the round ended at, this player's increments)``: each player
            increments it ``count / 2`` times when the turns alternate."""
            end = monotonic(clk) + seconds
            turns = 0
            while True:
                spins = 0
                seen = atomic_read(word, 0)
                while seen >= 0 and seen % 2 != me:
                    if spins < SPINS:
                        cpu_relax()
                        spins += 1
                    else:
                        yield_core()
                    seen = atomic_read(word, 0)
                if seen < 0:
                    return seen, turns
                if me == 0 and ((turns + 1) % CLOCK_EVERY == 0 or spins >= SPINS) and monotonic(clk) >= end:
                    atomic_cas(word, 0, seen, -1)
                    return seen, turns
                atomic_cas(word, 0, seen, seen + 1)
                turns += 1

        _KERNEL = volley
    return _KERNEL


def _own_line() -> np.ndarray:
    """Eight zeroed int64 words that start a 64-byte cache line: the count alone on its line (an
    allocator's neighbouring data on it would add other cores' traffic to the hand-offs)."""
    raw = np.zeros(16, np.int64)
    skip = (-raw.ctypes.data % 64) // 8
    return raw[skip: skip + 8]


def _round(seconds: float) -> float:
    """One round: ns per hand-off."""
    volley = _volley()
    word = _own_line()
    follower = threading.Thread(target=volley, args=(word, 1, seconds, np.zeros(2, np.int64)), daemon=True)
    t0 = time.perf_counter()
    follower.start()
    handed, _ = volley(word, 0, seconds, np.zeros(2, np.int64))
    elapsed = time.perf_counter() - t0
    follower.join()
    return 1e9 * elapsed / max(int(handed), 1)


def probe(seconds: float = 0.02, repeats: int = 5) -> dict | None:
    """``{"ns": minimum over rounds, "ns_median", "repeats", "seconds"}``: ns per one-way hand-off
    of a cache line between two threads (module docstring); None where this process may use
    fewer than two CPUs. ValueError naming the argument for a non-positive ``seconds`` or
    ``repeats``."""
    from replaybench.impl.machine import usable_cores

    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds < float("inf"):
        raise ValueError(f"seconds must be a positive number, got {seconds!r}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive integer, got {repeats!r}")
    if usable_cores() < 2:
        return None
    _round(0.001)  # compiles (or loads the cache) and starts the spinning once, untimed
    ns = [_round(float(seconds)) for _ in range(repeats)]
    return {"ns": min(ns), "ns_median": statistics.median(ns), "repeats": repeats, "seconds": float(seconds)}
