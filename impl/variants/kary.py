"""K-ary sum tree in plain level order: fewer levels than binary, no cache-line alignment."""

from replaybench.impl import registry
from replaybench.impl.trees import KarySumTree

registry.register_tree(
    "kary", KarySumTree, structure="kary",
    params={"K": 16, "dtype": "float32"},
    description="K-ary sum tree, level order, unpadded (sibling groups straddle lines)",
)
