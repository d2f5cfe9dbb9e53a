"""analysis/REPORT.md: the machine, the runs used, tables of medians with spread and ratios, the figures.

Written by ``make report`` (``replaybench report``) after the figures, in GitHub-flavoured
markdown with the figures linked relative to the report, so it renders on a code-hosting
site. The text holds no timestamp, so unchanged results give an unchanged report.

Numbers: medians over a cell's values with their spread as **min-max** (every value of every
worker process; the same spread the terminal summary prints), ratios of medians from the same
run (``x binary``: to the binary tree; ``x best peer``: to the fastest peer library in that
cell). Cells measured by several runs take the newest run's values (see
:func:`analysis.load.latest_per_cell`).
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from replaybench.analysis import load, stats
from replaybench.bench import contract
from replaybench.analysis.plots.capacity import default_timings

__all__ = ["build"]

_OPS = ["sample", "update", "insert_batch", "insert_one", "mixed"]


def _table(header: list[str], body: list[list]) -> list[str]:
    """A markdown table; numbers right-aligned."""
    right = [all(_numeric(row[i]) for row in body) if body else False for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---:" if r else "---" for r in right) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in body]
    return lines


def _numeric(text) -> bool:
    try:
        float(str(text).replace("x", "").split("-")[0] or "nan")
        return True
    except ValueError:
        return str(text) == "-"


def _g(x, digits=3) -> str:
    """Three significant figures; thousands and up as whole numbers with separators."""
    if x is None or pd.isna(x):
        return "-"
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.{digits}g}"


def _human(nbytes) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= size:
            return f"{nbytes / size:g} {unit}"
    return f"{nbytes} B"


def _machine(res) -> list[str]:
    out = ["## Machine", ""]
    seen = {}
    for run_id in sorted(res.metas, reverse=True):
        m = res.metas[run_id].get("machine") or {}
        key = (m.get("cpu_model"), m.get("logical_cpus"), tuple(sorted(load.cache_sizes(res.metas[run_id]).items())))
        seen.setdefault(key, (run_id, m))
    for (cpu, _, caches), (run_id, m) in seen.items():
        caches = ", ".join(f"{name} {_human(size)}" for name, size in caches) or "not recorded"
        mem = m.get("mem_total_bytes")
        out.append(f"- **{cpu or 'unknown CPU'}**: {m.get('usable_cpus') or m.get('logical_cpus') or '?'} usable CPUs"
                   f" ({m.get('sockets') or '?'} socket, {m.get('threads_per_core') or '?'} thread per core"
                   + (f", {m['hypervisor']} guest" if m.get("hypervisor") else "") + f"); caches {caches}"
                   + (f"; {mem / 2**30:.0f} GiB memory" if mem else "") + f"; {m.get('os') or ''}")
        libs = res.metas[run_id].get("libraries") or {}
        if libs:
            out.append("- libraries: " + ", ".join(f"{k} {v}" for k, v in sorted(libs.items())
                                                   if v and k != "python_implementation"))
    if len(seen) > 1:
        out.append("- **The runs were made on different machines**: compare numbers across runs with care.")
    return out + [""]


def _runs(res) -> list[str]:
    out = ["## Runs used", "",
           "Every run below was read; where several runs measured the same cell, the newest run's values "
           "are used (the CSV beside each figure names the run of every point).", ""]
    body = []
    table = res.table
    for run_id in sorted(res.metas):
        meta = res.metas[run_id]
        rows = table[table["run_id"] == run_id]
        statuses = rows["status"].value_counts()
        other = ", ".join(f"{n} {s}" for s, n in statuses.items() if s != "ok") or "-"
        sha = (meta.get("git_sha") or "-")[:10]
        body.append([f"`{run_id}`", (meta.get("suite") or {}).get("name") or "-", meta.get("scenario") or "-",
                     f"`{sha}`", "yes" if meta.get("dirty") else "no", "yes" if meta.get("complete") else "**no**",
                     len(rows), int(statuses.get("ok", 0)), other])
    out += _table(["run", "suite", "scenario", "git sha", "dirty", "complete", "rows", "ok", "not ok"], body)
    if res.problems:
        out += ["", "Left out (could not be read):", ""]
        out += [f"- `{p}`" for p in res.problems]
    return out + [""]


def _throughput(res) -> list[str]:
    rows = default_timings(res.table, res.metas)
    if rows.empty:
        return []
    keys = ["run_id", "op", "capacity", "batch", "transitions", "variant", "structure", "K"]
    cells = stats.ratio_columns(stats.spread(rows, keys, "items_per_s"))
    out = ["## Throughput", "",
           "Median over values, spread = min-max over the same values; `x binary` and `x best peer` are ratios "
           "of medians in the same run, op, capacity and workload (> 1 = faster). Runs without a parameter "
           "grid, every variant at its default parameters.", ""]
    ops = [op for op in _OPS if op in set(cells["op"])] + sorted(set(cells["op"]) - set(_OPS))
    for op in ops:
        scale, unit = contract.op_unit(op)
        part = cells[cells["op"] == op].sort_values(["capacity", "variant"])
        has_peer = part["best_peer"].notna().any()
        body = []
        for _, c in part.iterrows():
            line = [f"2^{int(c['capacity']).bit_length() - 1}", f"`{c['variant']}`", _g(c["median"] / scale),
                    f"{_g(c['min'] / scale)}-{_g(c['max'] / scale)}", int(c["n"]), _g(c.get("x_binary"))]
            if has_peer:
                line += [_g(c["x_best_peer"]),
                         (c["best_peer"] or "-").removeprefix(contract.PEER_PREFIX) if isinstance(c["best_peer"], str)
                         else "-"]
            body.append(line)
        out += [f"### {op} ({unit})", ""]
        out += _table(["capacity", "variant", "median", "min-max", "n", "x binary",
                       *(["x best peer", "best peer"] if has_peer else [])], body)
        out.append("")
    return out


def _cache(outcome) -> list[str]:
    data = outcome.data.get("cache_misses")
    if data is None:
        return []
    out = ["## Cache misses per transition", "",
           "Misses per call / items per call (one value per cell: the model is deterministic and cachegrind is "
           "one differential). `unsupported` = the method cannot run on this machine (or the model has no trace "
           "of that tree); `< b` = the differential is within its resolution of zero: fewer than b misses.", ""]
    rank = {m: i for i, m in enumerate(["model", "cachegrind", "perf"])}
    groups = sorted(data.groupby(["method", "stream"], sort=True), key=lambda kv: (rank.get(kv[0][0], 9), kv[0]))
    for (method, stream), part in groups:
        cols = sorted({(op, lv) for op, lv in zip(part["op"], part["level"])})
        body = []
        for (variant, cap), cell in part.groupby(["variant", "capacity"], sort=True):
            line = [f"`{variant}`", f"2^{int(cap).bit_length() - 1}"]
            for op, lv in cols:
                hit = cell[(cell["op"] == op) & (cell["level"] == lv)]
                if hit.empty:
                    line.append("")
                elif hit["status"].iloc[0] == "ok":
                    line.append(f"{hit['misses_per_transition'].iloc[0]:.3g}")
                elif hit["status"].iloc[0] == "below-resolution":  # an upper bound, not a count
                    line.append(f"< {hit['bound_per_transition'].iloc[0]:.2g}")
                else:
                    line.append(hit["status"].iloc[0])
            body.append(line)
        out += [f"### {method}, {stream}", ""]
        out += _table(["variant", "capacity", *[f"{op} {lv}" for op, lv in cols]], body)
        out.append("")
    return out


def _k_sweep(outcome) -> list[str]:
    data = outcome.data.get("k_sweep")
    if data is None:
        return []
    body = []
    for (cap, op, variant), part in data.groupby(["capacity", "op", "variant"], sort=True):
        best = part.loc[part["median"].idxmax()]
        scale, unit = contract.op_unit(op)
        body.append([f"2^{int(cap).bit_length() - 1}", op, f"`{variant}`", int(best["K"]), _g(best["median"] / scale),
                     f"{_g(best['min'] / scale)}-{_g(best['max'] / scale)}", unit,
                     ", ".join(f"{int(k)}: {_g(m / scale)}" for k, m in zip(part["K"], part["median"]))])
    return (["## Fan-out K", "", "The fastest K per layout (median throughput, min-max), and the median at every K "
             "measured.", ""]
            + _table(["capacity", "op", "variant", "best K", "median", "min-max", "unit", "median by K"], body) + [""])


def _concurrency(outcome) -> list[str]:
    data = outcome.data.get("concurrency")
    if data is None:
        return []
    part = data[data["metric"] == "aggregate_items_per_s"]
    body = []
    for key, g in part.groupby(["transitions", "variant", "policy", "mode"], dropna=False, sort=True):
        g = g.sort_values("workers")
        cells = ", ".join(f"{int(w)}: {_g(m / 1e6)}" for w, m in zip(g["workers"], g["median"]))
        body.append([*(("-" if pd.isna(k) else str(k)) for k in key), cells])
    return (["## Concurrency", "", "Aggregate insert + sample throughput (M items/s, median over repeats) by number "
             "of workers.", ""]
            + _table(["transitions", "variant", "policy", "mode", "workers: M items/s"], body) + [""])


def _training(outcome) -> list[str]:
    """One row per training configuration of every task the training_scaling figure draws (a task
    is an algorithm, environment and updates-per-step ratio); per task and buffer, its sequential
    baseline first."""
    data = outcome.data.get("training_scaling")
    if data is None:
        return []
    keys = ["task", "run_id", "variant", "K", "policy", "actors", "learners", "baseline"]
    rows = []
    for key, g in data.groupby(keys, dropna=False, sort=False):
        k = dict(zip(keys, key))
        a, n = int(k["actors"]), int(k["learners"])
        K = None if pd.isna(k["K"]) else int(k["K"])
        who = "sequential" if k["baseline"] else f"{a} actor{'s' * (a != 1)}, {n} learner{'s' * (n != 1)}"
        variant = f"`{k['variant']}`" + ("" if K is None else f" K={K}")
        line = [k["task"], f"{variant} {k['policy'] or ''}".strip(), who]
        for metric in ("time_to_threshold_s", "speedup", "env_steps_per_s", "updates_per_s"):
            hit = g[g["metric"] == metric]
            if hit.empty:
                line.append("-")
                continue
            h = hit.iloc[0]  # one row per configuration and metric (the figure's data)
            text = _g(h["median"])
            if metric == "time_to_threshold_s":
                reached = f"{int(h['n_reached'])}/{int(h['n_seeds'])} seeds"
                text = f"not reached ({reached})" if h["n_reached"] == 0 else f"{text} ({reached})"
            line.append(text)
        order = (k["task"], str(k["run_id"]), str(k["variant"]), K or 0, not k["baseline"], str(k["policy"]), a, n)
        rows.append((order, line))
    body = [line for _, line in sorted(rows, key=lambda r: r[0])]
    return (["## Training", "", "Per task (algorithm, environment, gradient updates per environment step) and buffer, "
             "the sequential baseline first, then each parallel configuration. Medians over seeds; time to threshold "
             "over the seeds that reached it (k/n = k of n seeds reached it); speedup over the sequential baseline "
             "of the same task and seed.", ""]
            + _table(["task", "variant / policy", "workers", "time to threshold (s)", "speedup", "env steps/s",
                      "updates/s"], body) + [""])


def _lf(outcome) -> list[str]:
    """The LF benchmarks (the lf figure's data): medians, speed over Ray, the paper's LF/Ray."""
    data = outcome.data.get("lf")
    if data is None:
        return []
    body = []
    for _, e in data.iterrows():
        unit = "s" if e["op"] == "pql" else "steps/s"
        batch = "-" if pd.isna(e["batch"]) else int(e["batch"])
        paper = "-" if e["paper"] is None or pd.isna(e["paper"]) else f"{e['paper']:.2f}x"
        x = "-" if pd.isna(e["x_ray"]) else f"{e['x_ray']:.2f}x"
        single = "-" if e["x_single"] is None or pd.isna(e["x_single"]) else f"{e['x_single']:.2f}x"
        body.append([e["op"], e["env"], e["policy"], int(e["actors"]), batch, e["backend"],
                     f"{_g(e['median'])} {unit}", f"{_g(e['min'])}-{_g(e['max'])}", x, paper, single])
    return (["## Lingua Franca benchmarks", "",
             f"Run `{data['run_id'].iloc[0]}`. Lock-step sampling (random actions), parallel Q-learning on Blackjack "
             "(time for the run's rounds) and multi-agent inference, every backend in the same run; *x Ray* is the "
             "backend's speed over Ray's median in the same cell; *paper* is Lingua Franca's over Ray's in "
             "arXiv 2312.04704 (32-core AWS machine), shown on our static dataflow's line; *x 1 process* is the speed "
             "over the one-process backend's (SyncVectorEnv, or the policies one after another). On a machine with "
             "fewer cores than actors, Ray's one process per env, actor or agent time-shares the cores (each message "
             "also wakes a scheduler), while the dataflow runs min(cores, envs) worker processes; the parallel "
             "Q-learning rows with 1 to 16 actors show how the gap moves with the number of actors.", ""]
            + _table(["workload", "env", "replay", "actors", "batch", "backend", "median", "min-max", "x Ray",
                      "paper LF/Ray", "x 1 process"], body) + [""])


def _figures(outcome, report_path: Path) -> list[str]:
    out = ["## Figures", ""]
    for name, paths in outcome.written.items():
        rel = lambda p: Path(os.path.relpath(p, report_path.parent)).as_posix()  # noqa: E731
        out += [f"### {outcome.titles[name]}", "", outcome.captions.get(name, ""), "",
                f"![{outcome.titles[name]}]({rel(paths[0])})", "",
                f"Data: [`{rel(paths[2])}`]({rel(paths[2])}) · vector: [`{rel(paths[1])}`]({rel(paths[1])})", ""]
    for name, why in {**outcome.skipped, **outcome.failed}.items():
        out.append(f"- *{outcome.titles.get(name, name)}*: not drawn: {why}")
    return out + [""]


def build(res, outcome, report_path) -> str:
    """The report's markdown for loaded results ``res`` and the figures ``outcome`` drew."""
    report_path = Path(report_path)
    lines = ["# replaybench report", "",
             "Generated by `make report` (`replaybench report`) from the stored runs below; regenerate it "
             "rather than editing it.", ""]
    lines += _machine(res) + _runs(res) + _throughput(res) + _k_sweep(outcome) + _cache(outcome)
    lines += _concurrency(outcome) + _training(outcome) + _lf(outcome) + _figures(outcome, report_path)
    return "\n".join(lines).rstrip() + "\n"
