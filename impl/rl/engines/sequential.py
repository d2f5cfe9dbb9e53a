"""The sequential baseline: one process acts, stores, samples, learns and writes priorities back.

    for t in range(0, steps, E):
        runner.step(t)      # EnvRunner: one batched forward for E envs (inference), E env.step
                            # (env_step), stage E rows, log episodes
        every ~insert_batch rows: buffer.add(staged rows)                            # replay
        while updates < ratio * (t - learning_starts):
            batch = buffer.sample(B)                 # replay
            loss, prio = learner.learn(batch)        # sgd
            buffer.update_priorities(idx, prio)      # replay

On the CPU (``TrainConfig.device``) the actor shares the learner's network, so it always acts
with the newest weights; on another device it runs a CPU copy loaded every
``weight_sync_every`` updates, as a parallel actor does. With
``envs_per_actor`` = E it steps E environments per forward, like each parallel actor does, so
the two loops compare at the same E. Seeds come from :class:`~impl.rl.common.seeding.RunSeeds` (this
loop is actor 0 and learner 0). The
buffer is any registered variant (``registry.create``), in process memory, without locks.
The clock starts at the first env step, after the buffer's kernels are warmed up.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np
import torch
from replaybench.impl.rl import algorithms
from replaybench.impl.rl.algorithms.base import LEARNER_FIELDS
from replaybench.impl.rl.common.deadline import alarm_at
from replaybench.impl.rl.common.envs import (
    EnvRunner,
    EpisodeLog,
    TransitionStager,
    make_env,
    stage_rows,
    transition_fields,
)
from replaybench.impl.rl.common.device import resolve_device, warm_up_learner
from replaybench.impl.rl.common.errors import InjectedFailure
from replaybench.impl.rl.common.local_replay import make_local_buffer, warm_up
from replaybench.impl.rl.common.processes import PROGRESS_EVERY_S
from replaybench.impl.rl.common.profiler import SectionProfiler
from replaybench.impl.rl.common.result import TrainResult, allowed_updates, smallest_weight
from replaybench.impl.rl.common.seeding import RunSeeds
from replaybench.impl.rl.common.snapshots import SnapshotLog

if TYPE_CHECKING:  # the config module imports the engines to check a run against them
    from replaybench.impl.rl.config import TrainConfig

__all__ = ["run_sequential"]



def run_sequential(cfg: TrainConfig, progress=None) -> TrainResult:
    """Run ``cfg`` in this process; ``progress(env_steps, updates, recent_mean_return,
    episodes)`` is called about every 0.25 s (see :func:`~impl.rl.train`). Raises ConfigError
    (a bad ``cfg``, before any work), InjectedFailure (test hook) or TimeoutError past
    ``cfg.timeout_s`` counted from the first env step (after the set-up and the buffer's
    warm-up, as the process engine counts from "go"): checked between steps, and an env step or update
    that does not return by then is interrupted (:func:`~impl.rl.common.deadline.alarm_at`,
    on the main thread); the envs are closed either way."""
    acfg = cfg.validate()
    torch.set_num_threads(1)
    algo = algorithms.get(cfg.algo)
    seeds = RunSeeds(cfg.seed)
    actor_seeds = seeds.actor(0)
    n_envs = cfg.envs_per_actor
    envs = [make_env(cfg.env, algo) for _ in range(n_envs)]
    env = envs[0]
    spaces = (env.observation_space, env.action_space)
    fields = transition_fields(env)
    buf = make_local_buffer(cfg, acfg, fields, seeds.buffer)
    warm_up(cfg, acfg, fields)
    device = resolve_device(cfg.device)
    template = buf.sample_out(acfg.batch_size)
    warmup_s = warm_up_learner(algo.learner_cls, spaces, acfg, seeds.networks, device,
                               {f: np.zeros_like(template[f]) for f in LEARNER_FIELDS})
    learner = algo.learner_cls(spaces, acfg, seeds.networks, device=device)
    shared = device.type == "cpu"  # the actor runs the learner's network itself, else a CPU copy of it
    actor = algo.actor_cls(spaces, acfg, actor_seeds.explore, net=learner.policy_net if shared else None)
    if not shared:
        actor.set_flat_weights(learner.get_flat_weights())
    log = EpisodeLog(cfg.resolved_threshold(), cfg.window)
    prof = SectionProfiler()
    runner = EnvRunner(envs, actor, TransitionStager(fields, stage_rows(cfg.insert_batch, n_envs)), 0, prof,
                       lambda steps, ret: log.record(steps, time.perf_counter() - t0, ret))
    fail_at = cfg.failure_point("sequential", 0)
    ratio, starts, batch_size = acfg.updates_per_step, acfg.learning_starts, acfg.batch_size

    replay, sgd = prof.section("replay"), prof.section("sgd")
    snaps = SnapshotLog(cfg.snapshot_every)
    updates = 0
    sample_s = 0.0
    runner.reset([actor_seeds.env_seed(j) for j in range(n_envs)])
    t0 = time.perf_counter()
    # the limit counts from the first step, as the process engine's from "go"
    deadline = None if cfg.timeout_s is None else time.monotonic() + cfg.timeout_s
    prof.restart()
    next_report = t0 + PROGRESS_EVERY_S
    steps = 0
    reported = 0
    try:
        with alarm_at(deadline, f"sequential run ({cfg.timeout_s} s limit)"):  # a step that never returns
            for t in range(0, cfg.steps, n_envs):
                full = runner.step(t, min(n_envs, cfg.steps - t))
                steps = min(t + n_envs, cfg.steps)
                if full or steps == cfg.steps:
                    with replay:
                        buf.add(runner.stage.batch())
                    due = allowed_updates(steps, ratio, starts)
                    while updates < due:
                        with replay:
                            s0 = time.perf_counter()
                            batch = buf.sample(batch_size, beta=acfg.beta(steps))
                            sample_s += time.perf_counter() - s0
                        with sgd:
                            _, priorities = learner.learn(batch)
                        with replay:
                            buf.update_priorities(batch["indices"], priorities)
                        updates += 1
                        if snaps.due(updates):  # a copy of the weights, inside the run's time
                            snaps.take(time.perf_counter() - t0, steps, updates, learner.get_flat_weights())
                        if not shared and updates % cfg.weight_sync_every == 0:
                            with sgd:  # one device-to-host copy of the policy
                                actor.set_flat_weights(learner.get_flat_weights())

                if fail_at is not None and steps >= fail_at:
                    raise InjectedFailure(f"sequential loop: injected failure at env step {steps}")
                if steps - reported >= 64:
                    reported = steps
                    now = time.perf_counter()
                    if now >= next_report:
                        next_report = now + PROGRESS_EVERY_S
                        if progress is not None:
                            progress(steps, updates, log.recent_mean(), log.episodes)
                        if deadline is not None and time.monotonic() > deadline:
                            raise TimeoutError(f"sequential run passed its {cfg.timeout_s} s limit at step {steps}")
                if cfg.stop_at_threshold and log.reached:
                    break
        wall = time.perf_counter() - t0
        if cfg.snapshot_every:
            snaps.take(wall, steps, updates, learner.get_flat_weights())
        if progress is not None:
            progress(steps, updates, log.recent_mean(), log.episodes)
        final = buf.sample(min(1024, len(buf)), beta=1.0)
    finally:
        for e in envs:
            e.close()

    return TrainResult(
        engine="sequential", env_steps=steps, updates=updates, wall_s=wall, episodes=log.episodes,
        threshold=log.threshold, window=log.window, time_to_threshold_s=log.time_to_threshold_s,
        steps_to_threshold=log.steps_to_threshold, sample_calls=updates,
        sample_latency_s=sample_s / updates if updates else None, actor_wait_s=0.0, learner_wait_s=0.0,
        profiles={"sequential": prof.breakdown(wall)}, processes={"sequential": 1}, buffer_lock_wait_s=None,
        learner_digests=[learner.digest()], actor_steps=[steps], actor_ids_sampled={0: updates * batch_size},
        inserted=steps, final_weight_min=smallest_weight(final["weights"]), warmup_s=warmup_s,
        snapshots=snaps.snapshots)
