"""Pure derivations from rows: what bench's terminal summaries and analysis's figures and report
compute from a run, stated once. It imports the standard library, numpy and :mod:`bench.contract`
only (never a scenario, impl or numba), so reading results stays as light as the contract.

Four parts, and :func:`recorded`: the paper figures and targets a run's meta.json holds.

- **Throughput summaries** (:func:`summarize_cells`, :func:`summarize`, :func:`thread_ratios`):
  medians, min-max and counts of items/s over the ``ok`` timing rows of a micro run, per cell
  or per (op, capacity, variant), and the speed-up of T threads over one.
- **Memory bounds** (:func:`working_set_bytes`, :func:`bound_ns`, :func:`bound_rows`): a
  buffer's working set, and the random-gather floor and dependent-load latency at that size
  from the machine's memory limits (meta.json ``memory_limits``, measured by
  :func:`bench.limits.probe`). :data:`SCHEMAS` and :func:`row_bytes` say what a row's
  ``transitions`` value stands for.
- **Op floors** (:func:`op_floor_ns`, :func:`floor_rows`): each op's measured cost against the
  floor of its own access pattern (meta.json ``memory_limits.op_floors``, measured by
  :func:`bench.floors.op_floors`), as a fraction of it.
- **Lingua Franca ratios** (:func:`lf_ratios`): each backend's median beside Ray's and the
  one-process backend's in the same cell, and the paper's ratio where the run recorded it.
- **The replay bound inside a framework's loop** (:func:`replay_bound`): how far swapping a
  framework's buffer for ours can speed its training loop up, from the replay shares
  (issue 29's targets; the model is in the function's docstring).
- **The scaling model** of actors and learners on one shared buffer (:class:`Costs`,
  :func:`predict`, :func:`best_split`, :func:`costs_from_rows`, :func:`validate_model`):
  predicted throughput and the best actor/learner split for a number of cores (PAL chooses its
  counts from the hardware), described below.

Every function takes rows as dicts (as :func:`bench.contract.read_rows` gives them; analysis
passes its table's records) and returns plain dicts, lists or dataclasses. Costs are one pass
over the rows unless a docstring says otherwise.

Scaling model
-------------
The model is a bottleneck bound (a roofline for one buffer), built from quantities the
concurrency benchmark measures on the machine at hand (:class:`Costs`):

* ``insert_s`` / ``iteration_s``: seconds of one core per insert call (``write_batch``
  transitions) and per learner iteration (sample ``sample_batch`` + update them), each
  measured by a worker alone (no contention, no waiting): the inverse of its call rate, so
  the loop around the call (making a batch) is included;
* ``insert_hold_s`` / ``iteration_hold_s``: seconds per call the buffer's tree lock is held
  (measured under the policy: global-lock holds it for the data copies too, lazy-writing and
  optimistic for the tree work only);
* ``serial_fraction`` (``s_l``) / ``insert_serial_fraction`` (``s_a``; None: ``s_l``): the
  share of a learner iteration / an insert that runs one at a time for another reason than
  the tree lock -- the GIL for threads; for processes, what shared lines, caches and memory
  take from each more worker -- fitted from the measured 2-learner / 2-actor cells.

With ``a`` actors, ``l`` learners on ``cores`` cores, a samples-per-insert ratio ``spi``
(sampled transitions per inserted transition, held fixed as in training) and the sample rate
``S`` (transitions/s; inserts run at ``S / spi``), each worker gets ``share = min(1, cores /
(a + l))`` of a core, and ``S`` is the largest rate that meets every bound:

====================  =====================================================================
bound                 constraint
====================  =====================================================================
learners              ``S / sample_batch * iteration_s <= l * share``
actors                ``S / spi / write_batch * insert_s <= a * share``
tree lock             ``S / sample_batch * iteration_hold_s + S / spi / write_batch * insert_hold_s <= 1``
serial (Amdahl)       ``S * (Z + P / n) <= 1``, ``n = min(a + l, cores)`` workers running at once
====================  =====================================================================

where per unit of ``S`` the learners' and actors' core seconds are ``W_l = iteration_s /
sample_batch`` and ``W_a = insert_s / write_batch / spi`` (``1 / spi`` is 1 without learners:
the actors insert unthrottled), their serial parts ``Z = s_l W_l + s_a W_a`` and their
parallel parts ``P = (1 - s_l) W_l + (1 - s_a) W_a``: Amdahl's law, ``n / (1 + (n - 1) s)``
times one worker's rate for one kind alone, tending to ``1 / Z`` as workers are added.

``s_l`` is fitted from the 2-learner cell: where two learners sample less than the other
bounds allow, the serial bound through them, ``s_l = (n / (S_2 W_l) - 1) / (n - 1)`` with
``n = min(2, cores)`` (``2 S_1 / S_2 - 1`` on two cores or more), clipped to [0, 1]; else 0.
``s_a`` likewise from the 2-actor cell's insert rate, where the run has one (else ``s_a =
s_l``). Each stands for everything that keeps two workers of its kind from doubling one (the
GIL for threads; shared caches, lines, memory bandwidth and the OS for processes). The
1-actor, 1- and 2-learner cells (and the 2-actor one, where present) are the model's inputs;
every other cell of a run is a prediction (:func:`validate_model`). (Not a cap at the 2-worker
rate: a design whose per-call costs grow slowly with the workers goes on scaling past it.)

The binding constraint is reported (``bound``). :func:`best_split` finds the split ``a + l <=
max_workers`` (default: ``cores``) with the highest sample rate, the one a scan of every split
finds, from a few splits per worker count (the rate is unimodal in the actors).

Assumptions and error bound. (1) Per-call costs do not grow with contention: cache traffic
between cores (the tree's top lines bounce between writers' caches), memory bandwidth and
lock hand-off latency are not modelled, so the prediction is an upper bound that is reached
only while the lock's utilisation stays well below 1; near a lock bound, queueing adds a wait
of about ``hold * rho / (1 - rho)`` per call (M/M/1) that the model leaves out. (2) Cores are
shared fairly by the operating system when oversubscribed. (3) The serial fractions fitted at
2 workers hold at any count. (4) Memory bandwidth is not a bound: the costs are measured
with one worker, so a predicted rate above what the memory system delivers to many cores at
once (``bench.limits``: the gather floor) is not caught. Measured against the concurrency
benchmark on the machine that gave the costs, :func:`validate_model` reports the error per cell;
the relative error is the statement of accuracy, not a constant.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass

import numpy as np

from replaybench.bench import contract

__all__ = ["RECORDED_KINDS", "recorded", "SCHEMAS", "row_bytes", "summarize_cells", "summarize", "thread_ratios", "BOUND_OPS", "working_set_bytes",
           "bound_ns", "bound_rows", "FLOOR_NOISE", "FLOOR_OF", "op_floor_ns", "floor_rows", "LF_WORKLOADS", "LF_SINGLE", "lf_ratios", "REPLAY_BOUNDS", "FRAMEWORK_TARGETS", "replay_bound", "replay_versus_own", "MODEL_BOUNDS", "Costs", "Prediction",
           "predict", "best_split", "costs_from_rows", "validate_model"]


# ---------------------------------------------------------------------------------------------
# what a run recorded beside its rows

#: The kinds of reference data a suite may carry and the driver copies into meta.json: the
#: source papers' figures (``paper``) and the issues' goals (``targets``), each
#: ``{topic: data}``, the data's shape being the topic's reader's business.
RECORDED_KINDS = ("paper", "targets")


def recorded(meta: dict | None, kind: str, topic: str):
    """``meta[kind][topic]``: a topic of the paper figures or targets a run recorded in its
    meta.json (from its suite: :mod:`bench.driver`); None when it recorded none.

    Raises ValueError naming ``kind`` when it is not one of :data:`RECORDED_KINDS`.
    """
    if kind not in RECORDED_KINDS:
        raise ValueError(f"kind must be one of {RECORDED_KINDS}, got {kind!r}")
    data = (meta or {}).get(kind)
    return data.get(topic) if isinstance(data, dict) else None


# ---------------------------------------------------------------------------------------------
# the replay bound inside a framework's loop

#: What holds a framework loop's speedup below its target (:func:`replay_bound`), in the order
#: they are checked.
REPLAY_BOUNDS = ("met", "share", "replay", "loop")


def replay_bound(share_own: float, replay_ratio: float, speedup: float | None, target: float = 1.05) -> dict:
    """What bounds the speedup of a framework's loop when its own buffer is replaced by ours.

    Model: one env step of the loop costs ``W = R + O``, ``R`` every call the loop makes into
    the buffer (add, sample, priority update, and the framework's own reads of it, such as
    Tianshou's n-step returns' ``buffer[indices]``, ``next`` and ``unfinished_index``), ``O``
    everything else (environment, network, the framework). Swapping the buffer changes ``R``
    only, so with ``s = R_own / W_own`` (``share_own``, the own buffer's share of the loop) and
    ``r = R_ours / R_own`` (``replay_ratio``, that time per env step, ours over own) the
    speedup ``W_own / W_ours`` is predicted as

        predicted = 1 / (1 - s + s * r)          (= (1 - s_ours) / (1 - s_own) when O is equal)

    and no buffer can do better than ``ceiling = 1 / (1 - s)`` (``r = 0``). Reaching
    ``target`` needs ``r <= needed = 1 - (1 - 1 / target) / s``, impossible (``needed < 0``)
    when ``s < 1 - 1 / target`` (4.8% for 1.05x).

    ``bound`` says which limit holds, the first that applies of :data:`REPLAY_BOUNDS`:
    ``"met"`` (the measured ``speedup`` reached ``target``); ``"share"`` (``ceiling <
    target``: the own buffer's replay share caps the loop below the target whatever the
    buffer); ``"replay"`` (``predicted < target``: our replay time is not low enough, ``r >
    needed``); ``"loop"`` (the replay times predict the target but the measured speedup
    missed it: the rest of the loop, ``O``, took longer with ours, e.g. the machine's other
    load or different episodes). With ``speedup`` None (not measured) ``"met"`` and
    ``"loop"`` are not decided: the bound is ``"share"``, ``"replay"`` or None.

    Error: the model assumes ``O`` is the same in both runs; the measured speedup over the
    predicted one is ``O_own / O_ours`` and is reported (``loop_ratio``) to show how far
    that holds. O(1). ValueError naming the argument for a share outside ``[0, 1)``, a
    negative ratio or a target below 1.
    """
    for name, value, ok in (("share_own", share_own, lambda v: 0.0 <= v < 1.0),
                            ("replay_ratio", replay_ratio, lambda v: v >= 0.0),
                            ("target", target, lambda v: v >= 1.0)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not ok(value):
            raise ValueError(f"{name} must be a finite number in range, got {value!r}")
    s, r = float(share_own), float(replay_ratio)
    ceiling = 1.0 / (1.0 - s)
    predicted = 1.0 / (1.0 - s + s * r)
    needed = 1.0 - (1.0 - 1.0 / target) / s if s > 0 else -math.inf
    if speedup is not None and speedup >= target:
        bound = "met"
    elif ceiling < target:
        bound = "share"
    elif predicted < target:
        bound = "replay"
    else:
        bound = None if speedup is None else "loop"
    return {"ceiling": ceiling, "predicted": predicted, "needed_ratio": needed, "bound": bound,
            "loop_ratio": None if speedup is None else speedup / predicted}


#: Issue 29's targets where a run recorded none (suite ``targets`` topic ``frameworks``):
#: speedup >= 1.05x in every framework, replay time per env step <= 0.5x the own buffer's where
#: that one is prioritized (Tianshou, TorchRL; SB3's uniform one is only reported against).
FRAMEWORK_TARGETS = {"speedup_at_least": 1.05, "replay_per_step_at_most": {"tianshou": 0.5, "torchrl": 0.5}}


def replay_versus_own(framework: str, own: dict, ours: dict, targets: dict | None = None) -> dict | None:
    """One buffer against the framework's own, from medians over seeds (``{metric: value}``
    with ``replay_per_step_s``, ``replay_share``, where recorded ``buffer_per_step_s`` and
    ``buffer_share``, and for ``ours`` ``speedup_vs_own``, which may be missing):
    ``replay_ratio`` (add, sample and update per env step, ours over own: issue 29's target)
    and its target (None: reported only), ``speedup`` and its target, and :func:`replay_bound`'s
    fields from every buffer call (``share_own`` and ``buffer_ratio``; ``calls`` says which:
    ``"every call"``, or for runs from before the reads were timed ``"add, sample, update"``).
    Counting only the three calls left Tianshou's n-step reads in ``O``, and a measured
    speedup beat the bound. None when either replay time is missing or the own one is 0.
    ``targets``: the run's recorded ``targets.frameworks`` (:data:`FRAMEWORK_TARGETS` when
    None). O(1)."""
    targets = targets or FRAMEWORK_TARGETS
    mine, theirs, share = ours.get("replay_per_step_s"), own.get("replay_per_step_s"), own.get("replay_share")
    if mine is None or theirs is None or share is None or not theirs > 0:
        return None
    goal = float(targets.get("speedup_at_least", FRAMEWORK_TARGETS["speedup_at_least"]))
    speedup = ours.get("speedup_vs_own")
    ratio = mine / theirs
    calls_mine, calls_theirs = ours.get("buffer_per_step_s"), own.get("buffer_per_step_s")
    calls_share = own.get("buffer_share")
    if calls_mine is not None and calls_theirs and calls_share is not None:
        share, calls_ratio, calls = calls_share, calls_mine / calls_theirs, "every call"
    else:
        calls_ratio, calls = ratio, "add, sample, update"
    return {"replay_ratio": ratio, "replay_target": (targets.get("replay_per_step_at_most") or {}).get(framework),
            "speedup": speedup, "speedup_target": goal, "share_own": share, "buffer_ratio": calls_ratio,
            "calls": calls, **replay_bound(min(share, 1.0 - 1e-9), calls_ratio, speedup, goal)}


def step_over_local_cell(e: dict) -> str:
    """A ``shared_path`` entry's step x local as the summary and the report show it: the median
    with its range over the paired rounds ("1.18 (1.12-1.22)"; runs from before the pairing
    have the ratio alone), "-" without one."""
    if e.get("step_over_local") is None:
        return "-"
    lo_hi = e.get("step_over_local_range")
    return f"{e['step_over_local']:.2f}" + (f" ({lo_hi[0]:.2f}-{lo_hi[1]:.2f})" if lo_hi else "")


# ---------------------------------------------------------------------------------------------
# transition schemas

#: Transition schemas by name (the ``transitions`` column): ``{field: (shape, dtype)}`` as
#: impl.storage takes them.
SCHEMAS = {
    # CartPole-v1: 4 floats of state; 16 + 8 + 4 + 16 + 1 = 45 bytes per transition.
    "cartpole": {
        "obs": ((4,), "float32"),
        "action": ((), "int64"),
        "reward": ((), "float32"),
        "next_obs": ((4,), "float32"),
        "done": ((), "bool"),
    },
    # Atari (DQN's input): 4 stacked 84x84 grey frames, 28,224 + 8 + 4 + 1 bytes per transition;
    # the copy, not the tree, is the cost here. (Next states are the following slot's frames.)
    "atari": {
        "obs": ((4, 84, 84), "uint8"),
        "action": ((), "int64"),
        "reward": ((), "float32"),
        "done": ((), "bool"),
    },
}


def _shape(shape) -> tuple:
    return (shape,) if isinstance(shape, int) else tuple(shape)


def row_bytes(fields: dict) -> int:
    """Bytes of one transition of schema ``fields``."""
    return sum(int(np.prod(_shape(shape), dtype=np.int64)) * np.dtype(dtype).itemsize
               for shape, dtype in fields.values())


# ---------------------------------------------------------------------------------------------
# throughput summaries


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
    thread's rows only (rows of more threads are cells of their own: :func:`thread_ratios`).

    For runs with a parameter grid use :func:`summarize_cells` (this merges the grid's cells).
    """
    groups: dict[tuple, list[float]] = {}
    for r, x in _timings(rows):
        if (r.get("threads") or 1) > 1:
            continue
        groups.setdefault((r["op"], r["capacity"], r["variant"]), []).append(x)
    return {k: _spread(v) for k, v in groups.items()}


def thread_ratios(cells: dict[tuple, dict]) -> list[dict]:
    """Thread scaling: per cell run by T > 1 threads (each on its own buffer), its throughput over
    the same cell's with one thread: ``{"row", "x", "lo", "hi"}`` with ``x`` the median over the
    median and ``lo``-``hi`` the ratio of the extremes (so the widest it can be). ``cells`` as
    :func:`summarize_cells` gives them; cells with no one-thread counterpart are left out."""
    one = {_without_threads(c["row"]): c for c in cells.values() if (c["row"].get("threads") or 1) == 1}
    out = []
    for c in cells.values():
        base = one.get(_without_threads(c["row"])) if (c["row"].get("threads") or 1) > 1 else None
        if base is not None:
            out.append({"row": c["row"], "x": c["median"] / base["median"], "lo": c["min"] / base["max"],
                        "hi": c["max"] / base["min"]})
    return out


def _without_threads(row: dict) -> tuple:
    """The cell key less what the thread count changes (threads, and items per call with it)."""
    skip = ("threads", "items_per_call")
    return tuple(v for c, v in zip(contract.CELL_COLUMNS, contract.cell_key(row)) if c not in skip)


# ---------------------------------------------------------------------------------------------
# memory bounds

#: Ops shown against the memory floor: one random row or leaf per item is what they cannot avoid.
BOUND_OPS = ("sample", "update", "insert_batch")


def working_set_bytes(capacity: int, row_bytes: int, leaf_bytes: int = 4) -> int:
    """Bytes a buffer of ``capacity`` rows spans: its rows plus a sum and a min tree
    (about ``capacity * leaf_bytes * 16/15`` each, for K=16; a binary tree is 2x: the
    difference is small beside the rows)."""
    return int(capacity * (row_bytes + 2 * leaf_bytes * 16 / 15))


def bound_ns(limits: dict, nbytes: int) -> dict:
    """``{"gather_ns", "latency_ns"}`` (and ``"gather_ns_2threads"`` when every probed size has
    it) at a working set of ``nbytes``, from a memory-limits table (``{"sizes": [{"bytes",
    "latency_ns", "gather_ns", ...}]}``, :func:`bench.limits.probe`): log-log interpolation
    between the probed sizes, the nearest probed value outside them."""
    pts = sorted(limits["sizes"], key=lambda s: s["bytes"])
    both = all("gather_ns_2threads" in p for p in pts)  # older runs probed one thread only
    keys = ("gather_ns", "latency_ns") + (("gather_ns_2threads",) if both else ())
    if nbytes <= pts[0]["bytes"]:
        return {k: pts[0][k] for k in keys}
    if nbytes >= pts[-1]["bytes"]:
        return {k: pts[-1][k] for k in keys}
    for a, b in zip(pts, pts[1:]):
        if a["bytes"] <= nbytes <= b["bytes"]:
            t = (math.log(nbytes) - math.log(a["bytes"])) / (math.log(b["bytes"]) - math.log(a["bytes"]))
            return {k: math.exp((1 - t) * math.log(a[k]) + t * math.log(b[k])) for k in keys}
    raise AssertionError("unreachable: sizes are sorted")


def bound_rows(stats: dict, rows: list[dict], memory_limits: dict) -> list[dict]:
    """Per (op in :data:`BOUND_OPS`, capacity, variant) of ``stats`` (:func:`summarize` of
    ``rows``): ns per item (median), the gather floor and dependent-load latency at the
    buffer's working set (:func:`bound_ns`), and ``x_floor`` = ns per item / floor."""
    transitions = {(r["variant"], r["capacity"]): r.get("transitions") for r in rows if r.get("capacity")}
    out = []
    for (op, capacity, variant), s in sorted(stats.items(), key=lambda kv: (kv[0][1] or 0, kv[0][0], kv[0][2])):
        if op not in BOUND_OPS or not capacity:
            continue
        schema = SCHEMAS.get(transitions.get((variant, capacity)) or "cartpole")
        if schema is None:
            continue
        b = bound_ns(memory_limits, working_set_bytes(capacity, row_bytes(schema)))
        ns = 1e9 / s["median"]
        out.append({"op": op, "capacity": capacity, "variant": variant, "ns_per_item": ns, **b,
                    "x_floor": ns / b["gather_ns"]})
    return out


# ---------------------------------------------------------------------------------------------
# op floors

#: How far a measured op may beat its floor before the floor counts as wrong: 25 %. The floor
#: is the minimum of a few passes of the probe taken once at the start of a run, the op's
#: fastest value comes from other processes minutes later; on this shared 2-core VM the same
#: probe read 21.0 and 38.9 ns per draw at 2**20 in back-to-back runs (a loaded moment makes the
#: floor read high), and :mod:`bench.limits` states ~10 % between probes on an idle machine. A
#: margin below that run-to-run spread would fail on noise; one far above it would hide a
#: model that leaves out a real cost.
FLOOR_NOISE = 0.25

#: Op -> the :func:`bench.floors.op_floors` number that is its floor, for tree variants and
#: for ``uniform`` (no tree: its sample is the row gather, its update and index draws touch no
#: memory the probe models, so they have no floor).
FLOOR_OF = {"tree": {"sample": "sample_ns", "sample_indices": "descent_ns", "find": "descent_ns", "update": "update_ns"},
            "uniform": {"sample": "rows_ns"}}


def op_floor_ns(op_floors: dict, key: str, capacity: int) -> float | None:
    """ns per item of ``op_floors``' pattern ``key`` (one of :data:`bench.floors.FLOOR_KEYS`) at
    ``capacity`` leaves: the measured value at a probed capacity, log-log interpolation between
    two probed ones, None outside the probed range (no extrapolation: a floor guessed beyond
    what ran is not a measured one). Cost: one pass over the probed sizes."""
    pts = sorted(op_floors["sizes"], key=lambda s: s["capacity"])
    for a, b in zip(pts, pts[1:] or pts):
        if a["capacity"] == capacity:
            return float(a[key])
        if b["capacity"] == capacity:
            return float(b[key])
        if a["capacity"] < capacity < b["capacity"]:
            t = (math.log(capacity) - math.log(a["capacity"])) / (math.log(b["capacity"]) - math.log(a["capacity"]))
            return math.exp((1 - t) * math.log(a[key]) + t * math.log(b[key]))
    return None


def floor_rows(stats: dict, rows: list[dict], memory_limits: dict | None) -> list[dict]:
    """Per (op, capacity, variant) of ``stats`` (:func:`summarize` of ``rows``) whose op has a
    floor (:data:`FLOOR_OF`): ``ns_per_item`` (median), ``best_ns`` (fastest value), ``floor_ns``
    and ``of_floor`` = floor_ns / ns_per_item (1 = at the floor; above ``1 + FLOOR_NOISE`` from
    ``best_ns`` means the floor does not hold: ``beats``). ``floor_ns`` and ``of_floor`` are
    None ("no floor measured") where the run has no ``op_floors`` (runs from before the probe),
    where the cell's batch or row bytes differ from the probe's, or its capacity is outside the
    probed ones. Peers count as tree variants (each keeps a sum tree)."""
    floors = (memory_limits or {}).get("op_floors")
    cell = {(r["variant"], r["capacity"]): r for r in rows if r.get("capacity")}
    out = []
    for (op, capacity, variant), s in sorted(stats.items(), key=lambda kv: (kv[0][1] or 0, kv[0][0], kv[0][2])):
        r = cell.get((variant, capacity)) or {}
        kind = "uniform" if r.get("structure") == "uniform" else "tree"
        key = FLOOR_OF[kind].get(op)
        if key is None or not capacity:
            continue
        floor = None
        schema = SCHEMAS.get(r.get("transitions") or "cartpole")
        if (floors and schema is not None and row_bytes(schema) == floors["row_bytes"]
                and int(r.get("batch") or 0) == floors["batch"]):
            floor = op_floor_ns(floors, key, int(capacity))
        ns, best = 1e9 / s["median"], 1e9 / s["max"]
        out.append({"op": op, "capacity": capacity, "variant": variant, "ns_per_item": ns, "best_ns": best,
                    "floor_key": key, "floor_ns": floor, "of_floor": None if floor is None else floor / ns,
                    "beats": floor is not None and floor > best * (1 + FLOOR_NOISE)})
    return out


# ---------------------------------------------------------------------------------------------
# Lingua Franca ratios

#: LF workload -> (backends it takes, the metric ratios are taken on, whether higher is faster).
LF_WORKLOADS = {
    "lockstep": (("ray", "dataflow", "sync", "async", "mp-queues"), "env_steps_per_s", True),
    "pql": (("ray", "dataflow"), "time_s", False),
    "multiagent": (("ray", "dataflow", "serial"), "steps_per_s", True),
}

#: LF workload -> its one-process backend (the bar parallel stepping must clear), for ``x_single``.
LF_SINGLE = {"lockstep": "sync", "multiagent": "serial"}


def _lf_key(r: dict) -> tuple:
    return (r["op"], r.get("env"), r.get("policy"), r.get("actors"), r.get("batch"))


def _paper_ratio(paper_cells, cell: dict):
    """The ``ratio`` of the first paper cell whose every ``match`` entry equals ``cell``'s."""
    for entry in paper_cells or ():
        if all(cell.get(k) == v for k, v in entry["match"].items()):
            return entry["ratio"]
    return None


def lf_ratios(rows: list[dict], paper_cells=None) -> list[dict]:
    """One entry per (workload, env, replay, actors, mini-batch, backend) with ``ok`` rows of the
    workload's ratio metric (:data:`LF_WORKLOADS`): its median, min, max and count, ``x_ray`` (its
    speed over Ray's in the same cell: Ray's median time over its own, or its median rate over
    Ray's), ``x_single`` (the same over the workload's one-process backend, :data:`LF_SINGLE`) and
    ``paper`` (the paper's LF-over-Ray ratio for that cell, on our dataflow's entry, or None).

    ``paper_cells``: the paper's cells as the suite records them (``paper.lf_over_ray.cells`` of
    bench/suites/lf.json), each ``{"match": {column: value}, "ratio": ...}``; a measured cell
    takes the first whose ``match`` entries (``op``, ``env``, ``actors``, ``batch``, ...) all
    equal its own. None or empty: None in every ``paper``. ``rows`` name their runtime in
    ``backend`` (rows stored before that column held it in ``variant``: read them through
    ``analysis.load.legacy_columns``).
    """
    groups: dict[tuple, dict[str, list[float]]] = {}
    for r in rows:
        workload = LF_WORKLOADS.get(r["op"])
        if workload and r["metric"] == workload[1] and r["status"] == contract.MEASURED:
            groups.setdefault(_lf_key(r), {}).setdefault(r["backend"], []).append(float(r["value"]))
    out = []
    for key, by_backend in groups.items():
        op, env, policy, actors, batch = key
        faster_is_higher = LF_WORKLOADS[op][2]
        ray = statistics.median(by_backend["ray"]) if "ray" in by_backend else None
        single = by_backend.get(LF_SINGLE.get(op))
        single = statistics.median(single) if single else None
        paper = _paper_ratio(paper_cells, {"op": op, "env": env, "policy": policy, "actors": actors, "batch": batch})
        for backend in LF_WORKLOADS[op][0]:
            if backend not in by_backend:
                continue
            values = by_backend[backend]
            med = statistics.median(values)
            x = None if ray is None else (med / ray if faster_is_higher else ray / med)
            out.append({"op": op, "env": env, "policy": policy, "actors": actors, "batch": batch, "backend": backend,
                        "median": med, "min": min(values), "max": max(values), "n": len(values), "x_ray": x,
                        "x_single": None if single is None else med / single,
                        "paper": paper if backend == "dataflow" else None})
    return out


# ---------------------------------------------------------------------------------------------
# the scaling model (see the module docstring)

MODEL_BOUNDS = ("learners", "actors", "tree lock", "serial")


def _positive(name: str, value, allow_zero: bool = False) -> float:
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
          and (value >= 0 if allow_zero else value > 0))
    if not ok:
        raise ValueError(f"{name} must be a {'non-negative' if allow_zero else 'positive'} finite number, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Costs:
    """Measured inputs of the model (see the module docstring); all seconds are per call."""

    insert_s: float
    iteration_s: float
    insert_hold_s: float
    iteration_hold_s: float
    serial_fraction: float
    write_batch: int
    sample_batch: int
    samples_per_insert: float
    insert_serial_fraction: float | None = None  # None: the learners' serial_fraction

    def __post_init__(self):
        for name in ("insert_s", "iteration_s", "samples_per_insert"):
            _positive(name, getattr(self, name))
        for name in ("insert_hold_s", "iteration_hold_s"):
            _positive(name, getattr(self, name), allow_zero=True)
        for name in ("serial_fraction", "insert_serial_fraction"):
            value = getattr(self, name)
            if (value is not None or name == "serial_fraction") and not 0.0 <= _positive(name, value, True) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value!r}")
        for name in ("write_batch", "sample_batch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Prediction:
    """Predicted rates of one split: transitions/s sampled and inserted, and which bound binds."""

    actors: int
    learners: int
    cores: int
    sample_per_s: float
    insert_per_s: float
    bound: str


def _count(name: str, value, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


def predict(costs: Costs, actors: int, learners: int, cores: int) -> Prediction:
    """The model's sample and insert rates for ``actors`` + ``learners`` workers on ``cores``.

    With no actors the learners sample a full buffer without the insert ratio (pure sampling);
    with no learners the actors insert unthrottled. Raises ValueError naming a bad argument.
    """
    _count("actors", actors, 0)
    _count("learners", learners, 0)
    _count("cores", cores, 1)
    if actors + learners == 0:
        raise ValueError("need at least one actor or learner")
    share = min(1.0, cores / (actors + learners))
    c = costs
    # per transition sampled: core seconds of learners, of actors, lock seconds and serial seconds
    per_sample = c.iteration_s / c.sample_batch if learners else 0.0
    per_insert = c.insert_s / c.write_batch if actors else 0.0
    ratio = 1.0 / c.samples_per_insert if learners else 1.0  # inserts per unit of the rate
    unit_lock = (c.iteration_hold_s / c.sample_batch if learners else 0.0) + ratio * (
        c.insert_hold_s / c.write_batch if actors else 0.0)
    s_l = c.serial_fraction
    s_a = s_l if c.insert_serial_fraction is None else c.insert_serial_fraction
    work_l, work_a = per_sample, ratio * per_insert
    serial = s_l * work_l + s_a * work_a  # Amdahl: serial and parallel core seconds per unit of the rate
    parallel = (1.0 - s_l) * work_l + (1.0 - s_a) * work_a
    running = min(actors + learners, cores)
    limits = {"learners": learners * share / per_sample if learners else math.inf,
              "actors": actors * share / (ratio * per_insert) if actors else math.inf,
              "tree lock": 1.0 / unit_lock if unit_lock > 0 else math.inf,
              "serial": 1.0 / (serial + parallel / running) if serial > 0 else math.inf}
    bound = min(limits, key=limits.get)
    rate = limits[bound]  # transitions/s sampled (or inserted, without learners)
    if learners:
        return Prediction(actors, learners, cores, rate, rate * ratio if actors else 0.0, bound)
    return Prediction(actors, learners, cores, 0.0, rate, bound)


def best_split(cores: int, costs: Costs, max_workers: int | None = None) -> Prediction:
    """The split (at least one actor and one learner, ``a + l <= max_workers``, default
    ``cores``) with the highest predicted sample rate; ties go to fewer workers, then fewer
    actors. Precisely: scanning worker counts n = 2, 3, ... and, within one, actors a = 1, 2,
    ..., the split kept is the first one, replaced only by a later one better by more than one
    part in 10^9 (:data:`_BETTER`), as the scan over every split keeps it, without evaluating
    every split.

    Why two splits per worker count suffice: with n workers the rate of a actors and n - a
    learners (:func:`predict`) is the least of a term rising in a (the actors'), one falling in
    a (the learners') and two that do not depend on a (the tree lock; Amdahl's serial bound,
    which depends on n and the cores only). So it rises up to its first maximum, at a = p, and
    never rises after it, and below p it is the actors' term, a times a constant: each split
    there is beaten by the next by a factor (a + 1) / a, far more than :data:`_BETTER` (for
    any a below 10^8; ``replaybench plan`` asks for at most 65,536 cores). So
    whatever the scan kept before n, it keeps after n what it keeps after looking at p - 1 and
    p alone (after p nothing beats p). :func:`_first_peak` finds p by galloping from the last
    worker count's p, then bisecting on whether the rate still rises.

    Cost: a few :func:`predict` calls per worker count (p moves by about one split from one
    count to the next), O(max_workers log max_workers) at worst; the scan over every split made
    max_workers^2 / 2. Raises ValueError naming a bad ``cores`` or ``max_workers``."""
    _count("cores", cores, 1)
    limit = cores if max_workers is None else _count("max_workers", max_workers, 2)
    if limit < 2:
        raise ValueError(f"cores must be >= 2 to place an actor and a learner (max_workers {limit})")
    best = None
    peak = 1
    for n in range(2, limit + 1):
        peak, at = _first_peak(costs, n, cores, peak)
        for a in (peak - 1, peak):
            if a >= 1:
                p = at(a)
                if best is None or p.sample_per_s > best.sample_per_s * _BETTER:
                    best = p
    return best


#: How much better a later split must be to replace the one :func:`best_split` keeps.
_BETTER = 1 + 1e-9


def _first_peak(costs: Costs, n: int, cores: int, guess: int):
    """``(p, at)``: the fewest actors p in [1, n - 1] at which n workers' predicted sample rate
    stops rising (``rate(p + 1) <= rate(p)``, or p = n - 1): its first maximum, the rate being
    unimodal in the actors (:func:`best_split`); ``at(a)`` is :func:`predict` of a actors and n
    - a learners on ``cores``, each split evaluated once. Gallops from ``guess`` (clamped) in
    steps 1, 2, 4, ... towards p, then bisects: O(log |p - guess|) evaluations."""
    seen: dict[int, Prediction] = {}

    def at(a: int) -> Prediction:
        if a not in seen:
            seen[a] = predict(costs, a, n - a, cores)
        return seen[a]

    def rising(a: int) -> bool:  # True for every a < p, False from p on
        return a < n - 1 and at(a).sample_per_s < at(a + 1).sample_per_s

    start = min(max(guess, 1), n - 1)
    step = 1
    if rising(start):  # p is past start: rising(lo), not rising(hi)
        lo, hi = start, min(start + step, n - 1)
        while rising(hi):
            lo, step = hi, 2 * step
            hi = min(start + step, n - 1)
    else:  # p is start or before it; 0 stands for "rising" below the first split
        lo, hi = start - step, start
        while lo >= 1 and not rising(lo):
            hi, step = lo, 2 * step
            lo = start - step
        lo = max(lo, 0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if rising(mid):
            lo = mid
        else:
            hi = mid
    return hi, at


# ---------------------------------------------------------------------------- from a run's rows
def _matching(rows, where: dict):
    """The concurrency rows whose columns hold the values of ``where`` (column -> value)."""
    return (r for r in rows if r.get("scenario") == "concurrency" and all(r.get(k) == v for k, v in where.items()))


def _medians(rows, **where) -> dict[tuple, float]:
    """``{(actors, learners, op, metric): median over windows}`` of the ``ok`` concurrency rows
    matching ``where`` (column -> value)."""
    groups: dict[tuple, list[float]] = {}
    for r in _matching(rows, where):
        if r.get("status") != "ok":
            continue
        key = (int(r["actors"] or 0), int(r["learners"] or 0), r["op"], r["metric"])
        groups.setdefault(key, []).append(float(r["value"]))
    return {k: statistics.median(v) for k, v in groups.items()}


def _param(rows, name, **where):
    """The first value of parameter ``name`` in the ``params`` of the rows matching ``where``."""
    for r in _matching(rows, where):
        params = contract.params_of(r.get("params"))
        if name in params:
            return params[name]
    return None


def costs_from_rows(rows, *, policy: str, mode: str, transitions: str, variant: str = "kary-aligned",
                    cores: int | None = None) -> Costs:
    """The model's inputs from a concurrency run's rows (dicts as :func:`bench.contract.read_rows`
    gives them): per-call costs and lock holds of the 1-actor and 1-learner cells, the serial
    fractions fitted from the 2-learner cell and, where the run has one, the 2-actor cell (see
    the module docstring).

    Raises ValueError naming what is missing: a run made before the per-call metrics existed,
    or without the 1-actor / 1-learner / 2-learner cells (``"workers": "auto"`` has them).
    """
    where = dict(policy=policy, mode=mode, transitions=transitions, variant=variant)
    med = _medians(rows, **where)
    what = f"policy={policy} mode={mode} transitions={transitions} variant={variant}"
    need = {(1, 0, "insert", "items_per_s"): "1 actor alone", (0, 1, "sample", "items_per_s"): "1 learner alone",
            (1, 0, "insert", "lock_hold_s_per_call"): "1 actor alone (lock hold per call)",
            (0, 1, "iteration", "lock_hold_s_per_call"): "1 learner alone (lock hold per call)"}
    missing = sorted({why for key, why in need.items() if key not in med})
    if missing:
        raise ValueError(f"run has no per-call costs for {what} ({', '.join(missing)}): the model needs the cells "
                         "of the redesigned concurrency scenario (workers 'auto')")
    spi = _param(rows, "samples_per_insert", **where)
    write_batch = _param(rows, "write_batch", **where)
    batch = next((int(r["batch"]) for r in _matching(rows, where) if r.get("batch")), None)
    if spi is None or write_batch is None or batch is None:
        raise ValueError(f"run does not say samples_per_insert, write_batch and batch for {what}")
    # seconds per call from the lone worker's rate: its whole loop (making the batch, the call),
    # which is what one more worker of that kind costs
    costs = Costs(insert_s=int(write_batch) / med[1, 0, "insert", "items_per_s"],
                  iteration_s=batch / med[0, 1, "sample", "items_per_s"],
                  insert_hold_s=med[1, 0, "insert", "lock_hold_s_per_call"],
                  iteration_hold_s=med[0, 1, "iteration", "lock_hold_s_per_call"], serial_fraction=0.0,
                  write_batch=int(write_batch), sample_batch=batch, samples_per_insert=float(spi))
    cores = int(cores or _param(rows, "cores", **where) or 1)
    running = min(2, cores)
    fitted = {}
    for name, (a, l_), op, per_item in (("serial_fraction", (0, 2), "sample", costs.iteration_s / batch),
                                        ("insert_serial_fraction", (2, 0), "insert", costs.insert_s / write_batch)):
        two = med.get((a, l_, op, "items_per_s"))
        if two is None:
            continue
        p = predict(costs, a, l_, cores)
        if two < (p.sample_per_s if l_ else p.insert_per_s) and running > 1:
            # Amdahl through the cell: running / (1 + (running - 1) s) one worker's rate = two
            fitted[name] = min(1.0, max(0.0, (running / (two * per_item) - 1.0) / (running - 1)))
        else:
            fitted[name] = 0.0
    return Costs(**{**costs.as_dict(), **fitted}) if fitted else costs


def validate_model(rows, costs: Costs, cores: int, **where) -> list[dict]:
    """Predicted against measured sample (or, without learners, insert) rate for every cell
    of the run matching ``where``: ``[{"actors", "learners", "measured", "predicted",
    "error", "bound", "input"}]``, ``error`` = predicted / measured - 1, ``input`` True for the
    cells the costs came from (the 2-actor one where its serial fraction was fitted)."""
    med = _medians(rows, **where)
    inputs = {(1, 0), (0, 1), (0, 2)} | ({(2, 0)} if costs.insert_serial_fraction is not None else set())
    out = []
    for a, l_ in sorted({(a, l_) for a, l_, _, _ in med}, key=lambda s: (sum(s), s)):
        op = "sample" if l_ else "insert"
        measured = med.get((a, l_, op, "items_per_s"))
        if measured is None or measured <= 0:
            continue
        p = predict(costs, a, l_, cores)
        predicted = p.sample_per_s if l_ else p.insert_per_s
        out.append({"actors": a, "learners": l_, "measured": measured, "predicted": predicted,
                    "error": predicted / measured - 1.0, "bound": p.bound,
                    "input": (a, l_) in inputs})
    return out
