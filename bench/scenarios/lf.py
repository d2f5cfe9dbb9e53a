"""The Lingua Franca benchmarks (Kwok, Lohstroh, Lee, arXiv 2312.04704): every backend in one run.

Three workloads, each measured on every backend named in the suite, in the same run, so that
the ratio to Ray is a ratio of the same machine's numbers:

- ``lockstep``: ``n_envs`` environments stepped in lock step with random actions
  (:mod:`bench.lf.lockstep`: ray, dataflow, sync, async, mp-queues); metric ``env_steps_per_s``
  (``n_envs x rounds / seconds``), one row per timed window of ``rounds`` rounds after ``warmup``
  rounds, all windows on one set of env processes;
- ``pql``: parallel Q-learning on Blackjack (ray: :mod:`bench.lf.pql_ray`; dataflow:
  :func:`impl.dataflow.run_pql`); metrics ``time_s`` (the run's ``rounds``, start-up excluded)
  and ``env_steps_per_s``; one row of each per run; ``policy`` holds the replay
  (``prioritized`` or ``deque``), ``batch`` the mini-batch, ``actors`` the rollout actors;
- ``multiagent``: one policy per agent on a PettingZoo environment (:mod:`bench.lf.multiagent`:
  ray, serial, dataflow); metric ``steps_per_s`` (joint env steps), one row per window.

Rows: ``backend`` = the backend, ``variant`` empty (no buffer variant is measured here),
``structure`` = "lf", ``op`` = the workload, ``env``, ``actors`` (envs, rollout actors or
agents), ``params`` (rounds, workers, cores, ...). A backend
that cannot run here (Ray or mpe2 not installed, ale-py missing for Atari ids) is an
``unavailable`` row with the reason. The summary (:func:`format_table`, from
:func:`bench.derive.lf_ratios`) puts each median beside Ray's median of the same cell, the
paper's ratio (the suite's ``paper.lf_over_ray``, recorded in meta.json) and the one-process
backend's median.

Suite keys (bench/suites/lf.json): ``lockstep``, ``pql``, ``multiagent``: each a list of
blocks; a block gives ``backends`` and its grid (lists) and settings (scalars):

- lockstep: envs (list), n_envs, rounds, warmup, repeats, workers (dataflow processes;
  default: this machine's cores, at most n_envs);
- pql: actors (list), batch_sizes (list), replays (list), rounds, repeats, and any other
  :class:`~impl.dataflow.PQLConfig` field;
- multiagent: env ("simple_spread"), agents, steps, warmup, repeats.

``ray_num_cpus`` (top level, default: every core) is given to ``ray.init``.
"""

from __future__ import annotations

import importlib.util
import itertools

from replaybench.bench import derive, suites
from replaybench.bench.scenarios import Cell, RunState, Scenario, Selection, SelectionError
from replaybench.impl.machine import usable_cores

__all__ = ["format_table", "LinguaFranca", "SCENARIO"]


def _positive_int(where: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SelectionError(f"{where} must be a positive integer, got {value!r}")
    return value


def _unavailable(backend: str, needs: tuple = ()) -> str:
    """Why ``backend`` (with the modules in ``needs``) cannot run here; "" when it can."""
    from replaybench.bench.lf import raysession

    if backend == "ray" and raysession.unavailable():
        return raysession.unavailable()
    for module, extra in needs:
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (pip install 'replaybench[{extra}]')"
    return ""


def _blocks(suite: dict, workload: str) -> list[dict]:
    blocks = suite.get(workload, [])
    where = f"suite {suite['name']!r}: {workload!r}"
    if not isinstance(blocks, list) or not all(isinstance(b, dict) for b in blocks):
        raise SelectionError(f"{where} must be a list of blocks (objects), got {blocks!r}")
    known = derive.LF_WORKLOADS[workload][0]
    for b in blocks:
        backends = b.get("backends")
        if not isinstance(backends, list) or not backends or set(backends) - set(known):
            raise SelectionError(f"{where}: 'backends' must be a non-empty list of {list(known)}, got {backends!r}")
    return blocks


def _lockstep_cells(suite: dict, cores: int) -> list[Cell]:
    cells = []
    for i, b in enumerate(_blocks(suite, "lockstep")):
        where = f"suite {suite['name']!r}: lockstep[{i}]"
        envs = b.get("envs")
        if not isinstance(envs, list) or not envs or not all(isinstance(e, str) and e for e in envs):
            raise SelectionError(f"{where}.envs must be a list of environment ids, got {envs!r}")
        n_envs = _positive_int(f"{where}.n_envs", b.get("n_envs", 15))
        spec = {"n_envs": n_envs, "rounds": _positive_int(f"{where}.rounds", b.get("rounds")),
                "warmup": _positive_int(f"{where}.warmup", b.get("warmup", 10)),
                "repeats": _positive_int(f"{where}.repeats", b.get("repeats", 3)),
                "workers": _positive_int(f"{where}.workers", b.get("workers", min(cores, n_envs)))}
        if spec["workers"] > n_envs:
            raise SelectionError(f"{where}.workers ({spec['workers']}) must be <= n_envs ({n_envs})")
        for env, backend in itertools.product(envs, b["backends"]):
            needs = (("ale_py", "atari"),) if env.startswith("ALE/") else ()
            params = {k: spec[k] for k in ("rounds", "warmup")} | {"cores": cores}
            if backend == "dataflow":
                params["workers"] = spec["workers"]
            columns = {"backend": backend, "structure": "lf", "policy": "none", "op": "lockstep", "env": env,
                       "actors": n_envs, "metric": "env_steps_per_s", "unit": "steps/s", "params": params}
            reason = _unavailable(backend, needs)
            cells.append(Cell(f"lockstep {env} {backend}", columns, {**spec, "env": env}, skip=reason,
                              skip_status="unavailable"))
    return cells


def _pql_cells(suite: dict, cores: int) -> list[Cell]:
    from replaybench.impl.dataflow import PQLConfig

    cells = []
    for i, b in enumerate(_blocks(suite, "pql")):
        where = f"suite {suite['name']!r}: pql[{i}]"
        grid = {}
        for key in ("actors", "batch_sizes", "replays"):
            if not isinstance(b.get(key), list) or not b[key]:
                raise SelectionError(f"{where}.{key} must be a non-empty list, got {b.get(key)!r}")
            grid[key] = b[key]
        repeats = _positive_int(f"{where}.repeats", b.get("repeats", 1))
        settings = {k: v for k, v in b.items() if k not in ("backends", "actors", "batch_sizes", "replays", "repeats")}
        unknown = set(settings) - set(PQLConfig.field_names())
        if unknown:
            raise SelectionError(f"{where}: unknown keys {sorted(unknown)}; PQLConfig fields: {PQLConfig.field_names()}")
        for actors, batch, replay, backend in itertools.product(grid["actors"], grid["batch_sizes"], grid["replays"],
                                                                 b["backends"]):
            fields = {"workers": min(cores, actors) if isinstance(actors, int) else 1, **settings}
            try:
                cfg = PQLConfig(actors=actors, batch_size=batch, replay=replay, **fields).validate()
            except (TypeError, ValueError) as err:
                raise SelectionError(f"{where}: {err}") from None
            params = {"rounds": cfg.rounds, "steps_per_round": cfg.steps_per_round,
                      "replay_capacity": cfg.replay_capacity, "cores": cores}
            if backend == "dataflow":
                params["workers"] = cfg.workers
            columns = {"backend": backend, "structure": "lf", "policy": replay, "op": "pql", "env": cfg.env,
                       "actors": actors, "batch": batch, "metric": "time_s", "unit": "s", "params": params}
            cells.append(Cell(f"pql {backend} actors={actors} batch={batch} {replay}", columns, (cfg, repeats),
                              skip=_unavailable(backend), skip_status="unavailable"))
    return cells


def _multiagent_cells(suite: dict, cores: int) -> list[Cell]:
    from replaybench.bench.lf.multiagent import ENVS

    cells = []
    for i, b in enumerate(_blocks(suite, "multiagent")):
        where = f"suite {suite['name']!r}: multiagent[{i}]"
        env = b.get("env", "simple_spread")
        if env not in ENVS:
            raise SelectionError(f"{where}.env must be one of {list(ENVS)}, got {env!r}")
        spec = {"env": env, "agents": _positive_int(f"{where}.agents", b.get("agents", 10)),
                "steps": _positive_int(f"{where}.steps", b.get("steps")),
                "warmup": _positive_int(f"{where}.warmup", b.get("warmup", 25)),
                "repeats": _positive_int(f"{where}.repeats", b.get("repeats", 3))}
        for backend in b["backends"]:
            columns = {"backend": backend, "structure": "lf", "policy": "none", "op": "multiagent", "env": env,
                       "actors": spec["agents"], "metric": "steps_per_s", "unit": "steps/s",
                       "params": {"steps": spec["steps"], "cores": cores}}
            cells.append(Cell(f"multiagent {env} x{spec['agents']} {backend}", columns, spec,
                              skip=_unavailable(backend, (("mpe2", "multiagent"),)), skip_status="unavailable"))
    return cells


class LinguaFranca(Scenario):
    """The LF benchmarks (see the module docstring)."""

    name = "lf"
    takes = frozenset()
    suite_keys = frozenset({"ray_num_cpus", *derive.LF_WORKLOADS})

    def cells(self, suite: dict, selection: Selection) -> list[Cell]:
        self.check_keys(suite)  # the driver checks too; direct callers (the tests) get the same
        ray_cpus = suite.get("ray_num_cpus")
        if ray_cpus is not None:
            _positive_int(f"suite {suite['name']!r}: ray_num_cpus", ray_cpus)
        cores = usable_cores()
        cells = _lockstep_cells(suite, cores) + _pql_cells(suite, cores) + _multiagent_cells(suite, cores)
        if not cells:
            raise SelectionError(f"suite {suite['name']!r} declares no work: give lockstep, pql or multiagent blocks")
        return cells

    def meta(self, suite: dict, selection: Selection, cells: list[Cell]) -> dict:
        return {"ray_num_cpus": suite.get("ray_num_cpus"),
                "timing": "perf_counter around the timed rounds/steps only: processes, Ray actors and envs are "
                          "started, and warm-up rounds run, before the clock starts"}

    def measure(self, cell: Cell, run: RunState) -> list[dict]:
        from contextlib import nullcontext

        from replaybench.bench.lf import raysession

        ray = cell.columns["backend"] == "ray"
        session = raysession.session(run.meta.get("ray_num_cpus")) if ray else nullcontext()
        with session:
            return getattr(self, "_" + cell.columns["op"])(cell, run)

    @staticmethod
    def _lockstep(cell: Cell, run: RunState) -> list[dict]:
        import time

        from replaybench.bench.lf.lockstep import open_backend

        s = cell.spec
        rows = []
        with open_backend(cell.columns["backend"], s["env"], s["n_envs"], 0, s["workers"]) as backend:
            for _ in range(s["warmup"]):
                backend.round()
            for rep in range(s["repeats"]):
                start = time.perf_counter()
                for _ in range(s["rounds"]):
                    backend.round()
                seconds = time.perf_counter() - start
                rows.append(cell.row("ok", value=s["n_envs"] * s["rounds"] / seconds, repeat=rep))
        return rows

    @staticmethod
    def _pql(cell: Cell, run: RunState) -> list[dict]:
        from dataclasses import replace

        from replaybench.bench.lf.pql_ray import run_pql_ray
        from replaybench.impl.dataflow import run_pql

        cfg, repeats = cell.spec
        go = run_pql_ray if cell.columns["backend"] == "ray" else run_pql
        rows = []
        for rep in range(repeats):
            def progress(r, rep=rep):
                if run.bar is not None and r % 10 == 0:
                    run.bar.set_postfix_str(f"{cell.label} run {rep + 1}/{repeats} round {r}/{cfg.rounds}")

            res = go(replace(cfg, seed=cfg.seed + rep), progress)
            rows.append(cell.row("ok", value=res.seconds, repeat=rep))
            rows.append(cell.row("ok", metric="env_steps_per_s", unit="steps/s", value=res.env_steps / res.seconds,
                                 repeat=rep))
        return rows

    @staticmethod
    def _multiagent(cell: Cell, run: RunState) -> list[dict]:
        from replaybench.bench.lf import multiagent

        s = cell.spec
        env = multiagent.make_env(s["env"], s["agents"])
        try:
            agent = env.possible_agents[0]
            obs_dim = int(env.observation_space(agent).shape[0])
            backend = multiagent.open_backend(cell.columns["backend"], s["agents"], obs_dim,
                                              int(env.action_space(agent).n), seed=0)
            try:
                multiagent.run(env, backend, s["warmup"], seed=0)
                return [cell.row("ok", value=s["steps"] / multiagent.run(env, backend, s["steps"], seed=rep + 1),
                                 repeat=rep) for rep in range(s["repeats"])]
            finally:
                backend.close()
        finally:
            env.close()

    def summarize(self, rows: list[dict], meta: dict) -> str:
        return format_table(rows, (derive.recorded(meta, "paper", "lf_over_ray") or {}).get("cells"))


SCENARIO = LinguaFranca()


def format_table(rows: list[dict], paper: list[dict] | None = None) -> str:
    """The medians, their spread and the ratio to Ray (with the paper's LF/Ray ratio on our
    dataflow's line where ``paper``, the paper's cells as :func:`bench.derive.lf_ratios` takes
    them, has the cell), then the cells that did not run."""
    from replaybench.bench.summary import format_table as table

    def g(x, fmt="{:,.3g}"):
        return "-" if x is None else fmt.format(x)

    body = [[e["op"], str(e["env"]), str(e["policy"]), str(e["actors"]), g(e["batch"], "{}"), e["backend"],
             g(e["median"]), f"{e['min']:,.3g}-{e['max']:,.3g}", str(e["n"]), g(e["x_ray"], "{:.2f}x"),
             g(e["paper"], "{:.2f}x"), g(e["x_single"], "{:.2f}x")] for e in derive.lf_ratios(rows, paper)]
    header = ["workload", "env", "replay", "actors", "batch", "backend", "median", "min-max", "n", "x Ray",
              "paper LF/Ray", "x 1 process"]
    out = table(header, body, set(range(6, len(header)))) if body else ["(no LF rows measured)"]
    out = ["steps/s (lockstep, multiagent) or seconds (pql); x Ray = speed over Ray's in the same run; "
           "x 1 process = over the one-process backend's (sync, serial)", *out]
    missing = [r for r in rows if r.get("status") != "ok"]
    if missing:
        seen = {}
        for r in missing:
            seen.setdefault((r["op"], r.get("env"), r.get("backend"), r["status"], (r.get("error") or "")[:100]),
                            None)
        out += ["", "Not measured:", *table(["workload", "env", "backend", "status", "error"],
                                            [[str(c) for c in k] for k in seen], set())]
    return "\n".join(out)
