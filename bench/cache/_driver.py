"""The program that cachegrind (and perf) run: build, fill, warm up, then the counted ops.

    python -m replaybench.bench.cache._driver --variant NAME --capacity N --batch 256 --warm W \
        --pool P --count sample=M --count update=M [--count sample_data=M]

Everything before the counted ops (imports, numba cache loads, building and filling the
buffer, ``W`` warm-up calls of every op, the input pools) is the same whatever the counts, so
the difference of two runs' totals is the cost of the extra counted calls alone. Ops:
``sample`` = ``tree.sample(batch)`` (descent only), ``sample_data`` = ``buffer.sample(batch)``
(descent + field gather + weights), ``update`` = ``buffer.update_priorities`` of ``batch``
random slots (fresh rows of a pool of ``P`` pre-drawn rows, so paths are not re-used).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np


def build(variant: str, capacity: int, seed: int = 0):
    """A registered variant's buffer, full, every slot with a random priority in [0, 1).

    The rows are added in chunks at the default priority (the tree's run fill), then every
    leaf gets its priority in one ``tree.update`` and the tree is rebuilt: the cheapest set-up
    the public API allows, which matters under cachegrind (about 50x slower than native).
    """
    from replaybench.bench.derive import SCHEMAS
    from replaybench.impl import registry

    fields = SCHEMAS["cartpole"]
    buf = registry.create(variant, capacity, fields, seed=seed)
    rng = np.random.default_rng(seed)
    chunk = min(capacity, 2**16)
    data = {}
    for name, (shape, dtype) in fields.items():
        shape = (chunk, *((shape,) if isinstance(shape, int) else shape))
        data[name] = (rng.random(shape) * 2).astype(dtype)
    for start in range(0, capacity, chunk):
        n = min(chunk, capacity - start)
        buf.add(data if n == chunk else {k: v[:n] for k, v in data.items()})
    tree = getattr(buf, "tree", None)
    if tree is not None:
        tree.update(np.arange(capacity, dtype=np.int64), rng.random(capacity))
        tree.rebuild()
    return buf


def compile_all(variant: str) -> None:
    """Run every kernel a measured run can reach once, at a small capacity, so that numba
    writes them to its cache (NUMBA_CACHE_DIR) before any run under valgrind."""
    buf = build(variant, 1024)
    rng = np.random.default_rng(0)
    tree = getattr(buf, "tree", None)
    buf.sample(8, rng=rng)
    if tree is not None:
        tree.sample(8, rng)
        buf.update_priorities(np.arange(8), rng.random(8))
        tree.fill(0, 4, 1.0)
        tree.get(np.arange(4))
        tree.rebuild()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variant", required=True)
    p.add_argument("--capacity", type=int, required=True)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--warm", type=int, default=32)
    p.add_argument("--pool", type=int, default=1024)
    p.add_argument("--count", action="append", default=[], help="op=calls, in the order given")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compile-only", action="store_true", help="fill the numba cache and exit")
    a = p.parse_args(argv)
    if a.compile_only:
        compile_all(a.variant)
        return 0
    counts = [(op, int(n)) for op, n in (c.split("=") for c in a.count)]
    buf = build(a.variant, a.capacity, a.seed)
    tree = getattr(buf, "tree", None)
    rng = np.random.default_rng(a.seed + 1)
    idx_pool = list(rng.integers(0, a.capacity, (a.pool, a.batch), dtype=np.int64))
    prio_pool = list(rng.random((a.pool, a.batch)))
    batch = a.batch
    state = {"row": 0}

    def sample(_):
        tree.sample(batch, rng)

    def sample_data(_):
        buf.sample(batch, rng=rng)

    def update(_):
        r = state["row"] % len(idx_pool)
        state["row"] += 1
        buf.update_priorities(idx_pool[r], prio_pool[r])

    ops = {"sample": sample, "sample_data": sample_data, "update": update}
    for op, _ in counts:
        if op not in ops:
            raise SystemExit(f"unknown op {op!r}")
        if op != "sample_data" and tree is None:
            raise SystemExit(f"{a.variant} has no sum tree: op {op!r} does not apply")
    for op, _ in counts:  # warm-up: the same for every run
        for i in range(a.warm):
            ops[op](i)
    for op, n in counts:  # the counted region
        call = ops[op]
        for i in range(n):
            call(i)
    return 0


if __name__ == "__main__":
    sys.exit(main())
