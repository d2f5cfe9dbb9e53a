"""The sequential baseline: one process acts, stores, samples, learns and writes priorities back.

    for t in range(steps):
        a = actor.act(obs, t)                        # inference
        obs', r, done = env.step(a)                  # env_step
        stage (obs, a, r, obs', done)                # every insert_batch steps: buffer.add (replay)
        while updates < ratio * (t - learning_starts):
            batch = buffer.sample(B)                 # replay
            loss, prio = learner.learn(batch)        # sgd
            buffer.update_priorities(idx, prio)      # replay

The actor shares the learner's network, so it always acts with the newest weights. The
buffer is any registered variant (``registry.create``), in process memory, without locks.
The clock starts at the first env step, after the buffer's kernels are warmed up.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from . import algorithms
from .config import InjectedFailure, TrainConfig, TrainResult, allowed_updates
from .envs import EpisodeLog, TransitionStager, make_env, transition_fields
from .profiler import SectionProfiler
from .replay import make_local_buffer, warm_up

__all__ = ["run_sequential"]

PROGRESS_EVERY_S = 0.25


def run_sequential(cfg: TrainConfig, progress=None) -> TrainResult:
    """Run ``cfg`` in this process; ``progress(env_steps, updates, recent_mean_return)`` is
    called about every 0.25 s. Raises InjectedFailure (test hook) or TimeoutError."""
    torch.set_num_threads(1)
    algo = algorithms.get(cfg.algo)
    acfg = cfg.algo_config()
    env = make_env(cfg.env, cfg.seed)
    spaces = (env.observation_space, env.action_space)
    fields = transition_fields(env)
    buf = make_local_buffer(cfg, acfg, fields)
    warm_up(cfg, acfg, fields)
    learner = algo.learner_cls(spaces, acfg, cfg.seed)
    actor = algo.actor_cls(spaces, acfg, cfg.seed + 1, net=learner.policy_net)
    stage = TransitionStager(fields, cfg.insert_batch)
    log = EpisodeLog(cfg.resolved_threshold(), cfg.window)
    fail_at = cfg.failure_point("sequential", 0)
    ratio, starts, batch_size = acfg.updates_per_step, acfg.learning_starts, acfg.batch_size

    prof = SectionProfiler()
    inference, env_step, replay, sgd = (prof.section(s) for s in ("inference", "env_step", "replay", "sgd"))
    updates = 0
    sample_s = 0.0
    episode_return = 0.0
    with env_step:
        obs, _ = env.reset(seed=cfg.seed)
    t0 = time.perf_counter()
    prof.restart()
    next_report = t0 + PROGRESS_EVERY_S
    steps = 0
    try:
        for t in range(cfg.steps):
            with inference:
                action = actor.act(obs, t)
            with env_step:
                next_obs, reward, terminated, truncated, _ = env.step(actor.env_action(action))
            full = stage.push(obs, action, reward, next_obs, terminated, 0)
            steps = t + 1
            episode_return += float(reward)
            if terminated or truncated:
                log.record(steps, time.perf_counter() - t0, episode_return)
                episode_return = 0.0
                with env_step:
                    obs, _ = env.reset()
            else:
                obs = next_obs

            if full or steps == cfg.steps:
                with replay:
                    buf.add(stage.batch())
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

            if fail_at is not None and steps >= fail_at:
                raise InjectedFailure(f"sequential loop: injected failure at env step {steps}")
            if (steps & 63) == 0:
                now = time.perf_counter()
                if now >= next_report:
                    next_report = now + PROGRESS_EVERY_S
                    if progress is not None:
                        progress(steps, updates, log.recent_mean())
                    if cfg.timeout_s is not None and now - t0 > cfg.timeout_s:
                        raise TimeoutError(f"sequential run passed its {cfg.timeout_s} s limit at step {steps}")
            if cfg.stop_at_threshold and log.reached:
                break
        wall = time.perf_counter() - t0
        if progress is not None:
            progress(steps, updates, log.recent_mean())
        final = buf.sample(min(1024, len(buf)), beta=1.0)
    finally:
        env.close()

    return TrainResult(
        mode="sequential", env_steps=steps, updates=updates, wall_s=wall, episodes=log.episodes,
        threshold=log.threshold, window=log.window, time_to_threshold_s=log.time_to_threshold_s,
        steps_to_threshold=log.steps_to_threshold, sample_calls=updates,
        sample_latency_s=sample_s / updates if updates else None, actor_wait_s=0.0, learner_wait_s=0.0,
        profiles={"sequential": prof.breakdown(wall)}, processes={"sequential": 1}, buffer_lock_wait_s=None,
        learner_digests=[learner.digest()], actor_steps=[steps], actor_ids_sampled={0: updates * batch_size},
        inserted=steps, final_weight_min=float(np.min(final["weights"])))
