"""The summary table of a run, computed from rows.csv (throughput is derived here, never stored).

Per op, capacity, variant and grid parameters: the median throughput over all values (items
per call / seconds per call), its spread as min-max over the same values, and ratios of
medians (> 1 = faster) computed within the run, for the same op, capacity and workload
(batch, transitions, mixed_adds): ``x binary`` (to the binary tree) and ``x best peer`` (to the
fastest available peer library for that cell, named in the ``best peer`` column). Rows of a
parameter sweep are told apart by a ``params`` column listing the grid parameters that vary
in the run (K, dtype, batch, ...).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from replaybench.bench import results, workloads

__all__ = ["REFERENCES", "PEER_PREFIX", "summarize", "summarize_cells", "best_peers", "format_table",
           "format_rows", "format_run", "compare_runs", "format_headline"]

#: Variants the ratio columns compare with: (column title, variant name).
REFERENCES = (("x binary", "binary"),)
PEER_PREFIX = "peer:"


def _params(row: dict) -> dict:
    p = row.get("params")
    if isinstance(p, str):
        try:
            p = json.loads(p)
        except ValueError:
            p = {}
    return p if isinstance(p, dict) else {}


def _cell_key(r: dict) -> tuple:
    """(op, capacity, variant, workload, variant params) of one row; the last two as sorted tuples."""
    p = _params(r)
    workload = (("batch", r.get("batch")), ("transitions", r.get("transitions")),
                ("mixed_adds", p.get("mixed_adds")))
    vparams = tuple(sorted((k, repr(v)) for k, v in p.items() if k != "mixed_adds"))
    return r["op"], r["capacity"], r["variant"], workload, vparams


def summarize_cells(rows: list[dict]) -> dict[tuple, dict]:
    """Like :func:`summarize`, keyed by (op, capacity, variant, workload, variant params)."""
    groups: dict[tuple, list[float]] = {}
    for r in rows:
        if r.get("status") == "ok" and r.get("metric") == "seconds_per_call" and r.get("value"):
            groups.setdefault(_cell_key(r), []).append(r["items_per_call"] / r["value"])
    return {k: {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)}
            for k, v in groups.items()}


def summarize(rows: list[dict]) -> dict[tuple, dict]:
    """``{(op, capacity, variant): {"median", "min", "max", "n"}}`` of throughput in items/s.

    For runs with a parameter grid use :func:`summarize_cells` (this merges the grid's cells).
    """
    groups: dict[tuple, list[float]] = {}
    for r in rows:
        if r.get("status") == "ok" and r.get("metric") == "seconds_per_call" and r.get("value"):
            key = (r["op"], r["capacity"], r["variant"])
            groups.setdefault(key, []).append(r["items_per_call"] / r["value"])
    return {k: {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)}
            for k, v in groups.items()}


def best_peers(stats: dict[tuple, dict]) -> dict[tuple, tuple[str, float]]:
    """``{(op, capacity, workload): (peer, median)}``: the fastest peer library for each cell."""
    best: dict[tuple, tuple[str, float]] = {}
    for (op, cap, variant, workload, _), s in stats.items():
        if variant.startswith(PEER_PREFIX):
            key = (op, cap, workload)
            if key not in best or s["median"] > best[key][1]:
                best[key] = (variant, s["median"])
    return best


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


def format_table(header: list[str], body: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(str(row[i])) for row in [header, *body]) for i in range(len(header))]
    fmt = lambda row: "  ".join(str(c).rjust(w) if i in right else str(c).ljust(w)  # noqa: E731
                                for i, (c, w) in enumerate(zip(row, widths))).rstrip()
    return [fmt(header), fmt(["-" * w for w in widths]), *map(fmt, body)]


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
    refs = [(title, name) for title, name in REFERENCES if any(k[2] == name for k in cells)]
    best = best_peers(cells)
    # the run's grid parameters (meta.json's selection) get a column
    grid_keys = list(((meta.get("selection") or {}).get("params") or {}))
    varying = [(3 if name in ("batch", "transitions", "mixed_adds") else 4, name) for name in grid_keys]

    def label(key):
        parts = []
        for idx, name in varying:
            value = dict(key[idx]).get(name)
            if value is not None:
                parts.append(f"{name}={value if idx == 3 else value.strip(chr(39))}")
        return " ".join(parts)

    def row_label(r):
        parts = []
        for idx, name in varying:
            value = r.get(name) if name in ("batch", "transitions") else _params(r).get(name)
            if value is not None:
                parts.append(f"{name}={value}")
        return " ".join(parts)

    def ref_median(key, name):
        op, cap, _, workload, vparams = key
        cands = [(k, s) for k, s in cells.items() if k[:4] == (op, cap, name, workload)]
        if not cands:
            return None
        same = [s for k, s in cands if dict(k[4]).get("dtype") == dict(vparams).get("dtype")]
        return (same or [cands[0][1]])[0]["median"]

    for op, spec in workloads.OPS.items():
        if op == "empty":
            continue
        keys = sorted((k for k in cells if k[0] == op),
                      key=lambda k: (k[1], variants.index(k[2]), [_sortable(v) for _, v in k[3]],
                                     [_sortable(v) for _, v in k[4]]))
        if not keys:
            continue
        body = []
        has_peer = any((op, k[1], k[3]) in best for k in keys)
        for key in keys:
            s = cells[key]
            row = [str(key[1]), key[2]]
            if varying:
                row.append(label(key) or "-")
            row += [_num(s["median"] / spec.scale), f"{_num(s['min'] / spec.scale)}-{_num(s['max'] / spec.scale)}"]
            for _, name in refs:
                ref = ref_median(key, name)
                row.append(f"{s['median'] / ref:.2f}" if ref else "-")
            if has_peer:
                peer = best.get((op, key[1], key[3]))
                row.append(f"{s['median'] / peer[1]:.2f}" if peer else "-")
                row.append(peer[0][len(PEER_PREFIX):] if peer else "-")
            body.append(row)
        out.append("")
        out.append(f"{op}: {spec.shown_unit} ({spec.item}), median over values")
        header = ["capacity", "variant", *(["params"] if varying else []), "median", "min-max",
                  *(t for t, _ in refs), *(["x best peer", "best peer"] if has_peer else [])]
        first = 3 if varying else 2
        out.extend(format_table(header, body, right={0, *range(first, first + 2 + len(refs) + (1 if has_peer else 0))}))
    missing = [r for r in rows if r.get("status") not in (None, "ok")]
    if missing:
        out.append("")
        out.append("Not measured:")
        body = [[r.get("variant") or "", str(r.get("capacity") or ""), r.get("op") or "",
                 *([row_label(r) or "-"] if varying else []),
                 r["status"], (r.get("error") or "")[:100]] for r in missing]
        header = ["variant", "capacity", "op", *(["params"] if varying else []), "status", "error"]
        out.extend(format_table(header, body, right={1}))
    return "\n".join(out)


def format_run(run_dir) -> str:
    """The summary of a stored run folder (rows.csv + meta.json)."""
    run_dir = Path(run_dir)
    meta = results.read_meta(run_dir) if (run_dir / "meta.json").exists() else {}
    return format_rows(results.read_rows(run_dir), meta)


def compare_runs(run_a, run_b) -> str:
    """Run-to-run spread of the medians of two stored runs of the same grid.

    Per cell measured in both: the medians' ratio b / a, and per op the largest
    ``|b / a - 1|``; the harness's empty op is left out.
    """
    a = summarize_cells(results.read_rows(run_a))
    b = summarize_cells(results.read_rows(run_b))
    common = sorted((k for k in a if k in b and k[0] != "empty"), key=lambda k: (k[0], k[1], k[2], k[4]))
    body, worst = [], {}
    for key in common:
        ratio = b[key]["median"] / a[key]["median"]
        spec = workloads.OPS[key[0]]
        body.append([key[0], str(key[1]), key[2], _num(a[key]["median"] / spec.scale),
                     _num(b[key]["median"] / spec.scale), f"{100 * (ratio - 1):+.1f}%"])
        worst[key[0]] = max(worst.get(key[0], 0.0), abs(ratio - 1))
    out = [f"Medians of {Path(run_a).name} (a) and {Path(run_b).name} (b), items/s in each op's unit", ""]
    out += format_table(["op", "capacity", "variant", "a", "b", "b/a - 1"], body, right={1, 3, 4, 5})
    out.append("")
    out.append("Largest |b/a - 1| per op: " + ", ".join(f"{op} {100 * w:.1f}%" for op, w in worst.items()))
    return "\n".join(out)


def format_headline(run_dirs, capacity: int = 2**20) -> str:
    """One table across the runs of a composite suite (``make bench``): per variant at
    ``capacity``, the median throughput of each micro op, the model's cache misses per
    transition for sample and update (tree only; L1d / LL), and the sample ratio to binary
    and to the best peer. Runs without micro or cache rows simply leave those columns empty;
    folders without a rows.csv are skipped.
    """
    rows = [r for d in run_dirs if (Path(d) / "rows.csv").exists() for r in results.read_rows(d)]
    stats = summarize(rows)
    misses = {}
    for r in rows:
        if (r.get("scenario") == "cache" and r.get("method") == "model" and r.get("stream") == "tree"
                and r.get("status") == "ok" and r.get("capacity") == capacity):
            misses[r["variant"], r["op"], r["level"]] = r["value"] / r["items_per_call"]
    variants = sorted({k[2] for k in stats if k[1] == capacity} | {k[0] for k in misses},
                      key=lambda v: (v.startswith(PEER_PREFIX), v))
    if not variants:
        return ""
    ops = [("sample", 1e6, "sample M/s"), ("update", 1e6, "update M/s"), ("insert_batch", 1e6, "insert M/s"),
           ("mixed", 1e3, "mixed K it/s")]
    peers = [s for (op, cap, v), s in stats.items() if op == "sample" and cap == capacity and v.startswith(PEER_PREFIX)]
    best_peer = max((s["median"] for s in peers), default=None)
    binary = stats.get(("sample", capacity, "binary"))
    header = ["variant"] + [title for _, _, title in ops] + [
        "sample miss/tr L1d", "LL", "update miss/tr L1d", "LL", "sample x binary", "sample x best peer"]
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
        s = stats.get(("sample", capacity, v))
        line.append(f"{s['median'] / binary['median']:.2f}" if s and binary else "-")
        line.append(f"{s['median'] / best_peer:.2f}" if s and best_peer else "-")
        body.append(line)
    title = (f"Headline at capacity 2^{capacity.bit_length() - 1}: medians from the micro run, misses per "
             f"transition from the cache model (tree only), ratios within the same run")
    return "\n".join([title, *format_table(header, body, set(range(1, len(header))))])
