"""PAAC: one learner, ``n_envs`` environments over ``n_workers`` processes, A2C updates.

    master (this process)                                  n_workers stepping processes
      venv = SharedVectorEnv(env, n_envs, n_workers)  ──►  make their envs, reset seed + i
      obs = venv.reset()
      loop until cfg.steps env steps:
        for t in range(t_max):                             (collect)
          actions = learner.act(obs)       inference: ONE forward pass for all n_envs states
          obs, r, term, trunc = venv.step(actions)  ─►     each steps its slice in place
        learner.update(rollout)            sgd: one A2C update on the t_max x n_envs batch
        episodes -> EpisodeLog (time and steps to the threshold)

The algorithm and its settings are :mod:`impl.rl.algorithms.a2c` (``A2CConfig.for_env(env, **overrides)``
through :meth:`TrainConfig.algo_config`); the processes and the shared memory are
:class:`~impl.rl.common.stepping.SharedVectorEnv`. Runs through :func:`impl.rl.train` with
``TrainConfig(algo="a2c", ...)``; its replay fields (buffer, policy, actors, learners,
insert_batch, weight_sync_every) do not apply.

Stepping backends (``A2CConfig.stepping``): "shared", the SharedVectorEnv above (any
environment, halves); "ale-vector", ALE's C++ vector env (:mod:`impl.rl.common.ale_vector`:
Atari only, ``max(1, n_workers)`` threads in this process, no halves, INTER_AREA resize only,
no ``reset_stack="noop"``). Atari preprocessing follows ``A2CConfig.resize`` and
``reset_stack`` (:mod:`impl.rl.common.atari`).

Counting: ``cfg.steps`` is rounded up to whole rollouts (``n_envs * t_max`` env steps each).
An episode is logged when the rollout it ended in is done (its env steps and wall time are
those of that rollout's end: at most one rollout late). Seeds: environment ``i`` starts from
``RunSeeds(seed).actor(0).env + i``; the network and the action draws from
``RunSeeds(seed).networks``. Stepping is the same for any ``n_workers`` (bit for bit); the
learner's arithmetic may not be across machines (torch's thread count follows the cores) or
with halves (its inference gets the cores the workers leave).

The learner, its batched inference included, computes on ``TrainConfig.device``
(:mod:`impl.rl.common.device`): off the CPU each inference copies the observations to the
device and the logits and values back, each update the rollout there and its statistics back.
A checkpoint resumes on any device.

Exit paths are the SharedVectorEnv's: a worker that fails raises WorkerFailed here after every
process has exited; Ctrl-C or a timeout closes the workers on the way out.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

import torch
from replaybench.impl.machine import usable_cores
from replaybench.impl.rl.algorithms.a2c import A2CConfig, A2CLearner, check_env, collect
from replaybench.impl.rl.common import checkpoint
from replaybench.impl.rl.common.deadline import alarm_at
from replaybench.impl.rl.common.ale_vector import AleVectorEnv, ale_game, check_options
from replaybench.impl.rl.common.device import resolve_device
from replaybench.impl.rl.common.envs import EpisodeLog
from replaybench.impl.rl.common.errors import ConfigError
from replaybench.impl.rl.common.processes import PROGRESS_EVERY_S
from replaybench.impl.rl.common.profiler import SectionProfiler
from replaybench.impl.rl.common.result import TrainResult
from replaybench.impl.rl.common.seeding import RunSeeds
from replaybench.impl.rl.common.stepping import SharedVectorEnv

if TYPE_CHECKING:  # the config module imports the engines to check a run against them
    from replaybench.impl.rl.config import TrainConfig

__all__ = ["check", "run_paac"]




def check(cfg: TrainConfig, acfg: A2CConfig) -> None:
    """The PAAC engine's checks, after :meth:`TrainConfig.validate`'s (fields,
    ``n_envs``/``n_workers``/``t_max`` and the other A2C fields as overrides, Discrete
    actions): the network can take the env's observations (``make_network``), and no failure
    hook (``fail``: the replay loops' test hook). Raises ConfigError naming the field. Cost:
    one ``gym.make``; with ``resume``, the checkpoint is read and checked
    (:func:`~impl.rl.common.checkpoint.read_resume`: a file of this project, of this run, with
    fewer steps than ``steps``), one ``torch.load``.
    """
    if cfg.algo != "a2c":
        raise ConfigError("algo", cfg.algo, f"the PAAC loop runs algo 'a2c', got {cfg.algo!r}")
    if cfg.fail is not None:
        raise ConfigError("fail", cfg.fail, "the PAAC loop has no failure hook (test a failing environment instead)")
    if acfg.stepping == "ale-vector":
        ale_game(cfg.env)
        check_options(acfg.atari_options())
        if acfg.halves:
            raise ConfigError("halves", acfg.halves, "stepping 'ale-vector' steps every env per call: halves must be false")
    check_env(cfg.env, acfg)
    if cfg.resume is not None:  # a checkpoint this run can go on from, before any run folder exists
        checkpoint.read_resume(cfg.resume, _run_identity(cfg, acfg), cfg.steps)


#: A2C fields that choose only how fast a run goes: a checkpoint resumes under other values.
_SPEED_FIELDS = ("n_workers", "halves", "stepping", "channels_last", "compile")


def _run_identity(cfg: TrainConfig, acfg: A2CConfig) -> dict:
    """What a checkpoint and the run resuming it must share."""
    settings = {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(acfg).items()
                if k not in _SPEED_FIELDS}
    return {"algo": cfg.algo, "env": cfg.env, "seed": cfg.seed, "a2c": settings}


def _open_stepping(cfg: TrainConfig, acfg: A2CConfig, n_workers: int, seed: int, deadline: float | None):
    """The stepping backend ``acfg.stepping`` names: SharedVectorEnv over ``n_workers`` processes
    (ending every wait on them at ``deadline``), or ALE's vector env on ``max(1, n_workers)``
    threads of this process (one C++ call per step: the run's deadline is checked between
    updates only)."""
    if acfg.stepping == "ale-vector":
        return AleVectorEnv(cfg.env, acfg.n_envs, max(1, n_workers), seed=seed, atari=acfg.atari_options())
    return SharedVectorEnv(cfg.env, acfg.n_envs, n_workers, seed=seed, halves=acfg.halves, atari=acfg.atari_options(),
                           start_method=cfg.start_method, timeout_s=cfg.timeout_s or 120.0, deadline=deadline)


def run_paac(cfg: TrainConfig, progress=None) -> TrainResult:
    """Train A2C on ``cfg.env`` the PAAC way (module docstring) for ``cfg.steps`` env steps.

    ``n_workers`` is capped at :func:`usable_cores` (and the config refuses more than
    ``n_envs``). Torch uses every core for the update and the inference (the workers sleep
    meanwhile), except the inference with halves, which gets the cores the workers leave
    (at least one thread).
    ``progress(env_steps, updates, recent_mean_return, episodes)`` (see :func:`~impl.rl.train`) is
    called about every 0.25 s.
    Checkpoints (:mod:`impl.rl.common.checkpoint`): with ``cfg.checkpoint`` the run's state is
    saved there every ``cfg.checkpoint_every`` env steps (at the first rollout boundary past
    each multiple) and at its end; with ``cfg.resume`` it starts from such a file and runs to
    ``cfg.steps`` in all (more than the checkpoint's, or ConfigError): ``env_steps``,
    ``updates``, ``episodes`` and ``wall_s`` count the whole run, the profiles and the rates
    this call's part (``TrainResult.resumed_*`` say what the checkpoint brought in). Bit for bit with ``n_workers=0`` (the envs'
    state is in the checkpoint), fresh episodes otherwise.
    Raises ConfigError before any process starts (:func:`validate`), WorkerFailed when a
    stepping worker fails, TimeoutError past ``cfg.timeout_s`` counted from the call (after
    :func:`validate`): the stepping checks it before every env step and ends every wait on the
    workers there, and the loop after every update, so a run overshoots it by at most one env
    step or one update (every process stopped by then); an env step in this process that does
    not return (no workers, ALE's threads) is interrupted at it
    (:func:`~impl.rl.common.deadline.alarm_at`, on the main thread).
    """
    acfg = cfg.validate()
    cores = usable_cores()
    n_workers = min(acfg.n_workers, cores)
    # torch's threads: the workers sleep on their pipes while the master infers and updates, so
    # both get every core; with halves the inference overlaps the stepping and gets what is left.
    act_threads = max(1, cores - n_workers) if acfg.halves else cores
    seeds = RunSeeds(cfg.seed)
    log = EpisodeLog(cfg.resolved_threshold(), cfg.window)
    prof = SectionProfiler()
    sgd = prof.section("sgd")
    ckpt = None
    if cfg.resume is not None:
        ckpt = checkpoint.read_resume(cfg.resume, _run_identity(cfg, acfg), cfg.steps)
    # envs come back bit for bit only from in-process stepping; otherwise fresh episodes, seeded
    # apart from the run's first ones
    restore_envs = ckpt is not None and ckpt["envs"] is not None and n_workers == 0 and acfg.stepping == "shared"
    env_seed = seeds.actor(0).env + (ckpt["steps"] if ckpt is not None and not restore_envs else 0)
    threads_before = torch.get_num_threads()
    deadline = None if cfg.timeout_s is None else time.monotonic() + cfg.timeout_s
    steps = 0
    try:
        with _open_stepping(cfg, acfg, n_workers, env_seed, deadline) as venv:
            learner = A2CLearner(venv.single_observation_space, venv.single_action_space, acfg, seeds.networks,
                                 device=resolve_device(cfg.device))
            steps, wall0 = 0, 0.0
            if ckpt is not None:
                learner.load_state_dict(ckpt["learner"])
                steps, wall0 = int(ckpt["steps"]), float(ckpt["wall_s"])
                for row in ckpt["episodes"]:
                    log.record(*row)
            steps0, updates0 = steps, learner.updates  # what the checkpoint brought in
            obs = venv.restore_env_state(ckpt["envs"]) if restore_envs else venv.reset()
            warm0 = time.perf_counter()  # the one-time device work, outside the run's time (A2CLearner.warm_up)
            torch.set_num_threads(cores)
            halves = [len(obs[venv.part_slice(p)]) for p in (0, 1)] if getattr(venv, "halves", False) else None
            learner.warm_up(obs, acfg.t_max, act_sizes=halves)
            warmup_s = time.perf_counter() - warm0
            busy0 = venv.worker_busy_s
            t0 = time.perf_counter() - wall0  # now - t0: wall seconds since the run's first start
            prof.restart()
            next_report = t0
            next_ckpt = steps + cfg.checkpoint_every if cfg.checkpoint_every else None

            def save_checkpoint():
                checkpoint.save(cfg.checkpoint, {
                    "run": _run_identity(cfg, acfg), "steps": steps, "wall_s": time.perf_counter() - t0,
                    "episodes": list(log.episodes), "learner": learner.state_dict(),
                    "envs": venv.env_state() if acfg.stepping == "shared" else None})

            # an env step in this process (no workers, or ALE's threads) that never returns is
            # interrupted; with workers the stepping's own waits end at the deadline (an alarm could
            # land inside its close of the workers)
            in_process = n_workers == 0 or acfg.stepping == "ale-vector"
            with alarm_at(deadline if in_process else None, "the PAAC run"):
                while steps < cfg.steps:
                    torch.set_num_threads(act_threads)
                    rollout, obs = collect(venv, learner, obs, acfg.t_max, prof)
                    with sgd:
                        torch.set_num_threads(cores)
                        learner.update(rollout)
                    steps += rollout.n_steps
                    now = time.perf_counter()
                    for _, ret, _ in venv.pop_episodes():
                        log.record(steps, now - t0, ret)
                    if now >= next_report:
                        next_report = now + PROGRESS_EVERY_S
                        if progress is not None:
                            progress(steps, learner.updates, log.recent_mean(), log.episodes)
                    if deadline is not None and time.monotonic() >= deadline:  # after the update
                        raise TimeoutError("the run's time limit passed after an update")
                    if next_ckpt is not None and steps >= next_ckpt:
                        save_checkpoint()
                        next_ckpt = steps + cfg.checkpoint_every
                    if cfg.stop_at_threshold and log.reached:
                        break
                if cfg.checkpoint is not None:
                    save_checkpoint()
            wall = time.perf_counter() - t0
            busy = venv.worker_busy_s - busy0
            pids, envs_per_worker = venv.worker_pids, venv.envs_per_worker
    except TimeoutError as err:
        raise TimeoutError(f"PAAC run passed its {cfg.timeout_s} s limit (--timeout) at env step {steps}: "
                           f"{err}") from None
    finally:
        torch.set_num_threads(threads_before)  # the caller's setting again, on every exit path
    if progress is not None:
        progress(steps, learner.updates, log.recent_mean(), log.episodes)

    part_wall = wall - wall0  # this call's part of a resumed run: the profiles' and the rates' time
    profiles = {"paac": prof.breakdown(part_wall)}
    processes = {"paac": 1}
    if n_workers and acfg.stepping == "shared":
        # the stepping processes: stepping their envs, else waiting for the master (its inference and update)
        profiles["stepping"] = {"env_step": float(busy.sum()), "inference": 0.0, "replay": 0.0, "sgd": 0.0,
                                "wait": max(0.0, n_workers * part_wall - float(busy.sum())), "other": 0.0}
        processes["stepping"] = n_workers
    per_worker = [steps // acfg.n_envs * n for n in envs_per_worker]
    return TrainResult(
        engine="paac", env_steps=steps, updates=learner.updates, wall_s=wall, episodes=log.episodes,
        threshold=log.threshold, window=log.window, time_to_threshold_s=log.time_to_threshold_s,
        steps_to_threshold=log.steps_to_threshold, sample_calls=0, sample_latency_s=None, actor_wait_s=0.0,
        learner_wait_s=0.0, profiles=profiles, processes=processes, buffer_lock_wait_s=None,
        learner_digests=[learner.digest()], actor_steps=per_worker, actor_ids_sampled={}, inserted=0,
        final_weight_min=None, worker_pids=pids, resumed_steps=steps0, resumed_updates=updates0,
        resumed_wall_s=wall0, warmup_s=warmup_s)

