"""Cache misses per operation, three ways: a trace-driven model, cachegrind, perf.

Pieces: :mod:`.model` (set-associative LRU cache fed byte addresses), :mod:`.traces` (the
addresses one sample / update touches, replayed from the tree's public layout and declared
kernel set), :mod:`.meters` (``model``, ``cachegrind``, ``perf``: records of misses per call)
and :mod:`._driver` (the program cachegrind and perf run). docs/cache-misses.md says how the
methods compare; analysis/REPORT.md has the measurements.

Entry point for the harness::

    bench.cache.run(suite: dict, variants: list[str] | None, emit_rows: callable, progress: bool) -> dict

``suite`` is bench/suites/cache.json (or the same shape); ``variants`` None means the suite's;
``emit_rows(list_of_dicts)`` is called as each (method, variant, capacity) finishes, with rows
shaped like the micro scenario's (scenario "cache", metric "misses_per_op", unit "misses",
plus columns ``level`` (L1d / LL), ``method``, ``stream`` (tree / tree+data), ``cache_config``);
``value`` is misses per *call* (one call = ``batch`` = 256 items: divide by
``items_per_call`` for misses per transition). Returns ``{"methods": {method: "ok" or the
reason it is unsupported}, "caches": {...}}`` for meta.json. Development CLI:
``python -m replaybench.bench.cache --variants binary kary-aligned --capacities 2**20``.

Row status per level: ``ok`` (``value`` measured; for a differential, ``error`` states its
resolution), ``below-resolution`` (a differential within its resolution of zero: ``value`` is
the upper bound, ``error`` the measured value and the resolution), ``unsupported`` (the method
cannot run here, or the model has no replay of this tree's kernels: never traced with another
tree's), ``skipped`` (no sum tree) or ``failed``, the reason in ``error``. No row holds a
negative count or an unmeasured 0.

Cost: the model replays ``warm_calls + calls`` batches per op and cell in numba (seconds per
cell at 2**22); cachegrind makes ``1 + 2 * ops`` valgrind runs per cell, each about 50x
slower than native, ``jobs`` at a time while the model runs.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from replaybench.bench import contract

from . import meters
from .model import CacheLevel, CacheModel, simulate  # noqa: F401 - re-exported

__all__ = ["run", "load_suite", "format_table", "rows_for", "CacheLevel", "CacheModel", "simulate"]

SUITES = Path(__file__).resolve().parent.parent / "suites"


def load_suite(name_or_path: str = "cache") -> dict:
    p = Path(name_or_path)
    if not p.suffix:
        p = SUITES / f"{name_or_path}.json"
    return json.loads(p.read_text())


def _info(name: str) -> dict:
    from replaybench.impl import registry

    v = registry.get(name)
    params = v.accepted()
    return {"variant": name, "structure": v.structure, "policy": "none", "K": params.get("K"),
            "dtype": params.get("dtype"), "params": params}


def rows_for(info: dict, suite: dict, capacity: int, results: dict) -> list[dict]:
    """Rows (one per level) for each ``(op, stream) -> record`` of one measurement."""
    rows = []
    batch = suite.get("batch", 256)
    for (op, stream), rec in results.items():
        base = {"scenario": suite.get("scenario", "cache"), **info, "capacity": capacity, "batch": batch,
                "threads": 1, "transitions": suite.get("transitions", "cartpole"), "op": op,
                "metric": "misses_per_op", "unit": "misses", "items_per_call": batch, "method": rec["method"],
                "stream": stream, "cache_config": rec.get("cache_config")}
        for level in meters.LEVELS:
            status, value, note = meters.level_reading(rec, level)
            rows.append({**base, "level": level, "value": value, "status": status, "error": note})
    return rows


def _failed(method, keys, err) -> dict:
    return {k: meters.record(method, "failed", error=f"{type(err).__name__}: {err}") for k in keys}


def run(suite: dict, variants: list[str] | None, emit_rows, progress: bool = True) -> dict:
    """Measure the suite's grid with every method it declares; see the module docstring."""
    from tqdm import tqdm

    from replaybench.impl import registry

    from ._driver import build

    names = list(variants) if variants else (
        registry.names() if suite["variants"] == "all" else list(suite["variants"]))
    infos = {n: _info(n) for n in names}  # unknown names raise KeyError before anything runs
    methods = suite.get("methods", {})
    ops = list(suite.get("ops", ["sample", "update"]))
    batch = suite.get("batch", 256)
    caches = meters.machine_caches()
    status = {"model": "ok"}

    def subset(cfg):
        chosen = cfg.get("variants", "all")
        return names if chosen == "all" else [n for n in names if n in chosen]

    work = []  # (method, variant, capacity)
    if "model" in methods:
        work += [("model", v, c) for v in names for c in methods["model"].get("capacities", suite["capacities"])]
    for m in ("cachegrind", "perf"):
        if m in methods:
            work += [(m, v, c) for v in subset(methods[m]) for c in methods[m].get("capacities", [2**20])]
    bar = tqdm(total=len(work), desc=suite.get("name", "cache"), unit="item", disable=not progress,
               dynamic_ncols=True)

    def done(method, variant, capacity, results):
        emit_rows(rows_for(infos[variant], suite, capacity, results))
        bar.update(1)

    # cachegrind: background threads, valgrind runs `jobs` at a time, while the model runs here
    cg_futures = []
    inner = outer = None
    if "cachegrind" in methods:
        cfg = methods["cachegrind"]
        ok, why = meters.cachegrind_support()
        status["cachegrind"] = "ok" if ok else why
        keys = [(op, s) for op in ops for s in cfg.get("streams", ["tree"]) if (op, s) in meters._DRIVER_OPS]
        inner = ThreadPoolExecutor(max(1, cfg.get("jobs", 2)))
        outer = ThreadPoolExecutor(8)

        def cg_item(v, c):
            has_tree = infos[v]["structure"] != "uniform"
            mine = [k for k in keys if has_tree or k[1] != "tree"]
            skipped = {k: meters.record("cachegrind", "skipped", error="no sum tree") for k in keys if k not in mine}
            if not mine:
                return skipped
            try:
                calls = cfg.get("calls", "auto")
                if calls == "auto":
                    sec = meters.native_seconds_per_call(v, c, mine, batch)
                    calls = meters.cachegrind_calls(sec, cfg.get("seconds_per_run", 3))
                res = meters.measure_cachegrind(v, c, mine, batch=batch, calls=int(calls),
                                                warm_calls=cfg.get("warm_calls", 16), caches=caches,
                                                timeout=cfg.get("timeout_s", 600), pool=inner)
            except Exception as err:  # noqa: BLE001 - one failing item is recorded, the rest go on
                res = _failed("cachegrind", mine, err)
            return {**res, **skipped}

        for (m, v, c) in work:
            if m == "cachegrind":
                cg_futures.append(((m, v, c), outer.submit(cg_item, v, c)))

    def drain(block=False):
        for item in list(cg_futures):
            key, fut = item
            if block or fut.done():
                done(*key, fut.result())
                cg_futures.remove(item)

    try:
        if "model" in methods:
            cfg = methods["model"]
            for (m, v, c) in work:
                if m != "model":
                    continue
                try:
                    buf = build(v, c, suite.get("seed", 0))
                    res = meters.measure_model(buf, ops, batch=batch, warm_calls=cfg.get("warm_calls", 128),
                                               calls=cfg.get("calls", 256), l1=caches["L1d"], l2=caches["L2"],
                                               seed=suite.get("seed", 0))
                    del buf
                except Exception as err:  # noqa: BLE001
                    res = _failed("model", [("sample", "tree"), ("update", "tree")], err)
                done(m, v, c, res)
                drain()
        if "perf" in methods:
            cfg = methods["perf"]
            ok, why = meters.perf_support()
            status["perf"] = "ok" if ok else why
            for (m, v, c) in work:
                if m == "perf":
                    keys = [(op, "tree") for op in ops]
                    if infos[v]["structure"] == "uniform":
                        res = {k: meters.record("perf", "skipped", error="no sum tree") for k in keys}
                    else:
                        res = meters.measure_perf(v, c, keys, batch=batch, calls=cfg.get("calls", 2000),
                                                  warm_calls=cfg.get("warm_calls", 64))
                    done(m, v, c, res)
        while cg_futures:
            drain()
            time.sleep(0.2)
    finally:
        bar.close()
        for pool in (outer, inner):
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
    return {"methods": status, "caches": {k: (v.describe() if isinstance(v, CacheLevel) else v)
                                          for k, v in caches.items()}}


def format_table(rows: list[dict]) -> str:
    """Misses per call by (variant, capacity, op, stream) x (method, level)."""
    cols = sorted({(r["method"], r["level"]) for r in rows},
                  key=lambda x: (["model", "cachegrind", "perf"].index(x[0]) if x[0] in ("model", "cachegrind", "perf")
                                 else 9, x[1]))
    keys = sorted({(r["variant"], r["capacity"], r["op"], r["stream"]) for r in rows},
                  key=lambda k: (k[1], k[2], k[3], k[0]))
    cell = {}
    for r in rows:
        k = (r["variant"], r["capacity"], r["op"], r["stream"])
        cell[k, (r["method"], r["level"])] = (f"{r['value']:.1f}" if r["status"] == "ok" and r["value"] is not None
                                             else f"< {r['value']:.2g}" if r["status"] == meters.BELOW_RESOLUTION
                                             else r["status"])
    head = ["variant", "capacity", "op", "stream"] + [f"{m} {lv}" for m, lv in cols]
    body = [[k[0], f"2^{int(k[1]).bit_length() - 1}", k[2], k[3]] + [cell.get((k, c), "") for c in cols] for k in keys]
    text = "\n".join(contract.format_table(head, body, right=set(range(4, len(head)))))
    notes = sorted({f"{r['method']}: {r['error']}" for r in rows
                    if r["status"] not in ("ok", meters.BELOW_RESOLUTION) and r.get("error")})
    if any(r["status"] == meters.BELOW_RESOLUTION for r in rows):
        notes.append("< b: the differential is within its resolution of zero; fewer than b misses per call")
    return ("misses per call (one call = batch items)\n" + text + ("\n" + "\n".join(notes) if notes else ""))
