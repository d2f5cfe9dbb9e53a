"""The classic binary sum tree (1-indexed heap), as in most PER implementations."""

from impl import registry
from impl.trees import BinarySumTree

registry.register_tree(
    "binary", BinarySumTree, structure="binary",
    params={"dtype": "float32"},
    description="binary sum tree, level order (1-indexed heap)",
)
