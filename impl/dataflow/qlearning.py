"""Parallel Q-learning as the Lingua Franca benchmark runs it: the parts every backend shares.

The workload (the paper's "parallel Q-learning" on Blackjack): ``actors`` rollout actors each
take ``steps_per_round`` epsilon-greedy steps with a copy of the Q-network; their transitions go
into a replay of ``replay_capacity``; one learner samples a mini-batch of ``batch_size``, makes
one DQN update (MSE to a target network synced every ``target_every`` updates, Adam) and sends
its weights back to the actors; then the next round starts. Rounds are sequential, as in the
paper's code: round r acts with the weights of update r - 1.

Observations are those of :func:`impl.rl.common.envs.make_env` in every backend: Blackjack's tuple
becomes 45 one-hot floats (the paper's code fed the 3 raw numbers to its network).

What differs between backends is only the transport (Ray's object store, or shared memory and
semaphores); the network, the update and the replays here are the same objects in both, so a
difference in time is a difference of transport.

Replays (:data:`REPLAYS`): ``"prioritized"`` is our K-ary sum-tree buffer (``kary-aligned``,
proportional PER with alpha 0.6 and importance weights, beta 0.4; the learner writes |TD|
back as priorities); ``"deque"`` is a plain ``collections.deque(maxlen=capacity)`` of row
tuples sampled uniformly, the paper's replay (their code takes a deque's first rows instead;
uniform sampling is the usual DQN choice and costs the same).
"""

from __future__ import annotations

import copy
import random
from collections import deque
from dataclasses import asdict, dataclass, fields

import numpy as np
import torch

from replaybench.impl.rl.common.errors import ConfigError
from replaybench.impl.rl.algorithms.nets import flat_params, load_flat_params, mlp, update_target

__all__ = ["PQLConfig", "QLearner", "DequeReplay", "REPLAYS", "make_replay", "transition_fields",
           "epsilon_greedy", "load_weights", "warm_up", "learn_round"]

#: The replay kinds a run may use.
REPLAYS = ("prioritized", "deque")


@dataclass(frozen=True)
class PQLConfig:
    """One parallel Q-learning run. Defaults: the paper's (Blackjack-v1, 16 actors x 100 steps per
    round, replay of 5,000, 500 rounds, a 32-unit hidden layer, Adam lr 0.01, epsilon 0.1, target
    sync every 10 updates).

    ``workers``: env worker processes of the static-dataflow backend (0 = step the envs in the
    server's process); the Ray backend runs one actor process per rollout actor whatever it says.
    """

    env: str = "Blackjack-v1"
    actors: int = 16
    steps_per_round: int = 100
    rounds: int = 500
    replay_capacity: int = 5000
    batch_size: int = 500
    replay: str = "prioritized"
    hidden: int = 32
    lr: float = 0.01
    gamma: float = 0.99
    epsilon: float = 0.1
    target_every: int = 10
    workers: int = 2
    seed: int = 0
    timeout_s: float = 120.0

    def validate(self) -> "PQLConfig":
        """Raise ConfigError naming the first field that cannot run; return self."""
        for name in ("actors", "steps_per_round", "rounds", "replay_capacity", "batch_size", "hidden",
                     "target_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(name, value, f"{name} must be a positive integer, got {value!r}")
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or not 0 <= self.workers <= self.actors:
            raise ConfigError("workers", self.workers, f"workers must be an integer in [0, actors={self.actors}], "
                                                       f"got {self.workers!r}")
        if self.replay not in REPLAYS:
            raise ConfigError("replay", self.replay, f"replay must be one of {REPLAYS}, got {self.replay!r}")
        if self.batch_size > self.replay_capacity:
            raise ConfigError("batch_size", self.batch_size, f"batch_size {self.batch_size} exceeds replay_capacity "
                                                             f"{self.replay_capacity}")
        for name, low, high in (("lr", 0.0, 1.0), ("gamma", 0.0, 1.0), ("epsilon", 0.0, 1.0),
                                ("timeout_s", 0.0, 1e6)):
            value = getattr(self, name)
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and low <= value <= high
            if not ok or (name in ("lr", "timeout_s") and value == 0):
                raise ConfigError(name, value, f"{name} must be a number in ({low}, {high}], got {value!r}")
        if not isinstance(self.env, str) or not self.env:
            raise ConfigError("env", self.env, f"env must be an environment id, got {self.env!r}")
        return self

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def field_names(cls) -> tuple:
        return tuple(f.name for f in fields(cls))


def transition_fields(obs_dim: int) -> dict:
    """The ``{name: (shape, dtype)}`` of one stored transition."""
    return {"obs": ((obs_dim,), "float32"), "action": ((), "int64"), "reward": ((), "float32"),
            "next_obs": ((obs_dim,), "float32"), "done": ((), "bool")}


@torch.no_grad()
def epsilon_greedy(net: torch.nn.Module, obs: np.ndarray, epsilon: float, n_actions: int,
                   rng: np.random.Generator) -> np.ndarray:
    """Actions for a batch of observations ``(n, obs_dim)``: greedy under ``net`` (one batched
    forward), replaced by a uniform action with probability ``epsilon`` each. int64 ``(n,)``."""
    actions = net(torch.tensor(obs, dtype=torch.float32)).argmax(1).numpy()
    explore = rng.random(len(actions)) < epsilon
    actions[explore] = rng.integers(n_actions, size=int(explore.sum()))
    return actions


class QLearner:
    """A DQN learner: online and target MLPs (``obs_dim -> hidden -> n_actions``), Adam.

    :meth:`update` makes one gradient step on a mini-batch and returns |TD| per row (the new
    priorities); the target network is copied from the online one every ``target_every``
    updates. Weights travel as one flat float32 vector (:meth:`flat_weights`). Cost per update:
    two forwards and one backward of the mini-batch. Thread-safety: none.
    """

    def __init__(self, obs_dim: int, n_actions: int, cfg: PQLConfig, seed: int):
        torch.manual_seed(seed)
        self.cfg = cfg
        self.net = mlp([obs_dim, cfg.hidden, n_actions])
        self.target = copy.deepcopy(self.net)
        self.opt = torch.optim.Adam(self.net.parameters(), lr=cfg.lr)
        self.updates = 0

    def update(self, batch: dict) -> np.ndarray:
        # copies: a batch may be read-only (Ray's object store), which torch refuses to wrap
        obs = torch.tensor(batch["obs"], dtype=torch.float32)
        nxt = torch.tensor(batch["next_obs"], dtype=torch.float32)
        act = torch.tensor(batch["action"], dtype=torch.int64)
        rew = torch.tensor(batch["reward"], dtype=torch.float32)
        done = torch.tensor(batch["done"], dtype=torch.float32)
        q = self.net(obs).gather(1, act[:, None]).squeeze(1)
        with torch.no_grad():
            y = rew + self.cfg.gamma * (1.0 - done) * self.target(nxt).max(1).values
        td = y - q
        if "weights" in batch:  # importance weights of prioritized sampling
            loss = (torch.tensor(batch["weights"], dtype=torch.float32) * td.pow(2)).mean()
        else:
            loss = td.pow(2).mean()
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        self.updates += 1
        if self.updates % self.cfg.target_every == 0:
            update_target(self.target, self.net, 1.0)
        return td.detach().abs().numpy()

    def flat_weights(self) -> np.ndarray:
        return flat_params(self.net).numpy()


def load_weights(net: torch.nn.Module, flat) -> None:
    """Copy a :meth:`QLearner.flat_weights` vector into an actor's copy of the network."""
    load_flat_params(net, torch.as_tensor(np.asarray(flat, dtype=np.float32)))


class DequeReplay:
    """The plain replay: ``collections.deque(maxlen=capacity)`` of row tuples, uniform sampling.

    Same interface as our buffers (``add(batch)``, ``sample(n)``, ``len``); no priorities
    (``prioritized = False``: the learner writes none back). Cost: O(rows) Python work per add,
    O(n * capacity / 64) per sample (deque indexing walks its 64-item blocks), then one
    ``np.array`` per field.
    """

    prioritized = False

    def __init__(self, capacity: int, fields: dict, seed=None):
        self.names = list(fields)
        self.dtypes = {name: dtype for name, (_, dtype) in fields.items()}
        self.rows: deque = deque(maxlen=int(capacity))
        self._rng = random.Random(seed)

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, batch: dict) -> None:
        self.rows.extend(zip(*(batch[name].tolist() for name in self.names)))

    def sample(self, n: int) -> dict:
        picked = [self.rows[self._rng.randrange(len(self.rows))] for _ in range(n)]
        return {name: np.array([row[i] for row in picked], dtype=self.dtypes[name])
                for i, name in enumerate(self.names)}


class _PrioritizedReplay:
    """Our prioritized buffer (``kary-aligned``) behind the replay interface."""

    prioritized = True

    def __init__(self, capacity: int, fields: dict, seed=None):
        from replaybench.impl import registry

        self.buf = registry.create("kary-aligned", capacity, fields, alpha=0.6, beta=0.4, eps=1e-6, seed=seed)

    def __len__(self) -> int:
        return len(self.buf)

    def add(self, batch: dict) -> None:
        self.buf.add(batch)

    def sample(self, n: int) -> dict:
        return self.buf.sample(n)

    def update_priorities(self, indices, priorities) -> None:
        self.buf.update_priorities(indices, priorities)


def make_replay(kind: str, capacity: int, fields: dict, seed=None):
    """A replay of ``kind`` (one of :data:`REPLAYS`); ValueError naming ``replay`` otherwise."""
    if kind == "prioritized":
        return _PrioritizedReplay(capacity, fields, seed)
    if kind == "deque":
        return DequeReplay(capacity, fields, seed)
    raise ValueError(f"replay must be one of {REPLAYS}, got {kind!r}")


def warm_up(kind: str, fields: dict) -> None:
    """Add, sample and write priorities once on a tiny replay of ``kind``, so that compiling (or
    loading from numba's cache) our buffer's kernels happens before the clock starts."""
    from replaybench.impl.storage import random_batch

    replay = make_replay(kind, 64, fields, seed=0)
    replay.add(random_batch(fields, 16, np.random.default_rng(0)))
    out = replay.sample(8)
    if replay.prioritized:
        replay.update_priorities(out["indices"], np.ones(8))


def learn_round(replay, learner: QLearner, batch: dict, batch_size: int) -> bool:
    """The replay + learner step of one round: add ``batch``, then one update when the replay
    holds ``batch_size`` rows, priorities written back. Returns whether an update was made."""
    replay.add(batch)
    if len(replay) < batch_size:
        return False
    sample = replay.sample(batch_size)
    td = learner.update(sample)
    if replay.prioritized:
        replay.update_priorities(sample["indices"], td)
    return True
