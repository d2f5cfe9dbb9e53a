"""The training loop's actor side as a static dataflow (``replaybench train --backend dataflow``).

Topology, declared before the first step::

    parent ── the process backend's lifecycle (:func:`~impl.rl.engines.process.run_workers`): shared
       │      buffer, counters, weights, monitor, shutdown
       ├── server (one process)   ONE batched policy forward for all A x E environments per lock
       │     step; stages the step's A x E transitions and inserts them into the shared
       │     prioritized buffer (its concurrency policy, the samples-per-insert rate limit and
       │     the weight refresh exactly as a process-backend actor does)
       │       └── env workers (A processes, :class:`~impl.rl.common.stepping.SharedVectorEnv`)
       │             worker w steps environments w*E .. (w+1)*E - 1 in place in shared memory
       └── learner r (L of them)  the process backend's learner loop, unchanged

Where the process backend runs A actor processes, each with its own copy of the policy and
one forward of E rows per step, this runs one server with one forward of A x E rows per step
and A processes that only step environments; the two backends share everything else (the
buffer, :class:`~impl.rl.common.shared_state.RateLimiter`, :class:`~impl.rl.common.shared_state.SharedWeights`, the
learners, the episode log, the result), so a difference in throughput is the actor side's.
A lock step costs one 1-byte pipe write and read per env worker each way; no transition is
pickled: observations and actions stay in the env workers' shared block, transitions go from
the server's stage straight into the buffer's shared memory.

Semantics, as the process backend's: ``cfg.steps`` env steps in total, inserted in adds of
:func:`~impl.rl.common.envs.stage_rows` ``(insert_batch, A x E)`` rows (whole lock steps); the
transitions of env worker w carry actor id w, and ``TrainResult.actor_steps[w]`` counts them
(the server is the single writer of every actor slot of :class:`~impl.rl.common.shared_state.SharedState`);
exploration follows the run's env steps; learners do exactly
:func:`~impl.rl.config.total_updates` updates. The last lock step may step more environments
than the run still owes: only the first ``steps`` transitions are stored and logged.

Seeds (:class:`~impl.rl.common.seeding.RunSeeds`): the server explores with actor 0's stream and
attaches to the buffer with actor 0's handle seed; environment ``i`` is reset first with
``RunSeeds.actor(0).env + i`` (SharedVectorEnv's ``seed + i`` rule), so the environments' seeds
depend on the run's seed and ``i`` only.

Exit paths are the process backend's (:mod:`impl.rl.engines.process`), plus the env workers: the
server reports their pids with "ready", so they count among the run's workers (in
``TrainResult.worker_pids`` and ``WorkerFailed.pids``); an env worker that raises or dies
makes the server's next lock step raise WorkerFailed naming it, which the server reports as
its own error; a server that stops (another worker failed, a timeout, Ctrl-C) closes its env
workers in a ``finally``, and one that is killed closes their command pipes by dying, so they
read end-of-file and exit. At the run's time limit (``timeout_s`` from "go", as the parent
counts it) the server's wait for a lock step ends whatever the env workers do, and one stuck
in a step is terminated; a SIGTERM from the parent (a stop the server could not see while it
waited) unwinds through the same ``finally``. Either way the server exits by itself, and its
multiprocessing helpers (fork server, resource tracker, their /tmp/pymp-* folder) go with it.
"""

from __future__ import annotations

import dataclasses
import signal
import time
from typing import TYPE_CHECKING

import numpy as np
from replaybench.impl.rl import algorithms
from replaybench.impl.rl.common.envs import (
    TransitionStager,
    make_env,
    stage_rows,
    transition_fields,
)
from replaybench.impl.rl.common.episode_outbox import EpisodeOutbox
from replaybench.impl.rl.common.errors import ConfigError, InjectedFailure
from replaybench.impl.rl.common.profiler import SECTIONS, SectionProfiler
from replaybench.impl.rl.common.result import TrainResult
from replaybench.impl.rl.common.seeding import RunSeeds
from replaybench.impl.rl.common.shared_state import (
    RateLimiter,
    SharedState,
    SharedWeights,
    Stopped,
)
from replaybench.impl.rl.engines.process import (
    STARTUP_TIMEOUT_S,
    Role,
    run_workers,
    worker_result,
)

if TYPE_CHECKING:  # the config module imports the engines to check a run against them
    from replaybench.impl.rl.config import TrainConfig

__all__ = ["run_dataflow"]


def _server_loop(cfg: TrainConfig, rank: int, buf, state: SharedState, weights: SharedWeights, out) -> dict:
    """The server process: the env workers, the batched policy, the stage, the inserts."""
    from replaybench.impl.rl.common.stepping import SharedVectorEnv

    algo = algorithms.get(cfg.algo)
    acfg = cfg.algo_config()
    seeds = RunSeeds(cfg.seed).actor(0)
    n_envs = cfg.actors * cfg.envs_per_actor
    probe = make_env(cfg.env, algo)
    spaces = (probe.observation_space, probe.action_space)
    fields = transition_fields(probe)
    probe.close()
    actor = algo.actor_cls(spaces, acfg, seeds.explore)
    discrete = algo.action_kind == "discrete"  # env_action is the identity: no per-row call
    rows = stage_rows(cfg.insert_batch, n_envs)
    stage = TransitionStager(fields, rows)
    limiter = RateLimiter(state, acfg.updates_per_step, acfg.learning_starts, cfg.ratio_tolerance, rows)
    fail_at = cfg.failure_point("server", rank)
    prof = SectionProfiler()
    inference, env_step, replay = prof.section("inference"), prof.section("env_step"), prof.section("replay")
    buf.warm_up()
    outbox = EpisodeOutbox(out)
    # half the parent's start-up limit: env workers that do not start fail the server, which says why
    venv = SharedVectorEnv(cfg.env, n_envs, cfg.actors, seed=seeds.env, start_method=cfg.start_method,
                           timeout_s=STARTUP_TIMEOUT_S / 2)
    # the parent's SIGTERM (a stop it did not see in time: Ctrl-C while the env workers hang)
    # unwinds through the finally below, so the env workers are closed and this process exits
    # by itself, its multiprocessing helpers with it
    signal.signal(signal.SIGTERM, _terminated)
    try:
        owner = np.repeat(np.arange(cfg.actors, dtype=np.int32), venv.envs_per_worker)  # env -> its worker
        obs = np.array(venv.reset(), dtype=np.float32)
        next_obs = np.empty_like(obs)
        out.put(("ready", f"server-{rank}", venv.worker_pids))
        t0 = state.wait_for_go()
        if cfg.timeout_s is not None:  # the parent's limit, counted from the same "go": a hung env worker
            venv.deadline = t0 + cfg.timeout_s  # ends the wait here, and is terminated by venv.close
        prof.restart()
        busy0 = venv.worker_busy_s  # the first reset's: before the clock

        have_version, weight_loads, done = 0, 0, 0
        while done < cfg.steps:
            if stage.n == 0:  # start of an insert: hold the ratio, refresh the policy, send due episodes
                outbox.poll()
                prof.add("wait", limiter.wait_insert(0, min(rows, cfg.steps - done)))
                if state.stopped:
                    raise Stopped()
                if state.finishing:  # the run reached its threshold: nothing is staged here
                    break
                fresh = weights.read_if_newer(have_version)
                if fresh is not None:
                    have_version = fresh[0]
                    actor.set_flat_weights(fresh[1])
                    weight_loads += 1
            k = min(n_envs, cfg.steps - done)
            with inference:
                actions = actor.act_batch(obs, done)
                env_actions = actions if discrete else np.stack([actor.env_action(a) for a in actions])
            with env_step:  # the env workers step in parallel; the server waits for the slowest
                nxt, rewards, terminated, truncated = venv.step(env_actions)
            next_obs[:] = nxt
            ended = np.flatnonzero(terminated | truncated)
            if ended.size:  # auto-reset: the transition ends in the finished episode's last observation
                next_obs[ended] = venv.final_obs[ended]
            full = stage.push(obs[:k], actions[:k], rewards[:k], next_obs[:k], terminated[:k], owner[:k])
            for i, ret, _ in venv.pop_episodes():
                if i < k:
                    outbox.add(done + i + 1, time.monotonic() - t0, ret)
            obs[:] = nxt
            done += k
            if full or done == cfg.steps:
                with replay:
                    batch = stage.batch()
                    buf.add(batch)
                state.actor_steps[:] += np.bincount(batch["actor"], minlength=cfg.actors)  # after the add
            if fail_at is not None and done >= fail_at:
                raise InjectedFailure(f"server {rank}: injected failure at env step {done}")
        end = time.monotonic() - t0
        return {"role": "server", "rank": rank, "steps": done, "end_s": end, "profile": prof.breakdown(),
                "wait_s": float(state.actor_wait.sum()), "lock_wait_s": buf.lock_wait_seconds,
                "weight_loads": weight_loads, "worker_steps": state.actor_steps.tolist(),
                "worker_busy_s": (venv.worker_busy_s - busy0).tolist()}
    finally:
        try:
            outbox.flush()  # every exit, an error's or a stop's too: the parent gets each finished episode
        finally:
            venv.close(join_s=_ENV_WORKER_JOIN_S)


#: How long the server's close waits for its env workers to exit by themselves before it
#: terminates them: short, so that it ends within the parent's grace (a worker stuck in a step
#: never reads its pipe); an idle worker exits at once.
_ENV_WORKER_JOIN_S = 0.5


def _terminated(signum, frame):
    raise SystemExit(f"server terminated by signal {signum}")


def check(cfg: TrainConfig, acfg) -> None:
    """The dataflow engine's own limit: it has no actor processes (its roles are "server" and
    "learner"), so a failure hook naming "actor" is refused. Raises ConfigError."""
    if cfg.fail is not None and cfg.fail.split(":")[0] == "actor":
        raise ConfigError("fail", cfg.fail, f"backend 'dataflow' has no actor processes (its roles: "
                                            f"'server', 'learner'), got fail={cfg.fail!r}")


def run_dataflow(cfg: TrainConfig, progress=None) -> TrainResult:
    """Run ``cfg`` (``backend="dataflow"``): one server process, ``cfg.actors`` env worker
    processes stepping ``cfg.envs_per_actor`` environments each, ``cfg.learners`` learner
    processes (module docstring).

    ``progress(env_steps, updates, recent_mean_return, episodes)`` (see :func:`~impl.rl.train`) is
    called about every 0.25 s. Raises
    ConfigError for a bad ``cfg`` before any process starts; WorkerFailed (worker "server-0"
    for an env worker's failure, with its traceback) as :func:`~impl.rl.engines.process.run_parallel`
    does; every process has exited and the shared buffer is unlinked by then.

    The result is the process engine's with engine "dataflow": role "actor" of ``profiles`` and
    ``processes`` is the server (the one process that acts), role "env_worker" the env workers
    (their ``env_step`` seconds are the time they spent stepping; ``other`` the rest of the
    wall time, mostly waiting for the next lock step), and ``actor_steps`` counts per env worker.
    """
    acfg = cfg.validate()
    if cfg.backend != "dataflow":
        raise ConfigError("backend", cfg.backend, f"run_dataflow runs backend 'dataflow', got {cfg.backend!r}")
    run = run_workers(cfg, acfg, Role("server", 1, _server_loop, daemon=False), progress)
    server = run.stats["server-0"]
    # the server is the loop's one acting process: the process backend's assembly with it as actor 0
    stats = {"actor-0": server, **{f"learner-{r}": run.stats[f"learner-{r}"] for r in range(cfg.learners)}}
    result = worker_result(dataclasses.replace(cfg, actors=1), acfg, stats, run.log, run.final, run.inserted,
                     run.lock_wait_s)
    busy = server["worker_busy_s"]
    env_worker = {name: 0.0 for name in SECTIONS}
    env_worker["env_step"] = float(sum(busy))
    env_worker["other"] = max(0.0, len(busy) * result.wall_s - env_worker["env_step"])
    return dataclasses.replace(result, engine="dataflow", actor_steps=server["worker_steps"],
                               profiles={**result.profiles, "env_worker": env_worker},
                               processes={**result.processes, "env_worker": cfg.actors}, worker_pids=run.pids)
