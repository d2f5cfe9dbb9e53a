"""A buffer variant in one file (docs/extending.md): a K-ary sum tree (K a power of 2, at most 16)
with each sibling group alone in one 64-byte line. As a module of impl/variants/ it registers
itself when the registry imports that folder; from another package, name the module in the
``replaybench.variants`` entry-point group. Importing this file registers it as well.

    python examples/variant_line_per_group.py
"""

import numpy as np

from replaybench.impl import registry
from replaybench.impl.trees import ArraySumTree, check_capacity, check_K


class LinePerGroupSumTree(ArraySumTree):
    def __init__(self, capacity, K=4, dtype="float32", resum_every=None):
        capacity = check_capacity(capacity)  # clear errors that name the argument and value
        K = check_K(K, power_of_two=True, high=16)  # a group of K float32 must fit one line
        depth = 0
        while K**depth < capacity:
            depth += 1
        rows, base = [], 0
        for d in range(depth + 1):
            # node j of depth d lives in line j // K of this depth, at slot j % K
            rows.append((base, K.bit_length() - 1, 4, K - 1, 1))
            base += 16 * max(1, K**d // K)
        super().__init__(capacity, K, np.array(rows, dtype=np.int64), base, dtype, resum_every)


registry.register_tree("kary-line-per-group", LinePerGroupSumTree, structure="kary-line-per-group",
                       params={"K": 4, "dtype": "float32"},
                       description="K-ary level order, one sibling group per cache line")


def main(capacity: int = 1000) -> float:
    buf = registry.create("kary-line-per-group", capacity=capacity, fields={"id": ((), "int64")}, alpha=1.0, eps=0.0)
    priorities = np.random.default_rng(0).random(capacity)
    buf.add({"id": np.arange(capacity)}, priorities=priorities)
    out = buf.sample(256, rng=np.random.default_rng(1))
    print(f"total {buf.tree.total():.3f} (sum of priorities {priorities.sum():.3f}); "
          f"sampled ids {out['id'][:5]} ...")
    return buf.tree.total()


if __name__ == "__main__":
    main()
