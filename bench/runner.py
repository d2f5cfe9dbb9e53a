"""Run a suite's grid: one pyperf benchmark per (variant, capacity, op), results as they finish.

For each grid item the runner starts ``python -m bench.pyperf_worker`` (a pyperf manager, in
its own process group) and waits; pyperf spawns the fresh worker processes that set up and
time the op. Items run one at a time, so the workers do not compete for the cores. When an
item ends, its rows are appended to rows.csv (atomically); an item whose process fails or
times out becomes one ``failed`` row with the error, and the grid goes on. Ctrl-C stops the
current item's processes, leaves rows.csv with every finished item and meta.json with
``complete: false``.

The first item is the timing-loop overhead: the ``empty`` op (a loop, a Python call and a
pool lookup, nothing else) recorded as variant ``harness``. Its median is stored in meta.json
so readers can subtract it from the other ops' seconds per call.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from bench import peers, results, workloads

__all__ = ["HARNESS", "SelectionError", "VariantInfo", "GridItem", "resolve_variants", "grid", "measure", "run"]

HARNESS = "harness"

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

    @property
    def slug(self) -> str:
        name = self.variant.name.replace(":", "-").replace("/", "-")
        return f"{name}__{self.capacity or 0}__{self.op}"


def _registry_info(name: str) -> VariantInfo:
    from impl import registry

    v = registry.get(name)
    return VariantInfo(name, v.structure, v.accepted(), v.description)


def _peer_info(name: str) -> VariantInfo:
    mod = peers.load(name)  # the adapter imports its library lazily, so this works without it
    ok, detail = peers.availability(name)
    return VariantInfo(name, mod.STRUCTURE, dict(mod.PARAMS), mod.DESCRIPTION, ok, "" if ok else detail)


def resolve_variants(suite: dict, selected: list[str] | None = None) -> list[VariantInfo]:
    """The suite's variants (``all`` = every registered name, then its peers), or ``selected``.

    Raises SelectionError for a name that is neither registered nor a known peer.
    """
    from impl import registry

    if selected is None:
        names = registry.names() if suite["variants"] == "all" else list(suite["variants"])
        names += [peers.PREFIX + p for p in suite["peers"]]
    else:
        names = list(dict.fromkeys(selected))
    try:
        return [_peer_info(n) if peers.is_peer(n) else _registry_info(n) for n in names]
    except KeyError as err:
        raise SelectionError(err.args[0]) from None


def grid(variants: list[VariantInfo], capacities: list[int], ops: list[str]) -> list[GridItem]:
    """Timing-loop overhead first, then variant x capacity x op in declaration order."""
    harness = VariantInfo(HARNESS, "none", {}, "timing loop with an empty op")
    return [GridItem(harness, None, "empty")] + [
        GridItem(v, c, op) for v in variants for c in capacities for op in ops]


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
    batch = {"empty": None, "insert_one": 1}.get(item.op, suite["batch"])  # mixed: the sample size
    row = {**base, **item.variant.columns(), "capacity": item.capacity, "batch": batch, "threads": 1,
           "transitions": suite["transitions"], "op": item.op, "metric": "seconds_per_call", "unit": "s",
           "items_per_call": spec.items_per_call(suite["batch"])}
    if not item.variant.available:
        return [{**row, "status": "unavailable", "error": item.variant.error}]
    out_json = raw_dir / f"{item.slug}.json"
    err_file = raw_dir / f"{item.slug}.error.txt"
    env, inherit = _worker_env()
    cmd = [sys.executable, "-m", "bench.pyperf_worker", "--quiet", "-o", str(out_json),
           "--target", item.variant.name, "--capacity", str(item.capacity or 0), "--op", item.op,
           "--batch", str(suite["batch"]), "--mixed-adds", str(suite["mixed_adds"]),
           "--transitions", suite["transitions"], "--seed", str(suite["seed"]), "--error-file", str(err_file),
           "--processes", str(settings["processes"]), "--values", str(settings["values"]),
           "--warmups", str(settings["warmups"]), "--loops", str(settings["loops"]),
           "--min-time", str(settings["min_time"])]
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


def _meta(suite, settings, variants, capacities, ops, machine, command) -> dict:
    from impl import registry

    git = results.git_state()
    return {
        "scenario": suite["scenario"], "suite": suite, "pyperf_settings": settings,
        "selection": {"variants": [v.name for v in variants], "capacities": capacities, "ops": ops},
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
        echo=print) -> Path:
    """Run the grid and write ``<out>/<run_id>/``; returns that folder.

    ``settings`` overrides the suite's pyperf settings key by key. Raises SelectionError
    before creating anything for unknown variants or ops, and KeyboardInterrupt after
    recording what finished when interrupted.
    """
    from tqdm import tqdm

    from bench import summary

    capacities = list(capacities or suite["capacities"])
    ops = list(ops or suite["ops"])
    known = [o for o in workloads.OPS if o != "empty"]  # empty is the overhead item, always run once
    unknown = sorted(set(ops) - set(known))
    if unknown:
        raise SelectionError(f"unknown op(s) {unknown}; known: {', '.join(known)}")
    settings = {**suite["pyperf"], **(settings or {})}
    infos = resolve_variants(suite, variants)
    items = grid(infos, capacities, ops)
    machine = machine or results.machine_info()["hostname"]
    run_id = run_id or results.new_run_id(suite["name"])
    meta = _meta(suite, settings, infos, capacities, ops, machine, command or sys.argv)
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
            bar.set_postfix_str(f"{item.variant.name} {item.capacity or ''} {item.op}".replace("  ", " "))
            rows = measure(item, suite, settings, writer.raw_dir, base)
            writer.append(rows)
            counts[rows[0]["status"]] += 1
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
