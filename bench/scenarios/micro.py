"""The micro scenario: one pyperf benchmark per (variant, capacity, grid parameters, op).

Each cell has a pyperf manager forked (:func:`bench.manager_server.run_manager`, in its own
session, by a clean fork server) and waits; pyperf spawns the
fresh worker processes that set up and time the op
(:mod:`bench.workloads`). Cells run one at a time, so the workers do not compete for the
cores. A cell whose process fails, makes no progress (a deadlock is seen in seconds:
:mod:`bench.stall_watch`) or times out gives one ``failed`` row with the error; Ctrl-C kills
the current cell's process group.

Parameter grids (asv-style): a suite's ``params`` (``{"K": [2, 4, 8]}``) and ``--param
K=2,4,8`` multiply the grid. Workload parameters (:data:`WORKLOAD_PARAMS`: batch, mixed_adds,
transitions) change what a call does, for every variant; any other key is a variant parameter,
handed to ``registry.create(name, capacity, fields, **params)`` in the worker. Every grid value
is checked and typed when the suite is expanded, against the type of the default the variants
declare for it (``K=abc`` is refused for a variant whose K defaults to 16; ``eps=1`` becomes
1.0), so a run never records a value its readers refuse. A combination a variant cannot take
(a parameter it does not have, a value its constructor refuses such as K=3 for a layout that
needs a power of 2, a peer's fixed parameter or capacity limit) is one ``skipped`` row with the
reason. Parameters appear in the rows: K, dtype, batch and transitions as columns, everything
in the ``params`` JSON column. A registered variant's rows also record the speed parameters its
buffer ran with, ``"auto"`` resolved (``resolved_storage``, ``resolved_prefetch``, and
``resolved_kernel`` where the tree has a choice, in ``params``:
:attr:`impl.buffers.ReplayBuffer.resolved_params`, written by the worker to a side file).

The first cell is the timing-loop overhead: the ``empty`` op (a loop, a Python call and a pool
lookup, nothing else) recorded as variant ``harness``. Its median is stored in meta.json
(``timing_overhead_s_per_call``) so readers can subtract it from the other ops' seconds per call.

Suite keys (bench/suites/micro.json): variants (``"all"`` = every registered one), peers,
capacities, ops, batch, mixed_adds, transitions, seed, item_timeout_s, pyperf (processes,
values, warmups, loops with 0 = calibrate, min_time), and optionally params, peer_ops (the
ops the peers run when fewer than ``ops``) and threads (default 1).

Threads (``threads`` = T > 1, as a suite key or a grid parameter): each pyperf worker builds
and fills T buffers and times T threads running the op at once, each on its own buffer; a call
is one op in every thread, so ``items_per_call`` is T times the op's and the row's ``threads``
column is T. Against the same cell at T = 1 this is what the GIL leaves of thread scaling.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from replaybench.bench import contract, derive, peers, workloads
from replaybench.bench.scenarios import Cell, RunState, Scenario, Selection, SelectionError, check_memory

__all__ = ["HARNESS", "WORKLOAD_PARAMS", "VariantInfo", "Item", "resolve_variants", "param_grid", "typed_grid",
           "skip_reason", "op_skip_reason", "Micro", "SCENARIO"]

HARNESS = "harness"

#: Grid parameters that change the workload (suite keys), not the variant. ``threads``: that many
#: threads, each with its own buffer, run the op at once (:func:`bench.workloads.time_threads`).
WORKLOAD_PARAMS = ("batch", "mixed_adds", "transitions", "threads")

#: Grid parameters stored in typed result columns, whatever the variants declare.
_COLUMN_TYPES = {"K": int, "dtype": str, "batch": int}

_SUITE_KEYS = {"variants": (str, list), "peers": list, "capacities": list, "ops": list, "batch": int,
               "mixed_adds": int, "transitions": str, "seed": int, "item_timeout_s": (int, float), "pyperf": dict}

#: pyperf settings: (type, smallest value, what the value means).
_SETTINGS = {"processes": (int, 1, "worker processes per cell"), "values": (int, 1, "values per process"),
             "warmups": (int, 0, "warm-up values per process"), "loops": (int, 0, "loops per value, 0 = calibrate"),
             "min_time": (float, 1e-9, "seconds per value when calibrating")}

#: Environment variables passed on to pyperf's workers (pyperf gives them a reduced environment).
_INHERIT_PREFIXES = ("NUMBA_", "REPLAYBENCH_")
_INHERIT_NAMES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


@dataclass(frozen=True)
class VariantInfo:
    """What the results say about one measured variant, resolved before anything is timed.

    ``params``: the parameters it declares with their defaults (registry variants: structure and
    buffer parameters; peers: their fixed parameters). ``accepts_any``: its factory takes
    keyword arguments it does not declare.
    """

    name: str
    structure: str
    params: dict = field(default_factory=dict)
    description: str = ""
    available: bool = True
    error: str = ""  # why it is unavailable
    accepts_any: bool = False

    def columns(self) -> dict:
        return {"variant": self.name, "structure": self.structure, "policy": "none",
                "K": self.params.get("K"), "dtype": self.params.get("dtype"), "params": self.params}


@dataclass(frozen=True)
class Item:
    """One micro cell: a variant at a capacity, its grid parameters, an op, the suite with this
    cell's workload parameters applied, and the pyperf settings."""

    variant: VariantInfo
    capacity: int | None
    op: str
    params: dict
    suite: dict
    settings: dict

    @property
    def slug(self) -> str:
        name = self.variant.name.replace(":", "-").replace("/", "-")
        extra = "".join(f"__{k}-{v}" for k, v in self.params.items())
        return f"{name}__{self.capacity or 0}__{self.op}{extra}".replace("/", "-").replace(" ", "")

    @property
    def variant_params(self) -> dict:
        return {k: v for k, v in self.params.items() if k not in WORKLOAD_PARAMS}


def _registry_info(name: str) -> VariantInfo:
    from replaybench.impl import registry

    v = registry.get(name)
    return VariantInfo(name, v.structure, v.accepted(), v.description, accepts_any=v.accepts_any)


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
        raise SelectionError(f"--variants: {err.args[0]}") from None


def param_grid(params: dict | None) -> list[dict]:
    """``{"K": [2, 4], "batch": [32]}`` -> ``[{"K": 2, "batch": 32}, {"K": 4, "batch": 32}]``."""
    combos = [{}]
    for key, values in (params or {}).items():
        values = values if isinstance(values, list) else [values]
        combos = [{**c, key: v} for c in combos for v in values]
    return combos


def _typed(value, kind: type, where: str, key: str, whose: str):
    """``value`` as ``kind`` (an int is a float too; a bool is only a bool), or SelectionError."""
    if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    if isinstance(value, kind) and (kind is bool or not isinstance(value, bool)):
        return value
    article = "an" if kind.__name__[0] in "aeiou" else "a"
    raise SelectionError(f"{where}: {key}={value!r} is not {article} {kind.__name__}, as {whose} requires")


def _check_workload(key: str, value, where: str) -> None:
    if key == "transitions":
        if value not in derive.SCHEMAS:
            raise SelectionError(f"{where}: transitions={value!r} is not one of {sorted(derive.SCHEMAS)}")
        return
    low = 1 if key in ("batch", "threads") else 0
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise SelectionError(f"{where}: {key}={value!r} must be an integer >= {low}")


def typed_grid(grid: dict, origin: dict, variants: list[VariantInfo]) -> dict:
    """The grid with every value checked and typed; SelectionError naming the first bad one.

    ``origin[key]`` says where the key's values came from (``--param`` or the suite), for the
    message. Workload parameters are checked for what the workload can do; a result-column
    parameter (K, dtype) must have the column's type; any other value must have the type of the
    default every variant declaring the key gives it. A key no variant declares is refused,
    unless a variant takes undeclared keyword arguments (then its constructor decides).
    """
    out = {}
    for key, values in grid.items():
        where = origin.get(key, "--param")
        if not isinstance(values, list) or not values:
            raise SelectionError(f"{where}: {key} needs a non-empty list of values, got {values!r}")
        typed = []
        for value in values:
            if key in WORKLOAD_PARAMS:
                _check_workload(key, value, where)
            else:
                declared = [(v.name, v.params[key]) for v in variants if key in v.params]
                if not declared and not any(v.accepts_any for v in variants):
                    raise SelectionError(f"{where}: no variant of this run takes {key!r} "
                                         f"(variants: {', '.join(v.name for v in variants)})")
                for name, default in declared:
                    # None or "auto": the variant takes an explicit setting of any type in its place
                    if default is not None and default != "auto":
                        value = _typed(value, type(default), where, key, f"{name} (default {key}={default!r})")
                if key in _COLUMN_TYPES:
                    value = _typed(value, _COLUMN_TYPES[key], where, key, f"the results' {key} column")
            if isinstance(value, float) and not math.isfinite(value):
                raise SelectionError(f"{where}: {key}={value!r} is not finite")
            typed.append(value)
        out[key] = typed
    return out


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

    unknown = [k for k in vparams if not variant.accepts_any and k not in variant.params]
    if unknown:
        return f"{variant.name} does not take parameter(s) {unknown}; it takes {sorted(variant.params)}"
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


def op_skip_reason(variant: VariantInfo, op: str) -> str:
    """Why ``variant`` cannot run ``op``, or "" when it can: ``find`` needs our sum tree (the
    uniform buffer has none, and the peers' APIs do not offer their trees' search)."""
    if op == "find" and (peers.is_peer(variant.name) or variant.structure == "uniform"):
        return f"{variant.name} has no sum tree to find in"
    return ""


def _check_suite(suite: dict) -> None:
    for key, kind in _SUITE_KEYS.items():
        value = suite.get(key)
        if isinstance(value, bool) or not isinstance(value, kind):
            raise SelectionError(f"suite {suite.get('name')!r}: {key!r} must be {kind}, got {value!r}")
    if "threads" in suite:
        _check_workload("threads", suite["threads"], f"suite {suite.get('name')!r}")
    if not isinstance(suite.get("params", {}), dict):
        raise SelectionError(f"suite {suite['name']!r}: 'params' must map each parameter to a non-empty list "
                             f"of values, got {suite['params']!r}")


def _settings(suite: dict, overrides: dict) -> dict:
    """The suite's pyperf settings with the command line's, each checked (SelectionError)."""
    out = {**suite["pyperf"], **overrides}
    for key, (kind, low, meaning) in _SETTINGS.items():
        value = out.get(key)
        where = f"--{key.replace('_', '-')}" if key in overrides else f"suite {suite['name']!r} pyperf.{key}"
        ok = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
              and value >= low and (kind is float or value == int(value)))
        if not ok:
            raise SelectionError(f"{where} must be {'an integer' if kind is int else 'a number'} >= {low} "
                                 f"({meaning}), got {value!r}")
        out[key] = kind(value)
    return out


class Micro(Scenario):
    """Seconds per call of each op, timed by pyperf in fresh processes (see the module docstring)."""

    name = "micro"
    suite_keys = frozenset({*_SUITE_KEYS, "threads", "params", "peer_ops"})
    takes = frozenset({"variants", "capacities", "ops", "params", "settings"})
    unit = "item"

    def cells(self, suite: dict, selection: Selection) -> list[Cell]:
        _check_suite(suite)
        capacities = list(selection.capacities or suite["capacities"])
        bad = [c for c in capacities if isinstance(c, bool) or not isinstance(c, int) or c < 1]
        if bad:
            where = "--capacities" if selection.capacities else f"suite {suite['name']!r}"
            raise SelectionError(f"{where}: capacities must be positive integers, got {bad}")
        peer_ops = None if selection.ops else suite.get("peer_ops")  # a suite may run fewer ops on the peers
        ops = list(selection.ops or suite["ops"])
        known = [o for o in contract.OPS if o != "empty"]  # empty is the overhead item, always run once
        unknown = sorted((set(ops) | set(peer_ops or ())) - set(known))
        if unknown:
            raise SelectionError(f"--ops: unknown op(s) {unknown}; known: {', '.join(known)}")
        settings = _settings(suite, selection.settings)
        infos = resolve_variants(suite, selection.variants)
        suite_params = suite.get("params") or {}
        origin = {**{k: f"suite {suite['name']!r} params" for k in suite_params},
                  **{k: "--param" for k in selection.params}}
        grid = typed_grid({**suite_params, **selection.params}, origin, infos)
        _check_workload("transitions", suite["transitions"], f"suite {suite['name']!r}")
        row = max(derive.row_bytes(derive.SCHEMAS[t]) for t in grid.get("transitions", [suite["transitions"]]))
        threads = max(grid.get("threads", [suite.get("threads", 1)]))
        check_memory(capacities, threads * (row + 8))  # a row and at least a float64 leaf per slot, per thread

        harness = VariantInfo(HARNESS, "none", {}, "timing loop with an empty op")
        items = [(harness, None, "empty", {}, "")]
        for v in infos:
            v_ops = peer_ops if peer_ops is not None and peers.is_peer(v.name) else ops
            for c in capacities:
                for combo in param_grid(grid):
                    reason = skip_reason(v, c, combo)
                    items += [(v, c, op, combo, reason or op_skip_reason(v, op)) for op in v_ops]
        cells = []
        if selection.variants is None:  # a plug-in that failed to load is a variant we could not measure
            from replaybench.impl import registry

            cells += [Cell(value, {"variant": value, "structure": "unknown", "policy": "none"},
                           skip=f"plug-in failed to load: {err}", skip_status="failed")
                      for value, err in registry.failures().items()]
        for v, capacity, op, combo, reason in items:
            item = Item(v, capacity, op, combo, {**suite, **{k: x for k, x in combo.items() if k in WORKLOAD_PARAMS}},
                        settings)
            status, why = ("unavailable", v.error) if not v.available else ("skipped", reason)
            label = " ".join(str(x) for x in (v.name, capacity or "", op, *(f"{k}={x}" for k, x in combo.items())) if x)
            cells.append(Cell(label, _columns(item), item, why, status))
        return cells

    def meta(self, suite: dict, selection: Selection, cells: list[Cell]) -> dict:
        from replaybench.bench import limits
        from replaybench.impl import registry

        items = [c.spec for c in cells if isinstance(c.spec, Item)]
        variants = list({i.variant.name: i.variant for i in items if i.variant.name != HARNESS}.values())
        grid = {}
        for i in items:
            for k, v in i.params.items():
                grid.setdefault(k, [])
                if v not in grid[k]:
                    grid[k].append(v)
        return {
            "pyperf_settings": items[0].settings,
            "selection": {"variants": [v.name for v in variants],
                          "capacities": list(dict.fromkeys(i.capacity for i in items if i.capacity)),
                          "ops": list(dict.fromkeys(i.op for i in items if i.variant.name != HARNESS)),
                          "params": grid, "settings": selection.settings},
            "peer_versions": {v.name: peers.availability(v.name)[1] if v.available else None
                              for v in variants if peers.is_peer(v.name)},
            "variants": {v.name: {"structure": v.structure, "params": v.params, "description": v.description,
                                  "available": v.available, "error": v.error or None} for v in variants},
            "plugin_failures": registry.failures(),
            "timing": "pyperf bench_time_func; value = seconds per call averaged over its loops; "
                      "set-up, fill and one call of the op before timing in each worker process",
            # this machine's latency and gather floor (bench/limits.py), and the floor of each op's
            # access pattern at the suite's default batch and row size (bench/floors.py)
            "memory_limits": {**limits.probe(), "op_floors": _op_floors(suite)},
            **({"gil_share": _gil_shares(items)} if any(i.suite.get("threads", 1) > 1 for i in items) else {}),
        }

    def measure(self, cell: Cell, run: RunState) -> list[dict]:
        rows = _measure(cell, run.raw_dir)
        if cell.spec.variant.name == HARNESS and rows[0]["status"] == "ok":
            run.meta["timing_overhead_s_per_call"] = statistics.median(r["value"] for r in rows)
        return rows

    def summarize(self, rows: list[dict], meta: dict) -> str:
        from replaybench.bench import summary

        return summary.format_rows(rows, meta, header=False)  # the driver prints the run's lines above it


def _op_floors(suite: dict) -> dict:
    """:func:`bench.floors.op_floors` at the suite's batch (default 256) and transitions' row bytes
    (CartPole by default), at the probed capacities whose arrays fit its 1 GiB limit."""
    from replaybench.bench import derive, floors

    nbytes = derive.row_bytes(derive.SCHEMAS[suite.get("transitions") or "cartpole"])
    caps = [c for c in floors.FLOOR_CAPACITIES if c * (nbytes + 16) <= 2**30]
    return floors.op_floors(caps, batch=int(suite.get("batch") or 256), row_bytes=nbytes)


SCENARIO = Micro()


def _gil_shares(items: list[Item]) -> list[dict]:
    """For a run with several threads: per registered variant and capacity of its threaded
    sample cells, the share of a ``sample`` call that holds the GIL
    (:func:`bench.workloads.gil_share`; what a second thread cannot overlap) and what two
    threads holding it for that share of such a call get here with nothing shared
    (``gil_pair``: :func:`bench.workloads.gil_pair_ratio`, the handover included), and the same
    at each larger thread count of those cells (``gil_threads``: ``[{"threads", "ratio",
    "ratio_min", "ratio_max"}]``: with many threads each handover wakes a sleeping one, which
    the share alone does not count). A few seconds per variant and thread count, measured while
    the run's meta is written, before any cell; a variant it cannot measure gets its error
    instead."""
    counts: dict[tuple, set] = {}
    for i in items:
        if i.op == "sample" and i.suite.get("threads", 1) >= 2:
            counts.setdefault((i.variant.name, i.capacity), set()).add(i.suite["threads"])
    keys = ("ratio", "ratio_min", "ratio_max")
    out = []
    seen = set()
    for i in items:
        key = (i.variant.name, i.capacity)
        if (i.op != "sample" or i.suite.get("threads", 1) < 2 or peers.is_peer(i.variant.name)
                or i.variant.name == HARNESS or key in seen):
            continue
        seen.add(key)
        try:
            got = workloads.gil_share(i.variant.name, i.capacity, batch=i.suite["batch"],
                                      transitions=i.suite["transitions"], calls=1000, **i.variant_params)
            held, free = got["gil_share"] * got["call_s"], (1 - got["gil_share"]) * got["call_s"]
            pair = workloads.gil_pair_ratio(held, free, calls=1)
            wider = [{"threads": t, **{k: m[k] for k in keys}}
                     for t in sorted(counts[key]) if t > 2
                     for m in (workloads.gil_pair_ratio(held, free, calls=1, threads=t),)]
            out.append({**got, "gil_pair": {k: pair[k] for k in keys}, **({"gil_threads": wider} if wider else {})})
        except Exception as err:  # recorded, not fatal: the timed cells are what the run is for
            out.append({"variant": i.variant.name, "capacity": i.capacity, "error": f"{type(err).__name__}: {err}"})
    return out


def _columns(item: Item) -> dict:
    """The columns every row of a micro cell shares."""
    spec = contract.OPS[item.op]
    suite = item.suite
    batch = {"empty": None, "insert_one": 1}.get(item.op, suite["batch"])  # mixed: the sample size
    columns = item.variant.columns()
    vparams = item.variant_params
    if item.variant.name != HARNESS and item.params:
        columns["params"] = {**columns["params"], **vparams,
                             **({"mixed_adds": suite["mixed_adds"]} if "mixed_adds" in item.params else {})}
        for key in ("K", "dtype"):
            if key in vparams:
                columns[key] = vparams[key]
    threads = suite.get("threads", 1)  # a call is one op in each of that many threads
    return {**columns, "capacity": item.capacity, "batch": batch, "threads": threads,
            "transitions": suite["transitions"], "op": item.op, "metric": "seconds_per_call", "unit": "s",
            "items_per_call": threads * spec.items_per_call(suite["batch"])}


def _inherited_environ() -> list[str]:
    """Variables the pyperf workers keep besides pyperf's reduced environment."""
    return sorted(k for k in os.environ if k.startswith(_INHERIT_PREFIXES) or k in _INHERIT_NAMES)


def _error_message(err_file: Path, stderr: str, returncode: int | None) -> str:
    if err_file.exists():
        return err_file.read_text().splitlines()[0]
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    return lines[-1] if lines else f"pyperf manager exited with status {returncode}"


def _resolved_params(cell: Cell, path: Path) -> dict:
    """``{"params": ...}``: the cell's params plus ``resolved_<name>`` for each speed parameter
    the worker's buffer resolved (``storage``, ``prefetch``: what ``"auto"`` chose, or the
    explicit setting), from the file the worker wrote; ``{}`` when there is none (a peer)."""
    try:
        resolved = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    finally:
        path.unlink(missing_ok=True)
    if not isinstance(resolved, dict) or not resolved:
        return {}
    return {"params": {**(cell.columns.get("params") or {}), **{f"resolved_{k}": v for k, v in resolved.items()}}}


def _measure(cell: Cell, raw_dir: Path) -> list[dict]:
    """Time one cell in fresh processes; its rows (one per value, or one failed row)."""
    from replaybench.bench import manager_server

    item: Item = cell.spec
    suite, settings = item.suite, item.settings
    out_json = raw_dir / f"{item.slug}.json"
    err_file = raw_dir / f"{item.slug}.error.txt"
    stderr_file = raw_dir / f"{item.slug}.stderr.txt"
    resolved_file = raw_dir / f"{item.slug}.resolved.json"
    argv = ["--quiet", "-o", str(out_json),
            "--target", item.variant.name, "--capacity", str(item.capacity or 0), "--op", item.op,
            "--batch", str(suite["batch"]), "--mixed-adds", str(suite["mixed_adds"]),
            "--transitions", suite["transitions"], "--seed", str(suite["seed"]), "--error-file", str(err_file),
            "--processes", str(settings["processes"]), "--values", str(settings["values"]),
            "--warmups", str(settings["warmups"]), "--loops", str(settings["loops"]),
            "--min-time", str(settings["min_time"]), "--resolved-file", str(resolved_file)]
    if item.variant_params:
        argv += ["--params", json.dumps(item.variant_params, sort_keys=True)]
    if suite.get("threads", 1) > 1:
        argv += ["--threads", str(suite["threads"])]
    inherit = _inherited_environ()
    if inherit:
        argv += ["--inherit-environ", ",".join(inherit)]
    try:
        code = manager_server.run_manager(argv, suite["item_timeout_s"], str(stderr_file))
    except (manager_server.ManagerHang, manager_server.ServerError) as err:
        stderr_file.unlink(missing_ok=True)
        return [cell.row("failed", str(err))]
    stderr = stderr_file.read_text() if stderr_file.exists() else ""
    stderr_file.unlink(missing_ok=True)
    if code != 0 or not out_json.exists():
        return [cell.row("failed", _error_message(err_file, stderr, code))]
    import pyperf

    bench = pyperf.Benchmark.load(str(out_json))
    extra = _resolved_params(cell, resolved_file)
    rows = []
    for run in bench.get_runs():
        for value in run.values:  # calibration runs have none
            rows.append(cell.row("ok", value=float(value), repeat=len(rows), loops=run.get_loops(), **extra))
    return rows or [cell.row("failed", "pyperf produced no values")]
