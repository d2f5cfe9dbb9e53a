"""The frameworks scenario: each framework's own DQN, with its own buffer and with ours.

One cell is one training run: a framework (``sb3``, ``tianshou``, ``torchrl``), a buffer
(``"own"``: the framework's own; else a registered variant, plugged in through
:mod:`replaybench.adapters`) and a seed. Within a suite every run of one framework has the same
environment, length and hyper-parameters, so the runs of one framework and seed differ only in
their buffer. Settings: :data:`HYPER` (:data:`A2C_HYPER` for ``"algo": "a2c"``), under the
suite's ``steps`` and ``hyper``, under its ``per_framework`` entries
(``{"sb3": {"steps": ..., "hyper": {...}, "source": "file and line of the settings"}}``), so
that each framework can run the settings its users run; a setting a framework's loop cannot
honour (:data:`FIXED`) is refused by name before any run.

- **sb3**: ``DQN`` with SB3's ``ReplayBuffer`` (own; SB3 has no prioritized replay, so its own
  run is uniform) vs ``PrioritizedDQN`` with :class:`replaybench.adapters.sb3.PrioritizedReplayBuffer`
  (beta fixed, as the other frameworks keep it); driven by ``model.learn``.
- **tianshou**: Tianshou's ``DQN`` algorithm, ``Collector`` over a ``DummyVectorEnv`` and
  ``PrioritizedVectorReplayBuffer`` (own) vs
  :class:`replaybench.adapters.tianshou.PrioritizedVectorReplayBuffer`; the loop is the one
  Tianshou's off-policy trainer runs (collect ``train_freq`` steps, then ``algorithm.update``),
  without its epochs, tests and logging.
- **torchrl**: a ``GymEnv``, ``QValueActor`` + ``EGreedyModule``, ``DQNLoss`` and
  ``HardUpdate`` around a ``TensorDictReplayBuffer`` with TorchRL's ``PrioritizedSampler`` (own)
  vs :class:`replaybench.adapters.torchrl.TensorDictPrioritizedReplayBuffer` (ours: the same
  TorchRL storage and writer, extend, sample and update each one pass over the storage's
  leaves, our sampler's priorities).

Each run is preceded by an untimed run of two batches with the same framework and buffer, so
numba kernels (ours load from the disk cache; Tianshou's segment tree compiles once per
process) and torch's first calls are not in the measured loop.

An Atari suite (``"atari": true``, SB3 only): the environment is made with SB3's
``make_atari_env`` and 4 stacked frames, and the policy is ``CnnPolicy`` (needs ``ale-py``:
``pip install 'replaybench[atari]'``); an ``ALE/...`` id is made as our own runs make it
(:func:`ale_kwargs`).

``"algo": "a2c"`` (SB3 only, buffers ``["own"]``): Stable-Baselines3's ``A2C`` as a reference for
our PAAC runs (issue 30): no replay buffer, so no replay share, speedup or profile; its episode
rows (raw returns over env steps, all environments together) draw beside PAAC's
(:mod:`analysis.plots.pong_reference`).

What is not the same across frameworks (each keeps its DQN's defaults): the loss (SB3 Huber
with gradient clipping at 10; Tianshou and TorchRL squared error), the network initialisation
and the order of random draws. Compare buffers within a framework; across frameworks only
the shape of the profile.

Rows (scenario "frameworks", ``variant`` the buffer, ``params`` holding ``framework`` and the
hyper-parameters), per run:

- op "summary": ``wall_per_step_s`` (s: wall time of the training loop over env steps),
  ``replay_share`` (fraction of that wall time spent in the buffer's add, sample and priority
  update calls), ``replay_per_step_s`` (s: the time of those calls over env steps, what issue
  29's "replay time per env step, ours over own" compares), ``buffer_share`` and
  ``buffer_per_step_s`` (the same for every call into the buffer: those three and the reads
  the framework's own code makes, Tianshou's ``buffer[indices]``, ``next``,
  ``unfinished_index``: :data:`TIANSHOU_READS`), ``time_to_threshold_s`` and
  ``steps_to_threshold`` (the first time the mean return of the last ``window`` episodes
  reached ``threshold``; status "skipped" when it did not), ``final_return`` (that mean at the
  end), and ``speedup_vs_own`` (x: the own buffer's ``wall_per_step_s`` over this buffer's,
  same framework and seed: with the suite's ``order`` "own-first", the own run's over this
  run's; with "abba", the mean of the own buffer's two runs over the mean of this buffer's two,
  on the row of this buffer's second run);
  the summary (:func:`format_table`) and the report set each buffer's median replay time per
  env step beside the own buffer's, the speedup beside issue 29's targets (suite ``targets``
  topic ``frameworks``) and say which bound holds (:func:`bench.derive.replay_bound`: the
  own buffer's share of the loop, every call into it, caps the speedup at
  ``1 / (1 - share_own)``);
- op "profile" (DQN): seconds in ``replay_add``, ``replay_sample``, ``replay_update``,
  ``replay_read`` (the framework's other calls into the buffer; 0 where it makes none) and
  ``other`` (everything else: environment, network, the framework's own overhead); a timed
  call made inside another (Tianshou's ``sample`` reading ``self[indices]``) counts once;
- op "episode", metric "return": one row per finished episode, with ``env_steps`` and ``wall_s``.

Order (suite ``order``): "own-first" (the default) runs, per framework and seed, the own
buffer and then each other buffer once. "abba" runs each buffer twice, in the order B, A, A, B
(A the own buffer, B the others, mirrored: B C A A C B with two), so that a drift of the host's
speed that is linear over a seed's runs adds the same to both buffers' means and cancels from
their ratio: single runs on a shared VM can vary by more than the speedups measured. It
doubles the suite's time. Every run gives its own rows (``repeat``: 0 or 1, the pass, on the
summary and profile rows); only the speedup is per seed.

Selection: ``--variants`` keeps the suite's buffers of those names (``own`` included).
"""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from dataclasses import dataclass, field

from replaybench.bench.scenarios import Cell, RunState, Scenario, Selection, SelectionError

__all__ = ["FRAMEWORKS", "ALGOS", "HYPER", "A2C_HYPER", "FIXED", "OWN", "RUNNERS", "Frameworks", "SCENARIO",
           "RunResult", "Timers", "target_rows", "epsilon", "warm_up", "ale_kwargs", "make_sb3_env", "run_sb3_a2c",
           "sb3_dqn", "tianshou_dqn", "missing_framework",
           "result_rows", "threshold_crossing", "format_table"]

FRAMEWORKS = ("sb3", "tianshou", "torchrl")

#: The name of "the framework's own buffer" in a suite's ``buffers`` and the rows' ``variant``.
OWN = "own"

ALGOS = ("dqn", "a2c")

#: DQN hyper-parameters every run of a suite shares (a suite's ``hyper`` overrides them, and its
#: ``per_framework[fw]["hyper"]`` overrides those for one framework). Steps are env steps (all
#: environments together); ``target_update`` is in env steps and becomes
#: ``target_update / train_freq * gradient_steps`` updates where a framework counts updates;
#: epsilon stays at ``eps_start`` for ``eps_hold`` env steps, then falls linearly to ``eps_end``
#: over ``eps_fraction`` of the run; ``n_envs`` environments step together; ``n_step``: n-step
#: returns; ``double_q``: double DQN targets.
HYPER = {"hidden": [64, 64], "lr": 1e-3, "gamma": 0.99, "batch_size": 64, "buffer_size": 50_000,
         "learning_starts": 1_000, "train_freq": 4, "gradient_steps": 1, "target_update": 500,
         "eps_start": 1.0, "eps_end": 0.05, "eps_fraction": 0.1, "alpha": 0.6, "beta": 0.4,
         "n_envs": 1, "n_step": 1, "eps_hold": 0, "double_q": False}

#: DQN settings a framework's runner cannot honour: ``{framework: {key: the only value it takes}}``
#: (SB3's DQN anneals epsilon by its own schedule and has no double Q; our SB3 adapter has no
#: n-step sampling; the TorchRL loop steps one ``GymEnv`` and builds one-step targets).
FIXED = {"sb3": {"n_step": 1, "eps_hold": 0, "double_q": False},
         "tianshou": {},
         "torchrl": {"n_envs": 1, "n_step": 1, "eps_hold": 0}}

#: A2C hyper-parameters (``"algo": "a2c"``, Stable-Baselines3 only): SB3's ``A2C`` defaults, with
#: ``n_envs`` environments, ``frame_stack`` frames stacked for Atari, and ``optimizer``
#: ``"rmsprop"`` (SB3's default: torch's RMSprop, alpha 0.99, eps ``rmsprop_eps``) or
#: ``"rmsprop-tf"`` (SB3's ``RMSpropTFLike``, eps ``rmsprop_eps``: what rl-baselines3-zoo sets).
A2C_HYPER = {"hidden": [64, 64], "lr": 7e-4, "gamma": 0.99, "n_envs": 1, "n_steps": 5, "gae_lambda": 1.0,
             "ent_coef": 0.0, "vf_coef": 0.5, "max_grad_norm": 0.5, "optimizer": "rmsprop", "rmsprop_eps": 1e-5,
             "normalize_advantage": False, "frame_stack": 4}
A2C_OPTIMIZERS = ("rmsprop", "rmsprop-tf")

#: What each framework's own buffer is (the rows' ``structure`` for ``variant == "own"``).
OWN_STRUCTURE = {"sb3": "sb3-uniform", "tianshou": "tianshou-segment-tree", "torchrl": "torchrl-segment-tree"}

#: The buffer's methods Tianshou's loop calls besides add, sample and update_weight (its n-step
#: returns at every update: ``buffer[indices]``, ``next``, ``unfinished_index``; the collector's
#: ``buffer[episode]``), timed as ``replay_read``: part of the buffer's cost in that loop, which
#: the bound on the speedup counts (:func:`bench.derive.replay_versus_own`).
TIANSHOU_READS = ("__getitem__", "next", "prev", "unfinished_index", "sample_indices")

#: The replay sections: the calls issue 29's replay time counts, then every call into the buffer.
REPLAY_SECTIONS = ("replay_add", "replay_sample", "replay_update")
BUFFER_SECTIONS = (*REPLAY_SECTIONS, "replay_read")

SUMMARY_UNITS = {"wall_per_step_s": "s", "replay_share": "fraction", "replay_per_step_s": "s",
                 "buffer_share": "fraction", "buffer_per_step_s": "s", "time_to_threshold_s": "s",
                 "steps_to_threshold": "steps", "final_return": "return", "speedup_vs_own": "x"}


# ------------------------------------------------------------------------------------------ timing
class Timers:
    """Seconds spent in chosen methods of chosen objects, accumulated by section name.

    Only the outermost timed call counts: a timed method that calls another (Tianshou's own
    ``sample`` reads its rows through ``self[indices]``) is counted once, in its own section."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)
        self._inside = False  # a timed call is running (the loops are single-threaded)

    def _timed(self, original, section: str):
        """``original`` timed into ``section`` unless a timed call is already running."""
        seconds = self.seconds
        clock = time.perf_counter

        def timed(*args, **kwargs):
            if self._inside:
                return original(*args, **kwargs)
            self._inside = True
            t = clock()
            try:
                return original(*args, **kwargs)
            finally:
                seconds[section] += clock() - t
                self._inside = False

        return timed

    def wrap(self, obj, method: str, section: str) -> None:
        """Replace ``obj.method`` (on the instance) by a timed call of the original."""
        setattr(obj, method, self._timed(getattr(obj, method), section))

    def wrap_class(self, obj, sections: dict[str, str]) -> None:
        """Time methods ``sections`` (``{method: section}``) of ``obj`` where Python looks them
        up for every call, the special ones included (``obj[i]`` finds ``__getitem__`` on the
        type, never on the instance): ``obj`` gets a subclass of its class with the timed
        methods, and keeps its state and everything else of its class."""
        cls = type(obj)
        # the timed wrapper is a plain function, so the subclass binds it as it bound the original
        timed = {m: self._timed(getattr(cls, m), s) for m, s in sections.items()}
        obj.__class__ = type(f"Timed{cls.__name__}", (cls,), {"__module__": cls.__module__, **timed})

    def call(self, section: str, fn, *args, **kwargs):
        """``fn(*args, **kwargs)``, timed into ``section``."""
        return self._timed(fn, section)(*args, **kwargs)


@dataclass
class RunResult:
    """One run: loop wall seconds, env steps, replay seconds by section, finished episodes as
    ``(env_steps, wall_s, return)``."""

    wall_s: float
    steps: int
    replay: dict
    episodes: list = field(default_factory=list)


def epsilon(h: dict, step: int, steps: int) -> float:
    """Exploration at env step ``step`` of ``steps``: ``eps_start`` for the first ``eps_hold``
    steps, then linear to ``eps_end`` over ``eps_fraction * steps`` steps, then ``eps_end``."""
    frac = min(1.0, max(0, step - h["eps_hold"]) / max(1.0, h["eps_fraction"] * steps))
    return h["eps_start"] + frac * (h["eps_end"] - h["eps_start"])


# ------------------------------------------------------------------------------------------ runners
def sb3_dqn(env_id: str, buffer: str, seed: int, h: dict, atari: bool = False):
    """Stable-Baselines3's model for ``h`` (:data:`HYPER`'s keys): ``DQN`` with its own uniform
    ``ReplayBuffer`` (``buffer`` :data:`OWN`), else ``PrioritizedDQN`` over variant ``buffer``
    (beta fixed); built, not run. Shared with :mod:`bench.peers.trainers`."""
    from stable_baselines3 import DQN

    from replaybench.adapters.sb3 import PrioritizedDQN

    env = make_sb3_env(env_id, seed, h["n_envs"], atari, 4)
    policy = "CnnPolicy" if atari else "MlpPolicy"
    common = dict(learning_rate=h["lr"], buffer_size=h["buffer_size"], learning_starts=h["learning_starts"],
                  batch_size=h["batch_size"], gamma=h["gamma"], train_freq=h["train_freq"],
                  gradient_steps=h["gradient_steps"], target_update_interval=h["target_update"],
                  exploration_initial_eps=h["eps_start"], exploration_final_eps=h["eps_end"],
                  exploration_fraction=h["eps_fraction"], policy_kwargs={"net_arch": list(h["hidden"])},
                  seed=seed, device="cpu", verbose=0)
    if buffer == OWN:
        model = DQN(policy, env, **common)
    else:
        model = PrioritizedDQN(policy, env, final_beta=None, **common,
                               replay_buffer_kwargs={"variant": buffer, "alpha": h["alpha"], "beta": h["beta"],
                                                     "seed": seed})
    return model


def run_sb3(env_id: str, buffer: str, seed: int, steps: int, h: dict, atari: bool = False) -> RunResult:
    model = sb3_dqn(env_id, buffer, seed, h, atari)
    timers = Timers()
    for method, section in (("add", "replay_add"), ("sample", "replay_sample"), ("update_priorities", "replay_update")):
        if hasattr(model.replay_buffer, method):
            timers.wrap(model.replay_buffer, method, section)
    return _sb3_learn(model, steps, timers)


def ale_kwargs() -> dict:
    """How an ``ALE/...`` id is made for SB3's Atari wrappers, as :func:`impl.rl.common.envs.make_env`
    makes it for our runs: every frame emulated (AtariWrapper skips 4 and max-pools the last 2),
    no sticky actions, our episode limit in frames. (``...NoFrameskip-v4`` ids are these already.)"""
    from replaybench.impl.rl.common.atari import AtariOptions

    return {"frameskip": 1, "repeat_action_probability": 0.0, "max_num_frames_per_episode": AtariOptions().max_frames}


def make_sb3_env(env_id: str, seed: int, n_envs: int, atari: bool, frame_stack: int):
    """SB3's vector env of ``n_envs`` copies of ``env_id`` seeded from ``seed``; for Atari,
    ``make_atari_env`` (SB3's AtariWrapper: no-op starts, 4-frame skip with max-pool, 84x84
    grey by INTER_AREA, rewards clipped for learning; Monitor records the raw return) and
    ``frame_stack`` frames stacked (zeros before the first frame)."""
    from stable_baselines3.common.env_util import make_atari_env, make_vec_env
    from stable_baselines3.common.vec_env import VecFrameStack

    if not atari:
        return make_vec_env(env_id, n_envs=n_envs, seed=seed)
    import ale_py
    import gymnasium as gym

    gym.register_envs(ale_py)
    kwargs = ale_kwargs() if env_id.startswith("ALE/") else None
    return VecFrameStack(make_atari_env(env_id, n_envs=n_envs, seed=seed, env_kwargs=kwargs), n_stack=frame_stack)


def _sb3_learn(model, steps: int, timers: Timers) -> RunResult:
    """``model.learn(steps)``, timed, with each finished episode's raw return (SB3's Monitor)."""
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.logger import Logger

    # verbose=0's logger with no outputs, made here: SB3's own would make an empty folder under
    # /tmp on every learn (its default log folder), never removed
    model.set_logger(Logger(folder=None, output_formats=[]))
    episodes: list = []
    start = time.perf_counter()

    class Episodes(BaseCallback):
        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    episodes.append((self.num_timesteps, time.perf_counter() - start, float(info["episode"]["r"])))
            return True

    model.learn(steps, callback=Episodes())
    return RunResult(time.perf_counter() - start, int(model.num_timesteps), dict(timers.seconds), episodes)


def run_sb3_a2c(env_id: str, buffer: str, seed: int, steps: int, h: dict, atari: bool = False) -> RunResult:
    """Stable-Baselines3's A2C (``h``: :data:`A2C_HYPER`'s keys) for ``steps`` env steps; no
    replay buffer (``buffer`` is always ``"own"``), so ``replay`` is empty."""
    from stable_baselines3 import A2C
    from stable_baselines3.common.sb2_compat.rmsprop_tf_like import RMSpropTFLike

    env = make_sb3_env(env_id, seed, h["n_envs"], atari, h["frame_stack"])
    policy_kwargs = {} if atari else {"net_arch": list(h["hidden"])}
    if h["optimizer"] == "rmsprop-tf":
        # as rl-baselines3-zoo's policy_kwargs: A2C then keeps this class (alpha 0.99, no decay)
        policy_kwargs.update(optimizer_class=RMSpropTFLike, optimizer_kwargs={"eps": h["rmsprop_eps"]})
    model = A2C("CnnPolicy" if atari else "MlpPolicy", env, learning_rate=h["lr"], n_steps=h["n_steps"],
                gamma=h["gamma"], gae_lambda=h["gae_lambda"], ent_coef=h["ent_coef"], vf_coef=h["vf_coef"],
                max_grad_norm=h["max_grad_norm"], rms_prop_eps=h["rmsprop_eps"],
                normalize_advantage=h["normalize_advantage"], policy_kwargs=policy_kwargs, seed=seed, device="cpu",
                verbose=0)
    return _sb3_learn(model, steps, Timers())


def tianshou_dqn(env_id: str, buffer: str, seed: int, h: dict):
    """Tianshou's DQN for ``h`` (:data:`HYPER`'s keys), seeded, built and not run: ``(envs,
    policy, algorithm, buf)``, a ``DummyVectorEnv`` of ``n_envs`` copies, the
    ``DiscreteQLearningPolicy`` (epsilon ``eps_start``), the ``DQN`` algorithm and the
    prioritized vector buffer (Tianshou's own for ``buffer`` :data:`OWN`, else ours over variant
    ``buffer``). Shared with :mod:`bench.peers.trainers`."""
    import gymnasium as gym
    import numpy as np
    import torch
    from tianshou.algorithm import DQN
    from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou.data import PrioritizedVectorReplayBuffer as TianshouPrioritizedVector
    from tianshou.env import DummyVectorEnv
    from tianshou.utils.net.common import Net

    from replaybench.adapters.tianshou import PrioritizedVectorReplayBuffer

    torch.manual_seed(seed)
    np.random.seed(seed)
    envs = DummyVectorEnv([lambda: gym.make(env_id)] * h["n_envs"])
    envs.seed(seed)
    space = envs.observation_space[0], envs.action_space[0]
    net = Net(state_shape=space[0].shape, action_shape=space[1].n, hidden_sizes=list(h["hidden"]))
    policy = DiscreteQLearningPolicy(model=net, action_space=space[1], eps_training=h["eps_start"])
    updates_between_targets = max(1, round(h["target_update"] / h["train_freq"] * h["gradient_steps"]))
    algorithm = DQN(policy=policy, optim=AdamOptimizerFactory(lr=h["lr"]), gamma=h["gamma"],
                    n_step_return_horizon=h["n_step"], target_update_freq=updates_between_targets,
                    is_double=h["double_q"])
    # The vector buffer, one sub-buffer per environment, as Tianshou's own DQN examples build it
    if buffer == OWN:
        buf = TianshouPrioritizedVector(h["buffer_size"], envs.env_num, alpha=h["alpha"], beta=h["beta"],
                                        random_seed=seed)
    else:
        buf = PrioritizedVectorReplayBuffer(h["buffer_size"], envs.env_num, h["alpha"], h["beta"], variant=buffer,
                                            random_seed=seed)
    return envs, policy, algorithm, buf


def run_tianshou(env_id: str, buffer: str, seed: int, steps: int, h: dict) -> RunResult:
    from tianshou.data import Collector
    from tianshou.utils.torch_utils import policy_within_training_step

    envs, policy, algorithm, buf = tianshou_dqn(env_id, buffer, seed, h)
    timers = Timers()
    timers.wrap_class(buf, {"add": "replay_add", "sample": "replay_sample", "update_weight": "replay_update",
                            **{m: "replay_read" for m in TIANSHOU_READS}})
    collector = Collector(algorithm, envs, buf, exploration_noise=True)
    collector.reset()
    episodes, done = [], 0
    start = time.perf_counter()
    with policy_within_training_step(policy):
        while done < steps:
            policy.set_eps_training(epsilon(h, done, steps))
            stats = collector.collect(n_step=h["train_freq"])
            done += stats.n_collected_steps
            now = time.perf_counter() - start
            episodes.extend((done, now, float(r)) for r in stats.returns)
            if done >= h["learning_starts"]:
                for _ in range(h["gradient_steps"]):
                    algorithm.update(buffer=buf, sample_size=h["batch_size"])
    return RunResult(time.perf_counter() - start, done, dict(timers.seconds), episodes)


def run_torchrl(env_id: str, buffer: str, seed: int, steps: int, h: dict) -> RunResult:
    import torch
    from tensordict.nn import TensorDictSequential
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
    from torchrl.data.replay_buffers.samplers import PrioritizedSampler as TorchRLPrioritized
    from torchrl.envs import GymEnv
    from torchrl.modules import MLP, EGreedyModule, QValueActor
    from torchrl.objectives import DQNLoss, HardUpdate

    from replaybench.adapters.torchrl import TensorDictPrioritizedReplayBuffer

    torch.manual_seed(seed)
    env = GymEnv(env_id)
    env.set_seed(seed)
    n_obs, n_act = env.observation_spec["observation"].shape[-1], env.action_spec.shape[-1]
    actor = QValueActor(MLP(in_features=n_obs, out_features=n_act, num_cells=list(h["hidden"])),
                        in_keys=["observation"], spec=env.action_spec)
    explore = EGreedyModule(env.action_spec, eps_init=h["eps_start"], eps_end=h["eps_end"],
                            annealing_num_steps=max(1, int(h["eps_fraction"] * steps)))
    policy = TensorDictSequential(actor, explore)
    loss = DQNLoss(actor, action_space=env.action_spec, delay_value=True, loss_function="l2",
                   double_dqn=h["double_q"])
    loss.make_value_estimator(gamma=h["gamma"])
    target = HardUpdate(loss, value_network_update_interval=max(
        1, round(h["target_update"] / h["train_freq"] * h["gradient_steps"])))
    optim = torch.optim.Adam(loss.parameters(), lr=h["lr"])
    cap = h["buffer_size"]
    if buffer == OWN:
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(cap), sampler=TorchRLPrioritized(cap, h["alpha"], h["beta"]),
                                    priority_key="td_error", batch_size=h["batch_size"])
    else:  # ours as a TorchRL user builds it: the buffer whose extend, sample and update are one pass each
        rb = TensorDictPrioritizedReplayBuffer(alpha=h["alpha"], beta=h["beta"], storage=LazyTensorStorage(cap),
                                               priority_key="td_error", batch_size=h["batch_size"], variant=buffer)
    timers = Timers()
    episodes, ret = [], 0.0
    td = env.reset()
    start = time.perf_counter()
    for step in range(1, steps + 1):
        with torch.no_grad():
            td = env.step(policy(td))
        timers.call("replay_add", rb.extend, td.unsqueeze(0))
        ret += float(td["next", "reward"])
        explore.step()
        td = env.step_mdp(td)
        if td["done"].item():
            episodes.append((step, time.perf_counter() - start, ret))
            td, ret = env.reset(), 0.0
        if step >= h["learning_starts"] and step % h["train_freq"] == 0:
            for _ in range(h["gradient_steps"]):
                sample = timers.call("replay_sample", rb.sample)
                out = loss(sample)
                optim.zero_grad()
                out["loss"].backward()
                optim.step()
                target.step()
                timers.call("replay_update", rb.update_tensordict_priority, sample)
    return RunResult(time.perf_counter() - start, steps, dict(timers.seconds), episodes)


#: ``{algo: {framework: runner}}``; a runner is ``(env_id, buffer, seed, steps, h, **extra) -> RunResult``.
RUNNERS = {"dqn": {"sb3": run_sb3, "tianshou": run_tianshou, "torchrl": run_torchrl},
           "a2c": {"sb3": run_sb3_a2c}}


# ------------------------------------------------------------------------------------------ rows
def threshold_crossing(episodes: list, threshold: float, window: int):
    """``(env_steps, wall_s)`` when the mean of the last ``window`` returns first reached
    ``threshold`` (at least ``window`` episodes), else None."""
    returns = [r for _, _, r in episodes]
    for i in range(window - 1, len(returns)):
        if sum(returns[i - window + 1: i + 1]) / window >= threshold:
            return episodes[i][0], episodes[i][1]
    return None


def result_rows(result: RunResult, base: dict, threshold: float, window: int, own_wall: float | None,
                replay_buffer: bool = True, mine_wall: float | None = None, repeat: int = 0) -> list[dict]:
    """The summary, profile and episode rows of one run (``base``: the cell's columns).

    ``speedup_vs_own`` is ``own_wall / mine_wall`` (wall time per env step; ``mine_wall``
    defaults to this run's), and no row when ``own_wall`` is None. ``repeat``: the run's pass
    (the suite's ``order``), on the summary and profile rows; episode rows count episodes.

    Without a replay buffer (``replay_buffer=False``: A2C) there is no replay share, speedup
    or profile: the summary holds the wall time per step, the threshold and the final return.
    A run whose episodes never reached ``threshold`` gets ``time_to_threshold_s`` and
    ``steps_to_threshold`` rows with status "skipped" saying so."""
    per_step = result.wall_s / result.steps
    replay = sum(result.replay.get(k, 0.0) for k in REPLAY_SECTIONS)
    calls = sum(result.replay.get(k, 0.0) for k in BUFFER_SECTIONS)
    crossing = threshold_crossing(result.episodes, threshold, window)
    last = [r for _, _, r in result.episodes[-window:]]
    values = {"wall_per_step_s": per_step, "replay_share": replay / result.wall_s,
              "replay_per_step_s": replay / result.steps, "buffer_share": calls / result.wall_s,
              "buffer_per_step_s": calls / result.steps, "time_to_threshold_s": crossing and crossing[1],
              "steps_to_threshold": crossing and crossing[0],
              "final_return": sum(last) / len(last) if last else None,
              "speedup_vs_own": own_wall / (mine_wall or per_step) if own_wall else None}
    if not replay_buffer:
        for metric in ("replay_share", "replay_per_step_s", "buffer_share", "buffer_per_step_s", "speedup_vs_own"):
            del values[metric]
    rows = []
    for metric, value in values.items():
        if metric == "speedup_vs_own" and value is None:
            continue
        row = {**base, "op": "summary", "metric": metric, "unit": SUMMARY_UNITS[metric], "repeat": repeat}
        if value is None:
            why = (f"threshold {threshold:g} (mean return of {window} episodes) not reached in {result.steps} env "
                   f"steps ({len(result.episodes)} episodes)" if "threshold" in metric else "no episode finished")
            rows.append({**row, "status": "skipped", "error": why})
        else:
            rows.append({**row, "value": float(value), "status": "ok"})
    if replay_buffer:
        sections = {s: result.replay.get(s, 0.0) for s in BUFFER_SECTIONS}
        sections["other"] = max(0.0, result.wall_s - calls)
        rows += [{**base, "op": "profile", "metric": s, "value": v, "unit": "s", "repeat": repeat, "status": "ok"}
                 for s, v in sections.items()]
    rows += [{**base, "op": "episode", "metric": "return", "value": r, "unit": "return", "repeat": i,
              "env_steps": s, "wall_s": w, "status": "ok"} for i, (s, w, r) in enumerate(result.episodes)]
    return rows


# ------------------------------------------------------------------------------------------ scenario
def _positive_int(value, low: int = 1) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value >= low


def _check_hyper(where: str, algo: str, fw: str, hyper: dict) -> None:
    """SelectionError naming the first key of one framework's ``hyper`` that is unknown,
    ill-typed or one its runner cannot honour (:data:`FIXED`)."""
    known = HYPER if algo == "dqn" else A2C_HYPER
    unknown = sorted(set(hyper) - set(known))
    if unknown:
        raise SelectionError(f"{where}: unknown 'hyper' key(s) {unknown} for algo {algo!r}; known: {sorted(known)}")
    ints = (("batch_size", 1), ("buffer_size", 1), ("learning_starts", 0), ("train_freq", 1), ("gradient_steps", 1),
            ("target_update", 1), ("n_envs", 1), ("n_step", 1), ("eps_hold", 0)) if algo == "dqn" else \
        (("n_envs", 1), ("n_steps", 1), ("frame_stack", 1))
    for key, low in ints:
        if not _positive_int(hyper[key], low):
            raise SelectionError(f"{where}: hyper[{key!r}] must be an integer >= {low}, got {hyper[key]!r}")
    for key in ("double_q",) if algo == "dqn" else ("normalize_advantage",):
        if not isinstance(hyper[key], bool):
            raise SelectionError(f"{where}: hyper[{key!r}] must be true or false, got {hyper[key]!r}")
    if algo == "a2c" and hyper["optimizer"] not in A2C_OPTIMIZERS:
        raise SelectionError(f"{where}: hyper['optimizer'] must be one of {list(A2C_OPTIMIZERS)}, "
                             f"got {hyper['optimizer']!r}")
    if algo == "dqn":
        for key, only in FIXED[fw].items():
            if hyper[key] != only:
                raise SelectionError(f"{where}: {fw}'s DQN loop takes only hyper[{key!r}] = {only!r}, "
                                     f"got {hyper[key]!r}")
        if fw == "tianshou" and hyper["train_freq"] % hyper["n_envs"]:
            raise SelectionError(f"{where}: tianshou collects train_freq env steps over all n_envs environments: "
                                 f"hyper['train_freq'] must be a multiple of n_envs {hyper['n_envs']}, "
                                 f"got {hyper['train_freq']!r}")


def _check_suite(suite: dict) -> dict:
    """The suite's settings, checked; SelectionError naming the first bad one.

    Returns ``frameworks``, ``algo``, ``seeds``, ``window``, ``threshold``, ``env``, ``atari``,
    ``torch_threads``, ``order`` (:data:`ORDERS`) and ``runs``: ``{framework: {"steps",
    "hyper"}}``, the suite's ``steps`` and ``hyper`` over the algorithm's defaults with the
    framework's ``per_framework`` entry (``{"steps", "hyper", "source"}``, each optional) over
    them."""
    where = f"suite {suite['name']!r}"
    algo = suite.get("algo", "dqn")
    if algo not in ALGOS:
        raise SelectionError(f"{where}: 'algo' must be one of {list(ALGOS)}, got {algo!r}")
    fws = suite.get("frameworks", list(FRAMEWORKS))
    if not isinstance(fws, list) or not fws or set(fws) - set(FRAMEWORKS):
        raise SelectionError(f"{where}: 'frameworks' must be a non-empty list of {list(FRAMEWORKS)}, got {fws!r}")
    if set(fws) - set(RUNNERS[algo]):
        raise SelectionError(f"{where}: algo {algo!r} runs in {sorted(RUNNERS[algo])} only, got frameworks {fws}")
    per = suite.get("per_framework", {})
    if not isinstance(per, dict) or set(per) - set(fws) or not all(isinstance(v, dict) for v in per.values()):
        raise SelectionError(f"{where}: 'per_framework' must map frameworks of the suite ({fws}) to objects, "
                             f"got {per!r}")
    seeds = suite.get("seeds", [0])
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and s >= 0 for s in seeds):
        raise SelectionError(f"{where}: 'seeds' must be a non-empty list of non-negative integers, got {seeds!r}")
    runs = {}
    for fw in fws:
        own = per.get(fw, {})
        extra = sorted(set(own) - {"steps", "hyper", "source"})
        if extra:
            raise SelectionError(f"{where}: per_framework[{fw!r}] has unknown key(s) {extra}; known: "
                                 f"['hyper', 'source', 'steps']")
        steps = own.get("steps", suite.get("steps"))
        if not _positive_int(steps):
            raise SelectionError(f"{where}: 'steps' must be a positive integer, got {steps!r} for {fw}")
        hyper = {**(HYPER if algo == "dqn" else A2C_HYPER), **(suite.get("hyper") or {}), **(own.get("hyper") or {})}
        _check_hyper(where if fw not in per else f"{where}, per_framework[{fw!r}]", algo, fw, hyper)
        runs[fw] = {"steps": steps, "hyper": hyper}
    window = suite.get("window", 20)
    if not _positive_int(window):
        raise SelectionError(f"{where}: 'window' must be a positive integer, got {window!r}")
    threshold = suite.get("threshold", 475.0)
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not math.isfinite(threshold):
        raise SelectionError(f"{where}: 'threshold' must be a finite number, got {threshold!r}")
    atari = suite.get("atari", False)
    if not isinstance(atari, bool) or (atari and fws != ["sb3"]):
        raise SelectionError(f"{where}: 'atari' must be true or false, and true only with frameworks ['sb3'], "
                             f"got {atari!r} with {fws}")
    threads = suite.get("torch_threads", 1)
    if not _positive_int(threads):
        raise SelectionError(f"{where}: 'torch_threads' must be a positive integer, got {threads!r}")
    order = suite.get("order", "own-first")
    if not isinstance(order, str) or order not in ORDERS:  # a list is unhashable: checked as a string first
        raise SelectionError(f"{where}: 'order' must be one of {list(ORDERS)}, got {order!r}")
    return {"frameworks": fws, "algo": algo, "runs": runs, "seeds": seeds, "window": window,
            "threshold": float(threshold), "env": suite.get("env", "CartPole-v1"), "atari": atari,
            "torch_threads": threads, "order": order}


#: The suite's ``order``: how many runs each buffer gets per framework and seed.
ORDERS = {"own-first": 1, "abba": 2}


def run_order(buffers: list[str], order: str) -> list[tuple[int, str]]:
    """``(pass, buffer)`` in the order one framework and seed runs them (``buffers`` with
    :data:`OWN` first when it is there): "own-first" as given; "abba" the others, the own
    buffer, then the own buffer again and the others mirrored (B C A A C B), so each pair's
    runs sit symmetrically about the middle. O(buffers)."""
    if order == "own-first":
        return [(0, b) for b in buffers]
    own, others = [b for b in buffers if b == OWN], [b for b in buffers if b != OWN]
    return [(0, b) for b in others + own] + [(1, b) for b in own + others[::-1]]


def warm_up(algo: str, h: dict) -> tuple[int, dict]:
    """``(steps, hyper)`` of the untimed run before each measured one: for DQN, ``2 * batch_size
    + n_envs`` env steps with updates from step ``batch_size`` on, one per collection of
    ``n_envs`` steps (``batch_size / n_envs + 1`` updates: cheap whatever the suite's update
    ratio), into a buffer of four batches per environment; for A2C, two rollouts."""
    if algo == "a2c":
        return 2 * h["n_envs"] * h["n_steps"], dict(h)
    return (2 * h["batch_size"] + h["n_envs"],
            {**h, "learning_starts": h["batch_size"], "train_freq": h["n_envs"], "gradient_steps": 1,
             "buffer_size": 4 * h["batch_size"] * h["n_envs"]})


def missing_framework(fw: str) -> str:
    """Why ``fw``'s runs cannot start ("" when its package is installed). Looks the package up
    without importing it (seconds for these frameworks); one that is installed but fails to
    import fails its runs with the adapter's ImportError, which names the extra."""
    import importlib.util

    from replaybench.adapters import FRAMEWORKS as ADAPTERS

    module, dist, extra = ADAPTERS[fw]
    if importlib.util.find_spec(module) is None:
        return f"{dist} is not installed: pip install 'replaybench[{extra}]'"
    return ""


class Frameworks(Scenario):
    """Each framework's own DQN with its own buffer and with ours (see the module docstring)."""

    name = "frameworks"
    suite_keys = frozenset({"frameworks", "algo", "env", "atari", "buffers", "hyper", "per_framework", "order",
                            "seeds", "steps", "threshold", "torch_threads", "window"})
    unit = "run"

    def cells(self, suite: dict, selection: Selection) -> list[Cell]:
        from replaybench.impl import registry

        s = _check_suite(suite)
        buffers = suite.get("buffers", [OWN, "kary-aligned", "binary"] if s["algo"] == "dqn" else [OWN])
        if not isinstance(buffers, list) or not buffers:
            raise SelectionError(f"suite {suite['name']!r}: 'buffers' must be a non-empty list, got {buffers!r}")
        if s["algo"] != "dqn" and buffers != [OWN]:
            raise SelectionError(f"suite {suite['name']!r}: algo {s['algo']!r} has no replay buffer: 'buffers' must "
                                 f"be [{OWN!r}], got {buffers!r}")
        for b in buffers:
            if b != OWN and b not in registry.names():
                raise SelectionError(f"suite {suite['name']!r}: buffer {b!r} is neither {OWN!r} nor a registered "
                                     f"variant ({', '.join(registry.names())})")
        if selection.variants:
            unknown = sorted(set(selection.variants) - set(buffers))
            if unknown:
                raise SelectionError(f"--variants: {unknown} not among the suite's buffers {buffers}")
            buffers = [b for b in buffers if b in selection.variants]
        buffers = sorted(buffers, key=lambda b: b != OWN)  # own first: the others compare with it
        cells = []
        for fw in s["frameworks"]:
            why = missing_framework(fw)
            run = s["runs"][fw]
            for seed in s["seeds"]:
                for repeat, b in run_order(buffers, s["order"]):
                    info = None if b == OWN else registry.get(b)
                    params = {"framework": fw, "steps": run["steps"], "threshold": s["threshold"],
                              "window": s["window"], "hyper": run["hyper"], "torch_threads": s["torch_threads"]}
                    structure = ("none" if s["algo"] != "dqn" else OWN_STRUCTURE[fw]) if info is None \
                        else info.structure
                    columns = {"variant": b, "structure": structure,
                               "policy": "none", "K": None if info is None else info.params.get("K"),
                               "params": params, "capacity": run["hyper"].get("buffer_size"),
                               "batch": run["hyper"].get("batch_size"), "algo": s["algo"], "env": s["env"], "seed": seed,
                               "actors": 0, "learners": 0, "op": "summary", "metric": "wall_per_step_s",
                               "unit": "s"}
                    label = f"{fw} {b} seed={seed}" + (f" pass={repeat}" if s["order"] != "own-first" else "")
                    cells.append(Cell(label, columns, (fw, b, seed, repeat, s), skip=why, skip_status="unavailable"))
        return cells

    def meta(self, suite: dict, selection: Selection, cells: list[Cell]) -> dict:
        from importlib.metadata import PackageNotFoundError, version

        versions = {}
        for dist in ("stable-baselines3", "tianshou", "torchrl-nightly", "torchrl", "tensordict-nightly", "torch"):
            try:
                versions[dist] = version(dist)
            except PackageNotFoundError:
                pass
        return {"framework_versions": versions,
                "timing": "wall-clock of the training loop (after the model and buffer are built, and after an "
                          "untimed warm-up run of 2 batches that loads the kernels); replay = the buffer's add, "
                          "sample and priority-update calls, timed around each call"}

    def measure(self, cell: Cell, run: RunState) -> list[dict]:
        import torch

        fw, buffer, seed, repeat, s = cell.spec
        threads = torch.get_num_threads()
        torch.set_num_threads(s["torch_threads"])
        runner = RUNNERS[s["algo"]][fw]
        h, steps, extra = s["runs"][fw]["hyper"], s["runs"][fw]["steps"], ({"atari": True} if s["atari"] else {})
        try:
            # A short untimed run first: numba kernels (ours cached on disk, Tianshou's compiled
            # per process) and torch's first calls load outside the measured loop.
            runner(s["env"], buffer, seed, *warm_up(s["algo"], h), **extra)
            result = runner(s["env"], buffer, seed, steps, dict(h), **extra)
        finally:
            torch.set_num_threads(threads)
        # Wall time per env step of every run so far, by (framework, buffer, seed): a buffer's
        # speedup is known once its runs and the own buffer's are all done.
        walls = run.state.setdefault("wall_per_step", {})
        mine = walls.setdefault((fw, buffer, seed), [])
        mine.append(result.wall_s / result.steps)
        own, passes = walls.get((fw, OWN, seed), []), ORDERS[s["order"]]
        complete = buffer != OWN and len(own) == len(mine) == passes
        return result_rows(result, cell.columns, s["threshold"], s["window"],
                           sum(own) / passes if complete else None, replay_buffer=s["algo"] == "dqn",
                           mine_wall=sum(mine) / passes if complete else None, repeat=repeat)

    def summarize(self, rows: list[dict], meta: dict) -> str:
        from replaybench.bench import derive

        return format_table(rows, derive.recorded(meta, "targets", "frameworks"))


def target_rows(groups: dict, targets: dict | None = None) -> dict[tuple, dict]:
    """Per ``(framework, buffer)`` other than the own buffer, from the medians over seeds in
    ``groups`` (``{(framework, buffer): {metric: [values]}}``): that buffer against the own one
    (:func:`bench.derive.replay_versus_own`: replay time per env step ours/own, speedup, the
    bound). A pair without both runs' replay times is left out. O(rows)."""
    import statistics

    from replaybench.bench import derive

    def medians(g):
        return {m: statistics.median(g[m]) for m in ("replay_per_step_s", "replay_share", "buffer_per_step_s",
                                                      "buffer_share", "speedup_vs_own") if g[m]}

    out = {}
    for (fw, b), g in groups.items():
        if b != OWN and (fw, OWN) in groups:
            v = derive.replay_versus_own(fw, medians(groups[(fw, OWN)]), medians(g), targets)
            if v is not None:
                out[(fw, b)] = v
    return out


def format_table(rows: list[dict], targets: dict | None = None) -> str:
    """Per framework and buffer: medians over runs of the summary metrics, and the run count
    (seeds x the suite's passes); time and steps to threshold over the runs that reached them,
    with how many did; against the own buffer, replay time per env step (ours / own, with its
    target), the speedup and which bound holds (:func:`target_rows`)."""
    import statistics

    from replaybench.bench import derive
    from replaybench.bench.summary import format_table as table

    groups: dict[tuple, dict] = {}
    for r in rows:
        params = json.loads(r["params"]) if isinstance(r["params"], str) else r["params"]
        key = (params.get("framework"), r["variant"])
        g = groups.setdefault(key, defaultdict(list))
        if r["op"] == "summary" and r["status"] == "ok":
            g[r["metric"]].append(float(r["value"]))
        elif r["op"] == "summary" and r["metric"] == "wall_per_step_s":
            g["status"].append(f"{r['status']}: {(r.get('error') or '')[:60]}")
        if r["op"] == "summary" and r["metric"] == "wall_per_step_s":
            g["seeds"].append(r.get("seed"))
    versus = target_rows(groups, targets)

    def med(values, fmt):
        return fmt.format(statistics.median(values)) if values else "-"

    def threshold(g, metric, fmt):
        # every run of the row says whether it reached the threshold: "12 (3/5)" or "not reached (0/5)"
        reached, runs = len(g[metric]), len(g["seeds"])
        return f"{med(g[metric], fmt)} ({reached}/{runs})" if reached else f"not reached (0/{runs})"

    def against(key):
        v = versus.get(key)
        if v is None:
            return ["-", "-"]
        goal = "reported" if v["replay_target"] is None else f"<= {v['replay_target']:g}"
        return [f"{v['replay_ratio']:.2f} ({goal})",
                f"{v['bound'] or '-'} (max {v['ceiling']:.2f}x, buffer alone {v['predicted']:.2f}x)"]

    body = [[fw or "-", b, str(len(g["seeds"])), med([v * 1e3 for v in g["wall_per_step_s"]], "{:.3f}"),
             med(g["replay_share"], "{:.1%}"), med([v * 1e3 for v in g["replay_per_step_s"]], "{:.4f}"),
             *against((fw, b))[:1], med(g["speedup_vs_own"], "{:.2f}"), *against((fw, b))[1:],
             threshold(g, "time_to_threshold_s", "{:.0f}"), threshold(g, "steps_to_threshold", "{:.0f}"),
             med(g["final_return"], "{:.0f}"), "; ".join(g["status"])[:80]] for (fw, b), g in groups.items()]
    goal = (targets or {}).get("speedup_at_least", derive.FRAMEWORK_TARGETS["speedup_at_least"])
    header = ["framework", "buffer", "runs", "ms/step", "replay share", "replay ms/step", "replay vs own",
              f"speedup vs own (>= {goal:g})", "bound", "t_thresh s", "steps_thresh", "final return",
              "not measured"]
    return "\n".join(table(header, body, {2, 3, 4, 5, 7, 9, 10, 11}))


SCENARIO = Frameworks()
