"""TorchRL: a sampler with the API of ``torchrl.data.PrioritizedSampler``, priorities in a
registered variant, and :class:`TensorDictPrioritizedReplayBuffer`, TorchRL's buffer around it
with ``extend``, ``sample`` and ``update_tensordict_priority`` one pass over the storage's
leaves each (see its docstring; what follows on the sampler holds for it too).

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

import copy  # noqa: E402  (after the framework check, on purpose)
import json  # noqa: E402
import math  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from tensordict import MemoryMappedTensor, TensorDict  # noqa: E402
from torchrl.data import TensorDictReplayBuffer  # noqa: E402
from torchrl.data.replay_buffers.samplers import PrioritizedSampler as _TorchRLPrioritizedSampler  # noqa: E402
from torchrl.data.replay_buffers.storages import TensorStorage  # noqa: E402
from torchrl.data.replay_buffers.writers import TensorDictRoundRobinWriter  # noqa: E402

from replaybench.adapters.views import MinTreeView, SumTreeView  # noqa: E402
from replaybench.impl.buffers import check_buffer_params, check_number  # noqa: E402

__all__ = ["PrioritizedSampler", "TensorDictPrioritizedReplayBuffer"]


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
        """The sampler's state, its priority index copied (O(capacity)), as TorchRL's deep-copies
        its trees: a buffer loaded from it, then written, leaves this sampler as it was."""
        return {"_alpha": self._alpha, "_beta": self._beta, "_eps": self._eps, "_index": copy.deepcopy(self._index),
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


class TensorDictPrioritizedReplayBuffer(TensorDictReplayBuffer):
    """TorchRL's ``TensorDictPrioritizedReplayBuffer`` API over our :class:`PrioritizedSampler`,
    with ``extend``, ``sample`` and ``update_tensordict_priority`` each one pass over the
    storage's leaves::

        rb = TensorDictPrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=LazyTensorStorage(2**16),
                                               priority_key="td_error", batch_size=128)

    A real ``TensorDictReplayBuffer`` (TorchRL's storage, writer and sampler objects, its
    ``state_dict``, ``dumps``/``loads``, transforms and errors); what changes is how the three
    calls reach them. TorchRL's own path goes through TensorDict's generic indexing
    (``storage[index] = data``, ``storage[index]``: per leaf, several dispatch layers and shape
    checks, about 250 µs to write one CartPole step), then the writer, then the sampler. Here,
    on the common case (a plain ``TensorDict`` with a batch dimension and exactly the stored
    keys, dtypes and shapes, a 1-D ``TensorStorage`` on the CPU (``LazyTensorStorage``,
    ``LazyMemmapStorage``), TorchRL's round-robin writer,
    no transform, prefetch, pinned memory or custom collate function):

    - ``extend``: one NumPy slice assignment per stored leaf into the storage's preallocated
      tensors (two where the write wraps; NumPy's small copies cost about half of torch's), the writer's cursor and count and the storage's length moved as
      TorchRL's writer moves them, the slots stored under ``index`` as TorchRL's writer
      stores them (``data`` itself is left as it was, as TorchRL's extend leaves it), new slots marked
      through the attached entities (our sampler's one tree call), the priority key, if
      present, written through ``update_priority``. Anything else goes through TorchRL's own
      ``extend`` unchanged (so its first call, which creates the storage, does).
    - ``sample``: the sampler's one call, then one NumPy ``take`` per leaf, and the result
      built as a ``TensorDict`` from those tensors (fresh tensors each call: a sample held by
      the caller is never overwritten), with ``index`` and ``priority_weight`` as TorchRL's.
    - ``update_tensordict_priority``: one priority per row (``(n,)`` or ``(n, 1)``) goes to
      the sampler's ``update_priority`` at once; other shapes through TorchRL's reduction.

    Costs per call: O(leaves) Python steps (never a loop over the batch) plus the tensor copies
    O(n row bytes), and the sampler's (see :class:`PrioritizedSampler`).

    Parameters
    ----------
    alpha, beta, priority_key, eps, storage, collate_fn, pin_memory, prefetch, transform, reduction,
    batch_size, dim_extend, generator, shared, compilable
        As TorchRL's ``TensorDictPrioritizedReplayBuffer`` (``storage`` defaults to TorchRL's
        default, a ``ListStorage`` of 1000 items, on which only TorchRL's paths run).
    variant, stratified, variant_params
        Our sampler's (see :class:`PrioritizedSampler`).
    """

    def __init__(self, *, alpha: float, beta: float, priority_key: str = "td_error", eps: float = 1e-8,
                 storage=None, collate_fn=None, pin_memory: bool = False, prefetch: int | None = None,
                 transform=None, reduction: str = "max", batch_size: int | None = None, dim_extend: int | None = None,
                 generator: torch.Generator | None = None, shared: bool = False, compilable: bool = False,
                 variant: str = DEFAULT_VARIANT, stratified: bool = False, variant_params: dict | None = None) -> None:
        storage = self._maybe_make_storage(storage, compilable=compilable)
        sampler = PrioritizedSampler(storage.max_size, alpha, beta, eps, reduction=reduction, variant=variant,
                                     stratified=stratified, variant_params=variant_params)
        super().__init__(priority_key=priority_key, storage=storage, sampler=sampler, collate_fn=collate_fn,
                         pin_memory=pin_memory, prefetch=prefetch, transform=transform, batch_size=batch_size,
                         dim_extend=dim_extend, generator=generator, shared=shared, compilable=compilable)
        self._fast_collate = collate_fn is None
        self._layout = None  # (the storage's TensorDict it was read from, its _Node or None)

    @property
    def prioritized_sampler(self) -> PrioritizedSampler:
        """The sampler that owns the priorities, as TorchRL's buffer names it."""
        return self._sampler

    def __getstate__(self) -> dict:
        # The layout's NumPy views would be pickled (and deep-copied) as copies, no longer the
        # storage's memory: the copy reads the storage anew at its first fast call.
        state = super().__getstate__()
        state["_layout"] = None
        return state

    # ------------------------------------------------------------------ fast-path checks
    def _plan(self) -> _Node | None:
        """The storage's layout (a :class:`_Node` tree over NumPy views of its preallocated
        tensors) when the fast paths apply to it, else None. Rebuilt when the storage's
        TensorDict, or a tensor in it, is another object (after ``set_storage``,
        ``load_state_dict`` or ``loads``; ``empty`` keeps them)."""
        storage = self._storage
        if (type(self._writer) is not TensorDictRoundRobinWriter or not isinstance(storage, TensorStorage)
                or not storage.initialized or storage.ndim != 1 or self.dim_extend != 0
                or (self._transform is not None and len(self._transform)) or self._prefetch or self._pin_memory
                or not self._fast_collate or type(self._sampler) is not PrioritizedSampler):
            return None
        # (A locked storage, as LazyMemmapStorage's, lists its keys in _storage_keys and TorchRL
        # drops other keys of the data; the fast path takes only data of exactly those keys.)
        td = storage._storage
        layout = self._layout
        # The same TensorDict may have had its tensors replaced (TorchRL's load_state_dict
        # sets loaded tensors into it): the views are kept only while every stored tensor is
        # the one they view (O(leaves) identity checks).
        if layout is None or layout[0] is not td or (layout[1] is not None and not layout[1].views(td)):
            plan = _Node.of(td) if type(td) is TensorDict and td.batch_dims == 1 else None
            if plan is not None and (td.device is not None and td.device.type != "cpu"):
                plan = None
            index = None if plan is None else plan.leaves.get("index")
            if index is None or index[0].dtype != np.int64 or index[0].ndim != 1:
                plan = None  # TorchRL's writer stores the slots there: without them, its own path
            self._layout = layout = (td, plan)
        return layout[1]

    # ------------------------------------------------------------------ extend
    def extend(self, tensordicts, *, update_priority: bool | None = None) -> torch.Tensor:
        """As TorchRL's ``TensorDictReplayBuffer.extend`` (see the class docstring for the
        fast path: one copy per leaf)."""
        index = self._fast_extend(tensordicts)
        if index is None:
            return super().extend(tensordicts, update_priority=update_priority)
        if update_priority is None or update_priority:
            vector = tensordicts.get(self.priority_key, None)
            if vector is not None:
                try:
                    self.update_priority(index, vector)
                except Exception as e:  # as TorchRL words it
                    raise RuntimeError("Failed to update priority of extended data. You can try to set "
                                       "update_priority=False in the extend method and update the priority "
                                       "manually.") from e
        return index

    def _fast_extend(self, data) -> torch.Tensor | None:
        """Write ``data`` leaf by leaf into the storage and return the slots, or None (nothing
        changed) where the fast path does not apply."""
        if type(data) is not TensorDict or data.batch_dims != 1:
            return None
        plan = self._plan()
        if plan is None:
            return None
        storage, writer = self._storage, self._writer
        n, cap = data.batch_size[0], storage.max_size
        if not 0 < n <= cap:
            return None
        # Every leaf is checked before anything changes: the stored keys exactly (an "index"
        # in data is ignored: the writer overwrites it), dtypes and row shapes; anything else
        # goes through TorchRL, which decides what to do with it.
        pairs = []
        if not plan.sources(data, pairs, top=True):
            return None
        with self._replay_lock, self._write_lock:
            cursor = writer._cursor
            end = cursor + n
            index = torch.arange(cursor, end, dtype=torch.long)
            if end > cap:
                index.remainder_(cap)
            writer._cursor = end % cap
            writer._write_count += n
            pairs.append((index.numpy(), plan.leaves["index"][0]))  # the slots, as TorchRL's writer stores them
            if end <= cap:
                for src, dst in pairs:
                    dst[cursor:end] = src
            else:
                first = cap - cursor
                for src, dst in pairs:
                    dst[cursor:] = src[:first]
                    dst[: n - first] = src[first:]
            storage._last_cursor = index
            storage._len = min(storage._len + n, cap)
            for entity in storage._attached_entities_iter():
                entity.mark_update(index)
            self._sampler.extend(index)
        return index

    # ------------------------------------------------------------------ sample
    def sample(self, batch_size: int | None = None, return_info: bool = False, include_info: bool | None = None):
        """As TorchRL's ``TensorDictReplayBuffer.sample`` (see the class docstring for the fast
        path: the sampler's one call, one gather per leaf)."""
        plan = None
        if include_info is None and (batch_size is None or self._batch_size is None or batch_size == self._batch_size):
            plan = self._plan()
        if batch_size is None:
            batch_size = self._batch_size
        if plan is None or batch_size is None:  # batch_size None: TorchRL's error, from its own path
            return super().sample(batch_size, return_info=return_info, include_info=include_info)
        storage = self._storage
        with self._replay_lock, self._write_lock:
            index, info = self._sampler.sample(storage, batch_size)
            data = plan.gather(index.numpy(), torch.Size([index.shape[0]]), storage._storage.device, top=True)
        info["index"] = index
        data._set_str("index", index, validated=True, inplace=False)
        data._set_str("priority_weight", info["priority_weight"], validated=True, inplace=False)
        return (data, info) if return_info else data

    # ------------------------------------------------------------------ priorities
    def update_tensordict_priority(self, data) -> None:
        """As TorchRL's: the priorities at ``data[priority_key]`` (reduced per row with the
        sampler's ``reduction`` where a row holds several) to the slots ``data["index"]``.
        One priority per row (shape ``(n,)`` or ``(n, 1)``, as TorchRL's losses write it) with a
        1-D index goes to the sampler at once (nothing to reduce)."""
        if type(data) is TensorDict and data.batch_dims == 1 and self._storage.ndim == 1:
            index, priority = data.get("index", None), data.get(self.priority_key, None)
            if (type(index) is torch.Tensor and type(priority) is torch.Tensor and index.dim() == 1
                    and priority.dim() and priority.shape[0] == index.shape[0] == priority.numel()):
                # One priority per row ((n,) or (n, 1), as DQNLoss writes it): TorchRL's
                # reduction of one value is that value.
                if priority.dim() > 1:
                    priority = priority.reshape(index.shape)
                with self._replay_lock, self._write_lock:
                    self._sampler.update_priority(index, priority, storage=self._storage)
                return None
        return super().update_tensordict_priority(data)



#: The tensor types of a storage's leaves the fast paths read and write through NumPy views:
#: ``LazyTensorStorage``'s plain tensors and ``LazyMemmapStorage``'s memory-mapped ones.
_STORED_TENSORS = (torch.Tensor, MemoryMappedTensor)


class _Node:
    """One level of a storage's TensorDict: its leaves ``{name: (NumPy view of the stored
    tensor, dtype, the tensor)}`` and nested levels ``{name: _Node}``, in the storage's key order. The
    views share the storage's memory (CPU tensors of NumPy dtypes), so the fast paths read and
    write through NumPy, which costs about half of torch's per-call overhead on small copies."""

    __slots__ = ("leaves", "children", "keys", "order")

    def __init__(self, leaves: dict, children: dict, order: list) -> None:
        self.leaves, self.children, self.order = leaves, children, order
        self.keys = leaves.keys() | children.keys()

    @classmethod
    def of(cls, td) -> _Node | None:
        """The layout of TensorDict ``td``, or None where a leaf is not a contiguous CPU tensor
        of a NumPy dtype (or a level not a plain TensorDict)."""
        leaves, children, order = {}, {}, []
        for name, value in td._tensordict.items():
            if type(value) is TensorDict and value.batch_dims == 1:
                child = cls.of(value)
                if child is None:
                    return None
                children[name] = child
            elif (type(value) in _STORED_TENSORS and value.device.type == "cpu" and value.dtype in _NUMPY_REAL
                  and value.is_contiguous()):
                # detach: TorchRL's first write of values that carry a graph (a policy run
                # outside no_grad) leaves its storage tensors requiring grad; the view is of
                # the same memory, and what the fast paths write and read are values only.
                leaves[name] = (value.detach().numpy(), value.dtype, value)
            else:
                return None
            order.append(name)
        return cls(leaves, children, order)

    def views(self, td) -> bool:
        """Whether ``td`` (the TensorDict this layout was read from) still holds, key for key,
        the tensors this layout views."""
        stored = td._tensordict
        if stored.keys() != self.keys:
            return False
        for name, leaf in self.leaves.items():
            if stored[name] is not leaf[2]:
                return False
        for name, child in self.children.items():
            sub = stored[name]
            if type(sub) is not TensorDict or not child.views(sub):
                return False
        return True

    def sources(self, td, pairs: list, top: bool = False) -> bool:
        """Append ``(source array, stored view)`` for every leaf of ``td`` (a TensorDict with
        this level's keys: at the top an extra ``"index"`` is ignored, the stored ``"index"``
        left to the caller); False (``pairs`` then partial) where ``td`` does not match."""
        stored = td._tensordict
        keys = stored.keys()
        if top:
            if (keys | {"index"}) != self.keys:
                return False
        elif keys != self.keys:
            return False
        for name, (dst, dtype, _) in self.leaves.items():
            if top and name == "index":
                continue
            src = stored[name]
            if (type(src) is not torch.Tensor or src.dtype != dtype or src.shape[1:] != dst.shape[1:]
                    or src.device.type != "cpu"):
                return False
            # A value computed with grad enabled (a policy's action values outside no_grad):
            # its values are stored, as TorchRL's storage holds them, without the graph.
            pairs.append(((src.detach() if src.requires_grad else src).numpy(), dst))
        for name, child in self.children.items():
            sub = stored[name]
            if type(sub) is not TensorDict or not child.sources(sub, pairs):
                return False
        return True

    def gather(self, rows: np.ndarray, batch_size: torch.Size, device, top: bool = False) -> TensorDict:
        """A new TensorDict of this layout holding the stored rows ``rows`` (fresh tensors:
        one ``take`` per leaf), without TensorDict's checks (the rows come from a storage of
        this structure). With ``top``, ``"index"`` is left to the caller (it has the rows)."""
        source = {}
        leaves, children = self.leaves, self.children
        for name in self.order:
            leaf = leaves.get(name)
            if top and name == "index":
                source[name] = None  # keeps the stored key order; the caller sets it
            elif leaf is not None:
                source[name] = torch.from_numpy(leaf[0].take(rows, axis=0))
            else:
                source[name] = children[name].gather(rows, batch_size, device)
        return TensorDict._new_unsafe(source, batch_size=batch_size, device=device)
