"""Sampling in a loop without allocating (docs/using.md): ``sample_out`` makes the output arrays
once, and ``sample(..., out=out)`` refills and returns them. A bad argument is refused with an
error naming it, and the buffer is left as it was.

    python examples/sample_into.py
"""

import numpy as np


def main(capacity: int = 2**12, steps: int = 100) -> int:
    from replaybench import create

    rng = np.random.default_rng(0)
    buf = create("kary-aligned", capacity=capacity, fields={"obs": ((4,), "float32")}, alpha=0.6, beta=0.4)
    buf.add({"obs": rng.random((capacity, 4), dtype=np.float32)})
    out = buf.sample_out(256)                       # once; fields=False: indices and weights only
    for step in range(steps):
        batch = buf.sample(256, rng=rng, out=out)   # refills and returns `out`
        buf.update_priorities(batch["indices"], rng.random(256) + 0.01)
    total = buf.tree.total()
    try:
        buf.update_priorities(batch["indices"], np.full(256, np.nan))
    except ValueError as err:                       # names the argument and the value
        print(f"refused: {err}")
    assert buf.tree.total() == total                # ... and nothing changed
    print(f"{steps} samples of 256 into the same arrays; total priority {total:.1f}")
    return steps


if __name__ == "__main__":
    main()
