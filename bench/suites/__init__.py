"""Benchmark suites declared as data: one JSON file per suite in this folder.

A suite names its scenario, the variants (``"all"`` = every registered one), the peers, the
capacities, ops, batch, transition schema, seed, a per-item timeout and the pyperf settings
(processes, values, warmups, loops with 0 = calibrate, min_time), and optionally ``params``, a
parameter grid as data (``{"K": [2, 4, 8]}``, asv-style), and ``peer_ops``, the ops the peers
run when fewer than ``ops`` (the quick suite runs them on ``mixed`` only). The grid is the product
variants x capacities x params x ops, plus one timing-loop overhead item. ``load`` also
accepts a path to a JSON file of the same shape.

Two other shapes: a *composite* suite ``{"name": ..., "suites": ["micro", ...]}`` names
sub-suites run one after the other (``default.json``: what ``make bench`` runs; add a suite
there to put it in ``make bench``), and a suite with ``"runner": "module:function"`` is run
by that function instead of bench.runner.run (only ``name`` is checked here; the function
validates the rest).
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
    if "suites" in suite:
        if not isinstance(suite.get("name"), str) or not isinstance(suite["suites"], list) or not all(
                isinstance(n, str) for n in suite["suites"]):
            raise ValueError(f"suite {path}: a composite suite needs 'name' and 'suites' (a list of suite names)")
        return suite
    if "runner" in suite:
        if not isinstance(suite.get("name"), str) or not isinstance(suite["runner"], str) or ":" not in suite["runner"]:
            raise ValueError(f"suite {path}: 'runner' must be 'module:function' and 'name' a string")
        return suite
    if not isinstance(suite.get("params", {}), dict) or not all(
            isinstance(v, list) and v for v in suite.get("params", {}).values()):
        raise ValueError(f"suite {path}: 'params' must map each parameter to a non-empty list of values")
    for section, spec in ((suite, _REQUIRED), (suite.get("pyperf", {}), _PYPERF)):
        for key, kind in spec.items():
            if not isinstance(section.get(key), kind):
                raise ValueError(f"suite {path}: {key!r} must be {kind}, got {section.get(key)!r}")
    return suite
