"""One ``nogil`` compiled call per shared-buffer operation: sample, add, update.

The in-process buffer runs each operation as one compiled call (:mod:`impl.fused`); this
module does the same for :class:`~impl.concurrent.buffer.SharedPrioritizedBuffer`, with the
policy's protocol inside the call: the stamps, the tree lock (taken and released in the
kernel), lazy writing's reserve / copy / publish, optimistic's unlocked draw and validation,
then the descent, the gather, the weights, the update. The Python around a call checks
arguments and nothing else, so threads sharing one buffer overlap all but the checks.

Which protocol a policy runs here is data on its class (:class:`impl.concurrent.policy.Policy`:
``fused_sample``, ``fused_insert``, ``fused_update``, ``fused_apply``; None keeps that operation
on the policy's Python methods). Every kernel takes the calling convention of
:mod:`impl.concurrent.context` (the buffer object's context, ``sums``, ``mins``, the caller's
token, the call's own arguments), which reads the protocol codes from the context. The codes:

==================  ============================================================================
``GATHER_LOCKED``   sample: draw and copy the rows under the tree lock (global-lock)
``DRAW_LOCKED``     sample: draw under the tree lock held *shared* (draws run together; tree
                    writers wait), copy outside it, redraw rows whose stamp changed during the
                    copy (lazy-writing, pal-locks)
``OPTIMISTIC``      sample: draw with no lock, validate (no zero leaf, no slot being written,
                    stamps unchanged after the copy); after ``rounds`` failed rounds, the
                    shared-locked draw (optimistic)
``DRAIN_LOCKED``    sample: as DRAW_LOCKED while the queue of deferred leaf deltas is empty;
                    otherwise take the lock exclusively, propagate the queue, draw (deferred)
``LOCKED``          add: reserve, copy, set priorities, publish, all under the lock (global-lock,
                    pal-locks, deferred)
``LAZY``            add: reserve at priority 0 under the lock, copy with no lock, publish under
                    the lock (lazy-writing, optimistic)
update              one locked section: drop stale updates (stamps), change the tree, count
``APPLY_WHOLE``     how add and update change the tree: one whole update of leaves and inner
                    nodes (global-lock, lazy-writing, optimistic)
``APPLY_SPLIT``     leaves under the leaf lock (``ctrl[LEAF_LOCK]``, taken inside the tree lock),
                    released before the deltas climb the inner levels (pal-locks)
``APPLY_QUEUED``    leaves written and their deltas queued for the next sample; a full queue
                    drained first (deferred)
==================  ============================================================================

The lock inside a kernel, and why the rest stays in Python
----------------------------------------------------------
The tree lock is the same shared word as :class:`~impl.concurrent.locks.SharedLock`'s (0 free,
else the holder's token), taken by compare-and-swap. A kernel tries it, then polls it for at
most :data:`LOCK_SPINS` rounds of one acquire load and one ``pause`` or, after
:data:`LOCK_PAUSES` of those, one ``sched_yield`` (about 0.3-1 ms on an idle machine, longer
than any fused critical section at the sizes measured; on a busy one each yield may run
others for longer, which is the point: a holder on this core gets to finish). If the lock is
still held it gives up and returns :data:`STATUS_BUSY` having changed nothing (or, for an
insert past its reservation, :data:`STATUS_PUBLISH_BUSY` with what Python needs to finish
it). Python then runs the policy's own methods, whose :class:`SharedLock` sleeps instead of
spinning, times out naming the holder, and takes over a dead holder's lock with recovery.
Those are rare, slow paths that need the OS (``os.kill``, ``/proc``, sleeping); keeping them
in one place keeps one recovery rule.

The lock held shared
--------------------
A draw writes nothing in the tree or the ring, so DRAW_LOCKED (and optimistic's fallback)
hold the tree lock *shared*: the drawing thread puts its token in one of the reader words
(:data:`~impl.concurrent.ring.MAX_READERS` of them, ``ctrl[READERS_AT:]``) and checks that the
lock word is free; every exclusive holder, here and in :class:`~impl.concurrent.locks.SharedLock`,
takes the word and then waits for the reader words to clear (a full fence on both sides, so
neither misses the other). So two learners' draws overlap and only their updates, inserts and
rebuilds serialise: the lock excludes what it must (a draw never sees a tree mid-write) and no
more. A draw that reaches a zero leaf (float drift) may rebuild the inner sums, a write: it
releases its shared hold and draws again, with the same key, under the exclusive lock. A
process that dies in a draw leaves its token in a reader word; the kernels' writers then give
up after their spins and the Python lock clears the word of a dead process (a draw has
nothing to recover). Shared holds are waited for but not counted as hold time (they are no
serial part of two samplers' work). Every other non-OK status (nothing sampleable, an
insert that would lap a writer still copying, a full writer table, a sample whose rows keep
changing) also hands the whole call to the Python path, which owns the waits and the errors.

What a sample sees while inserts are in flight
---------------------------------------------
The same as the policy's Python protocol (:mod:`impl.concurrent.policy`'s guarantees):

* never a half-written row, nor a slot between reserve and publish: a lazy insert reserves
  its slots at priority 0 and stamp -1 under the lock, so a locked draw never reaches them;
  a row copied outside the lock is returned only if its slot's stamp, read once after the
  copy (behind :func:`~impl.concurrent.atomics.acquire_fence`), still equals the stamp read
  before it (a seqlock: tickets only grow, so an overwrite in between always shows);
* optimistic's unlocked draw uses a reached leaf only if it is > 0 and in the ring and its
  stamp, read once, is >= 0; the probabilities and ``p_min`` of its draw may be off by the
  priority changes in flight (one batch), as in the Python protocol;
* no index read without the lock is used unchecked, and every stamp a decision rests on is
  read once (a value read twice can differ between the reads).

Lock statistics: each kernel counts itself (``KERNEL_CALLS``: what ran compiled, beside the
``FALLBACKS`` that went on to Python) and adds to the caller's ``lockstats`` (float64:
``[wait s, hold s, acquisitions, contended, Python fallbacks, kernel calls]``, then two words of clock
scratch: :data:`LOCKSTATS_SIZE` in all, one array per buffer object) with two monotonic clock reads
per acquisition (:func:`impl.concurrent.atomics.monotonic`, 30-150 ns each), so
``lock_wait_seconds`` and ``lock_hold_seconds`` of the buffer keep meaning what they meant.

Random draws follow :mod:`impl.fused` (one key per call from the caller's generator, SplitMix64
counters): a sample whose rows did not change during the copy returns exactly what
:meth:`impl.buffers.PrioritizedReplayBuffer.sample` returns for the same key and tree.
Redraws of rows that changed use counters past the ones :func:`impl.fused.redraw` uses.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .. import fused_ops as fused
from ..storage import gather_rows, write_rows
from ..trees import kernels, ops
from .atomics import (acquire_fence, atomic_cas, atomic_read, cpu_relax, full_fence, monotonic, process_gone,
                      yield_core)
from .deltas import reject_overshoot
from .locks import PID_SHIFT
from .context import K as K_AT
from .context import (ALPHA, APPLY, ARENA, CAPACITY, CTRL, EPS, FCTRL, INSERT_PROTOCOL, KIND, KSHIFT, LAY, LOCKSTATS as
                      LOCKSTATS_AT, OUT, OUT_INDEX, OUT_STAMP, OUT_TABLE, OUT_WEIGHT, QUEUE_DELTA, QUEUE_IDX, RESUM_EVERY,
                      ROUNDS, SAMPLE_PROTOCOL, SCRATCH, SRC_TABLE, STAMPS, STATE, STRATIFIED, TABLE, TOUCH_FROM,
                      TOUCH_ROWS, VMAX, WRITERS, f64, mat_i64, vec_f32, vec_f64, vec_i64, vec_u8)
from .ring import (LEAF_LOCK, MAX_READERS, READERS_AT, TREE_LOCK, count_changes, count_redrawn, drain_queue,
                   enqueue_deltas, fresh_mask, max_priority, note_max, note_rebuild, publish_slots, queue_length,
                   reserve_slots, tickets, uncount_stale)

__all__ = ["GATHER_LOCKED", "DRAW_LOCKED", "OPTIMISTIC", "DRAIN_LOCKED", "LOCKED", "LAZY", "APPLY_WHOLE",
           "APPLY_SPLIT", "APPLY_QUEUED", "STATUS_LEAF_BUSY", "release_held", "LOCK_SPINS", "LOCK_PAUSES", "STATUS_OK",
           "STATUS_BUSY", "STATUS_HELD", "STATUS_RESERVE", "STATUS_PUBLISH_BUSY", "STATUS_CHANGING", "STATUS_EMPTY",
           "MAX_CHANGED_ROUNDS", "LOCKSTATS", "LOCKSTATS_SIZE", "WAIT_S", "HOLD_S", "ACQUISITIONS", "CONTENDED",
           "KERNEL_CALLS",
           "FALLBACKS", "sample", "add", "update", "acquire", "release", "acquire_shared", "release_shared",
           "dead_holder", "draw_unlocked", "changed_rows", "copy_redrawn"]

GATHER_LOCKED, DRAW_LOCKED, OPTIMISTIC, DRAIN_LOCKED = 0, 1, 2, 3  # sample protocols
LOCKED, LAZY = 0, 1  # insert protocols
APPLY_WHOLE, APPLY_SPLIT, APPLY_QUEUED = 0, 1, 2  # how inserts and updates change the tree (Policy.apply)

#: Polls of a held lock before a kernel hands the call to Python (see the module docstring):
#: the first LOCK_PAUSES after a ``pause`` each (a holder running on another core ends a short
#: section within them), the rest after a ``sched_yield`` each (a holder that shares this core,
#: e.g. on an oversubscribed machine, gets to run instead of being spun against).
LOCK_SPINS = 1024
LOCK_PAUSES = 256

STATUS_OK = 0
STATUS_NO_MASS = fused.STATUS_NO_MASS
STATUS_REDRAWS = fused.STATUS_REDRAWS
STATUS_BUSY = 20  # the lock stayed held for LOCK_SPINS polls; nothing was changed
STATUS_HELD = 21  # the calling thread holds the lock already (a reentrant call); nothing was changed
STATUS_RESERVE = 22  # add: the ring could not be reserved (lapped writer, full table); nothing was changed
STATUS_PUBLISH_BUSY = 23  # add: reserved and copied, but the publishing lock stayed held: Python publishes
STATUS_CHANGING = 24  # sample: rows kept changing during the copy for MAX_CHANGED_ROUNDS rounds
_STATUS_WRITES = 25  # internal: a draw held shared reached a zero leaf; it is redone exclusively
STATUS_EMPTY = 26  # sample: nothing was ever inserted; nothing was done (the caller raises)
STATUS_LEAF_BUSY = 27  # add (APPLY_SPLIT): reserved and copied, the leaf lock stayed held; the tree lock is still held

LOCKSTATS = 6  # statistics in a lockstats array
LOCKSTATS_SIZE = LOCKSTATS + 2  # ... followed by the clock's scratch (int64 seconds, nanoseconds)
WAIT_S, HOLD_S, ACQUISITIONS, CONTENDED, FALLBACKS, KERNEL_CALLS = range(LOCKSTATS)

#: Rounds of redrawing rows whose slot changed during the copy before a sample gives up.
MAX_CHANGED_ROUNDS = 64
_UNLOCKED_BASE = fused.MAX_REDRAWS + 1  # optimistic's unlocked redraws use counters from here on (times n)


# ----------------------------------------------------------------------------- the lock
@njit(nogil=True, cache=True, inline="always")
def _subkey(key, tag):
    """A stream of its own for redraw round ``tag`` of the call with stream ``key`` (counters
    far past any a draw of the call uses)."""
    return np.int64(fused.uniform01(key, (1 << 40) + tag) * 4.0e18)


@njit(nogil=True, cache=True, inline="always")
def _wait_round(i):
    """Round ``i`` of a wait for a lock: a ``pause``, or past :data:`LOCK_PAUSES` a yield."""
    if i < LOCK_PAUSES:
        cpu_relax()
    else:
        yield_core()


@njit(nogil=True, cache=True, inline="always")
def _readers_gone(ctrl):
    """Whether no kernel holds the tree lock shared (every reader slot is 0)."""
    for r in range(READERS_AT, READERS_AT + MAX_READERS):
        if atomic_read(ctrl, r) != 0:
            return False
    return True


@njit(nogil=True, cache=True, inline="always")
def _acquire(ctrl, word, token, lockstats):
    """Take the tree lock ``ctrl[word]`` exclusively for ``token``: ``(STATUS_OK, time taken)``,
    or ``(STATUS_BUSY | STATUS_HELD, 0)`` with the lock not taken.

    Taking the word stops new shared holders; the call then waits for the ones inside to
    leave (a draw: microseconds). A holder or reader that stays past :data:`LOCK_SPINS` rounds
    (a dead process's slot, a descheduled thread) makes it release the word and hand the call
    to Python, whose :class:`~impl.concurrent.locks.SharedLock` sleeps, times out and voids a
    dead reader's slot."""
    clk = lockstats[LOCKSTATS:].view(np.int64)
    seen = atomic_cas(ctrl, word, 0, token)
    if seen == token:
        return STATUS_HELD, 0.0
    start = -1.0
    i = 0
    if seen != 0:
        start = monotonic(clk)
        lockstats[CONTENDED] += 1
        while i < LOCK_SPINS:
            _wait_round(i)
            i += 1
            if atomic_read(ctrl, word) == 0 and atomic_cas(ctrl, word, 0, token) == 0:
                seen = 0
                break
        if seen != 0:
            lockstats[WAIT_S] += monotonic(clk) - start  # Python's wait goes on from here, counted by SharedLock
            return STATUS_BUSY, 0.0
    full_fence()  # the word is visible before the reader slots are read (see full_fence)
    while not _readers_gone(ctrl):
        if start < 0.0:
            start = monotonic(clk)
            lockstats[CONTENDED] += 1
        if i >= LOCK_SPINS:
            atomic_cas(ctrl, word, token, 0)
            lockstats[WAIT_S] += monotonic(clk) - start
            return STATUS_BUSY, 0.0
        _wait_round(i)
        i += 1
    lockstats[ACQUISITIONS] += 1
    now = monotonic(clk)
    if start >= 0.0:
        lockstats[WAIT_S] += now - start
    return STATUS_OK, now


@njit(nogil=True, cache=True, inline="always")
def _release(ctrl, word, token, lockstats, taken):
    clk = lockstats[LOCKSTATS:].view(np.int64)
    lockstats[HOLD_S] += monotonic(clk) - taken
    atomic_cas(ctrl, word, token, 0)  # seq_cst: every write of the section is visible before the word


@njit(nogil=True, cache=True, inline="always")
def _acquire_shared(ctrl, token, lockstats):
    """Take the tree lock shared (a draw, which writes nothing in the tree or the ring):
    ``(STATUS_OK, reader slot)``, or ``(STATUS_BUSY | STATUS_HELD, -1)`` with nothing taken.

    The reader writes its token into a free reader slot (compare-and-swap, so no two share
    one), then reads the lock word: free means no writer can enter until the slot is cleared
    (a writer reads the slots after taking the word, and the fences order both handshakes);
    held means a writer is in or draining, so the reader clears its slot and waits for the
    word to be free. Within :data:`LOCK_SPINS` rounds, else STATUS_BUSY (Python's exclusive
    path then runs the draw). Shared holds are not added to the hold time: they exclude only
    writers, so they are no serial part of two samplers' work (waits are counted)."""
    clk = lockstats[LOCKSTATS:].view(np.int64)
    home = READERS_AT + ((token ^ (token >> 22)) & (MAX_READERS - 1))  # threads and processes spread out
    start = -1.0
    for i in range(LOCK_SPINS):
        holder = atomic_read(ctrl, TREE_LOCK)
        if holder == token:
            return STATUS_HELD, -1
        if holder == 0:
            for k in range(MAX_READERS):
                slot = READERS_AT + (home - READERS_AT + k) % MAX_READERS
                if atomic_read(ctrl, slot) == 0 and atomic_cas(ctrl, slot, 0, token) == 0:
                    full_fence()  # the slot is visible before the word is read again
                    if atomic_read(ctrl, TREE_LOCK) == 0:
                        lockstats[ACQUISITIONS] += 1
                        if start >= 0.0:
                            lockstats[WAIT_S] += monotonic(clk) - start
                        return STATUS_OK, slot
                    atomic_cas(ctrl, slot, token, 0)  # a writer came in between: let it drain
                    break
        if start < 0.0:
            start = monotonic(clk)
            lockstats[CONTENDED] += 1
        _wait_round(i)
    lockstats[WAIT_S] += monotonic(clk) - start
    return STATUS_BUSY, -1


@njit(nogil=True, cache=True, inline="always")
def _release_shared(ctrl, slot, token):
    atomic_cas(ctrl, slot, token, 0)  # seq_cst: the section's loads are done before the slot is free


#: The lock's steps for kernels of other modules (a policy's own kernel set, which takes the
#: same words in control blocks of its own): exclusive and shared, as described above.
acquire, release, acquire_shared, release_shared = _acquire, _release, _acquire_shared, _release_shared


@njit(nogil=True, cache=True)
def dead_holder(ctrl, token):
    """The first of the lock word ``ctrl[TREE_LOCK]`` and its reader words held by a process
    other than ``token``'s that has died (:func:`~impl.concurrent.atomics.process_gone`), else
    -1. For policies whose writers hold the lock *shared* (atomic-deltas): a reader word is then
    a writer's mark, and a dead one holds up no other writer nor any sampler, so nothing else
    would find it (the exclusive holders' waits find dead readers, but those come once per
    drift rebuild). A word found here goes to the Python path, which checks the pid against
    /proc (:meth:`~impl.concurrent.locks.SharedLock.dead_readers`) before it repairs anything.
    Cost: 1 + MAX_READERS acquire loads (5 lines), and a system call or two per word another
    process holds: a periodic check, not one for every call."""
    me = token >> PID_SHIFT
    for k in range(-1, MAX_READERS):
        word = TREE_LOCK if k < 0 else READERS_AT + k
        holder = atomic_read(ctrl, word)
        if holder != 0 and holder >> PID_SHIFT != me and process_gone(holder >> PID_SHIFT):
            return word
    return -1


# ----------------------------------------------------------------------------- draws
@njit(nogil=True, cache=True)
def _draw_locked(kind, sums, mins, lay, K, touch_from, state, ctrl, fctrl, key, stratified, exclusive, out_index,
                 prio):
    """Under the tree lock: one descent for every position (as :func:`impl.fused.sample`), zero
    leaves redrawn by :func:`impl.fused.redraw`; a rebuild it makes is recorded in the ring.
    Held shared (``exclusive`` False), a zero leaf returns :data:`_STATUS_WRITES` instead: the
    redraw may rebuild the inner sums, which only the exclusive holder may write."""
    n = out_index.shape[0]
    total = np.float64(sums[lay[0, 0]])
    if not total > 0.0:
        return STATUS_NO_MASS, 0.0
    for b in range(n):
        prio[b] = fused.mass(key, b, b, n, total, stratified)
    touched = ops.descend(kind, sums, lay, K, touch_from, prio, out_index)
    misses, leaf_touch = ops.read_leaves(kind, sums, lay, touch_from, out_index, prio)
    touched += leaf_touch
    if misses > 0:
        if not exclusive:
            return _STATUS_WRITES, touched
        rebuilds = state[3]
        status = fused.redraw(kind, sums, mins, lay, K, touch_from, state, key, stratified, out_index, prio)
        if state[3] != rebuilds:
            note_rebuild(ctrl, fctrl, np.float64(sums[lay[0, 0]]))
        if status != STATUS_OK:
            return status, touched
    return STATUS_OK, touched


@njit(nogil=True, cache=True)
def draw_unlocked(kind, sums, mins, lay, K, touch_from, stamps, key, stratified, rounds, out_index, prio,
                  out_stamp):
    """Optimistic's draw with no lock: ``p_min`` (> 0) when every position reached a nonzero
    leaf whose slot is not being written within ``rounds`` rounds, else -1 (take the lock).

    Writers may change the tree during the descent: every node read is a value it really held
    (aligned loads), so the descent reaches a real leaf; a leaf read as 0 or a slot stamped -1
    is drawn again (not stratified, as the tree's redraw), with a fresh total. So is a draw
    that overshot its leaf (the mass left there not below the leaf: a node on its path, or the
    total, was read before a decrease below it reached the nodes read after), which would
    otherwise go to the last child of the group where the descent ran out of mass."""
    n = out_index.shape[0]
    root = lay[0, 0]
    total = np.float64(sums[root])
    if not total > 0.0:
        return -1.0
    left = np.empty(n)  # each draw's mass, then what is left of it at its leaf
    for b in range(n):
        left[b] = fused.mass(key, b, b, n, total, stratified)
    ops.descend(kind, sums, lay, K, touch_from, left, out_index)
    ops.read_leaves(kind, sums, lay, touch_from, out_index, prio)
    reject_overshoot(left, out_index, prio)
    for r in range(rounds):
        bad = 0
        for b in range(n):
            i = out_index[b]
            # Read once, and trusted only once checked: a leaf in the ring whose stamp says
            # published. (A descent reaches a leaf below K**D whatever it read; one past the
            # ring's slots would be a padding leaf, which is never > 0, but nothing read
            # without the lock is used as an index unchecked.)
            s = stamps[i] if 0 <= i < stamps.shape[0] else -1
            out_stamp[b] = s
            if s < 0:
                out_index[b] = -1
                bad += 1
        if bad == 0:
            pmin = np.float64(mins[root])
            return pmin if 0.0 < pmin < np.inf else -1.0
        total = np.float64(sums[root])
        if not total > 0.0:
            return -1.0
        pos = np.flatnonzero(out_index < 0)
        u = np.empty(bad)
        j = np.empty(bad, dtype=np.int64)
        p = np.empty(bad)
        for k in range(bad):
            u[k] = fused.uniform01(key, (_UNLOCKED_BASE + r) * n + pos[k]) * total
        ops.descend(kind, sums, lay, K, touch_from, u, j)
        ops.read_leaves(kind, sums, lay, touch_from, j, p)
        reject_overshoot(u, j, p)
        for k in range(bad):
            out_index[pos[k]] = j[k]
            prio[pos[k]] = p[k]
    return -1.0


@njit(nogil=True, cache=True, inline="always")
def _stamps_and_pmin(stamps, mins, lay, out_index, out_stamp):
    """Under the tree lock (either way), after a whole draw: the drawn slots' stamps into
    ``out_stamp``, and ``p_min`` for the weights."""
    for b in range(out_index.shape[0]):
        out_stamp[b] = stamps[out_index[b]]
    return np.float64(mins[lay[0, 0]])


@njit(nogil=True, cache=True)
def _draw(kind, sums, mins, lay, K, kshift, touch_from, state, ctrl, fctrl, stamps, qidx, qdelta, resum_every, token,
          lockstats, protocol, rounds, key, stratified, arena, table, out, out_table, touch_rows, out_index, prio,
          out_stamp):
    """Positions ``0 .. n-1`` drawn by ``protocol``, with stamps and ``p_min`` (and, for
    GATHER_LOCKED, their rows copied under the lock): ``(status, p_min, touched)``.

    GATHER_LOCKED holds the tree lock exclusively (global-lock: one lock around everything);
    DRAW_LOCKED and optimistic's fallback hold it shared, so draws run together and only tree
    writers exclude them, and take it exclusively only for a draw that reached a zero leaf
    (the same key: the same draw, now allowed to rebuild). DRAIN_LOCKED (deferred) draws as
    DRAW_LOCKED while the queue of leaf deltas is empty (read under the shared hold, which no
    enqueuing writer can enter); otherwise it takes the lock exclusively, propagates the queue
    (:func:`~impl.concurrent.ring.drain_queue`) and draws."""
    pmin = -1.0
    if protocol == OPTIMISTIC:
        pmin = draw_unlocked(kind, sums, mins, lay, K, touch_from, stamps, key, stratified, rounds, out_index,
                             prio, out_stamp)
        if pmin > 0.0:
            return STATUS_OK, pmin, 0.0
        key = _subkey(key, 0)  # the locked draw gets a stream of its own
    if protocol != GATHER_LOCKED:
        status, slot = _acquire_shared(ctrl, token, lockstats)
        if status != STATUS_OK:
            return status, pmin, 0.0
        if protocol == DRAIN_LOCKED and queue_length(ctrl) > 0:
            status, touched = _STATUS_WRITES, 0.0
        else:
            status, touched = _draw_locked(kind, sums, mins, lay, K, touch_from, state, ctrl, fctrl, key, stratified,
                                           False, out_index, prio)
        if status == STATUS_OK:
            pmin = _stamps_and_pmin(stamps, mins, lay, out_index, out_stamp)
        _release_shared(ctrl, slot, token)
        if status != _STATUS_WRITES:
            return status, pmin, touched
    status, taken = _acquire(ctrl, TREE_LOCK, token, lockstats)
    if status != STATUS_OK:
        return status, pmin, 0.0
    if protocol == DRAIN_LOCKED:
        drain_queue(kind, sums, mins, lay, K, kshift, state, ctrl, fctrl, qidx, qdelta, resum_every)
    status, touched = _draw_locked(kind, sums, mins, lay, K, touch_from, state, ctrl, fctrl, key, stratified,
                                   True, out_index, prio)
    if status == STATUS_OK:
        pmin = _stamps_and_pmin(stamps, mins, lay, out_index, out_stamp)
        if protocol == GATHER_LOCKED:
            touched += gather_rows(arena, table, out_index, out, out_table, touch_rows)
    _release(ctrl, TREE_LOCK, token, lockstats, taken)
    return status, pmin, touched


@njit(nogil=True, cache=True, inline="always")
def changed_rows(ctrl, stamps, out_index, out_stamp, pos):
    """The seqlock check after a copy made outside the lock: the positions ``b`` whose slot's
    stamp is no longer the one read before the copy, into ``pos`` (as many as ``out_index``);
    returns how many, counted as redrawn. Writers change stamps at any moment (no lock is
    held), so each stamp is read exactly once and the positions that read found changed are
    the ones returned. (Counting them in one pass and collecting them in a second, as this
    once did, wrote past ``pos`` whenever a stamp changed between the passes: an out-of-bounds
    write beside concurrent inserts.) A row that changes after its check is caught by the
    caller's next round, which checks every position again. O(n)."""
    acquire_fence()  # the copy's loads are done before the stamps are read again
    changed = 0
    for b in range(out_index.shape[0]):
        if stamps[out_index[b]] != out_stamp[b]:
            pos[changed] = b
            changed += 1
    if changed:
        count_redrawn(ctrl, changed)
    return changed


@njit(nogil=True, cache=True, inline="always")
def copy_redrawn(arena, table, out, out_table, pos, j, st, out_index, out_stamp):
    """The redrawn rows ``j`` (stamps ``st``, as read by their draw) copied into the positions
    ``pos[:len(j)]`` of the sample's outputs, whose indices and stamps they replace; the
    caller then runs :func:`changed_rows` again. O(len(j) row bytes)."""
    acquire_fence()  # the new rows' stamps were read before their copy starts
    row_table = out_table.copy()
    for k in range(j.shape[0]):
        b = pos[k]
        out_index[b], out_stamp[b] = j[k], st[k]
        for f in range(out_table.shape[0]):
            row_table[f, 0] = out_table[f, 0] + b * out_table[f, 1]
        gather_rows(arena, table, j[k:k + 1], out, row_table, False)


@njit(nogil=True, cache=True)
def _redraw_changed(kind, sums, mins, lay, K, kshift, touch_from, state, ctrl, fctrl, stamps, qidx, qdelta,
                    resum_every, token, lockstats, protocol, rounds, key, stratified, arena, table, out, out_table,
                    out_index, prio, out_stamp):
    """The rows whose slot changed during a copy made outside the lock (:func:`changed_rows`)
    drawn again by the same protocol and copied into their positions, until none changed."""
    pos = np.empty(out_index.shape[0], dtype=np.int64)
    for r in range(MAX_CHANGED_ROUNDS):
        changed = changed_rows(ctrl, stamps, out_index, out_stamp, pos)
        if changed == 0:
            return STATUS_OK
        j = np.empty(changed, dtype=np.int64)
        p = np.empty(changed)
        s = np.empty(changed, dtype=np.int64)
        subkey = _subkey(key, 1 + r)
        status, _, _ = _draw(kind, sums, mins, lay, K, kshift, touch_from, state, ctrl, fctrl, stamps, qidx, qdelta,
                             resum_every, token, lockstats, protocol, rounds, subkey, stratified, arena, table, out,
                             out_table, False, j, p, s)
        if status != STATUS_OK:
            return status
        for k in range(changed):
            prio[pos[k]] = p[k]
        copy_redrawn(arena, table, out, out_table, pos, j, s, out_index, out_stamp)
    return STATUS_CHANGING


# ----------------------------------------------------------------------------- tree changes
@njit(nogil=True, cache=True, inline="always")
def _acquire_leaf(ctrl, token, lockstats):
    """Under the tree lock: take the leaf lock ``ctrl[LEAF_LOCK]`` (exclusive; it has no shared
    holders) within :data:`LOCK_SPINS` polls: True, or False with nothing taken. Its only other
    takers hold it for a read of leaves (pal-locks' ``priorities``); a wait is counted in the
    wait time, the hold is not (it sits inside the tree lock's, which is counted)."""
    if atomic_cas(ctrl, LEAF_LOCK, 0, token) == 0:
        return True
    clk = lockstats[LOCKSTATS:].view(np.int64)
    start = monotonic(clk)
    lockstats[CONTENDED] += 1
    for i in range(LOCK_SPINS):
        _wait_round(i)
        if atomic_read(ctrl, LEAF_LOCK) == 0 and atomic_cas(ctrl, LEAF_LOCK, 0, token) == 0:
            lockstats[WAIT_S] += monotonic(clk) - start
            return True
    lockstats[WAIT_S] += monotonic(clk) - start
    return False


@njit(nogil=True, cache=True)
def _apply(kind, sums, mins, lay, K, kshift, touch_from, state, ctrl, fctrl, qidx, qdelta, resum_every, mode, token,
           lockstats, idx, vals, n_valid, eps, alpha, vmax):
    """Under the tree lock: leaves ``idx`` set to ``(vals + eps) ** alpha`` as apply ``mode``
    says (the fused form of :meth:`impl.concurrent.policy.Policy.apply`), the changes counted
    for re-summing when they reach the inner nodes. Returns ``(status, position, max set)``:
    a check's status (nothing written), or :data:`STATUS_BUSY` (APPLY_SPLIT: the leaf lock
    stayed held; nothing written).

    * APPLY_WHOLE: one whole tree update (leaves and inner nodes).
    * APPLY_SPLIT (pal-locks): the leaves written under the leaf lock, which is released
      before the deltas climb the inner levels. O(n) under the leaf lock, O(n K D) in all.
    * APPLY_QUEUED (deferred): the leaves written and their deltas queued; a full queue is
      drained first, a batch larger than the whole queue propagated at once. O(n) unless it
      drains.
    """
    n = idx.shape[0]
    if mode == APPLY_WHOLE:
        status, pos, pmax = ops.update(kind, sums, mins, lay, K, kshift, touch_from, state, idx, vals, n_valid, eps,
                                       alpha, vmax)
        if status == STATUS_OK:
            count_changes(kind, sums, mins, lay, K, state, ctrl, fctrl, resum_every, n)
        return status, pos, pmax
    deltas = np.empty(n)
    if mode == APPLY_SPLIT:
        if not _acquire_leaf(ctrl, token, lockstats):
            return STATUS_BUSY, -1, 0.0
        status, pos, pmax = kernels.write_leaves(sums, mins, lay, idx, vals, n_valid, eps, alpha, vmax, deltas)
        atomic_cas(ctrl, LEAF_LOCK, token, 0)  # seq_cst: the leaves are visible before the word
        if status != STATUS_OK:
            return status, pos, pmax
        kernels.propagate_paths(sums, mins, lay, K, kshift, idx, deltas)
        count_changes(kind, sums, mins, lay, K, state, ctrl, fctrl, resum_every, n)
        return STATUS_OK, -1, pmax
    status, pos, pmax = kernels.write_leaves(sums, mins, lay, idx, vals, n_valid, eps, alpha, vmax, deltas)
    if status != STATUS_OK:
        return status, pos, pmax
    if not enqueue_deltas(ctrl, qidx, qdelta, idx, deltas):
        drain_queue(kind, sums, mins, lay, K, kshift, state, ctrl, fctrl, qidx, qdelta, resum_every)
        if not enqueue_deltas(ctrl, qidx, qdelta, idx, deltas):  # larger than the whole queue
            kernels.propagate_paths(sums, mins, lay, K, kshift, idx, deltas)
            count_changes(kind, sums, mins, lay, K, state, ctrl, fctrl, resum_every, n)
    return STATUS_OK, -1, pmax


# ----------------------------------------------------------------------------- operations
@njit(nogil=True, cache=True)
def _sample(kind, sums, mins, lay, K, kshift, touch_from, state, ctrl, fctrl, stamps, qidx, qdelta, resum_every,
            token, lockstats, protocol, rounds, key, stratified, beta, arena, table, out, out_table, touch_rows,
            out_index, out_weight, out_stamp, scratch):
    n = out_index.shape[0]
    status, pmin, touched = _draw(kind, sums, mins, lay, K, kshift, touch_from, state, ctrl, fctrl, stamps, qidx,
                                  qdelta, resum_every, token, lockstats, protocol, rounds, key, stratified, arena,
                                  table, out, out_table, touch_rows, out_index, scratch, out_stamp)
    if status != STATUS_OK:
        return status
    if protocol != GATHER_LOCKED:
        acquire_fence()  # every stamp was read (optimistic's without the lock) before any row
        touched += gather_rows(arena, table, out_index, out, out_table, touch_rows)
        status = _redraw_changed(kind, sums, mins, lay, K, kshift, touch_from, state, ctrl, fctrl, stamps, qidx,
                                 qdelta, resum_every, token, lockstats, protocol, rounds, key, stratified, arena,
                                 table, out, out_table, out_index, scratch, out_stamp)
        if status != STATUS_OK:
            return status
    for b in range(n):
        out_weight[b] = (scratch[b] / pmin) ** -beta
    if n > 0:
        out_weight[0] += 0.0 * touched  # keeps the touch passes' loads (see impl.fused.sample)
    return STATUS_OK


@njit(nogil=True, cache=True)
def sample(ctx, sums, mins, token, key, beta, octx):
    """One whole shared ``sample`` into the arrays of ``octx``; returns a status (``STATUS_*``;
    see the module docstring).

    ``ctx``: the buffer object's :class:`~impl.concurrent.context.KernelContext` words (the
    tree's and ring's arrays and constants, the lock statistics, the policy's protocol codes);
    ``sums, mins``: the tree's arrays; ``token``: this thread's lock token; ``key``: the call's
    random stream; ``beta``: the weights' exponent; ``octx``: the output context of one
    ``sample_out`` object (:func:`~impl.concurrent.context.out_context`: rows, ``indices``,
    ``weights``, ``stamps``, scratch). Cost: O(n K D) descent + O(n * row bytes) copy, plus the
    same again for rows that changed during the copy (and, for DRAIN_LOCKED, O(q K D) for q
    queued deltas). On a non-OK status the outputs are scratch and nothing in shared memory
    changed except statistics (and a rebuild of drifted inner sums, which changes no leaf, or
    a drain of deferred deltas, which changes no leaf either). A buffer nothing was ever
    inserted into returns :data:`STATUS_EMPTY` before anything else (one load: the Python caller
    checks nothing before the call).
    """
    ctrl = vec_i64(ctx, CTRL)
    if tickets(ctrl) == 0:
        return STATUS_EMPTY
    lockstats = vec_f64(ctx, LOCKSTATS_AT)
    lockstats[KERNEL_CALLS] += 1
    return _sample(ctx[KIND], sums, mins, mat_i64(ctx, LAY), ctx[K_AT], ctx[KSHIFT], ctx[TOUCH_FROM], vec_f64(ctx, STATE),
                   ctrl, vec_f64(ctx, FCTRL), vec_i64(ctx, STAMPS), vec_i64(ctx, QUEUE_IDX), vec_f64(ctx, QUEUE_DELTA),
                   ctx[RESUM_EVERY], token, lockstats, ctx[SAMPLE_PROTOCOL], ctx[ROUNDS], key,
                   ctx[STRATIFIED] != 0, beta, vec_u8(ctx, ARENA), mat_i64(octx, SRC_TABLE), vec_u8(octx, OUT),
                   mat_i64(octx, OUT_TABLE), octx[TOUCH_ROWS] != 0, vec_i64(octx, OUT_INDEX),
                   vec_f32(octx, OUT_WEIGHT), vec_i64(octx, OUT_STAMP), vec_f64(octx, SCRATCH))


@njit(nogil=True, cache=True)
def _set_new(kind, sums, mins, lay, K, kshift, touch_from, state, ctrl, fctrl, qidx, qdelta, resum_every, mode, token,
             lockstats, capacity, t0, keep, values, eps, alpha, vmax, max_priority):
    """Under the tree lock: tickets ``t0 ..`` get ``(values + eps) ** alpha`` (checked by the
    caller) or, with ``values`` empty, the max priority so far (one fill, or for a split apply
    mode the same value through :func:`_apply`, as :meth:`Policy.set_new_priorities`); counted.
    Returns :func:`_apply`'s status (STATUS_BUSY: the leaf lock stayed held, nothing written)."""
    start = t0 % capacity
    if values.shape[0] == 0 and mode == APPLY_WHOLE:
        ops.fill(kind, sums, mins, lay, K, kshift, touch_from, state, start, keep, capacity, max_priority)
        count_changes(kind, sums, mins, lay, K, state, ctrl, fctrl, resum_every, keep)
        return STATUS_OK
    slots = fused.ring_slots(start, keep, capacity)
    if values.shape[0] == 0:
        status, _, _ = _apply(kind, sums, mins, lay, K, kshift, touch_from, state, ctrl, fctrl, qidx, qdelta,
                              resum_every, mode, token, lockstats, slots, np.full(keep, max_priority), capacity, 0.0,
                              1.0, vmax)
        return status
    status, _, pmax = _apply(kind, sums, mins, lay, K, kshift, touch_from, state, ctrl, fctrl, qidx, qdelta,
                             resum_every, mode, token, lockstats, slots, values, capacity, eps, alpha, vmax)
    if status == STATUS_OK:
        note_max(fctrl, pmax)
    return status


@njit(nogil=True, cache=True)
def add(ctx, sums, mins, token, values, rows, keep):
    """One whole shared ``add`` of ``keep`` rows (``rows``: :meth:`impl.storage.Storage.as_bytes`)
    with checked raw ``values`` (empty: the max priority). Returns ``(status, first ticket,
    in-flight row)``: on :data:`STATUS_PUBLISH_BUSY` the rows are reserved (priority 0) and
    copied, and the caller publishes them under the lock; on :data:`STATUS_LEAF_BUSY` they are
    reserved and copied and the tree lock is *still held* by ``token``: the caller sets their
    priorities, publishes and releases it (:func:`release_held`). O(keep * (D + row bytes)).
    """
    kind, lay, K, kshift, touch_from = ctx[KIND], mat_i64(ctx, LAY), ctx[K_AT], ctx[KSHIFT], ctx[TOUCH_FROM]
    state, ctrl, fctrl, stamps = vec_f64(ctx, STATE), vec_i64(ctx, CTRL), vec_f64(ctx, FCTRL), vec_i64(ctx, STAMPS)
    qidx, qdelta, resum_every = vec_i64(ctx, QUEUE_IDX), vec_f64(ctx, QUEUE_DELTA), ctx[RESUM_EVERY]
    writers, lockstats = mat_i64(ctx, WRITERS), vec_f64(ctx, LOCKSTATS_AT)
    arena, table = vec_u8(ctx, ARENA), mat_i64(ctx, TABLE)
    protocol, mode, capacity = ctx[INSERT_PROTOCOL], ctx[APPLY], ctx[CAPACITY]
    eps, alpha, vmax = f64(ctx, EPS), f64(ctx, ALPHA), f64(ctx, VMAX)
    lockstats[KERNEL_CALLS] += 1
    status, taken = _acquire(ctrl, TREE_LOCK, token, lockstats)
    if status != STATUS_OK:
        return status, -1, -1
    t0, row, _ = reserve_slots(ctrl, writers, stamps, keep, token, capacity, protocol == LAZY)
    if row < 0:
        _release(ctrl, TREE_LOCK, token, lockstats, taken)
        return STATUS_RESERVE, -1, -1
    if protocol == LOCKED:
        write_rows(arena, table, t0 % capacity, capacity, rows, keep)
        status = _set_new(kind, sums, mins, lay, K, kshift, touch_from, state, ctrl, fctrl, qidx, qdelta, resum_every,
                          mode, token, lockstats, capacity, t0, keep, values, eps, alpha, vmax, max_priority(fctrl))
        if status != STATUS_OK:  # the leaf lock stayed held: Python finishes under the tree lock still held
            return STATUS_LEAF_BUSY, t0, row
        publish_slots(stamps, writers, row, t0, keep, capacity)
        _release(ctrl, TREE_LOCK, token, lockstats, taken)
        return STATUS_OK, t0, row
    # LAZY (its apply mode is APPLY_WHOLE: the buffer refuses other pairs)
    ops.fill(kind, sums, mins, lay, K, kshift, touch_from, state, t0 % capacity, keep, capacity, 0.0)
    count_changes(kind, sums, mins, lay, K, state, ctrl, fctrl, resum_every, keep)
    _release(ctrl, TREE_LOCK, token, lockstats, taken)
    write_rows(arena, table, t0 % capacity, capacity, rows, keep)
    status, taken = _acquire(ctrl, TREE_LOCK, token, lockstats)
    if status != STATUS_OK:
        return STATUS_PUBLISH_BUSY, t0, row
    _set_new(kind, sums, mins, lay, K, kshift, touch_from, state, ctrl, fctrl, qidx, qdelta, resum_every, mode, token,
             lockstats, capacity, t0, keep, values, eps, alpha, vmax, max_priority(fctrl))
    publish_slots(stamps, writers, row, t0, keep, capacity)
    _release(ctrl, TREE_LOCK, token, lockstats, taken)
    return STATUS_OK, t0, row


@njit(nogil=True, cache=True)
def release_held(ctx, token):
    """Release the tree lock a kernel left held for ``token`` (:data:`STATUS_LEAF_BUSY`), once
    the caller has finished the insert under it. Its hold time is not counted (rare path)."""
    atomic_cas(vec_i64(ctx, CTRL), TREE_LOCK, token, 0)


@njit(nogil=True, cache=True)
def update(ctx, sums, mins, token, indices, values, sampled, use_sampled):
    """One whole shared ``update_priorities``: every entry checked first (as the trees check:
    index in ``[0, n_valid)`` with ``n_valid`` the rows inserted so far, capped at the capacity,
    read here so the Python caller reads nothing; value finite and >= 0, ``(v + eps) ** alpha``
    not above ``vmax``, kept or stale), then under the lock the stale ones dropped
    (:func:`impl.concurrent.ring.fresh_mask`), the rest written by the policy's apply mode
    (:func:`_apply`) and counted. Returns ``(status, position, applied)``: a check's status
    names the first bad entry, nothing was written, and the third value is the ``n_valid`` it
    was checked against (for the error's message); STATUS_BUSY: a lock stayed held, nothing
    was written (nor counted). O(n D).

    The transform runs before the lock is taken (it reads only the caller's arrays): the
    locked section writes stored priorities as they are (the tree's update with ``eps = 0``
    and ``alpha = 1``, which stores each value unchanged), so its length is the tree's writes
    and the stamps' reads, not ``n`` powers.
    """
    kind, lay, K, kshift, touch_from = ctx[KIND], mat_i64(ctx, LAY), ctx[K_AT], ctx[KSHIFT], ctx[TOUCH_FROM]
    state, ctrl, fctrl, stamps = vec_f64(ctx, STATE), vec_i64(ctx, CTRL), vec_f64(ctx, FCTRL), vec_i64(ctx, STAMPS)
    qidx, qdelta, resum_every = vec_i64(ctx, QUEUE_IDX), vec_f64(ctx, QUEUE_DELTA), ctx[RESUM_EVERY]
    lockstats, mode = vec_f64(ctx, LOCKSTATS_AT), ctx[APPLY]
    eps, alpha, vmax = f64(ctx, EPS), f64(ctx, ALPHA), f64(ctx, VMAX)
    lockstats[KERNEL_CALLS] += 1
    n_valid = min(tickets(ctrl), stamps.shape[0])
    status, pos = kernels.check_batch(indices, values, n_valid)
    if status != STATUS_OK:
        return status, pos, n_valid
    stored, _, pos = kernels.transform(values, eps, alpha, vmax)
    if pos >= 0:
        return kernels.STATUS_OVERFLOW, pos, n_valid
    status, taken = _acquire(ctrl, TREE_LOCK, token, lockstats)
    if status != STATUS_OK:
        return status, -1, 0
    n = indices.shape[0]
    keep = np.empty(n, dtype=np.bool_)
    kept = fresh_mask(ctrl, stamps, indices, sampled, use_sampled, keep)
    idx, vals = indices, stored
    if kept < n:
        idx, vals = indices[keep], stored[keep]
    if kept:
        limit = min(tickets(ctrl), stamps.shape[0])  # as Policy.update: tickets handed out, capped at capacity
        status, p, pmax = _apply(kind, sums, mins, lay, K, kshift, touch_from, state, ctrl, fctrl, qidx, qdelta,
                                 resum_every, mode, token, lockstats, idx, vals, limit, 0.0, 1.0, vmax)
        if status == STATUS_BUSY:  # the leaf lock stayed held: nothing written; Python redoes the call
            uncount_stale(ctrl, n - kept)
            _release(ctrl, TREE_LOCK, token, lockstats, taken)
            return status, -1, 0
        if status != STATUS_OK:  # an index past the tickets handed out: nothing was written
            _release(ctrl, TREE_LOCK, token, lockstats, taken)
            return status, np.flatnonzero(keep)[p] if kept < n else p, limit
        note_max(fctrl, pmax)
    _release(ctrl, TREE_LOCK, token, lockstats, taken)
    return STATUS_OK, -1, kept
