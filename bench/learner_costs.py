"""The learner scenario's cells from its rows: what one update costs, over its floor, over the
eager update and over one learner. The scenario's summary (:mod:`bench.scenarios.learner`)
and the analysis read the same derivation (no scenario, impl or numba here).
"""

from __future__ import annotations

import statistics

from replaybench.bench import contract

__all__ = ["BOUND_FACTOR", "cell_medians"]

#: An update within this factor of its arithmetic floor is called arithmetic-bound.
BOUND_FACTOR = 2.0


def cell_medians(rows: list[dict], factor: float = BOUND_FACTOR) -> list[dict]:
    """Per (algo, env, device, batch, learners, update) cell of ``rows`` (this scenario's ``ok``
    rows, as dicts): ``seconds`` (median per update), ``low``/``high`` (its blocks' min and max),
    ``samples_per_s`` (the global batch over the median), ``floor`` (seconds, or None), ``bound``
    (``arithmetic`` within ``factor`` of the floor, else ``dispatch`` on the CPU and
    ``dispatch/copies`` off it; ``-`` without a floor), ``x_torch`` (the eager update's median
    over this one's at the same cell; None for the eager one or without it), ``x_one`` (for a
    group: its samples per second over one learner's with the same update and batch; else
    None) and ``allreduce`` (the group's all-reduce seconds, or None). Sorted by the key."""
    cells: dict[tuple, dict] = {}
    for r in rows:
        if r["status"] != "ok":
            continue
        device = contract.params_of(r.get("params")).get("device", "cpu")
        key = (r["algo"], r["env"], device, int(r["batch"]), int(r.get("learners") or 1), r["backend"])
        cell = cells.setdefault(key, {"items": None})
        if r["metric"] == "seconds_per_call":
            cell["items"] = r["items_per_call"]
        cell.setdefault(r["metric"], []).append(r["value"])
    out = []
    for (algo, env, device, batch, learners, update), m in sorted(cells.items()):
        values = m.get("seconds_per_call", [])
        if not values:
            continue
        median = statistics.median(values)
        floor = statistics.median(m["floor_seconds_per_call"]) if m.get("floor_seconds_per_call") else None
        bound = "-" if floor is None else (
            "arithmetic" if median <= factor * floor else ("dispatch" if device == "cpu" else "dispatch/copies"))
        eager = cells.get((algo, env, device, batch, learners, "torch"), {}).get("seconds_per_call")
        one = cells.get((algo, env, device, batch, 1, update), {})
        samples = m["items"] / median
        x_one = None
        if learners > 1 and one.get("seconds_per_call"):
            x_one = samples / (one["items"] / statistics.median(one["seconds_per_call"]))
        allreduce = m.get("allreduce_seconds_per_call")
        out.append({"algo": algo, "env": env, "device": device, "batch": batch, "learners": learners,
                    "update": update, "seconds": median, "low": min(values), "high": max(values),
                    "samples_per_s": samples, "floor": floor, "bound": bound,
                    "x_torch": statistics.median(eager) / median if eager and update != "torch" else None,
                    "x_one": x_one, "allreduce": statistics.median(allreduce) if allreduce else None})
    return out
