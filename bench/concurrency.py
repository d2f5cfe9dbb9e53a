"""The workers of the concurrency scenario: P writers and L sampler/updaters on one shared buffer.

Workers are threads or processes; each maps the buffer through its own
:class:`~impl.concurrent.SharedPrioritizedBuffer` object. Writers insert batches of tagged
transitions (an ``id``, a ``payload`` of the transition's size, and a ``check`` sum of both);
learners sample, optionally verify every row, and write random priorities back with the
sampled stamps. The same workers serve the benchmark (``replaybench run --suite
concurrency``: aggregate items/s and the fraction of time spent waiting for locks) and the
stress tests (tests/_concurrency_oracle.py: nothing lost, duplicated or torn, the tree's
total agrees with its leaves).

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

__all__ = ["TRANSITIONS", "ID_STRIDE", "schema", "make_batch", "intact_rows", "prefill", "run_workers"]

TRANSITIONS = {"cartpole": 40, "mujoco": 200, "atari": 84 * 84 * 4}
ID_STRIDE = 10**12  # writer w's k-th transition has id w * ID_STRIDE + k
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


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


# --------------------------------------------------------------------------- workers
def _writer(buf, wid: int, cfg: dict, window: float) -> dict:
    nbytes, batch = cfg["nbytes"], cfg["write_batch"]
    seq = cfg.get("first_seq", 0)
    verify = cfg.get("verify", False)
    template = make_batch(np.zeros(batch, np.int64), nbytes, checked=False)
    limit = cfg.get("max_items")
    items = 0
    start = time.perf_counter()
    end = start + window
    while time.perf_counter() < end and (limit is None or items < limit):
        ids = wid * ID_STRIDE + np.arange(seq, seq + batch, dtype=np.int64)
        buf.add(make_batch(ids, nbytes) if verify else {**template, "id": ids})
        seq += batch
        items += batch
    return {"role": "writer", "index": wid, "insert": items, "seconds": time.perf_counter() - start,
            "next_seq": seq}


def _learner(buf, lid: int, cfg: dict, window: float) -> dict:
    batch = cfg["sample_batch"]
    verify = cfg.get("verify", False)
    rng = np.random.default_rng(1000 + lid)
    sampled = updated = torn = 0
    problems: list[str] = []
    start = time.perf_counter()
    end = start + window
    while time.perf_counter() < end:
        out = buf.sample(batch, rng=rng)
        if verify:
            bad = ~intact_rows(out)
            torn += int(bad.sum())
            if not np.all(out["weights"] > 0) or not np.all(np.isfinite(out["weights"])):
                problems.append(f"non-positive or non-finite weights {out['weights'][:4]}")
            if np.any(out["stamps"] < 0) or np.any(out["stamps"] % buf.capacity != out["indices"]):
                problems.append("a sampled row's stamp does not match its slot")
        sampled += batch
        updated += buf.update_priorities(out["indices"], rng.random(batch) + 1e-3, out["stamps"])
    return {"role": "learner", "index": lid, "sample": sampled, "update": updated, "torn": torn,
            "problems": problems[:5], "seconds": time.perf_counter() - start}


def _work(handle, role: str, index: int, cfg: dict, start_barrier, windows: int, report) -> None:
    """One worker: attach, then for each timed window wait for everyone and run it."""
    from replaybench.impl.concurrent import SharedPrioritizedBuffer

    try:
        buf = SharedPrioritizedBuffer.attach(handle, seed=index)
        try:
            buf.warm_up()
            for w in range(windows):
                start_barrier.wait()
                waited = buf.lock_wait_seconds
                res = (_writer if role == "writer" else _learner)(buf, index, cfg, cfg["window_s"])
                if role == "writer":
                    cfg = {**cfg, "first_seq": res["next_seq"]}
                res.update(window=w, lock_wait=buf.lock_wait_seconds - waited)
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

    Raises RuntimeError with the worker's traceback if one raised, and TimeoutError if the
    workers do not finish in ``timeout`` seconds (a deadlock); processes are killed and
    joined on every exit path.
    """
    if mode not in ("threads", "processes"):
        raise ValueError(f"mode must be 'threads' or 'processes', got {mode!r}")
    roles = [("writer", w + 1) for w in range(writers)] + [("learner", i) for i in range(learners)]
    if not roles:
        raise ValueError("need at least one writer or learner")
    if mode == "threads":
        barrier, report = threading.Barrier(len(roles)), queue.Queue()
        workers = [threading.Thread(target=_work, args=(handle, r, i, cfg, barrier, windows, report), daemon=True)
                   for r, i in roles]
    else:
        ctx = mp.get_context("spawn")
        barrier, report = ctx.Barrier(len(roles)), ctx.Queue()
        workers = [ctx.Process(target=_work, args=(handle, r, i, cfg, barrier, windows, report), daemon=True)
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
