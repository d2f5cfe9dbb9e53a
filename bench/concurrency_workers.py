"""The workers of the concurrency scenario: actors inserting and learners sampling + updating on one shared buffer.

Workers are threads or processes; each maps the buffer through its own
:class:`~impl.concurrent.SharedPrioritizedBuffer` object. Actors (writers) insert batches of
tagged transitions (an ``id``, a ``payload`` of the transition's size, and a ``check`` sum of
both); learners sample, optionally verify every row, and write random priorities back with the
sampled stamps. The same workers serve the benchmark (``replaybench run --suite concurrency``)
and the stress tests (tests/_concurrency_oracle.py: nothing lost, duplicated or torn, the
tree's total agrees with its leaves).

**The training ratio.** With ``cfg["samples_per_insert"]`` set (and both kinds of worker
present), a :class:`RateLimiter` over two shared counters keeps sampled transitions at that
multiple of inserted ones, within a slack of one batch per worker, as Reverb's rate limiter
and PAL's training loop do: a learner that is ahead waits for inserts, an actor that is ahead
waits for samples. Time spent so is counted apart (``rate_wait``) from lock waits.

**Per-operation accounting.** Each worker reports, per kind of operation (``insert`` calls;
learner ``iteration`` = one sample plus its update): calls, items, seconds inside the calls
(``busy``), and of those the seconds spent waiting for and holding the tree lock (from the
buffer's lock statistics, read around each call).
Per window, each worker also reports ``kernel_calls`` (its calls that ran in a fused kernel)
and ``fallbacks`` (of those, the ones handed on to the policy's Python path).

Transition sizes: ``cartpole`` 40 B, ``mujoco`` 200 B, ``atari`` 84x84x4 = 28 224 B of payload
(plus 16 B of id and check).
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import threading
import time
import traceback

import numpy as np

from replaybench.impl.ratelimit import RateLimiter as Limiter
from replaybench.impl.ratelimit import SampleToInsertRatio


__all__ = ["TRANSITIONS", "ID_STRIDE", "RateLimiter", "schema", "make_batch", "intact_rows", "prefill", "run_workers",
           "shared_gil_share", "shared_kernel_scaling", "step_over_local", "fill_with_priorities"]

TRANSITIONS = {"cartpole": 40, "mujoco": 200, "atari": 84 * 84 * 4}
ID_STRIDE = 10**12  # writer w's k-th transition has id w * ID_STRIDE + k
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
NO_RESUM = 2**62  # resum_every that never comes due: for measurements the periodic re-sum would skew


def schema(payload_bytes: int) -> dict:
    return {"id": ((), "int64"), "check": ((), "uint64"), "payload": ((payload_bytes,), "uint8")}


def _payload(ids: np.ndarray, nbytes: int) -> np.ndarray:
    return ((ids[:, None] * 31 + np.arange(nbytes)) % 251).astype(np.uint8)


def _checksum(ids: np.ndarray, payload: np.ndarray) -> np.ndarray:
    # position-weighted, so swapped or shifted bytes change it too; uint64 arithmetic wraps
    weights = np.arange(1, payload.shape[1] + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return payload.astype(np.uint64) @ weights + ids.astype(np.uint64) * _GOLDEN


def make_batch(ids: np.ndarray, nbytes: int, checked: bool = True) -> dict:
    """Tagged transitions for ``ids``; ``checked=False`` leaves ``check`` at 0 (benchmarks)."""
    payload = _payload(ids, nbytes)
    check = _checksum(ids, payload) if checked else np.zeros(ids.shape[0], np.uint64)
    return {"id": ids.astype(np.int64), "check": check, "payload": payload}


def intact_rows(batch: dict) -> np.ndarray:
    """Mask of rows whose check sum matches their id and payload (False: torn or corrupt)."""
    return _checksum(batch["id"], batch["payload"]) == batch["check"]


def prefill(buf, n: int, nbytes: int, chunk: int = 4096) -> None:
    """Insert ``n`` tagged transitions (writer id 0 is reserved for them)."""
    for start in range(0, n, chunk):
        ids = np.arange(start, min(n, start + chunk), dtype=np.int64)
        buf.add(make_batch(ids, nbytes))


def fill_with_priorities(buf, capacity: int, nbytes: int, rng) -> None:
    """Fill ``buf`` (shared or in-process) with ``capacity`` tagged transitions and give them
    random priorities in [0.01, 1.01) from ``rng``: the state every learner-step measurement starts from."""
    prefill(buf, capacity, nbytes)
    buf.update_priorities(np.arange(capacity), rng.random(capacity) + 0.01)


# --------------------------------------------------------------------------- the training ratio
class RateLimiter:
    """Keeps ``sampled <= spi * inserted + slack`` and ``spi * inserted <= sampled + slack``
    over two int64 counters shared by every worker (``counts[0]`` inserted, ``counts[1]``
    sampled, updated atomically): the one rate limiter (:class:`impl.ratelimit.RateLimiter`)
    with a symmetric slack. Waits sleep 20 us between polls until the other side catches up
    or ``deadline`` (a perf_counter time) passes; they return the seconds waited.
    """

    def __init__(self, counts: np.ndarray, samples_per_insert: float, slack: float):
        from replaybench.impl.concurrent.atomics import load

        self.counts = counts
        bounds = SampleToInsertRatio(float(samples_per_insert), 0.0, float(slack), float(slack))
        self._limiter = Limiter(bounds, lambda: load(counts, 0), lambda: load(counts, 1), poll_s=2e-5, max_poll_s=2e-5)

    def before_sample(self, n: int, deadline: float) -> float:
        return self._limiter.wait_sample(n, deadline)

    def before_insert(self, n: int, deadline: float) -> float:
        return self._limiter.wait_insert(n, deadline)

    def inserted(self, n: int) -> None:
        from replaybench.impl.concurrent.atomics import fetch_add

        fetch_add(self.counts, 0, n)

    def sampled(self, n: int) -> None:
        from replaybench.impl.concurrent.atomics import fetch_add

        fetch_add(self.counts, 1, n)


class _Accounts:
    """The totals of one worker's calls of one kind (a writer's inserts, a learner's
    iterations) over a window: ``<kind>_calls``, ``<kind>_busy`` (seconds inside the calls), and
    ``<kind>_wait`` and ``<kind>_hold`` (the buffer object's lock wait and hold seconds over the
    window, all of which its calls of this kind spent: a worker makes calls of one kind).

    Per call it counts and reads the clock twice, no more: the bookkeeping runs between the
    calls holding the GIL, so reading the lock statistics (two guarded properties each) and
    building keys per call, as this once did, added several microseconds of GIL-held work to
    every learner step of the threads cells."""

    def __init__(self, buf, kind: str):
        self.buf, self.kind = buf, kind
        self.calls, self.busy = 0, 0.0
        self._wait0, self._hold0 = buf.lock_wait_seconds, buf.lock_hold_seconds

    def timed(self, fn, *args):
        t0 = time.perf_counter()
        out = fn(*args)
        self.busy += time.perf_counter() - t0
        self.calls += 1
        return out

    @property
    def totals(self) -> dict[str, float]:
        """The window's totals so far (empty before the first call)."""
        if not self.calls:
            return {}
        k, buf = self.kind, self.buf
        return {f"{k}_calls": self.calls, f"{k}_busy": self.busy, f"{k}_wait": buf.lock_wait_seconds - self._wait0,
                f"{k}_hold": buf.lock_hold_seconds - self._hold0}


# --------------------------------------------------------------------------- workers
def _writer(buf, wid: int, cfg: dict, window: float, limiter: RateLimiter | None = None) -> dict:
    nbytes, batch = cfg["nbytes"], cfg["write_batch"]
    seq = cfg.get("first_seq", 0)
    verify = cfg.get("verify", False)
    template = make_batch(np.zeros(batch, np.int64), nbytes, checked=False)
    limit = cfg.get("max_items")
    acct = _Accounts(buf, "insert")
    items = 0
    rate_wait = 0.0
    start = time.perf_counter()
    end = start + window
    while time.perf_counter() < end and (limit is None or items < limit):
        if limiter is not None:
            rate_wait += limiter.before_insert(batch, end)
            if time.perf_counter() >= end:
                break
        ids = wid * ID_STRIDE + np.arange(seq, seq + batch, dtype=np.int64)
        acct.timed(buf.add, make_batch(ids, nbytes) if verify else {**template, "id": ids})
        if limiter is not None:
            limiter.inserted(batch)
        seq += batch
        items += batch
    return {"role": "writer", "index": wid, "insert": items, "seconds": time.perf_counter() - start,
            "next_seq": seq, "rate_wait": rate_wait, **acct.totals}


def _learner(buf, lid: int, cfg: dict, window: float, limiter: RateLimiter | None = None) -> dict:
    batch = cfg["sample_batch"]
    verify = cfg.get("verify", False)
    rng = np.random.default_rng(1000 + lid)
    into = buf.sample_out(batch)  # made once: a training loop's steady state, no allocation per step
    acct = _Accounts(buf, "iteration")
    sampled = updated = torn = 0
    rate_wait = 0.0
    problems: list[str] = []
    start = time.perf_counter()
    end = start + window
    while time.perf_counter() < end:
        if limiter is not None:
            rate_wait += limiter.before_sample(batch, end)
            if time.perf_counter() >= end:
                break
        out = acct.timed(_iteration, buf, batch, rng, verify, problems, into)
        if limiter is not None:
            limiter.sampled(batch)
        sampled += batch
        updated += out["applied"]
        torn += out["torn"]
    return {"role": "learner", "index": lid, "sample": sampled, "update": updated, "torn": torn,
            "problems": problems[:5], "seconds": time.perf_counter() - start, "rate_wait": rate_wait,
            **acct.totals}


def _iteration(buf, batch: int, rng, verify: bool, problems: list, into=None) -> dict:
    """One learner step: sample ``batch`` rows (into ``into``, from ``buf.sample_out(batch)``,
    when given; verified if asked), write priorities back."""
    out = buf.sample(batch, rng=rng, out=into)
    torn = 0
    if verify:
        bad = ~intact_rows(out)
        torn = int(bad.sum())
        if not np.all(out["weights"] > 0) or not np.all(np.isfinite(out["weights"])):
            problems.append(f"non-positive or non-finite weights {out['weights'][:4]}")
        if np.any(out["stamps"] < 0) or np.any(out["stamps"] % buf.capacity != out["indices"]):
            problems.append("a sampled row's stamp does not match its slot")
    applied = buf.update_priorities(out["indices"], rng.random(batch) + 1e-3, out["stamps"])
    return {"applied": applied, "torn": torn}


def _work(handle, role: str, index: int, cfg: dict, start_barrier, windows: int, report, counts=None) -> None:
    """One worker: attach, then for each timed window wait for everyone and run it.
    ``counts``: the rate limiter's shared counters (None: no ratio kept)."""
    from replaybench.impl.concurrent import SharedPrioritizedBuffer

    try:
        buf = SharedPrioritizedBuffer.attach(handle, seed=index)
        limiter = None
        if counts is not None:
            counts = np.frombuffer(counts, dtype=np.int64) if not isinstance(counts, np.ndarray) else counts
            limiter = RateLimiter(counts, cfg["samples_per_insert"], cfg["slack"])
        try:
            buf.warm_up()
            for w in range(windows):
                start_barrier.wait()
                waited, kernel_calls, fallbacks = buf.lock_wait_seconds, buf.kernel_calls, buf.fallbacks
                res = (_writer if role == "writer" else _learner)(buf, index, cfg, cfg["window_s"], limiter)
                if role == "writer":
                    cfg = {**cfg, "first_seq": res["next_seq"]}
                res.update(window=w, lock_wait=buf.lock_wait_seconds - waited,
                           kernel_calls=buf.kernel_calls - kernel_calls, fallbacks=buf.fallbacks - fallbacks)
                report.put(res)
        finally:
            buf.close()
    except BaseException:
        report.put({"role": role, "index": index, "error": traceback.format_exc()})
        try:
            start_barrier.abort()
        except Exception:
            pass


def run_workers(handle, writers: int, learners: int, mode: str, cfg: dict, windows: int = 1,
                timeout: float = 120.0) -> list[dict]:
    """Run ``writers`` + ``learners`` workers (``mode`` threads or processes) for ``windows``
    timed windows of ``cfg["window_s"]`` seconds; returns one result dict per worker and window.

    With ``cfg["samples_per_insert"]`` (a positive number) and both kinds of worker, a
    :class:`RateLimiter` keeps that ratio of sampled to inserted transitions (slack: one batch
    per worker, times the ratio).

    Raises RuntimeError with the worker's traceback if one raised, and TimeoutError if the
    workers do not finish in ``timeout`` seconds (a deadlock); processes are killed and
    joined on every exit path.
    """
    if mode not in ("threads", "processes"):
        raise ValueError(f"mode must be 'threads' or 'processes', got {mode!r}")
    roles = [("writer", w + 1) for w in range(writers)] + [("learner", i) for i in range(learners)]
    if not roles:
        raise ValueError("need at least one writer or learner")
    spi = cfg.get("samples_per_insert")
    if spi is not None and (isinstance(spi, bool) or not isinstance(spi, (int, float)) or not 0 < spi < float("inf")):
        raise ValueError(f"samples_per_insert must be a positive number or None, got {spi!r}")
    ctx = mp.get_context("spawn")
    counts = None
    if spi is not None and writers and learners:
        counts = ctx.RawArray("q", 2) if mode == "processes" else np.zeros(2, np.int64)
        cfg = {**cfg, "slack": spi * cfg["write_batch"] * writers + cfg["sample_batch"] * learners}
    if mode == "threads":
        barrier, report = threading.Barrier(len(roles)), queue.Queue()
        workers = [threading.Thread(target=_work, args=(handle, r, i, cfg, barrier, windows, report, counts),
                                    daemon=True) for r, i in roles]
    else:
        barrier, report = ctx.Barrier(len(roles)), ctx.Queue()
        workers = [ctx.Process(target=_work, args=(handle, r, i, cfg, barrier, windows, report, counts), daemon=True)
                   for r, i in roles]
    results: list[dict] = []
    deadline = time.monotonic() + timeout
    try:
        for w in workers:
            w.start()
        expected = len(roles) * windows
        while len(results) < expected:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"{len(roles)} {mode} workers did not finish within {timeout:g} s "
                                   f"({len(results)} of {expected} reports): deadlock?")
            try:
                res = report.get(timeout=min(remaining, 1.0))
            except queue.Empty:
                if mode == "processes" and any(not w.is_alive() and w.exitcode not in (0, None) for w in workers):
                    codes = [w.exitcode for w in workers]
                    raise RuntimeError(f"a worker process died (exit codes {codes})") from None
                continue
            if "error" in res:
                raise RuntimeError(f"{res['role']} {res['index']} raised:\n{res['error']}")
            results.append(res)
        for w in workers:
            w.join(max(0.1, deadline - time.monotonic()))
    finally:
        if mode == "processes":
            for w in workers:
                if w.pid is None:  # never started
                    continue
                if w.is_alive():
                    w.kill()
                w.join(5)
    return results


_KEY_ARG = 4  # position of the key in the sample kernel's arguments (impl.concurrent.context; checked on use)
_LOOPS: dict = {}  # id(kernel set) -> (the set, kept alive so its id stays unique; its compiled loops)


def _kernel_loops(kernels):
    """The compiled loops of the measurements below over one kernel set's ``sample``, ``add`` and
    ``update`` (:attr:`~impl.concurrent.SharedPrioritizedBuffer.kernels`: the shared one, or a
    policy's own, as sharded's and atomic-deltas'), made on first use per set: every registered
    policy runs through the same calling convention (:mod:`impl.concurrent.context`), so the same
    loops measure all of them. bench/ loads numba only when a measurement needs it."""
    got = _LOOPS.get(id(kernels))
    if got is not None:
        return got[1]
    from types import SimpleNamespace

    from numba import njit

    from replaybench.impl.concurrent import fused

    sample_k, add_k, update_k = kernels.sample, kernels.add, kernels.update
    busy, ok = fused.STATUS_BUSY, fused.STATUS_OK

    @njit(nogil=True)
    def sample_loop(n, head, tail):
        for c in range(n):
            sample_k(*head, c, *tail)

    @njit(nogil=True)
    def update_loop(n, args):
        for _ in range(n):
            update_k(*args)

    @njit(nogil=True)
    def add_loop(n, args):
        for _ in range(n):
            add_k(*args)

    @njit(nogil=True)
    def learner_steps(n, head, key0, tail, update_args):
        """``n`` learner steps (the fused sample into the thread's outputs, then the fused update of
        the drawn rows), a busy lock retried; returns the retries, or ``-status`` for any other
        refusal."""
        retries = 0
        for c in range(n):
            status = sample_k(*head, key0 + c, *tail)
            while status == busy:
                retries += 1
                status = sample_k(*head, key0 + c, *tail)
            if status != ok:
                return -status
            status = update_k(*update_args)[0]
            while status == busy:
                retries += 1
                status = update_k(*update_args)[0]
            if status != ok:
                return -status
        return retries

    loops = SimpleNamespace(sample=sample_loop, update=update_loop, add=add_loop, learner_steps=learner_steps)
    _LOOPS[id(kernels)] = (kernels, loops)
    return loops


def shared_gil_share(policy: str, capacity: int, *, variant: str = "kary-aligned", batch: int = 64,
                     transition: str = "cartpole", calls: int = 500, repeats: int = 5, seed: int = 0) -> dict:
    """The share of a shared buffer's ``sample(batch, out=...)``, ``update_priorities(batch)``
    and ``add(batch rows)`` calls that holds the GIL (the shared-buffer counterpart of
    :func:`bench.workloads.gil_share`).

    Method: one thread, one buffer of ``capacity`` rows of ``transition`` size with random
    priorities; the median seconds of a whole call from Python (``call_s``: the checks, the
    gate, numba's dispatch and the kernel) against the same kernel with the same arguments
    run ``calls`` times from a compiled loop (``kernel_s``: no Python, no dispatch; the sample
    gets a new key per call, as from Python). The buffer's periodic re-sum is off (it is nogil
    work, amortised over ``capacity`` leaf updates). Both are this thread's CPU seconds
    (``time.thread_time``), not wall time, so other processes on a busy machine inflate
    neither. ``gil_share = 1 - kernel_s / call_s`` is what a second thread on the buffer cannot
    overlap; ``2 / (1 + gil_share)`` bounds two threads' speed-up. Returns ``{"policy",
    "variant", "capacity", "batch", "sample": {...}, "update": {...}, "add": {...}, "step":
    {...}}`` (each ``call_s``, ``kernel_s``, ``gil_share``; "step" is a learner's sample plus
    update). Every registered policy has the three fused calls (a policy's own kernel set runs
    through the same loops, :func:`_kernel_loops`); one without raises ValueError naming it. Costs
    ``4 * repeats * calls`` calls; compare shares measured in one run.
    """
    from replaybench.impl.concurrent import SharedPrioritizedBuffer

    rng = np.random.default_rng(seed)
    # no periodic re-sum (about one per `capacity` leaf updates, a nogil O(capacity) pass): it
    # would land in the calls' phase or the kernel loop's by the phases' lengths, not by the GIL
    buf = SharedPrioritizedBuffer.create(capacity, schema(TRANSITIONS[transition]), variant=variant, policy=policy,
                                         seed=seed, resum_every=NO_RESUM)
    try:
        fill_with_priorities(buf, capacity, TRANSITIONS[transition], rng)
        out = buf.sample_out(batch)
        idx, pr = rng.integers(0, capacity, batch), rng.random(batch) + 0.01
        sargs = buf.kernel_args("sample", out=out, key=12345)
        uargs = buf.kernel_args("update", indices=idx, priorities=pr)
        rows = make_batch(np.arange(batch), TRANSITIONS[transition])
        aargs = buf.kernel_args("add", batch=rows)
        if sargs[_KEY_ARG] != 12345:
            raise RuntimeError(f"the sample kernel's key is no longer argument {_KEY_ARG}: update _KEY_ARG")
        head, tail = sargs[:_KEY_ARG], sargs[_KEY_ARG + 1:]
        loops = _kernel_loops(buf.kernels)
        sample_loop, update_loop, add_loop = loops.sample, loops.update, loops.add
        sample_loop(1, head, tail)
        update_loop(1, uargs)
        add_loop(1, aargs)
        timed = {"sample": ([], [], lambda i: buf.sample(batch, out=out), lambda: sample_loop(calls, head, tail)),
                 "update": ([], [], lambda i: buf.update_priorities(idx, pr), lambda: update_loop(calls, uargs)),
                 "add": ([], [], lambda i: buf.add(rows), lambda: add_loop(calls, aargs))}
        for _ in range(repeats):
            for call_s, kernel_s, call, loop in timed.values():
                t0 = time.thread_time()
                for i in range(calls):
                    call(i)
                t1 = time.thread_time()
                loop()
                call_s.append((t1 - t0) / calls)
                kernel_s.append((time.thread_time() - t1) / calls)
    finally:
        buf.close()
    result = {"policy": policy, "variant": variant, "capacity": capacity, "batch": batch}
    for op, (call_s, kernel_s, _, _) in timed.items():
        call, kernel = float(np.median(call_s)), float(np.median(kernel_s))
        result[op] = {"call_s": call, "kernel_s": kernel, "gil_share": max(0.0, 1.0 - kernel / call)}
    call = result["sample"]["call_s"] + result["update"]["call_s"]
    kernel = result["sample"]["kernel_s"] + result["update"]["kernel_s"]
    result["step"] = {"call_s": call, "kernel_s": kernel, "gil_share": max(0.0, 1.0 - kernel / call)}
    return result


def step_over_local(policy: str, capacity: int, *, variant: str = "kary-aligned", batch: int = 64,
                    transition: str = "cartpole", calls: int = 300, repeats: int = 11, seed: int = 0) -> dict:
    """One learner step (``sample(batch, out=...)`` then ``update_priorities`` of ``batch``
    random rows) on a shared buffer of ``policy`` over the same step on the in-process buffer
    of the same variant (``replaybench.create``), measured as pairs: both buffers hold the
    same rows and priorities (re-sum off in both), and each of ``repeats`` rounds times
    ``calls`` steps on one, then on the other, in this thread's CPU seconds, the order
    alternating round by round. The ratio is taken per round, so a change of the host's speed
    from round to round (large on a shared VM) is in both terms of it. Returns ``{"ratio",
    "ratio_min", "ratio_max"}`` (median and range over the rounds) and ``"shared_s"``,
    ``"local_s"`` (median seconds per step). Raises ValueError for a policy without fused
    sample and update (none of the registered ones). Costs ``2 * repeats * calls`` steps."""
    from replaybench.impl import registry
    from replaybench.impl.concurrent import SharedPrioritizedBuffer

    rng = np.random.default_rng(seed)
    idx, pr = rng.integers(0, capacity, batch), rng.random(batch) + 0.01
    local = registry.create(variant, capacity, schema(TRANSITIONS[transition]), alpha=0.6)
    local.tree.resum_every = NO_RESUM  # as the shared one's: its periodic O(capacity) re-sum is not a step's cost
    shared = SharedPrioritizedBuffer.create(capacity, schema(TRANSITIONS[transition]), variant=variant, policy=policy,
                                            seed=seed, alpha=0.6, resum_every=NO_RESUM)
    try:
        outs = {"shared": shared.sample_out(batch), "local": local.sample_out(batch)}
        shared.kernel_args("sample", out=outs["shared"])  # ValueError naming the policy, before any work,
        shared.kernel_args("update", indices=idx, priorities=pr)  # when it has no fused sample or update
        steps = {}
        for name, buf in (("shared", shared), ("local", local)):
            fill_with_priorities(buf, capacity, TRANSITIONS[transition], np.random.default_rng(seed))

            def step(buf=buf, out=outs[name]):
                buf.sample(batch, out=out)
                buf.update_priorities(idx, pr)
            step()  # compiled (or loaded) before timing
            steps[name] = step
        seconds = {"shared": [], "local": []}
        for r in range(repeats):
            for name in (("shared", "local") if r % 2 == 0 else ("local", "shared")):
                step = steps[name]
                t0 = time.thread_time()
                for _ in range(calls):
                    step()
                seconds[name].append((time.thread_time() - t0) / calls)
    finally:
        shared.close()
    ratios = [a / b for a, b in zip(seconds["shared"], seconds["local"])]
    return {"ratio": float(np.median(ratios)), "ratio_min": min(ratios), "ratio_max": max(ratios),
            "shared_s": float(np.median(seconds["shared"])), "local_s": float(np.median(seconds["local"]))}


def _in_new_thread(fn):
    """``fn()`` run in a thread of its own; its result, or its exception raised here."""
    got: dict = {}

    def target():
        try:
            got["value"] = fn()
        except BaseException as err:  # handed to the caller
            got["error"] = err

    t = threading.Thread(target=target)
    t.start()
    t.join()
    if "error" in got:
        raise got["error"]
    return got["value"]


def shared_kernel_scaling(policy: str, capacity: int, *, variant: str = "kary-aligned", batch: int = 256,
                          transition: str = "cartpole", steps: int = 1000, repeats: int = 7, seed: int = 0,
                          shared: bool = True, threads: int = 2) -> dict:
    """``threads`` threads' compiled learner steps on one shared buffer over one thread's: what the
    policy's own synchronisation lets that many learners do once Python and the GIL are out of
    the way. With ``shared=False`` each thread runs on a buffer of its own (same size, policy
    and priorities): the same compiled steps with nothing shared, so the ratio is what this
    machine's cores and memory give that many such learners (the bound the shared figure can
    reach), and shared over private is what sharing one buffer costs.

    Method: one buffer of ``capacity`` rows of ``transition`` size with random priorities; each
    thread maps it through its own :meth:`~impl.concurrent.SharedPrioritizedBuffer.attach`
    object (its own lock token, lock statistics and outputs) and runs ``steps`` learner steps
    (the fused ``sample(batch)`` then the fused update of the drawn rows to new priorities, a busy
    lock retried: :func:`_kernel_loops`) in one nogil call. A repeat times one thread alone, then
    all ``threads`` started together at a barrier (wall seconds from the barrier to the last
    thread's end); ``ratio = threads * one / together``. Returns ``{"policy", "variant",
    "capacity", "batch", "steps", "shared", "threads", "ratio", "ratio_min", "ratio_max",
    "retries"}`` (median and range over ``repeats``; ``retries``: the busy-lock retries of the
    runs together, summed). Every registered policy, sharded and atomic-deltas included, runs
    through the same loop (:func:`_kernel_loops`).

    Not a strict bound of the Python figure: the Python between the calls also thins the
    contention there. It says which mechanism stops the learners: a policy that does not reach
    ~``threads`` here where the private buffers do is bound by its locks and shared lines; one
    that does is bound by the GIL (threads) or by what processes add. Costs about ``(1 +
    threads) * repeats * steps`` learner steps, and with ``shared=False`` ``threads`` buffers.
    """
    from replaybench.impl.concurrent import SharedPrioritizedBuffer

    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 2:
        raise ValueError(f"threads must be an integer >= 2, got {threads!r}")
    rng = np.random.default_rng(seed)
    buffers = []
    try:
        for _ in range(1 if shared else threads):
            buffers.append(SharedPrioritizedBuffer.create(capacity, schema(TRANSITIONS[transition]), variant=variant,
                                                          policy=policy, seed=seed))
            fill_with_priorities(buffers[-1], capacity, TRANSITIONS[transition], np.random.default_rng(seed))
        loop = _kernel_loops(buffers[0].kernels).learner_steps
        start = threading.Barrier(threads)
        failures: list[BaseException] = []

        def prepare(who: int):
            """This thread's own object and kernel arguments (made in the thread: the token is per thread)."""
            mine = SharedPrioritizedBuffer.attach(buffers[who % len(buffers)].handle, seed=seed + who)
            out = mine.sample_out(batch)
            sargs = mine.kernel_args("sample", out=out, key=0)
            drawn = out["indices"]  # the sample's output: the update writes the rows just drawn
            uargs = mine.kernel_args("update", indices=drawn, priorities=rng.random(batch) + 0.01)
            if not any(a is drawn for a in uargs) or sargs[_KEY_ARG] != 0:
                raise RuntimeError("the fused kernels' argument order changed: update shared_kernel_scaling")
            head, tail = sargs[:_KEY_ARG], sargs[_KEY_ARG + 1:]
            if loop(1, head, 1 + who * 10**9, tail, uargs) < 0:  # compiles on the first call
                raise RuntimeError(f"policy {policy!r}: the fused learner step refused its warm-up call")
            return mine, (head, tail, uargs)

        def run(who: int, args, key0: int, times: list, together: bool) -> None:
            head, tail, uargs = args
            try:
                if together:
                    start.wait()
                t0 = time.perf_counter()
                got = loop(steps, head, key0, tail, uargs)
                times.append((t0, time.perf_counter(), got))
            except BaseException as err:  # reported by the caller, never lost in the thread
                failures.append(err)
                start.abort()

        prepared = [prepare(0)]
        try:
            for who in range(1, threads):  # each in another thread: another lock token
                prepared.append(_in_new_thread(lambda who=who: prepare(who)))
            ratios, retries = [], 0
            for r in range(repeats):
                key0 = r * (threads + 1) * 10**7  # each run draws its own keys
                alone: list = []
                run(0, prepared[0][1], key0, alone, together=False)
                together: list = []
                others = [threading.Thread(target=run, args=(who, prepared[who][1], key0 + (who + 1) * 10**7,
                                                             together, True)) for who in range(1, threads)]
                for t in others:
                    t.start()
                run(0, prepared[0][1], key0 + 10**7, together, together=True)
                for t in others:
                    t.join()
                if failures:
                    raise failures[0]
                refused = [got for _, _, got in alone + together if got < 0]
                if refused:
                    raise RuntimeError(f"policy {policy!r}: a fused learner step was refused (status {-refused[0]})")
                one = alone[0][1] - alone[0][0]
                wall = max(end for _, end, _ in together) - min(begin for begin, _, _ in together)
                ratios.append(threads * one / wall)
                retries += sum(got for _, _, got in together)
        finally:
            for mine, _ in prepared:
                mine.close()
    finally:
        for buf in buffers:
            buf.close()
    return {"policy": policy, "variant": variant, "capacity": capacity, "batch": batch, "steps": steps,
            "shared": shared, "threads": threads,
            "ratio": float(np.median(ratios)), "ratio_min": float(min(ratios)), "ratio_max": float(max(ratios)),
            "retries": int(retries)}
