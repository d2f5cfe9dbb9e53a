"""Time to a good policy: weight snapshots taken during a run, greedy evaluations after it.

A run's "time to threshold" used to be the first time the mean of its last 20 *training*
episodes crossed the threshold: exploration on, and a policy that may fall back after. The
protocol here is the one Tianshou's and PAL's comparisons rest on, made explicit:

1. **Snapshots.** Every ``snapshot_every`` learner updates (and once at the end) the run keeps
   the policy's weights with its wall time, env steps and updates (:class:`SnapshotLog`; a
   flat float32 vector, tens of KB for the MLPs here, copied at the update's end).
2. **Greedy evaluation, after the run.** Each snapshot's policy plays ``episodes`` (at least 20)
   episodes with exploration off, on fixed evaluation seeds (:data:`EVAL_SEED` + i, apart from
   every training seed): :func:`evaluate`. It runs after the run, in the caller's process, so it
   takes nothing from the run it measures; all episodes of a snapshot step together (one
   forward for every live episode per step).
3. **Time to threshold** (:func:`time_to_threshold`): the wall time, env steps and updates of
   the first snapshot whose mean evaluation return is at least the threshold; and whether the
   final snapshot still holds it. A run without such a snapshot is *censored* at its budget,
   never dropped (:mod:`bench.derive`'s medians count it).

Peers' trainers (bench/peers) hand over their snapshots as policies (``obs batch -> actions``)
for the same :func:`evaluate`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["EVAL_SEED", "MIN_EPISODES", "Snapshot", "SnapshotLog", "evaluate", "snapshot_policy",
           "time_to_threshold", "Reached"]

#: The first evaluation episode's seed (episode i: EVAL_SEED + i), far from the training seeds.
EVAL_SEED = 1_000_003
#: The fewest episodes an evaluation may average.
MIN_EPISODES = 20


@dataclass
class Snapshot:
    """The policy's weights after ``updates`` learner updates, ``env_steps`` env steps and
    ``wall_s`` seconds of the run; ``mean_return`` once evaluated."""

    wall_s: float
    env_steps: int
    updates: int
    weights: np.ndarray = field(repr=False)
    mean_return: float | None = None


class SnapshotLog:
    """The snapshots of one run, one per ``every`` updates (0: none but the final one).
    Cost of :meth:`take`: one copy of the weight vector. Thread-safety: none."""

    def __init__(self, every: int):
        self.every = int(every)
        self.snapshots: list[Snapshot] = []

    def due(self, updates: int) -> bool:
        return self.every > 0 and updates > 0 and updates % self.every == 0

    def take(self, wall_s: float, env_steps: int, updates: int, weights) -> None:
        vector = np.array(weights.numpy() if hasattr(weights, "numpy") else weights, dtype=np.float32, copy=True)
        if self.snapshots and self.snapshots[-1].updates == updates:
            return  # the final snapshot of a run that ended on a due one
        self.snapshots.append(Snapshot(float(wall_s), int(env_steps), int(updates), vector))


def snapshot_policy(algo_name: str, env_id: str, acfg, weights):
    """The greedy policy (``obs batch -> actions``, exploration off) of ``algo_name`` with the
    flat ``weights`` of its policy network (a learner's ``get_flat_weights``)."""
    from replaybench.impl.rl import algorithms
    from replaybench.impl.rl.common.envs import make_env

    algo = algorithms.get(algo_name)
    env = make_env(env_id, algo)
    try:
        actor = algo.actor_cls((env.observation_space, env.action_space), acfg, 0)
    finally:
        env.close()
    actor.set_flat_weights(weights)

    def policy(obs: np.ndarray) -> np.ndarray:
        return np.stack([actor.env_action(a) for a in actor.greedy_batch(obs)])

    return policy


def evaluate(policy, env_id: str, episodes: int = MIN_EPISODES, seed: int = EVAL_SEED,
             max_steps: int | None = None) -> np.ndarray:
    """Returns of ``episodes`` greedy episodes of ``policy`` (``obs batch -> env actions``) on
    ``env_id``, episode i reset with seed ``seed + i``; the live episodes step together, one
    call of ``policy`` per step. Deterministic for a deterministic policy. Raises ValueError
    for fewer than :data:`MIN_EPISODES` episodes."""
    import gymnasium as gym

    if episodes < MIN_EPISODES:
        raise ValueError(f"episodes must be at least {MIN_EPISODES} (the protocol's mean), got {episodes}")
    envs = [gym.make(env_id) for _ in range(episodes)]
    try:
        obs = np.stack([np.asarray(e.reset(seed=seed + i)[0], dtype=np.float32) for i, e in enumerate(envs)])
        returns = np.zeros(episodes)
        live = np.ones(episodes, dtype=bool)
        steps = 0
        while live.any() and (max_steps is None or steps < max_steps):
            idx = np.flatnonzero(live)
            actions = policy(obs[idx])
            for j, a in zip(idx, actions):
                o, r, terminated, truncated, _ = envs[j].step(a)
                returns[j] += r
                obs[j] = o
                if terminated or truncated:
                    live[j] = False
            steps += 1
        return returns
    finally:
        for e in envs:
            e.close()


@dataclass(frozen=True)
class Reached:
    """When a run's evaluated policy first held the threshold (None fields: never, censored),
    and whether its final snapshot still holds it."""

    wall_s: float | None
    env_steps: int | None
    updates: int | None
    final_holds: bool

    @property
    def censored(self) -> bool:
        return self.wall_s is None


def time_to_threshold(snapshots: list[Snapshot], threshold: float) -> Reached:
    """The first evaluated snapshot whose mean return is at least ``threshold`` (snapshots in
    the order taken); censored when none is."""
    done = [s for s in snapshots if s.mean_return is not None]
    final = bool(done) and done[-1].mean_return >= threshold
    for s in done:
        if s.mean_return >= threshold:
            return Reached(s.wall_s, s.env_steps, s.updates, final)
    return Reached(None, None, None, final)
