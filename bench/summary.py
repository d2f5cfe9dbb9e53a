"""The summary table of a run, computed from rows.csv (throughput is derived here, never stored).

Per op, capacity and variant: the median throughput over all values (items per call /
seconds per call), its spread as min-max over the same values, and the ratio of medians to
``binary`` and to ``peer:cpprb`` at the same capacity and op in the same run (> 1 = faster).
"""

from __future__ import annotations

import statistics
from pathlib import Path

from bench import results, workloads

__all__ = ["REFERENCES", "summarize", "format_table", "format_rows", "format_run"]

#: Variants the ratio columns compare with: (column title, variant name).
REFERENCES = (("x binary", "binary"), ("x cpprb", "peer:cpprb"))


def summarize(rows: list[dict]) -> dict[tuple, dict]:
    """``{(op, capacity, variant): {"median", "min", "max", "n"}}`` of throughput in items/s."""
    groups: dict[tuple, list[float]] = {}
    for r in rows:
        if r.get("status") == "ok" and r.get("metric") == "seconds_per_call" and r.get("value"):
            key = (r["op"], r["capacity"], r["variant"])
            groups.setdefault(key, []).append(r["items_per_call"] / r["value"])
    return {k: {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)}
            for k, v in groups.items()}


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
    overhead = next((v for k, v in stats.items() if k[0] == "empty"), None)
    if overhead:  # items_per_call is 1, so 1 / throughput is seconds per call
        out.append(f"Timing-loop overhead (empty op): {1e9 / overhead['median']:.0f} ns per call "
                   f"(min {1e9 / overhead['max']:.0f}, max {1e9 / overhead['min']:.0f}); "
                   f"included in every per-call time below.")
    refs = [(title, name) for title, name in REFERENCES if any(k[2] == name for k in stats)]
    for op, spec in workloads.OPS.items():
        if op == "empty":
            continue
        keys = sorted((k for k in stats if k[0] == op), key=lambda k: (k[1], variants.index(k[2])))
        if not keys:
            continue
        body = []
        for key in keys:
            s = stats[key]
            row = [str(key[1]), key[2], _num(s["median"] / spec.scale),
                   f"{_num(s['min'] / spec.scale)}-{_num(s['max'] / spec.scale)}"]
            for _, name in refs:
                ref = stats.get((op, key[1], name))
                row.append(f"{s['median'] / ref['median']:.2f}" if ref else "-")
            body.append(row)
        out.append("")
        out.append(f"{op}: {spec.shown_unit} ({spec.item}), median over values")
        header = ["capacity", "variant", "median", "min-max", *(t for t, _ in refs)]
        out.extend(format_table(header, body, right={0, 2, 3, *range(4, 4 + len(refs))}))
    missing = [r for r in rows if r.get("status") not in (None, "ok")]
    if missing:
        out.append("")
        out.append("Not measured:")
        body = [[r.get("variant") or "", str(r.get("capacity") or ""), r.get("op") or "", r["status"],
                 (r.get("error") or "")[:100]] for r in missing]
        out.extend(format_table(["variant", "capacity", "op", "status", "error"], body, right={1}))
    return "\n".join(out)


def format_run(run_dir) -> str:
    """The summary of a stored run folder (rows.csv + meta.json)."""
    run_dir = Path(run_dir)
    meta = results.read_meta(run_dir) if (run_dir / "meta.json").exists() else {}
    return format_rows(results.read_rows(run_dir), meta)
