"""Tianshou: a buffer with the API of ``tianshou.data.PrioritizedReplayBuffer``, priorities in a
registered variant.

It is a Tianshou ``ReplayBuffer`` (Tianshou's storage, episode bookkeeping, frame stacking and
HDF5 saving unchanged) whose priorities live in a :class:`~replaybench.adapters._core.PriorityIndex`,
so Tianshou's DQN and trainer use it unchanged: the algorithm sees ``update_weight`` and writes
``|TD error|`` back after each update. Methods as Tianshou's: ``add``, ``update``,
``sample`` (returns the batch, with ``weight``, and the indices), ``sample_indices``,
``get_weight``, ``update_weight``, ``set_beta``, ``init_weight``, ``reset``.

Behaviour as Tianshou's: priorities ``(|w| + eps) ** alpha`` with eps = float32's (about
1.2e-7); new transitions get the largest priority so far; ``weight`` normalised by its maximum
within the batch when ``weight_norm`` (the default). Differences, on purpose:

- ``get_weight`` (and ``weight`` with ``weight_norm=False``) is ``(p_i / p_min) ** -beta`` with
  ``p_min`` the smallest *stored* priority (the min tree). Tianshou divides by the smallest raw
  ``|w| + eps`` ever set, not raised to alpha and never forgotten, so its unnormalised weights
  are off by a constant factor; with ``weight_norm=True`` the factor cancels and both agree.
- Bad input to ``update_weight`` (a NaN or inf TD error, an index not yet written) raises an
  error naming it and changes nothing; Tianshou stores it.
- Draws come from the buffer's own generator, seeded with ``random_seed`` (Tianshou's own
  argument, default 42), not from NumPy's global one.
- ``reset`` also clears the priorities.

Only the single buffer is offered (one environment, or Tianshou's ``Collector`` with one);
Tianshou's ``PrioritizedVectorReplayBuffer`` is not.
"""

from __future__ import annotations

from replaybench.adapters._core import DEFAULT_VARIANT, PriorityIndex, require

require("tianshou")

from typing import Any  # noqa: E402  (after the framework check, on purpose)

import numpy as np  # noqa: E402
from tianshou.data import ReplayBuffer, to_numpy  # noqa: E402

__all__ = ["PrioritizedReplayBuffer"]

FLOAT32_EPS = float(np.finfo(np.float32).eps)


class PrioritizedReplayBuffer(ReplayBuffer):
    """Tianshou's prioritized buffer API over a registered variant's tree.

    Parameters
    ----------
    size, alpha, beta, weight_norm
        As Tianshou's ``PrioritizedReplayBuffer`` (alpha finite and >= 0, beta in [0, 1]).
    variant : str
        A registered tree variant (``replaybench list``).
    eps : float
        Added to ``|w|`` before the power; Tianshou's value by default.
    stratified : bool
        One draw per equal-mass segment instead of independent draws.
    variant_params : dict, optional
        The variant's structure parameters (``{"K": 8}``).
    **kwargs
        Tianshou's ``ReplayBuffer`` arguments (``stack_num``, ``ignore_obs_next``,
        ``random_seed``, ...).

    Costs (D = tree depth): add O(D) on top of Tianshou's add, sample O(batch K D) plus
    Tianshou's gather, update_weight O(batch D).
    """

    def __init__(self, size: int, alpha: float, beta: float, weight_norm: bool = True, *,
                 variant: str = DEFAULT_VARIANT, eps: float = FLOAT32_EPS, stratified: bool = False,
                 variant_params: dict | None = None, **kwargs: Any) -> None:
        index = PriorityIndex(variant, size, alpha=alpha, beta=beta, eps=eps, stratified=stratified,
                              seed=kwargs.get("random_seed", 42), **(variant_params or {}))
        ReplayBuffer.__init__(self, size, **kwargs)
        self.priorities = index
        self._weight_norm = bool(weight_norm)
        self.options.update(alpha=alpha, beta=beta, weight_norm=weight_norm, variant=variant, eps=eps,
                            stratified=stratified, variant_params=variant_params)

    def init_weight(self, index) -> None:
        """Give ``index`` the largest priority stored so far (new transitions)."""
        self.priorities.mark_new(index)

    def add(self, batch, buffer_ids=None):
        ptr, ep_rew, ep_len, ep_idx = super().add(batch, buffer_ids)
        self.init_weight(ptr)
        return ptr, ep_rew, ep_len, ep_idx

    def update(self, buffer: ReplayBuffer) -> np.ndarray:
        indices = super().update(buffer)
        if indices.size:
            self.init_weight(indices)
        return indices

    def sample_indices(self, batch_size: int | None) -> np.ndarray:
        """``batch_size`` indices by priority; Tianshou's meaning of None, 0 and negative sizes."""
        if batch_size is not None and batch_size > 0 and len(self) > 0:
            return self.priorities.sample(batch_size)[0]
        return super().sample_indices(batch_size)

    def get_weight(self, index) -> float | np.ndarray:
        """Importance weights ``(p_i / p_min) ** -beta`` (see the module docstring)."""
        out = self.priorities.weights(index)
        return float(out[0]) if np.ndim(index) == 0 else out

    def update_weight(self, index: np.ndarray, new_weight) -> None:
        """Set priorities from ``new_weight`` (TD errors; their absolute value is used)."""
        self.priorities.update(index, np.abs(to_numpy(new_weight)).reshape(-1), n_valid=len(self))

    def __getitem__(self, index):
        if isinstance(index, slice):  # Tianshou's meaning: buffer[:] is every stored transition
            indices = self.sample_indices(0) if index == slice(None) else self._indices[: len(self)][index]
        else:
            indices = index
        batch = super().__getitem__(indices)
        weight = self.get_weight(indices)
        batch.weight = weight / np.max(weight) if self._weight_norm else weight
        return batch

    def set_beta(self, beta: float) -> None:
        """Set the importance-sampling exponent (a number in [0, 1])."""
        self.priorities.set_beta(beta)

    def reset(self, keep_statistics: bool = False) -> None:
        super().reset(keep_statistics)
        self.priorities.clear()
