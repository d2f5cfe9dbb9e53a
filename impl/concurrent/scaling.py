"""A scaling model of actors and learners on one shared buffer: predicted throughput and the
best actor/learner split for a number of cores (PAL chooses its counts from the hardware).

The model is a bottleneck bound (a roofline for one buffer), built from quantities the
concurrency benchmark measures on the machine at hand (:class:`Costs`):

* ``insert_s`` / ``iteration_s``: seconds of one core per insert call (``write_batch``
  transitions) and per learner iteration (sample ``sample_batch`` + update them), each
  measured by a worker alone (no contention, no waiting): the inverse of its call rate, so
  the loop around the call (making a batch) is included;
* ``insert_hold_s`` / ``iteration_hold_s``: seconds per call the buffer's tree lock is held
  (measured under the policy: global-lock holds it for the data copies too, lazy-writing and
  optimistic for the tree work only);
* ``serial_fraction``: the share of each call that runs one at a time for another reason
  than the tree lock -- the GIL for threads (fitted from the measured 1- and 2-learner
  rates), 0 for processes.

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
serial (GIL)          ``serial_fraction * (S / sample_batch * iteration_s + S / spi / write_batch * insert_s) <= 1``
====================  =====================================================================

``serial_fraction`` is fitted from the 2-learner cell: when two learners sample less than
the other bounds allow, the serial bound is set to what they reached, ``serial_fraction = 1
/ (S_2 * iteration_s / sample_batch)``; it therefore stands for everything that keeps two
workers from doubling one (the GIL for threads; shared caches, memory bandwidth and the OS
for processes). The 1-actor, 1- and 2-learner cells are the model's inputs; every other
cell of a run is a prediction (:func:`validate`).

The binding constraint is reported (``bound``). :func:`plan` searches every split ``a + l <=
max_workers`` (default: ``cores``) for the highest sample rate.

Assumptions and error bound. (1) Per-call costs do not grow with contention: cache traffic
between cores (the tree's top lines bounce between writers' caches), memory bandwidth and
lock hand-off latency are not modelled, so the prediction is an upper bound that is reached
only while the lock's utilisation stays well below 1; near a lock bound, queueing adds a wait
of about ``hold * rho / (1 - rho)`` per call (M/M/1) that the model leaves out. (2) Cores are
shared fairly by the operating system when oversubscribed. (3) The serial fraction fitted at
2 learners holds at any count. (4) Memory bandwidth is not a bound: the costs are measured
with one worker, so a predicted rate above what the memory system delivers to many cores at
once (``bench.limits``: the gather floor) is not caught. Measured against the concurrency
benchmark on the machine that gave the costs, :func:`validate` reports the error per cell;
the relative error is the statement of accuracy, not a constant.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

__all__ = ["Costs", "Prediction", "predict", "plan", "costs_from_rows", "validate", "BOUNDS"]

BOUNDS = ("learners", "actors", "tree lock", "serial")


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

    def __post_init__(self):
        for name in ("insert_s", "iteration_s", "samples_per_insert"):
            _positive(name, getattr(self, name))
        for name in ("insert_hold_s", "iteration_hold_s"):
            _positive(name, getattr(self, name), allow_zero=True)
        if not 0.0 <= _positive("serial_fraction", self.serial_fraction, allow_zero=True) <= 1.0:
            raise ValueError(f"serial_fraction must be in [0, 1], got {self.serial_fraction!r}")
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
    unit_serial = c.serial_fraction * (per_sample + ratio * per_insert)
    limits = {"learners": learners * share / per_sample if learners else math.inf,
              "actors": actors * share / (ratio * per_insert) if actors else math.inf,
              "tree lock": 1.0 / unit_lock if unit_lock > 0 else math.inf,
              "serial": 1.0 / unit_serial if unit_serial > 0 else math.inf}
    bound = min(limits, key=limits.get)
    rate = limits[bound]  # transitions/s sampled (or inserted, without learners)
    if learners:
        return Prediction(actors, learners, cores, rate, rate * ratio if actors else 0.0, bound)
    return Prediction(actors, learners, cores, 0.0, rate, bound)


def plan(cores: int, costs: Costs, max_workers: int | None = None) -> Prediction:
    """The split (at least one actor and one learner, ``a + l <= max_workers``, default
    ``cores``) with the highest predicted sample rate; ties go to fewer workers."""
    _count("cores", cores, 1)
    limit = cores if max_workers is None else _count("max_workers", max_workers, 2)
    if limit < 2:
        raise ValueError(f"cores must be >= 2 to place an actor and a learner (max_workers {limit})")
    best = None
    for n in range(2, limit + 1):
        for a in range(1, n):
            p = predict(costs, a, n - a, cores)
            if best is None or p.sample_per_s > best.sample_per_s * (1 + 1e-9):
                best = p
    return best


# ---------------------------------------------------------------------------- from a run's rows
def _matching(rows, where: dict):
    """The concurrency rows whose columns hold the values of ``where`` (column -> value)."""
    return (r for r in rows if r.get("scenario") == "concurrency" and all(r.get(k) == v for k, v in where.items()))


def _medians(rows, **where) -> dict[tuple, float]:
    """``{(actors, learners, op, metric): median over windows}`` of the ``ok`` concurrency rows
    matching ``where`` (column -> value)."""
    import statistics

    groups: dict[tuple, list[float]] = {}
    for r in _matching(rows, where):
        if r.get("status") != "ok":
            continue
        key = (int(r["actors"] or 0), int(r["learners"] or 0), r["op"], r["metric"])
        groups.setdefault(key, []).append(float(r["value"]))
    return {k: statistics.median(v) for k, v in groups.items()}


def _param(rows, name, **where):
    import json

    for r in _matching(rows, where):
        params = r.get("params")
        params = json.loads(params) if isinstance(params, str) else (params or {})
        if name in params:
            return params[name]
    return None


def costs_from_rows(rows, *, policy: str, mode: str, transitions: str, variant: str = "kary-aligned",
                    cores: int | None = None) -> Costs:
    """The model's inputs from a concurrency run's rows (dicts as ``bench.contract.read_rows``
    gives them): per-call costs and lock holds of the 1-actor and 1-learner cells, the serial
    fraction fitted from the 2-learner cell (see the module docstring).

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
    two = med.get((0, 2, "sample", "items_per_s"))
    cores = cores or _param(rows, "cores", **where) or 1
    if two is not None:
        unconstrained = predict(costs, 0, 2, int(cores)).sample_per_s
        if two < unconstrained:
            serial = min(1.0, 1.0 / (two * costs.iteration_s / costs.sample_batch))
            costs = Costs(**{**costs.as_dict(), "serial_fraction": serial})
    return costs


def validate(rows, costs: Costs, cores: int, **where) -> list[dict]:
    """Predicted against measured sample (or, without learners, insert) rate for every cell
    of the run matching ``where``: ``[{"actors", "learners", "measured", "predicted",
    "error", "bound", "input"}]``, ``error`` = predicted / measured - 1, ``input`` True for the
    cells the costs came from."""
    med = _medians(rows, **where)
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
                    "input": (a, l_) in ((1, 0), (0, 1), (0, 2))})
    return out
