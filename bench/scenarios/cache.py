"""The cache scenario: misses per call of sample and update, by method (:mod:`bench.cache`).

A cell is one (method, variant, capacity): the trace-driven ``model`` on every variant at its
capacities, and ``cachegrind`` and ``perf`` on the variants and capacities their sections of
the suite name (bench/suites/cache.json). Each cell is measured by :func:`bench.cache.run` on
the suite narrowed to that cell, so a cell's rows are exactly what the cache package emits for
it: one row per (op, stream, level), status ``unsupported`` with the reason when a method
cannot run on this machine. meta.json's ``cache_miss_method`` says, per method, "ok" or why
not; ``caches`` the cache geometry used.

Selection: ``--variants`` narrows every method (cachegrind and perf keep only the named ones
of theirs); ``--capacities`` replaces every method's capacities; ``--ops`` narrows sample /
update.
"""

from __future__ import annotations

from replaybench.bench import derive
from replaybench.bench.scenarios import Cell, RunState, Scenario, Selection, SelectionError, check_memory

__all__ = ["CacheMisses", "SCENARIO"]

METHODS = ("model", "cachegrind", "perf")
OPS = ("sample", "update")


class CacheMisses(Scenario):
    """Cache misses per call, three ways (see the module docstring)."""

    name = "cache"
    suite_keys = frozenset({"variants", "capacities", "ops", "batch", "transitions", "seed", "methods"})
    takes = frozenset({"variants", "capacities", "ops"})
    unit = "item"

    def cells(self, suite: dict, selection: Selection) -> list[Cell]:
        from replaybench.impl import registry

        where = f"suite {suite['name']!r}"
        methods = suite.get("methods")
        if not isinstance(methods, dict) or not methods or set(methods) - set(METHODS):
            raise SelectionError(f"{where}: 'methods' must map some of {list(METHODS)} to their settings")
        names = list(selection.variants or (registry.names() if suite.get("variants") == "all"
                                            else suite.get("variants") or []))
        try:
            infos = {n: registry.get(n) for n in names}
        except KeyError as err:
            raise SelectionError(f"--variants: {err.args[0]}") from None
        ops = list(selection.ops or suite.get("ops", OPS))
        unknown = sorted(set(ops) - set(OPS))
        if unknown:
            raise SelectionError(f"--ops: the cache scenario measures {list(OPS)}, not {unknown}")
        suite = {**suite, "ops": ops}
        cells = []
        for method in METHODS:
            if method not in methods:
                continue
            cfg = methods[method]
            capacities = list(selection.capacities or cfg.get("capacities", suite.get("capacities", [2**20])))
            check_memory(capacities, derive.row_bytes(derive.SCHEMAS["cartpole"]) + 8)
            chosen = cfg.get("variants", "all")
            mine = names if method == "model" or chosen == "all" else [n for n in names if n in chosen]
            for v in mine:
                params = infos[v].accepted()
                for c in capacities:
                    narrowed = {**suite, "capacities": [c],
                                "methods": {method: {**cfg, "capacities": [c], "variants": [v]}}}
                    columns = {"variant": v, "structure": infos[v].structure, "policy": "none",
                               "K": params.get("K"), "dtype": params.get("dtype"), "params": params, "capacity": c,
                               "batch": suite.get("batch", 256), "threads": 1, "op": "all", "method": method,
                               "metric": "misses_per_op", "unit": "misses",
                               "transitions": suite.get("transitions", "cartpole")}
                    cells.append(Cell(f"{method} {v} {c}", columns, narrowed))
        return cells

    def measure(self, cell: Cell, run: RunState) -> list[dict]:
        from replaybench.bench import cache

        rows: list[dict] = []
        info = cache.run(cell.spec, [cell.columns["variant"]], rows.extend, progress=False)
        run.meta["cache_miss_method"] = {**(run.meta.get("cache_miss_method") or {}), **info.get("methods", {})}
        run.meta["caches"] = info.get("caches")
        return rows

    def summarize(self, rows: list[dict], meta: dict) -> str:
        from replaybench.bench import cache

        measured = [r for r in rows if r.get("method") is not None and r.get("level") is not None]
        failed = [r for r in rows if r not in measured]
        text = cache.format_table(measured)
        if failed:
            text += "\n" + "\n".join(f"{r['method']} {r['variant']} {r['capacity']}: {r['status']} {r['error']}"
                                     for r in failed)
        return text


SCENARIO = CacheMisses()
