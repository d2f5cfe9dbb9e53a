"""atomic-deltas: one float64 tree written with atomics; no lock on the sample path."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from numba import njit

from ... import fused_ops as fo
from ...storage import gather_rows, write_rows
from ...trees import kernels as tree_kernels
from ...trees import ops
from .. import context as cx
from ..atomics import acquire_fence, atomic_read, exchange, load
from ..deltas import depth, draw, set_leaves
from ..fused import (KERNEL_CALLS, MAX_CHANGED_ROUNDS, STATUS_BUSY, STATUS_CHANGING, STATUS_EMPTY, STATUS_OK, STATUS_PUBLISH_BUSY,
                     STATUS_RESERVE, acquire, acquire_shared, changed_rows, copy_redrawn, dead_holder, release,
                     release_shared)
from ..locks import SharedLock, my_token, pid_alive, token_pid
from ..policy import Backoff, Policy, Selection, register
from ..ring import (MAX_READERS, MAX_WRITERS, READERS_AT, TREE_LOCK, Reservation, counters_of,
                    fresh_mask, max_priority, note_changes_atomic, note_max_atomic, note_rebuild, note_recovery,
                    release_record, reserve_unlocked, tickets)

__all__ = ["AtomicDeltas", "DRIFT_TOLERANCE", "DRIFT_TOLERANCE_F32", "HEAL_EVERY", "drift_bound", "rebuild_due"]

#: The relative drift of the root (against the exact sum of the leaves) the policy lets its
#: bound reach before an exact rebuild, for float64 leaves: 2**-30, about 9.3e-10 (see
#: :func:`drift_bound`); at a steady total and depth 5, a rebuild per about 1e6 leaf changes.
DRIFT_TOLERANCE = 2.0**-30
#: The same for float32 leaves (a float32 variant's): 2**-24, one float32 rounding of the
#: total, where the variant's own float32 tree carries up to D of them, so the float64 tree
#: stays within the accuracy of the tree it stands in for; a rebuild per about 6.7e7 leaf
#: changes at depth 5. (2**-30 made the rebuild, O(capacity) under the lock held
#: exclusively, the one serial section of an insert: an insert changes 2n leaves.)
DRIFT_TOLERANCE_F32 = 2.0**-24
#: Calls of one buffer object between its checks for writers that died inside a tree write
#: (:func:`_heal_due`): its first call checks, then every HEAL_EVERY-th. A check is 33 loads
#: (some 15 ns from cache) plus two system calls per word another process holds at that
#: moment (about 1 us), so a call pays under 1 ns on average with no other process inside a
#: write, some 30 ns per one that is, and one load and a count otherwise. A dead writer's batch
#: is repaired before the HEAL_EVERY-th call of any object after its death relies on the sums.
HEAL_EVERY = 32
# The policy's control block is laid out as the ring's (its lock word and reader words), then
# one line of its own: the heal word, set while a dead writer's repair is pending, which every
# call reads first (never written otherwise, so it stays in every core's cache).
HEAL = READERS_AT + MAX_READERS
_CONTROL_WORDS = HEAL + 8


# ----------------------------------------------------------------------------- drift
@njit(nogil=True, cache=True, inline="always")
def drift_bound(since, t_max, D):
    """Bound on ``|root - sum of leaves|`` after ``since`` leaf changes since the last rebuild,
    with ``t_max`` the largest total seen since, in a float64 tree of depth ``D``: each change's
    delta is rounded once (``new - old``), summed per node in float64 at most ``D`` times on
    its way up, and added to the root once: at most ``D + 3`` roundings of at most
    ``2**-53 T_max`` each."""
    return since * (D + 3) * 2.0**-53 * t_max


@njit(nogil=True, cache=True, inline="always")
def rebuild_due(since, t_max, total, D, leaf32):
    """Whether the drift bound passed the tolerance (:data:`DRIFT_TOLERANCE`, or
    :data:`DRIFT_TOLERANCE_F32` for float32 leaves) of the current ``total``. (The buffer's
    ``resum_every``, a float32 tree's re-summing period, does not apply: the inner nodes are
    float64, and a float64 tree's own default is never.)"""
    return drift_bound(since, t_max, D) > (DRIFT_TOLERANCE_F32 if leaf32 else DRIFT_TOLERANCE) * total


@njit(nogil=True, cache=True)
def _count(kind, sums, lay, lctrl, lfctrl, leaf32, n):
    """Held shared: count ``n`` leaf changes; whether a rebuild is due."""
    total = np.float64(sums[lay[0, 0]])
    since, t_max = note_changes_atomic(lctrl, lfctrl, n, total)
    return rebuild_due(since, t_max, total, depth(kind, lay), leaf32)


@njit(nogil=True, cache=True)
def _rebuild(kind, sums, mins, lay, K, state, lctrl, lfctrl, leaf32, token, lockstats):
    """The exact rebuild, under the policy's lock held exclusively (every atomic writer out), if
    still due once it is held: whether the lock was taken. Not taken (a rebuild in progress, or
    the word of a shared holder that died mid-write and holds it off), an update hands its
    call to the Python path, whose lock waits, clears a dead holder's word and rebuilds."""
    status, taken = acquire(lctrl, TREE_LOCK, token, lockstats)
    if status != STATUS_OK:
        return False
    total = np.float64(sums[lay[0, 0]])
    since, t_max = note_changes_atomic(lctrl, lfctrl, 0, total)
    if rebuild_due(since, t_max, total, depth(kind, lay), leaf32):
        ops.rebuild(kind, sums, mins, lay, K, state)
        note_rebuild(lctrl, lfctrl, np.float64(sums[lay[0, 0]]))
    release(lctrl, TREE_LOCK, token, lockstats, taken)
    return True


@njit(nogil=True, cache=True, inline="always")
def _leaf_values(p, leaf32):
    """Stored priorities as the variant's leaves hold them: rounded to float32 for a float32
    variant (the float64 tree then holds the very values the variant's tree would)."""
    if leaf32:
        for b in range(p.shape[0]):
            p[b] = np.float64(np.float32(p[b]))
    return p


# ----------------------------------------------------------------------------- dead writers
@njit(nogil=True, cache=True, inline="always")
def _heal_due(lctrl, calls, token):
    """Whether this call must go to the Python path first, to repair the tree after a writer
    that died inside a tree write (:meth:`AtomicDeltas._heal`): the heal word is set (a repair
    is pending: the sums are not to be relied on), or this is one of the object's periodic
    checks (``calls``: its own count, every :data:`HEAL_EVERY`-th from its first) and it finds
    the policy's lock word, or a reader word (a writer's mark, held from before its first
    leaf exchange to after its last delta), held by a process that has died
    (:func:`impl.concurrent.fused.dead_holder`). Nothing shared is written. O(1) a call, the
    check O(MAX_READERS) loads and a system call or two per word another process holds."""
    if atomic_read(lctrl, HEAL) != 0:
        return True
    c = calls[0]
    calls[0] = c + 1  # this object's own word: a lost count between threads sharing it moves a check, no more
    return c % HEAL_EVERY == 0 and dead_holder(lctrl, token) >= 0


# ----------------------------------------------------------------------------- kernels
@njit(nogil=True, cache=True)
def _sample(kind, sums, mins, lay, K, kshift, touch_from, state, ctrl, fctrl, stamps, lctrl, lfctrl, leaf32, token,
           lockstats, protocol, rounds, key, stratified, beta, arena, table, out, out_table, touch_rows, out_index,
           out_weight, out_stamp, scratch):
    """One whole ``sample`` with no lock (the tree's ``kernel_args``, the ring's arrays, then
    ``lctrl, lfctrl, leaf32``, then the call's own arguments): the draw (:func:`impl.concurrent.deltas.draw`),
    the copy, the seqlock check that draws again the rows whose stamp changed during the copy,
    the weights ``(p_i / p_min) ** -beta``. STATUS_BUSY when the draw kept reaching zero leaves
    or slots being written (the Python path waits for writers). O(n K D + n row bytes)."""
    if tickets(ctrl) == 0:
        return STATUS_EMPTY
    n = out_index.shape[0]
    pmin = draw(kind, sums, mins, lay, K, touch_from, stamps, key, stratified, 0, out_index, scratch, out_stamp)
    if not pmin > 0.0:
        return STATUS_BUSY
    acquire_fence()  # every stamp was read before any row
    touched = gather_rows(arena, table, out_index, out, out_table, touch_rows)
    pos = np.empty(n, dtype=np.int64)
    clean = False
    for r in range(MAX_CHANGED_ROUNDS):
        changed = changed_rows(ctrl, stamps, out_index, out_stamp, pos)
        if changed == 0:
            clean = True
            break
        j = np.empty(changed, dtype=np.int64)
        p = np.empty(changed)
        st = np.empty(changed, dtype=np.int64)
        pm = draw(kind, sums, mins, lay, K, touch_from, stamps, key, stratified, 1 + r, j, p, st)
        if not pm > 0.0:
            return STATUS_BUSY
        pmin = min(pmin, pm)
        for k in range(changed):
            scratch[pos[k]] = p[k]
        copy_redrawn(arena, table, out, out_table, pos, j, st, out_index, out_stamp)
    if not clean:
        return STATUS_CHANGING
    for b in range(n):
        out_weight[b] = (scratch[b] / pmin) ** -beta
    if n > 0:
        out_weight[0] += 0.0 * touched  # keeps the touch passes' loads (see impl.fused.sample)
    return STATUS_OK


@njit(nogil=True, cache=True)
def _add(kind, sums, mins, lay, K, kshift, touch_from, state, ctrl, fctrl, stamps, lctrl, lfctrl, leaf32, writers,
        resum_every, token, lockstats, protocol, capacity, values, eps, alpha, vmax, arena, table, rows, keep):
    """One whole ``add`` (unpacked as :func:`_sample`'s): tickets (one atomic add), the
    in-flight record and stamps -1 with no lock (:func:`impl.concurrent.ring.reserve_unlocked`:
    O(MAX_WRITERS + n), no section inserts share), which is what keeps draws off the slots
    while they are written (their leaves keep the old rows' priorities meanwhile: a draw that
    reaches one is drawn again, as a lazy write's priority 0 would keep it out); the copy; the
    priorities (``values`` transformed, or the max priority) set with atomics and the stamps
    published; the record cleared. Returns ``(status, first ticket, in-flight row)``:
    STATUS_RESERVE with nothing written when no record is free or the range would overtake a
    writer still in flight a lap behind (the Python path waits for it, or voids it); on
    STATUS_PUBLISH_BUSY the rows are copied and the caller publishes them (the policy's lock
    stayed held exclusively). A due rebuild that cannot take the lock is left to the next
    update."""
    t0, row, _ = reserve_unlocked(ctrl, writers, stamps, keep, token, capacity)
    if row < 0:
        return STATUS_RESERVE, -1, -1
    slots = fo.ring_slots(t0 % capacity, keep, capacity)
    write_rows(arena, table, t0 % capacity, capacity, rows, keep)
    if values.shape[0] == 0:
        p = np.full(keep, max_priority(fctrl))
    else:
        p, pmax, _ = tree_kernels.transform(values, eps, alpha, vmax)  # checked by the caller
        note_max_atomic(fctrl, pmax)
    _leaf_values(p, leaf32)
    status, rslot = acquire_shared(lctrl, token, lockstats)
    if status != STATUS_OK:
        return STATUS_PUBLISH_BUSY, t0, row
    set_leaves(kind, sums, mins, lay, K, kshift, slots, p)
    for k in range(keep):
        stamps[slots[k]] = t0 + k
    due = _count(kind, sums, lay, lctrl, lfctrl, leaf32, keep)
    release_shared(lctrl, rslot, token)
    release_record(writers, row, token)
    if due:
        _rebuild(kind, sums, mins, lay, K, state, lctrl, lfctrl, leaf32, token, lockstats)
    return STATUS_OK, t0, row


@njit(nogil=True, cache=True)
def _update(kind, sums, mins, lay, K, kshift, touch_from, state, ctrl, fctrl, stamps, lctrl, lfctrl, leaf32,
           resum_every, token, lockstats, indices, values, sampled, use_sampled, eps, alpha, vmax):
    """One whole ``update_priorities`` (unpacked as :func:`_sample`'s; the checks of
    :func:`impl.concurrent.fused.update`, all before anything is written): stale entries dropped, the rest set with atomics
    under the policy's lock held shared (only a rebuild or a Python path excludes it).
    O(n D) atomics."""
    n_valid = min(tickets(ctrl), stamps.shape[0])
    status, pos = tree_kernels.check_batch(indices, values, n_valid)
    if status != STATUS_OK:
        return status, pos, n_valid
    stored, _, pos = tree_kernels.transform(values, eps, alpha, vmax)
    if pos >= 0:
        return tree_kernels.STATUS_OVERFLOW, pos, n_valid
    _leaf_values(stored, leaf32)
    status, rslot = acquire_shared(lctrl, token, lockstats)
    if status != STATUS_OK:
        return status, -1, 0
    n = indices.shape[0]
    keep = np.empty(n, dtype=np.bool_)
    kept = fresh_mask(ctrl, stamps, indices, sampled, use_sampled, keep)
    idx, vals = indices, stored
    if kept < n:
        idx, vals = indices[keep], stored[keep]
    due = False
    if kept:
        set_leaves(kind, sums, mins, lay, K, kshift, idx, vals)
        due = _count(kind, sums, lay, lctrl, lfctrl, leaf32, kept)
    release_shared(lctrl, rslot, token)
    if kept:
        pmax = 0.0
        for b in range(kept):
            pmax = max(pmax, vals[b])
        note_max_atomic(fctrl, pmax)
    if due and not _rebuild(kind, sums, mins, lay, K, state, lctrl, lfctrl, leaf32, token, lockstats):
        return STATUS_BUSY, -1, kept  # the Python path applies the batch again (the same values) and rebuilds
    return STATUS_OK, -1, kept


# ----------------------------------------------------------------------------- entry points
# The calling convention of every shared kernel set (impl.concurrent.context): the context
# words, the tree's sums and mins, the token, the call's own arguments. The policy's control
# block, its float words, whether the leaves are float32 and the object's count of calls
# between checks for dead writers are its extras 0-3 (AtomicDeltas.kernel_extra). Each entry
# point counts itself (a sample once the buffer is not empty), as the shared kernels do, then
# hands the call to the Python path, having done nothing, when a dead writer's repair is due
# (_heal_due).
@njit(nogil=True, cache=True)
def sample(ctx, sums, mins, token, key, beta, octx):
    """A whole lock-free sample (:func:`_sample`) in the shared calling convention."""
    if tickets(cx.vec_i64(ctx, cx.CTRL)) == 0:
        return STATUS_EMPTY
    cx.vec_f64(ctx, cx.LOCKSTATS)[KERNEL_CALLS] += 1
    if _heal_due(cx.vec_i64(ctx, cx.extra(0)), cx.vec_i64(ctx, cx.extra(3)), token):
        return STATUS_BUSY
    return _sample(ctx[cx.KIND], sums, mins, cx.mat_i64(ctx, cx.LAY), ctx[cx.K], ctx[cx.KSHIFT], ctx[cx.TOUCH_FROM],
                   cx.vec_f64(ctx, cx.STATE), cx.vec_i64(ctx, cx.CTRL), cx.vec_f64(ctx, cx.FCTRL),
                   cx.vec_i64(ctx, cx.STAMPS), cx.vec_i64(ctx, cx.extra(0)), cx.vec_f64(ctx, cx.extra(1)),
                   ctx[cx.extra(2)] != 0, token, cx.vec_f64(ctx, cx.LOCKSTATS), ctx[cx.SAMPLE_PROTOCOL],
                   ctx[cx.ROUNDS], key, ctx[cx.STRATIFIED] != 0, beta, cx.vec_u8(ctx, cx.ARENA),
                   cx.mat_i64(octx, cx.SRC_TABLE), cx.vec_u8(octx, cx.OUT), cx.mat_i64(octx, cx.OUT_TABLE),
                   octx[cx.TOUCH_ROWS] != 0, cx.vec_i64(octx, cx.OUT_INDEX), cx.vec_f32(octx, cx.OUT_WEIGHT),
                   cx.vec_i64(octx, cx.OUT_STAMP), cx.vec_f64(octx, cx.SCRATCH))


@njit(nogil=True, cache=True)
def add(ctx, sums, mins, token, values, rows, keep):
    """A whole atomic add (:func:`_add`) in the shared calling convention."""
    cx.vec_f64(ctx, cx.LOCKSTATS)[KERNEL_CALLS] += 1
    if _heal_due(cx.vec_i64(ctx, cx.extra(0)), cx.vec_i64(ctx, cx.extra(3)), token):
        return STATUS_RESERVE, -1, -1  # nothing taken: the Python insert
    return _add(ctx[cx.KIND], sums, mins, cx.mat_i64(ctx, cx.LAY), ctx[cx.K], ctx[cx.KSHIFT], ctx[cx.TOUCH_FROM],
                cx.vec_f64(ctx, cx.STATE), cx.vec_i64(ctx, cx.CTRL), cx.vec_f64(ctx, cx.FCTRL),
                cx.vec_i64(ctx, cx.STAMPS), cx.vec_i64(ctx, cx.extra(0)), cx.vec_f64(ctx, cx.extra(1)),
                ctx[cx.extra(2)] != 0, cx.mat_i64(ctx, cx.WRITERS), ctx[cx.RESUM_EVERY], token,
                cx.vec_f64(ctx, cx.LOCKSTATS), ctx[cx.INSERT_PROTOCOL], ctx[cx.CAPACITY], values,
                cx.f64(ctx, cx.EPS), cx.f64(ctx, cx.ALPHA), cx.f64(ctx, cx.VMAX), cx.vec_u8(ctx, cx.ARENA),
                cx.mat_i64(ctx, cx.TABLE), rows, keep)


@njit(nogil=True, cache=True)
def update(ctx, sums, mins, token, indices, values, sampled, use_sampled):
    """A whole atomic update (:func:`_update`) in the shared calling convention."""
    cx.vec_f64(ctx, cx.LOCKSTATS)[KERNEL_CALLS] += 1
    if _heal_due(cx.vec_i64(ctx, cx.extra(0)), cx.vec_i64(ctx, cx.extra(3)), token):
        return STATUS_BUSY, -1, 0
    return _update(ctx[cx.KIND], sums, mins, cx.mat_i64(ctx, cx.LAY), ctx[cx.K], ctx[cx.KSHIFT], ctx[cx.TOUCH_FROM],
                   cx.vec_f64(ctx, cx.STATE), cx.vec_i64(ctx, cx.CTRL), cx.vec_f64(ctx, cx.FCTRL),
                   cx.vec_i64(ctx, cx.STAMPS), cx.vec_i64(ctx, cx.extra(0)), cx.vec_f64(ctx, cx.extra(1)),
                   ctx[cx.extra(2)] != 0, ctx[cx.RESUM_EVERY], token, cx.vec_f64(ctx, cx.LOCKSTATS), indices,
                   values, sampled, use_sampled, cx.f64(ctx, cx.EPS), cx.f64(ctx, cx.ALPHA), cx.f64(ctx, cx.VMAX))


# ----------------------------------------------------------------------------- the policy
@register
class AtomicDeltas(Policy):
    """One tree, float64, written with atomics by every writer at once; samples take no lock.

    * **Tree**: the variant's layout with float64 sums and minima
      (:meth:`impl.trees.ArraySumTree.widened`); a leaf holds its priority rounded to the
      variant's dtype, so the leaves are the values the variant's own tree would hold.
    * **Update**: checked and transformed first; then, under the policy's lock held *shared*
      (it excludes only the exact rebuild and the Python paths, never another writer or a
      sampler): stale entries dropped by stamp, leaves set by atomic exchange, each node's
      share of the batch's deltas summed and added with one atomic float add, minima settled
      by compare-and-swap (:mod:`impl.concurrent.deltas`).
    * **Insert**: no lock. An in-flight record claimed by compare-and-swap, the tickets taken
      with one atomic add, the record completed, a check that no writer a lap behind still
      writes the slots (else the tickets are given up and the call waits for it, or voids a
      dead one), stamps -1 (:func:`impl.concurrent.ring.reserve_unlocked`: O(MAX_WRITERS + n),
      the ticket the one word every insert writes), which keep draws off the slots while they
      are written (their leaves keep the old rows' priorities until then, and a draw that
      reaches one is drawn again: not set to 0 first, which doubled an insert's tree atomics
      and the lines two actors share); the copy; the priorities set with atomics and the
      stamps published; the record cleared.
    * **Sample**: no lock. One descent of the tree as it is read, clamped below the root total
      read once; a draw that overshoots its leaf (a node on its path lags a decrease), or
      reaches a leaf that is 0 or a slot being written (stamp -1), is drawn again; rows
      copied and stamp-checked (seqlock).

    What a sampler may see: **stale by at most one batch** per writer in flight. Each write
    is a leaf exchange followed by its deltas reaching the ancestors; a descent that runs
    beside it reads every node it passes once, each holding the sum of its leaves up to the
    deltas of the batches in flight not yet added. So a draw follows the tree as of the
    batches that have returned, except inside the subtrees an in-flight batch touches: there
    it reaches the leaves as they are now, within the smaller of the subtree's mass before and
    after the batch (a draw that overshoots a subtree whose decrease is in flight is drawn
    again, the rest of the tree keeping ``P(i)`` proportional to ``p_i``); a sample made with
    no writer in flight is exact (``P(i) = p_i / total``, up to the drift
    bound below). Never a slot being written, a torn row, or a zero leaf. ``p_min`` is the root
    minimum read after the draw, lowered to the smallest priority drawn, so no weight
    exceeds 1 (tests/test_concurrency_atomic.py checks both statements).

    Drift: every atomic add rounds (float64), so the root drifts from the exact sum of its
    leaves by at most :func:`drift_bound` (``(D + 3) m 2**-53 T_max`` after ``m`` changes); once
    that bound passes the tolerance (:data:`DRIFT_TOLERANCE_F32` for float32 leaves,
    :data:`DRIFT_TOLERANCE` for float64 ones) of the current total, the writer that sees it
    rebuilds the inner nodes exactly from the leaves, under the policy's lock held
    exclusively. The buffer's ``resum_every`` (a float32 tree's period) does not apply. The
    kernels' ``resum_every`` argument is kept for the shared call shape and not read.

    An update racing with inserts that lap its slot within the call (the ring coming round a
    whole capacity between its stamp check and its exchange) may land on the new row, as an
    update without stamps would.

    Crash recovery: an insert that dies with its record whole is voided as under every policy
    (its slots' priority 0 and stamps -1, the tree rebuilt) by the next call that needs a
    record or waits for it, or by a repair (below); one that dies before (its tickets taken or
    not) leaves its slots as they were. A writer that dies inside a tree write (an update's,
    or an insert's publish) may leave leaves exchanged whose deltas never arrived (the root
    short of, or over, those changes; minima not settled) and its token in a reader word of
    the policy's lock: its *mark*, set before its first leaf exchange and cleared after its
    last delta. Each buffer object checks for dead marks on its first kernel call and every
    :data:`HEAL_EVERY` calls after (:func:`_heal_due`: the lock word and the reader words
    read, and for each one another process holds, ``kill(pid, 0)`` and ``waitid`` for an
    exited child; the other calls read one word, the heal word, and count). A dead mark sends
    the call to the Python path (:meth:`_heal`): the death confirmed against /proc, the heal
    word set (from then on every call of every object goes to the Python path and waits for
    the repair instead of relying on the sums), the mark cleared, then under the ring lock and
    the policy's lock held exclusively the dead inserts' records voided and the inner nodes
    rebuilt exactly from the leaves (whole words), one recovery counted per dead writer, the
    heal word cleared. So a dead writer's batch is repaired before the ``HEAL_EVERY``-th call
    of any object after its death relies on the sums (an object attached after it: its
    first); until then samples are stale by that one batch, as beside a live writer. A
    holder of the lock itself that dies (in a drift rebuild, a repair, a Python path) is taken
    over by the lock's wait, which rebuilds the same way. Limits: in the kernels a zombie
    counts as dead only for its parent (``waitid``; others see it once reaped, the Python
    paths at once), and a live writer of another user (``kill`` refused) sends the checking
    call to the Python path, which finds it alive and goes on.

    Locks: ring lock, then the policy's lock; the kernels take the policy's lock alone (shared,
    or exclusively for a rebuild). The Python paths (a lock held past a kernel's spins, a
    sample that keeps meeting slots being written, recovery) hold the ring lock and the
    policy's lock exclusively, and may sleep and recover dead holders. Lock hold time counts
    the exclusive holds: the shared ones exclude no other worker.
    """

    name = "atomic-deltas"
    fused_sample = 0  # its own kernels (above); the protocol code is not read by them
    fused_insert = 0
    fused_update = True
    draws_as_one_tree = False  # one descent, but of float64 sums: indices may differ at the float32 tree's ties
    kernels = SimpleNamespace(sample=sample, add=add, update=update)

    @classmethod
    def tree_for(cls, tree, make_tree, capacity: int, shards: int):
        return tree.widened()

    @classmethod
    def check_structure(cls, tree) -> None:
        if not hasattr(tree, "widened"):
            raise NotImplementedError(f"policy {cls.name!r} cannot wrap {type(tree).__name__}: it needs an array tree "
                                      "with float64 inner nodes (ArraySumTree.widened)")

    @classmethod
    def shared_arrays(cls, capacity: int, shards: int) -> dict:
        return {"ctrl": ((_CONTROL_WORDS,), np.int64), "fctrl": ((4,), np.float64)}

    def __init__(self, parts):
        super().__init__(parts)
        self._lctrl, self._lfctrl = parts.arrays["ctrl"], parts.arrays["fctrl"]
        self._leaf32 = self.tree.leaf_dtype == np.float32
        self.tree_writes = SharedLock(self._lctrl, TREE_LOCK, "tree writes", on_recover=self._recover_writes,
                                      timeout=parts.tree_lock.timeout,
                                      readers=range(READERS_AT, READERS_AT + MAX_READERS),
                                      on_dead_reader=self._recover_readers)
        self._calls = np.zeros(1, dtype=np.int64)  # this object's calls, for its checks for dead writers (_heal_due)

    def kernel_extra(self) -> tuple:
        return (self._lctrl, self._lfctrl, int(self._leaf32), self._calls)

    def counters(self) -> dict:
        total = self.ring.counters()
        for name, value in counters_of(self._lctrl).items():
            total[name] += value
        return total

    # ------------------------------------------------------------------ the Python paths
    def _stored(self, vals, n: int) -> tuple[np.ndarray, float]:
        """Stored priorities of raw ``vals`` (None: the max priority), rounded to the leaves'
        precision, and the largest before rounding (what the max priority follows)."""
        if vals is None:
            p = np.full(n, self.ring.max_priority)
        else:
            v = np.asarray(vals, dtype=np.float64) + self.eps
            p = v if self.alpha == 1.0 else v ** self.alpha
        pmax = float(p.max()) if p.size else 0.0
        return (p.astype(np.float32).astype(np.float64) if self._leaf32 else p), pmax

    def _count(self, n: int) -> None:
        """Held exclusively: count ``n`` changes and rebuild at once if due."""
        kind, sums, mins, lay, K, _, _, state = self.tree.kernel_args
        total = self.tree.total()
        since, t_max = note_changes_atomic(self._lctrl, self._lfctrl, n, total)
        if rebuild_due(since, t_max, total, int(depth(kind, lay)), self._leaf32):
            self.tree.rebuild()
            note_rebuild(self._lctrl, self._lfctrl, self.tree.total())

    def select(self, n: int, rng) -> Selection:
        self._heal()
        return self.select_published(n, rng, lambda: self.tree_writes, 32)

    def insert(self, arrays, n, vals) -> int:
        self._heal()
        res = self._reserve(n)
        self.storage.write(res.first % self.ring.capacity, arrays, n)
        with self.tree_writes:
            self._set_new(res.first, n, vals)
            self.ring.publish(res, n)
        return res.first

    def _reserve(self, n: int) -> Reservation:
        """Tickets for ``n`` rows as the kernel takes them (:func:`reserve_unlocked`, no lock);
        when no record is free or a writer a lap behind is still in flight: dead writers voided
        (under the locks), a live one waited for. RuntimeError when every record is held by a
        live writer."""
        token = my_token()
        writers = self.ring.arrays["writers"]
        backoff = Backoff(self.tree_lock.timeout)
        while True:
            t0, row, blocker = reserve_unlocked(self.ring.control, writers, self.ring.arrays["stamps"], n, token,
                                                self.ring.capacity)
            if row >= 0:
                return Reservation(int(t0), int(row), 0)
            if blocker >= 0:  # a writer a lap behind: wait for it while it lives
                holder = int(writers[blocker, 0])
                if holder == 0:
                    continue  # it has finished
                if pid_alive(token_pid(holder)):
                    backoff.pause(lambda waited: f"insert of {n} rows waited {waited:.3g} s for ring slots still "
                                                 f"being written by pid {token_pid(holder)} (token {holder}), which "
                                                 "is alive but not progressing")
                    continue
            with self.tree_lock, self.tree_writes:  # voiding writes leaves and rebuilds
                voided = self.ring.void_dead_writers()
            if blocker < 0 and not voided and np.all(writers[:, 0] != 0):
                raise RuntimeError(f"more than {MAX_WRITERS} inserts in flight at once")

    def finish_insert(self, res: Reservation, n: int, vals) -> None:
        self._heal()
        super().finish_insert(res, n, vals)

    def set_new_priorities(self, first: int, n: int, vals) -> None:
        with self.tree_writes:
            self._set_new(first, n, vals)

    def _write(self, idx: np.ndarray, p: np.ndarray) -> None:
        """Held shared or exclusively: leaves ``idx`` set to stored priorities ``p`` by the
        kernels' own write (:func:`impl.concurrent.deltas.set_leaves`), never the tree's, whose
        minima read the leaves' min slots, which this policy does not keep."""
        kind, sums, mins, lay, K, kshift = self.tree.kernel_args[:6]
        set_leaves(kind, sums, mins, lay, K, kshift, idx, p)

    def _set_new(self, first: int, n: int, vals) -> None:
        p, pmax = self._stored(vals, n)
        self._write(self.ring.slots(first, n), p)
        if vals is not None:
            self.ring.note_max(pmax)
        self._count(n)

    def update(self, idx, vals, stamps) -> int:
        self._heal()
        with self.tree_writes:
            keep = self.ring.fresh(idx, stamps)
            idx, vals = idx[keep], vals[keep]
            if idx.size:
                p, pmax = self._stored(vals, idx.size)
                self._write(idx, p)  # idx checked by the buffer against the rows inserted
                self.ring.note_max(pmax)
                self._count(idx.size)
        return int(idx.size)

    def read_priorities(self, idx) -> np.ndarray:
        return self.tree.get(idx)  # each leaf is one aligned word: never torn, no lock needed

    # ------------------------------------------------------------------ recovery
    def _heal(self) -> None:
        """Every Python path first (the kernels send a call here when their check finds a dead
        writer, :func:`_heal_due`): the reader words of writers whose process died (checked
        against /proc: a zombie is dead) are found; the heal word is set, so every call waits
        here instead of relying on the sums meanwhile; the words are cleared (one
        compare-and-swap each: of several processes that found one, one clears it and counts
        it); then, under the ring lock and the policy's lock held exclusively (every live
        writer drained), dead inserts' records are voided and the inner nodes rebuilt exactly
        from the leaves (whole words), and the heal word cleared. A heal word found set with no
        dead word left (its finder's repair under way, or that process dead too) is waited for,
        and repaired here if still set. A dead holder of the lock word itself is taken over by
        the lock (:meth:`_recover_writes`). Cost with nothing dead: 32 loads and a pid check
        per word another process holds; the repair O(capacity)."""
        lock, lctrl = self.tree_writes, self._lctrl
        dead = lock.dead_readers()
        if dead:
            exchange(lctrl, HEAL, 1)
        cleared = [token for word, token in dead if lock.clear_reader(word, token)]
        if not cleared and load(lctrl, HEAL) == 0:
            return
        with self.tree_lock, lock:
            self.ring.void_dead_writers()  # a dead insert's slots (written in part, or not at all) to 0
            if cleared or load(lctrl, HEAL) != 0:
                self._repair(len(cleared))

    def _repair(self, dead_writers: int) -> None:
        """Held exclusively: the inner nodes rebuilt from the leaves (whole words, whatever the dead
        writers left half done), the drift count restarted, ``dead_writers`` recoveries counted,
        the heal word cleared. O(capacity)."""
        for _ in range(dead_writers):
            note_recovery(self._lctrl)
        self.tree.rebuild()
        note_rebuild(self._lctrl, self._lfctrl, self.tree.total())
        exchange(self._lctrl, HEAL, 0)

    def recover(self, dead_token: int) -> None:
        with self.tree_writes:  # voiding writes leaves and rebuilds
            self.ring.recover(dead_token)

    def _recover_readers(self, dead_tokens: list) -> None:
        """Held exclusively, every reader drained (the lock's own wait found these dead ones):
        writers that died holding the lock shared may have exchanged leaves whose deltas never
        reached the inner nodes; the leaves are whole words, so the inner nodes are rebuilt
        from them (:meth:`_repair`)."""
        self._repair(len(dead_tokens))

    def _recover_writes(self, dead_token: int) -> None:
        """The policy's lock was held exclusively by a process that died (in a rebuild, a repair or
        a Python path's tree write): its leaves are whole words, so the inner nodes are rebuilt
        from them (:meth:`_repair`)."""
        self._repair(1)
