"""Helpers shared by the conformance tests (not a test module).

Variant lists are read from the registry when the test modules are collected, so a variant
added as one file in impl/variants/ (or through an entry point) gets every test below
without editing this suite.
"""

from __future__ import annotations

import os
import time

import numpy as np

from replaybench.impl import registry, trees
from replaybench.impl.trees import AlignedKarySumTree, BinarySumTree, BlockedBinarySumTree, KarySumTree

ALL_VARIANTS = registry.names()
#: Tree-based prioritized variants: every registered name except the uniform baseline.
PRIORITIZED = [name for name in ALL_VARIANTS if name != "uniform"]

DTYPES = ["float32", "float64"]


_PROBES = {name: registry.create(name, capacity=4, fields={"x": ((), "float32")}) for name in ALL_VARIANTS}

#: Prioritized variants whose buffer exposes its SumTree as ``.tree`` (white-box checks).
TREE_VARIANTS = [name for name in PRIORITIZED if isinstance(getattr(_PROBES[name], "tree", None), trees.SumTree)]


def _first_variant_per_buffer_class() -> list[str]:
    first = {}
    for name in ALL_VARIANTS:
        first.setdefault(type(_PROBES[name]), name)
    return list(first.values())


#: One variant per buffer class (today ``binary`` for PrioritizedReplayBuffer and ``uniform``).
#: What a buffer class does itself (ring writes; batch, schema, capacity, sample and sampler
#: parameter checks) is the same code for every variant built on it, so it is tested once per
#: class through these; what differs per variant (the tree) is tested per tree. A variant with
#: a buffer class of its own (a plug-in factory) is its class's first variant and gets them too.
BUFFER_CLASS_VARIANTS = _first_variant_per_buffer_class()


def takes_param(name: str, param: str) -> bool:
    """Whether variant ``name`` declares structure parameter ``param`` (e.g. ``dtype``, ``K``)."""
    return param in registry.get(name).params

#: (id, factory(capacity, dtype, **kw)) for every array-backed tree configuration under test.
TREE_CONFIGS = (
    [("binary", lambda cap, dtype, **kw: BinarySumTree(cap, dtype=dtype, **kw))]
    + [(f"kary-K{K}", (lambda K: lambda cap, dtype, **kw: KarySumTree(cap, K=K, dtype=dtype, **kw))(K))
       for K in (2, 3, 5, 16)]
    # K=2 aligned is the binary layout exactly (tests/test_trees.py checks that): not repeated.
    + [(f"aligned-K{K}",
        (lambda K: lambda cap, dtype, **kw: AlignedKarySumTree(cap, K=K, dtype=dtype, **kw))(K))
       for K in (4, 16, 32)]
    + [("blocked", lambda cap, dtype, **kw: BlockedBinarySumTree(cap, dtype=dtype, **kw))]
)
# Trees added since (same constructor as AlignedKarySumTree) get the tree-level tests too.
if hasattr(trees, "PrefixKarySumTree"):
    TREE_CONFIGS += [
        (f"prefix-K{K}", (lambda K: lambda cap, dtype, **kw: trees.PrefixKarySumTree(cap, K=K, dtype=dtype, **kw))(K))
        for K in (2, 4, 16, 32)
    ]
#: The four layouts whose address tables the layout tests inspect.
LAYOUT_IDS = [name for name, _ in TREE_CONFIGS if not name.startswith("prefix")]
LAYOUT_FACTORIES = [f for name, f in TREE_CONFIGS if not name.startswith("prefix")]


def _variant_tree_factory(name):
    """factory(capacity, dtype, resum_every=...) for the tree inside variant ``name``."""

    def factory(capacity, dtype, **kw):
        params = {"dtype": dtype} if takes_param(name, "dtype") else {}
        tree = registry.create(name, capacity=capacity, fields={"x": ((), "float32")}, **params).tree
        if "resum_every" in kw and hasattr(tree, "resum_every"):
            tree.resum_every = int(kw["resum_every"])
        if "prefetch" in kw and hasattr(tree, "prefetch"):
            tree.prefetch = kw["prefetch"]
        return tree

    return factory


def _variant_tree_configs():
    """Trees of registered variants that the explicit configurations above do not already
    cover (same class and K): a variant added as one file gets the tree-level tests too."""
    covered = set()
    for _, factory in TREE_CONFIGS:
        tree = factory(4, "float32")
        covered.add((type(tree), getattr(tree, "K", None)))
    out = []
    for name in PRIORITIZED:
        tree = getattr(_PROBES[name], "tree", None)
        if isinstance(tree, trees.SumTree) and (type(tree), getattr(tree, "K", None)) not in covered:
            out.append((f"variant-{name}", _variant_tree_factory(name)))
    return out


#: The explicitly listed array trees (white-box tests poke at their arrays).
ARRAY_IDS = [name for name, _ in TREE_CONFIGS]
ARRAY_FACTORIES = [factory for _, factory in TREE_CONFIGS]

TREE_CONFIGS += _variant_tree_configs()
TREE_IDS = [name for name, _ in TREE_CONFIGS]
TREE_FACTORIES = [factory for _, factory in TREE_CONFIGS]


def rounding_slack(tree) -> int:
    """Rounding steps a rebuild leaves in the root: K * D, plus one level for safety."""
    K = getattr(tree, "K", 2)
    D = getattr(tree, "depth", max(1, int(np.ceil(np.log2(max(tree.capacity, 2))))))
    return K * (D + 1)

#: Unit roundoff of each tree dtype.
UNIT_ROUNDOFF = {np.dtype(np.float32): 2.0**-24, np.dtype(np.float64): 2.0**-53}


def prioritized_with_dtypes(names=None):
    """(variant, dtype-or-None) pairs: each prioritized variant, and float64 where it takes dtype."""
    out = []
    for name in PRIORITIZED if names is None else names:
        out.append((name, None))
        if takes_param(name, "dtype"):
            out.append((name, "float64"))
    return out


def dtype_kw(dtype):
    return {} if dtype is None else {"dtype": dtype}


def snapshot(buf) -> dict:
    """Everything observable about a buffer's state, copied."""
    storage = getattr(buf, "storage", None)  # white-box parts only where the buffer has them
    snap = {
        "len": len(buf),
        "capacity": buf.capacity,
        "columns": {k: v.copy() for k, v in storage.columns.items()} if storage is not None else {},
    }
    tree = getattr(buf, "tree", None)
    if isinstance(tree, trees.SumTree):
        snap["leaves"] = tree.leaves()
        snap["total"] = tree.total()
        snap["min"] = tree.min()
        snap["max_priority"] = getattr(buf, "max_priority", None)
    return snap


def assert_same_snapshot(before: dict, after: dict) -> None:
    assert before.keys() == after.keys()
    assert before["len"] == after["len"]
    assert before["capacity"] == after["capacity"]
    assert before["columns"].keys() == after["columns"].keys()
    for name in before["columns"]:
        np.testing.assert_array_equal(before["columns"][name], after["columns"][name], err_msg=name)
    if "leaves" in before:
        np.testing.assert_array_equal(before["leaves"], after["leaves"])
        assert before["total"] == after["total"]
        assert before["min"] == after["min"]
        assert before["max_priority"] == after["max_priority"]


def own_segments() -> list[str]:
    """Shared-memory segments created by this process (the owner's pid is in the name)."""
    from replaybench.impl.concurrent import leaked_segments

    return [name for name in leaked_segments() if f"_{os.getpid()}_" in name]


def assert_exited(pids) -> None:
    """Every pid has exited and been reaped within 5 s (no /proc entry; a zombie would still have one)."""
    deadline = time.monotonic() + 5
    alive = [p for p in pids if os.path.exists(f"/proc/{p}")]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if os.path.exists(f"/proc/{p}")]
    assert not alive, f"worker processes still there: {alive}"
