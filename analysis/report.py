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
from fractions import Fraction
from pathlib import Path

import pandas as pd

from replaybench.analysis import load, references, stats
from replaybench.bench import contract, derive
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
        out += ["", "Left out (could not be read, or would merge with a run above: the same folder or run id):", ""]
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


def _memory_bound(res) -> list[str]:
    """Per micro run that measured this machine's memory limits (meta.json ``memory_limits``,
    :mod:`bench.limits`): each tree op's best ns per item against the random-gather floor and
    the dependent-load latency at the buffer's working set (:func:`bench.derive.bound_rows`)."""
    out = []
    for run_id, meta in sorted(res.metas.items()):
        limits = meta.get("memory_limits")
        if not limits or meta.get("scenario") != "micro":
            continue
        table = res.table[res.table["run_id"] == run_id]
        records = table.astype(object).where(table.notna(), None).to_dict("records")
        bounds = [b for b in derive.bound_rows(derive.summarize(records), records, limits)
                  if not b["variant"].startswith(contract.PEER_PREFIX)]
        best: dict[tuple, dict] = {}
        for b in bounds:
            key = (b["op"], b["capacity"])
            if key not in best or b["ns_per_item"] < best[key]["ns_per_item"]:
                best[key] = b
        if not best:
            continue
        body = [[b["op"], f"2^{int(b['capacity']).bit_length() - 1}", f"`{b['variant']}`", _g(b["ns_per_item"]),
                 _g(b["gather_ns"]), _g(b["latency_ns"]), _g(b["x_floor"])]
                for b in sorted(best.values(), key=lambda b: (derive.BOUND_OPS.index(b["op"]), b["capacity"]))]
        out += [f"## Memory bound ({run_id})", "",
                "The best variant's cost per item against this machine's memory limits, measured at the start "
                "of the run (`replaybench limits`): the random-gather floor (one random cache line, misses "
                "overlapped: what touching one row or leaf costs at best) and the dependent-load latency (one "
                "level of a descent with nothing else in flight) at the buffer's working set (rows + trees). "
                "`x floor` = ns per item / floor.", ""]
        out += _table(["op", "capacity", "best variant", "ns per item", "floor ns", "latency ns", "x floor"], body)
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


def _grid_effects(outcome) -> list[str]:
    data = outcome.data.get("grid_effects")
    if data is None:
        return []
    body = []
    for _, e in data.iterrows():
        scale, unit = contract.op_unit(e["op"])
        body.append([e["suite"], e["op"], f"2^{int(e['capacity']).bit_length() - 1}", f"`{e['variant']}`",
                     e["transitions"], e["setting"], _g(e["median"] / scale), unit, _g(e["x_default"]),
                     f"{_g(e['x_lo'])}-{_g(e['x_hi'])}"])
    return (["## Speed parameters and threads", "",
             "Each setting's median throughput and its ratio to the run's default setting (the first value of each "
             "swept key) for the same variant, op, capacity and row kind, in the same run; the range is the ratio "
             "of the extremes. `threads=2`: two threads, each on its own buffer, against one.", ""]
            + _table(["suite", "op", "capacity", "variant", "rows", "setting", "median", "unit", "x default",
                      "range"], body) + [""])


def _concurrency(outcome) -> list[str]:
    data = outcome.data.get("concurrency")
    if data is None:
        return []
    rate = data[data["metric"] == "items_per_s"]
    # several runs may hold the same cell (concurrency and concurrency-scaling): one ratio per cell
    ratio = (data[data["metric"] == "x_global_lock"]
             .groupby([*_CONCURRENCY_KEY, "actors", "learners"], dropna=False)["median"].median())
    body = []
    for key, g in rate.groupby(_CONCURRENCY_KEY, dropna=False, sort=True):
        g = g.sort_values(["workers", "actors"])
        cells = []
        for a, l_, m in zip(g["actors"], g["learners"], g["median"]):
            x = ratio.get((*key, a, l_))
            cells.append(f"{int(a)}A+{int(l_)}L: {_g(m / 1e6)}" + (f" ({x:.2f}x)" if x is not None and pd.notna(x) else ""))
        body.append([*(("-" if pd.isna(k) else str(k)) for k in key), ", ".join(cells)])
    return (["## Concurrency", "", "Sample throughput (M transitions/s, median over repeats; insert throughput for "
             "actors alone: the two are never summed) per actor/learner split, and in brackets the ratio to "
             "global-lock in the same run and split.", ""]
            + _table(["transitions", "variant", "policy", "mode", "split: M items/s (x global-lock)"], body) + [""])


_CONCURRENCY_KEY = ["transitions", "variant", "policy", "mode"]


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


def _gossip(outcome, res) -> list[str]:
    """Issue 15's targets (the newest gossip run's ``targets.gossip``: :mod:`analysis.references`)
    beside what the gossip figures measured (medians over seeds)."""
    scaling, straggler = outcome.data.get("gossip_scaling"), outcome.data.get("gossip_straggler")
    if scaling is None:
        return []
    _, targets = references.newest(res.metas, "targets", "gossip", scenario="gossip")

    def med(data, scheme_prefix, metric=None, **where):
        d = data[data["scheme"].str.startswith(scheme_prefix)]
        if metric is not None:
            d = d[d["metric"] == metric]
        for k, v in where.items():
            d = d[d[k] == v]
        return d

    body = []
    n = targets["learners"] if targets else None
    at_n = scaling[scaling["learners"] == n] if targets else scaling.iloc[0:0]
    allreduce = med(at_n, "allreduce", "time_to_threshold_s")
    ar = allreduce["median"].iloc[0] if not allreduce.empty else None
    if targets is None:
        body.append(["issue 15's targets", "-", references.NOT_RECORDED, "-"])
    for _, g in med(at_n, "gossip", "time_to_threshold_s").iterrows():
        reached = f"{int(g['n_reached'])}/{int(g['n_seeds'])} seeds"
        text = f"{_g(g['median'])} s ({reached}) vs all-reduce {_g(ar)} s" if ar is not None else \
            f"{_g(g['median'])} s ({reached}); all-reduce not reached"
        verdict = "-" if pd.isna(g["median"]) or ar is None or pd.isna(ar) else \
            ("met" if g["median"] <= ar else "not met")
        body.append([f"{n} learners: gossip reaches the threshold in no more wall time than all-reduce",
                     g["scheme"], text, verdict])
    if targets and med(at_n, "gossip", "time_to_threshold_s").empty:
        body.append([f"{n} learners: gossip reaches the threshold in no more wall time than all-reduce", "-",
                     f"no {n}-learner runs in these results", "-"])
    if straggler is not None and targets:
        least = targets["straggler_at_least_x_allreduce"]
        slowed = straggler[(straggler["straggler"] > 1.0) & straggler["scheme"].str.startswith("gossip")]
        for _, g in slowed.iterrows():
            ratio = g["x_allreduce"]
            body.append([f"{int(g['learners'])} learners, one slowed {g['straggler']:g}x: gossip >= {least:g}x the "
                         "env steps/s of all-reduce", g["scheme"],
                         f"{_g(g['median'])} vs {_g(g['allreduce_median'])} steps/s = {_g(ratio)}x",
                         "-" if pd.isna(ratio) else ("met" if ratio >= least else "not met")])
    consensus = outcome.data.get("gossip_consensus")
    if consensus is not None:
        for (scheme, n), g in consensus.groupby(["scheme", "learners"], sort=True):
            if not scheme.startswith(("gossip", "independent")):
                continue
            body.append([f"{int(n)} learners: consensus distance stays bounded (largest over the run, per bound k)",
                         scheme,
                         f"max {_g(g['distance'].max())}, last {_g(g.sort_values('repeat')['distance'].iloc[-1])}",
                         "see figure"])
    return (["## Gossip learners", "",
             "Issue 15's targets beside the measurements (medians over seeds; `replaybench run --suite gossip`). "
             "The staleness bound k is a bound on rounds: a learner runs at most k rounds ahead of an in-peer, so "
             "with a permanent straggler every learner of a connected graph ends up at the straggler's pace plus "
             "k rounds of slack; only gossip without a bound (`gossip-free`) can leave it behind, at the price of "
             "a consensus distance that the bound no longer limits. On 2 cores, 4 or 8 learners share 2 cores: "
             "throughput cannot grow with learners there, so the figures show the trend, not the scaling.", ""]
            + _table(["target", "scheme", "measured", "verdict"], body) + [""])


def _frameworks(outcome, res) -> list[str]:
    """Per framework and buffer (its own first): cost per env step, replay share, speedup over
    its own buffer beside PAL's reported range (recorded by the frameworks runs:
    :func:`analysis.plots.frameworks.pal_speedup`), time to threshold and final return; from
    the frameworks figure's data."""
    from replaybench.analysis.plots.frameworks import pal_speedup

    data = outcome.data.get("frameworks")
    if data is None:
        return []
    pal = pal_speedup(res.metas)
    body = []
    for (fw, env, variant), g in data.groupby(["framework", "env", "variant"], sort=False):
        m = {r["metric"]: r for _, r in g.iterrows()}

        def cell(metric, scale=1.0, fmt="{:.3g}"):
            if metric not in m:
                return "-"
            r = m[metric]
            text = fmt.format(scale * r["median"])
            return text if r["n_reached"] < 2 else f"{text} ({fmt.format(scale * r['min'])}-{fmt.format(scale * r['max'])})"

        seeds = int(next(iter(m.values()))["n_seeds"])
        t = cell("time_to_threshold_s")
        reached = int(m["time_to_threshold_s"]["n_reached"]) if "time_to_threshold_s" in m else 0
        body.append((variant != "own", [fw, env, f"`{variant}`", str(seeds), cell("wall_per_step_s", 1e3),
                                        cell("replay_share", 100, "{:.0f}%"),
                                        "1 (reference)" if variant == "own" else cell("speedup_vs_own", fmt="{:.2f}"),
                                        f"{t} ({reached}/{seeds} seeds)" if reached else f"not reached (0/{seeds})",
                                        cell("final_return", fmt="{:.0f}")]))
    body = [line for _, line in sorted(body, key=lambda b: (b[1][0], b[1][1], b[0], b[1][2]))]
    if pal:
        versus = (f"PAL reports {pal[0]}-{pal[1]}x for its buffer in existing frameworks' sequential runs: compare "
                  "with the speedup column, which is bounded by ")
    else:
        versus = (f"PAL's reported speedup for its buffer in existing frameworks: {references.NOT_RECORDED}. The "
                  "speedup column is bounded by ")
    return (["## Inside other frameworks", "", "Each framework's own DQN loop (`replaybench run --suite frameworks`) "
             "with its own buffer (`own`; Stable-Baselines3 has no prioritized one, so its own is uniform) and with "
             "ours through `replaybench.adapters`, with the settings of the suite that ran it (since issue 29 the "
             "settings each framework's users run: the suite's `per_framework`, each with its source), the same seeds "
             "and settings for both buffers. Medians over seeds (min-max); "
             "replay share = the buffer's add, sample and priority-update calls over the loop's wall time; time to "
             "threshold over the seeds that reached it (a run that did not is counted in the seeds and says why in "
             "its row). " + versus
             + "the own buffer's replay share (a loop that spends 10% in replay gains at most 1.11x).", ""]
            + _table(["framework", "env", "buffer", "seeds", "ms per env step", "replay share",
                      f"speedup vs own (PAL: {pal[0]}-{pal[1]}x)" if pal else "speedup vs own",
                      "time to threshold (s)", "final return"], body) + [""])


def _paac(res) -> list[str]:
    """Issue 13's targets beside the measured ratios: PAAC stepping against its peers, DQN actors
    with E envs against 1, and PAAC (A2C) against the PAL loop (DQN) to the threshold. Targets
    and the paper's Pong rate are those the runs record (:mod:`analysis.references`:
    ``targets.paac_stepping``, ``targets.batched_inference``, ``paper.paac_pong``)."""
    from replaybench.analysis.plots._training import training_rows
    from replaybench.analysis.plots.paac_throughput import target_ratios, throughput

    out = []
    ratios = target_ratios(res.table, res.metas)
    if ratios.empty and not throughput(res.table).empty:
        out += ["## PAAC stepping against its peers", "",
                f"PAAC stepping was measured, but its targets are not: {references.NOT_RECORDED}.", ""]
    if not ratios.empty:
        body = [[r.env, r.peer, r.paac_method, r.n_workers, r.peer_n_workers, _g(r.paac), _g(r.peer_median),
                 f"{_g(r.ratio)}x", f"{_g(r.ratio_low)}-{_g(r.ratio_high)}",
                 "-" if pd.isna(r.target) else f">= {r.target:g}x", "-" if pd.isna(r.target) else
                 ("**yes**" if r.ratio_low >= r.target else "no" if r.ratio_high < r.target else "within spread")]
                for r in ratios.sort_values(["env", "peer", "n_workers"]).itertuples()]
        out += ["## PAAC stepping against its peers", "",
                f"Env steps/s at n_e = {int(ratios['n_envs'].iloc[0])} (median over windows, ratio of medians in the "
                "same run; range = min PAAC / max peer .. max PAAC / min peer). PAAC = the faster of plain and halves "
                "stepping; against per-env inference at the same n_w (processes stepping), against the other peers "
                "at PAAC's best n_w. Met = the whole range clears the target.", ""]
        out += _table(["env", "peer", "paac", "n_w", "peer n_w", "paac steps/s", "peer steps/s", "ratio",
                       "range", "target", "met"], body) + [""]
    pong = throughput(res.table)
    pong = pong[(pong["env"] == "ALE/Pong-v5") & pong["method"].isin(["paac", "paac-halves"])] if not pong.empty else pong
    if not pong.empty:
        best = pong.loc[pong["median"].idxmax()]
        paper = references.recorded(res.metas.get(best["run_id"]), "paper", "paac_pong")
        versus = (f"the paper's ~{paper['env_steps_per_s']:,.0f} {paper['setting']}" if paper else
                  f"the paper's rate: {references.NOT_RECORDED}")
        out += [f"Pong: PAAC's best stepping here is {_g(best['median'])} env steps/s ({best['method']}, "
                f"n_e = {int(best['n_envs'])}, n_w = {int(best['n_workers'])}; min-max {_g(best['min'])}-"
                f"{_g(best['max'])}), against {versus}.", ""]
    summaries = training_rows(res.table, "summary")
    steps = summaries[(summaries["metric"] == "env_steps_per_s") & (summaries["status"] == "ok")]
    if not steps.empty and steps["envs_per_actor"].nunique() > 1:
        keys = ["run_id", "algo", "env", "updates_per_step", "variant", "policy", "actors", "learners", "baseline"]
        # acting alone: env steps per second of the acting processes' env_step + inference time
        # (what the actors would sustain if the learners never held them back)
        prof = training_rows(res.table, "profile")
        acting_role = pd.Series([contract.params_of(p).get("role") in ("actor", "sequential") for p in prof["params"]],
                                index=prof.index, dtype=bool)
        prof = prof[prof["metric"].isin(["env_step", "inference"]) & acting_role]
        acting = prof.groupby([*keys, "envs_per_actor", "seed"], dropna=False).agg(
            s=("value", "sum"), params=("params", "first")).reset_index()
        # s sums the acting processes' seconds (params "processes": the actors, or a dataflow run's server)
        procs = [contract.params_of(p).get("processes") or a for p, a in zip(acting["params"], acting["actors"])]
        acting["value"] = [contract.params_of(p)["steps"] * max(1, int(n or 0)) / s if s > 0 else None
                           for p, n, s in zip(acting["params"], procs, acting["s"])]
        acting = acting.groupby([*keys, "envs_per_actor"], dropna=False)["value"].median().rename("acting")
        med = steps.groupby([*keys, "envs_per_actor"], dropna=False)["value"].agg(["median", "min", "max"])
        med = med.join(acting).reset_index()
        body = []

        def target(run_id, envs_per_actor, updates_per_step) -> str:
            """The run's batched-inference target where this row is the one it names."""
            t = references.recorded(res.metas.get(run_id), "targets", "batched_inference")
            hit = t and envs_per_actor == t["envs_per_actor"] and updates_per_step == t["updates_per_step"]
            return f">= {t['at_least']:g}x" if hit else "-"

        for key, g in med.groupby(keys, dropna=False, sort=True):
            one = g[g["envs_per_actor"] == 1]
            for _, many in g[g["envs_per_actor"] > 1].iterrows():
                if one.empty:
                    continue
                o = one.iloc[0]
                k = dict(zip(keys, key))
                who = "sequential" if k["baseline"] else f"{int(k['actors'])} A, {int(k['learners'])} L"
                body.append([f"{k['algo']} on {k['env']}", f"{k['updates_per_step']:g}",
                             f"`{k['variant']}` {k['policy']}", who,
                             int(many["envs_per_actor"]), _g(o["median"]), _g(many["median"]),
                             f"{_g(many['median'] / o['median'])}x",
                             f"{_g(many['min'] / o['max'])}-{_g(many['max'] / o['min'])}",
                             f"{_g(many['acting'] / o['acting'])}x" if o["acting"] and many["acting"] else "-",
                             target(k["run_id"], int(many["envs_per_actor"]), k["updates_per_step"])])
        if body:
            _, t = references.newest(res.metas, "targets", "batched_inference", scenario="training")
            goal = (f"DQN actors with E = {t['envs_per_actor']} at >= {t['at_least']:g}x E = 1 at the throughput "
                    f"preset ({Fraction(t['updates_per_step']).limit_denominator(1000)} updates per step)" if t else
                    references.NOT_RECORDED)
            out += ["## Batched inference in the PAL loop", "",
                    "Env steps/s with E environments per actor (one batched forward per vector step) against E = 1, "
                    "same layout, buffer and ratio (medians over seeds, range = min/max .. max/min). *Acting ratio*: "
                    "the same for the acting processes alone (env steps over their env_step + inference seconds), "
                    f"which a learner-bound run hides in rate-limiter waits. The issue's target: {goal}.", ""]
            out += _table(["task", "upd/step", "buffer", "workers", "E", "E=1 steps/s", "E steps/s", "ratio", "range",
                           "acting ratio", "target"], body) + [""]
    paac_runs = res.table[(res.table["scenario"] == "paac") & (res.table["op"] == "summary")]
    if not paac_runs.empty:
        body = []
        for (env, label), g in paac_runs.groupby(["env", "variant"], sort=True):
            t = g[g["metric"] == "time_to_threshold_s"]
            reached = t[t["status"] == "ok"]["value"]
            rate = g[(g["metric"] == "env_steps_per_s") & (g["status"] == "ok")]["value"]
            body.append([env, f"`{label}`", f"{len(reached)}/{len(t)}",
                         _g(reached.median()) if len(reached) else "not reached",
                         f"{_g(reached.min())}-{_g(reached.max())}" if len(reached) else "-",
                         _g(rate.median()) if len(rate) else "-"])
        out += ["## PAAC (A2C) vs the PAL loop (DQN): time to threshold", "",
                "Wall seconds from the first env step until the mean return of the last 20 episodes reached the "
                "threshold (median over the seeds that reached it), on the same cores.", ""]
        out += _table(["env", "run", "seeds reached", "time to threshold (s)", "min-max", "env steps/s"], body) + [""]
    return out


def _lf(outcome, res) -> list[str]:
    """The LF benchmarks (the lf figure's data): medians, speed over Ray, the paper's LF/Ray
    (where the run records ``paper.lf_over_ray``: :mod:`analysis.references`)."""
    data = outcome.data.get("lf")
    if data is None:
        return []
    run_id = data["run_id"].iloc[0]
    recorded = references.recorded(res.metas.get(run_id), "paper", "lf_over_ray") is not None
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
             f"Run `{run_id}`. Lock-step sampling (random actions), parallel Q-learning on Blackjack "
             "(time for the run's rounds) and multi-agent inference, every backend in the same run; *x Ray* is the "
             "backend's speed over Ray's median in the same cell; *paper* is Lingua Franca's over Ray's in "
             + ("arXiv 2312.04704 (32-core AWS machine), shown on our static dataflow's line" if recorded else
                f"arXiv 2312.04704: {references.NOT_RECORDED}")
             + "; *x 1 process* is the speed "
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
    lines += _machine(res) + _runs(res) + _throughput(res) + _memory_bound(res) + _k_sweep(outcome)
    lines += _grid_effects(outcome) + _cache(outcome) + _concurrency(outcome) + _training(outcome) + _paac(res)
    lines += _lf(outcome, res) + _gossip(outcome, res) + _frameworks(outcome, res) + _figures(outcome, report_path)
    return "\n".join(lines).rstrip() + "\n"
