"""What an algorithm gives the training loops: a config, an actor and a learner.

- :class:`AlgoConfig`: the fields both loops read (batch size, capacity, learning start,
  replay ratio, the PER constants), :meth:`AlgoConfig.for_env` (per-environment presets plus
  overrides, each checked against the fields and typed by them) and :meth:`AlgoConfig.beta`.
  An algorithm's config is a dataclass deriving from it.
- :class:`Actor`: ``act_batch(obs, env_steps)`` (one forward for E observations; ``act`` for
  one comes with the protocol), ``env_action(action)``, ``set_flat_weights(flat)``.
- :class:`Learner`: ``learn(batch) -> (loss, priorities)``, ``grad_hook``, ``policy_net``,
  ``modules()``; ``get_flat_weights()`` and ``digest()`` come with the protocol.

Both are :class:`typing.Protocol` classes: the loops are typed against them, and an algorithm
may subclass them to inherit the default methods. Construction is part of the contract
(:class:`~impl.rl.algorithms.Algorithm` holds the classes): ``Actor(spaces, cfg, seed,
net=None)`` and ``Learner(spaces, cfg, seed)``, with ``spaces`` = (observation_space,
action_space).
"""

from __future__ import annotations

import math
import types
import typing
from dataclasses import dataclass, fields, replace
from typing import Callable, ClassVar, Protocol

import numpy as np
import torch
from replaybench.impl.rl.algorithms.nets import flat_params, params_digest
from replaybench.impl.rl.common.errors import ConfigError
from torch import nn

__all__ = ["ConfigError", "AlgoConfig", "check_range", "UPDATES", "check_update", "resolve_update", "Actor", "Learner",
           "LEARNER_FIELDS"]


def _typed(name: str, hint, value):
    """``value`` as the field's type ``hint`` (int, float, bool, str, tuple[int, ...] or X | None).

    Integral floats are accepted for int fields (``1e3``), ints for float fields and a single
    int for a tuple (``--set hidden=64``); floats must be finite. Raises ConfigError otherwise.
    """
    if isinstance(hint, types.UnionType):  # X | None
        if value is None:
            return None
        hint = next(h for h in typing.get_args(hint) if h is not type(None))
    if hint is bool:
        if isinstance(value, (bool, np.bool_)):
            return bool(value)
        raise ConfigError(name, value, f"{name} must be true or false, got {value!r}")
    if typing.get_origin(hint) is tuple:
        items = (value,) if isinstance(value, (int, np.integer)) else value
        if not isinstance(items, (tuple, list)) or not items:
            raise ConfigError(name, value, f"{name} must be a comma-separated list of integers, got {value!r}")
        return tuple(_typed(name, int, v) for v in items)
    is_number = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))
    if hint is int:
        if is_number and float(value).is_integer():
            return int(value)
        raise ConfigError(name, value, f"{name} must be an integer, got {value!r}")
    if hint is float:
        if is_number and math.isfinite(value):
            return float(value)
        raise ConfigError(name, value, f"{name} must be a finite number, got {value!r}")
    if hint is str:  # a name among choices: the config's validate checks which
        if isinstance(value, str):
            return value
        raise ConfigError(name, value, f"{name} must be a string, got {value!r}")
    raise TypeError(f"field {name}: no rule for type {hint!r}")  # a config author's mistake


@dataclass
class AlgoConfig:
    """The fields both training loops read. Step counts are *environment* steps over all
    actors; update counts are *learner* updates (one optimizer step on ``batch_size`` rows).
    Subclasses redeclare a field to change its default."""

    batch_size: int = 64
    """Transitions per update; with L learners each samples ``batch_size // L``."""
    buffer_capacity: int = 50_000
    """Replay capacity (transitions); the oldest are overwritten first."""
    learning_starts: int = 1_000
    """Env steps stored before the first update (must be >= batch_size)."""
    updates_per_step: float = 0.25
    """The replay ratio: learner updates per env step (0.25 = one update every 4 steps).
    Samples per insert = ``updates_per_step * batch_size``; the parallel loop holds it with a
    rate limiter."""
    per_alpha: float = 0.6
    """Priority exponent: P(i) proportional to (|td_i| + per_eps) ** per_alpha."""
    per_beta_start: float = 0.4
    """Importance-sampling exponent at step 0, annealed linearly to 1.0 ..."""
    per_beta_steps: int = 50_000
    """... over this many env steps (unless ``per_beta_updates`` is set)."""
    per_beta_updates: int = 0
    """When > 0: the anneal takes this many learner updates instead (counted through the held
    replay ratio, as :meth:`updates_at` says), so a ratio change leaves beta at a given update
    count unchanged."""
    per_eps: float = 1e-6
    """Added to every priority so no transition becomes unsampleable."""

    PRESETS: ClassVar[dict] = {}
    """env id -> field overrides; each subclass sets its own."""

    @classmethod
    def for_env(cls, env_id: str, **overrides):
        """The preset for ``env_id`` (defaults when there is none) with ``overrides`` applied.

        Every override must name a field and is converted to the field's type (see
        :func:`_typed`); the result is :meth:`validate`-d. Raises ConfigError naming the
        field and the value.
        """
        hints = typing.get_type_hints(cls)
        names = [f.name for f in fields(cls)]
        typed = {}
        for name, value in {**cls.PRESETS.get(env_id, {}), **overrides}.items():
            if name not in names:
                raise ConfigError(name, value, f"{cls.__name__} has no field {name!r}; fields: {', '.join(names)}")
            typed[name] = _typed(name, hints[name], value)
        cfg = replace(cls(), **typed)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        """Raise ConfigError for a value the loops cannot run with (subclasses extend it)."""
        check_range(self, "batch_size", 1)
        check_range(self, "buffer_capacity", 1)
        if self.learning_starts < self.batch_size:
            raise ConfigError("learning_starts", self.learning_starts,
                              f"learning_starts ({self.learning_starts}) must be >= batch_size ({self.batch_size})")
        check_range(self, "updates_per_step", 0.0, low_open=True)
        check_range(self, "per_alpha", 0.0)
        check_range(self, "per_eps", 0.0)
        check_range(self, "per_beta_start", 0.0, 1.0)
        check_range(self, "per_beta_updates", 0)

    def updates_at(self, env_steps: int) -> float:
        """The learner updates made after ``env_steps`` env steps at the replay ratio the
        engines hold: ``(env_steps - learning_starts) x updates_per_step``, 0 before learning
        starts. The update-counted schedules read it."""
        return max(0, env_steps - self.learning_starts) * self.updates_per_step

    def beta(self, env_steps: int) -> float:
        """The importance-sampling exponent after ``env_steps``: per_beta_start -> 1 linearly."""
        if self.per_beta_updates > 0:
            frac = min(1.0, self.updates_at(env_steps) / self.per_beta_updates)
        else:
            frac = min(1.0, env_steps / max(1, self.per_beta_steps))
        return self.per_beta_start + frac * (1.0 - self.per_beta_start)


def check_range(cfg, name: str, low, high=math.inf, *, low_open: bool = False) -> None:
    """Raise ConfigError unless field ``name`` of ``cfg`` (every item, for a tuple; None
    passes) lies in ``[low, high]``, or ``(low, high]`` with ``low_open``."""
    value = getattr(cfg, name)
    for v in value if isinstance(value, tuple) else (value,):
        if v is not None and not (low < v <= high if low_open else low <= v <= high):
            if high == math.inf:
                bound = f"> {low}" if low_open else f">= {low}"
            else:
                bound = f"in {'(' if low_open else '['}{low}, {high}]"
            raise ConfigError(name, value, f"{name} must be {bound}, got {value!r}")


#: The values of an algorithm config's ``update`` field (DQN's, TD3's): how a learner's update
#: runs. ``"torch"``: torch's eager step, the reference and the only one off the CPU;
#: ``"numba"``: compiled kernels on flat vectors (:mod:`impl.rl.algorithms.compiled_step`, CPU
#: only); ``"auto"``: numba on the CPU, torch elsewhere.
UPDATES = ("auto", "torch", "numba")


def check_update(cfg) -> None:
    """Raise ConfigError (field "update") unless ``cfg.update`` is one of :data:`UPDATES`."""
    if cfg.update not in UPDATES:
        raise ConfigError("update", cfg.update, f"update must be one of {', '.join(UPDATES)}, got {cfg.update!r}")


def resolve_update(cfg, device) -> str:
    """The update a learner of ``cfg`` (a config with an ``update`` field) runs on ``device``:
    ``"torch"`` or ``"numba"``. Raises ConfigError for ``update="numba"`` off the CPU (its
    kernels run on the host). Cost: microseconds; it builds nothing."""
    on_cpu = torch.device(device).type == "cpu"
    if cfg.update == "numba" and not on_cpu:
        raise ConfigError("update", cfg.update, f"update='numba' runs on the CPU only, not on {device}")
    return "numba" if cfg.update == "numba" or (cfg.update == "auto" and on_cpu) else "torch"


class Actor(Protocol):
    """The acting half of an algorithm: a policy on a CPU copy of the policy network.

    Thread-safety: none; one per actor process (the sequential loop shares the learner's
    network through ``net``).
    """

    def act_batch(self, obs: np.ndarray, env_steps: int) -> np.ndarray:
        """The actions to store for a batch of observations (``obs``: (E, *obs_shape)
        float32), ``env_steps`` steps into the run (exploration schedules read it), with ONE
        forward pass; row ``j`` is env ``j``'s action. For E = 1 it draws exactly what
        :meth:`act` draws."""
        ...

    def act(self, obs: np.ndarray, env_steps: int):
        """The action to store for one observation: :meth:`act_batch` on one row."""
        return self.act_batch(np.asarray(obs, dtype=np.float32)[None], env_steps)[0]

    def greedy_batch(self, obs: np.ndarray) -> np.ndarray:
        """The policy's actions for each row of ``obs`` with exploration off (an evaluation's)."""
        ...

    def env_action(self, action):
        """``action`` as the environment takes it (e.g. scaled to a Box's bounds)."""
        ...

    def set_flat_weights(self, flat) -> None:
        """Load the policy from a vector made by :meth:`Learner.get_flat_weights`."""
        ...


LEARNER_FIELDS = ("obs", "action", "reward", "next_obs", "done", "weights")
"""The fields of a buffer sample that :meth:`Learner.learn` reads (the rest, ``indices``,
``stamps``, ``actor``, serve the priority update and the statistics)."""


class PendingLearn:
    """One update's ``(loss, priorities)`` (:meth:`Learner.learn_async`): ``done``, already on the
    host, or ``host``, a :class:`~impl.rl.common.device.PendingHost` of the loss and the |TD
    errors' float32 tensors; :meth:`result` gives ``(float loss, float64 priorities)``."""

    def __init__(self, done: tuple | None = None, host=None):
        self._done, self._host = done, host

    def result(self) -> tuple[float, np.ndarray]:
        if self._done is None:
            loss, td = self._host.result()
            self._done = (float(loss), td.astype(np.float64))
        return self._done


class Learner(Protocol):
    """The learning half: networks, optimizers and one update per :meth:`learn` call.

    Built as ``learner_cls(spaces, cfg, seed, device=torch.device("cpu"))``: ``device``
    (:mod:`impl.rl.common.device`) holds the networks, their targets and the optimizer state;
    the networks are built on the CPU from the seed and then moved, so learners built with the
    same seed start bitwise identical on any device. Thread-safety: none.
    """

    grad_hook: Callable[[list], None] | None
    """Called with each parameter list between backward and the optimizer step (the parallel
    loop averages gradients across learners there); None: nothing."""

    @property
    def policy_net(self) -> nn.Module:
        """The network actors run."""
        ...

    def learn(self, batch: dict) -> tuple[float, np.ndarray]:
        """One update on ``batch`` (a buffer sample holding the transition fields and
        ``weights``, :data:`LEARNER_FIELDS`: numpy arrays, or tensors already on the learner's
        device); returns (loss, new priorities lined up with ``batch["indices"]``), brought to
        the host in one device-to-host copy (:func:`~impl.rl.common.device.host_arrays`)."""
        ...

    def learn_async(self, batch: dict) -> "PendingLearn":
        """:meth:`learn` whose result may still be on its way from the device: the update is
        queued (on the CPU: done) and ``.result()`` of the returned object gives what
        :meth:`learn` returns, waiting for the device only then. Until ``.result()`` is called
        at most one more update may be queued (the learners keep two results in flight). This
        default runs :meth:`learn`; a learner off the CPU overrides it so that the host does not
        wait for its device at every update (:class:`~impl.rl.common.device.HostCopies`)."""
        return PendingLearn(done=self.learn(batch))

    def modules(self) -> list[nn.Module]:
        """Every network whose weights the learners must agree on."""
        ...

    def get_flat_weights(self) -> torch.Tensor:
        """The policy network's weights as one float32 vector (a copy, in host memory)."""
        return flat_params(self.policy_net)

    def digest(self) -> str:
        """SHA-1 of every parameter of :meth:`modules`: equal iff the learners agree bitwise."""
        return params_digest(*self.modules())
