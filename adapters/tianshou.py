"""Tianshou: a buffer with the API of ``tianshou.data.PrioritizedReplayBuffer``, priorities in a
registered variant.

It is a Tianshou ``ReplayBuffer`` (Tianshou's storage, episode bookkeeping, frame stacking and
HDF5 saving unchanged) whose priorities live in a :class:`~replaybench.adapters._core.PriorityIndex`,
so Tianshou's DQN and trainer use it unchanged: the algorithm sees ``update_weight`` and writes
``|TD error|`` back after each update. Methods as Tianshou's: ``add``, ``update``,
``sample`` (returns the batch, with ``weight``, and the indices), ``sample_indices``,
``get_weight``, ``update_weight``, ``set_beta``, ``init_weight``, ``reset``; attributes users
read as Tianshou's: ``weight`` (a read-only view of the priorities as Tianshou's segment
tree: ``weight[i]``, ``weight[index_array]``, ``weight.reduce(start, end)``, ``len``; see
:mod:`replaybench.adapters.views`), ``_alpha`` (read-only) and ``_beta`` (setting it is
``set_beta``). Tianshou's ``weight.get_prefix_sum_idx`` is not offered: sampling is ``sample``.

Behaviour as Tianshou's: priorities ``(|w| + eps) ** alpha`` with eps = float32's (about
1.2e-7); new transitions get the largest priority so far; ``weight`` normalised by its maximum
within the batch when ``weight_norm`` (the default). Differences, on purpose:

- ``get_weight`` (and ``weight`` with ``weight_norm=False``) is ``(p_i / p_min) ** -beta`` with
  ``p_min`` the smallest *stored* priority (the min tree). Tianshou divides by the smallest raw
  ``|w| + eps`` ever set, not raised to alpha and never forgotten, so its unnormalised weights
  are off by a constant factor; with ``weight_norm=True`` the factor cancels and both agree.
- Bad input to ``update_weight`` (a NaN, inf, complex or string TD error, an index not yet
  written) raises an error naming it and changes nothing; Tianshou stores it (the modulus of
  a complex one) or fails inside NumPy. Sampling an empty buffer, or one whose stored
  priorities are all 0 (``eps=0``), raises ValueError saying which.
- Draws come from the buffer's own generator, seeded with ``random_seed`` (Tianshou's own
  argument, default 42), not from NumPy's global one.
- ``reset`` also clears the priorities.

:class:`PrioritizedVectorReplayBuffer` is the counterpart of Tianshou's
``PrioritizedVectorReplayBuffer``: one sub-buffer per environment, for a ``Collector`` over a
``DummyVectorEnv`` / ``SubprocVectorEnv`` (``buffer_num`` = the number of environments).
"""

from __future__ import annotations

from replaybench.adapters._core import DEFAULT_VARIANT, PriorityIndex, real_array, require

require("tianshou")

import numbers  # noqa: E402  (after the framework check, on purpose)
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
from tianshou.data import Batch, ReplayBuffer, ReplayBufferManager  # noqa: E402

from replaybench.adapters.views import SumTreeView  # noqa: E402
from replaybench.impl.trees.base import as_indices  # noqa: E402

__all__ = ["PrioritizedReplayBuffer", "PrioritizedVectorReplayBuffer"]

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
        self._keep_priorities(index, weight_norm)
        self.options.update(alpha=alpha, beta=beta, weight_norm=weight_norm, variant=variant, eps=eps,
                            stratified=stratified, variant_params=variant_params)

    def _keep_priorities(self, index: PriorityIndex, weight_norm: bool) -> None:
        """Attach ``index`` (one slot per storage slot) once Tianshou's storage is set up."""
        self.priorities = index
        self._weight_norm = bool(weight_norm)

    @property
    def weight(self) -> SumTreeView:
        """Read-only view of the priorities as Tianshou's ``weight`` segment tree:
        ``weight[i]`` is ``(|w| + eps) ** alpha`` of slot ``i``, ``weight.reduce(start, end)``
        their sum (O(1) for the whole tree). Set them with :meth:`update_weight`."""
        return SumTreeView(self.priorities, "update_weight")

    @property
    def _alpha(self) -> float:
        """The priority exponent, read-only (Tianshou's attribute)."""
        return self.priorities.alpha

    @property
    def _beta(self) -> float:
        """The importance-sampling exponent (Tianshou's attribute); setting it is :meth:`set_beta`."""
        return self.priorities.beta

    @_beta.setter
    def _beta(self, value) -> None:
        self.set_beta(value)

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
        """``batch_size`` indices by priority; Tianshou's meaning of None, 0 and negative sizes.
        A positive size on an empty buffer, or on one whose stored priorities are all 0, raises
        ValueError saying which (Tianshou's fails inside NumPy)."""
        if batch_size is not None and batch_size > 0:
            return self.priorities.sample(batch_size, n_valid=len(self))[0]
        return super().sample_indices(batch_size)

    def sample(self, batch_size: int | None):
        """``(batch, indices)`` as Tianshou's: ``batch_size`` transitions drawn by priority, with
        ``batch.weight``; Tianshou's meaning of None, 0 and negative sizes.

        One descent of the tree gives the slots and their priorities, and the weights come
        from those priorities (Tianshou's ``sample`` reads every sampled priority back with
        ``get_weight``: a second pass over the tree); the same float64 values
        ``get_weight`` gives. Cost O(batch K D) plus Tianshou's gather of the batch."""
        if batch_size is None or batch_size <= 0:
            return super().sample(batch_size)
        index = self.priorities
        indices, priorities = index.sample_priorities(batch_size, n_valid=len(self))
        # The storage's gather (Tianshou's, prev/next aware), not our __getitem__, which
        # would read the priorities back from the tree.
        batch = super(PrioritizedReplayBuffer, self).__getitem__(indices)
        weight = np.power(priorities / index.tree.min(), -index.beta)
        batch.weight = weight / np.max(weight) if self._weight_norm else weight
        return batch, indices

    def get_weight(self, index) -> float | np.ndarray:
        """Importance weights ``(p_i / p_min) ** -beta`` (see the module docstring)."""
        out = self.priorities.weights(index)
        return float(out[0]) if np.ndim(index) == 0 else out

    def update_weight(self, index: np.ndarray, new_weight) -> None:
        """Set priorities from ``new_weight`` (TD errors; their absolute value is used). A TD
        error that is not a real number (a string, a complex number) raises TypeError naming it."""
        self.priorities.update(index, np.abs(real_array(new_weight, "new_weight")).reshape(-1), n_valid=len(self))

    def __getitem__(self, index):
        if len(self) == 0:  # Tianshou's storage has no keys yet: it would fail with KeyError('obs')
            raise IndexError(f"cannot index an empty buffer with {index!r}: add transitions first")
        if isinstance(index, slice):  # Tianshou's meaning: buffer[:] is every stored transition
            indices = self.sample_indices(0) if index == slice(None) else self._indices[: len(self)][index]
        else:
            indices = index
        batch = super().__getitem__(indices)
        weight = self.get_weight(indices)
        # An empty index gives an empty batch: there is no maximum to normalise by.
        batch.weight = weight / np.max(weight) if self._weight_norm and np.size(weight) else weight
        return batch

    def set_beta(self, beta: float) -> None:
        """Set the importance-sampling exponent (a number in [0, 1])."""
        self.priorities.set_beta(beta)

    def reset(self, keep_statistics: bool = False) -> None:
        super().reset(keep_statistics)
        self.priorities.clear()


class PrioritizedVectorReplayBuffer(PrioritizedReplayBuffer, ReplayBufferManager):
    """Tianshou's ``PrioritizedVectorReplayBuffer`` API: ``buffer_num`` ring sub-buffers of
    ``ceil(total_size / buffer_num)`` slots each, priorities in one registered variant's tree.

    Tianshou's ``ReplayBufferManager`` keeps the storage: sub-buffer ``b`` owns the slots
    ``b * size .. (b + 1) * size - 1`` of one contiguous storage, ``add(batch, buffer_ids)``
    writes row ``j`` of ``batch`` into sub-buffer ``buffer_ids[j]`` (default ``0 ..
    buffer_num - 1``: one row per environment, as the ``Collector`` passes them), each
    sub-buffer wraps around on its own, and ``prev``/``next`` stay inside a sub-buffer's episode.
    Indices (returned by ``add`` and ``sample``, taken by ``get_weight`` and ``update_weight``)
    are slots of that whole storage.

    Why one tree over the whole storage, not one per sub-buffer: a transition must be drawn
    with probability ``p_i / sum of every stored p``, whichever environment wrote it. One
    tree indexed by the storage slot gives exactly that in one descent (slots not yet written
    hold priority 0 and are never drawn); it is also how Tianshou's own vector buffer draws
    (one segment tree over the manager). Trees per sub-buffer would need a draw of the
    sub-buffer by its total first, and the weights' ``p_min`` across all of them; splitting
    the batch by sub-buffer length instead (what Tianshou's uniform manager does) would make
    probabilities depend on how transitions are spread over environments.

    Parameters
    ----------
    total_size : int
        Slots asked for in all; each sub-buffer gets ``ceil(total_size / buffer_num)``.
    buffer_num : int
        Sub-buffers (the number of environments the ``Collector`` steps).
    alpha, beta, weight_norm, variant, eps, stratified, variant_params, **kwargs
        As :class:`PrioritizedReplayBuffer` (``kwargs`` are Tianshou's ``ReplayBuffer``
        arguments, given to every sub-buffer).

    Differences from Tianshou's, on purpose (besides those of :class:`PrioritizedReplayBuffer`):
    ``set_beta`` changes the weights (Tianshou 2.0.1's sets it on the sub-buffers, which hold
    no priorities, so the manager's weights keep the old beta); ``add`` refuses a
    ``buffer_ids`` that is not one id in ``0 .. buffer_num - 1`` per row of ``batch`` before
    anything is written (Tianshou's fails deep inside, or wraps a negative id, after some
    sub-buffers moved on); ``update_weight`` refuses a slot no sub-buffer has written.

    Costs: construction O(total_size) (Tianshou's numba ``prev``/``next`` kernels compile at
    their first call, not here); add O(rows D) on top of Tianshou's manager add (a Python loop
    over the rows); sample and update_weight as :class:`PrioritizedReplayBuffer`, plus O(batch)
    for update_weight's written-slot check while some sub-buffer is not yet full.
    """

    def __init__(self, total_size: int, buffer_num: int, alpha: float, beta: float, weight_norm: bool = True, *,
                 variant: str = DEFAULT_VARIANT, eps: float = FLOAT32_EPS, stratified: bool = False,
                 variant_params: dict | None = None, **kwargs: Any) -> None:
        for name, value in (("total_size", total_size), ("buffer_num", buffer_num)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        size = -(-int(total_size) // int(buffer_num))
        index = PriorityIndex(variant, size * int(buffer_num), alpha=alpha, beta=beta, eps=eps,
                              stratified=stratified, seed=kwargs.get("random_seed", 42), **(variant_params or {}))
        ReplayBufferManager.__init__(self, [ReplayBuffer(size, **kwargs) for _ in range(int(buffer_num))])
        self._keep_priorities(index, weight_norm)
        self.options.update(alpha=alpha, beta=beta, weight_norm=weight_norm, variant=variant, eps=eps,
                            stratified=stratified, variant_params=variant_params)

    def _compile(self) -> None:
        """Nothing: numba compiles Tianshou's ``prev``/``next`` kernels at their first call
        (n-step returns), not here; Tianshou's manager warms them up in its constructor, which
        costs seconds per process whether or not they are used."""

    def add(self, batch, buffer_ids=None):
        """Write row ``j`` of ``batch`` into sub-buffer ``buffer_ids[j]``; Tianshou's return
        (the slots written, episode returns, lengths and start slots)."""
        self._check_buffer_ids(batch, buffer_ids)
        return super().add(batch, buffer_ids)

    def update_weight(self, index: np.ndarray, new_weight) -> None:
        """Set priorities from ``new_weight`` (TD errors; their absolute value is used) at
        ``index``, slots some sub-buffer has written."""
        weight = np.abs(real_array(new_weight, "new_weight")).reshape(-1)
        if len(self) == self.maxsize:
            # Every sub-buffer is full (a training run's steady state): every slot is written,
            # so the tree's own range check is the whole check. It changes nothing when it
            # fails; the check below then names the bad index as for a partly written buffer.
            try:
                self.priorities.update(index, weight, n_valid=self.maxsize)
                return
            except IndexError:
                pass
        idx = as_indices(index, "indices")
        self._check_written(idx)
        self.priorities.update(idx, weight, n_valid=self.maxsize)

    def _check_written(self, idx: np.ndarray) -> None:
        """IndexError naming the first of ``idx`` that is no slot, or a slot its sub-buffer has
        not written yet. O(batch log buffer_num)."""
        outside = np.flatnonzero((idx < 0) | (idx >= self.maxsize))
        if outside.size:
            b = int(outside[0])
            raise IndexError(f"indices[{b}] = {int(idx[b])} is out of range: slots are 0 .. {self.maxsize - 1}")
        buffer = np.searchsorted(self._offset, idx, side="right") - 1
        unwritten = np.flatnonzero(idx - self._offset[buffer] >= self._lengths[buffer])
        if unwritten.size:
            b, i = int(unwritten[0]), int(buffer[unwritten[0]])
            start, n = int(self._offset[i]), int(self._lengths[i])
            raise IndexError(f"indices[{b}] = {int(idx[b])} is not written yet: sub-buffer {i} has written "
                             + (f"slots {start} .. {start + n - 1}" if n else "nothing"))

    def _check_buffer_ids(self, batch, buffer_ids) -> None:
        rows = batch_rows(batch)
        if buffer_ids is None:
            if rows != self.buffer_num:
                raise ValueError(f"batch has {rows} rows but buffer_ids is None, which means one row per "
                                 f"sub-buffer ({self.buffer_num}); pass buffer_ids")
            return
        ids = np.asarray(buffer_ids)
        if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
            raise ValueError(f"buffer_ids must be a 1-D sequence of integers, got {buffer_ids!r}")
        if ids.size != rows:
            raise ValueError(f"buffer_ids has {ids.size} ids for a batch of {rows} rows; give one per row")
        bad = np.flatnonzero((ids < 0) | (ids >= self.buffer_num))
        if bad.size:
            raise ValueError(f"buffer_ids[{int(bad[0])}] = {int(ids[bad[0]])} is out of range: "
                             f"sub-buffers are 0 .. {self.buffer_num - 1}")


def batch_rows(batch) -> int:
    """``len(batch)``, Tianshou's rows of a ``Batch`` (the least length among its keys), read
    straight from the keys' arrays when each key is an array or an empty ``Batch`` (what a
    ``Collector`` adds: ``info`` is often empty); anything else is left to ``len(batch)``.
    Why: ``Batch.__len__`` runs protocol checks per key, about 8 us per call, more than the
    rest of our ``add``; this loop costs about 1 us for a Collector's batch."""
    lens = []
    for value in batch.__dict__.values():
        if type(value) is np.ndarray and value.ndim:
            lens.append(value.shape[0])
        elif not (type(value) is Batch and not value.__dict__):  # an empty Batch has no length to count
            return len(batch)
    return min(lens) if lens else 0
