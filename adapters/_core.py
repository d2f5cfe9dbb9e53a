"""What the framework adapters share: the optional-import check and a priority index.

A :class:`PriorityIndex` holds the priorities of a storage that a framework owns (Tianshou's
``Batch``, TorchRL's ``Storage``), slot for slot, in the sum tree of any registered
tree-based variant: new slots get the largest priority stored so far (Schaul et al.), samples
are drawn with probability ``p_i / sum p`` and weighted by ``(p_i / p_min) ** -beta``.
"""

from __future__ import annotations

import importlib
import math
import numbers

import numpy as np
from numba import njit

from replaybench.impl import fused_ops, registry
from replaybench.impl.buffers import check_buffer_params, check_number, raise_sample_status
from replaybench.impl.trees import kernels, ops
from replaybench.impl.trees.array_trees import ArraySumTree
from replaybench.impl.trees.base import SumTree, as_indices, as_priorities, check_real, raise_for_status

__all__ = ["FRAMEWORKS", "availability", "require", "sampler_params", "real_array", "PriorityIndex",
           "NothingToSampleError", "DEFAULT_VARIANT"]

#: Adapter module -> (the framework's import name, its distribution, the extra that installs it).
FRAMEWORKS = {"sb3": ("stable_baselines3", "stable-baselines3", "sb3"),
              "tianshou": ("tianshou", "tianshou", "tianshou"),
              "torchrl": ("torchrl", "torchrl-nightly", "torchrl")}

#: The variant the adapters use unless told otherwise: PAL's cache-aligned K-ary tree.
DEFAULT_VARIANT = "kary-aligned"


def require(adapter: str) -> None:
    """Import ``adapter``'s framework or raise ImportError naming the extra that installs it."""
    module, dist, extra = FRAMEWORKS[adapter]
    try:
        importlib.import_module(module)
    except Exception as err:  # a missing package, or one that fails to load (a C++ extension)
        raise ImportError(f"replaybench.adapters.{adapter} needs {dist}, which did not import "
                          f"({type(err).__name__}: {err}); install it with: pip install 'replaybench[{extra}]'"
                          ) from err


def availability(*adapters: str) -> dict[str, tuple[bool, str]]:
    """Per adapter (all by default): ``(True, "")`` when its framework imports, else
    ``(False, the reason)``. Importing a framework takes seconds (torch extensions)."""
    out = {}
    for adapter in adapters or FRAMEWORKS:
        try:
            require(adapter)
            out[adapter] = (True, "")
        except ImportError as err:
            out[adapter] = (False, str(err))
    return out


class NothingToSampleError(ValueError, RuntimeError):
    """A sample asked of an empty buffer, or of one whose stored priorities are all 0.

    A ValueError, as our own buffers raise for it, and a RuntimeError, as TorchRL's samplers
    raise for it ("Cannot sample from an empty storage", "non-positive p_sum"), so code
    written against either catches it."""


def sampler_params(checked: dict) -> dict:
    """Checked sampler parameters as a variant factory takes them: ``stratified`` only when
    True, since the uniform baseline accepts (and ignores) alpha, beta and eps but not it."""
    return {k: v for k, v in checked.items() if k != "stratified" or v}


def real_array(values, name: str) -> np.ndarray:
    """``values`` (a NumPy array, a sequence, a number, or a torch tensor on any device) as a
    NumPy array of real numbers, or a TypeError naming ``name`` and the first entry that is not
    one (a string, a complex number, None). What the frameworks hand an adapter as priorities
    (TD errors) goes through here before any arithmetic, so a complex TD error is refused
    rather than turned into its modulus by ``abs``. No copy for a CPU tensor or an array.
    """
    if hasattr(values, "detach") and hasattr(values, "cpu"):  # a torch tensor (torch is not imported here)
        values = values.detach().cpu()
        if str(values.dtype) == "torch.bfloat16":  # no NumPy dtype holds it: widen, exactly
            values = values.float()
        values = values.numpy()
    return check_real(np.asarray(values), name)


class PriorityIndex:
    """Priorities for ring slots ``0 .. capacity-1`` of an external storage.

    Parameters
    ----------
    variant : str
        A registered variant that keeps a sum tree (every tree variant; ``"uniform"`` does not).
    capacity : int
        Slots of the storage it indexes.
    alpha, beta, eps, stratified, seed
        As :class:`replaybench.impl.buffers.PrioritizedReplayBuffer` (checked the same way).
    beta_max : float
        The largest ``beta`` taken: 1 (Schaul et al.'s range, and Tianshou's use) or ``inf``
        (TorchRL takes any ``beta >= 0``; an annealing schedule may overshoot 1). Weights
        ``(p_i / p_min) ** -beta`` stay in ``(0, 1]`` for any ``beta >= 0``.
    max_within_buffer : bool
        False (the default): new slots get the largest priority ever stored. True: the
        largest priority stored now, among the slots not being overwritten (1 when there is
        none), as TorchRL's ``max_priority_within_buffer`` means it.
    **params
        The variant's structure parameters (``K=...``, ``dtype=...``).

    Costs: D = tree depth. :meth:`mark_new` and :meth:`update` O(n D), one call into the tree
    each; :meth:`sample` and :meth:`sample_priorities` O(n K D), one descent;
    :meth:`weights` O(n). With ``max_within_buffer``, an update that lowers the slot holding
    the maximum, or a write over it, adds one O(capacity) scan of the leaves (our trees keep
    sums and minima, not maxima). Errors name the argument and value and change nothing.
    """

    def __init__(self, variant: str, capacity: int, *, alpha=0.6, beta=0.4, eps=1e-6, stratified=False,
                 seed=None, beta_max: float = 1.0, max_within_buffer: bool = False, **params):
        if beta_max not in (1.0, math.inf):
            raise ValueError(f"beta_max must be 1.0 or math.inf, got {beta_max!r}")
        self.beta_max = beta_max
        beta = self._checked_beta(beta)
        # The variant's buffer checks beta in [0, 1]; it never uses it (only its tree is kept).
        checked = check_buffer_params(alpha=alpha, beta=min(beta, 1.0), eps=eps, stratified=stratified)
        if not isinstance(variant, str):
            raise ValueError(f"variant must be a registered variant's name, got {variant!r}")
        # The variant's own buffer validates capacity and parameters and builds the tree; a
        # one-byte field keeps its (unused) storage small. Only the tree is kept.
        buf = registry.create(variant, capacity=capacity, fields={"slot": ((), "bool")}, seed=seed,
                              **sampler_params(checked), **params)
        tree = getattr(buf, "tree", None)
        if not isinstance(tree, SumTree):
            raise ValueError(f"variant {variant!r} keeps no priorities (its buffer has no sum tree); the adapters "
                             f"need a prioritized variant, such as {DEFAULT_VARIANT!r}")
        self.variant, self.capacity, self.tree = variant, int(capacity), tree
        # Whether the tree's leaves are read by its compiled ``get`` kernel after the tree's own
        # range check (an array tree that keeps ArraySumTree.get): :meth:`stored` then checks
        # the slots once and calls the kernel itself.
        self._kernel_get = type(tree).get is ArraySumTree.get
        # An array tree is sampled by the buffers' own compiled sample call (the descent, the
        # leaf reads, any redraw and the weights in one call), gathering no field: the kept
        # tables of an output with no fields, over the throw-away buffer's one-byte arena.
        # Any other SumTree (a plug-in) is sampled through its Python methods.
        none = buf.sample_out(1, fields=False) if isinstance(tree, ArraySumTree) else None
        self._no_gather = None if none is None else (buf.storage.arena, none.src_table, none.block, none.block_table)
        self.alpha, self.eps, self.stratified = checked["alpha"], checked["eps"], checked["stratified"]
        self.beta = beta
        self.max_priority = 1.0  # largest stored p = (priority + eps) ** alpha so far (or now: see max_slot)
        self.max_within = bool(max_within_buffer)
        self.max_slot = None  # with max_within: a slot holding max_priority, None when none does
        self.rng = np.random.default_rng(seed)

    def set_beta(self, beta) -> None:
        """Set the default importance-sampling exponent (a number in ``[0, beta_max]``)."""
        self.beta = self._checked_beta(beta)

    def _checked_beta(self, beta) -> float:
        return check_number("beta", beta, 0.0, self.beta_max)

    def reseed(self, key: int) -> None:
        """Put the generator in the state ``key`` names (an integer ``0 <= key < 2**128``): the
        draws that follow depend on ``key`` alone. O(1), a few microseconds, no allocation of
        a new generator: how an adapter follows a framework's generator (one key drawn from
        it per sample)."""
        state = self.rng.bit_generator.state  # PCG64's: {"state": {"state": s, "inc": i}, ...}
        state["state"]["state"] = int(key)
        self.rng.bit_generator.state = state

    def mark_new(self, slots) -> None:
        """Give ``slots`` (just written) the largest priority stored so far (or now, with
        ``max_within_buffer``)."""
        if not self.max_within:
            # One call into the tree, which checks the slots against the capacity (naming the
            # first outside, before any change) and broadcasts the priority.
            self._tree_update(slots, self.max_priority, self.capacity, 0.0, 1.0)
            return
        idx = self.checked_slots(slots)
        if self.max_slot is not None and np.any(idx == self.max_slot):
            # The transition that held the maximum is gone: the maximum is among the others.
            self.tree.update(idx, np.zeros(idx.size), eps=0.0, alpha=1.0)
            self.rescan_max()
        self.tree.update(idx, self.max_priority, eps=0.0, alpha=1.0)
        if idx.size:
            self.max_slot = int(idx[-1])  # the newest holds it: the last of them to be overwritten

    def mark_args(self) -> tuple | None:
        """What a compiled caller passes to :func:`impl.trees.ops.update` to do :meth:`mark_new`
        itself, in the same compiled call that finds the new slots: ``(*tree kernel args,
        priority, capacity, vmax)``, the update then taken with ``eps=0``, ``alpha=1`` (stores
        ``priority`` as it is). None where ``mark_new`` must run as it is (a tree that is not
        an array tree, ``max_within_buffer``). O(1); valid until the next update or mark."""
        if self._no_gather is None or self.max_within:
            return None
        return (*self.tree.kernel_args, float(self.max_priority), self.capacity, self.tree.max_leaf)

    def update(self, slots, priorities, n_valid: int) -> None:
        """Store ``(priorities + eps) ** alpha`` at ``slots`` (each below ``n_valid``)."""
        pmax = self._tree_update(slots, priorities, n_valid, self.eps, self.alpha)
        if not self.max_within:
            self.max_priority = max(self.max_priority, pmax)
            return
        # What the tree stores now (rounded to its float type; the last of repeated slots),
        # so max_priority is a value mark_new can store exactly.
        idx = as_indices(slots)  # checked by the tree's update
        stored = self.tree.get(idx)
        j = int(np.argmax(stored)) if idx.size else 0
        if idx.size and stored[j] >= self.max_priority:
            self.max_priority, self.max_slot = float(stored[j]), int(idx[j])
        elif self.max_slot is not None and np.any(idx == self.max_slot):
            self.rescan_max()

    def update_abs(self, slots, values: np.ndarray, n_valid: int) -> None:
        """:meth:`update` with ``|values|`` as the priorities: ``values`` a NumPy array of real
        numbers (checked by the caller: :func:`real_array`), any shape with one entry per slot.

        Same result and errors as ``update(slots, np.abs(values.reshape(-1), dtype=np.float64),
        n_valid)``, which is what it does unless the common case of a training loop holds: an
        array tree, ``max_within_buffer`` off, 1-D contiguous int64 ``slots`` and a 1-D
        contiguous float32 or float64 ``values`` of the same length. That case is one compiled
        call (:func:`impl.trees.ops.update_abs`: the magnitudes, the check, the tree update),
        no NumPy array made in Python and no Python layer between: O(n D), about half the
        time of the general path when the call is cache-cold (between a network's updates)."""
        if (self._no_gather is not None and not self.max_within and type(slots) is np.ndarray
                and slots.dtype == np.int64 and slots.ndim == 1 and slots.flags.c_contiguous
                and type(values) is np.ndarray and values.dtype.kind == "f" and values.itemsize in (4, 8)
                and values.shape == slots.shape and values.flags.c_contiguous):
            tree = self.tree
            limit = min(int(n_valid), self.capacity)
            status, pos, pmax = ops.update_abs(*tree.kernel_args, slots, values, limit, self.eps, self.alpha,
                                               tree.max_leaf)
            if status != kernels.STATUS_OK:
                raise_for_status(status, pos, slots, np.abs(values, dtype=np.float64), limit, "priorities",
                                 eps=self.eps, alpha=self.alpha, vmax=tree.max_leaf)
            self.max_priority = max(self.max_priority, pmax)
            return
        self.update(slots, np.abs(values.reshape(-1), dtype=np.float64), n_valid)

    def _tree_update(self, slots, priorities, n_valid: int, eps: float, alpha: float) -> float:
        """The tree's ``update`` (checked, nothing written unless every slot and value is
        valid; returns the largest stored value). For an array tree, one compiled call
        (:func:`impl.trees.ops.update`, as our buffers make it) with the conversions skipped
        for what a framework's loop passes: int64 slots and float64 values (or one number)
        already contiguous. A framework calls this twice per training step (new slots, TD
        errors), where the tree method's argument handling is a large part of the call."""
        tree = self.tree
        if self._no_gather is None:
            return tree.update(slots, priorities, n_valid=n_valid, eps=eps, alpha=alpha)
        idx = slots
        if not (type(idx) is np.ndarray and idx.dtype == np.int64 and idx.ndim == 1 and idx.flags.c_contiguous):
            idx = as_indices(idx)
        vals = priorities
        if type(vals) is float:
            vals = np.full(idx.shape[0], vals)
        elif not (type(vals) is np.ndarray and vals.dtype == np.float64 and vals.shape == idx.shape
                  and vals.flags.c_contiguous):
            vals = as_priorities(vals, idx.shape[0])
        limit = min(int(n_valid), self.capacity)
        status, pos, pmax = ops.update(*tree.kernel_args, idx, vals, limit, float(eps), float(alpha), tree.max_leaf)
        if status != kernels.STATUS_OK:
            raise_for_status(status, pos, idx, vals, limit, "priorities", eps=eps, alpha=alpha, vmax=tree.max_leaf)
        return pmax

    def rescan_max(self) -> None:
        """``max_priority`` and ``max_slot`` from the leaves, O(capacity); 1 and None when
        every leaf is 0 (the priority new data gets in an empty storage)."""
        leaves = self.tree.leaves()
        j = int(np.argmax(leaves))
        self.max_priority, self.max_slot = (float(leaves[j]), j) if leaves[j] > 0 else (1.0, None)

    def sample(self, n: int, beta=None, *, n_valid: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``n`` slots drawn with probability ``p_i / total`` and their weights
        ``(p_i / p_min) ** -beta`` (float32: 1 for the smallest stored priority).

        ``n_valid`` (the storage's length, which the framework owns) lets the error for a
        total of 0 say which case it is: nothing stored, or every stored priority 0 (possible
        with ``eps=0`` and zero TD errors)."""
        beta = self.beta if beta is None else self._checked_beta(beta)
        return self._draw(n, beta, n_valid)[:2]

    def sample_priorities(self, n: int, *, n_valid: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``n`` slots drawn as :meth:`sample` draws them, and their stored priorities ``p_i``
        (float64, as :meth:`weights` reads them back): for callers that compute the weights
        in their own float type from the draw itself. Errors as :meth:`sample`."""
        idx, _, prio = self._draw(n, 0.0, n_valid)
        return idx, prio

    def _draw(self, n, beta: float, n_valid) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(slots, float32 weights (p_i / p_min) ** -beta, float64 priorities)`` of ``n``
        draws, fresh arrays the caller owns. With an array tree one compiled call (the
        buffers' sample, gathering no field; its key from this index's generator), else the
        tree's Python ``sample``. Errors as :meth:`sample`."""
        if not (type(n) is int and n >= 1 and n_valid != 0):
            self._check_sample(n, n_valid)  # the common case above skips the checks that name the error
            n = int(n)
        if self._no_gather is None:
            if not self.tree.total() > 0:
                self._check_sample(n, n_valid)
            idx, prio = self.tree.sample(n, self.rng, self.stratified)
            return idx, np.power(prio / self.tree.min(), -beta).astype(np.float32), prio
        idx, weights, prio = np.empty(n, np.int64), np.empty(n, np.float32), np.empty(n, np.float64)
        args = self.tree.kernel_args
        status = fused_ops.sample(*args, self.capacity, self.rng.bit_generator.random_raw() >> 1, self.stratified,
                                  float(beta), *self._no_gather, idx, weights, prio)
        if status != fused_ops.STATUS_OK:
            # A total of 0 is the compiled call's to find (it reads the root before drawing):
            # no Python call to the tree's total per sample. The error names the case.
            if status == fused_ops.STATUS_NO_MASS:
                self._check_sample(n, n_valid)
            raise_sample_status(status, args)
        return idx, weights, prio

    def _check_sample(self, n, n_valid) -> None:
        """Raise the error for a sample that cannot be drawn (see :meth:`sample`), if any."""
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
            raise ValueError(f"batch_size must be a positive integer, got {n!r}")
        if n_valid == 0:
            raise NothingToSampleError(f"cannot sample batch_size={n} from an empty buffer: add transitions first")
        if not self.tree.total() > 0:
            stored = "nothing is stored or all stored" if n_valid is None else f"all {n_valid} stored"
            raise NothingToSampleError(f"cannot sample batch_size={n}: {stored} priorities are 0 (eps={self.eps!r}, "
                                       f"so a zero TD error gives priority 0); set some priority above 0 or use "
                                       f"eps > 0")

    def weights(self, slots, beta=None) -> np.ndarray:
        """``(p_i / p_min) ** -beta`` for ``slots`` (float64, a fresh array); 0-priority slots get
        ``inf``. IndexError as :meth:`checked_slots`. O(n)."""
        beta = self.beta if beta is None else beta
        with np.errstate(divide="ignore"):
            return np.power(self.stored(slots) / self.tree.min(), -beta)

    def stored(self, slots) -> np.ndarray:
        """The stored priorities ``p_i`` at ``slots`` (float64, a fresh array); IndexError as
        :meth:`checked_slots`. O(n): with an array tree one compiled range check and the tree's
        compiled leaf read (the tree's ``get`` would check the range a second time, in NumPy:
        several times the read itself for a batch)."""
        idx = as_indices(slots, "indices")
        if _first_outside(idx, self.capacity) >= 0:
            self.checked_slots(idx)  # raises, naming the first slot outside
        if not self._kernel_get:
            return self.tree.get(idx)
        tree = self.tree
        out = np.empty(idx.shape[0], dtype=np.float64)
        tree.kernels.get(tree._sums, tree._lay, idx, out)
        return out

    def clear(self) -> None:
        """Every slot back to priority 0 and the running maximum to 1 (an emptied storage)."""
        self.tree.fill(0, self.tree.capacity, 0.0)
        self.tree.rebuild()
        self.max_priority, self.max_slot = 1.0, None

    def checked_slots(self, slots) -> np.ndarray:
        """``slots`` as int64 slot numbers, or IndexError naming the first outside ``0 .. capacity - 1``."""
        idx = as_indices(slots, "indices")
        bad = np.flatnonzero((idx < 0) | (idx >= self.capacity))
        if bad.size:
            b = int(bad[0])
            raise IndexError(f"indices[{b}] = {int(idx[b])} is out of range: valid slots are 0 .. {self.capacity - 1}")
        return idx


@njit(cache=True, nogil=True)
def _first_outside(idx, capacity):
    """The first position ``j`` with ``idx[j]`` outside ``0 .. capacity - 1``, or -1. O(n)."""
    for j in range(idx.shape[0]):
        if idx[j] < 0 or idx[j] >= capacity:
            return j
    return -1
