"""A K-ary sum tree of torch tensors, on any torch device: a GPU's memory, or the CPU.

The same code runs on both; the conformance tests run it on the CPU where torch sees no GPU
and on the GPU where it does (tests/test_gpu_tree.py). Not exported from
:mod:`impl.trees` (importing torch costs a second): import this module where it is used.

Layout (K = branching factor, D = ceil(log_K capacity), at least 1)
-------------------------------------------------------------------
Depth ``d`` holds ``m_d = ceil(capacity / K**(D - d))`` real nodes (the root alone at
``d = 0``, ``m_D = capacity`` leaves). Level ``d >= 1`` is stored as ``m_{d-1}`` sibling
groups of ``K`` (the children of each real node of depth ``d - 1``; the slots past ``m_d``
are padding, zero, with no children)::

    values[d]  (m_{d-1} * K,)  node sums in the tree's dtype; the leaves (d = D) hold
                               p = (priority + eps) ** alpha
    excl[d]    (m_{d-1}, K)    running sums in each group, float64, exclusive:
                               excl[d][g, k] = sum(values[d][g*K : g*K + k])
    mins[d]    (m_{d-1} * K,)  the smallest positive leaf under the node (inf where none)

    values[0], mins[0]  (1,)   the root: total and p_min

A parent's value is its group's float64 running sum, rounded once to the dtype, so a
parent is always exactly what a fresh sum of its children gives: no update propagates a
difference, and nothing drifts.

Costs
-----
- :meth:`set_leaves` (an update of ``n`` leaves): per level, the ``n`` touched groups are
  re-summed from their children (a gather, a cumsum and three scatters), so O(n K D) work in
  about ``6 D + 6`` tensor operations whatever ``n`` is (batched, no host round trip). It is
  not the O(N) cumsum of a flat prefix array: a full re-sum is :meth:`rebuild` only.
- :meth:`descend` (``B`` draws): per level one gather of ``B`` rows of ``K`` running sums, a
  count of the sums each draw passes (compare and row sum), a gather and a subtraction: O(B K D)
  work in about ``6 D + 4`` tensor operations (three more per padded level); no host round trip.
- :meth:`rebuild`: O(N). Memory: ``(8 + 2 * itemsize)`` bytes a node (running sums, values,
  minima) over ``N + N/K + ...`` nodes, plus 8 bytes a leaf of scratch; on the CPU it is
  checked against the memory available before anything is allocated.
On a GPU each tensor operation is a kernel launch (a few microseconds), so the costs above are
launch counts more than arithmetic at replay sizes: K = 32 gives D = 4 at 2**20 leaves.

Numeric error
-------------
Every node is recomputed from its children on each update (the running sums in float64), so
errors do not accumulate over updates: each level rounds its sum once to the dtype, and
``|total - exact sum| <= D * unit_roundoff(dtype) * total`` (plus the float64 sums' own
``(K - 1) * D * 2**-53``, negligible); float64 leaves bring the bound to ``D * 2**-53``. Draws
are float64 masses compared with float64 running sums, as the CPU trees do. Rounding can
carry a draw past its group's last positive child (probability of order the bound above):
the descent then ends on a zero or padding leaf and returns ``-1`` there, and the caller
redraws, as with every tree (:meth:`SumTree.find`).

Thread-safety: none (a concurrency policy or the buffer serialises callers). On a CUDA
device every operation is queued on torch's current stream.
"""

from __future__ import annotations

import math
import numbers

import numpy as np
import torch

from .. import machine
from . import kernels
from .array_trees import check_capacity, check_K
from .base import SumTree, as_indices, as_priorities, raise_for_status

__all__ = ["TorchSumTree", "resolve_device", "TORCH_DTYPES"]

#: The leaf dtypes a tree takes, by name.
TORCH_DTYPES = {"float32": torch.float32, "float64": torch.float64}


def resolve_device(device) -> torch.device:
    """The torch device ``device`` names: ``"auto"`` (CUDA where torch sees a GPU, else the CPU),
    ``"cpu"``, ``"cuda"``, ``"cuda:<n>"`` or a :class:`torch.device` of those types.

    Raises ValueError naming ``device`` for anything else, and for a CUDA device that torch
    cannot reach here (none, or index ``n`` past the devices it sees). Cost: one
    ``torch.cuda.is_available()`` for a CUDA name."""
    if isinstance(device, str) and device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not isinstance(device, (str, torch.device)):
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda', 'cuda:<n>' or a torch.device, got {device!r}")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda', 'cuda:<n>' or a torch.device, "
                         f"got {device!r}") from None
    if dev.type == "cpu":
        return torch.device("cpu")
    if dev.type != "cuda":
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda', 'cuda:<n>' or a torch.device, got {device!r}")
    if not torch.cuda.is_available():
        raise ValueError(f"device {device!r} is unavailable: torch {torch.__version__} sees no CUDA device "
                         f"(torch.cuda.is_available() is False)")
    if dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"device {device!r} is unavailable: torch sees {torch.cuda.device_count()} CUDA "
                         f"device(s)")
    return dev


def _check_dtype(dtype) -> torch.dtype:
    """``dtype`` ("float32" or "float64", as a name, a NumPy or a torch dtype) as a torch dtype,
    or a ValueError naming it."""
    names = {torch.float32: "float32", torch.float64: "float64"}
    if isinstance(dtype, torch.dtype):
        name = names.get(dtype)
    else:
        try:
            name = np.dtype(dtype).name
        except TypeError:
            name = None
    if name not in TORCH_DTYPES:
        raise ValueError(f"dtype must be 'float32' or 'float64', got {dtype!r}")
    return TORCH_DTYPES[name]


class TorchSumTree(SumTree):
    """K-ary sum and min tree in torch tensors on ``device`` (module docstring: layout, costs,
    error bound).

    Two interfaces over one state:

    - the :class:`SumTree` contract on NumPy arrays (``update``, ``find``, ``get``, ``total``,
      ``min``, ``rebuild``, ``fill``, ``sample``), checked like every tree's and copied to and
      from the device: what the conformance tests and the host-side callers use;
    - the device interface on tensors already there, unchecked (the caller checks):
      :meth:`set_leaves`, :meth:`descend`, :meth:`leaf_values`, :attr:`total_t`,
      :attr:`min_t`: what :class:`impl.device_buffer.DeviceReplayBuffer` uses, with no
      transfer and no synchronisation.

    Parameters: ``capacity`` (leaves), ``K`` (2 .. 64), ``dtype`` ("float32" or "float64":
    the node values; running sums are float64 either way), ``device`` (:func:`resolve_device`).
    """

    supports_split_updates = False  # no write_leaves/propagate: every update re-sums its groups

    def __init__(self, capacity: int, K: int = 32, dtype="float32", device="auto"):
        self.capacity = check_capacity(capacity)
        self.K = check_K(K)
        self.torch_dtype = _check_dtype(dtype)
        self.dtype = np.dtype(str(self.torch_dtype).removeprefix("torch."))
        self.device = resolve_device(device)
        K, cap = self.K, self.capacity
        D = 1
        while K**D < cap:
            D += 1
        self.depth = D
        # real nodes per depth, and the groups each level is stored in
        self._real = [-(-cap // K ** (D - d)) for d in range(D + 1)]
        dev, vt = self.device, self.torch_dtype
        if dev.type == "cpu":  # a GPU's allocator raises its own out-of-memory error
            nodes = 1 + sum(self._real[d - 1] * K for d in range(1, D + 1))
            machine.check_memory(nodes * (8 + 2 * self.dtype.itemsize) + 8 * cap,
                                 f"a TorchSumTree of capacity={cap} ({nodes} nodes)")
        self._values = [torch.zeros(1, dtype=vt, device=dev)]
        self._mins = [torch.full((1,), math.inf, dtype=vt, device=dev)]
        self._excl = [None]
        for d in range(1, D + 1):
            groups = self._real[d - 1]
            self._values.append(torch.zeros(groups * K, dtype=vt, device=dev))
            self._mins.append(torch.full((groups * K,), math.inf, dtype=vt, device=dev))
            self._excl.append(torch.zeros((groups, K), dtype=torch.float64, device=dev))
        # scratch of set_leaves' last-one-wins rule: the batch position that wrote each leaf
        self._winner = torch.zeros(cap, dtype=torch.int64, device=dev)
        # Largest storable leaf: the sums of ``capacity`` such leaves cannot overflow the dtype.
        self._vmax = float(torch.finfo(vt).max) / (2.0 * cap)

    # ------------------------------------------------------------------ device interface
    @property
    def total_t(self) -> torch.Tensor:
        """The root's sum as a 0-d tensor on the device (no synchronisation)."""
        return self._values[0][0]

    @property
    def min_t(self) -> torch.Tensor:
        """The smallest positive leaf as a 0-d tensor on the device (inf when none)."""
        return self._mins[0][0]

    @property
    def max_leaf(self) -> float:
        """The largest leaf value this tree stores; larger ones are refused by the checks."""
        return self._vmax

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self._values, *self._mins, *self._excl[1:]))

    def set_leaves(self, idx: torch.Tensor, p: torch.Tensor) -> None:
        """Set leaves ``idx`` (int64, on the device, in ``[0, capacity)``) to ``p`` (already
        ``(priority + eps) ** alpha``, finite, >= 0, at most :attr:`max_leaf`), and re-sum
        their groups up to the root. Unchecked. A repeated index takes its last value in
        batch order (the scatter of the batch positions below picks it, so duplicates then
        write one value). O(n K D) in about ``6 D + 6`` operations, none synchronising."""
        n = idx.shape[0]
        if n == 0:
            return
        K = self.K
        p = p.to(self.torch_dtype)
        pos = torch.arange(n, device=self.device)
        winner = self._winner.scatter_reduce_(0, idx, pos, "amax", include_self=False)[idx]
        p = p[winner]
        D = self.depth
        self._values[D].index_copy_(0, idx, p)
        self._mins[D].index_copy_(0, idx, torch.where(p > 0, p, math.inf))
        for d in range(D, 0, -1):
            g = torch.div(idx, K, rounding_mode="floor")
            rows = self._values[d].view(-1, K).index_select(0, g).to(torch.float64)
            run = rows.cumsum(1)
            self._excl[d].index_copy_(0, g, torch.nn.functional.pad(run[:, :-1], (1, 0)))
            self._values[d - 1].index_copy_(0, g, run[:, -1].to(self.torch_dtype))
            self._mins[d - 1].index_copy_(0, g, self._mins[d].view(-1, K).index_select(0, g).amin(1))
            idx = g

    def descend(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """For float64 masses ``u`` (on the device, in ``[0, total)``) the leaves whose running
        sums bracket them, and their values (float64): ``S(i-1) <= u < S(i)``. An entry is
        ``-1`` with value 0 where rounding carried the draw onto a zero or padding leaf (the
        caller redraws it). At each level the child is the number of the group's running sums
        ``<= u`` (the first is 0, so at least one; at most K), as the CPU trees' scan.
        O(B K D) in about ``6 D + 4`` operations (3 more per padded level), none synchronising."""
        node = torch.zeros(u.shape[0], dtype=torch.int64, device=self.device)
        u = u.unsqueeze(1)
        for d in range(1, self.depth + 1):
            rows = self._excl[d].index_select(0, node)
            # the child: how many of the running sums after the first (which is 0) are <= u,
            # a compare and a row sum, one launch more than a batched torch.searchsorted,
            # which on the CPU took 23 ms for 1,000 rows of 32 (2 cores, torch 2.13) against
            # 0.1 ms for these two
            j = (rows[:, 1:] <= u).sum(1, keepdim=True)
            u = u - rows.gather(1, j)
            node = torch.add(j.squeeze(1), node, alpha=self.K)
            if d < self.depth and self._values[d].shape[0] > self._real[d]:
                # Only a draw past its group's mass (rounding, or u = total) reaches a padding
                # node, which has no children: it goes on down the rightmost real path (u = inf
                # takes each group's last child) and ends on the last leaf: 0 (a miss) or the
                # last positive leaf, as the CPU trees' scan. (A level without padding, as
                # every level of 2**20 leaves at K = 32, skips these three operations.)
                past = node >= self._real[d]
                u = u.masked_fill(past.unsqueeze(1), math.inf)
                node = node.clamp_(max=self._real[d] - 1)
        prio = self._values[self.depth].index_select(0, node).to(torch.float64)
        hit = prio > 0  # padding leaves (past capacity) are never written: 0, so missed too
        return torch.where(hit, node, -1), torch.where(hit, prio, 0.0)

    def leaf_values(self, idx: torch.Tensor) -> torch.Tensor:
        """The values of leaves ``idx`` (int64 on the device, unchecked) as float64."""
        return self._values[self.depth].index_select(0, idx).to(torch.float64)

    # ------------------------------------------------------------------ SumTree on NumPy
    def _to(self, arr: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(arr).to(self.device)

    def checked_values(self, idx: np.ndarray, vals: np.ndarray, limit: int, eps: float, alpha: float) -> np.ndarray:
        """``(vals + eps) ** alpha`` for a host batch, after the checks every tree makes (index
        in ``[0, limit)``, finite, >= 0, then the overflow bound), each raising an error that
        names the first bad entry in batch order; nothing is written."""
        out_of_range = (idx < 0) | (idx >= limit)
        bad = np.flatnonzero(out_of_range | ~np.isfinite(vals) | (vals < 0))
        if bad.size:
            b = int(bad[0])
            status = (kernels.STATUS_INDEX if out_of_range[b] else
                      kernels.STATUS_NONFINITE if not np.isfinite(vals[b]) else kernels.STATUS_NEGATIVE)
            raise_for_status(status, b, idx, vals, limit, "priorities")
        with np.errstate(over="ignore"):
            p = (vals + eps) ** alpha
        over = np.flatnonzero(~(p <= self._vmax))
        if over.size:
            raise_for_status(kernels.STATUS_OVERFLOW, int(over[0]), idx, vals, limit, "priorities", eps=eps,
                             alpha=alpha, vmax=self._vmax)
        return p

    def update(self, indices, priorities, *, n_valid=None, eps=0.0, alpha=1.0) -> float:
        idx = as_indices(indices)
        vals = as_priorities(priorities, idx.shape[0])
        limit = self.capacity if n_valid is None else min(int(n_valid), self.capacity)
        p = self.checked_values(idx, vals, limit, float(eps), float(alpha))
        self.set_leaves(self._to(idx), self._to(p))
        return float(p.max()) if p.size else 0.0  # before rounding to the dtype, as the array trees

    def fill(self, start: int, count: int, priority: float) -> None:
        if not (isinstance(priority, numbers.Real) and math.isfinite(priority) and priority >= 0):
            raise ValueError(f"priority = {priority!r} must be finite and >= 0")
        if not 0 <= start < self.capacity or not 0 <= count <= self.capacity:
            raise IndexError(f"fill(start={start}, count={count}) is outside capacity {self.capacity}")
        idx = torch.arange(start, start + count, device=self.device) % self.capacity
        self.set_leaves(idx, torch.full((count,), float(priority), dtype=self.torch_dtype, device=self.device))

    def find(self, us):
        us = np.ascontiguousarray(us, dtype=np.float64)
        idx, prio = self.descend(self._to(us))
        return idx.cpu().numpy(), prio.cpu().numpy()

    def get(self, indices):
        idx = as_indices(indices)
        bad = np.flatnonzero((idx < 0) | (idx >= self.capacity))
        if bad.size:
            raise_for_status(kernels.STATUS_INDEX, int(bad[0]), idx, None, self.capacity, "indices")
        return self.leaf_values(self._to(idx)).cpu().numpy()

    def leaves(self) -> np.ndarray:
        return self._values[self.depth][: self.capacity].to(torch.float64).cpu().numpy()

    def total(self) -> float:
        return float(self.total_t)

    def min(self) -> float:
        return float(self.min_t)

    def rebuild(self) -> None:
        """Re-sum every level from the leaves, O(N). Every update already re-sums what it
        touches, so this changes nothing but the cost; kept for the SumTree contract."""
        K = self.K
        for d in range(self.depth, 0, -1):
            rows = self._values[d].view(-1, K).to(torch.float64)
            run = rows.cumsum(1)
            self._excl[d].copy_(torch.nn.functional.pad(run[:, :-1], (1, 0)))
            groups = rows.shape[0]
            self._values[d - 1][:groups] = run[:, -1].to(self.torch_dtype)
            self._mins[d - 1][:groups] = self._mins[d].view(-1, K).amin(1)

    def __repr__(self) -> str:
        return (f"TorchSumTree(capacity={self.capacity}, K={self.K}, dtype={self.dtype.name!r}, "
                f"device={str(self.device)!r}, depth={self.depth})")
