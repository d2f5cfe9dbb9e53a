"""Multi-agent inference: one policy per agent, one shared environment, lock step.

The paper ran ma_gym's TrafficJunction with 10 agents; ma_gym targets the old gym API and is
not maintained. Here: MPE's ``simple_spread_v3`` with ``N=10`` agents (PettingZoo's parallel
API, from ``mpe2``, where the Farama Foundation moved PettingZoo's MPE environments in
PettingZoo 1.25): like TrafficJunction it has a configurable number of cooperative agents,
small vector observations (here 60 floats per agent) and discrete actions (5), and among the
10-agent environments that install here its step is the cheapest (PettingZoo's own SISL
``pursuit_v5`` with 10 pursuers costs about 3x more per step), so the policies' dispatch,
which is what differs between backends, is the largest share of a step. Episodes are 25
steps (MPE's default) and restart when they end. Each agent's policy is the paper's
``obs -> 64 -> actions`` softmax network, argmax (weights from a seed: the timing does not
depend on them).

Backends (:data:`BACKENDS`), each ``act(obs) -> actions`` for the joint observation
``(n_agents, obs_dim)``:

- ``ray``: one ``@ray.remote`` policy actor per agent, ``ray.get([p.act.remote(o_i) ...])`` per
  step, as the paper's Ray code drives it;
- ``serial``: every agent's network called one after the other in the server's process (the
  paper's ``serial.py``);
- ``dataflow``: ours, the agents' networks as one node (:class:`~impl.dataflow.PolicyBank`):
  one batched forward for all agents.
"""

from __future__ import annotations

import numpy as np

__all__ = ["ENVS", "make_env", "BACKENDS", "PolicyActor", "open_backend", "run"]

#: Multi-agent environments by name: (module of mpe2, keyword arguments for parallel_env).
ENVS = {"simple_spread": ("mpe2.simple_spread_v3", "N")}


def make_env(name: str, n_agents: int):
    """A PettingZoo parallel env ``name`` (a key of :data:`ENVS`) with ``n_agents`` agents.
    Raises ImportError naming the extra when mpe2 is missing, ValueError for an unknown name."""
    import importlib

    if name not in ENVS:
        raise ValueError(f"multi-agent env must be one of {list(ENVS)}, got {name!r}")
    module, count = ENVS[name]
    try:
        env_module = importlib.import_module(module)
    except ImportError as err:
        raise ImportError(f"{module} is not installed (pip install 'replaybench[multiagent]'): {err}") from None
    return env_module.parallel_env(**{count: n_agents}, max_cycles=25)


class PolicyActor:
    """One agent's policy network (wrapped by ``ray.remote``)."""

    def __init__(self, n_agents, obs_dim, n_actions, seed, agent):
        import torch

        from replaybench.impl.dataflow import PolicyBank

        torch.set_num_threads(1)
        self.net = PolicyBank(n_agents, obs_dim, n_actions, seed=seed).module(agent)

    def act(self, obs) -> int:
        return _greedy(self.net, obs)


def _greedy(net, obs) -> int:
    """One agent's action: its network's argmax for its own observation."""
    import torch

    with torch.no_grad():
        return int(net(torch.as_tensor(obs, dtype=torch.float32)[None]).argmax(-1))


class Serial:
    def __init__(self, n_agents, obs_dim, n_actions, seed):
        from replaybench.impl.dataflow import PolicyBank

        bank = PolicyBank(n_agents, obs_dim, n_actions, seed=seed)
        self.nets = [bank.module(i) for i in range(n_agents)]

    def act(self, obs: np.ndarray) -> np.ndarray:
        return np.array([_greedy(net, o) for net, o in zip(self.nets, obs)])

    def close(self):
        pass


class Dataflow:
    def __init__(self, n_agents, obs_dim, n_actions, seed):
        from replaybench.impl.dataflow import PolicyBank

        self.bank = PolicyBank(n_agents, obs_dim, n_actions, seed=seed)

    def act(self, obs: np.ndarray) -> np.ndarray:
        return self.bank.act(obs)

    def close(self):
        pass


class Ray:
    def __init__(self, n_agents, obs_dim, n_actions, seed):
        import ray

        self._ray = ray
        cls = ray.remote(PolicyActor)
        self.actors = [cls.remote(n_agents, obs_dim, n_actions, seed, i) for i in range(n_agents)]
        ray.get([a.__ray_ready__.remote() for a in self.actors])

    def act(self, obs: np.ndarray) -> np.ndarray:
        return np.array(self._ray.get([a.act.remote(o) for a, o in zip(self.actors, obs)]))

    def close(self):
        for a in self.actors:
            self._ray.kill(a)


#: Backend name -> class, in table order.
BACKENDS = {"ray": Ray, "dataflow": Dataflow, "serial": Serial}


def open_backend(name: str, n_agents: int, obs_dim: int, n_actions: int, seed: int):
    """Construct backend ``name`` (a key of :data:`BACKENDS`); ValueError naming it otherwise."""
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {list(BACKENDS)}, got {name!r}")
    return BACKENDS[name](n_agents, obs_dim, n_actions, seed)


def run(env, backend, steps: int, seed: int) -> float:
    """Step ``env`` (a parallel env, its agents fixed) ``steps`` times with ``backend``'s
    actions, restarting each episode when it ends; the seconds it took."""
    import time

    obs, _ = env.reset(seed=seed)
    agents = list(env.possible_agents)
    start = time.perf_counter()
    for _ in range(steps):
        actions = backend.act(np.stack([obs[a] for a in agents]))
        obs, *_ = env.step(dict(zip(agents, actions.tolist())))
        if not env.agents:
            obs, _ = env.reset()
    return time.perf_counter() - start
