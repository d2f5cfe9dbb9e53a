"""The papers' claims as data: what each paper says, which stored runs answer it and the rule
that turns our rows into a verdict (the findings page, :mod:`analysis.findings`, is made from
this registry).

A claim is one :class:`Claim` registered in :data:`CLAIMS` (a
:class:`replaybench.registry.Registry` of kind "claim"): the paper, the number as the paper
states it, the metric, the suites whose runs answer it (``fnmatch`` patterns over meta.json's
``suite.name``: ``"concurrency*"``), the cells in words, and ``rule``. A new claim is one more
``claim(...)`` entry below, or one ``CLAIMS.register`` call from any module (tests register
into ``CLAIMS.copy()``).

The rule contract::

    rule(res: analysis.load.Results) -> Verdict

``res`` holds the answering runs of **one host** only (:meth:`analysis.load.Results.by_host`),
never two, so a verdict never pools hosts. The rule computes from rows alone: ratios are of
medians from the same run (never of two runs' numbers), spreads are min-max over the values
(a ratio's range is min/max .. max/min of its two cells' values). It returns a
:class:`Verdict` always, :data:`NO_DATA` with the reason where the runs lack the cells it
needs; returning None for runs it was given is a bug that :mod:`analysis.findings` refuses
(:class:`analysis.findings.MissingVerdict`). Cost: each rule is one pass over its host's rows.

A rule also returns the **points** of the claim's headline figure (:class:`Point`, drawn by
:mod:`analysis.headline`): the cells its verdict rests on, each with its spread, its run and, where
the paper gives one per cell, the paper's number; ``Claim.mark`` is the paper's number drawn
across the whole figure where one number stands for every cell. The points are the cells the
row sums up, so the figure and the row cannot disagree (tests/test_analysis_table_figure.py
compares the figure's CSV with the host page's table of the same points).

Verdicts (:data:`VERDICTS`): a ratio or rate claim *reproduces* when our median reaches the
paper's number within :data:`TOLERANCE` (10% below its low end; above its high end still
reproduces: the direction and at least the size hold), *partly* when ours goes the paper's way
by less, *contradicts* when ours goes the other way (a speedup of 1 or less), *not comparable*
when the rows measure something else than the claim (the reason is said), *no data* when no
row answers it (the suite that would is said).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from typing import Callable

import pandas as pd

from replaybench.analysis import references, stats
from replaybench.analysis import markdown as md
from replaybench.bench import contract
from replaybench.registry import Registry

__all__ = ["Claim", "Verdict", "Point", "CLAIMS", "claim", "VERDICTS", "REPRODUCES", "PARTLY", "CONTRADICTS",
           "NOT_COMPARABLE", "NO_DATA", "TOLERANCE", "ratio_verdict",
           "micro_cells", "seeds"]

REPRODUCES, PARTLY, CONTRADICTS, NOT_COMPARABLE, NO_DATA = (
    "reproduces", "partly", "contradicts", "not comparable", "no data")
VERDICTS = (REPRODUCES, PARTLY, CONTRADICTS, NOT_COMPARABLE, NO_DATA)

#: How far below the paper's number ours may fall and still reproduce it (fraction of the number).
TOLERANCE = 0.10


@dataclass(frozen=True)
class Point:
    """One cell of a claim's headline figure (:mod:`analysis.headline`): ``value`` (the median, or
    a ratio of medians from one run) with its range ``low``..``high`` (min-max over the values, or
    a ratio's min/max .. max/min), the ``run_id`` it comes from, the ``label`` that names the cell
    (a category of the x axis), the ``series`` it belongs to (ours, a baseline of ours ...), ``x``
    for a figure drawn against a number (processes: then each series and run is one line, never
    joining runs), and ``paper``: the paper's number for this cell, where it gives one."""

    label: str
    value: float
    low: float
    high: float
    run_id: str
    series: str = "ours"
    x: float | None = None
    paper: float | None = None


@dataclass(frozen=True)
class Verdict:
    """One claim answered on one host. ``ours``: our number(s) with units; ``spread``: how many
    values and their range; ``runs``: the run ids the numbers come from; ``why``: what the
    verdict rests on (or why there is none); ``points``: the cells of its headline figure
    (:class:`Point`; empty where there is nothing to draw)."""

    verdict: str
    ours: str = "-"
    spread: str = "-"
    runs: tuple = ()
    why: str = ""
    points: tuple = ()

    def __post_init__(self):
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got {self.verdict!r}")


@dataclass(frozen=True)
class Claim:
    """A paper's claim (see the module docstring). ``missing``: the suite (or the peer, or the
    baseline) that would answer it where no stored suite can; ``order``: its place in the
    findings table; ``axis``: what the headline figure's value axis shows; ``mark``: the paper's
    number drawn across the headline figure (a horizontal line labelled with the paper and
    ``number``; for a range, its low end, the least that reproduces), None where the points
    carry the paper's number each or the paper gives none."""

    name: str
    paper: str
    claim: str
    number: str
    metric: str
    suites: tuple
    cells: str
    rule: Callable | None = None
    missing: str = ""
    order: int = 100
    axis: str = "ours over the baseline (x)"
    mark: float | None = None
    extra: dict = field(default_factory=dict)


#: Claim name -> :class:`Claim`.
CLAIMS: Registry = Registry("claim")


def claim(name: str, **fields) -> Claim:
    """Register the claim ``name`` (the :class:`Claim` fields) in :data:`CLAIMS`; returns it."""
    return CLAIMS.register(name, Claim(name=name, **fields), origin=__name__)


# ---------------------------------------------------------------------------------------------
# helpers the rules share


def ratio_verdict(median: float, low: float) -> str:
    """A speedup claim's verdict: ours ``median`` against the paper's ``low`` end (> 1 = faster)."""
    if median is None or not math.isfinite(median):
        return NO_DATA
    if median >= low * (1 - TOLERANCE):
        return REPRODUCES
    return PARTLY if median > 1 else CONTRADICTS


def seeds(n: int, what: str = "seed") -> str:
    """``"1 seed"``, ``"3 seeds"``."""
    return f"{int(n)} {what}{'' if int(n) == 1 else 's'}"


def _x(v) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{md.num(v)}x"


def _range(lo, hi) -> str:
    return f"{md.num(lo)}-{md.num(hi)}"


def _runs(rows: pd.DataFrame) -> tuple:
    return tuple(sorted(set(rows["run_id"].astype(str))))


def _pow2(capacity) -> str:
    return f"2^{int(capacity).bit_length() - 1}"


def micro_cells(res) -> pd.DataFrame:
    """Per run, op, capacity, workload and variant of the micro runs without a grid: items/s
    medians, min, max, n, with ``x_best_peer`` and ``best_peer`` (same run)."""
    from replaybench.analysis.plots.capacity import default_timings

    rows = default_timings(res.table, res.metas)
    if rows.empty:
        return rows
    keys = ["run_id", "op", "capacity", "batch", "transitions", "variant", "structure", "K"]
    return stats.ratio_columns(stats.spread(rows, keys, "items_per_s"))


def _pair(cells: pd.DataFrame, mine: pd.Series, other: pd.Series) -> tuple[float, float, float]:
    """(ratio of medians, low, high) of two cells of one run (> 1 = ``mine`` faster)."""
    return mine["median"] / other["median"], mine["min"] / other["max"], mine["max"] / other["min"]


# ---------------------------------------------------------------------------------------------
# PAL: the K-ary buffer


def _peer_cell(part: pd.DataFrame, mine: pd.Series, peer: str) -> pd.Series | None:
    """The cell of ``peer`` beside ``mine`` (same run, op, capacity and workload), or None."""
    hit = part[(part["run_id"] == mine["run_id"]) & (part["op"] == mine["op"]) & (part["variant"] == peer)
               & (part["capacity"] == mine["capacity"]) & (part["batch"].astype(str) == str(mine["batch"]))
               & (part["transitions"].astype(str) == str(mine["transitions"]))]
    return None if hit.empty else hit.iloc[0]


def _kary_vs_peers(res) -> Verdict:
    cells = micro_cells(res)
    if cells.empty or not cells["variant"].astype(str).str.startswith(contract.PEER_PREFIX).any():
        return Verdict(NO_DATA, why="no micro run without a grid timed a peer library on this host")
    ops = ["sample", "update", "insert_batch"]
    peered = cells[cells["best_peer"].notna() & cells["op"].isin(ops)]
    # the paper's capacity (1,048,576) where a peer ran there, else the largest with a peer
    capacity = 2**20 if (peered["capacity"] == 2**20).any() else peered["capacity"].max()
    part = peered[peered["capacity"] == capacity]
    every = cells[cells["capacity"] == capacity]
    ours, binary, values, runs, points = [], [], [], set(), []
    for op in ops:
        mine = part[(part["op"] == op) & (part["variant"] == "kary-aligned")]
        base = part[(part["op"] == op) & (part["variant"] == "binary")]
        if mine.empty:
            continue
        m = mine.iloc[0]
        ours.append((op, m["x_best_peer"], m["best_peer"]))
        values.append(m["x_best_peer"])
        runs.add(m["run_id"])
        # the headline's points: ours and our binary tree over the same (fastest) peer, with ranges
        for series, row in (("kary-aligned (K=16)", m), ("binary (ours)", None if base.empty else base.iloc[0])):
            peer = None if row is None else _peer_cell(every, row, row["best_peer"])
            if peer is not None:
                _, lo, hi = _pair(every, row, peer)
                points.append(Point(f"{op} vs {str(row['best_peer']).removeprefix(contract.PEER_PREFIX)}",
                                    float(row["x_best_peer"]), float(lo), float(hi), str(row["run_id"]), series))
        if not base.empty:
            binary.append(f"{op} {_x(base.iloc[0]['x_best_peer'])}")
    if not ours:
        return Verdict(NO_DATA, why=f"no kary-aligned cell beside a peer at {_pow2(capacity)}")
    median = float(pd.Series(values).median())
    verdict = ratio_verdict(median, 4.0)
    if verdict == REPRODUCES and min(values) < 4.0 * (1 - TOLERANCE):
        verdict = PARTLY
    text = ", ".join(f"{op} {_x(x)}" for op, x, _ in ours)
    peers = sorted({str(p).removeprefix(contract.PEER_PREFIX) for _, _, p in ours})
    return Verdict(verdict, f"kary-aligned over the fastest peer at {_pow2(capacity)}: {text}",
                   f"{int(part['n'].min())} values per cell; ops {_range(min(values), max(values))}x",
                   tuple(sorted(runs)),
                   f"best peer: {', '.join(peers)}; our binary tree: {', '.join(binary) or '-'}: "
                   "the gain over peers is mostly the implementation (compiled batched calls), not the K-ary layout",
                   tuple(points))


claim("pal-kary-vs-baselines", order=10, paper="PAL", claim="K-ary sum tree beats baseline implementations",
      number="about 4-100x", metric="items/s, kary-aligned (K=16) over the fastest peer library, same run",
      suites=("micro",), cells="sample, update, insert_batch at capacity 2^20 (the paper's 1,048,576), batch 256",
      rule=_kary_vs_peers, axis="ours over the fastest peer, same run (x)", mark=4.0)


def _vs_tianshou(res) -> Verdict:
    cells = micro_cells(res)
    tianshou = contract.PEER_PREFIX + "tianshou"
    if cells.empty or not (cells["variant"] == tianshou).any():
        return Verdict(NO_DATA, why="no micro run on this host timed peer:tianshou")
    paper = {"insert_batch": 0.0573 / 0.0178, "sample": 0.0341 / 0.0239}
    capacity = cells.loc[cells["variant"] == tianshou, "capacity"].max()
    part = cells[cells["capacity"] == capacity]
    found, runs, verdicts, points = [], set(), [], []
    for op, target in paper.items():
        mine = part[(part["op"] == op) & (part["variant"] == "kary-aligned")]
        peer = part[(part["op"] == op) & (part["variant"] == tianshou)]
        if mine.empty or peer.empty:
            continue
        ratio, lo, hi = _pair(part, mine.iloc[0], peer.iloc[0])
        found.append(f"{op} {_x(ratio)} ({_range(lo, hi)})")
        runs.add(mine.iloc[0]["run_id"])
        verdicts.append(ratio_verdict(ratio, target))
        label = op + (": a batched call vs Tianshou's one row per add" if op == "insert_batch" else "")
        points.append(Point(label, float(ratio), float(lo), float(hi), str(mine.iloc[0]["run_id"]),
                            "kary-aligned (K=16)", paper=target))
    if not found:
        return Verdict(NO_DATA, why=f"no op with both kary-aligned and Tianshou at {_pow2(capacity)}")
    verdict = verdicts[0] if len(set(verdicts)) == 1 else PARTLY
    note = "" if capacity == 2**20 else f"; Tianshou ran at {_pow2(capacity)} only (the paper's 2^20)"
    return Verdict(verdict, f"kary-aligned over Tianshou at {_pow2(capacity)}: " + ", ".join(found),
                   f"{int(part['n'].min())} values per cell; ratio range min/max..max/min", tuple(sorted(runs)),
                   "Tianshou's add takes one transition per call, so insert_batch compares a batched call with "
                   f"a loop of single adds{note}", tuple(points))


claim("pal-microbench-tianshou", order=11, paper="PAL",
      claim="K=16 tree per call against Tianshou (authors' microbenchmark)",
      number="insert 3.2x, sample 1.43x (0.0573/0.0178, 0.0341/0.0239 ms)",
      metric="items/s, kary-aligned over peer:tianshou, same run", suites=("micro",),
      cells="insert_batch and sample at the largest capacity Tianshou ran", rule=_vs_tianshou,
      axis="kary-aligned over Tianshou, same run (x)")


def _k_sweep(res) -> Verdict:
    rows = res.table[(res.table["scenario"] == "micro") & (res.table["variant"] == "kary-aligned")
                     & (res.table["capacity"] == 2**20) & res.table["K"].isin([2, 16])]
    rows = stats.timings(rows)
    if rows.empty or rows["K"].nunique() < 2:
        return Verdict(NO_DATA, why="no kary-aligned K=2 and K=16 cells at 2^20 in one run")
    cells = stats.spread(rows, ["run_id", "op", "K"], "items_per_s")
    paper = {"insert_batch": 23.3 / 18.7, "sample": 31.0 / 25.8}
    found, verdicts, points = [], [], []
    for op, target in paper.items():
        part = cells[cells["op"] == op]
        k16, k2 = part[part["K"] == 16], part[part["K"] == 2]
        if k16.empty or k2.empty:
            continue
        ratio, lo, hi = _pair(part, k16.iloc[0], k2.iloc[0])
        found.append(f"{op} {_x(ratio)} ({_range(lo, hi)})")
        verdicts.append(ratio_verdict(ratio, target))
        points.append(Point(op, float(ratio), float(lo), float(hi), str(k16.iloc[0]["run_id"]), "kary-aligned",
                            paper=target))
    if not found:
        return Verdict(NO_DATA, why="no op with both K=2 and K=16")
    verdict = verdicts[0] if len(set(verdicts)) == 1 else PARTLY
    return Verdict(verdict, "K=16 over K=2 at 2^20: " + ", ".join(found),
                   f"{int(cells['n'].min())} values per cell", _runs(rows),
                   "at 2^20 both K have 2^20 leaves (16^5 = 2^20), so padding does not confound K here", tuple(points))


claim("pal-k-sweep", order=12, paper="PAL", claim="K=16 faster than K=2 (authors' K sweep at 1e6)",
      number="insert 1.25x, sample 1.20x (23.3/18.7, 31.0/25.8 us)",
      metric="items/s, kary-aligned K=16 over K=2, same run", suites=("micro-sweep-k",),
      cells="insert_batch and sample at 2^20, batch 256", rule=_k_sweep, axis="K=16 over K=2 (x)")

claim("pal-rllib", order=13, paper="PAL", claim="K=16 tree per call against RLlib's buffer",
      number="insert 176x, sample 53x (3.13/0.0178, 1.26/0.0239 ms)", metric="items/s over an RLlib peer",
      suites=(), cells="-", missing="a micro run with an RLlib peer (peer:rllib): no such peer is registered")


# ---------------------------------------------------------------------------------------------
# PAL: synchronisation and scaling


def _split_points(split: pd.DataFrame, series: str) -> list[Point]:
    """Headline points of one policy's per-split ratios (``split``: one row per run and split
    with ``x_global_lock`` = the median over windows, ``low``/``high`` = their extremes), in
    order of workers, then actors."""
    split = split.assign(w=split["actors"].astype(int) + split["learners"].astype(int))
    return [Point(f"{int(r['actors'])}A+{int(r['learners'])}L", float(r["x_global_lock"]), float(r["low"]),
                  float(r["high"]), str(r["run_id"]), series)
            for _, r in split.sort_values(["w", "actors", "run_id"]).iterrows()]


def _sync(res) -> Verdict:
    from replaybench.analysis.plots.concurrency import aggregate

    agg = aggregate(res.table)
    if agg.empty:
        return Verdict(NO_DATA, why="no concurrency windows")
    agg = agg[(agg["workers"] >= 2) & (agg["learners"].astype(float).fillna(0) >= 1)
              & agg["x_global_lock"].notna() & (agg["mode"] == "processes")]
    keys = ["run_id", "policy", "actors", "learners"]
    split = (agg.groupby(keys, dropna=False)["x_global_lock"].agg(["median", "min", "max"])
             .rename(columns={"median": "x_global_lock", "min": "low", "max": "high"}).reset_index())
    pal = split[split["policy"] == "pal-locks"]
    others = split[~split["policy"].isin(["pal-locks", "global-lock"])]
    best = others.loc[others["x_global_lock"].idxmax()] if not others.empty else None
    best_text = ("" if best is None else
                 f"; best other policy {best['policy']} {_x(best['x_global_lock'])} at "
                 f"{int(best['actors'])}A+{int(best['learners'])}L (run {best['run_id']}"
                 + ("" if res.metas.get(best["run_id"], {}).get("complete") else ", incomplete") + ")")
    # the best other policy's splits beside pal-locks' (its run only: a line of the figure is one run)
    best_points = ([] if best is None else
                   _split_points(others[(others["policy"] == best["policy"]) & (others["run_id"] == best["run_id"])],
                                 f"{best['policy']} (best other policy)"))
    if pal.empty:
        return Verdict(NO_DATA, "-", "-", _runs(split) if not split.empty else (),
                       "pal-locks and global-lock were never measured in one run on this host" + best_text)
    median, lo, hi = pal["x_global_lock"].median(), pal["x_global_lock"].min(), pal["x_global_lock"].max()
    verdict = REPRODUCES if median >= 2 * (1 - TOLERANCE) else PARTLY if hi > 1 else CONTRADICTS
    return Verdict(verdict, f"pal-locks over global-lock: {_x(median)} (median over splits)",
                   f"{len(pal)} splits of 2+ processes; {_range(lo, hi)}x", _runs(pal),
                   "ratio of medians per actor/learner split, same run" + best_text,
                   tuple(_split_points(pal, "pal-locks") + best_points))


claim("pal-sync", order=20, paper="PAL", claim="synchronisation optimisations over a global lock",
      number="about 2-4.4x", metric="sample items/s (insert without learners), pal-locks over global-lock, same run",
      suites=("concurrency*",), cells="every actor/learner split of 2+ processes with learners", rule=_sync,
      axis="over global-lock, same run and split (x)", mark=2.0)


def _scaling(res) -> Verdict:
    from replaybench.analysis.plots.concurrency import points

    data = points(res.table, res.metas)
    if data.empty:
        return Verdict(NO_DATA, why="no concurrency windows")
    data = data[data["mode"] == "processes"]
    if data.empty:
        return Verdict(NO_DATA, why="no concurrency windows with processes")
    # every line's last point (its most processes); the best efficiency among the lines that reach
    # the most processes, where a line starting at one process (learners or actors alone) wins ties
    data = data.assign(efficiency=data["median"] / data["ideal"], span=data["workers"] / data["n0"])
    last = data[data["workers"] == data.groupby(["run_id", "panel", "policy"])["workers"].transform("max")]
    last = last[last["span"] == last["span"].max()]
    best = last.sort_values(["efficiency", "run_id", "panel", "policy"]).iloc[-1]
    top, panel = best["workers"], best["panel"]
    speedup = best["median"] / (best["ideal"] / best["span"])
    ours = (f"{best['policy']} ({panel}): {_x(speedup)} from {int(best['n0'])} to {int(top)} processes, "
            f"{best['efficiency']:.0%} of linear")
    spread = f"{seeds(best['n'], 'window')} at {int(top)}; {md.num(best['min'])}-{md.num(best['max'])} items/s"
    # the headline: every policy's line of the best line's run and panel, as speedup over its first
    # point, the paper's linear scaling (workers / first workers) as each point's mark
    same = ["run_id", "panel", "variant", "K", "transitions", "capacity", "batch"]  # one buffer: a line per policy
    lines = data[(data[same].astype(str) == best[same].astype(str)).all(axis=1)]
    lines = lines.assign(rate0=lines["ideal"] * lines["n0"] / lines["workers"])
    points = tuple(Point(f"{int(r['workers'])}", float(r["median"] / r["rate0"]), float(r["min"] / r["rate0"]),
                         float(r["max"] / r["rate0"]), str(r["run_id"]), f"{r['policy']} ({panel})",
                         x=float(r["workers"]), paper=float(r["workers"] / r["n0"]))
                   for _, r in lines.sort_values(["policy", "workers"]).iterrows())
    if top < 4:
        return Verdict(NOT_COMPARABLE, ours, spread, (best["run_id"],),
                       f"this host's runs go up to {int(top)} processes: too few to show a trend with cores", points)
    verdict = REPRODUCES if best["efficiency"] >= 0.8 else PARTLY if speedup > 1 else CONTRADICTS
    return Verdict(verdict, ours, spread, (best["run_id"],),
                   "the best policy's line at the most processes, against the ideal line through its first point",
                   points)


claim("pal-linear-scaling", order=21, paper="PAL", claim="throughput scales linearly with cores",
      number="linear", metric="replay items/s against processes: learners, actors, or half and half",
      suites=("concurrency*",), cells="processes 1, 2, 4 .. up to the run's cores; every policy", rule=_scaling,
      axis="speedup over the line's first point (x)")


# ---------------------------------------------------------------------------------------------
# PAL: training


def _one_row_per_run(points: list) -> tuple:
    """``points`` sorted by label, each label naming its run where the points come from more
    than one run: two runs of one cell are two rows of the figure, never one row that hides
    which value is whose."""
    if len({p.run_id for p in points}) > 1:
        points = [replace(p, label=f"{p.label} ({p.run_id})") for p in points]
    return tuple(sorted(points, key=lambda p: (p.label, p.run_id)))


def _learning_convergence(res) -> Verdict | None:
    """The learning protocol's answer (greedy evaluations of snapshots, censored runs counted):
    per task of each learning run, the fastest parallel layout's per-seed speedup over the best
    sequential configuration; None when no learning run answers."""
    from replaybench.bench import time_to_policy as ttp

    table = res.table[(res.table["scenario"] == "learning") & (res.table["op"] == "learning")]
    if table.empty:
        return None
    best, points = None, []
    for run_id, rows in table.groupby("run_id", sort=True):
        records = rows.to_dict("records")
        outs, kinds = ttp.outcomes(records), ttp.layouts(records)
        for task in sorted({k[:2] for k in outs}):
            seq = {k[2]: v for k, v in outs.items() if k[:2] == task and kinds[k] == "sequential"}
            ref = ttp.best_reference(seq)
            if ref is None:
                continue
            for key, o in outs.items():
                if key[:2] != task or kinds[key] in ("sequential", "peer"):
                    continue
                s = ttp.summarize(o)
                if not math.isfinite(s.median_s):
                    continue
                ratio = ttp.summarize(seq[ref]).median_s / s.median_s
                per_seed = [x for _, rel, x in ttp.per_seed_speedups(seq[ref], o) if rel == "="]
                points.append(Point(f"{key[2]}, {task[1]}", float(ratio), float(min(per_seed, default=ratio)),
                                    float(max(per_seed, default=ratio)), str(run_id), "over the best sequential"))
                if best is None or ratio > best[0]:
                    best = (ratio, run_id, task, key[2], kinds[key], ref, s, ttp.summarize(seq[ref]), per_seed)
    if best is None:
        return Verdict(NO_DATA, "-", "-", tuple(sorted(set(table["run_id"].astype(str)))),
                       "no parallel layout held the threshold (greedy evaluation) in at least half its seeds")
    ratio, run_id, task, name, layout, ref, s, s_ref, per_seed = best
    spread = (f"{s.label} and {s_ref.label} seeds reached; per seed "
              + (_range(min(per_seed), max(per_seed)) + "x" if per_seed else "-"))
    return Verdict(ratio_verdict(ratio, 3.1),
                   f"{_x(ratio)} shorter: {name} ({layout}) over the best sequential configuration {ref} "
                   f"({task[0]} on {task[1]}; medians {md.num(s.median_s)} s and {md.num(s_ref.median_s)} s)",
                   spread, (run_id,),
                   "greedy evaluation of weight snapshots on fixed seeds, censored seeds counted, same run; the "
                   "reference is the best of our sequential configurations, not the paper's frameworks",
                   _one_row_per_run(points))


def _convergence(res) -> Verdict:
    from replaybench.analysis.plots._training import training_rows

    learned = _learning_convergence(res)
    if learned is not None:
        return learned

    rows = training_rows(res.table, "summary")
    rows = rows[rows["metric"] == "time_to_threshold_s"]
    if rows.empty:
        return Verdict(NO_DATA, why="no time-to-threshold rows")
    reached = rows[rows["status"] == contract.MEASURED]
    if reached.empty:
        return Verdict(NO_DATA, "-", f"0/{len(rows)} seeds reached", _runs(rows),
                       "no seed reached the threshold in these runs (their steps end before it)")
    keys = ["run_id", "task", "variant"]  # the sequential loop has no policy: not a key
    best, points = None, []
    for key, g in reached.groupby(keys, dropna=False, sort=True):
        base = g[g["baseline"]]
        if base.empty:
            continue
        for cfg, p in g[~g["baseline"]].groupby(["engine", "actors", "learners"], dropna=False, sort=True):
            ratio = base["value"].median() / p["value"].median()
            # a time ratio's range: the shortest baseline over the longest layout .. the reverse
            lo, hi = base["value"].min() / p["value"].max(), base["value"].max() / p["value"].min()
            points.append(Point(f"{int(cfg[1])}A+{int(cfg[2])}L {key[2]}, {key[1]}", float(ratio), float(lo),
                                float(hi), str(key[0]), "over the sequential loop"))
            if best is None or ratio > best[0]:
                total = rows[(rows["run_id"] == key[0]) & (rows["task"] == key[1])]
                best = (ratio, lo, hi, dict(zip(keys, key)), cfg, len(p), len(base), total)
    if best is None:
        return Verdict(NO_DATA, "-", "-", _runs(reached), "no run has both a sequential loop and a parallel "
                       "configuration reaching the threshold")
    ratio, r1, r2, k, cfg, n, nb, _ = best
    return Verdict(ratio_verdict(ratio, 3.1),
                   f"{_x(ratio)} shorter: {cfg[1]}A+{cfg[2]}L {k['variant']} over the sequential loop ({k['task']})",
                   f"{n} and {nb} seeds reached; {_range(min(r1, r2), max(r1, r2))}x", (k["run_id"],),
                   "wall time to the return threshold, medians over the seeds that reached it, same run; the "
                   "baseline is our own sequential loop, not the paper's frameworks", tuple(points))


claim("pal-convergence", order=22, paper="PAL", claim="shorter time to convergence than baselines",
      number="3.1-10.8x", metric="wall seconds to the return threshold, sequential loop over the best parallel layout",
      suites=("learning", "learning-pendulum", "learning-seeds", "learning-cores", "training", "training-cores"),
      cells="DQN and TD3 tasks: learning runs (greedy evaluations of snapshots) where stored, else training runs "
            "with a sequential baseline in the same run", rule=_convergence,
      axis="time to threshold, reference over layout (x)", mark=3.1)


def _own_buffer_peers(records: list[dict], kinds: dict) -> set:
    """The :func:`bench.time_to_policy.config_key` of the peers' trainers run with their own
    buffer (a peer given ours answers pal-frameworks' question, not this one)."""
    from replaybench.bench import time_to_policy as ttp

    return {ttp.config_key(r) for r in records if kinds.get(ttp.config_key(r)) == "peer"
            and (contract.params_of(r["params"]).get("hyper") or {}).get("buffer", "own") == "own"}


def _convergence_over_peers(res) -> Verdict:
    """Per task of each learning run, each peer's own trainer (its published settings, its own
    buffer) against our fastest configuration (sequential or parallel) in the same run: the
    ratio of median times to threshold. A peer whose median is censored gives a lower bound
    (the shortest budget its censored seeds ran over our median), marked ">=". The verdict reads
    the median of these ratios against the paper's low end."""
    from replaybench.bench import time_to_policy as ttp

    table = res.table[(res.table["scenario"] == "learning") & (res.table["op"] == "learning")]
    if table.empty:
        return Verdict(NO_DATA, why="no learning runs (greedy evaluations of snapshots)")
    pairs, points, runs = [], [], set()
    for run_id, rows in table.groupby("run_id", sort=True):
        records = rows.to_dict("records")
        outs, kinds = ttp.outcomes(records), ttp.layouts(records)
        peers = _own_buffer_peers(records, kinds)
        for task in sorted({k[:2] for k in outs}):
            ours = {k[2]: v for k, v in outs.items() if k[:2] == task and kinds[k] != "peer"}
            best = ttp.best_reference(ours)
            if best is None or not math.isfinite(ttp.summarize(ours[best]).median_s):
                continue
            mine = ttp.summarize(ours[best])
            for key in sorted(k for k in peers if k[:2] == task):
                theirs = ttp.summarize(outs[key])
                bound = not math.isfinite(theirs.median_s)
                ratio = (min(o.budget_s for o in outs[key] if o.censored) if bound else theirs.median_s) / mine.median_s
                exact = [x for _, rel, x in ttp.per_seed_speedups(outs[key], ours[best]) if rel == "="]
                label = f"{key[2]}, {task[1]}"
                pairs.append((ratio, bound, label, theirs.label, mine.label))
                points.append(Point(("≥ " if bound else "") + label, float(ratio), float(min(exact, default=ratio)),
                                    float(max(exact, default=ratio)), str(run_id), "peer's trainer over ours"))
                runs.add(str(run_id))
    if not pairs:
        return Verdict(NO_DATA, "-", "-", tuple(sorted(set(table["run_id"].astype(str)))),
                       "no learning run has a peer's own trainer beside a configuration of ours that held the threshold")
    middle = statistics.median(r for r, *_ in pairs)
    each = ", ".join(f"{label} {'>=' if bound else ''}{_x(r)}" for r, bound, label, *_ in pairs)
    spread = "; ".join(f"{label}: {peer} and {ours} seeds reached" for _, _, label, peer, ours in pairs)
    return Verdict(ratio_verdict(middle, 3.1), f"{_x(middle)} shorter than the peers' trainers (median over "
                   f"{len(pairs)}: {each})", spread, tuple(sorted(runs)),
                   "each peer's own trainer and buffer at its published settings against our fastest configuration "
                   "of the same run and task, greedy evaluation of snapshots, censored seeds counted; a censored "
                   "peer gives a lower bound (>=)", _one_row_per_run(points))


claim("pal-convergence-peers", order=22, paper="PAL", claim="shorter time to convergence than baselines' trainers",
      number="3.1-10.8x", metric="wall seconds to the return threshold, each peer's trainer over our fastest "
      "configuration, same run", suites=("learning", "learning-pendulum", "learning-cores"),
      cells="DQN and TD3 tasks of the learning runs: Tianshou's and SB3's trainers with their own buffers",
      rule=_convergence_over_peers, axis="time to threshold, peer's trainer over ours (x)", mark=3.1)


def _adapters_time_to_policy(res) -> tuple[str, tuple]:
    """What the learning runs say of each peer's trainer with our buffer against its own (the
    learning-adapters suite: time to threshold, same run), and the runs it read: ``("", ())``
    where no run has both."""
    from replaybench.bench import time_to_policy as ttp

    table = res.table[(res.table["scenario"] == "learning") & (res.table["op"] == "learning")]
    parts, runs = [], set()

    def time(s) -> str:
        return (f"{md.num(s.median_s)} s" if math.isfinite(s.median_s) else "not reached") + f" ({s.label})"

    for run_id, rows in table.groupby("run_id", sort=True):
        records = rows.to_dict("records")
        outs, kinds = ttp.outcomes(records), ttp.layouts(records)
        own = _own_buffer_peers(records, kinds)
        backend = {ttp.config_key(r): r["backend"] for r in records}
        for key in sorted(own):
            theirs = ttp.summarize(outs[key])
            for other in sorted(k for k in outs if kinds[k] == "peer" and k not in own and k[:2] == key[:2]
                                and backend[k] == backend[key]):
                parts.append(f"{backend[key]} on {key[1]}: {time(ttp.summarize(outs[other]))} with ours, "
                             f"{time(theirs)} with its own (`{run_id}`)")
                runs.add(str(run_id))
    if not parts:
        return "", ()
    return "; time to threshold (medians, seeds reached): " + "; ".join(parts), tuple(sorted(runs))


def _frameworks(res) -> Verdict:
    from replaybench.analysis.plots.frameworks import framework_rows

    learning, learning_runs = _adapters_time_to_policy(res)
    rows = framework_rows(res.table)
    rows = rows[(rows["metric"] == "speedup_vs_own") & (rows["status"] == contract.MEASURED)
                & (rows["variant"] != "own")]
    if rows.empty:
        return Verdict(NO_DATA, runs=learning_runs, why="no speedup_vs_own rows" + learning)
    per = rows.groupby(["framework", "variant"], sort=True)["value"].agg(["median", "min", "max", "count"]).reset_index()
    _, paper = references.newest(res.metas, "paper", "pal_speedup", scenario="frameworks")
    low = (paper or {}).get("low", 1.1)
    hits = [ratio_verdict(m, low) for m in per["median"]]
    verdict = (REPRODUCES if all(h == REPRODUCES for h in hits) else
               CONTRADICTS if all(h == CONTRADICTS for h in hits) else PARTLY)
    ours = ", ".join(f"{r.framework} {_x(r['median'])}" for _, r in per.iterrows())
    spread = "; ".join(f"{r.framework} {seeds(r['count'])} {_range(r['min'], r['max'])}x" for _, r in per.iterrows())
    # one point per framework (its runs: framework_rows takes the newest run per framework)
    points = tuple(Point(str(r.framework), float(r["median"]), float(r["min"]), float(r["max"]),
                         ", ".join(sorted(set(rows.loc[rows["framework"] == r.framework, "run_id"].astype(str)))),
                         str(r.variant), paper=float(low))
                   for _, r in per.iterrows())
    return Verdict(verdict, f"{per['variant'].iloc[0]} over each framework's own buffer: {ours}", spread,
                   tuple(sorted({*_runs(rows), *learning_runs})),
                   "the framework's sequential DQN loop with our buffer against its own buffer, same run" + learning,
                   points)


claim("pal-frameworks", order=23, paper="PAL", claim="plugged into existing frameworks, sequential runs are faster",
      number="1.1-2.1x", metric="wall time per env step, own buffer over ours (speedup_vs_own)",
      suites=("frameworks*", "learning-adapters"), cells="DQN CartPole in SB3, Tianshou and TorchRL; beside it, "
      "learning-adapters' time to threshold of each trainer with its own buffer and with ours", rule=_frameworks,
      axis="own buffer's wall per env step over ours (x)")


# ---------------------------------------------------------------------------------------------
# PAAC


def _paac_rate(res) -> Verdict:
    from replaybench.analysis.plots._training import training_rows

    rows = training_rows(res.table, "summary")
    rows = rows[(rows["metric"] == "env_steps_per_s") & (rows["status"] == contract.MEASURED)
                & (rows["engine"] == "paac") & rows["env"].astype(str).str.contains("Pong")]
    if rows.empty:
        return Verdict(NO_DATA, why="no PAAC training rows on Pong (stepping without learning does not answer)")
    cells = stats.spread(rows, ["run_id", "device", "task"], "value")
    points = tuple(Point(f"learner on {c['device']}, {c['run_id']}", float(c["median"]), float(c["min"]),
                         float(c["max"]), str(c["run_id"]), str(c["device"]))
                   for _, c in cells.sort_values(["device", "run_id"]).iterrows())
    cuda = cells[cells["device"] == "cuda"]
    best = (cuda if not cuda.empty else cells).sort_values(["median", "run_id"]).iloc[-1]
    ours = f"{md.num(best['median'])} env steps/s with learning, learner on {best['device']}"
    spread = f"{seeds(best['n'])}; {_range(best['min'], best['max'])}"
    ratio = best["median"] / 3000
    if best["device"] != "cuda" and ratio < 1 - TOLERANCE:
        return Verdict(NOT_COMPARABLE, ours, spread, (best["run_id"],),
                       f"{ratio:.2f}x the paper's rate with the network on the CPU; the paper's ran on a GTX 980 Ti",
                       points)
    verdict = REPRODUCES if ratio >= 1 - TOLERANCE else PARTLY if ratio >= 0.5 else CONTRADICTS
    return Verdict(verdict, ours, spread, (best["run_id"],), f"{ratio:.2f}x the paper's rate (4-core i7 + GTX 980 Ti)",
                   points)


claim("paac-rate", order=30, paper="PAAC", claim="A2C with shared-memory stepping trains at about 3,000 timesteps/s",
      number="~3,000 env steps/s with learning", metric="env steps/s of a PAAC training run on Pong (learning included)",
      suites=("paac-pong", "training", "training-pong-zoo", "training-gpu*"),
      cells="a2c on ALE/Pong-v5, n_e = 32; the CUDA learner where one ran", rule=_paac_rate,
      axis="env steps/s with learning", mark=3000.0)


# ---------------------------------------------------------------------------------------------
# Lingua Franca vs Ray


def _lf(select: Callable[[pd.DataFrame], pd.DataFrame], target: float, what: str) -> Callable:
    """A rule over the newest lf run's dataflow-over-Ray ratios (:func:`bench.derive.lf_ratios`)
    of the cells ``select`` keeps; the claim holds when their mean reaches ``target``."""
    from replaybench.bench.derive import lf_ratios

    def rule(res) -> Verdict:
        rows = res.table[res.table["scenario"] == "lf"]
        if rows.empty:
            return Verdict(NO_DATA, why="no lf rows")
        run_id = sorted(rows["run_id"].unique(), key=lambda r: (str(res.metas[r].get("start_time") or ""), r))[-1]
        rows = rows[rows["run_id"] == run_id].astype(object)
        paper = references.recorded(res.metas.get(run_id), "paper", "lf_over_ray") or {}
        data = pd.DataFrame(lf_ratios(rows.where(rows.notna(), None).to_dict("records"), paper.get("cells")))
        ray = data[data["backend"] == "ray"] if not data.empty else data
        data = select(data[data["backend"] == "dataflow"]) if not data.empty else data
        if data.empty or data["x_ray"].isna().all():
            return Verdict(NO_DATA, "-", "-", (run_id,), f"the run has no {what} cell with both Ray and the dataflow")
        spreads, points = [], []
        for _, e in data.iterrows():
            r = ray[(ray["op"] == e["op"]) & (ray["env"] == e["env"]) & (ray["actors"] == e["actors"])
                    & (ray["policy"] == e["policy"]) & (ray["batch"].fillna(-1) == (-1 if pd.isna(e["batch"]) else e["batch"]))]
            if r.empty:
                continue
            r = r.iloc[0]
            lo, hi = (r["min"] / e["max"], r["max"] / e["min"]) if e["op"] == "pql" else (e["min"] / r["max"], e["max"] / r["min"])
            spreads.append((lo, hi))
            label = str(e["env"]) + ("" if pd.isna(e["batch"]) else f" b{int(e['batch'])}")
            points.append(Point(label, float(e["x_ray"]), float(lo), float(hi), str(run_id), "dataflow (ours)",
                                paper=None if pd.isna(e["paper"]) else float(e["paper"])))
        mean = float(data["x_ray"].mean())
        parts = ", ".join(f"{e['env']}{'' if pd.isna(e['batch']) else ' b' + str(int(e['batch']))} {_x(e['x_ray'])}"
                          for _, e in data.iterrows())
        n = int(data["n"].min())
        return Verdict(ratio_verdict(mean, target), f"dataflow over Ray: {parts}" + (f"; mean {_x(mean)}" if len(data) > 1 else ""),
                       f"{n}+ values per cell; {_range(min(s[0] for s in spreads), max(s[1] for s in spreads))}x"
                       if spreads else f"{n}+ values per cell", (run_id,),
                       f"same run; our static dataflow engine stands for Lingua Franca; {res.metas[run_id]['machine'].get('usable_cpus', '?')} "
                       "usable CPUs against the paper's 32, where Ray's actor processes time-share the cores",
                       tuple(points))

    return rule


_GYM = ("CartPole-v1", "Pendulum-v1", "Blackjack-v1")
_LF_AXIS = "our dataflow over Ray, same run (x)"

claim("lf-gym", order=40, paper="LF", claim="lock-step sampling of gym envs faster than Ray",
      number="1.21x (mean of 1.16, 1.13, 1.35)", metric="env steps/s, LF (our dataflow) over Ray, same run",
      suites=("lf",), cells="lockstep, 15 envs, CartPole, Pendulum, Blackjack",
      rule=_lf(lambda d: d[(d["op"] == "lockstep") & d["env"].isin(_GYM)], 1.21, "gym lock-step"), axis=_LF_AXIS)
claim("lf-atari", order=41, paper="LF", claim="lock-step sampling of Atari faster than Ray",
      number="11.6x (Pong, Pacman, SpaceInvaders)", metric="env steps/s, LF (our dataflow) over Ray, same run",
      suites=("lf",), cells="lockstep, 15 envs, ALE/Pong-v5",
      rule=_lf(lambda d: d[(d["op"] == "lockstep") & ~d["env"].isin(_GYM)], 11.62, "Atari lock-step"), axis=_LF_AXIS)
claim("lf-pql", order=42, paper="LF", claim="parallel Q-learning shorter than Ray",
      number="31% shorter at batch 500 (Ray 136.95 s / LF 94.22 s = 1.45x)",
      metric="Ray's time over LF's (our dataflow), same run", suites=("lf",),
      cells="pql Blackjack, 16 actors, replay deque, batch 500",
      rule=_lf(lambda d: d[(d["op"] == "pql") & (d["actors"] == 16) & (d["batch"] == 500) & (d["policy"] == "deque")],
               1.4535, "parallel Q-learning"), axis=_LF_AXIS)
claim("lf-multiagent", order=43, paper="LF", claim="multi-agent inference faster than Ray",
      number="5.12x", metric="steps/s, LF (our dataflow) over Ray, same run", suites=("lf",),
      cells="multiagent, 10 agents (simple_spread; the paper: TrafficJunction)",
      rule=_lf(lambda d: d[d["op"] == "multiagent"], 5.12, "multi-agent"), axis=_LF_AXIS)


# ---------------------------------------------------------------------------------------------
# PALA / GALA


claim("pala-shared-memory", order=50, paper="PALA", claim="message-passing gossip trains faster than shared memory",
      number=">20% shorter training", metric="wall time to a return threshold", suites=(), cells="-",
      missing="a gossip suite with a shared-memory (GALA-style) learner beside the message-passing one; "
              "gossip-targets runs message passing and all-reduce only")
claim("pala-compute", order=51, paper="PALA", claim="more compute usable than shared memory",
      number=">6x", metric="cores (nodes) used productively", suites=(), cells="-",
      missing="gossip across several machines; every stored gossip run is on one host")


#: Issue 15's straggler target (suite gossip-targets), for gossip runs that recorded none.
_GOSSIP_TARGET = 1.3


def _gala(res) -> Verdict:
    rows = res.table[(res.table["scenario"] == "gossip") & (res.table["op"] == "summary")
                     & (res.table["metric"] == "env_steps_per_s") & (res.table["status"] == contract.MEASURED)]
    rows = rows.assign(slow=[contract.params_of(p).get("straggler_slowdown") or 1.0 for p in rows["params"]])
    rows = rows[rows["slow"] > 1]
    if rows.empty:
        return Verdict(NO_DATA, why="no gossip cell with a slowed learner")
    cells = stats.spread(rows, ["run_id", "learners", "slow", "variant"], "value")
    best, points = None, []
    for (run, learners, slow), g in cells.groupby(["run_id", "learners", "slow"], sort=True):
        ar, gossip = g[g["variant"] == "allreduce"], g[g["variant"] == "gossip"]
        if ar.empty or gossip.empty:
            continue
        ratio, lo, hi = _pair(g, gossip.iloc[0], ar.iloc[0])
        points.append(Point(f"{int(learners)} learners, one {slow:g}x slower", float(ratio), float(lo), float(hi),
                            str(run), "gossip (k=2)"))
        if best is None or int(gossip.iloc[0]["n"]) > best[4]:
            best = (ratio, lo, hi, run, int(gossip.iloc[0]["n"]), learners, slow)
    if best is None:
        return Verdict(NO_DATA, "-", "-", _runs(rows), "no run has gossip and all-reduce with the same straggler")
    ratio, lo, hi, run_id, n, learners, slow = best
    recorded = (references.recorded(res.metas.get(run_id), "targets", "gossip") or {}).get("straggler_at_least_x_allreduce")
    target = recorded or _GOSSIP_TARGET  # a run made from a copied suite file recorded none
    verdict = ratio_verdict(ratio, target)
    return Verdict(verdict, f"gossip (k=2) over all-reduce: {_x(ratio)}, {int(learners)} learners, one {slow:g}x slower",
                   f"{seeds(n)}; {_range(lo, hi)}x", (run_id,),
                   f"same run; the target is issue 15's (>= {target:g}x"
                   + (")" if recorded else ", as its suite file gives it; the run recorded none)"),
                   tuple(Point(p.label, p.value, p.low, p.high, p.run_id, p.series, paper=target) for p in points))


claim("gala-straggler", order=52, paper="GALA", claim="gossip learners keep their pace where all-reduce waits for a straggler",
      number="no number in the paper's abstract (issue 15's target: >= 1.3x)",
      metric="env steps/s, gossip over all-reduce with one learner slowed, same run", suites=("gossip*",),
      cells="A2C CartPole, 4 learners, one slowed 2x", rule=_gala, axis="gossip over all-reduce, same run (x)")
