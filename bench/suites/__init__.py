"""Benchmark suites declared as data: one JSON file per suite in this folder.

A suite names its scenario, the variants (``"all"`` = every registered one), the peers, the
capacities, ops, batch, transition schema, seed, a per-item timeout and the pyperf settings
(processes, values, warmups, loops with 0 = calibrate, min_time). The grid is the product
variants x capacities x ops, plus one timing-loop overhead item. ``load`` also accepts a path
to a JSON file of the same shape.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["SUITE_DIR", "available", "load"]

SUITE_DIR = Path(__file__).resolve().parent

_REQUIRED = {"name": str, "scenario": str, "variants": (str, list), "peers": list, "capacities": list,
             "ops": list, "batch": int, "mixed_adds": int, "transitions": str, "seed": int,
             "item_timeout_s": (int, float), "pyperf": dict}
_PYPERF = {"processes": int, "values": int, "warmups": int, "loops": int, "min_time": (int, float)}


def available() -> list[str]:
    return sorted(p.stem for p in SUITE_DIR.glob("*.json"))


def load(name_or_path: str) -> dict:
    """The suite called ``name`` here, or the JSON file at a path; checked for missing keys."""
    path = Path(name_or_path)
    if not (path.suffix == ".json" and path.exists()):
        path = SUITE_DIR / f"{name_or_path}.json"
    if not path.exists():
        raise ValueError(f"unknown suite {name_or_path!r}; available: {', '.join(available())} (or a .json path)")
    suite = json.loads(path.read_text())
    for section, spec in ((suite, _REQUIRED), (suite.get("pyperf", {}), _PYPERF)):
        for key, kind in spec.items():
            if not isinstance(section.get(key), kind):
                raise ValueError(f"suite {path}: {key!r} must be {kind}, got {section.get(key)!r}")
    return suite
