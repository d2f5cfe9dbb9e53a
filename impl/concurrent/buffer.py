"""A prioritized replay buffer in shared memory, used concurrently by threads and processes.

:class:`SharedPrioritizedBuffer` puts a registered variant's tree and its columnar storage in
one :class:`~impl.concurrent.shm.SharedArena`, next to a control block (locks, ring ticket,
counters, max priority), a per-slot *stamp* array and a per-writer *in-flight* table. How
inserts, samples and updates synchronise is the policy's job (:mod:`impl.concurrent.policies`);
this module holds what every policy shares:

* **Tickets and stamps.** Transition number ``t`` (a ticket, counted over all writers) goes to
  ring slot ``t % capacity``. ``stamps[slot]`` is the ticket whose data the slot holds, or -1
  while it is being written. A sample records the stamps of the slots it drew (under the lock)
  and re-reads them after copying the data out; a changed stamp means a writer got to the
  slot during the copy, so that row is drawn again (a seqlock). No row is ever returned torn.
* **Stale updates.** ``update_priorities(indices, priorities, stamps)`` applies a priority only
  if the slot still holds the sampled transition (same stamp); without ``stamps``, only if the
  slot is not being written. Skipped updates are counted, never applied to a newer transition.
* **Crash recovery.** Each insert records ``(writer token, first ticket, count)`` in the
  in-flight table while it runs. When a lock's holder has died (see :mod:`.locks`), or a writer
  waits on a dead writer's record, the survivor *voids* every dead writer's in-flight slots
  (priority 0, stamp -1: never sampled, overwritten when the ring comes round) and rebuilds the
  tree's inner nodes from its leaves. A dead writer's unfinished transitions are lost; nothing
  it half-wrote is ever sampled, and the tree is exact again.
* **Re-summing.** The count of updates since the last rebuild lives in the control block, so
  the float32 drift bound of :mod:`impl.trees.array_trees` holds across all processes.

Usage::

    buf = SharedPrioritizedBuffer.create(capacity, fields, variant="kary-aligned", policy="lazy-writing")
    # in another process (or thread): child = SharedPrioritizedBuffer.attach(buf.handle)
    slots = buf.add({"obs": ..., ...}); batch = buf.sample(256)
    buf.update_priorities(batch["indices"], td_errors, batch["stamps"])
    buf.close()   # the owner's close also frees the shared memory

Thread-safety: every method may be called from any number of processes. Within one process,
give each thread its own object (``attach(handle)`` again): an object's random generator and
lock statistics are not shared between threads.
"""

from __future__ import annotations

import numbers
import time
from dataclasses import dataclass

import numpy as np
from numba import njit

from .. import registry
from ..buffers import PrioritizedReplayBuffer, _check_priorities
from ..trees.base import as_indices, as_priorities
from .locks import SharedLock, pid_alive, token_pid
from .shm import ArenaSpec, SharedArena

__all__ = ["BufferHandle", "SharedPrioritizedBuffer", "MAX_WRITERS"]

MAX_WRITERS = 64  # inserts in flight at once (one per writer thread or process)
QUEUE_SIZE = 8192  # deferred policy: leaf changes held before the inner nodes catch up
MAX_REDRAWS = 64  # rounds of redrawing rows whose slot changed during a sample's copy

# control block (int64) slots
TREE_LOCK, LEAF_LOCK, TICKET, SINCE_REBUILD, QUEUE_LEN, REBUILDS, RECOVERIES, STALE, REDRAWN, VOIDED = range(10)
COUNTERS = {"rebuilds": REBUILDS, "recoveries": RECOVERIES, "stale_updates": STALE, "redrawn_rows": REDRAWN,
            "voided_slots": VOIDED}
# float control block slots
MAX_PRIORITY, T_MAX = range(2)


@njit(nogil=True, cache=True)
def _reserve_kernel(ctrl, writers, stamps, n, token, capacity, guard_lapping):
    """Ticket reservation (caller holds the tree lock): ``(t0, row, -1)`` on success;
    ``(t0, -1, r)`` when the range would overtake in-flight row ``r``; ``(t0, -1, -1)`` when
    the in-flight table is full. One pass over the table, O(MAX_WRITERS + n)."""
    t0 = ctrl[TICKET]
    free = -1
    oldest = -1
    for r in range(writers.shape[0]):
        if writers[r, 0] == 0:
            if free < 0:
                free = r
        elif oldest < 0 or writers[r, 1] < writers[oldest, 1]:
            oldest = r
    if guard_lapping and oldest >= 0 and t0 + n - capacity > writers[oldest, 1]:
        return t0, -1, oldest
    if free < 0:
        return t0, -1, -1
    writers[free, 1] = t0
    writers[free, 2] = n
    writers[free, 0] = token
    ctrl[TICKET] = t0 + n
    for k in range(n):
        stamps[(t0 + k) % capacity] = -1
    return t0, free, -1


@njit(nogil=True, cache=True)
def _finish_kernel(stamps, writers, row, t0, n, capacity):
    for k in range(n):
        stamps[(t0 + k) % capacity] = t0 + k
    writers[row, 0] = 0


@dataclass(frozen=True)
class BufferHandle:
    """Picklable description of a shared buffer: enough for another process to attach."""

    arena: ArenaSpec
    variant: str
    params: tuple  # sorted (name, value) pairs given to registry.create
    capacity: int
    fields: tuple  # ((name, shape, dtype str), ...)
    policy: str
    resum_every: int


def _schema(fields: tuple) -> dict:
    return {name: (shape, dtype) for name, shape, dtype in fields}


def _local_buffer(variant: str, capacity: int, fields: dict, params: dict) -> PrioritizedReplayBuffer:
    buf = registry.create(variant, capacity, fields, **params)
    tree = getattr(buf, "tree", None)
    if not isinstance(buf, PrioritizedReplayBuffer) or not hasattr(tree, "shared_arrays"):
        raise ValueError(f"variant {variant!r} cannot be shared: it must be a PrioritizedReplayBuffer over a tree "
                         "with shared_arrays()/bind_arrays() (every array tree has them)")
    return buf


class SharedPrioritizedBuffer:
    """Proportional prioritized replay (as :class:`~impl.buffers.PrioritizedReplayBuffer`)
    whose state lives in shared memory; ``policy`` decides the synchronisation.

    Costs are the tree's plus the policy's locking; a sample copies its rows once more only
    when a slot changed during the copy. Memory: the tree, ``capacity`` rows, and 8 bytes of
    stamp per slot, in one shared segment.
    """

    def __init__(self, handle: BufferHandle, arena: SharedArena, local: PrioritizedReplayBuffer, seed=None):
        from .policies import POLICIES

        self.handle = handle
        self._arena = arena
        self.tree = local.tree
        self.storage = local.storage
        self.alpha, self.beta, self.eps, self.stratified = local.alpha, local.beta, local.eps, local.stratified
        a = arena.arrays
        self.tree.bind_arrays({"sums": a["tree.sums"], "mins": a["tree.mins"]})
        self.tree.resum_every = 2**62  # re-summing is counted in the shared control block instead
        self.storage.columns = {name: a["col." + name] for name in self.storage.columns}
        self._ctrl, self._fctrl = a["ctrl"], a["fctrl"]
        self._writers, self._stamps = a["writers"], a["stamps"]
        self._queue_idx, self._queue_delta = a["queue_idx"], a["queue_delta"]
        self.tree_lock = SharedLock(self._ctrl, TREE_LOCK, "tree", on_recover=self._recover)
        self.leaf_lock = SharedLock(self._ctrl, LEAF_LOCK, "leaves")
        self._rng = np.random.default_rng(seed)
        self.policy = POLICIES[handle.policy](self)

    # ------------------------------------------------------------------ construction
    @classmethod
    def create(cls, capacity: int, fields, *, variant: str = "kary-aligned", policy: str = "lazy-writing",
               seed=None, resum_every: int | None = None, **params) -> "SharedPrioritizedBuffer":
        """Allocate a shared buffer of registered ``variant`` (owned by this process).

        ``params`` go to the variant (K, dtype, alpha, beta, eps, stratified). Raises
        ValueError for an unknown policy or a variant that cannot be shared, and
        NotImplementedError when ``policy`` needs split leaf/inner updates the structure
        lacks (pal-locks and deferred on kary-prefix).
        """
        from .policies import POLICIES

        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {sorted(POLICIES)}, got {policy!r}")
        local = _local_buffer(variant, capacity, fields, params)
        if "stamps" in local.storage.specs:
            raise ValueError("field name 'stamps' is reserved for sample() output of shared buffers")
        POLICIES[policy].check_structure(local.tree)
        capacity = local.capacity
        if resum_every is None:
            resum_every = local.tree.resum_every
        if isinstance(resum_every, bool) or not isinstance(resum_every, numbers.Integral) or resum_every < 1:
            raise ValueError(f"resum_every must be a positive integer, got {resum_every!r}")
        tree_arrays = local.tree.shared_arrays()
        layout = {f"tree.{k}": (v.shape, v.dtype) for k, v in tree_arrays.items()}
        layout.update({f"col.{n}": ((capacity, *s.shape), s.dtype) for n, s in local.storage.specs.items()})
        layout.update({"ctrl": ((16,), np.int64), "fctrl": ((4,), np.float64),
                       "writers": ((MAX_WRITERS, 3), np.int64), "stamps": ((capacity,), np.int64),
                       "queue_idx": ((QUEUE_SIZE,), np.int64), "queue_delta": ((QUEUE_SIZE,), np.float64)})
        arena = SharedArena.create(layout, tag=policy.replace("-", ""))
        try:
            for k, v in tree_arrays.items():
                arena.arrays[f"tree.{k}"][...] = v
            arena.arrays["stamps"][:] = -1
            arena.arrays["fctrl"][MAX_PRIORITY] = 1.0
            fields_t = tuple((s.name, s.shape, s.dtype.str) for s in local.storage.specs.values())
            handle = BufferHandle(arena.spec, variant, tuple(sorted(params.items())), capacity, fields_t, policy,
                                  int(resum_every))
            return cls(handle, arena, local, seed)
        except BaseException:
            arena.close()
            raise

    @classmethod
    def attach(cls, handle: BufferHandle, seed=None) -> "SharedPrioritizedBuffer":
        """Map an existing shared buffer (in another process, or for another thread)."""
        if not isinstance(handle, BufferHandle):
            raise TypeError(f"handle must be a BufferHandle, got {type(handle).__name__}")
        arena = SharedArena.attach(handle.arena)
        try:
            local = _local_buffer(handle.variant, handle.capacity, _schema(handle.fields), dict(handle.params))
            return cls(handle, arena, local, seed)
        except BaseException:
            arena.close()
            raise

    def close(self) -> None:
        """Unmap; the owner also frees the segment (other processes then fail to attach)."""
        self.tree = self.storage = None
        self._arena.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # ------------------------------------------------------------------ public API
    @property
    def capacity(self) -> int:
        return self.handle.capacity

    @property
    def owner(self) -> bool:
        return self._arena.owner

    @property
    def inserted(self) -> int:
        """Transitions reserved so far by all writers (tickets handed out)."""
        return int(self._ctrl[TICKET])

    def __len__(self) -> int:
        return min(self.inserted, self.capacity)

    @property
    def max_priority(self) -> float:
        return float(self._fctrl[MAX_PRIORITY])

    @property
    def lock_wait_seconds(self) -> float:
        """Seconds this object's callers spent waiting for the buffer's locks."""
        return self.tree_lock.wait_seconds + self.leaf_lock.wait_seconds

    def counters(self) -> dict:
        """Buffer-wide event counts (all processes): rebuilds, recoveries, stale updates
        skipped, rows redrawn because their slot changed during a copy, slots voided."""
        return {name: int(self._ctrl[i]) for name, i in COUNTERS.items()}

    def add(self, batch, priorities=None) -> np.ndarray:
        """Append a batch; returns its ring slots. New transitions get the max priority
        unless ``priorities`` (raw, transformed like updates) are given. Validation happens
        before anything is reserved, so a bad batch changes nothing."""
        arrays, n = self.storage.check_batch(batch)
        vals = None
        if priorities is not None:
            vals = as_priorities(priorities, n)
            _check_priorities(np.zeros(n, np.int64), vals, 1)
        keep = min(n, self.capacity)
        if keep < n:
            arrays = {k: v[n - keep:] for k, v in arrays.items()}
            vals = None if vals is None else vals[n - keep:]
        if keep == 0:
            return np.empty(0, dtype=np.int64)
        first = self.policy.insert(arrays, keep, vals)
        return (first + np.arange(keep, dtype=np.int64)) % self.capacity

    def sample(self, batch_size: int, beta: float | None = None, rng=None) -> dict[str, np.ndarray]:
        """Draw ``batch_size`` rows, ``P(i) = p_i / total``: the fields plus ``indices``,
        ``weights`` (float32, ``(p_i / p_min) ** -beta``) and ``stamps`` (pass them back to
        :meth:`update_priorities`). Raises ValueError when nothing is sampleable yet."""
        beta = self.beta if beta is None else beta
        if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        if isinstance(beta, bool) or not isinstance(beta, numbers.Real) or not 0.0 <= beta <= 1.0:
            raise ValueError(f"beta must be a number in [0, 1], got {beta!r}")
        if len(self) == 0:
            raise ValueError("cannot sample from an empty buffer: add transitions first")
        rng = self._rng if rng is None else rng
        idx, prio, stamps, pmin, out = self.policy.select(int(batch_size), rng)
        if out is None:  # copied outside the lock: redraw rows whose slot changed meanwhile
            out = self.storage.gather(idx)
            self._redraw_changed(idx, prio, stamps, out, rng)
        out["indices"] = idx
        out["weights"] = np.power(prio / pmin, -float(beta)).astype(np.float32)
        out["stamps"] = stamps
        return out

    def update_priorities(self, indices, priorities, stamps=None) -> int:
        """Set raw priorities of sampled slots; returns how many were applied.

        With ``stamps`` (from :meth:`sample`), a slot whose transition has since been replaced
        is skipped; without, only slots being written are skipped. Invalid input raises an
        error naming the first bad entry and changes nothing.
        """
        idx = as_indices(indices)
        vals = as_priorities(priorities, idx.shape[0])
        _check_priorities(idx, vals, len(self))
        if stamps is not None:
            stamps = np.asarray(stamps)
            if stamps.shape != idx.shape or stamps.dtype.kind not in "iu":
                raise ValueError(f"stamps must be an integer array shaped like indices {idx.shape}, got "
                                 f"{stamps.dtype} {stamps.shape}")
        return self.policy.update(idx, vals, stamps)

    def total(self) -> float:
        """Root total once pending work has reached the inner nodes (deferred drains first)."""
        with self.tree_lock:
            self.policy.flush()
            return self.tree.total()

    def priorities(self, indices) -> np.ndarray:
        """Stored priorities ``(p + eps) ** alpha`` of ``indices`` (float64)."""
        idx = as_indices(indices)
        return self.policy.read_priorities(idx)

    def warm_up(self) -> None:
        """Load (or compile) every kernel this buffer's policy calls, on a small private
        buffer of the same variant, so the first timed operation does not pay for it."""
        from .policies import POLICIES

        h = self.handle
        local = _local_buffer(h.variant, 64, _schema(h.fields), dict(h.params))
        tree, rng = local.tree, np.random.default_rng(0)
        idx = np.arange(8, dtype=np.int64)
        tree.fill(0, 64, 1.0)
        tree.update(idx, np.ones(8))
        tree.sample(8, rng)
        tree.get(idx)
        tree.rebuild()
        if POLICIES[h.policy].splits_updates:
            tree.propagate(*tree.write_leaves(idx, np.ones(8))[:2])
        self.tree_lock.holder()

    # ------------------------------------------------------------------ shared helpers for policies
    def _redraw_changed(self, idx, prio, stamps, out, rng) -> None:
        """Seqlock check: rows whose slot stamp changed while they were copied are redrawn."""
        for _ in range(MAX_REDRAWS):
            changed = np.flatnonzero(self._stamps[idx] != stamps)
            if changed.size == 0:
                return
            self._ctrl[REDRAWN] += changed.size  # statistics only: a lost increment is harmless
            i2, p2, s2, _, sub = self.policy.select(changed.size, rng)
            if sub is None:
                sub = self.storage.gather(i2)
            idx[changed], prio[changed], stamps[changed] = i2, p2, s2
            for name, col in sub.items():
                out[name][changed] = col
        raise RuntimeError(f"sample: rows kept being overwritten during the copy after {MAX_REDRAWS} redraws")

    def _select_locked(self, n: int, rng):
        """Draw under the caller's lock: indices, priorities, their stamps, p_min."""
        idx, prio = self.tree.sample(n, rng, self.stratified)
        return idx, prio, self._stamps[idx], self.tree.min()

    def _reserve(self, n: int, token: int, wait_for_lapped: bool = False):
        """Under the tree lock: take tickets ``t0 .. t0+n-1`` and record them in flight.

        Returns ``(t0, row)``, or None when ``wait_for_lapped`` and the range would overtake a
        slot another live writer is still writing (the caller releases the lock and retries).
        """
        while True:
            t0, row, blocker = _reserve_kernel(self._ctrl, self._writers, self._stamps, n, token, self.capacity,
                                               wait_for_lapped)
            if row >= 0:
                return t0, row
            if blocker >= 0 and pid_alive(token_pid(self._writers[blocker, 0])):
                return None
            if not self._void_dead_writers() and blocker < 0:
                raise RuntimeError(f"more than {MAX_WRITERS} inserts in flight at once")

    def _finish(self, row: int, t0: int, n: int) -> None:
        """Under the tree lock, after the slots' priorities are set: publish the stamps."""
        _finish_kernel(self._stamps, self._writers, row, t0, n, self.capacity)

    def _slots(self, t0: int, n: int) -> np.ndarray:
        s = np.arange(t0, t0 + n, dtype=np.int64)
        s %= self.capacity
        return s

    def _fresh(self, idx, stamps):
        """Under the tree lock: the mask of updates that still target the sampled transition."""
        now = self._stamps[idx]
        keep = now >= 0 if stamps is None else now == stamps
        skipped = idx.shape[0] - int(np.count_nonzero(keep))
        if skipped:
            self._ctrl[STALE] += skipped
        return keep

    def _note_max(self, pmax: float) -> None:
        if pmax > self._fctrl[MAX_PRIORITY]:
            self._fctrl[MAX_PRIORITY] = pmax

    def _count(self, n: int) -> None:
        """Under the tree lock, after ``n`` leaf changes reached the inner nodes: re-sum when
        the drift bound asks for it (same rule as the single-process trees)."""
        since = int(self._ctrl[SINCE_REBUILD]) + n
        self._ctrl[SINCE_REBUILD] = since
        total = self.tree.total()
        t_max = max(float(self._fctrl[T_MAX]), total)
        self._fctrl[T_MAX] = t_max
        r = self.handle.resum_every
        if since >= r or since * t_max > r * total:
            self._rebuild()

    def _rebuild(self) -> None:
        self.tree.rebuild()  # from the leaves, which are always current: queued deltas are void
        self._ctrl[QUEUE_LEN] = 0
        self._ctrl[SINCE_REBUILD] = 0
        self._fctrl[T_MAX] = self.tree.total()
        self._ctrl[REBUILDS] += 1

    def _void_dead_writers(self) -> int:
        """Under the tree lock: void the in-flight slots of writers whose process died."""
        w = self._writers
        voided = 0
        for row in np.flatnonzero(w[:, 0] != 0):
            if pid_alive(token_pid(w[row, 0])):
                continue
            t0, n = int(w[row, 1]), int(w[row, 2])
            self._stamps[self._slots(t0, n)] = -1
            self.tree.fill(t0 % self.capacity, n, 0.0)  # leaves and inner nodes (rebuilt after)
            w[row] = 0
            voided += n
        if voided:
            self._ctrl[VOIDED] += voided
            self._rebuild()
        return voided

    def _recover(self, dead_token: int) -> None:
        """The tree lock's holder died: make the buffer consistent again (we hold the lock)."""
        self._ctrl[RECOVERIES] += 1
        self._void_dead_writers()
        self._rebuild()

    @staticmethod
    def _backoff(attempt: int) -> None:
        time.sleep(min(1e-5 * 2**attempt, 1e-3))
