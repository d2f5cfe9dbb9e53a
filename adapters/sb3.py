"""Stable-Baselines3: a prioritized replay buffer for ``DQN(replay_buffer_class=...)``, and a DQN
that uses it.

``PrioritizedReplayBuffer`` is an SB3 ``ReplayBuffer`` (so ``save_replay_buffer`` /
``load_replay_buffer`` and SB3's own checks accept it) whose transitions and priorities live in
any registered variant's buffer (``replay_buffer_kwargs={"variant": "kary-aligned", "alpha":
0.6, "beta": 0.4}``). With ``n_envs`` environments it keeps ``buffer_size // n_envs`` rows of
``n_envs`` transitions, as SB3 does, and transition ``(row, env)`` is ring slot ``row * n_envs
+ env``: each transition is sampled by its own priority (SB3's uniform buffer draws a row and
then an environment). ``sample`` returns :class:`PrioritizedReplayBufferSamples`: SB3's
fields plus ``weights`` (importance weights, max-normalised over the whole buffer) and
``indices``, on the buffer's device.

Plain ``DQN`` ignores the two extra fields (prioritized sampling, unweighted loss);
:class:`PrioritizedDQN` weights its Huber loss by ``weights``, writes ``|TD error|`` back with
``update_priorities`` after each gradient step and anneals ``beta`` linearly to
``final_beta`` over the run (Schaul et al.).

Not supported (refused with an error naming the argument): ``optimize_memory_usage=True``
and ``Dict`` observation spaces.
"""

from __future__ import annotations

from replaybench.adapters._core import DEFAULT_VARIANT, real_array, require, sampler_params

require("sb3")

from typing import Any, NamedTuple  # noqa: E402  (after the framework check, on purpose)

import numpy as np  # noqa: E402
import torch as th  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from gymnasium import spaces  # noqa: E402
from stable_baselines3 import DQN  # noqa: E402
from stable_baselines3.common.buffers import BaseBuffer, ReplayBuffer  # noqa: E402
from stable_baselines3.common.type_aliases import ReplayBufferSamples  # noqa: E402

from replaybench.impl import registry  # noqa: E402
from replaybench.impl.buffers import check_buffer_params  # noqa: E402

__all__ = ["PrioritizedReplayBuffer", "PrioritizedReplayBufferSamples", "PrioritizedDQN"]


class PrioritizedReplayBufferSamples(NamedTuple):
    """SB3's ``ReplayBufferSamples`` fields, then ``weights`` (float32, shape ``(batch, 1)``) and
    ``indices`` (int64 ring slots, a NumPy array: what :meth:`PrioritizedReplayBuffer.update_priorities`
    takes)."""

    observations: th.Tensor
    actions: th.Tensor
    next_observations: th.Tensor
    dones: th.Tensor
    rewards: th.Tensor
    discounts: th.Tensor | None
    weights: th.Tensor
    indices: np.ndarray


class PrioritizedReplayBuffer(ReplayBuffer):
    """SB3 replay buffer backed by a registered variant (see the module docstring).

    Parameters
    ----------
    buffer_size, observation_space, action_space, device, n_envs, handle_timeout_termination
        As SB3's ``ReplayBuffer`` (SB3 passes the first five).
    optimize_memory_usage : bool
        Must be False (the variant stores next observations itself).
    variant : str
        Registered variant holding transitions and priorities (``replaybench list``); a
        variant without priorities (``"uniform"``) samples uniformly over transitions, with
        weights 1, and ignores ``alpha``, ``beta``, ``eps`` and ``stratified``.
    alpha, beta, eps, stratified, seed
        The variant's sampler parameters (see ``replaybench.impl.buffers``); ``seed`` seeds
        its generator (SB3 seeds NumPy's global one, which this buffer does not use).
    **variant_params
        The variant's structure parameters (``K=...``, ``dtype=...``).

    Costs per call: add O(n_envs D) (one copy per field into kept rows, then one compiled
    write), sample O(batch (K D + row bytes)): one compiled call that
    gathers the rows, on the CPU into fresh arrays which the returned tensors view, on another
    device into arrays reused across calls which are then copied there (one copy of the rows
    either way); update_priorities O(batch D), one compiled call (D = tree depth).
    """

    def __init__(self, buffer_size: int, observation_space: spaces.Space, action_space: spaces.Space,
                 device: th.device | str = "auto", n_envs: int = 1, optimize_memory_usage: bool = False,
                 handle_timeout_termination: bool = True, *, variant: str = DEFAULT_VARIANT, alpha=0.6, beta=0.4,
                 eps=1e-6, stratified=False, seed=None, **variant_params):
        if optimize_memory_usage:
            raise ValueError("optimize_memory_usage=True is not supported by the prioritized buffer "
                             "(it stores next observations itself); pass False")
        if isinstance(observation_space, spaces.Dict):
            raise ValueError(f"observation_space: Dict spaces are not supported, got {observation_space}")
        BaseBuffer.__init__(self, buffer_size, observation_space, action_space, device, n_envs=n_envs)
        self.buffer_size = max(buffer_size // n_envs, 1)
        self.optimize_memory_usage = False
        self.handle_timeout_termination = handle_timeout_termination
        obs = (self.obs_shape, observation_space.dtype)
        fields = {"obs": obs, "next_obs": obs,
                  "action": ((self.action_dim,), self._maybe_cast_dtype(action_space.dtype)),
                  "reward": ((), np.float32), "done": ((), np.float32), "timeout": ((), np.float32)}
        checked = check_buffer_params(alpha=alpha, beta=beta, eps=eps, stratified=stratified)
        self.store = registry.create(variant, capacity=self.buffer_size * n_envs, fields=fields, seed=seed,
                                     **sampler_params(checked), **variant_params)
        self.variant, self.variant_params = variant, variant_params

    @property
    def beta(self) -> float:
        """The importance-sampling exponent ``sample`` uses (settable: a number in [0, 1])."""
        return getattr(self.store, "beta", 0.0)

    @beta.setter
    def beta(self, value) -> None:
        if hasattr(self.store, "beta"):  # a uniform variant has none: its weights are 1
            self.store.beta = check_buffer_params(alpha=0.0, beta=value, eps=0.0, stratified=False)["beta"]

    def add(self, obs: np.ndarray, next_obs: np.ndarray, action: np.ndarray, reward: np.ndarray,
            done: np.ndarray, infos: list[dict[str, Any]]) -> None:
        """Store one transition per environment (arrays with a leading ``n_envs`` axis), cast
        to the fields' dtypes as SB3's own buffer casts them (by assignment).

        Cost: one copy per field into rows kept across calls (the store's ``add_staging``),
        then the store's compiled write: no dict, check or allocation per call."""
        n = self.n_envs
        staging = self.__dict__.get("_staging")
        if staging is None or staging.owner is not self.store:  # none yet, or the store was replaced (reset)
            staging = self._staging = self.store.add_staging(n)
        a = staging.arrays
        # Reshapes as SB3's own add makes them (a Discrete observation comes as (n_envs,));
        # assignment casts as SB3's does.
        a["obs"][...] = np.asarray(obs).reshape(a["obs"].shape)
        a["next_obs"][...] = np.asarray(next_obs).reshape(a["obs"].shape)
        a["action"][...] = np.asarray(action).reshape(a["action"].shape)
        a["reward"][...] = reward
        a["done"][...] = done
        if self.handle_timeout_termination:
            a["timeout"][...] = [info.get("TimeLimit.truncated", False) for info in infos]
        self.store.add_staged(staging)
        self.pos += 1
        if self.pos == self.buffer_size:
            self.full, self.pos = True, 0

    def sample(self, batch_size: int, env=None) -> PrioritizedReplayBufferSamples:
        """``batch_size`` transitions by priority, with weights and slots (see the class)."""
        if self.device.type == "cpu":
            out = self.store.sample(batch_size)  # fresh arrays, which the returned tensors view (see _tensor)
            indices = out["indices"]
        else:
            # The tensors are copies on the device, so the gather fills arrays kept across calls:
            # one copy in all, no allocation; the indices stay here, so they are copied out.
            out = self.store.sample(batch_size, out=self._reused_out(batch_size))
            indices = out["indices"].copy()
        return PrioritizedReplayBufferSamples(*self._tensors(out, env), self._tensor(out["weights"].reshape(-1, 1)),
                                              indices)

    def _reused_out(self, batch_size: int):
        """The store's ``sample_out(batch_size)``, made once per store and batch size."""
        outs = self.__dict__.setdefault("_outs", {})
        out = outs.get(batch_size)
        if out is None or out.owner is not self.store:  # none yet, or the store was replaced (reset)
            out = outs[batch_size] = self.store.sample_out(batch_size)
        return out

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.pop("_outs", None)  # reused output arrays (not data): made again on demand
        state.pop("_staging", None)  # the add's reused input rows, likewise
        return state

    def update_priorities(self, indices, priorities) -> None:
        """Set new raw priorities (``|TD error|``) for sampled ``indices``; a tensor is moved to
        the CPU, a ``(batch, 1)`` column (the loss's shape) is flattened. Bad input (a string or
        complex priority, NaN, a slot not written) raises an error naming the entry and changes
        nothing."""
        priorities = real_array(priorities, "priorities")
        self.store.update_priorities(indices, priorities.reshape(-1) if priorities.ndim > 1 else priorities)

    def reset(self) -> None:
        """Empty the buffer (a fresh variant buffer of the same parameters)."""
        super().reset()
        store = self.store
        params = {k: getattr(store, k) for k in ("alpha", "beta", "eps", "stratified") if hasattr(store, k)}
        self.store = registry.create(self.variant, capacity=store.capacity,
                                     fields={k: (s.shape, s.dtype) for k, s in store.fields.items()},
                                     **sampler_params(params), **self.variant_params)

    def _get_samples(self, batch_inds: np.ndarray, env=None) -> ReplayBufferSamples:
        """SB3's uniform path: rows ``batch_inds``, each with a uniformly drawn environment."""
        slots = batch_inds * self.n_envs + np.random.randint(0, self.n_envs, size=len(batch_inds))
        return ReplayBufferSamples(*self._tensors(self.store.storage.gather(slots), env))

    def _tensors(self, rows: dict, env) -> tuple:
        """SB3's sample fields as tensors on the buffer's device, from ``rows``: arrays this
        call's gather made and nobody else holds (see :meth:`_tensor`)."""
        dones = rows["done"] * (1 - rows["timeout"])
        return (self._tensor(self._normalize_obs(rows["obs"], env)), self._tensor(rows["action"]),
                self._tensor(self._normalize_obs(rows["next_obs"], env)), self._tensor(dones.reshape(-1, 1)),
                self._tensor(self._normalize_reward(rows["reward"].reshape(-1, 1), env)), None)

    def _tensor(self, array: np.ndarray) -> th.Tensor:
        """``array`` as a tensor on the buffer's device: on the CPU a view of it, no copy. SB3's
        ``to_torch`` copies, because its arrays are views of the buffer's storage; ours are
        the gather's fresh output, which the caller then owns, so that copy would be a second
        one. On another device, the one copy there. (``device`` is read per call: SB3's
        ``load_replay_buffer`` reassigns it.)"""
        if self.device.type == "cpu":
            return th.from_numpy(array)  # a third of as_tensor's cost: no device or dtype dispatch
        return th.as_tensor(array, device=self.device)


class PrioritizedDQN(DQN):
    """SB3's DQN with prioritized replay: importance-weighted Huber loss, ``|TD error|`` written
    back after every gradient step, ``beta`` annealed linearly from the buffer's to
    ``final_beta`` over ``learn``'s ``total_timesteps`` (None: kept fixed).

    Takes DQN's arguments; ``replay_buffer_class`` defaults to :class:`PrioritizedReplayBuffer`
    and must be it or a subclass.
    """

    def __init__(self, policy, env, *, final_beta: float | None = 1.0, **kwargs):
        kwargs.setdefault("replay_buffer_class", PrioritizedReplayBuffer)
        cls = kwargs["replay_buffer_class"]
        if not (isinstance(cls, type) and issubclass(cls, PrioritizedReplayBuffer)):
            raise ValueError(f"replay_buffer_class must be replaybench.adapters.sb3.PrioritizedReplayBuffer "
                             f"(or a subclass), got {cls!r}")
        if final_beta is not None:
            final_beta = check_buffer_params(alpha=0.0, beta=final_beta, eps=0.0, stratified=False)["beta"]
        self.final_beta = final_beta
        self._initial_beta: float | None = None
        super().__init__(policy, env, **kwargs)

    def load_replay_buffer(self, path, truncate_last_traj: bool = True) -> None:
        """SB3's ``load_replay_buffer``, refusing a file that holds another kind of buffer (a
        plain SB3 ``ReplayBuffer`` has no priorities, ``beta`` or importance weights, and
        ``learn`` then failed on ``beta``): TypeError naming the type, the model's buffer kept.
        Load such a file into a plain ``DQN``, or refill a prioritized buffer from it."""
        previous = getattr(self, "replay_buffer", None)
        super().load_replay_buffer(path, truncate_last_traj)
        loaded = self.replay_buffer
        if not isinstance(loaded, PrioritizedReplayBuffer):
            self.replay_buffer = previous
            kind = f"{type(loaded).__module__}.{type(loaded).__qualname__}"
            raise TypeError(f"load_replay_buffer: {path} holds a {kind}; PrioritizedDQN needs a "
                            f"replaybench.adapters.sb3.PrioritizedReplayBuffer (the model keeps its buffer)")

    def train(self, gradient_steps: int, batch_size: int = 100) -> None:
        buffer: PrioritizedReplayBuffer = self.replay_buffer  # type: ignore[assignment]
        self.policy.set_training_mode(True)
        self._update_learning_rate(self.policy.optimizer)
        if self.final_beta is not None:
            if self._initial_beta is None:
                self._initial_beta = buffer.beta
            done = 1.0 - self._current_progress_remaining
            buffer.beta = min(1.0, self._initial_beta + done * (self.final_beta - self._initial_beta))
        losses = []
        for _ in range(gradient_steps):
            data = buffer.sample(batch_size, env=self._vec_normalize_env)
            gamma = data.discounts if data.discounts is not None else self.gamma
            with th.no_grad():
                best_next = self.q_net_target(data.next_observations).max(dim=1).values.reshape(-1, 1)
                target = data.rewards + (1 - data.dones) * gamma * best_next
            q = self.q_net(data.observations).gather(1, data.actions.long())
            per_sample = F.smooth_l1_loss(q, target, reduction="none")
            loss = (data.weights * per_sample).mean()
            losses.append(loss.item())
            self.policy.optimizer.zero_grad()
            loss.backward()
            th.nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
            self.policy.optimizer.step()
            buffer.update_priorities(data.indices, (q - target).abs().detach().cpu().numpy().reshape(-1))
        self._n_updates += gradient_steps
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/loss", float(np.mean(losses)))
        self.logger.record("train/beta", buffer.beta)
