"""Cache-aligned K-ary sum tree with running sums in each sibling group (compare-only descent).

Our answer to the measured weakness of PAL's layout: with plain child sums a K=16 descent
spends K - 1 dependent additions per level; here each level is K - 1 independent compares.
"""

from replaybench.impl import registry
from replaybench.impl.trees import PrefixKarySumTree

registry.register_tree(
    "kary-prefix", PrefixKarySumTree, structure="kary-prefix",
    params={"K": 16, "dtype": "float32", "kernel": "auto"},
    description="cache-aligned K-ary tree, sibling groups store running sums (branch-free compares)",
)
