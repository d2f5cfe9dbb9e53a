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
``DummyVectorEnv`` / ``SubprocVectorEnv`` (``buffer_num`` = the number of environments). It
keeps Tianshou's storage layout (one ``Batch`` of arrays, the manager's offsets, the
sub-buffers' episode bookkeeping, so Tianshou's collector, n-step returns and HDF5 saving
read it unchanged) but writes a collector's rows and gathers sampled batches itself:
Tianshou's manager ``add`` loops over the rows in Python and its gather builds the batch
through ``Batch``'s per-value parsing, which together cost several times the priorities' own
work. The calls Tianshou's n-step returns make at every update (``next``,
``unfinished_index``, ``buffer[indices]``) are compiled passes over that same layout, with
Tianshou's results.
"""

from __future__ import annotations

from replaybench.adapters._core import DEFAULT_VARIANT, PriorityIndex, real_array, require

require("tianshou")

import numbers  # noqa: E402  (after the framework check, on purpose)
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
from numba import njit  # noqa: E402
from tianshou.data import Batch, ReplayBuffer, ReplayBufferManager  # noqa: E402
from tianshou.data.buffer.buffer_base import MalformedBufferError  # noqa: E402

from replaybench.adapters.views import SumTreeView  # noqa: E402
from replaybench.impl.trees import ops  # noqa: E402
from replaybench.impl.trees.base import as_indices, check_real  # noqa: E402

__all__ = ["PrioritizedReplayBuffer", "PrioritizedVectorReplayBuffer", "SubBuffer", "SubBufferState", "gather_rows",
           "td_array"]

FLOAT32_EPS = float(np.finfo(np.float32).eps)

#: The keys of a transition, in the order Tianshou's ``ReplayBuffer.__getitem__`` gives them.
BATCH_KEYS = ("obs", "act", "rew", "terminated", "truncated", "done", "obs_next", "info", "policy")
#: Those Tianshou reads unconditionally (it fails without them); the others default to an empty Batch.
REQUIRED_KEYS = frozenset(BATCH_KEYS[:6])
BATCH_KEY_SET = frozenset(BATCH_KEYS)
RESERVED_KEYS = frozenset(ReplayBuffer._reserved_keys)


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

    Costs (D = tree depth): add O(D) on top of Tianshou's add, sample O(batch K D) plus one
    array read per stored key (:func:`gather_rows`; Tianshou's gather with frame stacking or
    without a stored ``obs_next``), update_weight O(batch D).
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
        ``get_weight`` gives. Cost O(batch K D) plus :meth:`gather`."""
        if batch_size is None or batch_size <= 0:
            return super().sample(batch_size)
        index = self.priorities
        indices, priorities = index.sample_priorities(batch_size, n_valid=len(self))
        # The storage's gather, not our __getitem__, which would read the priorities back
        # from the tree.
        batch = self.gather(indices)
        # In place in the draw's own fresh array: the same ufuncs as (p / p_min) ** -beta and
        # its division by the maximum, so the same numbers, without three temporaries.
        weight = np.divide(priorities, index.tree.min(), out=priorities)
        np.power(weight, -index.beta, out=weight)
        if self._weight_norm:
            np.divide(weight, weight.max(), out=weight)
        batch.__dict__["weight"] = weight
        return batch, indices

    def gather(self, indices) -> Batch:
        """The stored transitions at ``indices`` as Tianshou's ``ReplayBuffer.__getitem__``
        gives them (no ``weight``): built straight from the storage's arrays by
        :func:`gather_rows` for a 1-D integer array on a buffer without frame stacking that
        stores ``obs_next`` (what ``sample``, Tianshou's n-step targets and its collector ask
        for), else Tianshou's own gather. O(batch) array reads, one per stored key."""
        if (type(indices) is np.ndarray and indices.ndim == 1 and indices.dtype.kind in "iu"
                and self.stack_num == 1 and self._save_obs_next):
            batch = gather_rows(self._meta, indices)
            if batch is not None:
                return batch
        return ReplayBuffer.__getitem__(self, indices)

    def get_weight(self, index) -> float | np.ndarray:
        """Importance weights ``(p_i / p_min) ** -beta`` (see the module docstring)."""
        out = self.priorities.weights(index)
        return float(out[0]) if np.ndim(index) == 0 else out

    def update_weight(self, index: np.ndarray, new_weight) -> None:
        """Set priorities from ``new_weight`` (TD errors; their absolute value is used). A TD
        error that is not a real number (a string, a complex number) raises TypeError naming it."""
        self.priorities.update_abs(index, td_array(new_weight), n_valid=len(self))

    def __getitem__(self, index):
        """The transitions at ``index`` with ``weight`` (``get_weight``'s, divided by their
        maximum when ``weight_norm``), as Tianshou's ``__getitem__``. A non-empty 1-D integer
        array (what Tianshou's DQN passes for its n-step targets, and its collector for a
        finished episode) takes :meth:`_rows_with_weights`; O(batch) plus one array read per
        stored key."""
        if len(self) == 0:  # Tianshou's storage has no keys yet: it would fail with KeyError('obs')
            raise IndexError(f"cannot index an empty buffer with {index!r}: add transitions first")
        if (type(index) is np.ndarray and index.ndim == 1 and index.shape[0] and index.dtype.kind in "iu"
                and type(self).get_weight is PrioritizedReplayBuffer.get_weight):  # a subclass's is called as it is
            return self._rows_with_weights(index)
        if isinstance(index, slice):  # Tianshou's meaning: buffer[:] is every stored transition
            indices = self.sample_indices(0) if index == slice(None) else self._indices[: len(self)][index]
        else:
            indices = index
        batch = self.gather(indices)
        weight = self.get_weight(indices)
        # An empty index gives an empty batch: there is no maximum to normalise by.
        batch.weight = weight / np.max(weight) if self._weight_norm and np.size(weight) else weight
        return batch

    def _rows_with_weights(self, indices: np.ndarray) -> Batch:
        """``self[indices]`` for a non-empty 1-D integer array: :meth:`gather`, then the weights
        normalised in their own fresh array (the same ufuncs as ``w / np.max(w)``, so the same
        numbers) and set as ``Batch.__setattr__`` would keep them (a float64 array is kept as
        it is). Errors as the general path: the gather's IndexError first, then
        ``get_weight``'s for a negative slot."""
        batch = self.gather(indices)
        weight = self.priorities.weights(indices)
        if self._weight_norm:
            np.divide(weight, weight.max(), out=weight)
        batch.__dict__["weight"] = weight
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

    The storage is laid out as Tianshou's ``ReplayBufferManager`` lays it out (it is one):
    sub-buffer ``b`` owns the slots
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

    Each sub-buffer is a :class:`SubBuffer`, whose episode bookkeeping lives in the manager's
    :class:`SubBufferState` arrays, so that one compiled call moves it on for all the rows of
    an add; Tianshou's own code that reads or moves it per sub-buffer sees the same values.

    Costs: construction O(total_size) (Tianshou's numba ``prev``/``next`` kernels, used only
    for arguments ours do not take, compile at their first call, not here); add of a batch
    with the stored keys and shapes O(keys) Python work, one compiled O(rows) call and one
    array write per key, plus O(rows D) for the new
    priorities (other batches: Tianshou's manager add, a Python loop over the rows); sample
    O(batch K D) for the draw plus one array read per stored key; update_weight as
    :class:`PrioritizedReplayBuffer`, plus O(batch) for its written-slot check while some
    sub-buffer is not yet full; ``next``/``prev`` of an int64 array O(batch) in one compiled
    call (Tianshou's: O(batch buffer_num)); ``unfinished_index`` O(buffer_num) in one
    compiled call.
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
        state = SubBufferState(int(buffer_num))
        # Whether every sub-buffer is full (a run's steady state), kept so that the per-call
        # paths need not sum the lengths: set by add once true, cleared by reset.
        self._full = False
        ReplayBufferManager.__init__(self, [SubBuffer(size, state, b, **kwargs) for b in range(int(buffer_num))])
        self._sub_state, self._sub_size = state, size
        self._all_ids = np.arange(int(buffer_num))
        self._keep_priorities(index, weight_norm)
        self.options.update(alpha=alpha, beta=beta, weight_norm=weight_norm, variant=variant, eps=eps,
                            stratified=stratified, variant_params=variant_params)

    def _compile(self) -> None:
        """Nothing: numba compiles Tianshou's ``prev``/``next`` kernels at their first call
        (only for indices that are not an int64 array: :meth:`next`), not here; Tianshou's
        manager warms them up in its constructor, which costs seconds per process whether or
        not they are used."""

    def add(self, batch, buffer_ids=None):
        """Write row ``j`` of ``batch`` into sub-buffer ``buffer_ids[j]``; Tianshou's return
        (the slots written, episode returns, lengths and start slots), and Tianshou's storage
        and episode bookkeeping after it.

        A batch whose keys and shapes match the storage's (every add after the first, unless
        a key appears or a shape changes) is written by :meth:`_add_rows`: one compiled call
        moves every sub-buffer's bookkeeping on, and one array write per stored key. Anything
        else (the first add, which allocates the storage, a new key, frame-stacking options)
        goes through Tianshou's manager ``add``."""
        out = self._add_rows(batch, buffer_ids)
        if out is not None:
            return out
        self._check_buffer_ids(batch, buffer_ids)
        rew = batch.get("rew") if isinstance(batch, Batch) else None
        if np.ndim(rew) > 1:
            raise ValueError(f"batch.rew has shape {np.shape(rew)}: this buffer keeps one episode return per "
                             f"sub-buffer, so a reward must be one number per row")
        out = super().add(batch, buffer_ids)
        self._full = len(self) == self.maxsize
        return out

    def reset(self, keep_statistics: bool = False) -> None:
        super().reset(keep_statistics)
        self._full = False

    def _add_rows(self, batch, buffer_ids) -> tuple | None:
        """Tianshou's manager ``add`` of ``batch`` when its values are arrays (or nested
        ``Batch`` es of arrays) with the stored keys and shapes, ``buffer_ids`` a 1-D integer
        array of ids in range and rewards one number per row; None, having changed nothing,
        otherwise.

        The same result as Tianshou's: the rows' keys that Tianshou keeps (its reserved keys;
        ``done`` recomputed as ``terminated | truncated``), numbers cast into the stored arrays
        as NumPy assignment casts them (Tianshou's ``Batch.__setitem__`` does the same), each
        sub-buffer's insertion point, length, episode return, length and start moved on row by
        row (repeated ids as Tianshou's loop handles them). Costs: O(keys) Python checks, one
        compiled O(rows) call, one array write per stored key, one tree call for the new
        priorities; Tianshou's loops over the rows in Python and goes through ``Batch``'s
        per-key checks."""
        stored = self._meta.__dict__
        if type(batch) is not Batch or not stored or not self._plain_storage():
            return None
        ids = self._all_ids if buffer_ids is None else buffer_ids
        if type(ids) is not np.ndarray:
            ids = np.asarray(ids)
        if ids.ndim != 1 or ids.dtype.kind not in "iu" or stored["rew"].ndim != 1:
            return None
        values = batch.__dict__
        writes = _matching_writes(stored, values, ids.shape[0])
        if writes is None or not values.keys() & RESERVED_KEYS <= stored.keys():
            return None
        done = np.logical_or(values["terminated"], values["truncated"])
        if values["rew"].dtype.kind not in "biuf" or done.dtype.kind != "b":
            return None  # object rewards or flags: the compiled call takes numbers only
        rows = ids.shape[0]
        slots, starts, ep_len = np.empty(rows, np.int64), np.empty(rows, np.int64), np.empty(rows, np.int64)
        ep_return = np.empty(rows)
        state = self._sub_state
        # A subclass's own init_weight is called as it is; ours is done in the compiled call.
        mark = self.priorities.mark_args() if type(self).init_weight is PrioritizedReplayBuffer.init_weight else None
        if mark is None:
            status = _advance_sub_buffers(ids, values["rew"], done, self._offset, self._sub_size, state.ints,
                                          state.ep_return, state.last, self.last_index, self._lengths, slots,
                                          ep_return, ep_len, starts)
        else:
            # The new slots' priorities set in the same compiled call (one call instead of two,
            # each cache-cold in a training loop); as init_weight would set them.
            status, marked = _advance_and_mark(ids, values["rew"], done, self._offset, self._sub_size, state.ints,
                                               state.ep_return, state.last, self.last_index, self._lengths, slots,
                                               ep_return, ep_len, starts, *mark)
            if status == 0 and marked != 0:  # cannot happen: the slots are in range, the priority was stored
                raise RuntimeError(f"marking the new slots {slots} failed with status {marked}")
        if status < 0:
            return None  # an id out of range: Tianshou's path names it, nothing has changed
        if status > 0:
            b = int(ids[status - 1])
            raise MalformedBufferError(f"sub-buffer {b}'s episode start {int(state.ints[3, b])} is outside its "
                                       f"{int(state.ints[1, b])} stored transitions (the buffer was modified by hand?)")
        for array, value in writes:
            array[slots] = value
        stored["done"][slots] = done
        if mark is None:
            self.init_weight(slots)
        if not self._full:
            self._full = len(self) == self.maxsize
        return slots, ep_return, ep_len, starts

    def __len__(self) -> int:
        """Transitions stored in all sub-buffers; O(1) once every one is full."""
        return self.maxsize if self._full else int(self._lengths.sum())

    def _plain_storage(self) -> bool:
        """Whether rows are stored as given: no last-frame-only option, ``obs_next`` kept."""
        return self._save_obs_next and not self._save_only_last_obs

    def unfinished_index(self) -> np.ndarray:
        """The last slot of each sub-buffer whose episode is not finished, sub-buffer by
        sub-buffer (Tianshou's manager result), from the bookkeeping arrays: one compiled
        O(buffer_num) call, not a Python call per sub-buffer (Tianshou's n-step returns call
        it at every update)."""
        done = self._meta.__dict__.get("done")
        if type(done) is not np.ndarray or done.dtype.kind != "b":
            return super().unfinished_index()  # nothing stored yet, or flags the kernel does not take
        return _unfinished_slots(self._sub_size, self._sub_state.ints, done)

    def next(self, index):
        """The slot after each of ``index`` within its sub-buffer's episode (the slot itself at
        an episode's end or a sub-buffer's last written slot), as Tianshou's manager ``next``.
        A 1-D int64 array takes one compiled O(batch) pass (:func:`_next_slots`; Tianshou's
        kernel makes masks over the whole batch once per sub-buffer); anything else Tianshou's."""
        done = self._fast_flags(index)
        if done is None:
            return super().next(index)
        return _next_slots(index, self._sub_size, done, self.last_index, self._lengths)

    def prev(self, index):
        """The slot before each of ``index`` within its sub-buffer's episode, as Tianshou's
        manager ``prev``; a 1-D int64 array in one compiled O(batch) pass (:func:`_prev_slots`)."""
        done = self._fast_flags(index)
        if done is None:
            return super().prev(index)
        return _prev_slots(index, self._sub_size, done, self.last_index, self._lengths)

    def _fast_flags(self, index) -> np.ndarray | None:
        """The stored ``done`` flags when ``index`` is a 1-D int64 array and the storage holds
        boolean flags (what the compiled ``next``/``prev`` take); None otherwise."""
        if type(index) is not np.ndarray or index.ndim != 1 or index.dtype != np.int64:
            return None
        done = self._meta.__dict__.get("done")
        if type(done) is not np.ndarray or done.dtype.kind != "b" or done.shape[0] != self.maxsize:
            return None
        return done

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        # A copy of the buffer pickles each sub-buffer's reference to the bookkeeping; where
        # they were stored apart (Tianshou's HDF5 pickles the sub-buffers on their own), they
        # share the manager's again, and the storage views are re-cut from the manager's.
        for buf in self.buffers:
            object.__setattr__(buf, "_sub_state", self._sub_state)
        self._full = len(self) == self.maxsize
        if self._meta.__dict__:
            self._set_batch_for_children()

    def update_weight(self, index: np.ndarray, new_weight) -> None:
        """Set priorities from ``new_weight`` (TD errors; their absolute value is used) at
        ``index``, slots some sub-buffer has written."""
        # |w| is taken in the tree's compiled update (PriorityIndex.update_abs): no float64
        # array made here, one compiled call for what Tianshou's DQN passes.
        weight = td_array(new_weight)
        if self._full:
            # Every sub-buffer is full (a training run's steady state): every slot is written,
            # so the tree's own range check is the whole check. It changes nothing when it
            # fails; the check below then names the bad index as for a partly written buffer.
            try:
                self.priorities.update_abs(index, weight, n_valid=self.maxsize)
                return
            except IndexError:
                pass
        idx = as_indices(index, "indices")
        # One compiled pass while sub-buffers fill (the first buffer_size env steps of a run);
        # the NumPy check that names the bad index only when there is one.
        if _first_unwritten(idx, self._sub_size, self._lengths) >= 0:
            self._check_written(idx)
        self.priorities.update_abs(idx, weight, n_valid=self.maxsize)

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


class SubBufferState:
    """The episode bookkeeping of a vector buffer's sub-buffers, one column per sub-buffer,
    in arrays that a compiled call moves on for many rows at once.

    ``ints`` rows: 0 the insertion point, 1 the stored length, 2 the running episode length,
    3 the running episode's first slot (each in the sub-buffer's own numbering);
    ``ep_return`` the running episode return; ``last`` each sub-buffer's last written slot
    (its ``last_index[0]``).
    """

    def __init__(self, buffer_num: int) -> None:
        self.ints = np.zeros((4, buffer_num), np.int64)
        self.ep_return = np.zeros(buffer_num)
        self.last = np.zeros(buffer_num, np.int64)


def _state_field(row: int, doc: str) -> property:
    def get(self) -> int:
        return int(self._sub_state.ints[row, self._slot])

    def put(self, value) -> None:
        self._sub_state.ints[row, self._slot] = value

    return property(get, put, doc=doc)


class SubBuffer(ReplayBuffer):
    """A sub-buffer of :class:`PrioritizedVectorReplayBuffer`: Tianshou's ``ReplayBuffer``
    (the manager gives it a view of its slots of the storage) whose episode bookkeeping
    (``_insertion_idx``, ``_size``, ``_ep_len``, ``_ep_start_idx``, ``_ep_return``,
    ``last_index``) lives in column ``slot`` of the manager's :class:`SubBufferState`.

    Tianshou's own code that reads or moves that bookkeeping (its manager's ``add``,
    ``reset``, ``sample_indices``, the sub-buffer's ``unfinished_index``) works on it
    unchanged, and the manager's fast ``add`` moves it for every row in one compiled call.
    An episode return is one number (a float) per sub-buffer.
    """

    _insertion_idx = _state_field(0, "The next slot to write.")
    _size = _state_field(1, "Transitions stored.")
    _ep_len = _state_field(2, "Steps of the running episode.")
    _ep_start_idx = _state_field(3, "The running episode's first slot.")

    def __init__(self, size: int, state: SubBufferState, slot: int, **kwargs: Any) -> None:
        self._sub_state, self._slot = state, int(slot)  # before Tianshou's __init__ sets the fields
        super().__init__(size, **kwargs)

    @property
    def _ep_return(self) -> float:
        """Return of the running episode so far."""
        return float(self._sub_state.ep_return[self._slot])

    @_ep_return.setter
    def _ep_return(self, value) -> None:
        self._sub_state.ep_return[self._slot] = value

    @property
    def last_index(self) -> np.ndarray:
        """``[the last slot written]``: a one-element view, so Tianshou's ``last_index[0] = i`` writes through."""
        return self._sub_state.last[self._slot: self._slot + 1]

    @last_index.setter
    def last_index(self, value) -> None:
        self._sub_state.last[self._slot] = np.asarray(value).reshape(-1)[0]


@njit(cache=True, nogil=True)
def _advance_sub_buffers(ids, rew, done, offset, sub_size, ints, ep_return, last, last_index, lengths,
                         slots, returns, ep_lens, starts):
    """Tianshou's ``_update_state_pre_add`` for row ``j`` in sub-buffer ``ids[j]``, rows in
    order, with the manager's ``last_index`` and ``_lengths``; outputs per row the slot to
    write (in the whole storage), the episode return and length (0 unless ``done[j]``) and the
    episode's first slot. Returns -1, having changed nothing, when an id is out of range;
    ``j + 1`` when row ``j`` finds its sub-buffer's episode start beyond its length
    (Tianshou's MalformedBufferError, raised after the same changes); else 0. O(rows)."""
    n = ints.shape[1]
    for j in range(ids.shape[0]):
        if ids[j] < 0 or ids[j] >= n:
            return -1
    for j in range(ids.shape[0]):
        b = ids[j]
        cur = ints[0, b]
        last[b] = cur
        last_index[b] = cur + offset[b]
        ints[1, b] = min(ints[1, b] + 1, sub_size)
        ints[0, b] = (cur + 1) % sub_size
        ep_return[b] += rew[j]
        ints[2, b] += 1
        if ints[3, b] > ints[1, b]:
            return j + 1
        slots[j] = cur + offset[b]
        starts[j] = ints[3, b] + offset[b]
        lengths[b] = ints[1, b]
        if done[j]:
            returns[j] = ep_return[b]
            ep_lens[j] = ints[2, b]
            ep_return[b] = 0.0
            ints[2, b] = 0
            ints[3, b] = ints[0, b]
        else:
            returns[j] = 0.0
            ep_lens[j] = 0
    return 0


@njit(cache=True, nogil=True)
def _advance_and_mark(ids, rew, done, offset, sub_size, ints, ep_return, last, last_index, lengths, slots, returns,
                      ep_lens, starts, kind, sums, mins, lay, K, kshift, touch_from, tree_state, priority, capacity,
                      vmax):
    """:func:`_advance_sub_buffers`, then (when it returns 0) the written slots set to
    ``priority`` in the tree (``ops.update`` with eps 0 and alpha 1: what ``init_weight``
    stores). Returns ``(advance status, tree status)``; the tree is untouched unless the
    advance succeeded. O(rows D)."""
    status = _advance_sub_buffers(ids, rew, done, offset, sub_size, ints, ep_return, last, last_index, lengths,
                                  slots, returns, ep_lens, starts)
    if status != 0:
        return status, 0
    marked, _, _ = ops.update(kind, sums, mins, lay, K, kshift, touch_from, tree_state, slots,
                              np.full(slots.shape[0], priority), capacity, 0.0, 1.0, vmax)
    return 0, marked


@njit(cache=True, nogil=True)
def _next_slots(index, sub_size, done, last_index, lengths):
    """Tianshou's ``_next_index`` for ``lengths.shape[0]`` sub-buffers of ``sub_size`` slots
    each (sub-buffer ``b`` at ``b * sub_size``): an index is taken modulo the storage, and the
    result is ``(i - start + 1 - end) % max(1, length) + start`` with ``end`` whether slot ``i``
    ends an episode or is its sub-buffer's last written slot. The same numbers, in one pass
    over the batch. O(batch)."""
    total = sub_size * lengths.shape[0]
    out = np.empty_like(index)
    for j in range(index.shape[0]):
        i = index[j] % total
        b = i // sub_size
        start = b * sub_size
        end = 1 if done[i] or i == last_index[b] else 0
        out[j] = (i - start + 1 - end) % max(1, lengths[b]) + start
    return out


@njit(cache=True, nogil=True)
def _prev_slots(index, sub_size, done, last_index, lengths):
    """Tianshou's ``_prev_index`` over the layout of :func:`_next_slots`: the slot ``p`` before
    ``i`` in its sub-buffer's ring, unless ``p`` ends an episode or is the last written slot,
    where ``i`` itself is returned. O(batch)."""
    total = sub_size * lengths.shape[0]
    out = np.empty_like(index)
    for j in range(index.shape[0]):
        i = index[j] % total
        b = i // sub_size
        start = b * sub_size
        n = max(1, lengths[b])
        sub = (i - start - 1) % n
        end = 1 if done[sub + start] or sub + start == last_index[b] else 0
        out[j] = (sub + end) % n + start
    return out


@njit(cache=True, nogil=True)
def _unfinished_slots(sub_size, ints, done):
    """The last written slot of each sub-buffer (``ints`` as :class:`SubBufferState`'s) that
    holds transitions and whose flag there is not ``done``, in sub-buffer order. O(buffer_num)."""
    n = ints.shape[1]
    out = np.empty(n, np.int64)
    k = 0
    for b in range(n):
        size = ints[1, b]
        if size > 0:
            slot = b * sub_size + (ints[0, b] - 1) % size
            if not done[slot]:
                out[k] = slot
                k += 1
    return out[:k].copy()


@njit(cache=True, nogil=True)
def _first_unwritten(idx, sub_size, lengths):
    """The first position ``j`` of ``idx`` that is no slot of the storage (``lengths.shape[0]``
    sub-buffers of ``sub_size`` slots, sub-buffer ``b`` at ``b * sub_size``), or a slot its
    sub-buffer has not written (``lengths[b]`` written); -1 when there is none. O(batch)."""
    for j in range(idx.shape[0]):
        i = idx[j]
        if i < 0 or i >= sub_size * lengths.shape[0] or i % sub_size >= lengths[i // sub_size]:
            return j
    return -1


def _matching_writes(stored: dict, values: dict, rows: int, top: bool = True) -> list | None:
    """``[(stored array, the rows to write into it), ...]`` for every stored key (but the top
    level's ``done``, which the caller computes) when ``values`` (a batch's keys) has, for
    each, an array of ``rows`` rows with the stored array's row shape (nested ``Batch`` es:
    the same keys, recursively); None otherwise. Keys in ``values`` that are not stored are
    not looked at here."""
    writes = []
    for key, array in stored.items():
        if top and key == "done":
            continue
        value = values.get(key)
        if type(array) is np.ndarray:
            if type(value) is not np.ndarray or value.shape[:1] != (rows,) or value.shape[1:] != array.shape[1:]:
                return None
            writes.append((array, value))
        elif type(array) is Batch and type(value) is Batch and value.__dict__.keys() == array.__dict__.keys():
            nested = _matching_writes(array.__dict__, value.__dict__, rows, False) if array.__dict__ else []
            if nested is None:
                return None
            writes.extend(nested)
        else:
            return None
    return writes


def td_array(new_weight) -> np.ndarray:
    """``new_weight`` (TD errors: a tensor on any device, an array, a sequence, a number) as a
    1-D NumPy array of real numbers, a view where it can be (no copy of a CPU tensor or an
    array); TypeError naming ``new_weight`` and the first entry that is not a real number.

    What :func:`real_array` gives, reached in one ``detach().numpy()`` for what Tianshou's DQN
    passes (a CPU float tensor that requires grad): ``real_array`` also asks the tensor for
    ``cpu()`` and its dtype's name, each a cache-cold call in a training loop. Anything
    ``numpy()`` refuses (a GPU or bfloat16 tensor) goes through ``real_array``. O(1) but for
    the copy of a tensor off a GPU."""
    w = new_weight
    if type(w) is not np.ndarray:
        try:
            w = w.detach().numpy()
        except (AttributeError, TypeError, RuntimeError):  # not a CPU tensor NumPy can view
            w = real_array(new_weight, "new_weight")
        if type(w) is not np.ndarray:  # a detach() that is not torch's
            w = real_array(new_weight, "new_weight")
    if w.dtype.kind not in "fiub":
        check_real(w, "new_weight")  # raises, naming the first entry that is not a real number
    return w if w.ndim == 1 else w.reshape(-1)


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


def gather_rows(meta: Batch, indices: np.ndarray) -> Batch | None:
    """The rows ``indices`` (a 1-D integer array) of a Tianshou storage ``meta``, as Tianshou's
    ``ReplayBuffer.__getitem__`` gives them without frame stacking: the keys of
    :data:`BATCH_KEYS` in that order (an empty ``Batch`` for a missing optional one), then any
    other stored key; nested ``Batch`` values gathered key by key, empty ones as ``Batch()``.

    Why not Tianshou's: it builds the result through ``Batch(dict)``, which checks and parses
    every value (``_parse_value``), several times the cost of the array reads themselves. The
    values here need no parsing: a fancy-indexed numeric array is what ``_parse_value`` keeps
    as it is. None (the caller then uses Tianshou's gather) where the storage holds anything
    else: an object or string array, a tensor, None, or a required key missing. O(batch) per
    stored array, no Python loop over the rows.
    """
    stored = meta.__dict__
    out = _new_batch()
    rows = out.__dict__
    for key in BATCH_KEYS:
        value = stored.get(key, _MISSING)
        if type(value) is np.ndarray and value.dtype.kind in "biufc":
            # _gathered's array case inline: no call per key (one per key is a third of the cost)
            rows[key] = value.take(indices, axis=0) if value.ndim > 1 else value[indices]
            continue
        if value is _MISSING:
            if key in REQUIRED_KEYS:
                return None
            rows[key] = _new_batch()
            continue
        rows[key] = value = _gathered(value, indices)
        if value is None:
            return None
    if not stored.keys() <= BATCH_KEY_SET:
        for key, value in stored.items():  # keys beyond Tianshou's (set by hooks): after the others
            if key not in BATCH_KEY_SET:
                rows[key] = value = _gathered(value, indices)
                if value is None:
                    return None
    return out


_MISSING = object()


def _new_batch() -> Batch:
    """An empty ``Batch``, what ``Batch()`` gives: ``Batch.__init__`` with no arguments sets
    nothing, so it is skipped (its argument checks are a cache-cold call per key gathered)."""
    return Batch.__new__(Batch)


def _gathered(value, indices: np.ndarray):
    """``value[indices]`` for a numeric or boolean array, key by key for a ``Batch`` (an empty
    one gives ``Batch()``, as Tianshou's slicing does); None for anything else."""
    if type(value) is np.ndarray:
        if value.dtype.kind not in "biufc":
            return None
        # take: the same rows (and IndexError) as value[indices], several times faster for
        # rows of more than one number (NumPy's fancy indexing sets up a general iterator).
        return value.take(indices, axis=0) if value.ndim > 1 else value[indices]
    if type(value) is Batch:
        out = _new_batch()
        rows = out.__dict__
        for key, sub in value.__dict__.items():
            rows[key] = sub = _gathered(sub, indices)
            if sub is None:
                return None
        return out
    return None
