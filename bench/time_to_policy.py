"""Time to threshold across seeds, with censored runs counted: the learning scenario's
summary and the analysis read the same derivations (no scenario, impl or numba here).

A run that ends its budget without a snapshot holding the threshold is *censored*: its time to
threshold is only known to be longer than the run. It is never dropped. Medians and quartiles
are taken over every seed with censored runs as +infinity, so a configuration that reaches the
threshold in fewer than half its seeds has no finite median ("not reached"), and a
configuration that reaches it in 1 of 3 seeds cannot look best. Speedups are per seed: the
reference configuration's time over this one's for the same seed, a censored side giving a
bound (``>``/``<``) rather than a number.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from replaybench.bench import contract

__all__ = ["Outcome", "Summary", "summarize", "quantile", "per_seed_speedups", "best_reference", "config_key",
           "outcomes", "layouts"]


@dataclass(frozen=True)
class Outcome:
    """One run: its seed, seconds to threshold (None: censored at ``budget_s``), env steps and
    updates to threshold, and whether its final policy held the threshold."""

    seed: int
    time_s: float | None
    budget_s: float
    env_steps: int | None = None
    updates: int | None = None
    final_holds: bool = False

    @property
    def censored(self) -> bool:
        return self.time_s is None

    @property
    def sort_key(self) -> float:
        return math.inf if self.time_s is None else self.time_s


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (inf allowed) by linear interpolation between order
    statistics (numpy's default); inf where it falls among or next to infinite values."""
    xs = sorted(values)
    if not xs:
        return math.nan
    pos = q * (len(xs) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    if math.isinf(xs[hi]):
        return math.inf
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class Summary:
    """A configuration over its seeds: ``reached`` of ``n``, the median and quartiles of the time
    (inf: not reached by that share of seeds), the median env steps and updates to threshold
    over the seeds that reached it (None when none did), and how many final policies held."""

    n: int
    reached: int
    median_s: float
    q1_s: float
    q3_s: float
    median_env_steps: float | None
    median_updates: float | None
    final_holds: int

    @property
    def label(self) -> str:
        return f"{self.reached}/{self.n}"


def summarize(outcomes: list[Outcome]) -> Summary:
    """The :class:`Summary` of one configuration's runs (censored ones counted as +inf)."""
    times = [o.sort_key for o in outcomes]
    done = [o for o in outcomes if not o.censored]

    def med(values):
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    return Summary(len(outcomes), len(done), quantile(times, 0.5), quantile(times, 0.25), quantile(times, 0.75),
                   med([o.env_steps for o in done]), med([o.updates for o in done]),
                   sum(o.final_holds for o in outcomes))


def per_seed_speedups(reference: list[Outcome], candidate: list[Outcome]) -> list[tuple[int, str, float]]:
    """Per seed both ran: ``(seed, relation, ratio)``, ratio = reference time / candidate time.
    relation ``"="`` when both reached; ``">"`` when only the candidate did (the ratio is at
    least reference budget / candidate time); ``"<"`` when only the reference did (at most its
    time / the candidate's budget); seeds where neither reached are left out."""
    ref = {o.seed: o for o in reference}
    out = []
    for c in candidate:
        r = ref.get(c.seed)
        if r is None or (r.censored and c.censored):
            continue
        if not r.censored and not c.censored:
            out.append((c.seed, "=", r.time_s / c.time_s))
        elif r.censored:
            out.append((c.seed, ">", r.budget_s / c.time_s))
        else:
            out.append((c.seed, "<", r.time_s / c.budget_s))
    return sorted(out)


def best_reference(configs: dict[str, list[Outcome]]) -> str | None:
    """The name of the configuration with the shortest median time (ties: more seeds reached,
    then the name), among ``configs``; None when empty."""
    if not configs:
        return None
    return min(configs, key=lambda name: (summarize(configs[name]).median_s, -summarize(configs[name]).reached, name))


def config_key(row) -> tuple:
    """``(algo, env, config name)`` of a learning row."""
    return row["algo"], row["env"], contract.params_of(row["params"]).get("config")


def outcomes(rows) -> dict[tuple, list[Outcome]]:
    """:func:`config_key` -> the runs' :class:`Outcome`, by seed, from learning rows (dicts as the
    results contract reads them)."""
    runs: dict[tuple, dict] = {}
    for r in rows:
        if r.get("op") != "learning" or r.get("status") != "ok":
            continue
        runs.setdefault(config_key(r), {}).setdefault(r["seed"], {})[r["metric"]] = r["value"]
    out = {}
    for key, by_seed in runs.items():
        out[key] = [Outcome(seed, m.get("time_to_threshold_s"), m.get("censored_at_s", m.get("time_to_threshold_s", 0.0)),
                            m.get("env_steps_to_threshold"), m.get("updates_to_threshold"), bool(m.get("final_holds")))
                    for seed, m in sorted(by_seed.items())]
    return out


def layouts(rows) -> dict[tuple, str]:
    """:func:`config_key` -> ``"sequential"``, ``"A+L"`` (actor and learner processes) or
    ``"peer"`` (another framework's trainer)."""
    out = {}
    for r in rows:
        if r.get("op") == "learning":
            out[config_key(r)] = ("peer" if r["backend"] != "replaybench" else
                                  "sequential" if not r.get("actors") else f"{r['actors']}+{r['learners']}")
    return out
