"""TorchRL: a sampler with the API of ``torchrl.data.PrioritizedSampler``, priorities in a
registered variant.

It subclasses TorchRL's ``PrioritizedSampler`` (so TorchRL's checks for a prioritized sampler,
such as ``update_tensordict_priority``, accept it) and replaces its C++ segment trees with a
:class:`~replaybench.adapters._core.PriorityIndex`. Use it where TorchRL takes a sampler, with
the storage unchanged; a ``TensorDictReplayBuffer`` with it is what
``TensorDictPrioritizedReplayBuffer`` builds around TorchRL's own sampler (priority key,
``update_priority``, ``update_tensordict_priority``, ``sample(return_info=True)`` giving
``index`` and ``priority_weight``)::

    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(2**16), priority_key="td_error",
                                sampler=PrioritizedSampler(2**16, alpha=0.6, beta=0.4))

Behaviour as TorchRL's: priorities ``(priority + eps) ** alpha`` (eps 1e-8 by default),
weights ``(p_i / p_min) ** -beta`` with ``p_min`` the smallest stored priority, float32
``priority_weight`` and int64 ``index`` tensors, ``-1`` indices skipped by
``update_priority``. Also as TorchRL's, for code written against its sampler:

- ``alpha`` and ``beta`` may be 0-d tensors (what its parameter schedulers may set) and
  ``beta`` any finite number >= 0 (a schedule that overshoots 1 keeps running; the weights
  stay in ``(0, 1]``).
- With a buffer ``generator``, each sample draws one key from it, so the generator's state
  alone decides the draws: resetting it (``manual_seed``, ``set_state``, ``set_rng``)
  repeats them. Without one, draws come from this sampler's NumPy generator, seeded from
  torch's global generator when the sampler is made (``torch.manual_seed`` makes runs
  repeatable; TorchRL draws from NumPy's global generator there).
- ``max_priority_within_buffer=True``: new data gets the largest priority stored *now*,
  among the transitions it does not overwrite (1 when there is none); an update that lowers
  the slot holding it, or a write over that slot, costs one O(capacity) scan of the leaves.
  TorchRL's own mode falls back to priority 1 once the slot holding the maximum is
  overwritten, until the next ``update_priority`` rescans the leaves.
- An empty storage raises :class:`~replaybench.adapters._core.NothingToSampleError`, a
  RuntimeError as TorchRL's and a ValueError as our buffers' (so is a storage whose
  priorities are all 0, TorchRL's "non-positive p_sum").
- ``_sum_tree``, ``_min_tree`` and ``_max_priority`` are read-only views with what TorchRL's
  users and tests read: ``_sum_tree[i]`` and ``_sum_tree[index_tensor]`` (a tensor back),
  ``_sum_tree.query(l, r)``, the same on ``_min_tree``, and ``_max_priority`` as ``(largest
  raw priority given, its slot)`` or ``(None, None)``. See :mod:`replaybench.adapters.views`
  for their costs. Unlike TorchRL's min tree, an unwritten slot reads ``inf``, not the
  float type's largest value.

Differences, on purpose:

- New transitions get the largest stored priority ``p_max`` (Schaul et al.). TorchRL's
  ``mark_update`` passes its ``default_priority``, already ``(max + eps) ** alpha``, through
  ``update_priority``, which raises it to alpha again: its new transitions get ``p_max **
  alpha``, less than ``p_max`` once a priority above 1 was set.
- Bad input (a NaN, inf, negative, complex or string priority, an index outside the storage,
  an empty storage) raises an error naming it and changes nothing; ``loads`` and
  ``load_state_dict`` are all or nothing (a corrupt folder leaves the sampler as it was;
  TorchRL's sets alpha, beta and eps before it checks the capacity).

Refused, each with an error naming it, and why:

- A slot index >= ``max_capacity``: TorchRL's C++ tree does not check it and writes past its
  leaves (into another slot's or the padding's node). A slot not yet written (>= the
  storage's length, which the buffer passes): TorchRL stores it, but it is never drawn and
  is overwritten when the slot is written, so it has no effect there; ours would be drawn.
- A multi-dimensional storage (``ndim > 1``), not supported yet: it needs the ``(n, ndim)``
  indices TorchRL's writers pass raveled onto the flat tree, sampled slots unraveled back,
  and the written-slot check following the storage's fill order; none of that is tested
  against TorchRL here. The error comes at the first ``extend``, after TorchRL's writer has
  filled the storage and before any priority changes; use a 1-D storage.
- ``device`` other than the CPU: the trees are CPU structures. The tree's float type is the
  variant's (``variant_params={"dtype": "float64"}``), not ``dtype``.
"""

from __future__ import annotations

from replaybench.adapters._core import DEFAULT_VARIANT, NothingToSampleError, PriorityIndex, real_array, require

require("torchrl")

import json  # noqa: E402  (after the framework check, on purpose)
import math  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torchrl.data.replay_buffers.samplers import PrioritizedSampler as _TorchRLPrioritizedSampler  # noqa: E402

from replaybench.adapters.views import MinTreeView, SumTreeView  # noqa: E402
from replaybench.impl.buffers import check_buffer_params, check_number  # noqa: E402

__all__ = ["PrioritizedSampler"]


class PrioritizedSampler(_TorchRLPrioritizedSampler):
    """TorchRL's prioritized sampler API over a registered variant's tree.

    Parameters
    ----------
    max_capacity, alpha, beta, eps, dtype, reduction, max_priority_within_buffer, device
        As TorchRL's ``PrioritizedSampler`` (see the module docstring for ``dtype``,
        ``device`` and ``max_priority_within_buffer``; ``reduction`` is TorchRL's, used by its
        buffers to reduce a per-step priority).
    variant : str
        A registered tree variant (``replaybench list``).
    stratified : bool
        One draw per equal-mass segment instead of independent draws.
    variant_params : dict, optional
        The variant's structure parameters (``{"K": 8}``).

    Costs (D = tree depth): sample O(batch K D), update_priority and mark_update O(n D), plus
    the tensor conversions (no copies on the CPU).
    """

    def __init__(self, max_capacity: int, alpha: float, beta: float, eps: float = 1e-8,
                 dtype: torch.dtype = torch.float, reduction: str = "max", max_priority_within_buffer: bool = False,
                 device=None, *, variant: str = DEFAULT_VARIANT, stratified: bool = False,
                 variant_params: dict | None = None) -> None:
        if device is not None and torch.device(device).type != "cpu":
            raise ValueError(f"device must be the CPU (the trees are CPU structures), got {device!r}")
        self._variant, self._stratified, self._variant_params = variant, stratified, dict(variant_params or {})
        alpha, beta = _scalar(alpha, "alpha"), _scalar(beta, "beta")
        self._key = torch.empty((), dtype=torch.int64)  # where sample draws its key from the buffer's generator
        # TorchRL's __init__ only stores max_priority_within_buffer (its add/extend use it; ours
        # do not): _new_index reads it from there.
        super().__init__(max_capacity, alpha, beta, eps, dtype, reduction, bool(max_priority_within_buffer), None)

    def _init(self) -> None:  # called by TorchRL's __init__ and _empty: a fresh, empty tree
        seed = int(torch.randint(0, 2**62, (1,)).item())
        self._index = self._new_index(self._alpha, self._beta, self._eps, seed)
        self._raw_max = None  # (largest raw priority given, its slot), what _max_priority shows

    def _new_index(self, alpha, beta, eps, seed) -> PriorityIndex:
        return PriorityIndex(self._variant, self._max_capacity, alpha=alpha, beta=beta, eps=eps,
                             stratified=self._stratified, seed=seed, beta_max=math.inf,
                             max_within_buffer=self._max_priority_within_buffer, **self._variant_params)

    @property
    def _sum_tree(self) -> SumTreeView:
        """Read-only view of the priorities as TorchRL's ``SumSegmentTree`` (``[i]``,
        ``query(l, r)``); see :mod:`replaybench.adapters.views` for costs."""
        return _TensorSumTreeView(self._index, "update_priority")

    @property
    def _min_tree(self) -> MinTreeView:
        """Read-only view of the priorities as TorchRL's ``MinSegmentTree``."""
        return _TensorMinTreeView(self._index, "update_priority")

    @property
    def _max_priority(self) -> tuple[float | None, int | None]:
        """``(largest raw priority given to update_priority, its slot)``, as TorchRL's, or
        ``(None, None)`` before any; the first ``mark_update`` records the default priority
        there, as TorchRL's does. With ``max_priority_within_buffer``: the raw priority new
        data gets now and a slot holding it. Read-only."""
        if self._index.max_within:
            slot = self._index.max_slot
            return (None, None) if slot is None else (self.default_priority, slot)
        return self._raw_max if self._raw_max is not None else (None, None)

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def alpha(self) -> float:
        return self._index.alpha

    @alpha.setter
    def alpha(self, value) -> None:  # a 0-d tensor too (TorchRL's parameter schedulers may give one)
        self._alpha = self._index.alpha = check_buffer_params(alpha=_scalar(value, "alpha"), beta=0.0,
                                                              eps=self._eps, stratified=False)["alpha"]

    @property
    def beta(self) -> float:
        return self._index.beta

    @beta.setter
    def beta(self, value) -> None:  # any finite beta >= 0, as TorchRL; a 0-d tensor too
        self._index.set_beta(_scalar(value, "beta"))
        self._beta = self._index.beta

    @property
    def default_priority(self) -> float:
        """The raw priority whose ``(priority + eps) ** alpha`` is the largest stored one, so
        TorchRL's ``update_priority(index, default_priority)`` gives new data ``p_max``."""
        p = self._index.max_priority
        return 1.0 if self._index.alpha == 0 else max(p ** (1.0 / self._index.alpha) - self._index.eps, 0.0)

    def sample(self, storage, batch_size: int):
        if getattr(storage, "ndim", 1) > 1:
            raise ValueError(f"storage must be 1-dimensional for this sampler, got ndim={storage.ndim}")
        stored = len(storage)  # once: TorchRL's storages answer len through torch._dynamo wrappers (microseconds)
        if stored == 0:  # a RuntimeError too, as TorchRL raises
            raise NothingToSampleError("cannot sample from an empty storage: extend the buffer first")
        if self._rng is not None:
            # One key drawn from the buffer's generator per sample: its state alone decides the
            # draws, so resetting it (manual_seed, set_state, set_rng) repeats them, as in TorchRL.
            # (random_ into a kept 0-d tensor: a quarter of torch.randint's cost per call.)
            self._index.reseed(int(self._key.random_(0, 2**62, generator=self._rng)))
        idx, weights = self._index.sample(batch_size, n_valid=stored)
        return torch.from_numpy(idx), {"priority_weight": torch.from_numpy(weights)}

    def add(self, index) -> None:  # new data is marked by the writer's mark_update
        return

    def extend(self, index) -> None:
        return

    def update_priority(self, index, priority, *, storage=None) -> None:
        """Store ``(priority + eps) ** alpha`` at ``index`` (a scalar priority is broadcast;
        ``-1`` entries are skipped, as TorchRL's writers use them for "not written"). With
        ``storage`` (the buffer passes it) an index must be below ``len(storage)``."""
        # No torch.no_grad() around this (TorchRL's has one, microseconds a call): the
        # priorities leave torch at once, detached, and no tensor is made from them.
        idx, prio = self._as_arrays(index, priority)
        keep = idx != -1
        if not keep.all():
            idx, prio = idx[keep], prio[keep]
        if idx.size:  # the buffer passes its storage: then only written slots may be updated
            written = self._max_capacity if storage is None else min(len(storage), self._max_capacity)
            self._index.update(idx, prio, n_valid=written)
            top = int(np.argmax(prio))
            if self._raw_max is None or prio[top] > self._raw_max[0]:
                self._raw_max = (float(prio[top]), int(idx[top]))

    def mark_update(self, index, *, storage=None) -> None:
        """Give ``index`` (just written) the largest stored priority. Cost: the tree's one
        call; no priority array is made (the index broadcasts the one priority)."""
        idx = self._as_indices(index)
        if -1 in idx:
            idx = idx[idx != -1]
        if idx.size:
            self._index.mark_new(idx)
            if self._raw_max is None:
                self._raw_max = (self.default_priority, int(idx[0]))

    @staticmethod
    def _as_indices(index) -> np.ndarray:
        """``index`` (a tensor, array, sequence or number) as a 1-D array, a view where it can be."""
        idx = _cpu_numpy(index) if isinstance(index, torch.Tensor) else np.asarray(index)
        if idx.ndim > 1:
            raise ValueError(f"index must be 1-D, got shape {idx.shape}: a multi-dimensional storage is not "
                             f"supported by this sampler (use a 1-D storage)")
        return idx.reshape(-1)

    def _as_arrays(self, index, priority) -> tuple[np.ndarray, np.ndarray]:
        idx = self._as_indices(index)
        # A CPU tensor of a NumPy dtype (what TorchRL's losses give) is viewed, not converted.
        if type(priority) is torch.Tensor and priority.dtype in _NUMPY_REAL and priority.device.type == "cpu":
            prio = priority.detach().numpy()
        else:
            prio = real_array(priority, "priority")
        prio = np.broadcast_to(prio, idx.shape) if prio.size == 1 else prio.reshape(-1)
        return idx, prio

    def state_dict(self) -> dict:
        return {"_alpha": self._alpha, "_beta": self._beta, "_eps": self._eps, "_index": self._index,
                "_max_priority": self._raw_max}

    def load_state_dict(self, state_dict: dict) -> None:
        """Take what :meth:`state_dict` gave: all or nothing (a missing key or an index of
        another capacity raises ValueError and changes nothing)."""
        missing = sorted({"_alpha", "_beta", "_eps", "_index"} - set(state_dict))
        if missing:
            raise ValueError(f"state_dict lacks {missing}: not a state_dict of this sampler")
        index = state_dict["_index"]
        if not isinstance(index, PriorityIndex) or index.capacity != self._max_capacity:
            raise ValueError(f"state_dict['_index'] must be a PriorityIndex of capacity {self._max_capacity}, "
                             f"got {index!r}")
        self._alpha, self._beta, self._eps = state_dict["_alpha"], state_dict["_beta"], state_dict["_eps"]
        self._index, self._raw_max = index, state_dict.get("_max_priority")

    def dumps(self, path) -> None:
        """Write the leaf priorities (``priorities.npy``) and parameters (JSON) into folder ``path``."""
        path = Path(path).absolute()
        path.mkdir(parents=True, exist_ok=True)
        np.save(path / "priorities.npy", self._index.tree.leaves()[: self._max_capacity])
        meta = {"alpha": self._index.alpha, "beta": self._index.beta, "eps": self._index.eps,
                "max_priority": self._index.max_priority, "max_capacity": self._max_capacity,
                "variant": self._variant, "stratified": self._stratified, "variant_params": self._variant_params,
                "raw_max": self._raw_max}
        (path / "sampler_metadata.json").write_text(json.dumps(meta))

    def loads(self, path) -> None:
        """Read what :meth:`dumps` wrote into folder ``path`` (the same capacity and variant
        are required): all or nothing.

        Both files are read and checked (the metadata's keys and values, the priorities'
        shape and values) and a new tree is filled before this sampler changes; a missing,
        truncated or corrupt file raises ValueError naming the file and what is wrong, and
        the sampler keeps its priorities and parameters. The sampler's generator is kept.
        Cost O(capacity D).
        """
        path = Path(path).absolute()
        meta_file, prio_file = path / "sampler_metadata.json", path / "priorities.npy"
        try:
            meta = json.loads(meta_file.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"{meta_file}: cannot read the sampler's metadata ({type(err).__name__}: {err})") from err
        keys = {"alpha", "beta", "eps", "max_priority", "max_capacity", "variant"}
        if not isinstance(meta, dict) or not keys <= meta.keys():
            got = sorted(meta) if isinstance(meta, dict) else type(meta).__name__
            raise ValueError(f"{meta_file}: the metadata must hold {sorted(keys)}, got {got}")
        if meta["max_capacity"] != self._max_capacity or meta["variant"] != self._variant:
            raise ValueError(f"{path}: written by a sampler of capacity {meta['max_capacity']!r} and variant "
                             f"{meta['variant']!r}; this one has {self._max_capacity} and {self._variant!r}")
        try:
            params = check_buffer_params(alpha=meta["alpha"], beta=0.0, eps=meta["eps"], stratified=False)
            params["beta"] = check_number("beta", meta["beta"], 0.0)
        except ValueError as err:
            raise ValueError(f"{meta_file}: {err}") from err
        max_p, raw_max = meta["max_priority"], meta.get("raw_max")
        if isinstance(max_p, bool) or not isinstance(max_p, (int, float)) or not 0 < max_p < float("inf"):
            raise ValueError(f"{meta_file}: max_priority must be a finite number > 0, got {max_p!r}")
        if raw_max is not None and not (isinstance(raw_max, list) and len(raw_max) == 2):
            raise ValueError(f"{meta_file}: raw_max must be null or [priority, slot], got {raw_max!r}")
        try:
            leaves = np.load(prio_file, allow_pickle=False)
        except (OSError, ValueError, EOFError) as err:
            raise ValueError(f"{prio_file}: cannot read the priorities ({type(err).__name__}: {err})") from err
        if leaves.shape != (self._max_capacity,) or leaves.dtype.kind not in "fiu":
            raise ValueError(f"{prio_file}: the priorities must be {self._max_capacity} numbers, got shape "
                             f"{leaves.shape} of dtype {leaves.dtype}")
        index = self._new_index(params["alpha"], params["beta"], params["eps"], seed=None)
        try:  # validates every leaf (finite, >= 0, not too large for the tree)
            index.tree.update(np.arange(leaves.size), leaves, eps=0.0, alpha=1.0)
        except ValueError as err:
            raise ValueError(f"{prio_file}: {err}") from err
        index.max_priority, index.rng = float(max_p), self._index.rng
        if index.max_within:  # the maximum stored now is in the leaves just read
            index.rescan_max()
        # Everything is read and checked: only now does this sampler change.
        self._alpha, self._beta, self._eps = params["alpha"], params["beta"], params["eps"]
        self._index, self._raw_max = index, None if raw_max is None else (float(raw_max[0]), int(raw_max[1]))


#: Torch dtypes that are NumPy's real dtypes too: a CPU tensor of one is viewed by ``.numpy()``.
_NUMPY_REAL = frozenset({torch.float16, torch.float32, torch.float64, torch.int8, torch.int16, torch.int32,
                         torch.int64, torch.uint8, torch.bool})


def _cpu_numpy(tensor: torch.Tensor) -> np.ndarray:
    """``tensor`` as a NumPy array: a view for a CPU tensor, else a copy from its device."""
    tensor = tensor.detach()
    return (tensor if tensor.device.type == "cpu" else tensor.cpu()).numpy()


def _scalar(value, name: str):
    """``value`` as a Python float when it is a 0-d tensor or array (TorchRL's schedulers and
    users pass those for alpha and beta); anything else unchanged, for the range check that
    follows to name. A tensor of more than one element raises ValueError naming it."""
    if not hasattr(value, "shape"):
        return value
    arr = real_array(value, name)
    if arr.ndim != 0:
        raise ValueError(f"{name} must be a number or a 0-d tensor, got shape {tuple(arr.shape)}")
    return arr.item()


class _TensorIndexing:
    """Index a view with a tensor and get a tensor back, as TorchRL's trees answer."""

    __slots__ = ()

    def __getitem__(self, index):
        if isinstance(index, torch.Tensor):
            return torch.from_numpy(super().__getitem__(index.detach().cpu().numpy()))
        return super().__getitem__(index)


class _TensorSumTreeView(_TensorIndexing, SumTreeView):
    __slots__ = ()


class _TensorMinTreeView(_TensorIndexing, MinTreeView):
    __slots__ = ()
