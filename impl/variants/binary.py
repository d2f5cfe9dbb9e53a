"""The classic binary sum tree (1-indexed heap), as in most PER implementations."""

from replaybench.impl import registry
from replaybench.impl.trees import BinarySumTree

registry.register_tree(
    "binary", BinarySumTree, structure="binary",
    params={"dtype": "float32"},
    description="binary sum tree, level order (1-indexed heap)",
)
