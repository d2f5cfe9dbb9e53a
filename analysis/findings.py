"""The findings page: the front of analysis/REPORT.md, made from the claims registry and the runs.

Three parts, each computed from rows alone (nothing is typed in by hand):

- **the claims table** (:func:`verdict_rows`): one row per claim of :data:`analysis.claims.CLAIMS`
  and host whose runs answer it (the claim's rule applied to that host's answering runs only),
  or one *no data* row naming the suite (or peer, or baseline) that would answer it;
- **the hosts** (:func:`host_lines`): per host (:func:`analysis.load.host_of`) its CPU, caches,
  suites run, a few key numbers and its warnings: incomplete runs, runs with no recorded git
  state, runs superseded by a later run of the same host (:func:`superseded`, with what the
  data says of why they were slower: :func:`slowdown`), and cells that two runs of the same
  host measured more than :data:`DIFFER` apart (:func:`differing_cells`);
- **which design when** (:func:`design_rows`): the fastest configuration per situation and
  host (one process; threads; processes at 2, 8 and 16 workers; inside each framework; a
  learner's update and learners averaging gradients, from the newest learner run; beside a GPU
  learner), *no data* where no run measured it.

``parts`` is :meth:`analysis.load.Results.by_host`'s list ``[(host, Results)]``: no function
here reads two hosts' rows into one number. Output is deterministic (sorted keys, fixed
formats), so unchanged results give an unchanged page. Cost: one pass over each host's rows per
claim; :func:`differing_cells` one group-by over the host's rate rows.
"""

from __future__ import annotations

import fnmatch

import pandas as pd

from replaybench.analysis import claims as claims_mod
from replaybench.analysis import load, stats
from replaybench.analysis import markdown as md
from replaybench.bench import contract, suites

__all__ = ["MissingVerdict", "PooledHosts", "verdict_rows", "claims_table", "host_lines", "design_rows",
           "superseded", "slowdown", "differing_cells", "section", "answering_runs", "check_one_host", "DIFFER",
           "SLOWER"]

#: Two runs of one host whose medians of one cell differ by more than this fraction are flagged.
DIFFER = 0.25

#: The rate metrics compared between runs of one host (a cell's value is a speed or a cost per call).
_RATE_METRICS = ("seconds_per_call", "items_per_s", "env_steps_per_s", "steps_per_s", "updates_per_s")
#: Of those, the costs (lower is faster); the others are speeds.
_COST_METRICS = ("seconds_per_call",)
#: A superseded run's one-process cells this many times slower than its successor's call for a cause.
SLOWER = 2.0
#: Memory probes of two runs within this factor: the machine ran alike.
_PROBE_ALIKE = 1.5


class MissingVerdict(RuntimeError):
    """A claim's rule gave no verdict for a host whose runs answer it (the rule's bug, refused)."""


class PooledHosts(ValueError):
    """Rows of two hosts reached a table or figure that must hold one host."""


def check_one_host(res) -> str | None:
    """The one host of ``res``'s runs (None when it has none); :class:`PooledHosts` naming the
    hosts and their runs when there are several."""
    hosts: dict[str, list[str]] = {}
    for run_id, host in sorted(res.hosts().items()):
        hosts.setdefault(host, []).append(run_id)
    if len(hosts) > 1:
        raise PooledHosts("rows of several hosts in one part: "
                          + "; ".join(f"{h}: {', '.join(r)}" for h, r in sorted(hosts.items())))
    return next(iter(hosts), None)


def _suite(meta) -> str:
    return str((meta.get("suite") or {}).get("name") or meta.get("scenario") or "")


def answering_runs(claim, res) -> list[str]:
    """The run ids of ``res`` whose suite matches one of ``claim.suites`` (fnmatch patterns)."""
    return sorted(r for r, m in res.metas.items() if any(fnmatch.fnmatchcase(_suite(m), p) for p in claim.suites))


def _subset(res, run_ids) -> load.Results:
    table = res.table[res.table["run_id"].isin(run_ids)].reset_index(drop=True)
    return load.Results(table, {r: res.metas[r] for r in run_ids}, {r: res.dirs.get(r) for r in run_ids}, [])


def verdict_rows(parts, registry=None) -> list[dict]:
    """One dict per claim and answering host (``claim``, ``host``, ``verdict``: a
    :class:`analysis.claims.Verdict`; ``superseded``: its runs that :func:`superseded` names), claims in (order, name) order, hosts in ``parts``'
    order; a claim no host answers gets one row with host "-" and a *no data* verdict naming
    its suites (or ``missing``). Raises :class:`MissingVerdict` when a rule returns no
    :class:`~analysis.claims.Verdict` for runs that answer it, or when a claim names suites
    but no rule."""
    registry = claims_mod.CLAIMS if registry is None else registry
    out = []
    gone = {host: superseded(res) for host, res in parts}
    for _, claim in sorted(registry.items(), key=lambda kv: (kv[1].order, kv[0])):
        answered = False
        for host, res in parts:
            check_one_host(res)
            runs = answering_runs(claim, res)
            if not runs:
                continue
            verdict = claim.rule(_subset(res, runs)) if claim.rule else None
            if not isinstance(verdict, claims_mod.Verdict):
                raise MissingVerdict(f"claim {claim.name!r}: runs {', '.join(runs)} of host {host} answer it "
                                     f"(suites {', '.join(claim.suites)}), but its rule gave no verdict")
            out.append({"claim": claim, "host": host, "verdict": verdict,
                        "superseded": sorted(set(verdict.runs) & set(gone[host]))})
            answered = True
        if not answered:
            would = claim.missing or (f"no stored run of suite {', '.join(f'`{s}`' for s in claim.suites)}; "
                                      f"run that suite to answer it")
            out.append({"claim": claim, "host": "-", "verdict": claims_mod.Verdict(claims_mod.NO_DATA, why=would)})
    return out


def claims_table(rows, figure=None, host_link=None) -> list[str]:
    """The claims table of :func:`verdict_rows`' rows. ``figure(row) -> str``: the text of the
    row's figure cell (a link to its headline, or why there is none; "-" without it);
    ``host_link(host) -> str | None``: where the host's page is (the host cell links to it)."""
    body = []
    for r in rows:
        c, v = r["claim"], r["verdict"]
        runs = ", ".join(f"`{x}`" + (" (superseded)" if x in r.get("superseded", ()) else "")
                         for x in v.runs) or "-"
        link = host_link(r["host"]) if host_link and r["host"] != "-" else None
        host = "-" if r["host"] == "-" else f"[`{r['host']}`]({link})" if link else f"`{r['host']}`"
        body.append([f"{c.claim} (`{c.name}`)", c.paper, c.number, v.ours, f"**{v.verdict}**",
                     figure(r) if figure else "-", host, runs, v.spread, v.why or "-"])
    # what a reader looks for first stands left: the claim, the paper's number, ours, the verdict, the figure
    return md.table(["claim", "paper", "paper's number", "ours", "verdict", "figure", "host", "runs", "values, spread",
                     "rests on"], body)


# ---------------------------------------------------------------------------------------------
# hosts


def superseded(res) -> dict[str, str]:
    """``{run_id: reason}`` for the runs of one host that a later run superseded: a run that
    recorded no git state (empty ``git_sha``) while a later run of the same scenario on the same
    host recorded a commit. The reason names that run, the suite file when it is not a shipped
    suite (a copied, since-lost file) and the libraries that differ."""
    out = {}
    shipped = set(suites.available())
    metas = res.metas
    start = {r: (str(m.get("start_time") or ""), r) for r, m in metas.items()}  # run ids break ties, as elsewhere
    for run_id, meta in sorted(metas.items()):
        if meta.get("git_sha"):
            continue
        later = sorted((start[r], r) for r, m in metas.items()
                       if m.get("git_sha") and m.get("scenario") == meta.get("scenario") and start[r] > start[run_id])
        if not later:
            continue
        _, newer = later[0]
        why = [f"no git state recorded; `{newer}` re-measured scenario {meta.get('scenario')} on this host "
               f"from commit {metas[newer]['git_sha'][:10]}"]
        if _suite(meta) not in shipped:
            why.append(f"its suite `{_suite(meta)}` is not a shipped suite (a copied file)")
        mine, theirs = meta.get("libraries") or {}, metas[newer].get("libraries") or {}
        diff = [f"{k} {mine.get(k) or 'absent'} vs {theirs.get(k)}" for k in sorted(theirs)
                if k != "python_implementation" and mine.get(k) != theirs.get(k)]
        if diff:
            why.append("libraries " + ", ".join(diff))
        out[run_id] = "; ".join(why)
    return out


def _probe_ratio(old: dict, new: dict) -> float | None:
    """How much slower ``old``'s memory probe (meta.json ``memory_limits``: dependent-load latency
    and random gather per working-set size) ran than ``new``'s: the median over the sizes both
    measured up to 1 MiB (the caches, where a slower core shows; beyond, DRAM and its neighbours
    do) of old / new, latency and gather alike; None when either run has no probe."""
    def sizes(meta):
        return {s["bytes"]: s for s in (meta.get("memory_limits") or {}).get("sizes") or [] if s.get("bytes")}

    a, b = sizes(old), sizes(new)
    ratios = [a[k][m] / b[k][m] for k in sorted(set(a) & set(b)) if k <= 2**20
              for m in ("latency_ns", "gather_ns") if a[k].get(m) and b[k].get(m)]
    return float(pd.Series(ratios).median()) if ratios else None


#: What one cell is for :func:`_one_process_ratio`, besides its params: the cell columns less
#: ``params`` and ``items_per_call`` (how a suite batched its calls, not what it measured).
_SAME_CELL = [c for c in load.CELL_COLUMNS if c not in ("params", "items_per_call")]
#: Params that say how long a cell was measured, not what: ignored when two runs' cells are matched.
_LENGTH_PARAMS = frozenset({"steps", "window_s", "windows", "repeats", "timeout_s", "warmup_s"})
#: Params a run made before they existed did not record, and the value it ran with.
_PARAM_DEFAULTS = {"envs_per_actor": 1}


def _same_params(a: dict, b: dict) -> bool:
    """Whether two cells' params say the same measurement: equal on every key both hold (and on
    :data:`_PARAM_DEFAULTS`, a missing one read as its default), length keys aside; a key only one
    holds is a setting recorded since (a resolved default), not a difference."""
    for key in (set(a) & set(b) | set(_PARAM_DEFAULTS)) - _LENGTH_PARAMS:
        if a.get(key, _PARAM_DEFAULTS.get(key)) != b.get(key, _PARAM_DEFAULTS.get(key)):
            return False
    return True


def _one_process_ratio(res, old: str, new: str) -> tuple[float | None, int]:
    """(median over the cells both runs measured with one worker process of how many times slower
    ``old`` ran, the number of such cells): one process is what neither a CPU quota of a core or
    more nor contention between workers can slow, so a gap there is the machine or the code.
    Cells match on :data:`_SAME_CELL` and :func:`_same_params`."""
    t = res.table
    rows = t[t["run_id"].isin([old, new]) & (t["status"] == contract.MEASURED) & t["metric"].isin(_RATE_METRICS)
             & t["value"].notna()]
    workers = rows["actors"].astype(float).fillna(0) + rows["learners"].astype(float).fillna(0)
    threads = rows["threads"].astype(float).fillna(1)
    rows = rows[(workers <= 1) & (threads <= 1)]
    if rows["run_id"].nunique() < 2:
        return None, 0
    rows = rows.assign(key=rows[_SAME_CELL].astype(str).agg("\x1f".join, axis=1), p=rows["params"].astype(str))
    med = rows.groupby(["key", "p", "run_id"], sort=True)["value"].median()
    slower = []
    for key, g in med.groupby(level="key", sort=True):
        mine = {p: v for (_, p, r), v in g.items() if r == old}
        theirs = {p: v for (_, p, r), v in g.items() if r == new}
        cost = key.split("\x1f")[_SAME_CELL.index("metric")] in _COST_METRICS
        for p, v in mine.items():
            match = [w for q, w in theirs.items() if _same_params(contract.params_of(p), contract.params_of(q))]
            if match and v > 0 and match[0] > 0:
                slower.append(v / match[0] if cost else match[0] / v)
    return (float(pd.Series(slower).median()), len(slower)) if slower else (None, 0)


def _witness(res, run_id: str) -> str | None:
    """The later run of ``run_id``'s host and scenario with a recorded commit that measured the
    most one-process cells beside it (then the earliest, then by id); None when there is none."""
    metas = res.metas
    mine = metas[run_id]
    start = str(mine.get("start_time") or "")
    later = [r for r, m in metas.items() if m.get("git_sha") and m.get("scenario") == mine.get("scenario")
             and (str(m.get("start_time") or ""), r) > (start, run_id)]
    if not later:
        return None
    return min(later, key=lambda r: (-_one_process_ratio(res, run_id, r)[1], str(metas[r].get("start_time") or ""), r))


def slowdown(res, run_id: str) -> str:
    """What the stored data says of why superseded run ``run_id`` was slower than the later runs of
    its host (the one with a recorded commit that shares the most one-process cells with it,
    :func:`_witness`): the usable CPUs and CPU quota each recorded, their memory probes
    (:func:`_probe_ratio`) and their one-process cells (:func:`_one_process_ratio`). Where one
    process ran :data:`SLOWER` times slower or more while the probes ran within
    :data:`_PROBE_ALIKE`, the cause is the code the run ran (the machine was not slower, and
    neither a quota nor other workers slow one process); else the text says what was checked and
    that the cause is unknown."""
    newer = _witness(res, run_id)
    if newer is None:
        return "cause unknown: no later run of this host recorded its commit"
    old, new = res.metas[run_id], res.metas[newer]
    cpus = [((m.get("machine") or {}).get("usable_cpus") or "?") for m in (old, new)]
    quota = ["not recorded" if "cpu_quota" not in (m.get("machine") or {}) else
             (m["machine"]["cpu_quota"] or "none") for m in (old, new)]
    probe = _probe_ratio(old, new)
    ratio, n = _one_process_ratio(res, run_id, newer)
    checked = (f"against `{newer}`: usable CPUs {cpus[0]} vs {cpus[1]}; CPU quota {quota[0]} vs {quota[1]}; git state "
               f"{'not recorded' if not old.get('git_sha') else old['git_sha'][:10]} vs {(new.get('git_sha') or '-')[:10]}; "
               + ("memory probe: " + (f"{probe:.2f}x the later run's time" if probe is not None else
                                      f"not in both runs") + "; ")
               + (f"{n} one-process cells measured by both: {ratio:.2f}x slower" if ratio is not None else
                  "no one-process cell measured by both"))
    if ratio is not None and ratio >= SLOWER and probe is not None and probe <= _PROBE_ALIKE:
        return (f"slower because of the code it ran, not the machine: one process (which neither a CPU quota nor "
                f"other workers slow) ran {ratio:.1f}x slower while the machine's memory probe took {probe:.2f}x the "
                f"later run's time ({checked})")
    if ratio is not None and ratio >= SLOWER:
        return (f"slower, cause unknown between the machine and the code: one process ran {ratio:.1f}x slower, so "
                f"neither a CPU quota nor other workers, and no memory probe in both runs tells the two apart "
                f"({checked})")
    if ratio is not None and ratio < 1 + DIFFER:
        return (f"not slower where both measured one process ({ratio:.2f}x): superseded for its missing git "
                f"state, not its speed ({checked})")
    return f"cause of its speed unknown ({checked})"


def differing_cells(res, limit: float = DIFFER) -> pd.DataFrame:
    """Cells (:data:`bench.contract.CELL_COLUMNS` without the suite, rate metrics only) measured
    by two or more runs of one host whose medians differ by more than ``limit`` (max/min - 1),
    largest first: columns ``cell`` (a short label), ``runs``, ``low``, ``high``, ``ratio``."""
    t = res.table
    rows = t[(t["status"] == contract.MEASURED) & t["metric"].isin(_RATE_METRICS) & t["value"].notna()]
    if rows.empty or rows["run_id"].nunique() < 2:
        return pd.DataFrame(columns=["cell", "runs", "low", "high", "ratio"])
    keys = list(load.CELL_COLUMNS)
    key = rows[keys].astype(str).agg("\x1f".join, axis=1)
    med = rows.assign(key=key).groupby(["key", "run_id"], sort=True)["value"].median().reset_index()
    many = med.groupby("key")["run_id"].transform("nunique") > 1
    med = med[many]
    out = []
    for k, g in med.groupby("key", sort=True):
        lo, hi = g["value"].min(), g["value"].max()
        if lo > 0 and hi / lo - 1 > limit:
            f = dict(zip(keys, k.split("\x1f")))
            given = {c: f[c] for c in f if f[c] not in ("None", "nan", "<NA>", "none", "")}
            split = f"{given['actors']}A+{given['learners']}L" if "actors" in given and "learners" in given else None
            label = ", ".join(str(x) for x in (given.get("scenario"), given.get("op"), given.get("variant"),
                                                given.get("policy"), given.get("engine"), given.get("env"), split,
                                                given.get("mode"), given.get("metric")) if x)
            runs = g.sort_values(["value", "run_id"])["run_id"].tolist()
            out.append({"cell": label, "runs": runs, "low": lo, "high": hi, "ratio": hi / lo})
    data = pd.DataFrame(out, columns=["cell", "runs", "low", "high", "ratio"])
    # a concurrency window gives its sample, update and insert rates from one count: list it once
    data = data[~data.assign(r=data["runs"].map(tuple)).duplicated(subset=["r", "low", "high"])]
    return data.sort_values(["ratio", "cell"], ascending=[False, True]).reset_index(drop=True)


def _describe(meta) -> str:
    m = meta.get("machine") or {}
    caches = ", ".join(f"{k} {md.human_bytes(v)}" for k, v in sorted(load.cache_sizes(meta).items())) or "caches not recorded"
    mem = m.get("mem_total_bytes")
    return (f"{m.get('cpu_model') or 'unknown CPU'}, {m.get('logical_cpus') or '?'} logical CPUs"
            + (f" ({m['hypervisor']} guest)" if m.get("hypervisor") else "") + f"; {caches}"
            + (f"; {mem / 2**30:.0f} GiB" if mem else ""))


def _short(cause: str) -> str:
    """:func:`slowdown`'s conclusion without its list of what was checked."""
    return cause.split(" (against ", 1)[0]


def host_lines(parts, verdicts, host_link=None) -> list[str]:
    """Per host: what it is, the suites run there, up to four key numbers (its claims' numbers)
    and its warnings (a superseded run with the conclusion of :func:`slowdown`; the evidence is
    on the host's page). ``host_link(host) -> str | None``: the host's page, linked from its name."""
    out = []
    for host, res in parts:
        if not res.metas:
            continue
        first = sorted(res.metas)[0]
        labels = sorted({load.machine_of(m) for m in res.metas.values()})
        link = host_link(host) if host_link else None
        name = f"[`{host}`]({link})" if link else f"`{host}`"
        out.append(f"**{name}**: {_describe(res.metas[first])}; labels {', '.join(f'`{x}`' for x in labels)}; "
                   f"{len(res.metas)} runs: suites {', '.join(sorted({_suite(m) for m in res.metas.values()}))}.")
        keys = [v for v in verdicts if v["host"] == host and v["verdict"].ours != "-"][:4]
        for v in keys:
            out.append(f"- {v['claim'].paper}, {v['claim'].claim}: {v['verdict'].ours} ({v['verdict'].verdict})")
        incomplete = sorted(r for r, m in res.metas.items() if not m.get("complete"))
        nogit = sorted(r for r, m in res.metas.items() if not m.get("git_sha"))
        if incomplete:
            out.append(f"- warning: incomplete runs: {', '.join(f'`{r}`' for r in incomplete)}")
        if nogit:
            out.append(f"- warning: no git state recorded: {', '.join(f'`{r}`' for r in nogit)}")
        for run_id in superseded(res):
            out.append(f"- warning: `{run_id}` is superseded by a later run of this host that recorded its commit; "
                       f"{_short(slowdown(res, run_id))}")
        diff = differing_cells(res)
        if not diff.empty:
            worst = "; ".join(f"{d.cell}: {md.num(d.low)} in `{d.runs[0]}` vs {md.num(d.high)} in `{d.runs[-1]}` "
                              f"({d.ratio:.2f}x)" for d in diff.head(2).itertuples())
            out.append(f"- warning: {len(diff)} cells differ by more than {DIFFER:.0%} between runs of this host; "
                       f"the largest: {worst}")
        out.append("")
    return out


# ---------------------------------------------------------------------------------------------
# which design when


def _one_process(res) -> list:
    cells = claims_mod.micro_cells(res)
    if cells.empty:
        return []
    cells = cells[(cells["op"] == "sample") & ~cells["variant"].astype(str).str.startswith(contract.PEER_PREFIX)
                  & (cells["variant"] != "uniform")]
    if cells.empty:
        return []
    capacity = 2**20 if (cells["capacity"] == 2**20).any() else cells["capacity"].max()
    part = cells[cells["capacity"] == capacity].sort_values(["median", "variant"])
    best = part.iloc[-1]
    return [[f"`{best['variant']}`", f"sample {md.num(best['median'] / 1e6)} M/s at 2^{int(capacity).bit_length() - 1}",
             f"{md.num(best['x_binary'])}x binary, {md.num(best['x_best_peer'])}x best peer", best["run_id"]]]


def _workers(res, mode: str, n: int | None) -> list:
    from replaybench.analysis.plots.concurrency import aggregate

    agg = aggregate(res.table)
    if agg.empty:
        return []
    agg = agg[(agg["mode"] == mode) & agg["items_per_s"].notna() & (agg["learners"].astype(float).fillna(0) > 0)]
    if n is None and not agg.empty:
        n = int(agg["workers"].max())
    agg = agg[agg["workers"] == n]
    if agg.empty:
        return []
    cells = stats.spread(agg, ["run_id", "policy", "actors", "learners"], "items_per_s")
    ratio = agg.groupby(["run_id", "policy", "actors", "learners"])["x_global_lock"].median().rename("x").reset_index()
    cells = cells.merge(ratio, on=["run_id", "policy", "actors", "learners"])
    best = cells.sort_values(["median", "run_id", "policy"]).iloc[-1]
    return [[f"`{best['policy']}` ({int(best['actors'])}A+{int(best['learners'])}L{', ' + mode if n else ''})",
             f"{md.num(best['median'] / 1e6)} M sampled/s ({md.num(best['min'] / 1e6)}-{md.num(best['max'] / 1e6)})",
             f"{md.num(best['x'])}x global-lock" if pd.notna(best["x"]) else "no global-lock in that split",
             _run(res, best["run_id"])]]


def _run(res, run_id) -> str:
    """A run id, marked when the run did not finish (its cells may miss the slower policies)."""
    return run_id + ("" if res.metas.get(run_id, {}).get("complete") else " (incomplete)")


def _frameworks(res) -> list:
    from replaybench.analysis.plots.frameworks import framework_rows

    rows = framework_rows(res.table)
    rows = rows[(rows["metric"] == "speedup_vs_own") & (rows["status"] == contract.MEASURED)]
    out = []
    for fw, g in rows.groupby("framework", sort=True):
        per = g.groupby("variant")["value"].median().sort_values()
        variant, x = per.index[-1], per.iloc[-1]
        pick = f"`{variant}`" if x > 1 else "its own buffer"
        out.append([f"{pick} in {fw}", f"{md.num(x)}x own buffer's speed", "wall per env step, DQN CartPole",
                    g["run_id"].iloc[0]])
    return out


def _gpu(res) -> list:
    from replaybench.analysis.plots._training import training_rows

    rows = training_rows(res.table, "summary")
    rows = rows[(rows["metric"] == "env_steps_per_s") & (rows["status"] == contract.MEASURED)]
    if rows.empty or not (rows["device"] == "cuda").any():
        return []
    keys = ["run_id", "task", "engine", "actors", "learners"]
    med = rows.groupby([*keys, "device"], dropna=False)["value"].median().unstack("device")
    med = med.dropna(subset=["cuda"]).reset_index()
    out = []
    for task, g in med.groupby("task", sort=True):
        best = g.sort_values(["cuda", "run_id"]).iloc[-1]
        cpu = best.get("cpu")
        who = "sequential" if best["engine"] == "sequential" else (
            "PAAC" if best["engine"] == "paac" else f"{int(best['actors'])}A+{int(best['learners'])}L")
        out.append([f"CUDA learner, {who} ({task})", f"{md.num(best['cuda'])} env steps/s",
                    f"{md.num(best['cuda'] / cpu)}x the CPU learner" if cpu and not pd.isna(cpu) else "no CPU learner beside it",
                    best["run_id"]])
    return out


def _learner_runs(res) -> list[tuple[str, list[dict]]]:
    """``(run_id, cells)`` of the host's newest learner run (by start time, run id breaking
    ties): :func:`bench.learner_costs.cell_medians` of its rows; [] without one."""
    from replaybench.bench.learner_costs import cell_medians

    t = res.table
    if t.empty or "scenario" not in t.columns:
        return []
    rows = t[t["scenario"] == "learner"]
    if rows.empty:
        return []
    run_id = max(rows["run_id"].unique(), key=lambda r: (str(res.metas.get(r, {}).get("start_time") or ""), r))
    records = rows[rows["run_id"] == run_id].to_dict("records")
    return [(run_id, cell_medians(records, res.metas.get(run_id, {}).get("bound_factor") or 2.0))]


def _learner_batch(meta: dict, cells: list[dict], algo: str, env: str, key: str) -> int | None:
    """The batch a learner row reads: the run's target for ``key`` (its ``batch``, where its
    ``env`` is this one or unnamed), else 64 where measured, else the smallest measured."""
    target = (meta.get("targets") or {}).get(key) or {}
    if target.get("batch") and target.get("env", env) == env:
        return int(target["batch"])
    batches = sorted({c["batch"] for c in cells if c["algo"] == algo and c["env"] == env})
    return 64 if 64 in batches else (batches[0] if batches else None)


def _learner_update(res) -> list:
    out = []
    for run_id, cells in _learner_runs(res):
        meta = res.metas.get(run_id, {})
        for algo, env in sorted({(c["algo"], c["env"]) for c in cells}):
            batch = _learner_batch(meta, cells, algo, env, f"{algo}_update")
            here = [c for c in cells if (c["algo"], c["env"], c["device"], c["batch"], c["learners"])
                    == (algo, env, "cpu", batch, 1)]
            if not here:
                continue
            best = min(here, key=lambda c: (c["seconds"], c["update"]))
            floor = f", {best['seconds'] / best['floor']:.1f}x its arithmetic floor" if best["floor"] else ""
            against = (f"{best['x_torch']:.2f}x torch's eager update" if best["x_torch"] is not None
                       else "no compiled update measured beside it")
            out.append([f"`{best['update']}` update ({algo}, {env}, batch {batch})",
                        f"{best['seconds'] * 1e6:,.0f} us an update{floor}", against, _run(res, run_id)])
    return out


def _learner_groups(res) -> list:
    out = []
    for run_id, cells in _learner_runs(res):
        meta = res.metas.get(run_id, {})
        for algo, env in sorted({(c["algo"], c["env"]) for c in cells}):
            batch = _learner_batch(meta, cells, algo, env, "learners")
            groups = [c for c in cells if (c["algo"], c["env"], c["device"], c["batch"]) == (algo, env, "cpu", batch)
                      and c["learners"] > 1 and c["x_one"] is not None]
            if not groups:
                continue
            best = max(groups, key=lambda c: (c["samples_per_s"], c["update"]))
            allreduce = f"; all-reduce {best['allreduce'] * 1e6:.0f} us" if best["allreduce"] else ""
            out.append([f"{best['learners']} learners x {batch} rows, `{best['update']}` ({algo}, {env})",
                        f"{best['samples_per_s']:,.0f} samples learned/s", f"{best['x_one']:.2f}x one learner{allreduce}",
                        _run(res, run_id)])
    return out


#: Situation -> (finder(res) -> [[pick, measured, against, run]], the suite that would answer it).
_SITUATIONS = [("one process", _one_process, "micro"),
               ("threads", lambda r: _workers(r, "threads", None), "concurrency (threads)"),
               ("processes, 2 workers", lambda r: _workers(r, "processes", 2), "concurrency"),
               ("processes, 8 workers", lambda r: _workers(r, "processes", 8), "concurrency-cores on 8+ cores"),
               ("processes, 16 workers", lambda r: _workers(r, "processes", 16), "concurrency-cores on 16+ cores"),
               ("inside a framework", _frameworks, "frameworks-*"),
               ("a learner's update, one core", _learner_update, "learner"),
               ("learners averaging gradients", _learner_groups, "learner"),
               ("beside a GPU learner", _gpu, "training-gpu-quick on a CUDA host")]


def design_rows(parts) -> list[list]:
    """``[situation, host, pick, measured, against, run]`` rows: per situation each host's best,
    or one *no data* row naming the suite that would measure it."""
    body = []
    for situation, finder, suite in _SITUATIONS:
        found = False
        for host, res in parts:
            for pick, measured, against, run in finder(res):
                run_id, _, mark = run.partition(" ")
                body.append([situation, f"`{host}`", pick, measured, against, f"`{run_id}`" + (f" {mark}" if mark else "")])
                found = True
        if not found:
            body.append([situation, "-", "**no data**", "-", "-", f"run `{suite}`"])
    return body


def section(parts, registry=None, verdicts=None, figure=None, host_link=None) -> list[str]:
    """The findings page's markdown lines (see the module docstring). ``verdicts``: the rows of
    :func:`verdict_rows` where the caller has them (else computed here); ``figure`` and
    ``host_link``: see :func:`claims_table`."""
    verdicts = verdict_rows(parts, registry) if verdicts is None else verdicts
    counts = {v: sum(r["verdict"].verdict == v for r in verdicts) for v in claims_mod.VERDICTS}
    hosts = [h for h, r in parts if r.metas]
    out = ["## Findings", "",
           f"Each claim of the papers (`analysis/claims.py`) answered from the stored runs, host by host: a host is "
           f"its CPU model, logical CPUs and caches (`{len(hosts)}` here), never the `--machine` label, and no number "
           f"below mixes two hosts. Ratios are of medians from the same run; spreads are min-max over the values. "
           f"Verdicts: " + ", ".join(f"{n} {v}" for v, n in counts.items() if n) + ".", "",
           "### The papers' claims", "",
           "*figure*: the claim's headline figure on that host (our cells, the paper's number as a red dashed "
           "mark), or why there is none; *details*: the claim's section on the host's page, its tables each beside "
           "its figure.", ""]
    out += claims_table(verdicts, figure, host_link) + [""]
    out += ["### Hosts", ""] + host_lines(parts, verdicts, host_link)
    out += ["### Which design when", "",
            "The fastest configuration measured per situation and host (sampled items/s of the replay buffer; "
            "the framework rows are training speed; the learner rows, one update's time and samples learned per "
            "second, each at its run's target batch, else 64 rows). *no data* names the suite that would measure it.", ""]
    out += md.table(["situation", "host", "pick", "measured", "against", "run"], design_rows(parts)) + [""]
    return out
