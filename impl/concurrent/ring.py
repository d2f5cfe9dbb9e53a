"""The shared ring state of a :class:`~impl.concurrent.SharedPrioritizedBuffer`: tickets, stamps,
the in-flight writer table, counters, and the deferred policy's queue, with named operations.

Every policy builds on these operations; none of them locks. The caller holds the tree lock
wherever a docstring says "under the tree lock" (the policies decide when that is).

* **Tickets and stamps.** Transition number ``t`` (a ticket, counted over all writers) goes to
  ring slot ``t % capacity``. ``stamps[slot]`` is the ticket whose data the slot holds, or -1
  while it is being written (or was voided). A sample records the stamps of the slots it drew
  and re-reads them after copying the data out (:meth:`SharedRing.stamps_changed`); a changed
  stamp means a writer got to the slot during the copy, so that row is drawn again (a seqlock).
* **Stale updates.** :meth:`SharedRing.fresh` keeps only the updates whose slot still holds the
  sampled transition (same stamp); without stamps, only slots that are not being written.
* **Crash recovery.** Each insert records ``(writer token, first ticket, count)`` in the
  in-flight table from :meth:`~SharedRing.reserve` to :meth:`~SharedRing.publish`. When a
  lock's holder died, or a writer waits on a dead writer's record, :meth:`~SharedRing.void_dead_writers`
  sets every dead writer's in-flight slots to priority 0 and stamp -1 (never sampled,
  overwritten when the ring comes round) and rebuilds the tree's inner nodes from its leaves.
* **Re-summing.** The count of leaf changes since the last rebuild lives in the control block
  (:meth:`~SharedRing.count`), so the float32 drift bound of :mod:`impl.trees.array_trees`
  holds across all processes.

Memory: 8 bytes of stamp per slot, a fixed control block, writer table and queue.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from ..trees import kernels, ops
from .atomics import atomic_add, atomic_cas, atomic_read, atomic_xchg
from .locks import pid_alive, token_pid

__all__ = ["SharedRing", "Reservation", "ring_arrays", "MAX_WRITERS", "RECORD_WORDS", "MAX_READERS", "READERS_AT",
           "QUEUE_SIZE",
           "TREE_LOCK", "LEAF_LOCK", "reserve_slots", "reserve_unlocked", "release_record", "publish_slots",
           "count_changes", "note_rebuild", "note_max",
           "fresh_mask", "count_redrawn", "tickets", "max_priority", "counters_of", "note_max_atomic", "note_recovery",
           "queue_length", "enqueue_deltas", "drain_queue", "uncount_stale", "note_changes_atomic"]

MAX_WRITERS = 64  # inserts in flight at once (one per writer thread or process)
#: Words of one in-flight record (token, first ticket, count, then padding): a cache line each,
#: so that writers on two cores never write one line (each insert writes its record 5-7 times).
RECORD_WORDS = 8
#: Kernels that may hold the tree lock shared at once (a sample's draw; one more waits for a slot
#: or falls back to the exclusive lock). Their tokens are ctrl words READERS_AT .. READERS_AT +
#: MAX_READERS - 1, on lines of their own past the words below: a writer reads them all after
#: taking the word (impl.concurrent.fused, impl.concurrent.locks.SharedLock's ``readers``).
MAX_READERS = 32
QUEUE_SIZE = 8192  # deferred policy: leaf changes held before the inner nodes catch up

# Control block (int64) words; the two locks live here too (see impl.concurrent.locks). Each word
# that many workers write often has a cache line of its own (8 words), apart from the tree-lock
# word that every shared acquisition reads twice: the ticket (every insert adds to it), the
# changes since the rebuild (every atomic-deltas write adds to it) and the stale and redrawn
# counts; a write to a line invalidates it in every other core, so a counter beside the lock
# word made each acquisition a miss. The leaf lock (another policy's) has its own line too.
TREE_LOCK, _REBUILDS, _RECOVERIES, _VOIDED = 0, 1, 2, 3
LEAF_LOCK, _QUEUE_LEN = 8, 9  # the deferred policy's queue length is written under the leaf lock
_TICKET = 16
_GIVEN_UP = 17  # tickets a lock-free writer took and gave up (lapped): on the ticket's line, written as rarely
_SINCE_REBUILD = 24
_STALE, _REDRAWN = 32, 33
READERS_AT = 40
_COUNTERS = {"rebuilds": _REBUILDS, "recoveries": _RECOVERIES, "stale_updates": _STALE, "redrawn_rows": _REDRAWN,
             "voided_slots": _VOIDED, "given_up_tickets": _GIVEN_UP}
# float control block words
_MAX_PRIORITY, _T_MAX = range(2)


def ring_arrays(capacity: int) -> dict:
    """The shared arrays of a ring of ``capacity`` slots: ``{name: (shape, dtype)}``."""
    return {"ctrl": ((READERS_AT + MAX_READERS,), np.int64), "fctrl": ((4,), np.float64),
            "writers": ((MAX_WRITERS, RECORD_WORDS), np.int64), "stamps": ((capacity,), np.int64),
            "queue_idx": ((QUEUE_SIZE,), np.int64), "queue_delta": ((QUEUE_SIZE,), np.float64)}


class Reservation(NamedTuple):
    """What :meth:`SharedRing.reserve` got: tickets ``first .. first+n-1`` recorded in row
    ``row`` of the in-flight table, or ``row == -1`` and the token of the live writer whose
    slots the range would overtake (``blocker``)."""

    first: int
    row: int
    blocker: int


@njit(nogil=True, cache=True)
def reserve_slots(ctrl, writers, stamps, n, token, capacity, guard_lapping):
    """Under the tree lock: :meth:`SharedRing.reserve`'s one pass. ``(t0, row, -1)`` on
    success; ``(t0, -1, r)`` when the range would overtake in-flight
    row ``r``; ``(t0, -1, -1)`` when the table is full. One pass, O(MAX_WRITERS + n)."""
    t0 = ctrl[_TICKET]
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
    ctrl[_TICKET] = t0 + n
    for k in range(n):
        stamps[(t0 + k) % capacity] = -1
    return t0, free, -1


@njit(nogil=True, cache=True)
def reserve_unlocked(ctrl, writers, stamps, n, token, capacity):
    """:func:`reserve_slots` with no lock, for writers that exclude no one (the atomic-deltas
    policy's): ``(t0, row, -1)`` on success (tickets ``t0 .. t0+n-1`` recorded in ``row``,
    their stamps -1); ``(t0, -1, r)`` when the range would overtake in-flight row ``r`` (the
    tickets from ``t0`` were taken and are given up: their slots keep the rows they hold, the
    caller tries again once ``r`` is gone; they are counted as ``given_up_tickets``, and those
    slots keep rows older than the newest ``capacity`` tickets); ``(-1, -1, -1)`` when no row is
    free (nothing taken).

    A record goes through three states, each store sequentially consistent: claimed (token
    swapped into a free row, count 0: scans ignore it, as its tickets are not taken yet),
    provisional (first ticket at most the one it will get, count -1: scans treat it as in
    flight from there, a recovery voids nothing), and whole (first ticket, count). So a
    writer's lapping check, made after its own tickets were taken, sees every writer whose
    tickets come before its own (one that took its tickets after is ahead, never a lap behind).
    A writer that dies between its ticket and its whole record leaves its tickets unused: their
    slots keep their rows and stamps. O(MAX_WRITERS + n); the one word all writers share is the
    ticket, taken with one atomic add. The search for a free record starts at a row of the
    token's own (``token % MAX_WRITERS``), so that writers in different processes claim
    different records (lines) rather than race for the first."""
    row = -1
    rows = writers.shape[0]
    home = token % rows
    for i in range(rows):
        r = (home + i) % rows
        if atomic_read(writers[r], 0) == 0 and atomic_cas(writers[r], 0, 0, token) == 0:
            row = r
            break
    if row < 0:
        return -1, -1, -1
    rec = writers[row]
    atomic_xchg(rec, 1, atomic_read(ctrl, _TICKET))
    atomic_xchg(rec, 2, -1)
    t0 = atomic_add(ctrl, _TICKET, n)
    atomic_xchg(rec, 1, t0)
    atomic_xchg(rec, 2, n)
    lapped = _lapped_row(writers, row, t0 + n - capacity)
    if lapped >= 0:
        release_record(writers, row, token)
        atomic_add(ctrl, _GIVEN_UP, n)  # counted, so that a check of FIFO order can allow their slots
        return t0, -1, lapped
    for k in range(n):
        stamps[(t0 + k) % capacity] = -1
    return t0, row, -1


@njit(nogil=True, cache=True, inline="always")
def _lapped_row(writers, own, limit):
    """A row other than ``own`` in flight from a ticket before ``limit`` (its slots may be ones a
    range ending a lap after ``limit`` overtakes), or -1. The count is read before the first
    ticket (see :func:`reserve_unlocked`'s states)."""
    for r in range(writers.shape[0]):
        if r == own or atomic_read(writers[r], 0) == 0:
            continue
        if atomic_read(writers[r], 2) != 0 and atomic_read(writers[r], 1) < limit:
            return r
    return -1


@njit(nogil=True, cache=True, inline="always")
def release_record(writers, row, token):
    """Clear in-flight record ``row`` of ``token``: its count first, so a scan that still sees
    the token sees a record that voids nothing, then the token (a compare-and-swap: the record
    is the writer's own)."""
    atomic_xchg(writers[row], 2, 0)
    atomic_cas(writers[row], 0, token, 0)


@njit(nogil=True, cache=True)
def publish_slots(stamps, writers, row, t0, n, capacity):
    """Under the tree lock: :meth:`SharedRing.publish`'s stamps and in-flight record (its count
    cleared before its token, as :func:`release_record` does)."""
    for k in range(n):
        stamps[(t0 + k) % capacity] = t0 + k
    atomic_xchg(writers[row], 2, 0)
    atomic_xchg(writers[row], 0, 0)


@njit(nogil=True, cache=True)
def note_rebuild(ctrl, fctrl, total):
    """Under the tree lock, right after the tree's inner nodes were rebuilt from its leaves:
    queued deltas are void, the re-summing count restarts, the rebuild is counted."""
    ctrl[_QUEUE_LEN] = 0
    ctrl[_SINCE_REBUILD] = 0
    fctrl[_T_MAX] = total
    ctrl[_REBUILDS] += 1


@njit(nogil=True, cache=True)
def count_changes(kind, sums, mins, lay, K, state, ctrl, fctrl, resum_every, n):
    """Under the tree lock, after ``n`` leaf changes reached the inner nodes: the re-summing
    rule of :func:`impl.trees.ops.count_updates` (rebuild after ``resum_every`` changes, or
    once ``since * T_max > resum_every * total``), counted in the shared control block so the
    float32 drift bound holds across all processes. O(1), or O(capacity) when it rebuilds."""
    since = ctrl[_SINCE_REBUILD] + n
    ctrl[_SINCE_REBUILD] = since
    total = np.float64(sums[lay[0, 0]])
    t_max = max(fctrl[_T_MAX], total)
    fctrl[_T_MAX] = t_max
    if since >= resum_every or since * t_max > resum_every * total:
        ops.rebuild(kind, sums, mins, lay, K, state)
        note_rebuild(ctrl, fctrl, np.float64(sums[lay[0, 0]]))


@njit(nogil=True, cache=True, inline="always")
def note_max(fctrl, pmax):
    """Under the tree lock: raise the max priority new rows get to ``pmax`` if larger."""
    if pmax > fctrl[_MAX_PRIORITY]:
        fctrl[_MAX_PRIORITY] = pmax


@njit(nogil=True, cache=True)
def note_max_atomic(fctrl, pmax):
    """:func:`note_max` for writers that do not exclude one another (a sharded policy's, each
    under its own shard's lock): a compare-and-swap loop on the word's bits, which order as the
    values do for the non-negative floats stored there. O(1) unless it races."""
    if not pmax > fctrl[_MAX_PRIORITY]:
        return
    want = np.empty(1)
    want[0] = pmax
    new = want.view(np.int64)[0]
    bits = fctrl.view(np.int64)
    while True:
        seen = atomic_read(bits, _MAX_PRIORITY)
        if new <= seen or atomic_cas(bits, _MAX_PRIORITY, seen, new) == seen:
            return


@njit(nogil=True, cache=True)
def note_changes_atomic(ctrl, fctrl, n, total):
    """:func:`count_changes`'s bookkeeping for writers that do not exclude one another (the
    atomic-deltas policy's, each holding its tree lock *shared*): ``n`` leaf changes added to
    the count since the last rebuild with an atomic add, the largest total since raised to
    ``total`` by a compare-and-swap loop. Returns ``(changes since the last rebuild, largest
    total since)``; the caller decides whether to rebuild (under the lock held exclusively,
    where :func:`note_rebuild` restarts both). O(1) unless it races."""
    since = atomic_add(ctrl, _SINCE_REBUILD, n) + n
    bits = fctrl.view(np.int64)
    word = np.empty(1)  # float <-> bits of the T_max word
    word_bits = word.view(np.int64)
    word[0] = total
    new = word_bits[0]
    while True:
        seen = atomic_read(bits, _T_MAX)
        word_bits[0] = seen
        if not total > word[0]:
            return since, word[0]
        if atomic_cas(bits, _T_MAX, seen, new) == seen:
            return since, total


def note_recovery(ctrl: np.ndarray) -> None:
    """Count one recovery from a dead lock holder in control block ``ctrl``."""
    ctrl[_RECOVERIES] += 1


@njit(nogil=True, cache=True)
def fresh_mask(ctrl, stamps, idx, sampled, use_sampled, keep):
    """Under the tree lock: ``keep[b]`` is whether update ``b`` still targets the sampled
    transition (``stamps[idx[b]] == sampled[b]``; without ``use_sampled``, any slot not being
    written). Skips are counted; returns how many are kept. O(n)."""
    kept = 0
    for b in range(idx.shape[0]):
        now = stamps[idx[b]]
        ok = now == sampled[b] if use_sampled else now >= 0
        keep[b] = ok
        kept += ok
    if kept < idx.shape[0]:
        ctrl[_STALE] += idx.shape[0] - kept
    return kept


@njit(nogil=True, cache=True, inline="always")
def tickets(ctrl):
    """Tickets handed out so far (kernels' :attr:`SharedRing.inserted`)."""
    return ctrl[_TICKET]


@njit(nogil=True, cache=True, inline="always")
def max_priority(fctrl):
    """Kernels' :attr:`SharedRing.max_priority`: what new rows get."""
    return fctrl[_MAX_PRIORITY]


@njit(nogil=True, cache=True, inline="always")
def count_redrawn(ctrl, n):
    """Count ``n`` rows redrawn because their slot changed during a copy (statistics only: a
    lost increment between processes is harmless, so no atomic)."""
    ctrl[_REDRAWN] += n


@njit(nogil=True, cache=True, inline="always")
def uncount_stale(ctrl, n):
    """Under the tree lock: take back ``n`` stale skips :func:`fresh_mask` counted for a call
    that then wrote nothing (the Python path that redoes it counts them again)."""
    ctrl[_STALE] -= n


@njit(nogil=True, cache=True, inline="always")
def queue_length(ctrl):
    """Leaf deltas queued by the deferred policy, not yet in the inner nodes (read under the
    tree lock, shared or exclusive: only an exclusive holder changes it)."""
    return ctrl[_QUEUE_LEN]


@njit(nogil=True, cache=True)
def enqueue_deltas(ctrl, queue_idx, queue_delta, idx, deltas):
    """Under the tree lock: :meth:`SharedRing.enqueue`'s append of leaf deltas; False (and
    nothing appended) when they do not fit in the queue's room. O(n)."""
    q = ctrl[_QUEUE_LEN]
    n = idx.shape[0]
    if q + n > queue_idx.shape[0]:
        return False
    for b in range(n):
        queue_idx[q + b] = idx[b]
        queue_delta[q + b] = deltas[b]
    ctrl[_QUEUE_LEN] = q + n
    return True


@njit(nogil=True, cache=True)
def drain_queue(kind, sums, mins, lay, K, kshift, state, ctrl, fctrl, queue_idx, queue_delta, resum_every):
    """Under the tree lock (exclusive): the deferred policy's flush (:meth:`SharedRing.take_queue`,
    then the tree's ``propagate`` and :meth:`SharedRing.count`): every queued delta added to the
    inner nodes, the queue emptied, the changes counted for re-summing. O(q K D) for q queued."""
    q = ctrl[_QUEUE_LEN]
    ctrl[_QUEUE_LEN] = 0
    if q > 0:
        kernels.propagate_paths(sums, mins, lay, K, kshift, queue_idx[:q], queue_delta[:q])
        count_changes(kind, sums, mins, lay, K, state, ctrl, fctrl, resum_every, q)


def counters_of(ctrl: np.ndarray) -> dict:
    """The event counts of control block ``ctrl`` (a ring's, or one laid out as a ring's, such
    as a sharded policy's per-shard blocks): rebuilds, recoveries, stale updates, redrawn
    rows, voided slots, tickets given up by lapped lock-free writers."""
    return {name: int(ctrl[i]) for name, i in _COUNTERS.items()}


_NO_STAMPS = np.empty(0, dtype=np.int64)


class SharedRing:
    """Tickets, stamps, in-flight writers, counters and the deferred queue of one shared buffer.

    ``arrays`` are the views named by :func:`ring_arrays` (in shared memory); ``tree`` is the
    buffer's tree over the same memory, which the ring rebuilds and voids slots in.
    Thread-safety: the methods that say "under the tree lock" need it held; the others are
    snapshots safe to take at any time.
    """

    def __init__(self, arrays: dict, tree, capacity: int, resum_every: int):
        #: The shared arrays themselves, by :func:`ring_arrays` name (views of shared memory, for
        #: compiled code: the kernel context, measurement loops, tests; valid while mapped).
        self.arrays = dict(arrays)
        self.control = arrays["ctrl"]  # the lock words live here too
        self._fctrl = arrays["fctrl"]
        self._writers, self._stamps = arrays["writers"], arrays["stamps"]
        self._queue_idx, self._queue_delta = arrays["queue_idx"], arrays["queue_delta"]
        self.tree = tree
        self.capacity = int(capacity)
        self.resum_every = int(resum_every)

    @staticmethod
    def initialise(arrays: dict) -> None:
        """Set a fresh (zero-filled) ring's arrays to the empty state: every slot unwritten."""
        arrays["stamps"][:] = -1
        arrays["fctrl"][_MAX_PRIORITY] = 1.0

    # ------------------------------------------------------------------ snapshots
    @property
    def inserted(self) -> int:
        """Tickets handed out so far, by all writers."""
        return int(self.control[_TICKET])

    @property
    def max_priority(self) -> float:
        """Largest stored priority ``(p + eps) ** alpha`` so far (1 initially): new rows get it."""
        return float(self._fctrl[_MAX_PRIORITY])

    def counters(self) -> dict:
        """Buffer-wide event counts: rebuilds, recoveries, stale updates skipped, rows redrawn
        because their slot changed during a copy, slots voided."""
        return counters_of(self.control)

    def stamps_at(self, idx: np.ndarray) -> np.ndarray:
        """Stamps of slots ``idx`` (a copy)."""
        return self._stamps[idx]

    def stamps_snapshot(self) -> np.ndarray:
        """All ``capacity`` stamps (a copy): the ticket each slot holds, -1 if none. O(capacity)."""
        return self._stamps.copy()

    def in_flight(self) -> list[tuple[int, int, int]]:
        """``(writer token, first ticket, count)`` of every insert between reserve and publish."""
        return [tuple(int(x) for x in row[:3]) for row in self._writers[self._writers[:, 0] != 0]]

    def stamps_changed(self, idx: np.ndarray, stamps: np.ndarray) -> np.ndarray:
        """Seqlock check after a copy: positions ``k`` where slot ``idx[k]`` no longer holds
        ticket ``stamps[k]`` (counted as redrawn rows). No lock needed."""
        changed = np.flatnonzero(self._stamps[idx] != stamps)
        if changed.size:
            self.control[_REDRAWN] += changed.size  # statistics only: a lost increment is harmless
        return changed

    def slots(self, first: int, n: int) -> np.ndarray:
        """Ring slots of tickets ``first .. first+n-1``."""
        s = np.arange(first, first + n, dtype=np.int64)
        s %= self.capacity
        return s

    # ------------------------------------------------------------------ under the tree lock
    def reserve(self, n: int, token: int, wait_for_lapped: bool = False) -> Reservation:
        """Under the tree lock: take tickets ``first .. first+n-1``, set their stamps to -1
        and record them in flight for writer ``token``.

        With ``wait_for_lapped``, a range that would overtake a slot another live writer is
        still writing is not taken: the result has ``row == -1`` and that writer's token (the
        caller releases the lock and retries). Dead writers met on the way are voided. Raises
        RuntimeError when :data:`MAX_WRITERS` inserts are in flight. O(MAX_WRITERS + n).
        """
        while True:
            t0, row, blocker = reserve_slots(self.control, self._writers, self._stamps, n, token, self.capacity,
                                               wait_for_lapped)
            if row >= 0:
                return Reservation(int(t0), int(row), 0)
            if blocker >= 0:
                holder = int(self._writers[blocker, 0])
                if pid_alive(token_pid(holder)):
                    return Reservation(int(t0), -1, holder)
            if not self.void_dead_writers() and blocker < 0:
                raise RuntimeError(f"more than {MAX_WRITERS} inserts in flight at once")

    def publish(self, reservation: Reservation, n: int) -> None:
        """Under the tree lock, after the slots' priorities are set: stamp them with their
        tickets (sampleable from now on) and clear the in-flight record."""
        publish_slots(self._stamps, self._writers, reservation.row, reservation.first, n, self.capacity)

    def stamp(self, slots: np.ndarray, tickets: np.ndarray) -> None:
        """Under the lock that guards ``slots``, after their priorities are set: stamp them with
        their ``tickets`` (sampleable from now on), as :meth:`publish` does for a whole batch."""
        self._stamps[slots] = tickets

    def unstamp(self, slots: np.ndarray) -> None:
        """Under the lock that guards ``slots``: mark them unwritten (stamp -1: never sampled,
        updates skip them), as voiding does."""
        self._stamps[slots] = -1

    def fresh(self, idx: np.ndarray, stamps, counts=None) -> np.ndarray:
        """Under the lock that guards the slots ``idx`` (the tree lock, or a shard's): the mask of
        updates that still target the sampled transition (same stamp; without ``stamps``, any
        slot not being written). Skips are counted in ``counts``, the control block of that
        lock (default the ring's own)."""
        keep = np.empty(idx.shape[0], dtype=np.bool_)
        sampled = _NO_STAMPS if stamps is None else np.asarray(stamps, dtype=np.int64)
        fresh_mask(self.control if counts is None else counts, self._stamps, idx, sampled, stamps is not None, keep)
        return keep

    def note_max(self, pmax: float, *, atomic: bool = False) -> None:
        """Raise the max priority new rows get to ``pmax`` if larger: under the tree lock, or with
        ``atomic`` by writers that do not exclude one another (each under a shard's lock)."""
        (note_max_atomic if atomic else note_max)(self._fctrl, float(pmax))

    def count(self, n: int) -> None:
        """Under the tree lock, after ``n`` leaf changes reached the inner nodes: re-sum when
        the drift bound asks for it (the single-process trees' rule, counted for all processes)."""
        t = self.tree.kernel_args
        count_changes(t[0], t[1], t[2], t[3], t[4], t[7], self.control, self._fctrl, self.resum_every, int(n))

    def rebuild(self) -> None:
        """Under the tree lock: recompute the inner nodes from the leaves (always current, so
        queued deltas are void and dropped). O(capacity)."""
        self.tree.rebuild()
        note_rebuild(self.control, self._fctrl, self.tree.total())

    def enqueue(self, idx: np.ndarray, deltas: np.ndarray) -> bool:
        """Under the tree lock: append leaf deltas for a later :meth:`take_queue`; False (and
        nothing appended) when they do not fit in the :data:`QUEUE_SIZE` entries left."""
        q = int(self.control[_QUEUE_LEN])
        if q + idx.size > QUEUE_SIZE:
            return False
        self._queue_idx[q:q + idx.size] = idx
        self._queue_delta[q:q + idx.size] = deltas
        self.control[_QUEUE_LEN] = q + idx.size
        return True

    def take_queue(self) -> tuple[np.ndarray, np.ndarray]:
        """Under the tree lock: the queued ``(leaf indices, deltas)``, emptying the queue. The
        arrays are views of shared memory, valid until the lock is released."""
        q = int(self.control[_QUEUE_LEN])
        self.control[_QUEUE_LEN] = 0
        return self._queue_idx[:q], self._queue_delta[:q]

    def void_dead_writers(self) -> int:
        """Under the tree lock: void the in-flight slots of writers whose process died
        (priority 0, stamp -1) and rebuild the tree if any; returns how many slots."""
        w = self._writers
        voided = 0
        for row in np.flatnonzero(w[:, 0] != 0):
            if pid_alive(token_pid(w[row, 0])):
                continue
            t0, n = int(w[row, 1]), int(w[row, 2])
            if n > 0:  # 0 or -1: a record not whole yet (reserve_unlocked), whose slots were not touched
                self._stamps[self.slots(t0, n)] = -1
                self.tree.fill(t0 % self.capacity, n, 0.0)  # leaves and inner nodes (rebuilt after)
                voided += n
            w[row, 2] = 0  # the count before the token, as release_record: a writer may claim the row at once
            w[row, 1] = 0
            w[row, 0] = 0
        if voided:
            self.control[_VOIDED] += voided
            self.rebuild()
        return voided

    def recover(self, dead_token: int) -> None:
        """The tree lock's holder ``dead_token`` died and we took the lock over: make the ring
        and tree consistent again (the :class:`~impl.concurrent.locks.SharedLock` callback)."""
        self.control[_RECOVERIES] += 1
        self.void_dead_writers()
        self.rebuild()
