"""The achievable floor of each tree op's access pattern, measured by running that pattern itself.

:mod:`bench.limits` times one random line at a time (a pointer chase, a gather); a sample or an
update touches several lines per item, some of which overlap and some of which cannot, so no
per-line number says how fast the op itself could go. :func:`op_floors` runs, per capacity, the
memory accesses the op cannot avoid, with everything else stripped away, and times them:

* **descent** (``descent_ns``, per draw): a K-ary sum tree over ``capacity`` leaves of
  ``leaf_bytes`` stored level by level (one group of K children is ``K * leaf_bytes`` bytes, one
  line at K=16 and float32). A descent reads one group per level, root's children first. The
  probe does, for each level in turn, one load from a random group of that level for every draw
  of the batch: the loads of a level are independent across draws (all ``batch`` misses in
  flight at once), the levels come one after another (the next level's addresses depend on the
  sum of this level's loads, so no load of a level starts before the level above is done). A
  real descent also has each level's
  address depend on the level above, and compares within the group; leaving that out makes the
  pattern cheaper, never dearer, so it is a floor.
* **rows** (``rows_ns``, per draw): the copy of ``batch`` random rows of ``row_bytes`` (rows
  stored contiguously ``row_stride`` bytes apart, as ``storage="rows"`` does: a row that fits
  in a line padded to lie in one, :func:`impl.storage.row_stride`) into an output batch: what
  the gather of a sample costs at best (column storage touches one line per field and is
  dearer; packed rows straddle lines and are dearer too).
* **sample** (``sample_ns``, per draw): the descent then the rows, per batch, in one kernel (they
  share the cache, as in the op): ``sample_fused_ns``; ``sample_ns`` is the smaller of that and
  ``descent_ns + rows_ns`` (both are ways to run the pattern, and on a shared machine a burst of
  other work during one of the timings makes it read high, never low).
* **update** (``update_ns``, per item): the same levels upward, leaves first, for two trees (the
  sum and the min tree, both of which an update of a prioritized buffer maintains): per level,
  a read-modify-write of one random group per item, or of each of the level's groups once
  where the level has no more groups than the batch (a level-synchronous update over
  deduplicated indices touches no more).

Every probe goes over ``draws`` random draws (fresh random groups and rows per batch, the
upper levels hot after the first batches, as in a benchmark that calls the op in a loop),
after one untimed pass (no page fault is timed), and keeps the minimum of ``repeats`` timed
passes. Random indices are drawn by NumPy beforehand and read sequentially (the prefetcher
streams them), so the random number generation the op does is not counted either.

Why K=16 for every layout: one group per level in one line is the fewest lines a descent can
touch per level; a binary layout touches as many or more. So the floor is one of the op, not of
a layout: a variant that touches more lines shows as a smaller fraction of it.

Error bound: as :mod:`bench.limits`, the minimum over repeats approaches the idle machine's
value; on a loaded machine it reads high (a floor measured during other work is too high, so
an op measured at a quieter moment can appear to beat it: see :data:`bench.derive.FLOOR_NOISE`).
"""

from __future__ import annotations

import time

import numpy as np

from replaybench.impl.storage import row_stride
from replaybench.impl.trees.layouts import aligned_empty

__all__ = ["FLOOR_CAPACITIES", "FLOOR_KEYS", "tree_groups", "op_floors", "format_floors"]

#: Capacities (leaves) at which :func:`op_floors` runs each pattern: 2**10 .. 2**22 in steps of
#: x4, so the micro suites' default capacities (2**16, 2**20, 2**22) are measured, not
#: interpolated. 2**22 CartPole rows (45 bytes) and two K=16 float32 trees are ~220 MiB.
FLOOR_CAPACITIES = tuple(2**k for k in range(10, 23, 2))
#: The numbers :func:`op_floors` records per capacity, ns per draw (per item for update).
FLOOR_KEYS = ("descent_ns", "rows_ns", "sample_ns", "update_ns")
_MAX_BYTES = 2**30  # refuse a probe whose arrays would pass 1 GiB (before allocating anything)


def tree_groups(capacity: int, k: int) -> list[int]:
    """Groups (of ``k`` children) per level of a K-ary tree over ``capacity`` leaves, root's
    children first: ``[1, ..., ceil(capacity / k)]``, ``ceil(log_k(capacity))`` levels (one at
    least). E.g. ``tree_groups(2**20, 16) == [1, 16, 256, 4096, 65536]``."""
    levels = [-(-capacity // k)]
    while levels[-1] > 1:
        levels.append(-(-levels[-1] // k))
    return levels[::-1]


def _kernels():
    from numba import njit

    @njit(nogil=True, cache=True)
    def sample_pattern(tree, offsets, k, gidx, rows, ridx, out, batch, descent, copy):
        # per batch: the levels one after another, each level's loads independent across draws,
        # then the row copies (independent loads too)
        s = 0.0
        calls = ridx.size // batch
        levels = offsets.size
        width = out.shape[1]  # the row's bytes; rows.shape[1] is its stride
        for c in range(calls):
            lo = c * batch
            if descent:
                dep = 0
                for level in range(levels):
                    base = offsets[level]
                    ls = 0.0
                    for i in range(lo, lo + batch):
                        ls += tree[base + (gidx[level, i] + dep) * k]
                    # the next level's addresses wait for this level's loads (dep is 0, but the
                    # core cannot know): levels one after another, as a descent's are
                    dep = int(ls * 0.0)
                    s += ls
            if copy:
                for i in range(batch):
                    r = ridx[lo + i]
                    for b in range(width):
                        out[i, b] = rows[r, b]
                s += out[batch - 1, 0]
        return s

    @njit(nogil=True, cache=True)
    def update_pattern(trees, offsets, k, gidx, counts, batch):
        # per batch, per tree: the levels leaves first; a level with no more groups than the
        # batch has each group touched once (what deduplicated indices leave), others one random
        # group per item; every touch a read-modify-write
        calls = gidx.shape[1] // batch
        levels = offsets.size
        for c in range(calls):
            lo = c * batch
            for t in range(trees.shape[0]):
                dep = 0
                for level in range(levels - 1, -1, -1):
                    base = offsets[level]
                    if counts[level] <= batch:
                        for g in range(counts[level]):
                            trees[t, base + (g + dep) * k] += 1.0
                    else:
                        for i in range(lo, lo + batch):
                            trees[t, base + (gidx[level, i] + dep) * k] += 1.0
                    # a parent's sum needs its children's: the next level waits for this one
                    dep = int(trees[t, base] * 0.0)
        return trees[0, 0]

    return sample_pattern, update_pattern


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _min_time(fn, args, repeats: int) -> float:
    fn(*args)  # untimed: page faults, and the set as cached as it gets
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(*args)
        best = min(best, time.perf_counter() - t0)
    return best


def op_floors(capacities=FLOOR_CAPACITIES, *, batch: int = 256, k: int = 16, row_bytes: int = 45,
              leaf_bytes: int = 4, draws: int = 2**15, repeats: int = 5, seed: int = 0) -> dict:
    """Run each op's access pattern (module docstring) at each capacity and time it.

    Returns a JSON-ready dict: ``{"batch", "K", "row_bytes", "row_stride", "leaf_bytes", "draws", "repeats",
    "seconds", "sizes": [{"capacity", "bytes", "levels", "descent_ns", "rows_ns", "sample_fused_ns",
    "sample_ns", "update_ns"}, ...]}``, ``bytes`` being the rows plus two trees as allocated (the working set),
    each ``*_ns`` ns per draw (per item for update), the minimum over ``repeats`` passes of
    ``draws`` draws (rounded up to whole batches). Cost: per capacity, ``4 * (repeats + 1)``
    passes of about ``draws * (levels + 1)`` loads (milliseconds each), plus allocating and
    filling ``capacity * (row_stride + 2 * leaf_bytes * 16/15)`` bytes (~0.2 s at 2**22 CartPole
    rows), and numba's compilation (cached on disk) the first time on a machine.

    Raises ValueError naming the argument, before allocating anything, for a capacity below 2,
    a non-positive batch, k below 2, leaf_bytes other than 4 (the trees are float32), or
    arrays that would pass 1 GiB.
    """
    caps = [_positive_int("capacities", c) for c in capacities] if capacities is not None else []
    if not caps or any(c < 2 for c in caps):
        raise ValueError(f"capacities must be leaf counts of at least 2, got {capacities!r}")
    batch = _positive_int("batch", batch)
    if _positive_int("k", k) < 2:
        raise ValueError(f"k must be at least 2, got {k!r}")
    row_bytes = _positive_int("row_bytes", row_bytes)
    stride = row_stride(row_bytes)
    if leaf_bytes != 4:
        raise ValueError(f"leaf_bytes must be 4 (float32 trees), got {leaf_bytes!r}")
    draws, repeats = _positive_int("draws", draws), _positive_int("repeats", repeats)
    too_big = [c for c in caps if c * (stride + 2 * leaf_bytes * 2) > _MAX_BYTES]
    if too_big:
        raise ValueError(f"capacities {too_big} with row_bytes {row_bytes} need more than 1 GiB of arrays")
    sample_pattern, update_pattern = _kernels()
    start = time.perf_counter()
    rng = np.random.default_rng(seed)
    calls = -(-draws // batch)
    n = calls * batch
    out = []
    for capacity in caps:
        groups = tree_groups(capacity, k)
        offsets = np.cumsum([0] + [g * k for g in groups[:-1]]).astype(np.int64)
        nodes = sum(groups) * k
        trees = np.ones((2, nodes), np.float32)  # ones, not zeros: every page written now
        rows = aligned_empty(capacity * stride, np.uint8, 1).reshape(capacity, stride)  # from a line on
        gidx = np.stack([rng.integers(0, g, n, dtype=np.int64) for g in groups])
        ridx = rng.integers(0, capacity, n, dtype=np.int64)
        dest = np.empty((batch, row_bytes), np.uint8)
        counts = np.asarray(groups, np.int64)

        def sample(descent, copy):
            return _min_time(sample_pattern, (trees[0], offsets, k, gidx, rows, ridx, dest, batch, descent, copy),
                             repeats) * 1e9 / n

        entry = {"capacity": capacity, "bytes": int(rows.nbytes + trees.nbytes), "levels": len(groups),
                 "descent_ns": sample(True, False), "rows_ns": sample(False, True),
                 "sample_fused_ns": sample(True, True),
                 "update_ns": _min_time(update_pattern, (trees, offsets, k, gidx, counts, batch), repeats) * 1e9 / n}
        entry["sample_ns"] = min(entry["sample_fused_ns"], entry["descent_ns"] + entry["rows_ns"])
        out.append(entry)
        trees = rows = gidx = None  # freed before the next (larger) capacity is allocated
    return {"batch": batch, "K": k, "row_bytes": row_bytes, "row_stride": stride, "leaf_bytes": leaf_bytes,
            "draws": n, "repeats": repeats,
            "seconds": time.perf_counter() - start, "sizes": out}


def format_floors(floors: dict) -> str:
    """:func:`op_floors`' result as a table: per capacity, ns per draw of each pattern."""
    from replaybench.bench.contract import format_table

    body = [[f"2^{s['capacity'].bit_length() - 1}", str(s["levels"]), *(f"{s[key]:.1f}" for key in FLOOR_KEYS)]
            for s in floors["sizes"]]
    head = (f"Op floors of this machine (batch {floors['batch']}, K={floors['K']}, {floors['row_bytes']}-byte rows"
            f"{'' if floors.get('row_stride') is None else ' ' + str(floors['row_stride']) + ' bytes apart'}; "
            f"{floors['draws']} draws, min of {floors['repeats']}; {floors['seconds']:.1f} s), ns per draw")
    return "\n".join([head, *format_table(["capacity", "levels", "descent", "rows", "sample", "update"], body,
                                          set(range(6)))])
