"""The paac scenario: batched vs per-environment inference, PAAC's stepping against its peers,
and PAAC (A2C) against the PAL loop (DQN) to the CartPole threshold.

Three kinds of cell, each declared by a section of the suite (bench/suites/paac.json):

``stepping``: a list of blocks ``{"env", "methods", "n_envs", "n_workers", "steps", "repeats",
"overrides"}``. One cell per (env, method, n_e, n_w): the method drives n_e environments with
the SAME network (A2C's :func:`~impl.rl.algorithms.a2c.make_network` for the env, built from
``A2CConfig.for_env(env, **overrides)``: an MLP for vectors, the paper's conv net for Atari
frames; actions sampled by :meth:`~impl.rl.algorithms.a2c.A2CLearner.act`) and one torch thread per
process. It warms up for one window, then times ``repeats`` windows of ``steps`` env steps
each (rounded up to whole vector steps), each window one row. Methods (the ``stepping``
column; ``variant`` is empty, as no buffer variant is measured):

==============  =========================================================================
paac            :class:`~impl.rl.common.stepping.SharedVectorEnv`, n_w worker processes, ONE
                batched forward per step in the master (PAAC's synchronous loop)
paac-halves     the same with ``halves=True``: the forward of one half of the envs
                overlaps the stepping of the other half
per-env         today's actors: n_w processes each stepping its n_e / n_w envs with one
                forward per env step (no batching; what PAAC's batching replaces)
gym-sync        gymnasium's SyncVectorEnv, one process, one batched forward (n_w column 0)
gym-async       gymnasium's AsyncVectorEnv (one subprocess per env, its default shared
                memory), one batched forward in the master (n_w column = n_e)
envpool         EnvPool's C++ thread pool (n_w threads), one batched forward; Atari ids run
                as EnvPool's own ``Pong-v5`` with its preprocessing (84x84 grey, 4 stacked
                frames, frame skip 4: the same shapes, its own no-op and episode rules).
                Where EnvPool does not install or cannot make the env, its cells are
                ``unavailable`` with the reason.
ale-vector      ALE's own C++ vector env (:mod:`impl.rl.common.ale_vector`, PAAC's
                ``stepping="ale-vector"``) on n_w threads, one batched forward; ALE ids only
                (other envs' cells are ``unavailable``), gymnasium's preprocessing choices
==============  =========================================================================

An environment that cannot be made here (``ALE/Pong-v5`` without the ``atari`` extra) makes
its block's cells ``unavailable``, naming the reason. Combinations a method cannot run
(n_w > n_e; halves with n_w > n_e // 2 or n_e < 2; EnvPool and ale-vector with n_w = 0) are
not cells. n_w = 0
runs paac and per-env in the measuring process (PAAC's single-process case; today's one
actor stepping n_e envs).

``training``: ``{"env", "steps", "seeds", "timeout_s", "runs": [{"label", "algo", "actors",
"learners", "envs_per_actor", "steps", "overrides"}, ...]}``: one cell per (run, seed), a full
training run through :func:`impl.rl.train` (``stop_at_threshold``: PAAC and the sequential loop
end at the threshold, the parallel PAL loop runs its ``steps``, a run's own or the section's,
and records when it got there): ``algo: "a2c"`` is PAAC
(:mod:`impl.rl.engines.paac`), ``"dqn"`` the PAL loop (actor and learner processes over the shared
prioritized buffer). Give both the same cores (PAAC's n_w + 1 processes, the PAL loop's
actors + learners).

Rows (scenario "paac"; ``env``, ``algo`` ("a2c" for the stepping cells' network), ``mode``
"processes", ``batch`` = n_e, ``actors`` = n_w, ``params`` {"n_envs", "n_workers", "steps",
"hidden"}):

- stepping, op "step", metric ``env_steps_per_s`` (steps/s), one row per window (``repeat``);
- stepping, op "profile": where a window's wall time went, metrics ``inference`` (the master's
  forward passes; for per-env: the workers' forward time / n_w), ``env_step`` (for paac: the
  workers' mean busy time stepping; per-env: their step time / n_w; the vector-env peers: the
  whole ``step`` call), ``sync`` (paac only: the master's wait beyond the workers' mean busy
  time: synchronisation and load imbalance) and ``other`` (the rest), each in us per env step
  (unit "us/step"), summed over the windows;
- training: the training scenario's rows (:func:`bench.scenarios.training.result_rows`:
  summary metrics env_steps_per_s, time_to_threshold_s ..., episode returns, per-role
  profiles), ``variant`` = the run's label ("paac-a2c", "pal-dqn").

Timing: ``time.perf_counter`` around each window, after a warm-up window; the venv or worker
processes are started (and torch imported in them) before the first window. Repeats are
windows of one venv, not fresh processes: a start-up of n_w processes costs seconds.
"""

from __future__ import annotations

import time

import numpy as np

from replaybench.bench.scenarios import Cell, RunState, Scenario, Selection, SelectionError

__all__ = ["METHODS", "BATCHED", "SteppingSpec", "measure_stepping", "envpool_status", "PaacBench", "SCENARIO"]

METHODS = ("paac", "paac-halves", "per-env", "gym-sync", "gym-async", "envpool", "ale-vector")
#: Methods whose n_w axis is their own (not the suite's): gym-sync runs in one process, gym-async
#: one process per env.
NO_WORKER_AXIS = ("gym-sync", "gym-async")
#: Methods that run one batched forward per vector step.
BATCHED = ("paac", "paac-halves", "gym-sync", "gym-async", "envpool", "ale-vector")
PROFILE = ("inference", "env_step", "sync", "other")


def envpool_status() -> str | None:
    """None when EnvPool imports, else why not (the exception, one line)."""
    try:
        import envpool  # noqa: F401
    except Exception as err:  # ImportError, or a binary that does not load here
        return f"envpool does not import: {type(err).__name__}: {err}"
    return None


def _envpool_id(env_id: str) -> str:
    return env_id.split("/", 1)[1] if env_id.startswith("ALE/") else env_id


# ------------------------------------------------------------------------------------------ policy
class _Policy:
    """The one network every method drives: ``act(obs) -> actions`` with one forward pass."""

    def __init__(self, env_id: str, overrides: dict, seed: int = 0):
        import torch

        from replaybench.impl.rl.algorithms.a2c import A2CConfig, A2CLearner
        from replaybench.impl.rl.common.envs import make_env

        torch.set_num_threads(1)
        env = make_env(env_id)
        self.obs_space, self.action_space = env.observation_space, env.action_space
        env.close()
        self.learner = A2CLearner(self.obs_space, self.action_space, A2CConfig.for_env(env_id, **overrides), seed)

    def act(self, obs: np.ndarray) -> np.ndarray:
        return self.learner.act(obs)[0]


# ------------------------------------------------------------------------------------------ stepping
class SteppingSpec:
    """One stepping cell: ``method`` drives ``n_envs`` copies of ``env`` over ``n_workers``
    processes (or threads: envpool) for ``repeats`` timed windows of ``steps`` env steps."""

    def __init__(self, env: str, method: str, n_envs: int, n_workers: int, steps: int, repeats: int,
                 overrides: dict, seed: int = 0):
        self.env, self.method, self.n_envs, self.n_workers = env, method, int(n_envs), int(n_workers)
        self.steps, self.repeats, self.overrides, self.seed = int(steps), int(repeats), dict(overrides), int(seed)

    @property
    def vector_steps(self) -> int:
        """Vector steps per window: ``steps`` rounded up to whole steps of all n_e envs."""
        return -(-self.steps // self.n_envs)


def _time_windows(spec: SteppingSpec, step_once, profile: dict, split=None) -> list[float]:
    """Warm up one window, then time ``spec.repeats`` windows of ``step_once()`` calls; returns
    the seconds of each. ``split()``, when given, returns the cumulative (inference, env_step,
    sync) seconds so far, whose increase over the timed windows goes into ``profile``."""
    for _ in range(spec.vector_steps):
        step_once()
    start = split() if split else None
    walls = []
    for _ in range(spec.repeats):
        t0 = time.perf_counter()
        for _ in range(spec.vector_steps):
            step_once()
        walls.append(time.perf_counter() - t0)
    if split:
        for name, before, after in zip(PROFILE, start, split()):
            profile[name] += after - before
    return walls


def _batched_loop(venv_step, policy: _Policy, obs, timing: dict):
    """A step function: one batched forward on the latest observations, then ``venv_step``."""
    state = {"obs": obs}

    def step_once():
        t0 = time.perf_counter()
        actions = policy.act(state["obs"])
        t1 = time.perf_counter()
        state["obs"] = venv_step(actions)
        t2 = time.perf_counter()
        timing["inference"] += t1 - t0
        timing["env_step"] += t2 - t1

    return step_once


def _measure_paac(spec: SteppingSpec, policy: _Policy, profile: dict) -> list[float]:
    from replaybench.impl.rl.common.stepping import SharedVectorEnv

    halves = spec.method == "paac-halves"
    timing = {"inference": 0.0, "wait": 0.0}
    with SharedVectorEnv(spec.env, spec.n_envs, spec.n_workers, seed=spec.seed, halves=halves) as venv:
        obs = np.array(venv.reset())
        def split():
            if spec.n_workers == 0:  # stepped in this process: the whole wait is stepping
                return timing["inference"], timing["wait"], 0.0
            busy = float(venv.worker_busy_s.sum()) / spec.n_workers  # resets included: only differences count
            return timing["inference"], busy, timing["wait"] - busy

        if not halves:
            state = {"obs": obs}

            def step_once():
                t0 = time.perf_counter()
                actions = policy.act(state["obs"])
                t1 = time.perf_counter()
                state["obs"] = venv.step(actions)[0]
                timing["inference"] += t1 - t0
                timing["wait"] += time.perf_counter() - t1
        else:  # part p's forward runs while the other part steps
            parts = [venv.part_slice(0), venv.part_slice(1)]
            for p in (0, 1):
                venv.step_async(policy.act(obs[parts[p]]), part=p)

            def step_once():
                for p in (0, 1):
                    t0 = time.perf_counter()
                    part_obs = venv.step_wait(part=p)[0]
                    t1 = time.perf_counter()
                    actions = policy.act(part_obs)
                    t2 = time.perf_counter()
                    venv.step_async(actions, part=p)
                    timing["wait"] += t1 - t0 + time.perf_counter() - t2  # the hand-off is synchronisation too
                    timing["inference"] += t2 - t1

        walls = _time_windows(spec, step_once, profile, split)
        if halves:
            for p in (0, 1):
                venv.step_wait(part=p)
    return walls


class _PerEnvActor:
    """Today's actor without replay: its envs and a copy of the network (same seed, same
    weights), one forward per env step. :meth:`window` returns (wall, inference, env_step) s."""

    def __init__(self, env_id: str, overrides: dict, seeds: list):
        from replaybench.impl.rl.common.envs import make_env

        self.policy = _Policy(env_id, overrides)
        self.envs = [make_env(env_id) for _ in seeds]
        self.obs = [env.reset(seed=s)[0] for env, s in zip(self.envs, seeds)]

    def window(self, vector_steps: int) -> tuple[float, float, float]:
        inference = stepping = 0.0
        t_start = time.perf_counter()
        for _ in range(vector_steps):
            for j, env in enumerate(self.envs):
                t0 = time.perf_counter()
                action = int(self.policy.act(self.obs[j][None])[0])
                t1 = time.perf_counter()
                o, _, term, trunc, _ = env.step(action)
                self.obs[j] = env.reset()[0] if term or trunc else o
                t2 = time.perf_counter()
                inference += t1 - t0
                stepping += t2 - t1
        return time.perf_counter() - t_start, inference, stepping

    def close(self) -> None:
        for env in self.envs:
            env.close()


def _per_env_worker(conn, env_id: str, overrides: dict, seeds: list, windows: int, vector_steps: int) -> None:
    """Worker process of the per-env method: one :class:`_PerEnvActor`, one window per "go"."""
    try:
        actor = _PerEnvActor(env_id, overrides, seeds)
        conn.send("ready")
        for _ in range(windows):
            conn.recv()
            conn.send(actor.window(vector_steps))
        actor.close()
    except BaseException as err:  # reported to the master, which raises it
        import traceback

        conn.send(("error", f"{type(err).__name__}: {err}\n{traceback.format_exc()}"))
    finally:
        conn.close()


def _measure_per_env(spec: SteppingSpec, profile: dict) -> list[float]:
    import multiprocessing as mp

    from replaybench.impl.rl.common.seeding import RunSeeds

    seeds = RunSeeds(spec.seed).actor(0)
    if spec.n_workers == 0:  # in this process
        actor = _PerEnvActor(spec.env, spec.overrides, [seeds.env_seed(i) for i in range(spec.n_envs)])
        try:
            actor.window(spec.vector_steps)  # warm-up
            walls = []
            for _ in range(spec.repeats):
                wall, inference, stepping = actor.window(spec.vector_steps)
                walls.append(wall)
                profile["inference"] += inference
                profile["env_step"] += stepping
            return walls
        finally:
            actor.close()
    ctx = mp.get_context("spawn")
    n_w = spec.n_workers
    bounds = [spec.n_envs * w // n_w for w in range(n_w + 1)]
    procs, conns = [], []
    try:
        for w in range(n_w):
            here, there = ctx.Pipe()
            mine = [seeds.env_seed(i) for i in range(bounds[w], bounds[w + 1])]
            p = ctx.Process(target=_per_env_worker, daemon=True, name=f"per-env-{w}",
                            args=(there, spec.env, spec.overrides, mine, spec.repeats + 1, spec.vector_steps))
            p.start()
            there.close()
            procs.append(p)
            conns.append(here)

        def receive(conn):
            msg = conn.recv()
            if isinstance(msg, tuple) and msg[0] == "error":
                raise RuntimeError(f"per-env worker failed: {msg[1]}")
            return msg

        for conn in conns:
            receive(conn)  # ready
        walls = []
        for window in range(spec.repeats + 1):  # the first is the warm-up
            t0 = time.perf_counter()
            for conn in conns:
                conn.send("go")
            replies = [receive(conn) for conn in conns]
            wall = time.perf_counter() - t0
            if window:
                walls.append(wall)
                profile["inference"] += sum(r[1] for r in replies) / n_w
                profile["env_step"] += sum(r[2] for r in replies) / n_w
        for p in procs:
            p.join(10)
        return walls
    finally:
        for conn in conns:
            conn.close()
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(2)
            if p.is_alive():
                p.kill()
                p.join(2)


def _measure_gym(spec: SteppingSpec, policy: _Policy, profile: dict) -> list[float]:
    import gymnasium as gym

    from replaybench.impl.rl.common.envs import make_env

    fns = [lambda: make_env(spec.env) for _ in range(spec.n_envs)]
    venv = gym.vector.SyncVectorEnv(fns) if spec.method == "gym-sync" else gym.vector.AsyncVectorEnv(fns)
    try:
        obs, _ = venv.reset(seed=spec.seed)
        timing = {"inference": 0.0, "env_step": 0.0}
        step_once = _batched_loop(lambda a: venv.step(a)[0], policy, obs, timing)
        return _time_windows(spec, step_once, profile, lambda: (timing["inference"], timing["env_step"], 0.0))
    finally:
        venv.close()


def _measure_envpool(spec: SteppingSpec, policy: _Policy, profile: dict) -> list[float]:
    import envpool

    venv = envpool.make(_envpool_id(spec.env), env_type="gymnasium", num_envs=spec.n_envs, seed=spec.seed,
                        num_threads=spec.n_workers)
    try:
        obs, _ = venv.reset()
        timing = {"inference": 0.0, "env_step": 0.0}
        step_once = _batched_loop(lambda a: venv.step(np.asarray(a, dtype=np.int32))[0], policy, obs, timing)
        return _time_windows(spec, step_once, profile, lambda: (timing["inference"], timing["env_step"], 0.0))
    finally:
        venv.close()


def _measure_ale_vector(spec: SteppingSpec, policy: _Policy, profile: dict) -> list[float]:
    """ALE's C++ vector env (PAAC's ``stepping="ale-vector"``) on n_w threads of this process, with
    gymnasium's preprocessing choices (the ones it can do: INTER_AREA, the first frame repeated)."""
    from replaybench.impl.rl.common.ale_vector import AleVectorEnv

    with AleVectorEnv(spec.env, spec.n_envs, spec.n_workers, seed=spec.seed) as venv:
        obs = venv.reset()
        timing = {"inference": 0.0, "env_step": 0.0}
        step_once = _batched_loop(lambda a: venv.step(a)[0], policy, obs, timing)
        return _time_windows(spec, step_once, profile, lambda: (timing["inference"], timing["env_step"], 0.0))


def measure_stepping(spec: SteppingSpec) -> tuple[list[float], dict]:
    """Run one stepping cell: ``(env steps/s per window, profile {section: us per env step})``.

    Raises whatever the method raises (WorkerFailed, ImportError ...); every process it started
    has exited by then."""
    profile = {name: 0.0 for name in PROFILE}
    if spec.method == "per-env":
        walls = _measure_per_env(spec, profile)
    else:
        policy = _Policy(spec.env, spec.overrides)
        measure = {"paac": _measure_paac, "paac-halves": _measure_paac, "gym-sync": _measure_gym,
                   "gym-async": _measure_gym, "envpool": _measure_envpool,
                   "ale-vector": _measure_ale_vector}[spec.method]
        walls = measure(spec, policy, profile)
    per_window = spec.vector_steps * spec.n_envs
    total_steps = per_window * len(walls)
    profile["sync"] = max(0.0, profile["sync"])  # the workers' mean busy time may exceed a fast master's wait
    profile["other"] = max(0.0, sum(walls) - sum(profile.values()))
    return [per_window / w for w in walls], {k: v / total_steps * 1e6 for k, v in profile.items()}


# ------------------------------------------------------------------------------------------ cells
def _env_problem(env_id: str) -> str | None:
    """None when ``env_id`` can be made here, else why not."""
    from replaybench.impl.rl import ConfigError
    from replaybench.impl.rl.common.envs import make_env

    try:
        make_env(env_id).close()
    except ConfigError as err:
        return str(err)
    return None


def _valid(method: str, n_envs: int, n_workers: int) -> bool:
    """Whether ``method`` can run n_e envs over n_w workers (0: in the measuring process;
    EnvPool and ALE's vector env need a thread)."""
    if method == "paac-halves":
        return n_envs >= 2 and n_workers <= n_envs // 2
    return (1 if method in ("envpool", "ale-vector") else 0) <= n_workers <= n_envs


def _ale_vector_problem(env_id: str) -> str | None:
    """None when ALE's vector env can step ``env_id`` here, else why not."""
    from replaybench.impl.rl import ConfigError
    from replaybench.impl.rl.common.ale_vector import ale_game

    try:
        ale_game(env_id)
    except ConfigError as err:
        return str(err)
    return None


def _ints(block: dict, key: str, where: str, low: int = 1) -> list[int]:
    values = block.get(key)
    if not isinstance(values, list) or not values or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= low for v in values):
        raise SelectionError(f"{where}: '{key}' must be a list of integers >= {low}, got {values!r}")
    return values


def _stepping_cells(suite: dict, block: dict, envpool_problem: str | None) -> list[Cell]:
    where = f"suite {suite['name']!r}, stepping block {block.get('env')!r}"
    env = block.get("env")
    if not isinstance(env, str):
        raise SelectionError(f"{where}: 'env' must be an environment id")
    methods = block.get("methods", list(METHODS))
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        raise SelectionError(f"{where}: unknown methods {unknown}; known: {list(METHODS)}")
    n_envs, n_workers = _ints(block, "n_envs", where), _ints(block, "n_workers", where, low=0)
    steps, repeats = (_ints({k: [block.get(k)]}, k, where)[0] for k in ("steps", "repeats"))
    overrides = dict(block.get("overrides") or {})
    env_problem = _env_problem(env)
    cells = []
    for method in methods:
        for n_e in n_envs:
            for n_w in ([0 if method == "gym-sync" else n_e] if method in NO_WORKER_AXIS else n_workers):
                if method not in NO_WORKER_AXIS and not _valid(method, n_e, n_w):
                    continue
                spec = SteppingSpec(env, method, n_e, n_w, steps, repeats, overrides)
                columns = {"stepping": method, "structure": "batched" if method in BATCHED else "per-env",
                           "policy": "none", "op": "step", "metric": "env_steps_per_s", "unit": "steps/s",
                           "algo": "a2c", "env": env, "mode": "processes", "batch": n_e, "actors": n_w,
                           "params": {"n_envs": n_e, "n_workers": n_w, "steps": spec.vector_steps * n_e,
                                      **({"overrides": overrides} if overrides else {})}}
                skip = env_problem or (envpool_problem if method == "envpool" else None) \
                    or (_ale_vector_problem(env) if method == "ale-vector" else None)
                cells.append(Cell(f"{env} {method} n_e={n_e} n_w={n_w}", columns, spec, skip=skip or "",
                                  skip_status="unavailable"))
    return cells


def _training_cells(suite: dict, section: dict) -> list[Cell]:
    from replaybench.bench.scenarios.training import run_base
    from replaybench.impl.rl import TrainConfig

    where = f"suite {suite['name']!r}, training"
    cells = []
    for run in section.get("runs", []):
        for seed in section.get("seeds", [0]):
            cfg = TrainConfig(algo=run["algo"], env=section["env"], actors=run.get("actors", 0),
                              learners=run.get("learners", 0), envs_per_actor=run.get("envs_per_actor", 1),
                              steps=run.get("steps", section["steps"]), seed=seed, stop_at_threshold=True,
                              overrides={k: tuple(v) if isinstance(v, list) else v
                                         for k, v in (run.get("overrides") or {}).items()},
                              timeout_s=section.get("timeout_s"))
            label = f"{run['label']} {section['env']} seed={seed}"
            try:
                acfg = cfg.validate()
            except ValueError as err:
                raise SelectionError(f"{where}: run {label}: {err}") from None
            columns = {**run_base(cfg, acfg, {}), "scenario": "paac", "variant": run["label"], "op": "summary",
                       "metric": "time_to_threshold_s", "unit": "s"}
            cells.append(Cell(label, columns, cfg))
    return cells


def _name(cell: Cell) -> str:
    """What ``--variants`` selects a cell by: its stepping method, or its training run's label."""
    return cell.columns.get("stepping") or cell.columns["variant"]


class PaacBench(Scenario):
    """Stepping throughput, its profile, and time to threshold (see the module docstring)."""

    name = "paac"
    suite_keys = frozenset({"stepping", "training"})
    takes = frozenset({"variants"})
    unit = "cell"

    def cells(self, suite: dict, selection: Selection) -> list[Cell]:
        if not suite.get("stepping") and not suite.get("training"):
            raise SelectionError(f"suite {suite['name']!r}: needs a 'stepping' list and/or a 'training' section")
        envpool_problem = envpool_status()
        cells = []
        for block in suite.get("stepping") or []:
            cells += _stepping_cells(suite, block, envpool_problem)
        if suite.get("training"):
            try:
                cells += _training_cells(suite, suite["training"])
            except KeyError as err:
                raise SelectionError(f"suite {suite['name']!r}: training lacks {err.args[0]!r}") from None
        if selection.variants:  # --variants names stepping methods and training runs' labels
            known = {_name(c) for c in cells}
            if set(selection.variants) - known:
                raise SelectionError(f"--variants: {sorted(set(selection.variants) - known)} not in this suite; "
                                     f"it has {sorted(known)}")
            cells = [c for c in cells if _name(c) in selection.variants]
        return cells

    def meta(self, suite: dict, selection: Selection, cells: list[Cell]) -> dict:
        import gymnasium

        try:
            import envpool
            envpool_version = envpool.__version__
        except Exception:
            envpool_version = None
        return {"envpool": envpool_version or envpool_status(), "gymnasium": gymnasium.__version__,
                "timing": "stepping: perf_counter around windows of env steps after a warm-up window, one venv "
                          "per cell; training: wall-clock from the first env step to the threshold"}

    def measure(self, cell: Cell, run: RunState) -> list[dict]:
        spec = cell.spec
        if isinstance(spec, SteppingSpec):
            rates, profile = measure_stepping(spec)
            rows = [cell.row("ok", value=rate, repeat=i, env_steps=spec.vector_steps * spec.n_envs)
                    for i, rate in enumerate(rates)]
            rows += [cell.row("ok", op="profile", metric=name, value=value, unit="us/step", repeat=0)
                     for name, value in profile.items()]
            return rows
        from replaybench.bench.scenarios.training import EpisodeRows, ProgressBar, result_rows
        from replaybench.impl.rl import train

        bar = ProgressBar(spec.steps, cell.label, run.progress, bar=run.bar if run.cells > 1 else None)
        episodes = EpisodeRows(run.write, cell.columns, then=bar)
        try:
            result = train(spec, episodes)
        finally:
            bar.close()
        return result_rows(result, cell.columns, first_episode=episodes.written)

    def summarize(self, rows: list[dict], meta: dict) -> str:
        from replaybench.bench.summary import format_table

        from replaybench.bench.contract import params_of

        groups: dict[tuple, list[float]] = {}
        other = []
        for r in rows:
            if r["op"] == "step" and r["status"] == "ok":
                p = params_of(r["params"])
                groups.setdefault((r["env"], r["stepping"], p.get("n_envs"), p.get("n_workers")), []).append(r["value"])
            elif r["op"] == "summary" and r["metric"] in ("time_to_threshold_s", "env_steps_per_s"):
                other.append([r["variant"], r["env"], str(r["seed"]), r["metric"],
                              "-" if r.get("value") is None else f"{r['value']:.4g}", r["status"]])
            elif r["status"] not in ("ok", "skipped"):
                other.append([r.get("stepping") or r["variant"], r["env"], "-", r["metric"], "-",
                              f"{r['status']}: {(r['error'] or '')[:80]}"])
        body = [[env, method, str(n_e), str(n_w), f"{float(np.median(v)):.0f}", f"{min(v):.0f}-{max(v):.0f}"]
                for (env, method, n_e, n_w), v in sorted(groups.items(), key=lambda kv: tuple(map(str, kv[0])))]
        text = "\n".join(format_table(["env", "method", "n_e", "n_w", "steps/s", "range"], body, {2, 3, 4}))
        if other:
            text += "\n\n" + "\n".join(format_table(["run", "env", "seed", "metric", "value", "status"], other, {4}))
        return text


SCENARIO = PaacBench()
