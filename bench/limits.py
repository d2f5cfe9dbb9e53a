"""The memory limits of the running machine, measured in a few seconds: ``replaybench limits``.

Two probes, each at working-set sizes from a few KiB (L1) to beyond the last-level cache,
the sizes a sum tree and its rows span from 2**10 to 2**24 leaves:

* **dependent load latency** (``latency_ns``): a pointer chase through a random cyclic
  permutation of the working set's 64-byte lines (Sattolo's algorithm, so the chase visits
  every line of the cycle once per turn; above :data:`MAX_CYCLE` lines, a random subset of
  them spread over the whole set); each load's address is the previous load's value, so no two
  misses overlap. This is what one level of a tree descent costs when nothing else is in
  flight.
* **independent gather** (``gather_ns``): loads of one word from each of many random lines
  whose addresses are all known in advance (a precomputed index array), summed so they cannot
  be skipped; the core overlaps as many misses as it can. This is the floor per random line
  that any layout pays: touching a random row or leaf cannot be cheaper.
* **the same gather in two threads** (``gather_ns_2threads``): two threads, each gathering
  from its own copy of the working set for :data:`PAIR_SECONDS` at least (whole passes),
  timed together; ns per line of the two threads' combined throughput. About half of
  ``gather_ns`` when each core has its own capacity for misses in flight; about ``gather_ns``
  when the two share one bottleneck (two hyperthreads of one core, or the memory controller):
  what bounds threads that each own a buffer.

Both are compiled with numba (``nogil``, cached on disk), run after one untimed pass over the
working set (so page faults are not timed), and report the minimum over ``repeats`` timed
passes (the machine's capability, least disturbed by other work). The buffers are plain
NumPy allocations, as the trees' arrays are: with 4 KiB pages, large working sets also pay
TLB misses, exactly as the trees do.

:func:`bench.derive.bound_ns` turns the table into the bound the summaries quote for a
buffer: the gather floor (and the dependent latency) at the buffer's working-set size,
interpolated log-log between the measured sizes. A micro or concurrency run stores
:func:`probe`'s result in meta.json (``memory_limits``); :mod:`bench.summary` and the report
show each op's cost per item as a multiple of that floor.

Error bound: on an idle machine repeated probes agree within ~10 % beyond L2 (DRAM latency
varies with page placement); on a loaded machine the minimum still approaches the idle value,
but a single run can read high. The probe is a bound of the same machine, not a model.
"""

from __future__ import annotations

import time

import numpy as np

__all__ = ["LINE", "DEFAULT_SIZES", "probe", "format_limits"]

LINE = 64  # bytes per cache line
#: Working-set sizes probed, bytes: 4 KiB .. 256 MiB in steps of x4 (2**10 .. 2**26 float32 leaves;
#: a 2**22-slot buffer of CartPole rows and its trees span ~220 MiB).
DEFAULT_SIZES = tuple(4 * 4**k * 1024 for k in range(9))
_WORDS = LINE // 8  # int64 words per line
MAX_CYCLE = 2**20  # lines in a pointer-chase cycle at most (64 MiB of distinct lines)
#: Seconds each of the two threads gathers for at least (whole passes over its lines), so that
#: starting and joining the threads is a small part of the time.
PAIR_SECONDS = 0.005


def _kernels():
    from numba import njit

    @njit(nogil=True, cache=True)
    def sattolo(n, seed):
        """A random cyclic permutation of 0..n-1 (one cycle through every element)."""
        np.random.seed(seed)
        perm = np.arange(n)
        for i in range(n - 1, 0, -1):
            j = np.random.randint(0, i)
            perm[i], perm[j] = perm[j], perm[i]
        return perm

    @njit(nogil=True, cache=True)
    def build_chase(words, lines, perm):
        # line lines[perm[i]]'s first word holds the word offset of the next line in the cycle
        for i in range(perm.size):
            words[lines[perm[i]] * 8] = lines[perm[(i + 1) % perm.size]] * 8

    @njit(nogil=True, cache=True)
    def chase(words, steps, start):
        p = start
        for _ in range(steps):
            p = words[p]
        return p

    @njit(nogil=True, cache=True)
    def gather(words, lines):
        s = 0
        for i in range(lines.size):
            s += words[lines[i] * 8]
        return s

    @njit(nogil=True, cache=True)
    def gather_rounds(words, lines, rounds):
        s = 0
        for _ in range(rounds):
            s += gather(words, lines)
        return s

    return sattolo, build_chase, chase, gather, gather_rounds


def _timed(fn, *args) -> tuple[float, int]:
    t0 = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - t0, out


def probe(sizes=DEFAULT_SIZES, *, loads: int = 100_000, repeats: int = 3, seed: int = 0) -> dict:
    """Measure both probes at each working-set size (bytes, each >= 2 lines).

    Returns a JSON-ready dict: ``{"line_bytes", "loads", "repeats", "seconds", "sizes": [{"bytes",
    "latency_ns", "gather_ns", "gather_ns_2threads"}, ...]}``. Cost: about ``4 * repeats * loads``
    loads per size, plus ``repeats`` two-thread passes of :data:`PAIR_SECONDS` (~0.1-0.4 s per size
    beyond the LLC; about 3 s in all on an idle machine) plus
    building the permutation, twice the largest size in memory, and numba's first compilation
    (cached on disk) the first time on a machine.
    """
    from replaybench.bench.workloads import time_threads

    sizes = [int(s) for s in sizes]
    if not sizes or any(s < 2 * LINE for s in sizes):
        raise ValueError(f"sizes must be working-set sizes of at least {2 * LINE} bytes, got {sizes!r}")
    if isinstance(loads, bool) or not isinstance(loads, int) or loads < 1:
        raise ValueError(f"loads must be a positive integer, got {loads!r}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive integer, got {repeats!r}")
    sattolo, build_chase, chase, gather, gather_rounds = _kernels()
    start = time.perf_counter()
    rng = np.random.default_rng(seed)
    out = []
    for size in sizes:
        n = size // LINE
        words = np.empty(n * _WORDS, np.int64)
        words.fill(0)  # writes every page, so no page fault is timed (np.zeros would map them lazily)
        # the cycle visits MAX_CYCLE random lines at most, spread over the whole set (every page
        # and far more lines than any cache holds), so building it stays cheap at 256 MiB
        cycle = np.sort(rng.choice(n, n if n <= MAX_CYCLE else MAX_CYCLE, replace=False))
        build_chase(words, cycle, sattolo(cycle.size, seed))
        lines = rng.integers(0, n, loads, dtype=np.int64)
        first = cycle[0] * _WORDS
        chase(words, min(cycle.size, loads), first)  # untimed: the set as cached as it can be
        gather(words, lines)
        lat = min(_timed(chase, words, loads, first)[0] for _ in range(repeats))
        gat = min(_timed(gather, words, lines)[0] for _ in range(repeats))
        other, other_lines = words.copy(), rng.integers(0, n, loads, dtype=np.int64)
        gather(other, other_lines)
        # each thread gathers for PAIR_SECONDS at least: releasing and joining two threads costs
        # tens of microseconds on a VM, as long as one pass over a cached set takes
        rounds = max(1, int(np.ceil(PAIR_SECONDS / max(gat, 1e-9))))
        pair = [lambda i: gather_rounds(words, lines, rounds), lambda i: gather_rounds(other, other_lines, rounds)]
        gat2 = min(time_threads(pair, 1) for _ in range(repeats))
        out.append({"bytes": size, "latency_ns": 1e9 * lat / loads, "gather_ns": 1e9 * gat / loads,
                    "gather_ns_2threads": 1e9 * gat2 / (2 * loads * rounds)})
    return {"line_bytes": LINE, "loads": loads, "repeats": repeats, "seconds": time.perf_counter() - start,
            "sizes": out}


def _size(nbytes: int) -> str:
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"


def format_limits(limits: dict) -> str:
    """The probe as a table: per working-set size, dependent-load latency and gather cost per line."""
    from replaybench.bench.contract import format_table

    body = [[_size(s["bytes"]), f"{s['latency_ns']:.1f}", f"{s['gather_ns']:.2f}",
             f"{s['latency_ns'] / s['gather_ns']:.1f}",
             f"{s['gather_ns_2threads']:.2f}" if "gather_ns_2threads" in s else "-",  # older runs lack it
             f"{s['gather_ns'] / s['gather_ns_2threads']:.2f}" if "gather_ns_2threads" in s else "-"]
            for s in limits["sizes"]]
    head = (f"Memory limits of this machine ({limits['loads']} loads per probe, min of {limits['repeats']}; "
            f"{limits['seconds']:.1f} s)")
    return "\n".join([head, *format_table(["working set", "dependent load ns", "gather ns/line", "overlap (ratio)",
                                           "2 threads ns/line", "2 threads x 1"], body, {0, 1, 2, 3, 4, 5})])
