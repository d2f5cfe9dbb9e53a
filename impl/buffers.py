"""Replay buffers: columnar storage written as a ring, plus a sampler.

:class:`PrioritizedReplayBuffer` samples transition ``i`` with probability
``P(i) = p_i / sum_j p_j`` where ``p_i = (priority_i + eps) ** alpha`` (Schaul et al.), kept in
any :class:`~impl.trees.SumTree`; :class:`UniformReplayBuffer` is the baseline.

Thread-safety: none. A buffer is used by one thread at a time; the concurrency policies
wrap buffers and trees for shared use.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from .storage import ColumnarStorage
from .trees import kernels
from .trees.base import SumTree, as_indices, as_priorities, raise_for_status

__all__ = ["ReplayBuffer", "UniformReplayBuffer", "PrioritizedReplayBuffer", "check_buffer_params"]


def _check_priorities(idx: np.ndarray, priorities, n_valid: int) -> None:
    """The trees' input checks, in NumPy, for callers that do not pass through a tree:
    the first bad entry in batch order is reported, as the tree kernels do."""
    vals = as_priorities(priorities, idx.shape[0])
    out_of_range = (idx < 0) | (idx >= n_valid)
    bad = np.flatnonzero(out_of_range | ~np.isfinite(vals) | (vals < 0))
    if bad.size:
        b = int(bad[0])
        status = (kernels.STATUS_INDEX if out_of_range[b] else
                  kernels.STATUS_NONFINITE if not np.isfinite(vals[b]) else kernels.STATUS_NEGATIVE)
        raise_for_status(status, b, idx, vals, n_valid, "priorities")


def _check_number(name: str, value, low: float, high: float = math.inf) -> float:
    """``value`` as a float in ``[low, high]``; always finite, even where ``high`` is inf."""
    if (isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value)
            or not low <= value <= high):
        wanted = f"a finite number >= {low}" if high == math.inf else f"a number in [{low}, {high}]"
        raise ValueError(f"{name} must be {wanted}, got {value!r}")
    return float(value)


def check_buffer_params(*, alpha, beta, eps, stratified) -> dict:
    """The sampler parameters of a prioritized buffer, checked; returns them normalised.

    ``alpha`` and ``eps`` must be finite numbers >= 0 (an infinite one would make every
    stored priority ``inf``, ``0`` or ``nan``, so the buffer could take no update), ``beta`` a
    number in ``[0, 1]``, and ``stratified`` a bool (``numpy.bool_`` too): a string such as
    ``"no"`` is refused, not read as True. Finite values too large for a tree are refused
    later, per priority, by the tree (the error names ``eps`` and ``alpha``).

    Returns ``{"alpha": float, "beta": float, "eps": float, "stratified": bool}``; raises
    ValueError naming the first bad argument and its value. Shared by every buffer that
    samples ``(priority + eps) ** alpha`` (the single-process one and the shared-memory one).
    """
    if not isinstance(stratified, (bool, np.bool_)):
        raise ValueError(f"stratified must be True or False, got {stratified!r}")
    return {"alpha": _check_number("alpha", alpha, 0.0), "beta": _check_number("beta", beta, 0.0, 1.0),
            "eps": _check_number("eps", eps, 0.0), "stratified": bool(stratified)}


class ReplayBuffer:
    """Ring-buffer writes over :class:`ColumnarStorage`; subclasses decide how to sample.

    ``add`` overwrites the oldest transitions once ``capacity`` is reached (FIFO eviction).
    """

    def __init__(self, capacity: int, fields, *, seed=None):
        if isinstance(capacity, bool) or not isinstance(capacity, numbers.Integral) or capacity < 1:
            raise ValueError(f"capacity must be a positive integer, got {capacity!r}")
        self.storage = ColumnarStorage(int(capacity), fields)
        try:
            self._rng = np.random.default_rng(seed)
        except (TypeError, ValueError) as err:
            raise ValueError(f"seed must be None, a non-negative integer or a numpy Generator, got {seed!r}: "
                             f"{err}") from None
        self._next = 0  # ring slot the next transition goes to
        self._size = 0

    @property
    def capacity(self) -> int:
        return self.storage.capacity

    @property
    def fields(self):
        return self.storage.specs

    def __len__(self) -> int:
        return self._size

    def add(self, batch, priorities=None) -> np.ndarray:
        """Append a batch (dict of arrays with a leading batch axis); return the ring slots.

        Cost: O(n * row bytes) copies plus the sampler's per-item work. Everything is
        validated before anything is written, so a bad batch leaves the buffer unchanged.
        A batch longer than ``capacity`` keeps only its last ``capacity`` rows, as if added
        one by one.
        """
        arrays, n = self.storage.check_batch(batch)
        cap = self.capacity
        keep = min(n, cap)
        start = (self._next + n - keep) % cap
        if keep < n:
            arrays = {name: arr[n - keep :] for name, arr in arrays.items()}
        self._set_new_priorities(start, keep, priorities, n)
        self.storage.write(start, arrays, keep)
        self._next = (self._next + n) % cap
        self._size = min(self._size + n, cap)
        return self._slots(start, keep)

    def _slots(self, start: int, count: int) -> np.ndarray:
        """Ring slots ``start, start+1, ...`` (``count`` of them), wrapping at capacity."""
        slots = np.arange(start, start + count, dtype=np.int64)
        if start + count > self.capacity:
            slots %= self.capacity
        return slots

    def _check_sample_args(self, batch_size, beta):
        # The common case (plain int and float in range) is checked first: it is on the hot path.
        if type(batch_size) is int and type(beta) is float and batch_size >= 1 and 0.0 <= beta <= 1.0 and self._size:
            return batch_size, beta
        if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        beta = _check_number("beta", beta, 0.0, 1.0)
        if self._size == 0:
            raise ValueError("cannot sample from an empty buffer: add transitions first")
        return int(batch_size), beta

    def _generator(self, rng) -> np.random.Generator:
        """``rng``, or the buffer's own generator when it is None (checked: the name is given)."""
        if rng is None:
            return self._rng
        if not isinstance(rng, np.random.Generator):
            raise TypeError(f"rng must be a numpy.random.Generator or None, got {rng!r}")
        return rng

    def _set_new_priorities(self, start, keep, priorities, n):
        """Give the ``keep`` new slots from ``start`` their priorities (validated first)."""
        raise NotImplementedError


class UniformReplayBuffer(ReplayBuffer):
    """Uniform sampling with replacement over the stored transitions; weights are all 1.

    Cost: sample O(batch * row bytes); add O(n * row bytes).
    """

    def _set_new_priorities(self, start, keep, priorities, n):
        if priorities is not None:
            _check_priorities(np.zeros(n, np.int64), priorities, 1)

    def sample(self, batch_size: int, beta: float = 0.4, rng=None) -> dict[str, np.ndarray]:
        batch_size, _ = self._check_sample_args(batch_size, beta)
        rng = self._generator(rng)
        idx = rng.integers(0, self._size, batch_size, dtype=np.int64)
        out = self.storage.gather(idx)
        out["indices"] = idx
        out["weights"] = np.ones(batch_size, dtype=np.float32)
        return out

    def update_priorities(self, indices, priorities) -> None:
        """Validates like the prioritized buffer, then ignores the priorities."""
        _check_priorities(as_indices(indices), priorities, self._size)



class PrioritizedReplayBuffer(ReplayBuffer):
    """Proportional prioritized replay over any sum tree.

    Parameters
    ----------
    capacity, fields
        Ring size and the ``{name: (shape, dtype)}`` schema.
    tree : SumTree
        Priority structure with at least ``capacity`` leaves (the layout being measured).
    alpha : float
        Priority exponent, finite and >= 0; ``p = (priority + eps) ** alpha`` is what the tree
        stores.
    beta : float
        Default importance-sampling exponent for :meth:`sample`, in ``[0, 1]``.
    eps : float
        Added to every priority so no transition becomes unsampleable by a zero TD error;
        finite and >= 0.
    stratified : bool
        Draw one sample per equal-mass segment (PER paper) instead of independently.
    seed
        Seed of the buffer's own generator (used when :meth:`sample` gets no ``rng``).

    The four sampler parameters are checked by :func:`check_buffer_params`.

    New transitions get the largest stored priority ever set (initially 1), so each is likely
    to be replayed at least once. Importance weights are ``w_i = (N P(i)) ** -beta`` divided
    by their maximum over all stored transitions, i.e. ``(p_i / p_min) ** -beta`` where
    ``p_min`` is the smallest positive stored priority, which the tree keeps in O(1).

    Costs (N = capacity, D = tree depth): add O(n D), sample O(batch K D + batch row bytes),
    update_priorities O(n D). Numeric error: the tree's (see impl.trees.array_trees).
    """

    def __init__(self, capacity: int, fields, tree: SumTree, *, alpha=0.6, beta=0.4, eps=1e-6,
                 stratified=False, seed=None):
        params = check_buffer_params(alpha=alpha, beta=beta, eps=eps, stratified=stratified)
        super().__init__(capacity, fields, seed=seed)
        if not isinstance(tree, SumTree) or tree.capacity < self.capacity:
            raise ValueError(f"tree must be a SumTree with capacity >= {self.capacity}, got {tree!r}")
        self.tree = tree
        self.alpha, self.beta, self.eps, self.stratified = (params["alpha"], params["beta"], params["eps"],
                                                            params["stratified"])
        self.max_priority = 1.0  # largest stored p = (priority + eps) ** alpha so far

    def _set_new_priorities(self, start, keep, priorities, n):
        if priorities is None:
            self.tree.fill(start, keep, self.max_priority)
            return
        vals = as_priorities(priorities, n)
        if keep < n:
            _check_priorities(np.zeros(n, np.int64), vals, 1)
            vals = vals[n - keep :]
        pmax = self.tree.update(self._slots(start, keep), vals, eps=self.eps, alpha=self.alpha)
        self.max_priority = max(self.max_priority, pmax)

    def sample(self, batch_size: int, beta: float | None = None, rng=None) -> dict[str, np.ndarray]:
        """Draw ``batch_size`` transitions with replacement, P(i) = p_i / total.

        Returns the field arrays plus ``indices`` (int64 ring slots) and ``weights``
        (float32 importance weights, max-normalised over the whole buffer).
        """
        batch_size, beta = self._check_sample_args(batch_size, self.beta if beta is None else beta)
        rng = self._generator(rng)
        idx, prio = self.tree.sample(batch_size, rng, self.stratified)
        out = self.storage.gather(idx)
        out["indices"] = idx
        out["weights"] = np.power(prio / self.tree.min(), -beta).astype(np.float32)
        return out

    def update_priorities(self, indices, priorities) -> None:
        """Set new raw priorities (e.g. ``|TD error|``) for stored transitions ``indices``.

        Invalid input (an index outside ``0 .. len-1``, a NaN, inf or negative priority)
        raises an error naming the first bad entry and changes nothing.
        """
        pmax = self.tree.update(indices, priorities, n_valid=self._size, eps=self.eps, alpha=self.alpha)
        self.max_priority = max(self.max_priority, pmax)
