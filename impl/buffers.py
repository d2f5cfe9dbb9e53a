"""Replay buffers: transition storage written as a ring, plus a sampler.

:class:`PrioritizedReplayBuffer` samples transition ``i`` with probability
``P(i) = p_i / sum_j p_j`` where ``p_i = (priority_i + eps) ** alpha`` (Schaul et al.), kept in
any :class:`~impl.trees.SumTree`; :class:`UniformReplayBuffer` is the baseline.

One compiled call per operation: over an array tree (every registered variant), ``sample``,
``add`` and ``update_priorities`` each check their arguments in Python and then make exactly
one ``nogil`` call (:mod:`impl.fused_ops`, :func:`impl.trees.ops.update`), so threads overlap all
but the checks. ``sample(..., out=buffer.sample_out(batch_size))`` reuses its output arrays:
no allocation in steady state. Random draws come from the caller's generator, one key per
call (:mod:`impl.fused_ops`), so they are reproducible from its seed in any thread.

Thread-safety: ``sample`` calls on one buffer may run concurrently with each other (each with
its own ``out``, or none) as long as nothing writes the buffer meanwhile (the one exception:
a sample whose redraws keep missing rebuilds the tree, which only float32 drift between two
re-sums can cause); ``add`` and ``update_priorities`` need the buffer to themselves. The concurrency policies wrap buffers
and trees for shared use with writers.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from . import fused_ops as fused
from . import working_set
from .storage import Storage, gather_rows, make_storage, parse_schema, write_rows
from .trees import kernels, ops
from .trees.array_trees import ArraySumTree
from .trees.base import SumTree, as_indices, as_priorities, raise_for_status

__all__ = ["ReplayBuffer", "AddStaging", "UniformReplayBuffer", "PrioritizedReplayBuffer", "SampleOut", "check_buffer_params",
           "check_priorities", "check_number", "make_sample_out", "raise_sample_status"]


def check_priorities(idx: np.ndarray, priorities, n_valid: int) -> None:
    """Check a priority update before any state changes: ``idx`` (int64) in ``[0, n_valid)``,
    ``priorities`` finite and >= 0, one per index. The trees' own checks, in NumPy, for
    callers that do not pass through a tree (the shared buffer's protocol writes leaves
    itself); the first bad entry in batch order is reported, as the tree kernels do, with a
    ValueError naming it. Cost: O(batch) vectorised."""
    vals = as_priorities(priorities, idx.shape[0])
    out_of_range = (idx < 0) | (idx >= n_valid)
    bad = np.flatnonzero(out_of_range | ~np.isfinite(vals) | (vals < 0))
    if bad.size:
        b = int(bad[0])
        status = (kernels.STATUS_INDEX if out_of_range[b] else
                  kernels.STATUS_NONFINITE if not np.isfinite(vals[b]) else kernels.STATUS_NEGATIVE)
        raise_for_status(status, b, idx, vals, n_valid, "priorities")


def check_number(name: str, value, low: float, high: float = math.inf) -> float:
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
    return {"alpha": check_number("alpha", alpha, 0.0), "beta": check_number("beta", beta, 0.0, 1.0),
            "eps": check_number("eps", eps, 0.0), "stratified": bool(stratified)}


class SampleOut(dict):
    """Reusable output of ``sample``: the field arrays plus ``indices`` (int64) and ``weights``
    (float32) for ``batch_size`` draws, as a dict, made by :meth:`ReplayBuffer.sample_out`.

    ``sample(batch_size, out=o)`` overwrites the arrays' contents in place and returns ``o``
    itself: no allocation. The arrays live in one block owned by ``o``; replacing a dict entry
    does not redirect the writes (the kernel writes the block). ``o`` belongs to the buffer
    that made it (checked, as is ``batch_size``). Made with ``fields=False`` it holds only
    ``indices`` and ``weights``, and sampling into it gathers no field.
    """

    __slots__ = ("owner", "batch_size", "block", "block_table", "src_table", "index", "weight", "scratch", "tail")


def make_sample_out(out: SampleOut, owner, storage: Storage, n: int, fields: bool = True) -> SampleOut:
    """Fill the empty ``out`` (a :class:`SampleOut` or a subclass) with the output arrays of ``n``
    draws from ``storage`` for buffer ``owner`` (unchecked: the callers check ``n``). One
    allocation per array."""
    out.block, out.block_table, arrays = storage.out_block(n)
    out.src_table = storage.table
    if fields:
        out.update(arrays)
    else:
        out.src_table = out.src_table[:0]  # no field: the gather loop runs over nothing
    out.owner, out.batch_size = owner, n
    out.index = out["indices"] = np.empty(n, dtype=np.int64)
    out.weight = out["weights"] = np.empty(n, dtype=np.float32)
    out.scratch = np.empty(n, dtype=np.float64)
    # the sample kernel's last arguments, made once (:meth:`ReplayBuffer._sample_into`)
    out.tail = (out.src_table, out.block, out.block_table, out.index, out.weight, out.scratch)
    return out


class AddStaging:
    """Preallocated rows for :meth:`ReplayBuffer.add_staged` (made by :meth:`ReplayBuffer.add_staging`):
    ``arrays`` (``{field: (n, *shape) array}``, written in place by the caller), ``rows`` (their
    bytes, as the write kernel takes them), ``n`` and the ``owner`` buffer."""

    __slots__ = ("owner", "n", "arrays", "rows")

    def __init__(self, owner, n: int, arrays: dict, rows: tuple):
        self.owner, self.n, self.arrays, self.rows = owner, n, arrays, rows


class ReplayBuffer:
    """Ring-buffer writes over a :class:`~impl.storage.Storage`; subclasses decide how to sample.

    ``add`` overwrites the oldest transitions once ``capacity`` is reached (FIFO eviction).
    ``storage``: ``"columns"`` (one array per field) or ``"rows"`` (each transition's fields
    contiguous); ``hugepages``: put the storage (and the tree) on transparent huge pages;
    ``prefetch``: let the tree's descent touch the levels that leave cache first (no effect
    without a tree). The three change speed only, never a result.
    ``storage="auto"`` and ``prefetch="auto"`` (the defaults) choose from the working set: the
    storage's bytes plus ``extra_nbytes`` (what the sampler keeps beside it: the tree) against
    the machine's private cache (:mod:`impl.working_set`); :attr:`resolved_params` says what
    was chosen. Bad arguments raise ValueError naming them before anything is allocated.
    """

    def __init__(self, capacity: int, fields, *, seed=None, storage="auto", hugepages=False, prefetch="auto",
                 extra_nbytes: int = 0):
        if isinstance(capacity, bool) or not isinstance(capacity, numbers.Integral) or capacity < 1:
            raise ValueError(f"capacity must be a positive integer, got {capacity!r}")
        prefetch = working_set.check_prefetch(prefetch)
        specs = parse_schema(fields)
        layout = working_set.choose_storage(storage, int(capacity), [s.nbytes for s in specs.values()])
        self.storage: Storage = make_storage(layout, int(capacity), fields, hugepages=hugepages)
        self.prefetch = working_set.choose_prefetch(prefetch, extra_nbytes + self.storage.arena.nbytes)
        self._auto = {"storage": isinstance(storage, str) and storage == working_set.AUTO,
                      "prefetch": prefetch == working_set.AUTO}
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
    def resolved_params(self) -> dict:
        """The speed parameters this buffer runs with, ``"auto"`` resolved: ``{"storage": "rows"
        or "columns", "prefetch": bool}``, plus ``"kernel"`` where the tree has a choice of
        descent (:class:`~impl.trees.PrefixKarySumTree`): what a result row records beside the
        asked-for parameters (:mod:`bench.scenarios.micro`)."""
        out = {"storage": self.storage.layout, "prefetch": self.prefetch}
        kernel = getattr(getattr(self, "tree", None), "kernel", None)
        if isinstance(kernel, str):
            out["kernel"] = kernel
        return out

    @property
    def fields(self):
        return self.storage.specs

    def __len__(self) -> int:
        return self._size

    def add(self, batch, priorities=None) -> np.ndarray:
        """Append a batch (dict of arrays with a leading batch axis); return the ring slots.

        Cost: O(n * row bytes) copies plus the sampler's per-item work, in one compiled call
        after the checks. Everything is validated before anything is written, so a bad batch
        leaves the buffer unchanged. A batch longer than ``capacity`` keeps only its last
        ``capacity`` rows, as if added one by one.
        """
        plain = self.storage.plain_rows(batch)  # the common form, recognised in one pass
        if plain is not None and plain[1] <= self.capacity:
            rows, n = plain
            return self._slots(self._append(rows, n, n, self._new_priorities(priorities, n, n)), n)
        arrays, n = self.storage.check_batch(batch)
        keep = min(n, self.capacity)
        values = self._new_priorities(priorities, n, keep)
        return self._slots(self._append(self.storage.as_bytes(arrays, n - keep, keep), n, keep, values), keep)

    def _append(self, rows: tuple, n: int, keep: int, values: np.ndarray) -> int:
        """Write the last ``keep`` of ``n`` checked rows (``rows``: their bytes) after the newest
        and move the ring on; returns the first slot written."""
        cap = self.capacity
        start = (self._next + n - keep) % cap
        self._add_rows(start, values, rows, keep)
        self._next = (self._next + n) % cap
        self._size = min(self._size + n, cap)
        return start

    def add_staging(self, n: int) -> AddStaging:
        """Preallocated input for :meth:`add_staged`: ``n`` rows, one writable array per field
        of the schema's shape and dtype (``staging.arrays``), to be filled in place and added
        again and again. For callers that add the same number of rows every call (a
        framework's one row per environment step), without a dict, checks or casts per call."""
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
            raise ValueError(f"n must be a positive integer, got {n!r}")
        arrays = {name: np.zeros((int(n), *spec.shape), spec.dtype) for name, spec in self.storage.specs.items()}
        return AddStaging(self, int(n), arrays, self.storage.as_bytes(arrays, 0, int(n)))

    def add_staged(self, staging: AddStaging) -> int:
        """Add the rows in ``staging.arrays`` (from this buffer's :meth:`add_staging`) as
        :meth:`add` would add them, without priorities (new rows get the default); returns the
        first ring slot written (the others follow it, wrapping at ``capacity``).

        Cost: the compiled write of :meth:`add`, without its per-call checks (the arrays have
        the schema's shapes and dtypes by construction) or allocations: about a third of
        :meth:`add`'s time for one row. ValueError for a staging of another buffer."""
        if type(staging) is not AddStaging or staging.owner is not self:
            raise ValueError(f"staging must come from this buffer's add_staging(n), got {staging!r}")
        n = staging.n
        keep = min(n, self.capacity)
        rows = staging.rows if keep == n else self.storage.as_bytes(staging.arrays, n - keep, keep)
        return self._append(rows, n, keep, _NO_PRIORITIES)

    def _new_priorities(self, priorities, n: int, keep: int) -> np.ndarray:
        """The checked priorities of the ``keep`` rows kept of an ``n``-row batch (an empty
        array for None: new rows then get the buffer's default)."""
        if priorities is None:
            return _NO_PRIORITIES
        vals = as_priorities(priorities, n)
        if keep < n:
            check_priorities(np.zeros(n, np.int64), vals, 1)
            vals = vals[n - keep :]
        return vals

    def _add_rows(self, start: int, values: np.ndarray, rows: tuple, keep: int) -> None:
        raise NotImplementedError

    def sample_out(self, batch_size: int, fields: bool = True) -> SampleOut:
        """Output arrays for ``sample(batch_size, out=...)``, to be reused across calls; with
        ``fields=False`` indices and weights only (the sample then copies no row)."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        if not isinstance(fields, (bool, np.bool_)):
            raise ValueError(f"fields must be True or False, got {fields!r}")
        return make_sample_out(SampleOut(), self, self.storage, int(batch_size), bool(fields))

    def _check_out(self, out, batch_size: int) -> SampleOut:
        if out is None:
            return self.sample_out(batch_size)
        if type(out) is not SampleOut or out.owner is not self or out.batch_size != batch_size:
            raise ValueError(f"out must come from this buffer's sample_out({batch_size}), got "
                             f"{type(out).__name__}" + (f" for batch_size {out.batch_size}"
                                                        if type(out) is SampleOut else ""))
        return out

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
        beta = check_number("beta", beta, 0.0, 1.0)
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

    def _call_sample(self, tree_args, batch_size, beta, rng, out) -> SampleOut:
        """The checks common to every sampler, then the one compiled call."""
        return self._sample_into(tree_args, self._generator(rng), beta, self._check_out(out, batch_size))

    def _fast_sample_ok(self, batch_size, beta, rng, out) -> bool:
        """Whether a ``sample`` call's arguments are the steady state of a training loop, which
        :meth:`_sample_into` may take without the full checks: a plain int ``batch_size``, the
        batch size of ``out`` (this buffer's, from :meth:`sample_out`), a plain float ``beta`` in
        ``[0, 1]`` (NaN fails the compare), ``rng`` None or exactly a Generator, and something
        stored. Anything else goes through the checks, which raise the errors naming the
        argument; the two paths make the same compiled call, so they give the same results."""
        return (type(out) is SampleOut and out.owner is self and type(batch_size) is int
                and out.batch_size == batch_size and type(beta) is float and 0.0 <= beta <= 1.0
                and (rng is None or type(rng) is np.random.Generator) and self._size > 0)

    def _sample_into(self, tree_args, rng: np.random.Generator, beta: float, out: SampleOut) -> SampleOut:
        """The one compiled call of a checked sample: one key from ``rng``, then
        :func:`impl.fused_ops.sample` into ``out``."""
        status = fused.sample(*tree_args, self._size, (rng or self._rng).bit_generator.random_raw() >> 1,
                              self.stratified, beta, self.storage.arena, *out.tail)
        if status != fused.STATUS_OK:
            raise_sample_status(status, tree_args)
        return out


_NO_PRIORITIES = np.empty(0, dtype=np.float64)


def raise_sample_status(status: int, tree_args) -> None:
    """Raise the error a compiled sample's ``status`` (not ``STATUS_OK``) stands for: ValueError
    for a tree without mass, RuntimeError when redraws kept missing (``tree_args``: the tree's
    kernel arguments, to name its total)."""
    if status == fused.STATUS_NO_MASS:
        raise ValueError("cannot sample: the total priority is 0 (nothing is sampleable)")
    total = float(tree_args[1][tree_args[3][0, 0]])
    raise RuntimeError(f"sampling kept landing on zero leaves after {fused.MAX_REDRAWS} redraws; the tree's "
                       f"inner sums are inconsistent (total={total!r}); call rebuild()")


class UniformReplayBuffer(ReplayBuffer):
    """Uniform sampling with replacement over the stored transitions; weights are all 1.

    Cost: sample O(batch * row bytes); add O(n * row bytes).
    """

    stratified = False
    _TREE_ARGS = fused.uniform_tree_args()

    def _new_priorities(self, priorities, n, keep):
        if priorities is not None:
            check_priorities(np.zeros(n, np.int64), priorities, 1)
        return _NO_PRIORITIES

    def _add_rows(self, start, values, rows, keep):
        st = self.storage
        fused.add(*self._TREE_ARGS, self.capacity, start, 1.0, values, 0.0, 1.0, 1.0, st.arena, st.table, rows, keep)

    def sample(self, batch_size: int, beta: float = 0.4, rng=None, out=None) -> dict[str, np.ndarray]:
        """Draw ``batch_size`` stored transitions uniformly with replacement; ``weights`` are 1.
        ``out``: reused output arrays from :meth:`sample_out` (returned, refilled)."""
        if self._fast_sample_ok(batch_size, beta, rng, out):
            return self._sample_into(self._TREE_ARGS, rng, 0.0, out)
        batch_size, _ = self._check_sample_args(batch_size, beta)
        return self._call_sample(self._TREE_ARGS, batch_size, 0.0, rng, out)

    def _sample_into(self, tree_args, rng, beta, out):
        # The uniform kernel: the same draws as fused.sample's UNIFORM branch, without the
        # stand-in tree's arguments (each costs numba's dispatch an unboxing under the GIL).
        fused.sample_uniform(self._size, (rng or self._rng).bit_generator.random_raw() >> 1, self.storage.arena,
                             *out.tail)
        return out

    def update_priorities(self, indices, priorities) -> None:
        """Validates like the prioritized buffer, then ignores the priorities."""
        check_priorities(as_indices(indices), priorities, self._size)



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
                 stratified=False, seed=None, storage="auto", hugepages=False, prefetch="auto"):
        params = check_buffer_params(alpha=alpha, beta=beta, eps=eps, stratified=stratified)
        if (not isinstance(tree, SumTree) or isinstance(capacity, numbers.Integral)
                and not isinstance(capacity, bool) and tree.capacity < capacity):
            raise ValueError(f"tree must be a SumTree with capacity >= {capacity!r}, got {tree!r}")
        # The tree's arrays are part of the working set that prefetch="auto" weighs.
        super().__init__(capacity, fields, seed=seed, storage=storage, hugepages=hugepages, prefetch=prefetch,
                         extra_nbytes=getattr(tree, "nbytes", 0))
        self.tree = tree
        if self._auto["prefetch"] and isinstance(tree, ArraySumTree):
            tree.prefetch = self.prefetch  # "auto" decides for the tree's touch pass too
        # Array trees run each operation as one compiled call; any other SumTree (a plug-in, the
        # reference tree) is driven through its Python methods, with the same results contract.
        self._fused = isinstance(tree, ArraySumTree)
        self.alpha, self.beta, self.eps, self.stratified = (params["alpha"], params["beta"], params["eps"],
                                                            params["stratified"])
        self.max_priority = 1.0  # largest stored p = (priority + eps) ** alpha so far

    def _add_rows(self, start, values, rows, keep):
        if not self._fused:
            if values.shape[0] == 0:
                self.tree.fill(start, keep, self.max_priority)
            else:
                self.max_priority = max(self.max_priority, self.tree.update(self._slots(start, keep), values,
                                                                            eps=self.eps, alpha=self.alpha))
            write_rows(self.storage.arena, self.storage.table, start, self.capacity, rows, keep)
            return
        tree, st = self.tree, self.storage
        status, pos, pmax = fused.add(*tree.kernel_args, self.capacity, start, self.max_priority, values, self.eps,
                                      self.alpha, tree.max_leaf, st.arena, st.table, rows, keep)
        if status != kernels.STATUS_OK:
            raise_for_status(status, pos, self._slots(start, keep), values, self.capacity, "priorities",
                             eps=self.eps, alpha=self.alpha, vmax=tree.max_leaf)
        self.max_priority = max(self.max_priority, pmax)

    def sample(self, batch_size: int, beta: float | None = None, rng=None, out=None) -> dict[str, np.ndarray]:
        """Draw ``batch_size`` transitions with replacement, P(i) = p_i / total.

        Returns the field arrays plus ``indices`` (int64 ring slots) and ``weights``
        (float32 importance weights, max-normalised over the whole buffer). ``out``: output
        arrays from :meth:`sample_out`, refilled and returned (no allocation); by default
        fresh ones. Raises ValueError when every priority is 0.
        """
        if beta is None:
            beta = self.beta
        if self._fused and self._fast_sample_ok(batch_size, beta, rng, out):
            return self._sample_into(self.tree.kernel_args, rng, beta, out)
        batch_size, beta = self._check_sample_args(batch_size, beta)
        if self._fused:
            return self._call_sample(self.tree.kernel_args, batch_size, beta, rng, out)
        out = self._check_out(out, batch_size)
        idx, prio = self.tree.sample(batch_size, self._generator(rng), self.stratified)
        out.index[:] = idx
        out.weight[:] = np.power(prio / self.tree.min(), -beta)
        gather_rows(self.storage.arena, out.src_table, idx, out.block, out.block_table, False)
        return out

    def update_priorities(self, indices, priorities) -> None:
        """Set new raw priorities (e.g. ``|TD error|``) for stored transitions ``indices``.

        Invalid input (an index outside ``0 .. len-1``, a NaN, inf or negative priority)
        raises an error naming the first bad entry and changes nothing. One compiled call
        after the conversions (:func:`impl.trees.ops.update`).
        """
        if not self._fused:
            pmax = self.tree.update(indices, priorities, n_valid=self._size, eps=self.eps, alpha=self.alpha)
            self.max_priority = max(self.max_priority, pmax)
            return
        idx = as_indices(indices)
        vals = as_priorities(priorities, idx.shape[0])
        tree = self.tree
        status, pos, pmax = ops.update(*tree.kernel_args, idx, vals, self._size, self.eps, self.alpha, tree.max_leaf)
        if status != kernels.STATUS_OK:
            raise_for_status(status, pos, idx, vals, self._size, "priorities", eps=self.eps, alpha=self.alpha,
                             vmax=tree.max_leaf)
        if pmax > self.max_priority:
            self.max_priority = pmax
