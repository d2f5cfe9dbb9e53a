"""A prioritized buffer in ten lines: create one, add transitions, sample a batch with importance
weights and write new priorities back (README.md shows the body of ``main``).

    python examples/quickstart.py
"""

import numpy as np


def main(capacity: int = 2**12, seed: int = 0) -> dict:
    from replaybench import create

    rng = np.random.default_rng(seed)
    fields = {"obs": ((4,), "float32"), "action": ((), "int64"), "reward": ((), "float32")}
    buf = create("kary-aligned", capacity=capacity, fields=fields, alpha=0.6, beta=0.4)
    buf.add({"obs": rng.random((1000, 4), dtype=np.float32), "action": rng.integers(0, 2, 1000),
             "reward": np.ones(1000, np.float32)})                 # a leading batch axis
    out = buf.sample(256, rng=rng)                                # fields, "indices", "weights"
    td_errors = rng.normal(size=256)                              # what a learner computes
    buf.update_priorities(out["indices"], np.abs(td_errors))
    print(len(buf), out["obs"].shape, out["weights"].max())
    return out


if __name__ == "__main__":
    main()
