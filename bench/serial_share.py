"""The serial share of a shared buffer's calls, from a concurrency run's rows, and the Amdahl
model it sets (issue 42 item 3). Pure: the standard library and :mod:`bench.contract` only, so
the summary, ``replaybench plan`` and the analysis all read it without numba or a scenario.

Accounts of one call (the concurrency scenario's per-call rows, :mod:`bench.scenarios.concurrency`):

* ``call_s`` (``busy_s_per_call``): the call's wall time, read with ``time.perf_counter``
  around it by the worker;
* ``exclusive_s`` (``lock_hold_s_per_call``): the time inside sections that exclude every
  other worker: the tree lock held exclusively, timed by the kernels' own clock
  (``lockstats``, :mod:`impl.concurrent.fused`; Python-path locks by
  :class:`impl.concurrent.locks.SharedLock`). Shared (reader) holds are not in it: they exclude
  only writers;
* ``wait_s`` (``lock_wait_s_per_call``): the time spent waiting for a lock (about 0 with one
  worker: nothing else holds it);
* ``parallel_s = call_s - exclusive_s - wait_s``: everything any number of workers can run at
  once (the Python around the kernel, the data copies outside the lock, the draw under a
  shared hold).

The three measured accounts come from two clocks (the kernel's ``CLOCK_MONOTONIC`` reads
inside the call, ``perf_counter`` around it: the same clock on Linux), so ``exclusive_s +
wait_s`` can exceed ``call_s`` only by a bookkeeping error (a hold counted twice, counted
outside the call, or in another unit). :data:`ACCOUNT_TOLERANCE` states how far it may before
:func:`one_worker_shares` refuses the run: 1 % of the call plus 0.1 us (two clock reads'
granularity and the statistics' float rounding, per call).

The serial share of an op (``insert`` = an actor's insert call; ``iteration`` = a learner step,
sample + update) is ``exclusive_s / call_s`` **with one worker** (the 1-actor or 1-learner
cell): a property of the code path, measurable on any machine with one core to spare, not of
the machine's core count. For threads the Python around the kernel holds the GIL, which is
serial too and not in this share (the scenario's ``shared_path`` measures it: ``gil_share``);
the share is the buffer's own, the whole serial part for processes. Amdahl's law turns it into
a bound on n workers' speed-up,
``amdahl(s, n) = 1 / (s + (1 - s) / n)`` (:func:`amdahl`; at 16: ``AMDAHL_AT``).

The model (:func:`predict_cells`) extends Amdahl to a mix of actors and learners: a worker's
loop per call costs what it costs with one worker (``loop = batch / rate``: the call and the
loop around it) plus one exclusive section of every *other* worker (each other worker is taken
to be ahead of it in the lock's queue once: Amdahl's law for identical workers, exactly),

    learner step:  T_L(a, l) = loop_L + (l - 1) * excl_L + a * excl_A
    actor insert:  T_A(a, l) = loop_A + (a - 1) * excl_A + l * excl_L

so ``l`` learners sample ``l * sample_batch / T_L`` transitions/s and ``a`` actors insert ``a *
write_batch / T_A``, with ``n`` workers on fewer cores sharing them (the rate times ``cores /
n``); with both kinds and a samples-per-insert ratio the sample rate is the lower of the
learners' and ``spi`` times the actors' (the side that is ahead waits for the other). Inputs:
the 1-actor and 1-learner cells only, so a run on two cores predicts a run on sixteen.

What the model leaves out, and how a missed cell is explained (:func:`predict_cells`'s
``term``): it keeps each account at its one-worker value, so a cell it misses by more than
:data:`MISS` is attributed to the account whose measured per-call seconds at that cell moved
furthest from the model's: ``exclusive`` (the lock held longer per call: the tree's lines
bouncing between cores), ``parallel`` (the unlocked work slowed: shared caches, memory
bandwidth, cores shared with the machine's other work), ``wait`` (queueing beyond one section
per other worker, or less of it) or ``rate`` (the rate limiter held the faster side back more
than the model's min() says). Costs: one pass over the rows.
"""

from __future__ import annotations

import math
import statistics

from replaybench.bench import contract

__all__ = ["ACCOUNT_TOLERANCE", "AMDAHL_AT", "MISS", "OPS", "amdahl", "account_error", "check_accounts",
           "one_worker_shares", "predict_cells"]

#: (relative to the call, absolute seconds per call) by which exclusive + wait may pass the call.
ACCOUNT_TOLERANCE = (0.01, 1e-7)
#: The worker count the summary and the report state Amdahl's bound at.
AMDAHL_AT = 16
#: A prediction further off than this (|predicted / measured - 1|) is a miss and gets a term.
MISS = 0.25
#: op -> (the one-worker cell (actors, learners), the op whose items/s is its rate).
OPS = {"iteration": ((0, 1), "sample"), "insert": ((1, 0), "insert")}

_ACCOUNTS = {"call_s": "busy_s_per_call", "exclusive_s": "lock_hold_s_per_call", "wait_s": "lock_wait_s_per_call"}


def amdahl(share: float, n: int) -> float:
    """Amdahl's speed-up of ``n`` workers over one when ``share`` of each call is serial.
    ValueError naming the argument for a share outside [0, 1] or ``n < 1``."""
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0.0 <= share <= 1.0:
        raise ValueError(f"share must be a number in [0, 1], got {share!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an integer >= 1, got {n!r}")
    return 1.0 / (share + (1.0 - share) / n)


def account_error(call_s: float, exclusive_s: float, wait_s: float) -> float:
    """How far ``exclusive_s + wait_s`` passes ``call_s`` beyond :data:`ACCOUNT_TOLERANCE`, in
    seconds (<= 0: the accounts sum to the call within the tolerance)."""
    rel, absolute = ACCOUNT_TOLERANCE
    return exclusive_s + wait_s - call_s * (1.0 + rel) - absolute


def _int(x) -> int:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return 0
    return 0 if math.isnan(x) else int(x)


_CONFIG = ("variant", "policy", "mode", "transitions")


def _windows(rows) -> dict:
    """``{(variant, policy, mode, transitions, actors, learners): {(op, metric): {repeat: value}}}``
    of the ``ok`` concurrency rows."""
    out: dict = {}
    for r in rows:
        if r.get("scenario") != "concurrency" or r.get("status") != "ok":
            continue
        key = (*(r.get(k) for k in _CONFIG), _int(r.get("actors")), _int(r.get("learners")))
        out.setdefault(key, {}).setdefault((r["op"], r["metric"]), {})[_int(r.get("repeat"))] = float(r["value"])
    return out


def _median_accounts(by: dict, op: str) -> dict | None:
    """Median over windows of each account of ``op`` (None when the cell lacks one), checked."""
    per = {name: by.get((op, metric)) for name, metric in _ACCOUNTS.items()}
    if any(not v for v in per.values()):
        return None
    return {name: statistics.median(v.values()) for name, v in per.items()}


def check_accounts(rows) -> int:
    """Check every window of every cell (any number of workers) of a run's per-call rows: its
    exclusive + wait seconds per call do not pass its call's seconds beyond
    :data:`ACCOUNT_TOLERANCE`. Returns the number of (cell, op, window) accounts checked (0 for
    a run without per-call rows); raises ValueError naming the first that fails. One pass."""
    checked = 0
    for key, by in _windows(rows).items():
        for op in OPS:
            calls, holds, waits = (by.get((op, _ACCOUNTS[n])) or {} for n in ("call_s", "exclusive_s", "wait_s"))
            for w in sorted(calls):
                if w not in holds or w not in waits:
                    continue
                checked += 1
                if account_error(calls[w], holds[w], waits[w]) > 0:
                    where = {**dict(zip(_CONFIG, key)), "actors": key[4], "learners": key[5]}
                    raise ValueError(
                        f"{where} op {op} window {w}: exclusive {holds[w]:.3e} s + wait {waits[w]:.3e} s per call "
                        f"exceed the call's {calls[w]:.3e} s beyond the tolerance {ACCOUNT_TOLERANCE}: the accounts "
                        "do not sum to the call")
    return checked


def one_worker_shares(rows, at: int = AMDAHL_AT) -> list[dict]:
    """Per (variant, policy, mode, transitions) and op (``iteration``, ``insert``) of a run's
    one-worker cells: ``call_s``, ``exclusive_s``, ``wait_s``, ``parallel_s`` (medians over the
    windows), ``share`` (the median over windows of exclusive / call), ``amdahl`` (the bound at
    ``at`` workers), ``at``, ``rate`` (items/s of the op's one worker) and ``windows``.

    Rows are dicts as :func:`bench.contract.read_rows` gives them (or an analysis table's
    records). Runs without the per-call rows (made before them) give no entries.
    Raises ValueError naming the cell and window whose exclusive + wait time passes its call's
    time by more than :data:`ACCOUNT_TOLERANCE` (see the module docstring). One pass.
    """
    out = []
    for key, by in sorted(_windows(rows).items(), key=lambda kv: tuple(map(str, kv[0]))):
        split = key[4:]
        for op, (one, rate_op) in OPS.items():
            if split != one:
                continue
            calls, holds, waits = (by.get((op, _ACCOUNTS[n])) or {} for n in ("call_s", "exclusive_s", "wait_s"))
            shares = []
            for w in sorted(calls):
                if w not in holds or w not in waits:
                    continue
                if account_error(calls[w], holds[w], waits[w]) > 0:
                    raise ValueError(
                        f"{dict(zip(_CONFIG, key))} op {op} window {w}: exclusive {holds[w]:.3e} s + wait "
                        f"{waits[w]:.3e} s per call exceed the call's {calls[w]:.3e} s beyond the tolerance "
                        f"{ACCOUNT_TOLERANCE}: the accounts do not sum to the call")
                shares.append(holds[w] / calls[w] if calls[w] > 0 else 0.0)
            acc = _median_accounts(by, op)
            if acc is None or not shares:
                continue
            share = min(1.0, max(0.0, statistics.median(shares)))
            rate = by.get((rate_op, "items_per_s"))
            out.append({**dict(zip(_CONFIG, key)), "op": op, **acc,
                        "parallel_s": acc["call_s"] - acc["exclusive_s"] - acc["wait_s"], "share": share,
                        "amdahl": amdahl(share, at), "at": at, "windows": len(shares),
                        "rate": statistics.median(rate.values()) if rate else None})
    return out


def _term(measured: dict, model: dict, others: int, rate_wait: float | None) -> str:
    """The account whose measured seconds per call moved furthest from the model's (see the
    module docstring). A longer exclusive section costs a call its own one and ``others``
    waited for, so its move counts ``others + 1`` times; the wait is compared with the model's
    wait at the measured section length, so that it names queueing beyond the holds."""
    moved = {"exclusive_s": (others + 1) * abs(measured["exclusive_s"] - model["exclusive_s"]),
             "parallel_s": abs(measured["parallel_s"] - model["parallel_s"])}
    grown = measured["exclusive_s"] / model["exclusive_s"] if model["exclusive_s"] > 0 else 1.0
    moved["wait_s"] = abs(measured["wait_s"] - model["wait_s"] * grown)
    if rate_wait:  # share of worker time the limiter held back, as seconds per call of the cell
        moved["rate_s"] = rate_wait * measured["call_s"]
    return {"exclusive_s": "exclusive", "parallel_s": "parallel", "wait_s": "wait", "rate_s": "rate"}[
        max(moved, key=moved.get)]


def predict_cells(rows, cores: int, *, variant: str, policy: str, mode: str, transitions: str,
                  samples_per_insert: float | None = None, write_batch: int | None = None,
                  sample_batch: int | None = None) -> list[dict]:
    """The model's rate against the measured one for every cell of the run matching the
    configuration: ``[{"actors", "learners", "measured", "predicted", "error", "input", "term"}]``
    (``measured`` / ``predicted``: sample transitions/s, insert transitions/s without learners;
    ``error`` = predicted / measured - 1; ``input``: the 1-actor or 1-learner cell; ``term``: the
    account that explains a miss past :data:`MISS`, "" otherwise; see the module docstring).

    ``samples_per_insert``, ``write_batch``, ``sample_batch``: the run's (read from the rows'
    ``params`` and ``batch`` when None). Raises ValueError naming what is missing: the one-worker
    cells, or a cores count below 1.
    """
    if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
        raise ValueError(f"cores must be an integer >= 1, got {cores!r}")
    where = dict(variant=variant, policy=policy, mode=mode, transitions=transitions)
    mine = [r for r in rows if all(r.get(k) == v for k, v in where.items())]
    shares = {e["op"]: e for e in one_worker_shares(mine)}
    if set(shares) != set(OPS) or not all(e["rate"] for e in shares.values()):
        raise ValueError(f"no one-worker accounts for {where} (needs the 1-actor and 1-learner cells with the "
                         f"per-call rows; has {sorted(shares)})")
    for r in mine:
        params = contract.params_of(r.get("params"))
        if samples_per_insert is None and params.get("samples_per_insert"):
            samples_per_insert = float(params["samples_per_insert"])
        if write_batch is None and params.get("write_batch"):
            write_batch = int(params["write_batch"])
        if sample_batch is None and r.get("batch"):
            sample_batch = _int(r["batch"])
    if not write_batch or not sample_batch:
        raise ValueError(f"the rows of {where} do not say write_batch and batch")
    it, ins = shares["iteration"], shares["insert"]
    # a worker's loop per call with one worker (the call and the loop around it: making the
    # batch, the bookkeeping), from its measured rate: the model adds only the others' sections
    loop_l, loop_a = sample_batch / it["rate"], write_batch / ins["rate"]
    out = []
    for key, by in sorted(_windows(mine).items(), key=lambda kv: (sum(kv[0][4:]), kv[0][4:])):
        a, l_ = key[4:]
        op = "sample" if l_ else "insert"
        got = by.get((op, "items_per_s"))
        if not got:
            continue
        measured = statistics.median(got.values())
        share = min(1.0, cores / (a + l_))
        t_l = loop_l + (l_ - 1) * it["exclusive_s"] + a * ins["exclusive_s"] if l_ else math.inf
        t_a = loop_a + (a - 1) * ins["exclusive_s"] + l_ * it["exclusive_s"] if a else math.inf
        learn = l_ * sample_batch / t_l * share if l_ else 0.0
        act = a * write_batch / t_a * share if a else 0.0
        if l_ and a and samples_per_insert:
            predicted = min(learn, samples_per_insert * act)
        else:
            predicted = learn if l_ else act
        error = predicted / measured - 1.0
        term = ""
        if abs(error) > MISS:
            kind, base, model_t, loop = ("iteration", it, t_l, loop_l) if l_ else ("insert", ins, t_a, loop_a)
            acc = _median_accounts(by, kind)
            if acc is None:
                term = "-"
            else:
                model = {"exclusive_s": base["exclusive_s"], "parallel_s": base["parallel_s"],
                         "wait_s": model_t - loop}
                measured_acc = {**acc, "parallel_s": acc["call_s"] - acc["exclusive_s"] - acc["wait_s"]}
                rw = by.get(("all", "rate_wait_fraction"))
                term = _term(measured_acc, model, a + l_ - 1,
                             statistics.median(rw.values()) if rw and a and l_ else None)
        out.append({"actors": a, "learners": l_, "measured": measured, "predicted": predicted, "error": error,
                    "input": (a, l_) in ((1, 0), (0, 1)), "term": term})
    return out
