"""PAL's cache-aligned K-ary sum tree: each sibling group starts on a cache line."""

from replaybench.impl import registry
from replaybench.impl.trees import AlignedKarySumTree

registry.register_tree(
    "kary-aligned", AlignedKarySumTree, structure="kary-aligned",
    params={"K": 16, "dtype": "float32"},
    description="K-ary sum tree padded so sibling groups are cache-line aligned (PAL)",
)
