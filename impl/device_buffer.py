"""Prioritized replay held in a torch device's memory: rows and sum tree on the GPU (or the CPU).

:class:`DeviceReplayBuffer` keeps every field as a ``(capacity, *shape)`` tensor on its device
and the priorities in a :class:`~impl.trees.torch_tree.TorchSumTree` there, so that a GPU
learner's batch is drawn, weighted and gathered on the GPU and never crosses the bus: only
the call's random key goes down and one status word comes back. The variant ``torch-kary``
(impl/variants/torch_kary.py) builds it.

What crosses the bus, per call
------------------------------
- ``add(batch)``: the batch's rows (NumPy arrays from the actors) go up, one copy per field;
  priorities, when given, are checked on the host (the checks name the bad entry) and go up.
- ``sample(n)``: one 63-bit key from the caller's generator goes down; one synchronisation
  reads back two numbers (misses, total) after the whole sample is queued. Returned, with
  ``output="device"``: a dict of tensors on the device: every field ``(n, *shape)``,
  ``indices`` (int64 ring slots) and ``weights`` (float32), nothing copied to the host. With
  ``output="host"`` (the registered variant's default, so that it drops into every
  consumer of NumPy batches: the conformance suite, the benchmarks, the CPU learners) the same
  tensors, computed by the same code on the device, are then copied to NumPy arrays, one
  copy each. No priorities key: the contract of every buffer is fields, indices and weights;
  ``buf.tree.leaf_values(indices)`` gives the priorities on the device.
- ``update_priorities(indices, priorities)``: tensors already on the device stay there (the
  checks run there: one synchronisation reads whether any entry is bad and the largest value);
  host arrays are checked on the host and go up.

Draws are the CPU buffers' draws exactly (:mod:`impl.fused_ops`: one key per call,
SplitMix64 of ``key`` and the draw's counter, redraw ``r`` of position ``b`` on counter
``r * n + b``), computed on the device in int64 arithmetic: the same seed gives the same
masses as every other variant, so a float64 tree samples what the float64 CPU trees sample.

Sampling probability, weights, eviction and errors follow
:class:`impl.buffers.PrioritizedReplayBuffer`: ``P(i) = p_i / sum p`` with
``p = (priority + eps) ** alpha``, weights ``(p_i / p_min) ** -beta`` (float64 on the device,
rounded to float32), new rows at the largest ``p`` set so far, FIFO overwrite, bad arguments
refused with an error naming them before anything changes.

Costs: add O(n D K + n row bytes); sample O(B K D + B row bytes) on the device in about
``6 D + 25`` tensor operations plus one per field, and one synchronisation; update
O(n K D). On a GPU those operations are launches, each 10-20 us of the host's time, which
bound the sample at replay sizes: so on a CUDA device a sample into a :meth:`sample_out`
object with ``output="device"`` is captured once as a CUDA graph
(:class:`impl.cuda_graph.GraphedStep`, ``cuda_graph=True``) and then replayed: the key and
``beta`` copied in, one replay, the one synchronisation. The graph runs the eager call's
kernels on the same tensors (the tree's and the rows' are only ever changed in place), so it
samples what the eager call samples. Thread-safety: none (one caller at a time, as the CPU
buffers' writers).
"""

from __future__ import annotations

import numbers

import numpy as np
import torch

from . import machine
from .buffers import check_buffer_params, check_number, check_priorities
from .cuda_graph import GraphedStep
from .fused_ops import MAX_REDRAWS, REBUILD_AFTER
from .storage import STORAGE_LAYOUTS, Storage, parse_schema
from .trees.base import as_indices, as_priorities
from .trees.torch_tree import TorchSumTree, resolve_device
from .working_set import check_prefetch

__all__ = ["DeviceReplayBuffer", "DeviceStorage", "DeviceSampleOut", "OUTPUTS", "uniform01"]

#: What :meth:`DeviceReplayBuffer.sample` returns: tensors on the device, or NumPy arrays.
OUTPUTS = ("device", "host")


def _signed(x: int) -> int:
    return x - (1 << 64) if x >= 1 << 63 else x


# SplitMix64's constants as int64 (torch has no uint64 arithmetic): multiplication and addition
# wrap modulo 2**64 in two's complement exactly as in uint64; right shifts are made logical by
# masking the sign bits the arithmetic shift copies in.
_GAMMA = _signed(0x9E3779B97F4A7C15)
_MIX1 = _signed(0xBF58476D1CE4E5B9)
_MIX2 = _signed(0x94D049BB133111EB)


def _shr(z: torch.Tensor, k: int) -> torch.Tensor:
    return (z >> k) & ((1 << (64 - k)) - 1)


def uniform01(key, counters: torch.Tensor) -> torch.Tensor:
    """Draws ``counters`` (int64 tensor) of stream ``key`` (an int in ``[0, 2**63)``, or a
    0-d int64 tensor on the counters' device holding one) as float64 in ``[0, 1)``, on the
    counters' device: bit for bit :func:`impl.fused_ops.uniform01` (tested). About 15
    elementwise operations."""
    z = (counters + 1) * _GAMMA + key
    z = (z ^ _shr(z, 30)) * _MIX1
    z = (z ^ _shr(z, 27)) * _MIX2
    z = z ^ _shr(z, 31)
    return _shr(z, 11).to(torch.float64) * (1.0 / 9007199254740992.0)


def torch_dtype_of(name: str, dtype: np.dtype) -> torch.dtype:
    """The torch dtype storing field ``name`` of NumPy ``dtype``; ValueError naming the field
    where torch has none that gathers (unsigned integers wider than 8 bits)."""
    if dtype.kind == "u" and dtype.itemsize > 1:
        raise ValueError(f"fields[{name!r}] has dtype {dtype}, which a device buffer cannot store (torch has no "
                         f"gather for unsigned integers wider than 8 bits): use a signed integer type")
    return torch.from_numpy(np.empty(0, dtype)).dtype


class DeviceStorage:
    """One ``(capacity, *shape)`` tensor per field on ``device`` (:attr:`tensors`). Batches are
    checked by :meth:`impl.storage.Storage.check_batch`'s rules (the same function)."""

    layout = "columns"

    def __init__(self, capacity: int, fields, device: torch.device):
        self.capacity = int(capacity)
        self.specs = parse_schema(fields)
        self.device = device
        self._names = frozenset(self.specs)
        self._shapes = {name: s.shape for name, s in self.specs.items()}
        self.torch_dtypes = {name: torch_dtype_of(name, s.dtype) for name, s in self.specs.items()}
        if device.type == "cpu":  # a GPU's allocator raises its own out-of-memory error
            machine.check_memory(self.capacity * sum(s.nbytes for s in self.specs.values()),
                                 f"a device storage of capacity={self.capacity}")
        self.tensors = {name: torch.zeros((self.capacity, *s.shape), dtype=self.torch_dtypes[name], device=device)
                        for name, s in self.specs.items()}

    @property
    def columns(self) -> dict[str, np.ndarray]:
        """Each field as a host array, as :attr:`impl.storage.Storage.columns`: a view of the
        tensor on the CPU, a copy from a GPU (for reading: a write to a copy changes nothing)."""
        return {name: t.cpu().numpy() for name, t in self.tensors.items()}

    check_batch = Storage.check_batch  # reads only specs, _names and _shapes

    @property
    def nbytes(self) -> int:
        return sum(c.numel() * c.element_size() for c in self.tensors.values())

    def write(self, slots: torch.Tensor, arrays: dict, lo: int, n: int) -> None:
        """Rows ``lo .. lo + n - 1`` of checked host ``arrays`` into ring ``slots`` (a device
        tensor of ``n`` slots): one host-to-device copy and one scatter per field."""
        for name, col in self.tensors.items():
            spec = self.specs[name]
            arr = np.ascontiguousarray(arrays[name][lo:lo + n], dtype=spec.dtype)
            col.index_copy_(0, slots, torch.from_numpy(arr).to(self.device))


class DeviceSampleOut(dict):
    """Reusable output of :meth:`DeviceReplayBuffer.sample`: device tensors for each field,
    ``indices`` and ``weights`` (made by :meth:`DeviceReplayBuffer.sample_out`; a sample into
    it overwrites them in place and returns it). ``graph``: the CUDA graph of samples into it
    (a :class:`~impl.cuda_graph.GraphedStep`), or None."""

    __slots__ = ("owner", "batch_size", "fields", "graph")


class DeviceReplayBuffer:
    """Proportional prioritized replay with rows and tree on a torch device (module docstring).

    Parameters
    ----------
    capacity, fields
        Ring size and the ``{name: (shape, dtype)}`` schema (unsigned integers wider than
        8 bits are refused: torch cannot gather them).
    K, dtype, device
        The tree's (:class:`~impl.trees.torch_tree.TorchSumTree`): branching factor, leaf dtype
        ("float32" or "float64"), and the device ("auto": CUDA where torch sees a GPU, else the
        CPU; an unknown or unreachable device is refused, naming it).
    alpha, beta, eps, stratified, seed
        As :class:`impl.buffers.PrioritizedReplayBuffer` (checked by
        :func:`impl.buffers.check_buffer_params`).
    output
        ``"device"``: :meth:`sample` returns tensors on the device; ``"host"``: NumPy arrays
        (the device's tensors copied once each). Anything else is refused, naming it.
    cuda_graph
        On a CUDA device with ``output="device"``: samples into a :meth:`sample_out` object are
        captured as one CUDA graph per object (after 3 eager calls) and replayed (module
        docstring). Without effect elsewhere; :attr:`resolved_params` says whether it applies.
    storage, hugepages, prefetch
        Accepted and checked so that every variant takes the same speed arguments, and
        without effect: device memory is one tensor per field (``"columns"``), with no touch
        passes and no huge pages; :attr:`resolved_params` says so.
    """

    def __init__(self, capacity: int, fields, *, K=32, dtype="float32", device="auto", output="device",
                 cuda_graph=True, alpha=0.6, beta=0.4, eps=1e-6, stratified=False, seed=None, storage="auto",
                 hugepages=False, prefetch="auto"):
        if isinstance(capacity, bool) or not isinstance(capacity, numbers.Integral) or capacity < 1:
            raise ValueError(f"capacity must be a positive integer, got {capacity!r}")
        params = check_buffer_params(alpha=alpha, beta=beta, eps=eps, stratified=stratified)
        if not (isinstance(storage, str) and (storage == "auto" or storage in STORAGE_LAYOUTS)):
            raise ValueError(f"storage must be 'auto' or one of {sorted(STORAGE_LAYOUTS)}, got {storage!r}")
        if not isinstance(hugepages, (bool, np.bool_)):
            raise ValueError(f"hugepages must be True or False, got {hugepages!r}")
        check_prefetch(prefetch)
        if not (isinstance(output, str) and output in OUTPUTS):
            raise ValueError(f"output must be one of {OUTPUTS}, got {output!r}")
        if not isinstance(cuda_graph, (bool, np.bool_)):
            raise ValueError(f"cuda_graph must be True or False, got {cuda_graph!r}")
        device = resolve_device(device)
        try:
            self._rng = np.random.default_rng(seed)
        except (TypeError, ValueError) as err:
            raise ValueError(f"seed must be None, a non-negative integer or a numpy Generator, got {seed!r}: "
                             f"{err}") from None
        self.tree = TorchSumTree(int(capacity), K=K, dtype=dtype, device=device)
        self.storage = DeviceStorage(int(capacity), fields, device)
        self.device = device
        self.output = output
        self.graphed = bool(cuda_graph) and device.type == "cuda" and output == "device"
        # the call's key and -beta, refilled in place each call: what a graph reads them from
        self._key_t = torch.zeros((), dtype=torch.int64, device=device)
        self._neg_beta_t = torch.zeros((), dtype=torch.float64, device=device)
        self.alpha, self.beta, self.eps, self.stratified = (params["alpha"], params["beta"], params["eps"],
                                                            params["stratified"])
        self.max_priority = 1.0  # largest stored p = (priority + eps) ** alpha so far
        self._next = 0
        self._size = 0
        self._counters: dict[int, torch.Tensor] = {}  # batch size -> arange on the device

    # ------------------------------------------------------------------ the buffer contract
    @property
    def capacity(self) -> int:
        return self.storage.capacity

    @property
    def fields(self):
        return self.storage.specs

    @property
    def resolved_params(self) -> dict:
        """What this buffer runs with: one tensor per field (``storage="columns"``), no touch
        passes, the device, and whether samples into :meth:`sample_out` objects are graphed."""
        return {"storage": "columns", "prefetch": False, "device": str(self.device), "output": self.output,
                "cuda_graph": self.graphed}

    def __len__(self) -> int:
        return self._size

    def add(self, batch, priorities=None) -> np.ndarray:
        """Append a batch (dict of host arrays with a leading batch axis); return the ring slots
        (int64 NumPy). New rows get ``priorities`` (checked) or the largest ``p`` so far. A
        batch longer than ``capacity`` keeps its last ``capacity`` rows. Everything is checked
        before anything is written. Cost: one copy per field to the device, O(n K D) tree work."""
        arrays, n = self.storage.check_batch(batch)
        keep = min(n, self.capacity)
        vals = None
        if priorities is not None:
            vals = as_priorities(priorities, n)
            if keep < n:
                check_priorities(np.zeros(n, np.int64), vals, 1)  # every given priority is checked
                vals = vals[n - keep:]
        start = (self._next + n - keep) % self.capacity
        slots = (start + np.arange(keep, dtype=np.int64)) % self.capacity
        if vals is None:
            self.tree.fill(start, keep, self.max_priority)
        else:
            self.max_priority = max(self.max_priority, self.tree.update(slots, vals, eps=self.eps, alpha=self.alpha))
        if keep:
            self.storage.write(torch.from_numpy(slots).to(self.device), arrays, n - keep, keep)
        self._next = (self._next + n) % self.capacity
        self._size = min(self._size + n, self.capacity)
        return slots

    def sample_out(self, batch_size: int, fields: bool = True) -> DeviceSampleOut:
        """Outputs for ``sample(batch_size, out=...)``, reused across calls: tensors on the
        device (``output="device"``) or NumPy arrays (``"host"``); with ``fields=False``
        indices and weights only (no row is gathered). Where samples are graphed
        (``cuda_graph``), the object carries its own graph, captured by its fourth sample."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        if not isinstance(fields, (bool, np.bool_)):
            raise ValueError(f"fields must be True or False, got {fields!r}")
        n = int(batch_size)
        out = DeviceSampleOut()
        if self.output == "device":
            if fields:
                for name, col in self.storage.tensors.items():
                    out[name] = torch.empty((n, *col.shape[1:]), dtype=col.dtype, device=self.device)
            out["indices"] = torch.empty(n, dtype=torch.int64, device=self.device)
            out["weights"] = torch.empty(n, dtype=torch.float32, device=self.device)
        else:
            if fields:
                for name, spec in self.storage.specs.items():
                    out[name] = np.empty((n, *spec.shape), dtype=spec.dtype)
            out["indices"] = np.empty(n, dtype=np.int64)
            out["weights"] = np.empty(n, dtype=np.float32)
        out.owner, out.batch_size, out.fields = self, n, bool(fields)
        out.graph = None
        if self.graphed:
            def queued(inputs):  # the indices, their values and the status: what the caller reads
                idx, prio, _, status = self._queue(inputs["key"], inputs["neg_beta"], n, out)
                return idx, prio, status

            out.graph = GraphedStep(queued)
        return out

    def sample(self, batch_size: int, beta: float | None = None, rng=None, out=None) -> dict:
        """Draw ``batch_size`` transitions with replacement, ``P(i) = p_i / total``.

        Returns a dict (or ``out``, refilled) of the fields, ``indices`` (int64) and
        ``weights`` (float32, ``(p_i / p_min) ** -beta``): tensors on the device, or NumPy
        arrays with ``output="host"``. ``rng``: a NumPy
        Generator giving the call's key (default the buffer's own). ValueError when nothing is
        stored or every priority is 0; RuntimeError when redraws keep missing (see
        :data:`impl.fused_ops.MAX_REDRAWS`)."""
        beta = self.beta if beta is None else beta
        if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        beta = check_number("beta", beta, 0.0, 1.0)
        if rng is not None and not isinstance(rng, np.random.Generator):
            raise TypeError(f"rng must be a numpy.random.Generator or None, got {rng!r}")
        n = int(batch_size)
        if out is not None and (type(out) is not DeviceSampleOut or out.owner is not self or out.batch_size != n):
            raise ValueError(f"out must come from this buffer's sample_out({n}), got {type(out).__name__}"
                             + (f" for batch_size {out.batch_size}" if type(out) is DeviceSampleOut else ""))
        if self._size == 0:
            raise ValueError("cannot sample from an empty buffer: add transitions first")
        self._key_t.fill_(int((rng or self._rng).bit_generator.random_raw() >> 1))
        self._neg_beta_t.fill_(-beta)
        if n not in self._counters:
            self._counters[n] = torch.arange(n, dtype=torch.int64, device=self.device)
        if out is not None and out.graph is not None:
            idx, prio, status = out.graph({"key": self._key_t, "neg_beta": self._neg_beta_t})
            result = out
        else:
            idx, prio, result, status = self._queue(self._key_t, self._neg_beta_t, n, out)
        misses, total_h = status.tolist()
        if not total_h > 0.0:
            raise ValueError("cannot sample: the total priority is 0 (nothing is sampleable)")
        if misses:
            idx, prio = self._redraw(self._key_t, n, idx, prio)
            result = self._finish(idx, prio, self._neg_beta_t, out)
        return result

    def _queue(self, key_t, neg_beta_t, n, out):
        """One sample of ``n`` up to its synchronisation, queued with no host round trip (so that
        it can be captured): the draws of stream ``key_t``, the descent, the weights with
        exponent ``neg_beta_t`` and the gather into ``out`` (or new tensors). Returns the
        indices, their leaf values, the result and the status tensor ``[misses, total]``
        (float64), which the caller reads; a miss (index -1, only after rounding) is gathered
        at slot 0 and redone by the caller."""
        counters = self._counters[n]
        total = self.tree.total_t.to(torch.float64)
        idx, prio = self.tree.descend(self._masses(key_t, counters, counters, n, total))
        # the weights and the gather are queued before the synchronisation, so the device works
        # while the host waits for the status
        result = self._finish(idx, prio, neg_beta_t, out)
        return idx, prio, result, torch.stack([(idx < 0).sum().to(torch.float64), total])

    def _masses(self, key, counters, positions, n, total):
        v = uniform01(key, counters)
        return (positions + v) * (total / n) if self.stratified else v * total

    def _finish(self, idx, prio, neg_beta_t, out):
        weights = (prio / self.tree.min_t.to(torch.float64)).pow(neg_beta_t).to(torch.float32)
        slots = idx.clamp(min=0)
        if out is None:
            res = {name: col.index_select(0, slots) for name, col in self.storage.tensors.items()}
            res["indices"], res["weights"] = idx, weights
            return res if self.output == "device" else {k: v.cpu().numpy() for k, v in res.items()}
        if self.output == "device":
            if out.fields:
                for name, col in self.storage.tensors.items():
                    torch.index_select(col, 0, slots, out=out[name])
            out["indices"].copy_(idx)
            out["weights"].copy_(weights)
            return out
        if out.fields:
            for name, col in self.storage.tensors.items():
                torch.from_numpy(out[name]).copy_(col.index_select(0, slots))
        torch.from_numpy(out["indices"]).copy_(idx)
        torch.from_numpy(out["weights"]).copy_(weights)
        return out

    def _redraw(self, key_t, n, idx, prio):
        """Redraw the positions that missed, as :func:`impl.fused_ops.redraw` (same counters;
        the tree is re-summed at round :data:`REBUILD_AFTER`), into new tensors (``idx`` and
        ``prio`` may be a graph's outputs). Rare: driven from the host."""
        total = self.tree.total_t.to(torch.float64)
        for attempt in range(MAX_REDRAWS):
            bad = torch.nonzero(idx < 0).squeeze(1)
            if bad.numel() == 0:
                return idx, prio
            if attempt == REBUILD_AFTER:
                self.tree.rebuild()
                total = self.tree.total_t.to(torch.float64)
            j, p = self.tree.descend(self._masses(key_t, (attempt + 1) * n + bad, bad, n, total))
            idx, prio = idx.index_put((bad,), j), prio.index_put((bad,), p)
        if bool((idx >= 0).all()):
            return idx, prio
        raise RuntimeError(f"sampling kept landing on zero leaves after {MAX_REDRAWS} redraws; the tree's inner "
                           f"sums are inconsistent (total={float(total)!r}); call rebuild()")

    def update_priorities(self, indices, priorities) -> None:
        """Set new raw priorities (e.g. ``|TD error|``) for stored transitions ``indices``.

        Tensors (on the device, as a GPU learner has them) are checked on the device: one
        synchronisation reads whether an entry is bad, and only then are they copied to the
        host to name it. Host arrays are checked on the host. Either way an index outside
        ``0 .. len - 1`` or a NaN, inf, negative or too large priority raises an error naming
        the first bad entry and changes nothing. Repeated indices: the last one wins."""
        if not (isinstance(indices, torch.Tensor) or isinstance(priorities, torch.Tensor)):
            pmax = self.tree.update(indices, priorities, n_valid=self._size, eps=self.eps, alpha=self.alpha)
            self.max_priority = max(self.max_priority, pmax)
            return
        idx, vals = self._device_batch(indices, priorities)
        with torch.no_grad():
            p = (vals + self.eps) ** self.alpha
            bad = (idx < 0) | (idx >= self._size) | ~torch.isfinite(vals) | (vals < 0) | ~(p <= self.tree.max_leaf)
            any_bad, pmax = torch.stack([bad.any().to(torch.float64),
                                         p.max() if p.numel() else p.new_zeros(())]).tolist()
        if any_bad:
            # name the first bad entry with the host checks (they raise)
            self.tree.checked_values(idx.cpu().numpy(), vals.cpu().numpy(), self._size, self.eps, self.alpha)
        self.tree.set_leaves(idx, p)
        self.max_priority = max(self.max_priority, pmax)  # before rounding to the dtype, as the host path

    def _device_batch(self, indices, priorities):
        """``indices`` (int64) and ``priorities`` (float64) as 1-D tensors on the device, or the
        errors of :func:`impl.trees.base.as_indices` / ``as_priorities`` naming them."""
        if isinstance(indices, torch.Tensor):
            if indices.dtype.is_floating_point or indices.dtype.is_complex or indices.dtype == torch.bool:
                raise TypeError(f"indices must be integers, got dtype {indices.dtype}")
            if indices.dim() > 1:
                raise ValueError(f"indices must be 1-D, got shape {tuple(indices.shape)}")
            idx = indices.reshape(-1).to(self.device, torch.int64)
        else:
            idx = torch.from_numpy(as_indices(indices)).to(self.device)
        n = idx.shape[0]
        if isinstance(priorities, torch.Tensor):
            if priorities.dtype.is_complex:
                raise TypeError(f"priorities must be numbers in a real dtype, got dtype {priorities.dtype}")
            vals = priorities.detach().to(self.device, torch.float64)
            if vals.dim() == 0:
                vals = vals.expand(n)
            elif tuple(vals.shape) != (n,):
                raise ValueError(f"priorities must have shape ({n},) to match indices, got {tuple(vals.shape)}")
        else:
            vals = torch.from_numpy(as_priorities(priorities, n)).to(self.device)
        return idx, vals

    def __repr__(self) -> str:
        return (f"DeviceReplayBuffer(capacity={self.capacity}, K={self.tree.K}, dtype={self.tree.dtype.name!r}, "
                f"device={str(self.device)!r}, size={self._size})")

