"""Benchmark suites declared as data: one JSON file per suite in this folder.

A suite names its ``scenario`` (a module of bench/scenarios/, or a dotted module path: see
:mod:`bench.scenarios`) and that scenario's grid; the scenario checks its own keys when the
suite is expanded (:mod:`bench.driver`). The micro suites (micro, micro-quick, micro-threads, micro-sweep-*) declare
variants, peers, capacities, ops, batch, transition schema, seed, a per-item timeout, pyperf
settings and an optional ``params`` grid (asv-style); cache, concurrency and training suites
declare their own grids (see each scenario's docstring). ``load`` also accepts a path to a
JSON file. Any suite may carry ``paper`` and ``targets`` (:data:`COMMON_KEYS`): data the
analysis compares with, copied into each run's meta.json.

Every suite names itself ``<scenario>-<what>[-quick]`` (``micro-sweep-k``, ``training-ray``;
the scenario alone for its main grid) and states ``expected_minutes``, the wall time of a
whole run on 2 idle cores; a ``-quick`` suite (the tests' smoke grids) takes under a minute.

A *composite* suite ``{"name": ..., "suites": ["micro", ...]}`` names sub-suites run one after
the other (``default.json``: what ``make bench`` runs; add a suite there to put it in ``make
bench``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

__all__ = ["SUITE_DIR", "COMMON_KEYS", "available", "load"]

SUITE_DIR = Path(__file__).resolve().parent

#: The keys every suite may have, whatever its scenario. ``paper`` and ``targets``: the source
#: papers' figures and the issues' goals the analysis sets beside the measurements, each
#: ``{topic: data}`` (topics: :mod:`analysis.references`); the driver copies them into meta.json.
COMMON_KEYS = frozenset({"name", "scenario", "description", "expected_minutes", "paper", "targets"})

_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")  # a suite's name starts its default run id


def available() -> list[str]:
    return sorted(p.stem for p in SUITE_DIR.glob("*.json"))


def load(name_or_path: str) -> dict:
    """The suite called ``name`` here, or the JSON file at a path; its name and scenario checked."""
    if not isinstance(name_or_path, (str, Path)) or not str(name_or_path):
        raise ValueError(f"a suite is a name ({', '.join(available())}) or a .json path, got {name_or_path!r}")
    path = Path(name_or_path)
    if not (path.suffix == ".json" and path.exists()):
        path = SUITE_DIR / f"{name_or_path}.json"
    if not path.exists():
        raise ValueError(f"unknown suite {name_or_path!r}; available: {', '.join(available())} (or a .json path)")
    if not path.is_file():
        raise ValueError(f"suite {str(path)!r} is a directory (or another non-file), not a JSON file")
    try:
        suite = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"suite {str(path)!r} cannot be read: {err}") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"suite {str(path)!r} is not valid JSON: {err}") from None
    if not isinstance(suite, dict) or not isinstance(suite.get("name"), str) or not _NAME.fullmatch(suite["name"]):
        raise ValueError(f"suite {path}: 'name' must be letters, digits, '.', '_' and '-', not starting with '.'")
    minutes = suite.get("expected_minutes")
    if minutes is not None and (isinstance(minutes, bool) or not isinstance(minutes, (int, float)) or not minutes > 0):
        raise ValueError(f"suite {path}: 'expected_minutes' must be a number > 0, got {minutes!r}")
    for kind in ("paper", "targets"):
        data = suite.get(kind)
        if data is not None and not (isinstance(data, dict) and all(isinstance(v, dict) for v in data.values())):
            raise ValueError(f"suite {path}: {kind!r} must be an object of topics, each an object, got {data!r}")
    if "suites" in suite:
        if not isinstance(suite["suites"], list) or not all(isinstance(n, str) for n in suite["suites"]):
            raise ValueError(f"suite {path}: a composite suite's 'suites' must be a list of suite names")
        return suite
    if "runner" in suite:
        raise ValueError(f"suite {path}: unknown key 'runner': a suite names its scenario "
                         f"(\"scenario\": \"micro\", \"cache\", ... or a module path), which runs it")
    if not isinstance(suite.get("scenario"), str):
        raise ValueError(f"suite {path}: 'scenario' must name a scenario, got {suite.get('scenario')!r}")
    return suite
