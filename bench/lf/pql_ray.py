"""Parallel Q-learning on Ray, as the paper's Ray code drives it.

``actors`` ``@ray.remote`` rollout actors, each with one environment and its own copy of the
Q-network; a ``@ray.remote`` replay actor; the learner in the driver. Per round: the weights
go out once through the object store (``ray.put``), ``ray.get([a.rollout.remote(w) ...])``
gathers ``actors x steps_per_round`` transitions, the replay actor adds them and returns a
mini-batch, the learner makes one update and, with the prioritized replay, sends the
priorities back (a call the replay actor runs before the next round's add: Ray runs one
caller's calls to an actor in order). The network, update and replays are those of
:mod:`impl.dataflow.qlearning`, so the only difference from :func:`impl.dataflow.run_pql` is
the transport. Transitions travel as numpy arrays (cheaper than the paper's lists of tensors).
"""

from __future__ import annotations

import time

import numpy as np

from replaybench.impl.dataflow.qlearning import (PQLConfig, QLearner, epsilon_greedy, load_weights, make_replay,
                                                 transition_fields, warm_up)
from replaybench.impl.dataflow.pql import PQLResult

__all__ = ["RolloutActor", "ReplayActor", "run_pql_ray"]


class RolloutActor:
    """One environment and a copy of the Q-network (wrapped by ``ray.remote``)."""

    def __init__(self, cfg: PQLConfig, index: int):
        import torch

        from replaybench.impl.rl.common.envs import make_env
        from replaybench.impl.rl.algorithms.nets import mlp

        torch.set_num_threads(1)
        self.cfg = cfg
        self.env = make_env(cfg.env)
        self.obs, _ = self.env.reset(seed=cfg.seed + index)
        self.n_actions = int(self.env.action_space.n)
        self.net = mlp([self.obs.size, cfg.hidden, self.n_actions])
        self.rng = np.random.default_rng([cfg.seed, index])
        self.ret, self.returns = 0.0, []

    def rollout(self, weights: np.ndarray) -> tuple[dict, list]:
        """``steps_per_round`` epsilon-greedy steps with ``weights``; the transitions as arrays
        and the returns of the episodes that ended."""
        load_weights(self.net, weights)
        n, dim = self.cfg.steps_per_round, self.obs.size
        out = {"obs": np.empty((n, dim), np.float32), "action": np.empty(n, np.int64),
               "reward": np.empty(n, np.float32), "next_obs": np.empty((n, dim), np.float32),
               "done": np.empty(n, np.bool_)}
        returns = []
        for t in range(n):
            action = int(epsilon_greedy(self.net, self.obs[None], self.cfg.epsilon, self.n_actions, self.rng)[0])
            nxt, reward, terminated, truncated, _ = self.env.step(action)
            out["obs"][t], out["action"][t], out["reward"][t] = self.obs, action, reward
            out["next_obs"][t], out["done"][t] = nxt, terminated
            self.ret += float(reward)
            if terminated or truncated:
                returns.append(self.ret)
                self.ret = 0.0
                nxt, _ = self.env.reset()
            self.obs = nxt
        return out, returns


class ReplayActor:
    """The replay (wrapped by ``ray.remote``): adds a round's transitions, returns a mini-batch."""

    def __init__(self, cfg: PQLConfig, obs_dim: int):
        self.cfg = cfg
        warm_up(cfg.replay, transition_fields(obs_dim))
        self.replay = make_replay(cfg.replay, cfg.replay_capacity, transition_fields(obs_dim), seed=cfg.seed + 1)

    def add_and_sample(self, *batches: dict) -> dict | None:
        for b in batches:
            self.replay.add(b)
        return self.replay.sample(self.cfg.batch_size) if len(self.replay) >= self.cfg.batch_size else None

    def update_priorities(self, indices, priorities) -> None:
        self.replay.update_priorities(indices, priorities)


def run_pql_ray(cfg: PQLConfig, progress=None) -> PQLResult:
    """Run ``cfg.rounds`` rounds on Ray (an initialised session: :func:`bench.lf.raysession.session`).

    Times from the first rollout to the last update, actors constructed before. Returns a
    :class:`~impl.dataflow.PQLResult`. Raises ConfigError for a bad config before any actor starts.
    """
    import ray
    import torch

    from replaybench.impl.rl.common.envs import make_env

    cfg.validate()
    torch.set_num_threads(1)
    probe = make_env(cfg.env)
    obs_dim, n_actions = int(np.prod(probe.observation_space.shape)), int(probe.action_space.n)
    probe.close()
    learner = QLearner(obs_dim, n_actions, cfg, seed=cfg.seed)
    actors = [ray.remote(RolloutActor).remote(cfg, i) for i in range(cfg.actors)]
    replay = ray.remote(ReplayActor).remote(cfg, obs_dim)
    try:
        ray.get([a.__ray_ready__.remote() for a in (*actors, replay)])
        returns, updates = [], 0
        start = time.perf_counter()
        for r in range(cfg.rounds):
            weights = ray.put(learner.flat_weights())
            results = ray.get([a.rollout.remote(weights) for a in actors])
            batch = ray.get(replay.add_and_sample.remote(*(out for out, _ in results)))
            for _, rets in results:
                returns.extend(rets)
            if batch is not None:
                td = learner.update(batch)
                updates += 1
                if "indices" in batch:
                    replay.update_priorities.remote(batch["indices"], td)
            if progress is not None:
                progress(r + 1)
        seconds = time.perf_counter() - start
        rows = cfg.actors * cfg.steps_per_round
        return PQLResult(seconds, cfg.rounds, rows * cfg.rounds, updates, returns, learner.flat_weights())
    finally:
        for a in (*actors, replay):
            ray.kill(a)

