"""Cache-blocked binary sum tree: 4-level subtrees packed into one 64-byte line each."""

from replaybench.impl import registry
from replaybench.impl.trees import BlockedBinarySumTree

registry.register_tree(
    "binary-blocked", BlockedBinarySumTree, structure="binary-blocked",
    params={"dtype": "float32"},
    description="binary sum tree in 16-slot blocks, one 4-level subtree per cache line",
)
