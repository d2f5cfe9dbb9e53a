"""Priority structures: single-threaded sum trees with no locks inside."""

from .array_trees import (
    AlignedKarySumTree,
    ArraySumTree,
    BinarySumTree,
    BlockedBinarySumTree,
    KarySumTree,
    PrefixKarySumTree,
    check_capacity,
    check_K,
)
from .base import SumTree
from .reference import ReferenceSumTree

__all__ = [
    "SumTree",
    "ArraySumTree",
    "BinarySumTree",
    "KarySumTree",
    "AlignedKarySumTree",
    "BlockedBinarySumTree",
    "PrefixKarySumTree",
    "ReferenceSumTree",
    "check_capacity",
    "check_K",
]
