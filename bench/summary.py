"""The summary table of a run, computed from rows.csv (throughput is derived here, never stored).

Per cell (rows equal in :data:`bench.contract.CELL_COLUMNS`: op, capacity, variant, grid
parameters ...): the median throughput over the ``ok`` timings (items per call / seconds per
call), its spread as min-max over the same values, and the contract's ratios of medians
(:func:`bench.contract.reference_ratios`, > 1 = faster): ``x binary`` (to the binary tree) and
``x best peer`` (to the fastest available peer library for that run, op, capacity and workload,
named in the ``best peer`` column). Rows of a parameter sweep are told apart by a ``params``
column listing the grid parameters the run swept (K, dtype, batch, ...). Rows that hold no
measurement are listed after the tables, a ``below-resolution`` row with its bound.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from replaybench.bench import contract, limits, workloads
from replaybench.bench.contract import format_table  # the one text-table formatter, named here for bench's tables

__all__ = ["summarize", "summarize_cells", "format_table", "format_rows", "thread_ratios", "format_threads",
           "bound_rows", "format_bound", "format_run", "format_headline"]

#: Ops shown against the memory floor: one random row or leaf per item is what they cannot avoid.
BOUND_OPS = ("sample", "update", "insert_batch")

#: Grid parameters that are columns of their own (the others are in ``params``).
_WORKLOAD_COLUMNS = ("batch", "transitions", "threads")


def _timings(rows: list[dict]):
    """``(row, items/s)`` of each ``ok`` timing row."""
    for r in rows:
        if r.get("status") == contract.MEASURED and r.get("metric") == contract.TIMING_METRIC:
            yield r, contract.items_per_s(r["items_per_call"], r["value"])


def _spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def summarize_cells(rows: list[dict]) -> dict[tuple, dict]:
    """Throughput per cell: ``{contract.cell_key(row): {"median", "min", "max", "n", "row"}}`` in
    items/s, ``row`` being the cell's first row (what the cell is: variant, op, params ...)."""
    groups: dict[tuple, tuple[dict, list[float]]] = {}
    for r, x in _timings(rows):
        groups.setdefault(contract.cell_key(r), (r, []))[1].append(x)
    return {k: {**_spread(v), "row": r} for k, (r, v) in groups.items()}


def summarize(rows: list[dict]) -> dict[tuple, dict]:
    """``{(op, capacity, variant): {"median", "min", "max", "n"}}`` of throughput in items/s, one
    thread's rows only (rows of more threads are cells of their own: :func:`format_threads`).

    For runs with a parameter grid use :func:`summarize_cells` (this merges the grid's cells).
    """
    groups: dict[tuple, list[float]] = {}
    for r, x in _timings(rows):
        if (r.get("threads") or 1) > 1:
            continue
        groups.setdefault((r["op"], r["capacity"], r["variant"]), []).append(x)
    return {k: _spread(v) for k, v in groups.items()}


def _sortable(value) -> tuple:
    """Numbers (also their repr) before strings, numbers by value: K=2 < K=16."""
    try:
        return (0, float(value), "")
    except (TypeError, ValueError):
        return (1, 0.0, str(value))


def _num(x: float) -> str:
    """Three significant figures, no exponent for the usual ranges."""
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def format_rows(rows: list[dict], meta: dict | None = None) -> str:
    """The summary as text: overhead line, one table per op, then what was not measured."""
    meta = meta or {}
    stats = summarize(rows)
    variants = list(dict.fromkeys(r["variant"] for r in rows if r.get("variant")))
    out = []
    if meta:
        state = "complete" if meta.get("complete") else "INCOMPLETE (interrupted or still running)"
        sha = (meta.get("git_sha") or "no git")[:10] + (", dirty" if meta.get("dirty") else "")
        cpu = (meta.get("machine") or {}).get("cpu_model")
        out.append(f"Run {meta.get('run_id')}: {state}; git {sha}; {cpu}, "
                   f"{(meta.get('machine') or {}).get('usable_cpus')} CPUs")
        s = meta.get("pyperf_settings") or {}
        out.append(f"pyperf: {s.get('processes')} processes x {s.get('values')} values "
                   f"(+{s.get('warmups')} warm-up), loops {'calibrated' if not s.get('loops') else s.get('loops')}, "
                   f"min_time {s.get('min_time')} s")
    cells = summarize_cells(rows)
    overhead = next((v for k, v in stats.items() if k[0] == "empty"), None)
    if overhead:  # items_per_call is 1, so 1 / throughput is seconds per call
        out.append(f"Timing-loop overhead (empty op): {1e9 / overhead['median']:.0f} ns per call "
                   f"(min {1e9 / overhead['max']:.0f}, max {1e9 / overhead['min']:.0f}); "
                   f"included in every per-call time below.")
    cell_rows = [{**c["row"], "median": c["median"]} for c in cells.values()]
    ratios = dict(zip(cells, contract.reference_ratios(cell_rows)))
    refs = [(title, name) for title, name in contract.REFERENCES
            if any(c["row"]["variant"] == name for c in cells.values())]
    # the run's grid parameters (meta.json's selection) get a column
    varying = list(((meta.get("selection") or {}).get("params") or {}))

    def grid_value(r, name):
        return r.get(name) if name in _WORKLOAD_COLUMNS else contract.params_of(r.get("params")).get(name)

    def label(r):
        return " ".join(f"{name}={grid_value(r, name)}" for name in varying if grid_value(r, name) is not None)

    def order(key):
        r = cells[key]["row"]
        p = contract.params_of(r.get("params"))
        workload = [r.get("batch"), r.get("transitions"), p.get("mixed_adds")]
        vparams = sorted((k, repr(v)) for k, v in p.items() if k != "mixed_adds")
        return (r["capacity"], variants.index(r["variant"]), [_sortable(v) for v in workload],
                [_sortable(v) for _, v in vparams])

    for op, spec in workloads.OPS.items():
        if op == "empty":
            continue
        keys = sorted((k for k, c in cells.items() if c["row"]["op"] == op), key=order)
        if not keys:
            continue
        body = []
        has_peer = any(ratios[k]["best_peer"] for k in keys)
        for key in keys:
            s, r, ratio = cells[key], cells[key]["row"], ratios[key]
            line = [str(r["capacity"]), r["variant"]]
            if varying:
                line.append(label(r) or "-")
            line += [_num(s["median"] / spec.scale), f"{_num(s['min'] / spec.scale)}-{_num(s['max'] / spec.scale)}"]
            for _, name in refs:
                x = ratio[f"x_{name}"]
                line.append(f"{x:.2f}" if x is not None else "-")
            if has_peer:
                peer = ratio["best_peer"]
                line.append(f"{ratio['x_best_peer']:.2f}" if peer else "-")
                line.append(peer.removeprefix(contract.PEER_PREFIX) if peer else "-")
            body.append(line)
        out.append("")
        out.append(f"{op}: {spec.shown_unit} ({spec.item}), median over values")
        header = ["capacity", "variant", *(["params"] if varying else []), "median", "min-max",
                  *(t for t, _ in refs), *(["x best peer", "best peer"] if has_peer else [])]
        first = 3 if varying else 2
        out.extend(format_table(header, body, right={0, *range(first, first + 2 + len(refs) + (1 if has_peer else 0))}))
    threads = format_threads(cells, meta.get("gil_share"), meta.get("memory_limits"))
    if threads:
        out += ["", *threads]
    if meta.get("memory_limits"):
        out += ["", *format_bound(stats, rows, meta["memory_limits"])]
    missing = [r for r in rows if r.get("status") not in (None, contract.MEASURED)]
    if missing:
        out.append("")
        out.append("Not measured:")
        body = [[r.get("variant") or "", str(r.get("capacity") or ""), r.get("op") or "",
                 *([label(r) or "-"] if varying else []), r["status"], _why(r)[:100]] for r in missing]
        header = ["variant", "capacity", "op", *(["params"] if varying else []), "status", "error"]
        out.extend(format_table(header, body, right={1}))
    return "\n".join(out)


def thread_ratios(cells: dict[tuple, dict]) -> list[dict]:
    """Thread scaling: per cell run by T > 1 threads (each on its own buffer), its throughput over
    the same cell's with one thread: ``{"row", "x", "lo", "hi"}`` with ``x`` the median over the
    median and ``lo``-``hi`` the ratio of the extremes (so the widest it can be). Cells with no
    one-thread counterpart are left out."""
    one = {_without_threads(c["row"]): c for c in cells.values() if (c["row"].get("threads") or 1) == 1}
    out = []
    for c in cells.values():
        base = one.get(_without_threads(c["row"])) if (c["row"].get("threads") or 1) > 1 else None
        if base is not None:
            out.append({"row": c["row"], "x": c["median"] / base["median"], "lo": c["min"] / base["max"],
                        "hi": c["max"] / base["min"]})
    return out


def format_threads(cells: dict[tuple, dict], gil_shares: list[dict] | None = None,
                   memory_limits: dict | None = None) -> list[str]:
    """:func:`thread_ratios` as a table (empty when no cell has more than one thread). With the
    run's ``gil_share`` measurements (meta.json), the sample rows add the share g of a call that
    holds the GIL and the bound it sets on T threads, ``T / (1 + (T - 1) g)`` (Amdahl's law with
    the GIL-held part serial). With a memory probe that timed two threads
    (:func:`bench.limits.probe`), 2-thread rows add what two threads gathering random lines,
    each from its own working set of the buffer's size, got over one (the memory system's own
    scaling at that size)."""
    shares = {(g["variant"], g["capacity"]): g.get("gil_share") for g in gil_shares or ()}
    body = []
    for t in thread_ratios(cells):
        r = t["row"]
        g = shares.get((r["variant"], r["capacity"])) if r["op"] == "sample" else None
        n = r["threads"]
        memory = None
        if memory_limits and n == 2 and r.get("transitions") in workloads.SCHEMAS:
            b = limits.bound_ns(memory_limits, limits.working_set_bytes(
                r["capacity"], workloads.row_bytes(workloads.SCHEMAS[r["transitions"]])))
            memory = b["gather_ns"] / b["gather_ns_2threads"] if "gather_ns_2threads" in b else None
        body.append([r["op"], str(r["capacity"]), r["variant"], str(n), f"{t['x']:.2f}", f"{t['lo']:.2f}-{t['hi']:.2f}",
                     f"{g:.2f}" if g is not None else "-", f"{n / (1 + (n - 1) * g):.2f}" if g is not None else "-",
                     f"{memory:.2f}" if memory is not None else "-"])
    if not body:
        return []
    return ["Threads, each on its own buffer: throughput over one thread's, same run; GIL share of a sample call "
            "and the bound it sets; random gathers of 2 threads over 1 at the buffer's size",
            *format_table(["op", "capacity", "variant", "threads", "x 1 thread", "min-max", "GIL share", "bound",
                           "memory 2 thr x 1"], body, right={1, 3, 4, 5, 6, 7, 8})]


def _without_threads(row: dict) -> tuple:
    """The cell key less what the thread count changes (threads, and items per call with it)."""
    skip = ("threads", "items_per_call")
    return tuple(v for c, v in zip(contract.CELL_COLUMNS, contract.cell_key(row)) if c not in skip)


def bound_rows(stats: dict, rows: list[dict], memory_limits: dict) -> list[dict]:
    """Per (op in :data:`BOUND_OPS`, capacity, variant): ns per item (median), the gather
    floor and dependent-load latency at the buffer's working set (:func:`bench.limits.bound_ns`),
    and ``x_floor`` = ns per item / floor."""
    transitions = {(r["variant"], r["capacity"]): r.get("transitions") for r in rows if r.get("capacity")}
    out = []
    for (op, capacity, variant), s in sorted(stats.items(), key=lambda kv: (kv[0][1] or 0, kv[0][0], kv[0][2])):
        if op not in BOUND_OPS or not capacity:
            continue
        schema = workloads.SCHEMAS.get(transitions.get((variant, capacity)) or "cartpole")
        if schema is None:
            continue
        b = limits.bound_ns(memory_limits, limits.working_set_bytes(capacity, workloads.row_bytes(schema)))
        ns = 1e9 / s["median"]
        out.append({"op": op, "capacity": capacity, "variant": variant, "ns_per_item": ns, **b,
                    "x_floor": ns / b["gather_ns"]})
    return out


def format_bound(stats: dict, rows: list[dict], memory_limits: dict) -> list[str]:
    """The memory-bound table of :func:`bound_rows` as lines."""
    body = [[f"2^{b['capacity'].bit_length() - 1}", b["op"], b["variant"], f"{b['ns_per_item']:.1f}",
             f"{b['gather_ns']:.1f}", f"{b['latency_ns']:.0f}", f"{b['x_floor']:.1f}"]
            for b in bound_rows(stats, rows, memory_limits)]
    if not body:
        return []
    head = ("Memory bound here (bench/limits.py): ns per item against the random-gather floor and the "
            "dependent-load latency at the buffer's working set (rows + trees)")
    return [head, *format_table(["capacity", "op", "variant", "ns/item", "floor ns", "latency ns", "x floor"], body,
                                {0, 3, 4, 5, 6})]


def _why(row: dict) -> str:
    """The error of a row without a measurement; a below-resolution row's bound first."""
    error = row.get("error") or ""
    if row.get("status") != contract.BELOW_RESOLUTION:
        return error
    bound = f"< {row['value']:.3g} {row.get('unit') or ''} (resolution)".replace("  ", " ")
    return f"{bound}; {error}" if error else bound


def format_run(run_dir) -> str:
    """The summary of a stored run folder (rows.csv, and meta.json when there is one).

    Raises
    ------
    bench.contract.RunError
        naming the file and line, when rows.csv or meta.json breaks the results contract.
    """
    run_dir = Path(run_dir)
    meta = contract.read_meta(run_dir) if (run_dir / "meta.json").exists() else {}
    return format_rows(contract.read_rows(run_dir), meta)


def format_headline(run_dirs, capacity: int = 2**20) -> str:
    """One table across the runs of a composite suite (``make bench``): per variant at
    ``capacity``, the median throughput of each micro op, the model's cache misses per
    transition for sample and update (tree only; L1d / LL), and the sample ratio to binary
    and to the best peer, and from a run of several threads (the ``threads`` suite) the sample
    throughput of 2 threads over 1. Runs without such rows simply leave those columns empty;
    folders without a rows.csv are skipped.
    """
    runs = [contract.read_rows(d) for d in run_dirs if (Path(d) / "rows.csv").exists()]
    threaded = [any((r.get("threads") or 1) > 1 for r in rs) for rs in runs]
    rows = [r for rs, t in zip(runs, threaded) if not t for r in rs]  # one thread's ratios: one run's
    stats = summarize(rows)
    two_threads = {t["row"]["variant"]: t["x"] for t in thread_ratios(summarize_cells(
        [r for rs, t in zip(runs, threaded) if t for r in rs]))
        if t["row"]["op"] == "sample" and t["row"]["capacity"] == capacity and t["row"]["threads"] == 2}
    misses = {}
    for r in rows:
        if (r.get("scenario") == "cache" and r.get("method") == "model" and r.get("stream") == "tree"
                and r.get("status") == contract.MEASURED and r.get("capacity") == capacity):
            misses[r["variant"], r["op"], r["level"]] = r["value"] / r["items_per_call"]
    variants = sorted({k[2] for k in stats if k[1] == capacity} | {k[0] for k in misses} | set(two_threads),
                      key=lambda v: (v.startswith(contract.PEER_PREFIX), v))
    if not variants:
        return ""
    ops = [("sample", 1e6, "sample M/s"), ("update", 1e6, "update M/s"), ("insert_batch", 1e6, "insert M/s"),
           ("mixed", 1e3, "mixed K it/s")]
    sample = [{"variant": v, "op": op, "capacity": cap, "median": s["median"]}
              for (op, cap, v), s in stats.items() if op == "sample" and cap == capacity]
    ratios = {c["variant"]: x for c, x in zip(sample, contract.reference_ratios(sample))}
    header = ["variant"] + [title for _, _, title in ops] + [
        "sample miss/tr L1d", "LL", "update miss/tr L1d", "LL", "sample x binary", "sample x best peer",
        "sample 2 threads x 1"]
    body = []
    for v in variants:
        line = [v]
        for op, scale, _ in ops:
            s = stats.get((op, capacity, v))
            line.append(_num(s["median"] / scale) if s else "-")
        for op in ("sample", "update"):
            for level in ("L1d", "LL"):
                m = misses.get((v, op, level))
                line.append(f"{m:.2f}" if m is not None else "-")
        x = ratios.get(v, {})
        line += [f"{x[key]:.2f}" if x.get(key) is not None else "-" for key in ("x_binary", "x_best_peer")]
        line.append(f"{two_threads[v]:.2f}" if v in two_threads else "-")
        body.append(line)
    title = (f"Headline at capacity 2^{capacity.bit_length() - 1}: medians from the micro run, misses per "
             f"transition from the cache model (tree only), ratios within the same run")
    return "\n".join([title, *format_table(header, body, set(range(1, len(header))))])
