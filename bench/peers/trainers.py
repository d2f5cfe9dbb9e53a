"""Peers' own trainers under the time-to-threshold protocol (issue 56, item 5).

:func:`train_peer` runs one peer library's own training loop with the settings that library's
users run (:data:`SETTINGS`, each with its source), and takes weight snapshots through that
library's own hook while it runs; the snapshots are evaluated after the run, with
:func:`impl.rl.common.snapshots.evaluate`, exactly as our own runs' are. The models and buffers
are the ones :mod:`bench.scenarios.frameworks` builds (:func:`~bench.scenarios.frameworks.sb3_dqn`,
:func:`~bench.scenarios.frameworks.tianshou_dqn`); only the driving differs: the frameworks
scenario times each framework's update loop, this module runs each framework's *trainer*.

- **tianshou** (DQN): Tianshou's ``OffPolicyTrainer`` (``algorithm.create_trainer``) over a
  ``Collector`` of ``DummyVectorEnv`` and its ``PrioritizedVectorReplayBuffer`` (``buffer``
  None), or ours through :mod:`replaybench.adapters.tianshou`; epsilon by the test's
  ``training_fn``. Snapshots: a wrapper around ``algorithm.update`` (the trainer's one call per
  gradient step), so they fall exactly on every ``snapshot_every`` updates. The trainer's test
  steps are off (no ``test_collector``, no ``stop_fn``, ``test_in_training`` False): nothing is
  evaluated inside the run. The trainer's own per-collection costs stay in (they are what its
  users pay): a NaN scan of the whole buffer (``hasnull``) after every collection, and its stats.
- **sb3** (DQN): Stable-Baselines3's ``DQN.learn`` with its plain uniform ``ReplayBuffer``
  (``buffer`` None: SB3's DQN has no prioritized replay), or ``PrioritizedDQN`` over our buffer
  (:mod:`replaybench.adapters.sb3`, beta fixed). Its epsilon follows the zoo's schedule in env
  steps (``eps_fraction`` of the zoo's ``n_timesteps``), whatever the run's budget: SB3 counts
  ``exploration_fraction`` against the steps given to ``learn``, so a longer budget would
  otherwise stretch the decay. Snapshots: a ``BaseCallback`` that compares
  ``model._n_updates`` with the next multiple of ``snapshot_every`` at every env step. SB3 runs
  its gradient steps in bursts (rl-zoo's CartPole: 128 after every 256 env steps), so a
  snapshot lands at the first env step after the burst that crossed the multiple and records
  the update count it saw (a multiple of the burst, not of ``snapshot_every``). No
  ``EvalCallback``: nothing is evaluated inside the run.
- **td3** on Pendulum-v1: Tianshou's ``TD3`` under the same trainer with its ``VectorReplayBuffer``
  (uniform, as its test), and SB3's ``TD3.learn``; snapshots copy the actor. Our buffer goes into
  Tianshou's TD3 (its critic loss takes the importance weights and writes priorities back);
  SB3's TD3 has no prioritized variant, so it takes ``buffer=None`` only.

Snapshots: each copies the policy network's ``state_dict`` (tensors cloned: tens to hundreds of
KB for these MLPs, microseconds to a millisecond, inside the run's time) with the wall time
since the run's first env step (the timer starts after the environments' reset), the env steps
and the gradient updates so far; one more is taken at the end (unless the last one already has
the run's update count). Its ``policy`` builds the network from that copy on first call (a deep
copy of an untrained template of the same network) and maps observations to the framework's
greedy env actions: argmax Q (DQN), the deterministic actor clipped to [-1, 1] and scaled to
the action bounds (TD3, as both frameworks' ``map_action`` / ``unscale_action``).

Costs: a run is the peer's own training time plus one state-dict copy per snapshot; memory one
copy of the network per snapshot. ``timeout_s`` is checked in the hooks (every env step for SB3,
every collection and update for Tianshou), so a run overshoots it by at most one SB3 burst of
updates or one Tianshou collection.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

__all__ = ["PEER_TRAINERS", "ALGOS", "ENVS", "SETTINGS", "PeerSnapshot", "PeerRun", "train_peer", "settings"]

#: The peers :func:`train_peer` runs.
PEER_TRAINERS = ("tianshou", "sb3")
#: The algorithms, and the environments each has published settings for.
ALGOS = ("dqn", "td3")
ENVS = {"dqn": ("CartPole-v1", "Acrobot-v1"), "td3": ("Pendulum-v1",)}

# The DQN keys are bench.scenarios.frameworks.HYPER's (target_update in env steps); the frameworks
# defaults fill what a source leaves out (alpha 0.6, beta 0.4 for our buffer; n_envs 1).
_TIANSHOU_CARTPOLE = {
    "hidden": [128, 128, 128, 128], "lr": 1e-3, "gamma": 0.95, "batch_size": 64, "buffer_size": 20_000,
    "learning_starts": 640, "train_freq": 10, "gradient_steps": 1, "target_update": 3200,
    "eps_start": 0.1, "eps_end": 0.01, "eps_hold": 10_000, "eps_decay_steps": 40_000, "eps_inference": 0.05,
    "n_envs": 10, "n_step": 3, "double_q": True, "alpha": 0.6, "beta": 0.4}
_TIANSHOU_SOURCE = (
    "Tianshou test/discrete/test_dqn.py (as bench/suites/frameworks-sb3-tianshou.json cites it, commit "
    "f2402056b03a): eps_train 0.1, eps_test 0.05, buffer 20000, lr 1e-3, n_step 3, target_update_freq 320 "
    "updates (= 3200 env steps at 10 per update), 10 env steps per collection with update_per_step 0.1 (one "
    "gradient step each), batch 64, hidden [128]*4, 10 training envs, alpha 0.6, beta 0.4, an initial "
    "collection of batch_size * 10 envs = 640 steps (epsilon eps_test: outside the training step), epsilon 0.1 "
    "to trainer env step 10k then linear to 0.01 at 50k (its train_fn); test_pdqn's gamma 0.95 with the "
    "prioritized buffer; DQN's default is_double=True")
_SB3_CARTPOLE = {
    "hidden": [256, 256], "lr": 2.3e-3, "gamma": 0.99, "batch_size": 64, "buffer_size": 100_000,
    "learning_starts": 1000, "train_freq": 256, "gradient_steps": 128, "target_update": 10,
    "eps_start": 1.0, "eps_end": 0.04, "eps_fraction": 0.16, "n_timesteps": 50_000, "n_envs": 1, "alpha": 0.6,
    "beta": 0.4}
_SB3_ACROBOT = {
    "hidden": [256, 256], "lr": 6.3e-4, "gamma": 0.99, "batch_size": 128, "buffer_size": 50_000,
    "learning_starts": 0, "train_freq": 4, "gradient_steps": 4, "target_update": 250,
    "eps_start": 1.0, "eps_end": 0.1, "eps_fraction": 0.12, "n_timesteps": 100_000, "n_envs": 1, "alpha": 0.6,
    "beta": 0.4}
_ZOO = "rl-baselines3-zoo hyperparams/{file} (commit {commit}), entry {entry}"

#: ``{(peer, algo, env): {"hyper": {...}, "source": "where the settings come from"}}``; a run's
#: ``PeerRun.hyper`` is the entry's ``hyper`` as run.
SETTINGS: dict[tuple[str, str, str], dict] = {
    ("tianshou", "dqn", "CartPole-v1"): {"hyper": _TIANSHOU_CARTPOLE, "source": _TIANSHOU_SOURCE},
    ("tianshou", "dqn", "Acrobot-v1"): {
        "hyper": {**_TIANSHOU_CARTPOLE, "gamma": 0.99},
        "source": "Tianshou publishes no Acrobot DQN settings: its CartPole test's (" + _TIANSHOU_SOURCE + ") with "
                  "gamma 0.99 from " + _ZOO.format(file="dqn.yml", commit="ce95481b041f", entry="Acrobot-v1 ('Tuned')")
                  + " (0.95 discounts Acrobot's -1 per step over about 20 steps, shorter than a solved episode)"},
    ("sb3", "dqn", "CartPole-v1"): {
        "hyper": _SB3_CARTPOLE,
        "source": _ZOO.format(file="dqn.yml", commit="ce95481b041f", entry="CartPole-v1 ('Almost Tuned')")
                  + ": n_timesteps 5e4, lr 2.3e-3, batch 64, buffer 100000, learning_starts 1000, gamma 0.99, "
                    "target_update_interval 10, train_freq 256, gradient_steps 128, exploration_fraction 0.16, "
                    "exploration_final_eps 0.04, net_arch [256, 256]; the rest SB3's DQN defaults "
                    "(exploration_initial_eps 1.0, Huber loss, max_grad_norm 10)"},
    ("sb3", "dqn", "Acrobot-v1"): {
        "hyper": _SB3_ACROBOT,
        "source": _ZOO.format(file="dqn.yml", commit="ce95481b041f", entry="Acrobot-v1 ('Tuned')")
                  + ": n_timesteps 1e5, lr 6.3e-4, batch 128, buffer 50000, learning_starts 0, gamma 0.99, "
                    "target_update_interval 250, train_freq 4, gradient_steps -1 (as many as the rollout's env "
                    "steps: 4 with one env), exploration_fraction 0.12, exploration_final_eps 0.1, net_arch "
                    "[256, 256]; the rest SB3's DQN defaults"},
    ("tianshou", "td3", "Pendulum-v1"): {
        "hyper": {"hidden": [128, 128], "actor_lr": 1e-4, "critic_lr": 1e-3, "gamma": 0.99, "tau": 0.005,
                  "exploration_noise": 0.1, "policy_noise": 0.2, "noise_clip": 0.5, "update_actor_freq": 2,
                  "buffer_size": 20_000, "batch_size": 128, "train_freq": 8, "gradient_steps": 1, "n_envs": 8,
                  "n_step": 3, "learning_starts": 0, "alpha": 0.6, "beta": 0.4},
        "source": "Tianshou test/continuous/test_td3.py (commit 8ac36414410d): Pendulum-v1, buffer 20000, actor_lr "
                  "1e-4, critic_lr 1e-3, gamma 0.99, tau 0.005, exploration_noise 0.1, policy_noise 0.2, noise_clip "
                  "0.5, update_actor_freq 2, step_per_collect 8 with update_per_step 0.125 (one gradient step "
                  "each), batch 128, hidden [128, 128], 8 training envs, n_step 3, no initial collection; the "
                  "actor's max_action 1 with the policy's action scaling to the bounds (Tianshou 2's defaults)"},
    ("sb3", "td3", "Pendulum-v1"): {
        "hyper": {"hidden": [400, 300], "lr": 1e-3, "gamma": 0.98, "buffer_size": 200_000, "learning_starts": 10_000,
                  "noise_std": 0.1, "train_freq": "episode", "gradient_steps": -1, "batch_size": 256,
                  "tau": 0.005, "n_envs": 1},
        "source": _ZOO.format(file="td3.yml", commit="a02f4fbfaefa", entry="Pendulum-v0 (the same dynamics as v1)")
                  + ": gamma 0.98, buffer 200000, learning_starts 10000, normal action noise std 0.1, train_freq "
                    "[1, 'episode'] with gradient_steps -1 (one gradient step per env step of the episode), lr "
                    "1e-3, net_arch [400, 300], n_timesteps 20000; the rest SB3's TD3 defaults (batch 256, tau "
                    "0.005, policy_delay 2, target noise 0.2 clipped at 0.5)"},
}


@dataclass
class PeerSnapshot:
    """The peer's policy after ``updates`` gradient steps, ``env_steps`` env steps and ``wall_s``
    seconds since its first env step. ``policy(obs batch float32 (n, *obs_shape)) -> env
    actions (n, ...)``: greedy (exploration off), bound to a copy of the weights at that moment."""

    wall_s: float
    env_steps: int
    updates: int
    policy: Callable = field(repr=False)


@dataclass
class PeerRun:
    """One peer run: its snapshots in the order taken (the last at the run's end), the run's
    wall time (first env step to the trainer's return), env steps, gradient updates and the
    hyper-parameters it ran (with ``buffer``: ``"own"`` or our variant)."""

    name: str
    snapshots: list[PeerSnapshot]
    wall_s: float
    env_steps: int
    updates: int
    hyper: dict


def settings(name: str, algo: str, env_id: str) -> dict:
    """``{"hyper", "source"}`` of one peer, algorithm and environment (ValueError naming the
    argument that has no entry)."""
    if name not in PEER_TRAINERS:
        raise ValueError(f"name: unknown peer {name!r}; peers: {list(PEER_TRAINERS)}")
    if algo not in ALGOS:
        raise ValueError(f"algo: {algo!r} is not supported; supported: {list(ALGOS)}")
    if env_id not in ENVS[algo]:
        raise ValueError(f"env_id: {env_id!r} has no published {algo} settings here; supported: {list(ENVS[algo])}")
    return SETTINGS[(name, algo, env_id)]


# ---------------------------------------------------------------------------------- snapshots
class _Greedy:
    """A snapshot's greedy policy: ``template`` (an untrained copy of the network) loaded with
    ``state`` on first call, then ``act(forward(net, obs tensor))`` under ``no_grad``."""

    def __init__(self, template, state: dict, forward: Callable, act: Callable):
        self._template, self._state, self._forward, self._act = template, state, forward, act
        self._net = None

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        import torch

        if self._net is None:
            self._net = copy.deepcopy(self._template)
            self._net.load_state_dict(self._state)
            self._net.eval()
        with torch.no_grad():
            out = self._forward(self._net, torch.as_tensor(np.asarray(obs), dtype=torch.float32))
        return self._act(out.cpu().numpy())


def _argmax(q: np.ndarray) -> np.ndarray:
    return q.argmax(axis=1)


def _scaled(low: np.ndarray, high: np.ndarray) -> Callable:
    """[-1, 1] actor output -> the Box's bounds, clipped first (both frameworks' mapping)."""

    def act(a: np.ndarray) -> np.ndarray:
        return (low + (np.clip(a, -1.0, 1.0) + 1.0) * 0.5 * (high - low)).astype(np.float32)

    return act


class _Recorder:
    """Snapshots and the timeout of one run. ``take`` copies ``net``'s state when ``updates``
    reached the next multiple of ``every``; ``final`` always (once per update count)."""

    def __init__(self, name: str, every: int, timeout_s: float | None, net, forward: Callable, act: Callable):
        self.name, self.every, self.timeout_s = name, every, timeout_s
        self.template = copy.deepcopy(net)  # untrained: only its structure is used
        self.forward, self.act = forward, act
        self.snapshots: list[PeerSnapshot] = []
        self.next_due = every
        self.start = None

    def begin(self) -> None:
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def check_time(self) -> None:
        if self.timeout_s is not None and self.elapsed() > self.timeout_s:
            raise TimeoutError(f"peer {self.name!r}: past timeout_s={self.timeout_s:g} s "
                               f"({self.elapsed():.1f} s, {len(self.snapshots)} snapshots taken)")

    def _copy(self, env_steps: int, updates: int, net) -> None:
        wall = self.elapsed()
        state = {k: v.detach().clone() for k, v in net.state_dict().items()}
        self.snapshots.append(PeerSnapshot(wall, int(env_steps), int(updates),
                                           _Greedy(self.template, state, self.forward, self.act)))

    def take(self, env_steps: int, updates: int, net) -> None:
        if updates >= self.next_due:
            self._copy(env_steps, updates, net)
            self.next_due = (updates // self.every + 1) * self.every

    def final(self, env_steps: int, updates: int, net) -> None:
        if not self.snapshots or self.snapshots[-1].updates != updates:
            self._copy(env_steps, updates, net)


# ---------------------------------------------------------------------------------- tianshou
def _tianshou_td3(env_id: str, buffer: str, seed: int, h: dict):
    """Tianshou's TD3 as its test builds it: ``(envs, policy, algorithm, buf)``, seeded."""
    import gymnasium as gym
    import torch
    from tianshou.algorithm import TD3
    from tianshou.algorithm.modelfree.ddpg import ContinuousDeterministicPolicy
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou.data import VectorReplayBuffer
    from tianshou.env import DummyVectorEnv
    from tianshou.exploration import GaussianNoise
    from tianshou.utils.net.common import Net
    from tianshou.utils.net.continuous import ContinuousActorDeterministic, ContinuousCritic

    from replaybench.adapters.tianshou import PrioritizedVectorReplayBuffer
    from replaybench.bench.scenarios.frameworks import OWN

    torch.manual_seed(seed)
    np.random.seed(seed)
    envs = DummyVectorEnv([lambda: gym.make(env_id)] * h["n_envs"])
    envs.seed(seed)
    obs_space, act_space = envs.observation_space[0], envs.action_space[0]
    actor = ContinuousActorDeterministic(
        preprocess_net=Net(state_shape=obs_space.shape, hidden_sizes=list(h["hidden"])),
        action_shape=act_space.shape, max_action=1.0)
    policy = ContinuousDeterministicPolicy(actor=actor, exploration_noise=GaussianNoise(sigma=h["exploration_noise"]),
                                           action_space=act_space, action_scaling=True)

    def critic():
        return ContinuousCritic(preprocess_net=Net(state_shape=obs_space.shape, action_shape=act_space.shape,
                                                   hidden_sizes=list(h["hidden"]), concat=True))

    algorithm = TD3(policy=policy, policy_optim=AdamOptimizerFactory(lr=h["actor_lr"]), critic=critic(),
                    critic_optim=AdamOptimizerFactory(lr=h["critic_lr"]), critic2=critic(),
                    critic2_optim=AdamOptimizerFactory(lr=h["critic_lr"]), tau=h["tau"], gamma=h["gamma"],
                    policy_noise=h["policy_noise"], update_actor_freq=h["update_actor_freq"],
                    noise_clip=h["noise_clip"], n_step_return_horizon=h["n_step"])
    if buffer == OWN:
        buf = VectorReplayBuffer(h["buffer_size"], envs.env_num)
    else:
        buf = PrioritizedVectorReplayBuffer(h["buffer_size"], envs.env_num, h["alpha"], h["beta"], variant=buffer,
                                            random_seed=seed)
    return envs, policy, algorithm, buf


def _train_tianshou(algo: str, env_id: str, buffer: str, seed: int, steps: int, h: dict,
                    rec_args: tuple) -> tuple[_Recorder, int, int, float]:
    from tianshou.data import Collector
    from tianshou.trainer import OffPolicyTrainerParams

    from replaybench.bench.scenarios.frameworks import tianshou_dqn

    if algo == "dqn":
        envs, policy, algorithm, buf = tianshou_dqn(env_id, buffer, seed, h)
        policy.set_eps_inference(h["eps_inference"])
        net = policy.model
        rec = _Recorder(*rec_args, net, lambda m, obs: m(obs)[0], _argmax)
    else:
        envs, policy, algorithm, buf = _tianshou_td3(env_id, buffer, seed, h)
        net = policy.actor
        space = envs.action_space[0]
        rec = _Recorder(*rec_args, net, lambda m, obs: m(obs)[0], _scaled(space.low, space.high))
    collector = Collector(algorithm, envs, buf, exploration_noise=True)
    counts = {"env_steps": 0, "updates": 0}
    collect, update = collector.collect, algorithm.update

    def counted_collect(*args, **kwargs):
        rec.check_time()
        stats = collect(*args, **kwargs)
        counts["env_steps"] += stats.n_collected_steps
        return stats

    def snapshot_update(*args, **kwargs):
        # the trainer's one call per gradient step: count it, snapshot when due, check the time
        out = update(*args, **kwargs)
        counts["updates"] += 1
        rec.take(counts["env_steps"], counts["updates"], net)
        rec.check_time()
        return out

    collector.collect, algorithm.update = counted_collect, snapshot_update

    def training_fn(epoch: int, env_step: int) -> None:
        # test_dqn's train_fn: epsilon by the trainer's env step (the initial collection excluded)
        if algo == "dqn":
            frac = min(1.0, max(0, env_step - h["eps_hold"]) / h["eps_decay_steps"])
            policy.set_eps_training(h["eps_start"] + frac * (h["eps_end"] - h["eps_start"]))

    try:
        collector.reset()
        rec.begin()
        start = min(h["learning_starts"], steps)
        if start:
            # test_dqn's initial collection, before the trainer (outside a training step: eps_test)
            collector.collect(n_step=start)
        if steps - counts["env_steps"] > 0:
            # One epoch of the remaining steps: with no test collector an epoch boundary only logs.
            # The trainer's reset keeps the buffer (reset_collector_buffers False) and resets the envs.
            params = OffPolicyTrainerParams(
                training_collector=collector, max_epochs=1, epoch_num_steps=steps - counts["env_steps"],
                collection_step_num_env_steps=h["train_freq"], batch_size=h["batch_size"],
                update_step_num_gradient_steps_per_sample=h["gradient_steps"] / h["train_freq"],
                training_fn=training_fn, test_in_training=False, verbose=False, show_progress=False)
            algorithm.create_trainer(params).run()
        rec.final(counts["env_steps"], counts["updates"], net)
        wall = rec.elapsed()
    finally:
        envs.close()
    return rec, counts["env_steps"], counts["updates"], wall


# ---------------------------------------------------------------------------------- sb3
def _sb3_td3(env_id: str, seed: int, h: dict):
    from stable_baselines3 import TD3
    from stable_baselines3.common.noise import NormalActionNoise

    from replaybench.bench.scenarios.frameworks import make_sb3_env

    env = make_sb3_env(env_id, seed, h["n_envs"], False, 4)
    dim = env.action_space.shape[-1]
    return TD3("MlpPolicy", env, learning_rate=h["lr"], buffer_size=h["buffer_size"],
               learning_starts=h["learning_starts"], batch_size=h["batch_size"], tau=h["tau"], gamma=h["gamma"],
               train_freq=(1, h["train_freq"]) if h["train_freq"] == "episode" else h["train_freq"],
               gradient_steps=h["gradient_steps"],
               action_noise=NormalActionNoise(np.zeros(dim), h["noise_std"] * np.ones(dim)),
               policy_kwargs={"net_arch": list(h["hidden"])}, seed=seed, device="cpu", verbose=0)


def _train_sb3(algo: str, env_id: str, buffer: str, seed: int, steps: int, h: dict,
               rec_args: tuple) -> tuple[_Recorder, int, int, float]:
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.logger import Logger

    from replaybench.bench.scenarios.frameworks import sb3_dqn

    if algo == "dqn":
        # SB3's exploration_fraction is a fraction of the steps passed to learn(): the zoo's
        # schedule is that fraction of its own n_timesteps, so it is rescaled to this run's budget
        # (epsilon reaches its floor at the same env step whatever the budget)
        h = {**h, "eps_fraction": min(1.0, h["eps_fraction"] * h["n_timesteps"] / steps)}
        model = sb3_dqn(env_id, buffer, seed, h)
        net = model.q_net
        rec = _Recorder(*rec_args, net, lambda m, obs: m(obs), _argmax)
    else:
        model = _sb3_td3(env_id, seed, h)
        net = model.actor
        space = model.action_space
        rec = _Recorder(*rec_args, net, lambda m, obs: m(obs), _scaled(space.low, space.high))
    # verbose=0's logger with no outputs (as the frameworks scenario: SB3's own makes a /tmp folder)
    model.set_logger(Logger(folder=None, output_formats=[]))

    class Snapshots(BaseCallback):
        def _on_training_start(self) -> None:
            rec.begin()  # after learn's env reset, before the first env step

        def _on_step(self) -> bool:
            rec.take(self.model.num_timesteps, self.model._n_updates, net)
            rec.check_time()
            return True

    try:
        model.learn(steps, callback=Snapshots())
        rec.final(model.num_timesteps, model._n_updates, net)
        wall = rec.elapsed()
    finally:
        model.get_env().close()
    return rec, int(model.num_timesteps), int(model._n_updates), wall


# ---------------------------------------------------------------------------------- the seam
def train_peer(name: str, algo: str, env_id: str, seed: int, steps: int, snapshot_every: int,
               buffer: str | None = None, timeout_s: float | None = None) -> PeerRun:
    """Train peer ``name``'s ``algo`` on ``env_id`` for ``steps`` env steps (its trainer's
    granularity: Tianshou's last collection may add up to ``n_envs - 1`` more, SB3's DQN rounds up
    to its ``train_freq``) with its published settings (:data:`SETTINGS`), snapshotting every
    ``snapshot_every`` gradient updates and at the end (module docstring).

    ``buffer``: None (or ``"own"``) for the framework's own buffer (Tianshou's prioritized one
    for DQN, its uniform ``VectorReplayBuffer`` for TD3; SB3's uniform ``ReplayBuffer``), else a
    registered variant of ours through the adapters. ``timeout_s``: TimeoutError naming the peer
    once a hook sees the run past it.

    Raises, before any work: ValueError naming the argument for an unknown ``name``, ``algo``,
    ``env_id`` or ``buffer``, a ``snapshot_every`` or ``steps`` that is not a positive integer,
    a negative ``seed`` or a non-positive ``timeout_s``; ImportError naming the framework when it
    is not installed."""
    from replaybench.bench.scenarios.frameworks import OWN, missing_framework
    from replaybench.impl import registry

    entry = settings(name, algo, env_id)
    for arg, value in (("steps", steps), ("snapshot_every", snapshot_every)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{arg} must be a positive integer, got {value!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    if timeout_s is not None and not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
        raise ValueError(f"timeout_s must be a positive number of seconds or None, got {timeout_s!r}")
    buffer = OWN if buffer is None else buffer
    if buffer != OWN and buffer not in registry.names():
        raise ValueError(f"buffer: {buffer!r} is neither None (the framework's own) nor a registered variant "
                         f"({', '.join(registry.names())})")
    if buffer != OWN and (name, algo) == ("sb3", "td3"):
        raise ValueError(f"buffer: SB3's TD3 takes only None (its own uniform buffer; our SB3 adapter's "
                         f"prioritized learner is a DQN), got {buffer!r}")
    why = missing_framework(name)
    if why:
        raise ImportError(f"peer {name!r}: {why}")
    h = copy.deepcopy(entry["hyper"])
    rec_args = (name, int(snapshot_every), timeout_s)
    train = _train_tianshou if name == "tianshou" else _train_sb3
    rec, env_steps, updates, wall = train(algo, env_id, buffer, int(seed), int(steps), h, rec_args)
    return PeerRun(name, rec.snapshots, wall, env_steps, updates, {**h, "buffer": buffer})
