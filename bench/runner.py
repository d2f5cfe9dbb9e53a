"""Run a suite's grid: one pyperf benchmark per (variant, capacity, op), results as they finish.

For each grid item the runner starts ``python -m replaybench.bench.pyperf_worker`` (a pyperf manager, in
its own process group) and waits; pyperf spawns the fresh worker processes that set up and
time the op. Items run one at a time, so the workers do not compete for the cores. When an
item ends, its rows are appended to rows.csv (atomically); an item whose process fails or
times out becomes one ``failed`` row with the error, and the grid goes on. Ctrl-C stops the
current item's processes, leaves rows.csv with every finished item and meta.json with
``complete: false``.

Parameter grids (asv-style): a suite's ``params`` (``{"K": [2, 4, 8]}``) and ``--param
K=2,4,8`` multiply the grid. Workload parameters (:data:`WORKLOAD_PARAMS`: batch, mixed_adds,
transitions) change what a call does, for every variant; any other key is a variant parameter,
handed to ``registry.create(name, capacity, fields, **params)`` in the worker. A combination a
variant cannot take (a parameter it does not have, a value its constructor refuses such as K=3
for a layout that needs a power of 2, a peer's fixed parameter or capacity limit) is recorded as
one ``skipped`` row with the reason, and not run. Parameters appear in the rows: K, dtype,
batch and transitions as columns, everything in the ``params`` JSON column.

The first item is the timing-loop overhead: the ``empty`` op (a loop, a Python call and a
pool lookup, nothing else) recorded as variant ``harness``. Its median is stored in meta.json
so readers can subtract it from the other ops' seconds per call.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from replaybench.bench import peers, results, workloads

__all__ = ["HARNESS", "WORKLOAD_PARAMS", "SelectionError", "VariantInfo", "GridItem", "resolve_variants", "grid",
           "param_grid", "skip_reason", "measure", "run", "run_suites"]

HARNESS = "harness"

#: Grid parameters that change the workload (suite keys), not the variant.
WORKLOAD_PARAMS = ("batch", "mixed_adds", "transitions")

#: Environment variables passed on to pyperf's workers (pyperf gives them a reduced environment).
_INHERIT_PREFIXES = ("NUMBA_", "REPLAYBENCH_")
_INHERIT_NAMES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


class SelectionError(ValueError):
    """An unknown variant, peer or op was asked for; raised before anything is timed."""


@dataclass(frozen=True)
class VariantInfo:
    """What the results say about one measured variant, resolved before anything is timed."""

    name: str
    structure: str
    params: dict = field(default_factory=dict)
    description: str = ""
    available: bool = True
    error: str = ""  # why it is unavailable

    def columns(self) -> dict:
        return {"variant": self.name, "structure": self.structure, "policy": "none",
                "K": self.params.get("K"), "dtype": self.params.get("dtype"), "params": self.params}


@dataclass(frozen=True)
class GridItem:
    variant: VariantInfo
    capacity: int | None
    op: str
    params: dict = field(default_factory=dict)  # this cell's grid parameters (workload and variant)
    skip: str = ""  # why this combination is not run ("" = run it)

    @property
    def slug(self) -> str:
        name = self.variant.name.replace(":", "-").replace("/", "-")
        extra = "".join(f"__{k}-{v}" for k, v in self.params.items())
        return f"{name}__{self.capacity or 0}__{self.op}{extra}".replace("/", "-").replace(" ", "")

    @property
    def variant_params(self) -> dict:
        return {k: v for k, v in self.params.items() if k not in WORKLOAD_PARAMS}

    def workload(self, suite: dict) -> dict:
        """The suite with this cell's workload parameters applied."""
        return {**suite, **{k: v for k, v in self.params.items() if k in WORKLOAD_PARAMS}}


def _registry_info(name: str) -> VariantInfo:
    from replaybench.impl import registry

    v = registry.get(name)
    return VariantInfo(name, v.structure, v.accepted(), v.description)


def _peer_info(name: str) -> VariantInfo:
    try:
        mod = peers.load(name)  # the adapter imports its library lazily, so this works without it
    except KeyError:
        raise
    except Exception as err:  # a broken adapter module: recorded as unavailable, never dropped
        return VariantInfo(name, "unknown", {}, "", False, f"adapter failed to load: {type(err).__name__}: {err}")
    ok, detail = peers.availability(name)
    return VariantInfo(name, mod.STRUCTURE, dict(mod.PARAMS), mod.DESCRIPTION, ok, "" if ok else detail)


def resolve_variants(suite: dict, selected: list[str] | None = None) -> list[VariantInfo]:
    """The suite's variants (``all`` = every registered name, then its peers), or ``selected``.

    Raises SelectionError for a name that is neither registered nor a known peer.
    """
    from replaybench.impl import registry

    if selected is None:
        names = registry.names() if suite["variants"] == "all" else list(suite["variants"])
        names += [peers.PREFIX + p for p in suite["peers"]]
    else:
        names = list(dict.fromkeys(selected))
    try:
        return [_peer_info(n) if peers.is_peer(n) else _registry_info(n) for n in names]
    except KeyError as err:
        raise SelectionError(err.args[0]) from None


def param_grid(params: dict | None) -> list[dict]:
    """``{"K": [2, 4], "batch": [32]}`` -> ``[{"K": 2, "batch": 32}, {"K": 4, "batch": 32}]``."""
    combos = [{}]
    for key, values in (params or {}).items():
        values = values if isinstance(values, list) else [values]
        combos = [{**c, key: v} for c in combos for v in values]
    return combos


_FIELDS_FOR_CHECKS = {"x": ((), "float32")}
_checked: dict[tuple, str] = {}


def skip_reason(variant: VariantInfo, capacity: int | None, params: dict) -> str:
    """Why ``variant`` cannot run with these grid parameters, or "" when it can.

    Registry variants: a parameter the variant does not take, or a value its constructor
    refuses with ValueError or TypeError (tried once in this process at capacity 64; any other
    error is left to the worker, which records the cell as failed). Peers: peers.skip_reason.
    """
    vparams = {k: v for k, v in params.items() if k not in WORKLOAD_PARAMS}
    if variant.name == HARNESS:
        return ""
    if peers.is_peer(variant.name):
        return peers.skip_reason(variant.name, capacity, vparams) if variant.available else ""
    if not vparams:
        return ""
    from replaybench.impl import registry

    v = registry.get(variant.name)
    unknown = [k for k in vparams if not v.accepts_any and k not in v.accepted()]
    if unknown:
        return f"{variant.name} does not take parameter(s) {unknown}; it takes {sorted(v.accepted())}"
    key = (variant.name, tuple(sorted((k, repr(val)) for k, val in vparams.items())))
    if key not in _checked:
        try:
            registry.create(variant.name, 64, _FIELDS_FOR_CHECKS, **vparams)
            _checked[key] = ""
        except (ValueError, TypeError) as err:  # the documented way to refuse an argument
            _checked[key] = f"{variant.name} refuses {vparams}: {type(err).__name__}: {err}"
        except Exception:  # any other error is a failure, not a refusal: run it and record it as failed
            _checked[key] = ""
    return _checked[key]


def grid(variants: list[VariantInfo], capacities: list[int], ops: list[str],
         params: dict | None = None, peer_ops: list[str] | None = None) -> list[GridItem]:
    """Timing-loop overhead first, then variant x capacity x params x op in declaration order.

    ``params`` is a grid (``{"K": [2, 4]}``); cells a variant cannot take carry ``skip``.
    ``peer_ops`` (default: ``ops``) are the ops the peer libraries run.
    """
    harness = VariantInfo(HARNESS, "none", {}, "timing loop with an empty op")
    items = [GridItem(harness, None, "empty")]
    for v in variants:
        v_ops = peer_ops if peer_ops is not None and peers.is_peer(v.name) else ops
        for c in capacities:
            for combo in param_grid(params):
                reason = skip_reason(v, c, combo)
                items += [GridItem(v, c, op, combo, reason) for op in v_ops]
    return items


def _worker_env() -> tuple[dict, list[str]]:
    env = dict(os.environ)
    root = str(results.REPO_ROOT)
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    inherit = sorted(k for k in env if k.startswith(_INHERIT_PREFIXES) or k in _INHERIT_NAMES)
    return env, inherit


def _kill_group(proc: subprocess.Popen) -> None:
    """End the manager we started and the pyperf workers in its process group."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _error_message(err_file: Path, stderr: str, returncode: int) -> str:
    if err_file.exists():
        return err_file.read_text().splitlines()[0]
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    return lines[-1] if lines else f"pyperf manager exited with status {returncode}"


def measure(item: GridItem, suite: dict, settings: dict, raw_dir: Path, base: dict) -> list[dict]:
    """Time one grid item in fresh processes; its rows (one per value, or one failed row)."""
    spec = workloads.OPS[item.op]
    suite = item.workload(suite)
    batch = {"empty": None, "insert_one": 1}.get(item.op, suite["batch"])  # mixed: the sample size
    columns = item.variant.columns()
    vparams = item.variant_params
    if item.variant.name != HARNESS and (vparams or item.params):
        columns["params"] = {**columns["params"], **vparams,
                             **({"mixed_adds": suite["mixed_adds"]} if "mixed_adds" in item.params else {})}
        for key in ("K", "dtype"):
            if key in vparams:
                columns[key] = vparams[key]
    row = {**base, **columns, "capacity": item.capacity, "batch": batch, "threads": 1,
           "transitions": suite["transitions"], "op": item.op, "metric": "seconds_per_call", "unit": "s",
           "items_per_call": spec.items_per_call(suite["batch"])}
    if not item.variant.available:
        return [{**row, "status": "unavailable", "error": item.variant.error}]
    if item.skip:
        return [{**row, "status": "skipped", "error": item.skip}]
    out_json = raw_dir / f"{item.slug}.json"
    err_file = raw_dir / f"{item.slug}.error.txt"
    env, inherit = _worker_env()
    cmd = [sys.executable, "-m", "replaybench.bench.pyperf_worker", "--quiet", "-o", str(out_json),
           "--target", item.variant.name, "--capacity", str(item.capacity or 0), "--op", item.op,
           "--batch", str(suite["batch"]), "--mixed-adds", str(suite["mixed_adds"]),
           "--transitions", suite["transitions"], "--seed", str(suite["seed"]), "--error-file", str(err_file),
           "--processes", str(settings["processes"]), "--values", str(settings["values"]),
           "--warmups", str(settings["warmups"]), "--loops", str(settings["loops"]),
           "--min-time", str(settings["min_time"])]
    if vparams:
        cmd += ["--params", json.dumps(vparams, sort_keys=True)]
    if inherit:
        cmd += ["--inherit-environ", ",".join(inherit)]
    proc = subprocess.Popen(cmd, cwd=results.REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=suite["item_timeout_s"])
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        return [{**row, "status": "failed", "error": f"timed out after {suite['item_timeout_s']} s"}]
    except BaseException:  # Ctrl-C: leave no process of ours behind
        _kill_group(proc)
        raise
    if proc.returncode != 0 or not out_json.exists():
        return [{**row, "status": "failed", "error": _error_message(err_file, stderr, proc.returncode)}]
    import pyperf

    bench = pyperf.Benchmark.load(str(out_json))
    rows = []
    for run in bench.get_runs():
        for value in run.values:  # calibration runs have none
            rows.append({**row, "value": float(value), "repeat": len(rows), "loops": run.get_loops(),
                         "status": "ok"})
    return rows or [{**row, "status": "failed", "error": "pyperf produced no values"}]


def _meta(suite, settings, variants, capacities, ops, machine, command, params=None) -> dict:
    from replaybench.impl import registry

    git = results.git_state()
    peer_versions = {}
    for v in variants:
        if peers.is_peer(v.name):
            ok, detail = peers.availability(v.name)
            peer_versions[v.name] = detail if ok else None
    return {
        "scenario": suite["scenario"], "suite": suite, "pyperf_settings": settings,
        "selection": {"variants": [v.name for v in variants], "capacities": capacities, "ops": ops,
                      "params": params or {}},
        "peer_versions": peer_versions,
        "variants": {v.name: {"structure": v.structure, "params": v.params, "description": v.description,
                              "available": v.available, "error": v.error or None} for v in variants},
        "plugin_failures": registry.failures(),
        "command": command, "cwd": os.getcwd(),
        "git_sha": git["sha"], "dirty": git["dirty"], "machine_label": machine,
        "machine": results.machine_info(), "libraries": results.library_versions(),
        "cache_miss_method": None,  # the micro suite does not count cache misses
        "timing": "pyperf bench_time_func; value = seconds per call averaged over its loops; "
                  "set-up, fill and one call of the op before timing in each worker process",
    }


def run(suite: dict, *, variants: list[str] | None = None, capacities: list[int] | None = None,
        ops: list[str] | None = None, out="results", run_id: str | None = None, machine: str | None = None,
        settings: dict | None = None, progress: bool = True, command: list[str] | None = None,
        echo=print, params: dict | None = None) -> Path:
    """Run the grid and write ``<out>/<run_id>/``; returns that folder.

    ``settings`` overrides the suite's pyperf settings key by key. ``params`` (``{key: [values]}``)
    overrides the suite's ``params`` grid key by key. Raises SelectionError
    before creating anything for unknown variants or ops, and KeyboardInterrupt after
    recording what finished when interrupted.
    """
    from tqdm import tqdm

    from replaybench.bench import summary

    capacities = list(capacities or suite["capacities"])
    peer_ops = None if ops else suite.get("peer_ops")  # a suite may run fewer ops on the peers
    ops = list(ops or suite["ops"])
    known = [o for o in workloads.OPS if o != "empty"]  # empty is the overhead item, always run once
    unknown = sorted((set(ops) | set(peer_ops or ())) - set(known))
    if unknown:
        raise SelectionError(f"unknown op(s) {unknown}; known: {', '.join(known)}")
    settings = {**suite["pyperf"], **(settings or {})}
    infos = resolve_variants(suite, variants)
    params = {**(suite.get("params") or {}), **(params or {})}
    items = grid(infos, capacities, ops, params, peer_ops)
    machine = machine or results.machine_info()["hostname"]
    run_id = run_id or results.new_run_id(suite["name"])
    meta = _meta(suite, settings, infos, capacities, ops, machine, command or sys.argv, params)
    writer = results.RunWriter(out, run_id, meta)
    base = {"schema_version": results.SCHEMA_VERSION, "run_id": run_id, "git_sha": meta["git_sha"],
            "dirty": meta["dirty"], "machine": machine, "scenario": suite["scenario"]}
    if variants is None:  # a plug-in that failed to load is a variant we could not measure
        writer.append([{**base, "variant": value, "structure": "unknown", "policy": "none", "status": "failed",
                        "error": f"plug-in failed to load: {err}"} for value, err in meta["plugin_failures"].items()])
    counts = {s: 0 for s in results.STATUSES}
    bar = tqdm(items, desc=suite["name"], unit="item", disable=not progress, dynamic_ncols=True)
    try:
        for item in bar:
            label = " ".join(f"{k}={v}" for k, v in item.params.items())
            bar.set_postfix_str(f"{item.variant.name} {item.capacity or ''} {item.op} {label}".replace("  ", " "))
            rows = measure(item, suite, settings, writer.raw_dir, base)
            counts[rows[0]["status"]] += 1  # counted first: finish() rewrites rows.csv, so counted = on disk
            writer.append(rows)
            if item.variant.name == HARNESS and rows[0]["status"] == "ok":
                writer.meta["timing_overhead_s_per_call"] = statistics.median(r["value"] for r in rows)
                writer.write_meta()
    except KeyboardInterrupt:
        bar.close()
        writer.finish(False, interrupted=True, items_total=len(items), items_done=sum(counts.values()),
                      items_by_status=counts)
        echo(f"interrupted: kept {sum(counts.values())} of {len(items)} items in {writer.dir}")
        raise
    bar.close()
    writer.finish(True, interrupted=False, items_total=len(items), items_done=sum(counts.values()),
                  items_by_status=counts)
    echo(summary.format_run(writer.dir))
    echo(f"\nResults: {writer.dir}")
    return writer.dir


def run_suites(suite: dict, **kwargs) -> list[Path]:
    """Run a suite, or each sub-suite of a composite one (``{"suites": [...]}``), in order.

    A composite suite (``bench/suites/default.json``) names the suites ``make bench`` runs. A
    sub-suite whose JSON names a ``"runner": "module:function"`` is run by that function,
    called as ``function(suite, **kwargs)`` with the same keyword arguments as :func:`run`
    (this is the hook for suites with their own runner, such as cache-miss meters); otherwise
    :func:`run` runs it. Returns the run folders. Keyword arguments go to every sub-suite.
    """
    import importlib

    from replaybench.bench import suites

    if "suites" not in suite:
        target = suite.get("runner")
        if target:
            module, _, func = target.partition(":")
            return [getattr(importlib.import_module(module), func)(suite, **kwargs)]
        return [run(suite, **kwargs)]
    out = []
    for name in suite["suites"]:
        sub = dict(kwargs)
        if sub.get("run_id"):
            sub["run_id"] = f"{sub['run_id']}-{name}"
        out += run_suites(suites.load(name), **sub)
    from replaybench.bench import summary

    headline = summary.format_headline(out)
    if headline:
        kwargs.get("echo", print)("\n" + headline)
    return out
