"""analysis/REPORT.md and its host pages: the findings first, everything else one page per host.

Written by ``make report`` (``replaybench report``) after the figures, in GitHub-flavoured
markdown with the figures linked relative to each page, so it renders on a code-hosting site.
The text holds no timestamp, so unchanged results give unchanged pages.

- **REPORT.md** (:func:`build_pages`): the findings (:mod:`analysis.findings`: the papers'
  claims with their verdicts, each row linking its headline figure (:mod:`analysis.headline`)
  and its section on the host's page; the hosts; which design when) and the list of host pages.
  It stays a front page (under about 200 lines): every table of measurements is on a host page.
- **report/<host>.md** (:func:`build`): one host's machine, then one section per claim of the
  papers that its runs bear on, in the claims' order: the verdict, the headline figure with the
  table of its points, then every section and figure tied to that claim (a figure module's
  ``CLAIMS``: :mod:`analysis.plots`), each figure right after its section's first table; then the
  sections tied to no claim ("Other measurements"), the runs used (with why superseded runs were
  slower: :func:`analysis.findings.slowdown`) and the figures not drawn. :func:`build` refuses
  results of two hosts (:class:`analysis.findings.PooledHosts`), so no page pools hosts.

Numbers: medians over a cell's values with their spread as **min-max** (every value of every
worker process; the same spread the terminal summary prints), ratios of medians from the same
run (``x binary``: to the binary tree; ``x best peer``: to the fastest peer library in that
cell). Cells measured by several runs take the newest run's values (see
:func:`analysis.load.latest_per_cell`).

This module writes the sections that are no one figure's (machine, runs, throughput, memory
bound, op floors, PAAC: :data:`_PLACED`); the sections drawn from a figure's data come from the
figure modules' ``report_section`` (:mod:`analysis.plots`).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import pandas as pd

from replaybench.analysis import claims as claims_mod
from replaybench.analysis import findings, load, plots, references, stats
from replaybench.analysis import markdown as md
from replaybench.bench import contract, derive
from replaybench.analysis.plots.capacity import default_timings

__all__ = ["build", "build_pages", "page_name", "claim_heading", "PAGES"]

#: The folder of the host pages, beside REPORT.md.
PAGES = "report"

_OPS = ["sample", "update", "insert_batch", "insert_one", "mixed"]


def _machine(res) -> list[str]:
    out = ["## Machine", ""]
    seen = {}
    for run_id in sorted(res.metas, reverse=True):
        m = res.metas[run_id].get("machine") or {}
        key = (m.get("cpu_model"), m.get("logical_cpus"), tuple(sorted(load.cache_sizes(res.metas[run_id]).items())))
        seen.setdefault(key, (run_id, m))
    for (cpu, _, caches), (run_id, m) in seen.items():
        caches = ", ".join(f"{name} {md.human_bytes(size)}" for name, size in caches) or "not recorded"
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


def _dirty(dirty) -> str:
    """meta.json's ``dirty`` in the runs table: ``unknown`` where the run recorded none (made
    where git was not at hand, such as a device machine's copy of the tree), never ``no``."""
    return "yes" if dirty else "no" if dirty is False else "unknown"


def _runs(res) -> list[str]:
    out = ["## Runs used", "",
           "Every run below was read; where several runs measured the same cell, the newest run's values "
           "are used (the CSV beside each figure names the run of every point). *host*: the CPU model, logical "
           "CPUs and caches the run recorded (:func:`analysis.load.host_of`); *superseded*: a later run of the same "
           "host re-measured its scenario with a recorded commit (why, and why its calls were slower, below the "
           "table).", ""]
    body = []
    table = res.table
    gone = findings.superseded(res)
    for run_id in sorted(res.metas):
        meta = res.metas[run_id]
        rows = table[table["run_id"] == run_id]
        statuses = rows["status"].value_counts()
        other = ", ".join(f"{n} {s}" for s, n in statuses.items() if s != "ok") or "-"
        sha = (meta.get("git_sha") or "-")[:10]
        body.append([f"`{run_id}`", f"`{load.host_of(meta)}`", (meta.get("suite") or {}).get("name") or "-",
                     meta.get("scenario") or "-", f"`{sha}`", _dirty(meta.get("dirty")),
                     "yes" if meta.get("complete") else "**no**", "**yes**" if run_id in gone else "-",
                     len(rows), int(statuses.get("ok", 0)), other])
    out += md.table(["run", "host", "suite", "scenario", "git sha", "dirty", "complete", "superseded", "rows", "ok",
                     "not ok"], body)
    if gone:
        out += ["", "Superseded runs: why, and what the stored data says of why their calls were slower (the "
                "usable CPUs and CPU quota each run recorded, the machine's memory probe of each, and the cells both "
                "measured with one worker process, which neither a CPU quota nor other workers slow):", ""]
        out += [f"- `{run_id}`: {why}; {findings.slowdown(res, run_id)}" for run_id, why in gone.items()]
    return out + [""]


def _left_out(problems) -> list[str]:
    """The runs that could not be read or would have merged with another (REPORT.md's list)."""
    if not problems:
        return []
    return (["Left out (could not be read, or would merge with a run named before it: the same folder or run id):",
             ""] + [f"- `{p}`" for p in problems] + [""])


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
            line = [f"2^{int(c['capacity']).bit_length() - 1}", f"`{c['variant']}`", md.num(c["median"] / scale),
                    f"{md.num(c['min'] / scale)}-{md.num(c['max'] / scale)}", int(c["n"]), md.num(c.get("x_binary"))]
            if has_peer:
                line += [md.num(c["x_best_peer"]),
                         (c["best_peer"] or "-").removeprefix(contract.PEER_PREFIX) if isinstance(c["best_peer"], str)
                         else "-"]
            body.append(line)
        out += [f"### {op} ({unit})", ""]
        out += md.table(["capacity", "variant", "median", "min-max", "n", "x binary",
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
        body = [[b["op"], f"2^{int(b['capacity']).bit_length() - 1}", f"`{b['variant']}`", md.num(b["ns_per_item"]),
                 md.num(b["gather_ns"]), md.num(b["latency_ns"]), md.num(b["x_floor"])]
                for b in sorted(best.values(), key=lambda b: (derive.BOUND_OPS.index(b["op"]), b["capacity"]))]
        out += [f"## Memory bound ({run_id})", "",
                "The best variant's cost per item against this machine's memory limits, measured at the start "
                "of the run (`replaybench limits`): the random-gather floor (one random cache line, misses "
                "overlapped: what touching one row or leaf costs at best) and the dependent-load latency (one "
                "level of a descent with nothing else in flight) at the buffer's working set (rows + trees). "
                "`x floor` = ns per item / floor.", ""]
        out += md.table(["op", "capacity", "best variant", "ns per item", "floor ns", "latency ns", "x floor"], body)
        out.append("")
        out += _op_floors(run_id, records, limits)
    return out


def _op_floors(run_id: str, records: list[dict], limits: dict) -> list[str]:
    """Every op of a micro run as a fraction of the floor of its access pattern
    (:func:`bench.derive.floor_rows`); nothing for a run whose probe predates the op floors
    (its section above stays as it was written)."""
    if not limits.get("op_floors"):
        return []
    floors = derive.floor_rows(derive.summarize(records), records, limits)
    if not floors:
        return []
    body = [[b["op"], f"2^{int(b['capacity']).bit_length() - 1}", f"`{b['variant']}`", md.num(b["ns_per_item"]),
             md.num(b["floor_ns"]) if b["floor_ns"] is not None else "no floor measured",
             md.num(b["of_floor"]) if b["of_floor"] is not None else "-", "**beats its floor**" if b["beats"] else ""]
            for b in sorted(floors, key=lambda b: (b["op"], b["capacity"], b["variant"]))]
    f = limits["op_floors"]
    out = [f"## Op floors ({run_id})", "",
           f"Each op's median cost per item against the floor of its own access pattern, run by the probe at the "
           f"start of the run (`bench/floors.py`: batch {f['batch']}, K={f['K']}, {f['row_bytes']}-byte rows"
           f"{'' if f.get('row_stride') is None else ' ' + str(f['row_stride']) + ' bytes apart'}): for "
           "sample, the descent's levels one after another with the loads of all draws in flight, then the row "
           "gather; for sample_indices the descent alone; for update the levels upward over the sum and the min "
           "tree; for `uniform`'s sample the row gather alone. `of floor` = floor / ns per item (1 = at the "
           f"floor); an op whose fastest value beats its floor by more than {derive.FLOOR_NOISE:.0%} is flagged.",
           ""]
    out += md.table(["op", "capacity", "variant", "ns per item", "floor ns", "of floor", ""], body)
    out.append("")
    return out


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
        body = [[r.env, r.peer, r.paac_method, r.n_workers, r.peer_n_workers, md.num(r.paac), md.num(r.peer_median),
                 f"{md.num(r.ratio)}x", f"{md.num(r.ratio_low)}-{md.num(r.ratio_high)}",
                 "-" if pd.isna(r.target) else f">= {r.target:g}x", "-" if pd.isna(r.target) else
                 ("**yes**" if r.ratio_low >= r.target else "no" if r.ratio_high < r.target else "within spread")]
                for r in ratios.sort_values(["env", "peer", "n_workers"]).itertuples()]
        out += ["## PAAC stepping against its peers", "",
                f"Env steps/s at n_e = {int(ratios['n_envs'].iloc[0])} (median over windows, ratio of medians in the "
                "same run; range = min PAAC / max peer .. max PAAC / min peer). PAAC = the faster of plain and halves "
                "stepping; against per-env inference at the same n_w (processes stepping), against the other peers "
                "at PAAC's best n_w. Met = the whole range clears the target.", ""]
        out += md.table(["env", "peer", "paac", "n_w", "peer n_w", "paac steps/s", "peer steps/s", "ratio",
                       "range", "target", "met"], body) + [""]
    pong = throughput(res.table)
    pong = pong[(pong["env"] == "ALE/Pong-v5") & pong["method"].isin(["paac", "paac-halves"])] if not pong.empty else pong
    if not pong.empty:
        best = pong.loc[pong["median"].idxmax()]
        paper = references.recorded(res.metas.get(best["run_id"]), "paper", "paac_pong")
        versus = (f"the paper's ~{paper['env_steps_per_s']:,.0f} {paper['setting']}" if paper else
                  f"the paper's rate: {references.NOT_RECORDED}")
        out += [f"Pong: PAAC's best stepping here is {md.num(best['median'])} env steps/s ({best['method']}, "
                f"n_e = {int(best['n_envs'])}, n_w = {int(best['n_workers'])}; min-max {md.num(best['min'])}-"
                f"{md.num(best['max'])}), against {versus}.", ""]
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
        acting["value"] = [contract.params_of(p).get("steps", math.nan) * max(1, int(n or 0)) / s if s > 0 else None
                           for p, n, s in zip(acting["params"], procs, acting["s"])]  # no steps recorded: NaN
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
                             int(many["envs_per_actor"]), md.num(o["median"]), md.num(many["median"]),
                             f"{md.num(many['median'] / o['median'])}x",
                             f"{md.num(many['min'] / o['max'])}-{md.num(many['max'] / o['min'])}",
                             f"{md.num(many['acting'] / o['acting'])}x" if o["acting"] and many["acting"] else "-",
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
            out += md.table(["task", "upd/step", "buffer", "workers", "E", "E=1 steps/s", "E steps/s", "ratio", "range",
                           "acting ratio", "target"], body) + [""]
    paac_runs = res.table[(res.table["scenario"] == "paac") & (res.table["op"] == "summary")]
    if not paac_runs.empty:
        body = []
        for (env, label), g in paac_runs.groupby(["env", "variant"], sort=True):
            t = g[g["metric"] == "time_to_threshold_s"]
            reached = t[t["status"] == "ok"]["value"]
            rate = g[(g["metric"] == "env_steps_per_s") & (g["status"] == "ok")]["value"]
            body.append([env, f"`{label}`", f"{len(reached)}/{len(t)}",
                         md.num(reached.median()) if len(reached) else "not reached",
                         f"{md.num(reached.min())}-{md.num(reached.max())}" if len(reached) else "-",
                         md.num(rate.median()) if len(rate) else "-"])
        out += ["## PAAC (A2C) vs the PAL loop (DQN): time to threshold", "",
                "Wall seconds from the first env step until the mean return of the last 20 episodes reached the "
                "threshold (median over the seeds that reached it), on the same cores.", ""]
        out += md.table(["env", "run", "seeds reached", "time to threshold (s)", "min-max", "env steps/s"], body) + [""]
    return out



@dataclass
class _Block:
    """One section of a host page: ``lines`` (markdown, headings at level 2) and the figure
    drawn beside it (``figure``: its name in the outcome, or None), placed under the first of
    ``claims`` that has a section on the page (else under "Other measurements"), in ``place`` order."""

    place: tuple
    claims: tuple
    lines: list
    figure: str | None = None


#: This module's sections, placed among the figure modules' (whose place is their
#: ``REPORT_ORDER``, or ``ORDER``) as (place, name, maker(res) -> lines, claims): they read raw
#: rows, not one figure's data. Throughput stands before the capacity figure (20), the memory
#: bound after it, PAAC's at the PAAC stepping figure's place (56, before LF at 60).
_PLACED = [(19, "throughput", _throughput, ("pal-kary-vs-baselines",)),
           (21, "memory_bound", _memory_bound, ()),
           (56, "paac", _paac, ("paac-rate",))]


def _blocks(res, outcome) -> list[_Block]:
    """Every section of a host page in place order: each figure module's (its ``report_section``
    and its figure, handed ``data=None`` when the figure was not drawn) and :data:`_PLACED`."""
    blocks = [_Block((order, name), claims, maker(res)) for order, name, maker, claims in _PLACED]
    for module in plots.modules():
        place = (getattr(module, "REPORT_ORDER", module.ORDER), module.NAME)
        lines = (module.report_section(outcome.data.get(module.NAME), res, outcome.data)
                 if hasattr(module, "report_section") else [])
        figure = module.NAME if module.NAME in outcome.written else None
        blocks.append(_Block(place, tuple(getattr(module, "CLAIMS", ())), lines, figure))
    return sorted(blocks, key=lambda b: b.place)


def _demote(lines: list[str]) -> list[str]:
    """Headings one level down (a section's ``##`` stands under a claim's ``##`` on the page)."""
    return [f"#{line}" if line.startswith("#") else line for line in lines]


def _rel(path, page: Path) -> str:
    return Path(os.path.relpath(path, page.parent)).as_posix()


def _figure_lines(outcome, name: str, page: Path) -> list[str]:
    png, svg, csv = outcome.written[name]
    return [f"![{outcome.titles[name]}]({_rel(png, page)})", "", outcome.captions.get(name, ""), "",
            f"Data: [`{_rel(csv, page)}`]({_rel(csv, page)}) · vector: [`{_rel(svg, page)}`]({_rel(svg, page)})", ""]


def _block_lines(block: _Block, outcome, page: Path) -> list[str]:
    """A block's section with its figure right after the section's first table (or after its text
    where it has no table; under the figure's title where it has no section)."""
    lines = _demote(block.lines)
    if block.figure is None:
        return lines
    figure = _figure_lines(outcome, block.figure, page)
    if not lines:
        return [f"### {outcome.titles[block.figure]}", ""] + figure
    table = next((i for i, line in enumerate(lines) if line.startswith("|")), None)
    if table is None:
        return lines + figure
    end = next((i for i in range(table, len(lines)) if not lines[i].startswith("|")), len(lines))
    return lines[:end] + [""] + figure + lines[end + 1 if end < len(lines) and not lines[end] else end:]


def claim_heading(claim) -> str:
    """The heading of ``claim``'s section on a host page (its anchor: :func:`analysis.markdown.anchor`)."""
    return f"## `{claim.name}`: {claim.claim} ({claim.paper})"


def _points_table(claim, verdict) -> list[str]:
    """The headline's points as a table (the same numbers as the figure's CSV)."""
    lines = any(p.x is not None for p in verdict.points)  # a figure against a number: its x column
    body = [[p.label, p.series, *([f"{p.x:g}"] if lines else []), md.num(p.value),
             f"{md.num(p.low)}-{md.num(p.high)}", md.num(p.paper if p.paper is not None else claim.mark), f"`{p.run_id}`"]
            for p in verdict.points]
    header = ["cell", "series", *(["x"] if lines else []), "ours", "min-max", claim.paper, "run"]
    return md.table(header, body) if body else []


def _claim_lines(row, headlines, page: Path) -> list[str]:
    """A claim's verdict on this host, its headline figure (or why none) and the figure's points."""
    claim, v = row["claim"], row["verdict"]
    out = [f"**{v.verdict}**" + (f": {v.why}" if v.why else "") + ".", "",
           f"- {claim.paper}: {claim.number} ({claim.metric}); cells: {claim.cells}",
           f"- ours: {v.ours}; {v.spread}; runs: " + (", ".join(f"`{r}`" for r in v.runs) or "-"), ""]
    key = (claim.name, row["host"])
    if headlines is not None and key in headlines.written:
        png, svg, csv = headlines.written[key]
        out += [f"![{claim.claim}]({_rel(png, page)})", "",
                f"Data: [`{_rel(csv, page)}`]({_rel(csv, page)}) · vector: [`{_rel(svg, page)}`]({_rel(svg, page)})",
                ""]
    elif headlines is not None and key in headlines.left_out:
        out += [f"No headline figure: {headlines.left_out[key]}.", ""]
    return out + _points_table(claim, v) + ([""] if v.points else [])


def build(res, outcome, report_path, verdicts=None, headlines=None, findings_path=None) -> str:
    """One host's page (see the module docstring) for loaded results ``res`` of that host, the
    figures ``outcome`` drew from them, written at ``report_path``: ``verdicts``, the rows of
    :func:`analysis.findings.verdict_rows` (those of this host are used; computed from ``res``
    when None); ``headlines``, :func:`analysis.headline.render_all`'s outcome (None: no headline
    links); ``findings_path``, REPORT.md, linked back to. :class:`analysis.findings.PooledHosts`
    when ``res`` holds runs of two hosts."""
    host = findings.check_one_host(res) or "no runs"
    page = Path(report_path)
    if verdicts is None:
        verdicts = findings.verdict_rows([(host, res)])
    rows = [r for r in verdicts if r["host"] == host]
    blocks = [b for b in _blocks(res, outcome) if b.lines or b.figure]
    # the project's claims and any other the verdicts hold (a registry of the caller's: tests add one)
    known = {**dict(claims_mod.CLAIMS.items()), **{r["claim"].name: r["claim"] for r in verdicts}}
    order = {name: (c.order, name) for name, c in known.items()}
    answered = {r["claim"].name for r in rows}
    with_blocks = {c for b in blocks for c in b.claims if c in order}
    sections = sorted(answered | with_blocks, key=lambda c: order[c])
    placed = {name: [] for name in sections}
    other = []
    for b in blocks:
        home = next((c for c in sorted(b.claims, key=lambda c: order.get(c, (1e9, c))) if c in placed), None)
        (placed[home] if home else other).append(b)
    lines = [f"# Host `{host}`", ""]
    if findings_path is not None:
        lines += [f"[Back to the findings]({_rel(findings_path, page)}#findings) (REPORT.md). Everything measured on "
                  "this host, ordered by the papers' claims; each table stands beside its figure.", ""]
    lines += ["Contents: " + " · ".join([f"[`{c}`](#{md.anchor(claim_heading(known[c]))})"
                                        for c in sections]
                                       + ["[other measurements](#other-measurements-on-this-host)",
                                          "[runs used](#runs-used)"]), ""]
    lines += _machine(res)
    for name in sections:
        claim = known[name]
        lines += [claim_heading(claim), ""]
        row = next((r for r in rows if r["claim"].name == name), None)
        if row is not None:
            lines += _claim_lines(row, headlines, page)
        else:
            lines += ["No verdict on this host: none of its runs is of the claim's suites "
                      f"({', '.join(f'`{x}`' for x in claim.suites) or '-'}); the measurements below bear on it.", ""]
        for b in placed[name]:
            lines += _block_lines(b, outcome, page)
    lines += ["## Other measurements on this host", ""]
    for b in other:
        lines += _block_lines(b, outcome, page)
    if not other:
        lines += ["None.", ""]
    lines += _runs(res)
    missing = {**outcome.skipped, **outcome.failed}
    if missing:
        lines += ["## Figures not drawn on this host", ""]
        lines += [f"- *{outcome.titles.get(name, name)}*: {why}" for name, why in missing.items()] + [""]
    return "\n".join(lines).rstrip() + "\n"


def page_name(host: str) -> str:
    """The file name of ``host``'s page under :data:`PAGES`."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", host) + ".md"


def build_pages(parts, report_path, verdicts=None, headlines=None) -> dict[Path, str]:
    """Every page of the report: ``parts`` is ``[(host, results, outcome)]`` in
    :meth:`analysis.load.Results.by_host`'s order, each host's figures drawn from its own runs
    only; ``{path: markdown}`` for ``report_path`` (REPORT.md: the findings, from every host's
    runs, each number from one host) and ``<its folder>/report/<host>.md`` per host
    (:func:`build`). Numbers of two hosts are never put in one table or one figure. Raises
    :class:`analysis.findings.MissingVerdict` when a claim answered by stored runs gets no
    verdict."""
    report_path = Path(report_path)
    pairs = [(host, res) for host, res, _ in parts]
    verdicts = findings.verdict_rows(pairs) if verdicts is None else verdicts
    pages = {host: report_path.parent / PAGES / page_name(host) for host, res, _ in parts if res.metas}

    def host_link(host):
        return _rel(pages[host], report_path) if host in pages else None

    def figure(row):
        host, claim = row["host"], row["claim"]
        if host not in pages:
            return "-"
        details = f"[details]({host_link(host)}#{md.anchor(claim_heading(claim))})"
        key = (claim.name, host)
        if headlines is not None and key in headlines.written:
            return f"[figure]({_rel(headlines.written[key][0], report_path)}) · {details}"
        if headlines is not None and key in headlines.left_out:
            return f"none: {headlines.left_out[key]} · {details}"
        return details

    front = ["# replaybench report", "",
             "Generated by `make report` (`replaybench report`) from the stored runs; regenerate it rather than "
             "editing it. This page holds the findings; every table of measurements is on its host's page, ordered "
             "by the papers' claims: "
             + ", ".join(f"[`{host}`]({host_link(host)}) ({len(res.metas)} runs)" for host, res, _ in parts
                         if host in pages) + ".", ""]
    front += _left_out([p for _, res, _ in parts for p in res.problems])
    front += findings.section(pairs, verdicts=verdicts, figure=figure, host_link=host_link)
    out = {report_path: "\n".join(front).rstrip() + "\n"}
    for host, res, outcome in parts:
        if host in pages:
            out[pages[host]] = build(res, outcome, pages[host], verdicts, headlines, report_path)
    return out
