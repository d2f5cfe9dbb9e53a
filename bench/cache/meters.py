"""Three ways to count cache misses per operation, each returning records of one shape.

A record is ``{"method", "status", "misses_per_op", "error", ...}``: ``status`` is ``"ok"``,
``"unsupported"`` (the method cannot run on this machine, or the model has no trace of this
tree: the reason is in ``error``; never zeros), ``"skipped"`` or ``"failed"``; ``misses_per_op``
maps level (``"L1d"``, ``"LL"``) to misses per call of the op (one call = ``batch`` items), or
is None. The differential meters add ``resolution`` (level -> misses per call) and
``below_resolution`` (the levels whose differential is within its resolution of zero: there
``misses_per_op`` holds the upper bound, see :func:`reading`), so no record holds a negative
count or a 0 that was not measured. Keys of the returned dicts are
``(op, stream)``: op ``sample``/``update``, stream ``tree`` (the sum tree's arrays only) or
``tree+data`` (sample only: the descent plus the gather of the sampled rows).

* ``model``: trace-driven (:mod:`bench.cache.traces` into :mod:`bench.cache.model`), with this
  machine's L1d and L2 by default (:func:`machine_caches`). Counted after a warm-up.
* ``cachegrind``: the real numba kernels under ``valgrind --tool=cachegrind --cache-sim=yes``
  with ``--I1/--D1/--LL`` set to this machine's L1i, L1d and L2, as a differential
  (:func:`differential`): one run with ``M`` counted calls of every op, and per op two runs
  with that op's count raised to ``2M`` and ``3M``, read from D1/LL read + write misses
  (``D1mr + D1mw``, ``DLmr + DLmw``) of the output file. Start-up, numba cache loads, the
  build and fill and the warm-up calls are identical in every run and cancel. Numba
  recompiles under valgrind (it presents another CPU), so the kernels are compiled for
  ``NUMBA_CPU_NAME=generic`` into a separate numba cache folder, natively, before the first
  run (:data:`NUMBA_CACHE_ENV`); generic x86-64 code makes scalar loads where the native build
  vectorises, which changes access counts, not the lines touched.
* ``perf``: hardware counters through ``perf stat`` (same differential, native). Checked
  first: no ``perf`` on PATH, or events reported ``<not supported>`` (these VMs) give
  ``unsupported`` with the reason.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from replaybench.bench.contract import BELOW_RESOLUTION  # a level within its resolution: value = the bound

from .model import CacheLevel, CacheModel
from .traces import TreeTracer, data_gather, trace_support, tree_of

__all__ = ["FALLBACK_L1D", "FALLBACK_L1I", "FALLBACK_L2", "NUMBA_CACHE_ENV", "LEVELS", "BELOW_RESOLUTION",
           "machine_caches", "record", "differential", "reading", "differential_record", "level_reading", "measure_model",
           "measure_cachegrind", "measure_perf", "perf_support", "cachegrind_support", "parse_cachegrind",
           "cachegrind_calls"]

REPO_ROOT = Path(__file__).resolve().parents[2]
LEVELS = ("L1d", "LL")

#: Used when neither sysfs nor lscpu says (documented fallback: a recent Xeon core).
FALLBACK_L1D = CacheLevel(48 * 1024, 12, 64)
FALLBACK_L1I = CacheLevel(32 * 1024, 8, 64)
FALLBACK_L2 = CacheLevel(2 * 1024 * 1024, 16, 64)

#: Environment variable naming the numba cache folder used under valgrind.
NUMBA_CACHE_ENV = "REPLAYBENCH_CACHEGRIND_NUMBA_CACHE"

#: driver op for each (op, stream)
_DRIVER_OPS = {("sample", "tree"): "sample", ("sample", "tree+data"): "sample_data", ("update", "tree"): "update"}


def record(method: str, status: str, misses: dict | None = None, error: str = "", **extra) -> dict:
    return {"method": method, "status": status, "misses_per_op": misses, "error": error, **extra}


# ---------------------------------------------------------------------------------------------
# differentials: runs with M, 2M and 3M counted calls of one op

#: The counted-call multiples of the runs behind one op's differential (the base run is shared).
_MULTIPLES = (2, 3)


def _plans(names: list[str], calls: int) -> dict:
    """``{label: {driver op: counted calls}}``: ``base`` runs every op ``calls`` times; run
    ``"<op>x<k>"`` runs ``op`` ``k * calls`` times and the others ``calls`` times."""
    plans = {"base": {n: calls for n in names}}
    for n in names:
        for k in _MULTIPLES:
            plans[f"{n}x{k}"] = {m: (k * calls if m == n else calls) for m in names}
    return plans


def _pool_rows(names: list[str], warm_calls: int, calls: int) -> int:
    """Pre-drawn input rows for the driver: enough for the largest run, the same in every run."""
    return len(names) * (warm_calls + max(_MULTIPLES) * calls)


def differential(base: float, twice: float, thrice: float, calls: int) -> tuple[float, float]:
    """``(misses per call, resolution)`` from the totals of runs with ``M``, ``2M``, ``3M`` calls.

    The value is ``(thrice - base) / 2M``: the mean of the two differentials ``(twice - base) / M``
    and ``(thrice - twice) / M``. The resolution is the spread of those two (what else changes
    between runs: allocation, layout, the interpreter), at least ``1 / M`` (one miss in the
    counted region) and at least ``-value`` (a mean below zero is noise of that size: a miss
    count cannot be negative).
    """
    first, second = (twice - base) / calls, (thrice - twice) / calls
    value = (thrice - base) / (2 * calls)
    return value, max(abs(first - second), 1.0 / calls, -value)


def reading(value: float, resolution: float) -> tuple[str, float]:
    """``("ok", value)`` when ``value`` exceeds its ``resolution``, else
    ``(BELOW_RESOLUTION, bound)``: the misses per call are below ``bound = max(value, 0) +
    resolution`` (never negative, never an unmeasured 0)."""
    if value > resolution:
        return "ok", value
    return BELOW_RESOLUTION, max(value, 0.0) + resolution


def level_reading(rec: dict, level: str) -> tuple[str, float | None, str]:
    """``(row status, value, note)`` of one ``level`` of record ``rec``: a differential's level
    within its resolution is ``BELOW_RESOLUTION`` with the bound as value; the note gives the
    resolution (or the record's error)."""
    if rec["status"] != "ok":
        return rec["status"], None, rec.get("error") or ""
    value = (rec["misses_per_op"] or {}).get(level)
    res = (rec.get("resolution") or {}).get(level)
    if res is None:  # the model: deterministic, no resolution
        return "ok", value, ""
    how = f"resolution {res:.3g} misses per call (spread of the 2M and 3M differentials, at least 1/M)"
    if level in rec.get("below_resolution", ()):
        return BELOW_RESOLUTION, value, f"measured {rec['measured'][level]:.3g}, {how}: below resolution"
    return "ok", value, how


def differential_record(method: str, totals: dict, name: str, calls: int, **extra) -> dict:
    """The record of driver op ``name`` from ``totals`` (``{run label: {level: misses}}``)."""
    misses, resolution, below, measured = {}, {}, [], {}
    for lv in LEVELS:
        value, res = differential(totals["base"][lv], totals[f"{name}x2"][lv], totals[f"{name}x3"][lv], calls)
        status, misses[lv] = reading(value, res)
        resolution[lv], measured[lv] = res, value
        if status == BELOW_RESOLUTION:
            below.append(lv)
    return record(method, "ok", misses, resolution=resolution, below_resolution=tuple(below), measured=measured,
                  calls=calls, **extra)


# ---------------------------------------------------------------------------------------------
# this machine's caches

def _parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(i?B)?\s*", text, re.I)
    if not m:
        raise ValueError(text)
    return int(m.group(1)) * {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}[m.group(2).upper()]


def _from_sysfs(root="/sys/devices/system/cpu/cpu0/cache") -> dict:
    out = {}
    for d in sorted(Path(root).glob("index*")):
        read = lambda name: (d / name).read_text().strip()  # noqa: E731
        level, kind = int(read("level")), read("type")
        name = {(1, "Data"): "L1d", (1, "Instruction"): "L1i", (2, "Unified"): "L2"}.get((level, kind))
        if name:
            out[name] = CacheLevel(_parse_size(read("size")), int(read("ways_of_associativity")),
                                   int(read("coherency_line_size")))
    return out


def _from_lscpu() -> dict:
    res = subprocess.run(["lscpu", "-C=NAME,ONE-SIZE,WAYS,COHERENCY-SIZE", "--bytes"], capture_output=True,
                         text=True, timeout=10)
    out = {}
    for line in res.stdout.splitlines()[1:]:
        parts = line.split()
        if len(parts) == 4 and parts[0] in ("L1d", "L1i", "L2"):
            out[parts[0]] = CacheLevel(int(parts[1]), int(parts[2]), int(parts[3]))
    return out


def machine_caches() -> dict:
    """``{"L1d", "L1i", "L2": CacheLevel, "source": where from}``: sysfs, else ``lscpu -C``,
    else the fallback 48 KiB 12-way L1d, 32 KiB 8-way L1i, 2 MiB 16-way L2, 64 B lines."""
    for source, reader in (("sysfs", _from_sysfs), ("lscpu", _from_lscpu)):
        try:
            found = reader()
        except Exception:  # noqa: BLE001 - any failure means: try the next source
            continue
        if "L1d" in found and "L2" in found:
            found.setdefault("L1i", FALLBACK_L1I)
            return {**found, "source": source}
    return {"L1d": FALLBACK_L1D, "L1i": FALLBACK_L1I, "L2": FALLBACK_L2, "source": "fallback"}


def describe(l1: CacheLevel, l2: CacheLevel | None) -> str:
    s = f"L1d {l1.size // 1024}KiB/{l1.ways}w/{l1.line}B"
    return s + (f"; LL {l2.size // 1024}KiB/{l2.ways}w/{l2.line}B" if l2 else "")


# ---------------------------------------------------------------------------------------------
# model

def measure_model(buf, ops=("sample", "update"), *, batch: int = 256, warm_calls: int = 128, calls: int = 256,
                  l1: CacheLevel | None = None, l2: CacheLevel | None = None, seed: int = 0) -> dict:
    """Model misses per call for ``buf`` (a full buffer, or a bare tree: no tree+data stream).

    Sample: ``warm_calls`` then ``calls`` descents of ``batch`` uniform draws, fed to one model
    for the tree stream and to another for tree + data (the descent, then the gather).
    Update: the same for ``batch`` uniformly random leaves with random priorities, applied to
    the tracer's copies in turn. The buffer itself is never modified. A tree with no replay
    (:func:`bench.cache.traces.trace_support`) gives ``unsupported`` records with the reason.
    """
    caches = machine_caches() if l1 is None else None
    l1 = l1 or caches["L1d"]
    l2 = l2 if l2 is not None or caches is None else caches["L2"]
    cfg = describe(l1, l2)
    tree = tree_of(buf)
    columns = getattr(getattr(buf, "storage", None), "columns", None)
    if tree is not None:
        traceable, why = trace_support(tree)
        if not traceable:  # never replay a tree with another tree's kernels: say so instead
            keys = [(op, s) for op in ops for s in ("tree", "tree+data")
                    if (op, s) in _DRIVER_OPS and (s == "tree" or columns is not None)]
            return {key: record("model", "unsupported", error=f"no address trace: {why}") for key in keys}
    capacity = len(buf) if columns is not None else tree.capacity
    rng = np.random.default_rng(seed)
    out = {}
    tracer = TreeTracer(tree) if tree is not None else None
    if "sample" in ops:
        models = {"tree": CacheModel(l1, l2)} if tracer is not None else {}
        if columns is not None:
            models["tree+data"] = CacheModel(l1, l2)
        for i in range(warm_calls + calls):
            if i == warm_calls:
                for m in models.values():
                    m.reset_counts()
            if tracer is not None:
                addrs, leaves = tracer.sample(rng.random(batch) * tracer.total())
                models["tree"].access(addrs)
            else:
                addrs, leaves = np.empty(0, np.int64), rng.integers(0, capacity, batch)
            if columns is not None:
                models["tree+data"].access(addrs)
                models["tree+data"].access(data_gather(columns, leaves[leaves >= 0], l1.line))
        for stream, m in models.items():
            c = m.counts()
            out[("sample", stream)] = record("model", "ok", {k: c[k] / calls for k in LEVELS if k in c},
                                             accesses_per_op=c["accesses"] / calls, cache_config=cfg)
        if tracer is None:
            out[("sample", "tree")] = record("model", "skipped", error="no sum tree (uniform sampling)")
    if "update" in ops:
        if tracer is None:
            out[("update", "tree")] = record("model", "skipped", error="no sum tree: update does nothing")
        else:
            m = CacheModel(l1, l2)
            eps = float(getattr(buf, "eps", 0.0))
            alpha = float(getattr(buf, "alpha", 1.0))
            for i in range(warm_calls + calls):
                if i == warm_calls:
                    m.reset_counts()
                idx = rng.integers(0, tree.capacity, batch)
                m.access(tracer.update(idx, (rng.random(batch) + eps) ** alpha))
            c = m.counts()
            out[("update", "tree")] = record("model", "ok", {k: c[k] / calls for k in LEVELS if k in c},
                                             accesses_per_op=c["accesses"] / calls, cache_config=cfg)
    return out


# ---------------------------------------------------------------------------------------------
# cachegrind

def cachegrind_support() -> tuple[bool, str]:
    exe = shutil.which("valgrind")
    if exe is None:
        return False, "valgrind not found on PATH (cachegrind unavailable)"
    try:
        res = subprocess.run([exe, "--tool=cachegrind", "--help"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as err:
        return False, f"valgrind --tool=cachegrind failed to start: {err}"
    if res.returncode != 0 or "cache-sim" not in res.stdout + res.stderr:
        return False, f"valgrind has no usable cachegrind tool (exit {res.returncode})"
    return True, exe


def parse_cachegrind(path) -> dict:
    """``{event: total}`` from a cachegrind output file's ``events:`` and ``summary:`` lines."""
    events = summary = None
    for line in Path(path).read_text().splitlines():
        if line.startswith("events:"):
            events = line.split()[1:]
        elif line.startswith("summary:"):
            summary = [int(x) for x in line.split()[1:]]
    if events is None or summary is None:
        raise ValueError(f"{path}: no events/summary lines (not a cachegrind output file?)")
    return dict(zip(events, summary))


def _cg_levels(totals: dict) -> dict:
    return {"L1d": totals["D1mr"] + totals["D1mw"], "LL": totals["DLmr"] + totals["DLmw"]}


def numba_cache_dir() -> Path:
    return Path(os.environ.get(NUMBA_CACHE_ENV) or Path.home() / ".cache" / "replaybench" / "numba-cachegrind")


def _driver_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env["NUMBA_CACHE_DIR"] = str(numba_cache_dir())
    env["NUMBA_CPU_NAME"] = "generic"  # the same cache index natively and under valgrind
    env.pop("NUMBA_CPU_FEATURES", None)
    env["PYTHONHASHSEED"] = "0"  # identical set-up in every run of a differential
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


_compiled: set = set()


def warm_numba_cache(variant: str, timeout: float = 600) -> None:
    """Compile every kernel ``variant`` uses into the valgrind numba cache, natively (fast,
    a no-op when already cached). Raises RuntimeError with the error on failure."""
    if variant in _compiled:
        return
    numba_cache_dir().mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "replaybench.bench.cache._driver", "--variant", variant, "--capacity", "1", "--compile-only"]
    res = subprocess.run(cmd, cwd=REPO_ROOT, env=_driver_env(), capture_output=True, text=True, timeout=timeout)
    if res.returncode != 0:
        raise RuntimeError(_last_line(res.stderr) or f"compile run exited {res.returncode}")
    _compiled.add(variant)


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("==")]
    return lines[-1] if lines else ""


def cachegrind_calls(native_seconds_per_call: float, seconds: float = 4.0, slowdown: float = 60.0,
                     low: int = 16, high: int = 2000) -> int:
    """``M``: counted calls so that the extra ``M`` calls cost about ``seconds`` under
    cachegrind (``slowdown`` times native), clamped to ``low .. high``."""
    m = int(seconds / max(native_seconds_per_call * slowdown, 1e-9))
    return max(low, min(high, m))


def native_seconds_per_call(variant: str, capacity: int, ops, batch: int = 256, calls: int = 20) -> float:
    """Slowest op's native seconds per call (to size ``M``), on a freshly built buffer."""
    from ._driver import build

    buf = build(variant, capacity)
    tree = tree_of(buf)
    rng = np.random.default_rng(0)
    worst = 0.0
    for op, stream in ops:
        if op == "update":
            fn = lambda: buf.update_priorities(rng.integers(0, capacity, batch), rng.random(batch))  # noqa: E731
        elif stream == "tree":
            fn = lambda: tree.sample(batch, rng)  # noqa: E731
        else:
            fn = lambda: buf.sample(batch, rng=rng)  # noqa: E731
        fn()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        worst = max(worst, (time.perf_counter() - t0) / calls)
    return worst


def measure_cachegrind(variant: str, capacity: int, ops=(("sample", "tree"), ("update", "tree")), *,
                       batch: int = 256, calls: int = 200, warm_calls: int = 16, jobs: int = 2,
                       caches: dict | None = None, timeout: float = 600, workdir=None, pool=None) -> dict:
    """Cachegrind misses per call for each ``(op, stream)`` in ``ops``; see the module doc.

    ``1 + 2 len(ops)`` valgrind runs (:func:`differential`), ``jobs`` at a time (or on ``pool``, an executor). The
    output files go to ``workdir`` (kept) or a temporary folder (removed afterwards).
    """
    ok, exe = cachegrind_support()
    ops = list(ops)
    if not ok:
        return {key: record("cachegrind", "unsupported", error=exe) for key in ops}
    bad = [k for k in ops if k not in _DRIVER_OPS]
    if bad:
        raise ValueError(f"unknown (op, stream) {bad}; known: {list(_DRIVER_OPS)}")
    caches = caches or machine_caches()
    l1i, l1d, l2 = caches["L1i"], caches["L1d"], caches["L2"]
    cfg = describe(l1d, l2)
    try:
        warm_numba_cache(variant)
    except Exception as err:  # noqa: BLE001
        return {key: record("cachegrind", "failed", error=f"numba compile run: {err}") for key in ops}
    import tempfile

    tmp = None if workdir else tempfile.TemporaryDirectory(prefix="replaybench-cg-")
    workdir = Path(workdir or tmp.name)
    workdir.mkdir(parents=True, exist_ok=True)
    names = [_DRIVER_OPS[k] for k in ops]
    plans = _plans(names, calls)
    env = _driver_env()
    safe = re.sub(r"[^A-Za-z0-9_.-]", "-", variant)

    def one(label: str) -> dict:
        out = workdir / f"cachegrind.{safe}.{capacity}.{label}.out"
        cmd = [exe, "--tool=cachegrind", "--cache-sim=yes", f"--I1={l1i.size},{l1i.ways},{l1i.line}",
               f"--D1={l1d.size},{l1d.ways},{l1d.line}", f"--LL={l2.size},{l2.ways},{l2.line}",
               f"--cachegrind-out-file={out}", sys.executable, "-m", "replaybench.bench.cache._driver",
               "--variant", variant, "--capacity", str(capacity), "--batch", str(batch),
               "--warm", str(warm_calls), "--pool", str(_pool_rows(names, warm_calls, calls))]
        for n in names:
            cmd += ["--count", f"{n}={plans[label][n]}"]
        res = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        if res.returncode != 0 or not out.exists():
            raise RuntimeError(_last_line(res.stderr) or f"valgrind exited {res.returncode}")
        return _cg_levels(parse_cachegrind(out))

    own = pool is None
    pool = pool or ThreadPoolExecutor(max(1, jobs))
    try:
        futures = {label: pool.submit(one, label) for label in plans}
        results, errors = {}, {}
        for label, fut in futures.items():
            try:
                results[label] = fut.result()
            except subprocess.TimeoutExpired:
                errors[label] = f"cachegrind run timed out after {timeout} s"
            except Exception as err:  # noqa: BLE001
                errors[label] = f"{type(err).__name__}: {err}"
    finally:
        if own:
            pool.shutdown()
        if tmp is not None:
            tmp.cleanup()  # output files: only their summary lines were needed
    out = {}
    for key, n in zip(ops, names):
        err = next((errors[label] for label in ("base", f"{n}x2", f"{n}x3") if label in errors), None)
        out[key] = (record("cachegrind", "failed", error=err) if err else
                    differential_record("cachegrind", results, n, calls, cache_config=cfg))
    return out


# ---------------------------------------------------------------------------------------------
# perf

_PERF_EVENTS = ("L1-dcache-load-misses", "LLC-load-misses")


def perf_support() -> tuple[bool, str]:
    """(True, path) when ``perf stat`` counts the hardware events here, else (False, reason)."""
    exe = shutil.which("perf")
    if exe is None:
        return False, "perf not found on PATH"
    try:
        res = subprocess.run([exe, "stat", "-x", ",", "-e", ",".join(_PERF_EVENTS), "--", "true"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as err:
        return False, f"perf stat failed to start: {err}"
    text = res.stdout + res.stderr
    if res.returncode != 0:
        return False, f"perf stat exited {res.returncode}: {_last_line(text)}"
    for line in text.splitlines():
        f = line.split(",")
        if len(f) > 2 and f[2] in _PERF_EVENTS and f[0].startswith("<"):
            return False, f"perf stat: {f[2]} {f[0]} (no hardware counters on this machine, e.g. a VM)"
    return True, exe


def _parse_perf(text: str) -> dict:
    vals = {}
    for line in text.splitlines():
        f = line.split(",")
        if len(f) > 2 and f[2] in _PERF_EVENTS:
            if not f[0].strip().isdigit():
                raise ValueError(f"perf: {f[2]} = {f[0]}")
            vals[f[2]] = int(f[0])
    return {"L1d": vals["L1-dcache-load-misses"], "LL": vals["LLC-load-misses"]}


def measure_perf(variant: str, capacity: int, ops=(("sample", "tree"), ("update", "tree")), *,
                 batch: int = 256, calls: int = 2000, warm_calls: int = 64, timeout: float = 300) -> dict:
    """Hardware-counter misses per call (load misses only), same differential, natively.

    ``1 + 2 len(ops)`` runs one after the other (:func:`differential`)."""
    ok, exe = perf_support()
    ops = list(ops)
    if not ok:
        return {key: record("perf", "unsupported", error=exe) for key in ops}
    names = [_DRIVER_OPS[k] for k in ops]
    plans = _plans(names, calls)
    env = dict(_driver_env())
    env.pop("NUMBA_CPU_NAME", None)  # native code, the normal numba cache
    env.pop("NUMBA_CACHE_DIR", None)
    results = {}
    try:
        for label, plan in plans.items():
            cmd = [exe, "stat", "-x", ",", "-e", ",".join(_PERF_EVENTS), "--", sys.executable, "-m",
                   "replaybench.bench.cache._driver", "--variant", variant, "--capacity", str(capacity), "--batch", str(batch),
                   "--warm", str(warm_calls), "--pool", str(_pool_rows(names, warm_calls, calls))]
            for n in names:
                cmd += ["--count", f"{n}={plan[n]}"]
            res = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)
            if res.returncode != 0:
                raise RuntimeError(_last_line(res.stderr) or f"perf exited {res.returncode}")
            results[label] = _parse_perf(res.stderr)
    except Exception as err:  # noqa: BLE001
        return {key: record("perf", "failed", error=f"{type(err).__name__}: {err}") for key in ops}
    return {key: differential_record("perf", results, n, calls) for key, n in zip(ops, names)}
