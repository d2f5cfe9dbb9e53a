"""sharded: S sub-trees, each with its own lock; samples split by one multinomial draw."""

from __future__ import annotations

from contextlib import contextmanager, ExitStack
from functools import partial
from types import SimpleNamespace

import numpy as np
from numba import njit

from ... import fused_ops as fo
from ...storage import gather_rows, write_rows
from ...trees import kernels as tree_kernels
from ...trees import ops
from .. import context as cx
from ..atomics import acquire_fence, atomic_cas
from ..fused import (KERNEL_CALLS, MAX_CHANGED_ROUNDS, STATUS_BUSY, STATUS_CHANGING, STATUS_EMPTY, STATUS_NO_MASS,
                     STATUS_OK, STATUS_PUBLISH_BUSY, STATUS_RESERVE, acquire, acquire_shared, changed_rows,
                     copy_redrawn, release, release_shared)
from ..locks import SharedLock, my_token, pid_alive, token_pid
from ..policy import Backoff, Policy, Selection, register
from ..ring import (MAX_READERS, READERS_AT, TREE_LOCK, Reservation, count_changes, counters_of, fresh_mask,
                    max_priority, note_max_atomic, note_rebuild, note_recovery, release_record, reserve_slots,
                    tickets)
from ..shards import BLOCK, ShardedTree, global_of, local_of, shard_geometry, shard_of

__all__ = ["Sharded", "DEFAULT_SHARDS", "MAX_SHARDS", "SHARD_ROUNDS"]

DEFAULT_SHARDS = 16  # one per worker up to 16 workers; a sample of 256 still descends 16 rows a shard
MAX_SHARDS = 64
#: Redraw rounds, inside one shard's shared hold, of positions that reached a slot being written
#: (stamp -1) or a zero leaf, before the call goes to the Python path (which waits and rebuilds).
SHARD_ROUNDS = 32
_CONTROL_WORDS = READERS_AT + MAX_READERS  # a shard's control block is laid out as the ring's


# ----------------------------------------------------------------------------- kernels
@njit(nogil=True, cache=True, inline="always")
def _subkey(key, tag):
    """A stream of its own for round ``tag`` of the call with stream ``key``."""
    return np.int64(fo.uniform01(key, (1 << 40) + tag) * 4.0e18)


@njit(nogil=True, cache=True, inline="always")
def _shard_leaves(capacity, S, B):
    blocks = (capacity + B - 1) // B
    return ((blocks + S - 1) // S) * B


@njit(nogil=True, cache=True)
def _group(shard, S):
    """Counting sort of positions by shard: ``(order, start)``, shard ``s``'s positions being
    ``order[start[s]:start[s + 1]]`` in their original order. O(n + S)."""
    n = shard.shape[0]
    start = np.zeros(S + 1, dtype=np.int64)
    for b in range(n):
        start[shard[b] + 1] += 1
    for s in range(S):
        start[s + 1] += start[s]
    fill = start[:S].copy()
    order = np.empty(n, dtype=np.int64)
    for b in range(n):
        s = shard[b]
        order[fill[s]] = b
        fill[s] += 1
    return order, start


@njit(nogil=True, cache=True)
def _draw_in_shard(kind, sums, lay, K, touch_from, stamps, S, B, s, key, pos, frac, t_snap, out_index, prio,
                   out_stamp, ratio):
    """Under shard ``s``'s lock held shared: positions ``pos`` descend the shard at mass
    ``frac * total now``; a position that reaches a zero leaf or a slot being written (stamp
    -1, read once) is drawn again inside the shard, up to :data:`SHARD_ROUNDS` rounds (else
    STATUS_BUSY). ``ratio``: the snapshot's total of the shard over its total now (1 when it
    did not change), the factor between the draw's true probability and ``p_i / total``."""
    m = pos.shape[0]
    t_now = np.float64(sums[lay[0, 0]])
    if not t_now > 0.0:
        return STATUS_NO_MASS
    cap = stamps.shape[0]
    r = t_snap / t_now
    u = np.empty(m)
    j = np.empty(m, dtype=np.int64)
    p = np.empty(m)
    for k in range(m):
        u[k] = frac[pos[k]] * t_now
    ops.descend(kind, sums, lay, K, touch_from, u, j)
    ops.read_leaves(kind, sums, lay, touch_from, j, p)
    todo = np.arange(m)  # the entries of j / p still to check
    left = m
    for rnd in range(SHARD_ROUNDS):
        bad = 0
        for q in range(left):
            k = todo[q]
            g = global_of(s, j[k], S, B) if j[k] >= 0 else -1
            st = stamps[g] if 0 <= g < cap else -1  # read once; trusted only when >= 0
            if p[k] > 0.0 and st >= 0:
                b = pos[k]
                out_index[b], prio[b], out_stamp[b], ratio[b] = g, p[k], st, r
            else:
                todo[bad] = k
                bad += 1
        if bad == 0:
            return STATUS_OK
        left = bad
        uu = np.empty(bad)
        jj = np.empty(bad, dtype=np.int64)
        pp = np.empty(bad)
        for q in range(bad):
            uu[q] = fo.uniform01(key, (2 + rnd) * m + todo[q]) * t_now
        ops.descend(kind, sums, lay, K, touch_from, uu, jj)
        ops.read_leaves(kind, sums, lay, touch_from, jj, pp)
        for q in range(bad):
            j[todo[q]], p[todo[q]] = jj[q], pp[q]
    return STATUS_BUSY


@njit(nogil=True, cache=True)
def _draw(kind, sums, mins, lay, K, touch_from, stamps, S, B, sctrl, token, lockstats, key, stratified,
          out_index, prio, out_stamp, ratio):
    """Positions ``0 .. n-1`` drawn: ``(status, p_min)``.

    The snapshot: each shard's root total and minimum, one aligned load each (a value that
    node really held). One multinomial draw on those totals: position ``b``'s mass (uniform,
    or stratified over the whole total) picks the shard whose range holds it and keeps its
    place in that range as a fraction. Then each shard with positions is descended once, under
    its lock held shared (:func:`_draw_in_shard`). ``p_min``: the smallest shard minimum of the
    snapshot."""
    n = out_index.shape[0]
    root = lay[0, 0]
    tot = np.empty(S)
    total = 0.0
    pmin = np.inf
    for s in range(S):
        t = np.float64(sums[s, root])
        tot[s] = t if t > 0.0 else 0.0
        total += tot[s]
        pmin = min(pmin, np.float64(mins[s, root]))
    if not total > 0.0:
        return STATUS_NO_MASS, -1.0
    shard = np.empty(n, dtype=np.int64)
    frac = np.empty(n)
    below_one = 1.0 - 2.0**-53
    for b in range(n):
        u = fo.mass(key, b, b, n, total, stratified)
        acc = 0.0
        last = -1
        pick = -1
        for s in range(S):
            if tot[s] > 0.0:
                last = s
                if u < acc + tot[s]:
                    pick = s
                    break
                acc += tot[s]
        if pick < 0:  # rounding put u at or past the summed totals: the top of the last shard with mass
            pick = last
            acc -= tot[last]
        shard[b] = pick
        frac[b] = min(max((u - acc) / tot[pick], 0.0), below_one)
    order, start = _group(shard, S)
    for s in range(S):
        if start[s + 1] == start[s]:
            continue
        ctrl = sctrl[s]
        status, slot = acquire_shared(ctrl, token, lockstats)
        if status != STATUS_OK:
            return status, -1.0
        status = _draw_in_shard(kind, sums[s], lay, K, touch_from, stamps, S, B, s, _subkey(key, s),
                                order[start[s]:start[s + 1]], frac, tot[s], out_index, prio, out_stamp, ratio)
        release_shared(ctrl, slot, token)
        if status != STATUS_OK:
            return status, -1.0
    return STATUS_OK, pmin


@njit(nogil=True, cache=True)
def _sample(kind, sums, mins, lay, K, kshift, touch_from, state, ctrl, fctrl, stamps, S, B, sctrl, sfctrl, token,
           lockstats, protocol, rounds, key, stratified, beta, arena, table, out, out_table, touch_rows, out_index,
           out_weight, out_stamp, scratch):
    """One whole sharded ``sample`` (unpacked by :func:`sample`): the draw (:func:`_draw`), the copy with no
    lock, the seqlock check that redraws rows whose stamp changed during the copy, and the
    weights ``(p_i r_i / p_min) ** -beta`` with ``r_i`` the shard's snapshot total over its
    total at the descent, so that the weight follows the draw's true probability
    ``(T_s / T) (p_i / T_s now)``. O(S + n K D + n row bytes)."""
    if tickets(ctrl) == 0:
        return STATUS_EMPTY
    n = out_index.shape[0]
    ratio = np.empty(n)
    status, pmin = _draw(kind, sums, mins, lay, K, touch_from, stamps, S, B, sctrl, token, lockstats, key,
                         stratified, out_index, scratch, out_stamp, ratio)
    if status != STATUS_OK:
        return status
    if not 0.0 < pmin < np.inf:
        return STATUS_NO_MASS
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
        ra = np.empty(changed)
        status, _ = _draw(kind, sums, mins, lay, K, touch_from, stamps, S, B, sctrl, token, lockstats,
                          _subkey(key, (1 << 20) + r), stratified, j, p, st, ra)
        if status != STATUS_OK:
            return status
        for k in range(changed):
            scratch[pos[k]], ratio[pos[k]] = p[k], ra[k]
        copy_redrawn(arena, table, out, out_table, pos, j, st, out_index, out_stamp)
    if not clean:
        return STATUS_CHANGING
    for b in range(n):
        out_weight[b] = (scratch[b] * ratio[b] / pmin) ** -beta
    if n > 0:
        out_weight[0] += 0.0 * touched  # keeps the touch passes' loads (see impl.fused.sample)
    return STATUS_OK


@njit(nogil=True, cache=True)
def _publish(kind, sums, mins, lay, K, kshift, touch_from, state, fctrl, stamps, S, B, sctrl, sfctrl, token,
             lockstats, resum_every, t0, keep, values, eps, alpha, vmax):
    """Tickets ``t0 ..`` (``keep``, copied) get their priorities and their stamps, one shard at a
    time under its lock: ``values`` (raw, checked) or, empty, the max priority. STATUS_BUSY
    when a shard's lock stays held (the shards before it are published; a repeat is
    idempotent)."""
    cap = stamps.shape[0]
    leaves = _shard_leaves(cap, S, B)
    shard = np.empty(keep, dtype=np.int64)
    for k in range(keep):
        shard[k] = shard_of((t0 + k) % cap, S, B)
    order, start = _group(shard, S)
    pmax_all = max_priority(fctrl)
    for s in range(S):
        a, e = start[s], start[s + 1]
        if a == e:
            continue
        sc = sctrl[s]
        status, _ = acquire(sc, TREE_LOCK, token, lockstats)
        if status != STATUS_OK:
            return status
        if values.shape[0] == 0:
            # runs of consecutive leaves (a block's slots are consecutive in its shard): one fill each
            q = a
            while q < e:
                first = local_of((t0 + order[q]) % cap, S, B)
                run = 1
                while q + run < e and local_of((t0 + order[q + run]) % cap, S, B) == first + run:
                    run += 1
                ops.fill(kind, sums[s], mins[s], lay, K, kshift, touch_from, state[s], first, run, leaves, pmax_all)
                q += run
        else:
            j = np.empty(e - a, dtype=np.int64)
            v = np.empty(e - a)
            for q in range(a, e):
                j[q - a] = local_of((t0 + order[q]) % cap, S, B)
                v[q - a] = values[order[q]]
            _, _, pmax = ops.update(kind, sums[s], mins[s], lay, K, kshift, touch_from, state[s], j, v, leaves, eps,
                                    alpha, vmax)
            note_max_atomic(fctrl, pmax)
        count_changes(kind, sums[s], mins[s], lay, K, state[s], sc, sfctrl[s], resum_every, e - a)
        for q in range(a, e):
            t = t0 + order[q]
            stamps[t % cap] = t
        atomic_cas(sc, TREE_LOCK, token, 0)  # seq_cst: the leaves and stamps are visible before the word
    return STATUS_OK


@njit(nogil=True, cache=True)
def _add(kind, sums, mins, lay, K, kshift, touch_from, state, ctrl, fctrl, stamps, S, B, sctrl, sfctrl, writers,
        resum_every, token, lockstats, protocol, capacity, values, eps, alpha, vmax, arena, table, rows, keep):
    """One whole sharded ``add`` (unpacked by :func:`add`): reserve under
    the ring lock (the tree lock word: tickets, stamps -1, the in-flight record; O(MAX_WRITERS
    + n), the only section every writer shares), copy with no lock, then per shard set the
    priorities and stamps under the shard's lock, and clear the in-flight record. Slots being
    written keep their old priority until then; samples skip them by their stamp (-1).
    Returns ``(status, first ticket, in-flight row)`` as the fused add."""
    status, taken = acquire(ctrl, TREE_LOCK, token, lockstats)
    if status != STATUS_OK:
        return status, -1, -1
    t0, row, _ = reserve_slots(ctrl, writers, stamps, keep, token, capacity, True)
    release(ctrl, TREE_LOCK, token, lockstats, taken)
    if row < 0:
        return STATUS_RESERVE, -1, -1
    write_rows(arena, table, t0 % capacity, capacity, rows, keep)
    status = _publish(kind, sums, mins, lay, K, kshift, touch_from, state, fctrl, stamps, S, B, sctrl, sfctrl, token,
                      lockstats, resum_every, t0, keep, values, eps, alpha, vmax)
    if status != STATUS_OK:
        return STATUS_PUBLISH_BUSY, t0, row
    atomic_cas(writers[row], 0, token, 0)  # the record is this writer's own: no lock
    return STATUS_OK, t0, row


@njit(nogil=True, cache=True)
def _update(kind, sums, mins, lay, K, kshift, touch_from, state, ctrl, fctrl, stamps, S, B, sctrl, sfctrl,
           resum_every, token, lockstats, indices, values, sampled, use_sampled, eps, alpha, vmax):
    """One whole sharded ``update_priorities`` (unpacked by :func:`update`; the fused update's
    checks, all before any lock): the entries grouped by shard, and each group
    written under its own shard's lock only (stale entries dropped there, counted in the
    shard's block). STATUS_BUSY when a shard's lock stays held: the Python path then applies
    the whole batch again (the groups already written get the same values). O(n D + S)."""
    cap = stamps.shape[0]
    n_valid = min(tickets(ctrl), cap)
    status, pos = tree_kernels.check_batch(indices, values, n_valid)
    if status != STATUS_OK:
        return status, pos, n_valid
    stored, _, pos = tree_kernels.transform(values, eps, alpha, vmax)
    if pos >= 0:
        return tree_kernels.STATUS_OVERFLOW, pos, n_valid
    n = indices.shape[0]
    leaves = _shard_leaves(cap, S, B)
    shard = np.empty(n, dtype=np.int64)
    for b in range(n):
        shard[b] = shard_of(indices[b], S, B)
    order, start = _group(shard, S)
    g = np.empty(n, dtype=np.int64)
    smp = np.empty(n if use_sampled else 0, dtype=np.int64)
    j = np.empty(n, dtype=np.int64)
    v = np.empty(n)
    keep = np.empty(n, dtype=np.bool_)
    applied = 0
    for s in range(S):
        a, e = start[s], start[s + 1]
        m = e - a
        if m == 0:
            continue
        for q in range(m):
            b = order[a + q]
            g[q] = indices[b]
            v[q] = stored[b]
            if use_sampled:
                smp[q] = sampled[b]
        sc = sctrl[s]
        status, _ = acquire(sc, TREE_LOCK, token, lockstats)
        if status != STATUS_OK:
            return status, -1, applied
        sm = smp[:m] if use_sampled else smp[:0]
        kept = fresh_mask(sc, stamps, g[:m], sm, use_sampled, keep[:m])
        c = 0
        for q in range(m):
            if keep[q]:
                j[c] = local_of(g[q], S, B)
                v[c] = v[q]
                c += 1
        if c:
            _, _, pmax = ops.update(kind, sums[s], mins[s], lay, K, kshift, touch_from, state[s], j[:c], v[:c],
                                    leaves, 0.0, 1.0, vmax)
            note_max_atomic(fctrl, pmax)
            count_changes(kind, sums[s], mins[s], lay, K, state[s], sc, sfctrl[s], resum_every, c)
        atomic_cas(sc, TREE_LOCK, token, 0)
        applied += kept
    return STATUS_OK, -1, applied


# ----------------------------------------------------------------------------- entry points
# The calling convention of every shared kernel set (impl.concurrent.context): the context
# words, the stacked trees' sums and mins, the token, the call's own arguments. The shard
# count, block and the shards' control blocks are the policy's extras 0-3 (Sharded.kernel_extra).
@njit(nogil=True, cache=True)
def sample(ctx, sums, mins, token, key, beta, octx):
    """A whole sharded sample (:func:`_sample`) in the shared calling convention."""
    if tickets(cx.vec_i64(ctx, cx.CTRL)) == 0:
        return STATUS_EMPTY
    cx.vec_f64(ctx, cx.LOCKSTATS)[KERNEL_CALLS] += 1
    return _sample(ctx[cx.KIND], sums, mins, cx.mat_i64(ctx, cx.LAY), ctx[cx.K], ctx[cx.KSHIFT], ctx[cx.TOUCH_FROM],
                   cx.mat_f64(ctx, cx.STATE), cx.vec_i64(ctx, cx.CTRL), cx.vec_f64(ctx, cx.FCTRL),
                   cx.vec_i64(ctx, cx.STAMPS), ctx[cx.extra(0)], ctx[cx.extra(1)], cx.mat_i64(ctx, cx.extra(2)),
                   cx.mat_f64(ctx, cx.extra(3)), token, cx.vec_f64(ctx, cx.LOCKSTATS), ctx[cx.SAMPLE_PROTOCOL],
                   ctx[cx.ROUNDS], key, ctx[cx.STRATIFIED] != 0, beta, cx.vec_u8(ctx, cx.ARENA),
                   cx.mat_i64(octx, cx.SRC_TABLE), cx.vec_u8(octx, cx.OUT), cx.mat_i64(octx, cx.OUT_TABLE),
                   octx[cx.TOUCH_ROWS] != 0, cx.vec_i64(octx, cx.OUT_INDEX), cx.vec_f32(octx, cx.OUT_WEIGHT),
                   cx.vec_i64(octx, cx.OUT_STAMP), cx.vec_f64(octx, cx.SCRATCH))


@njit(nogil=True, cache=True)
def add(ctx, sums, mins, token, values, rows, keep):
    """A whole sharded add (:func:`_add`) in the shared calling convention."""
    cx.vec_f64(ctx, cx.LOCKSTATS)[KERNEL_CALLS] += 1
    return _add(ctx[cx.KIND], sums, mins, cx.mat_i64(ctx, cx.LAY), ctx[cx.K], ctx[cx.KSHIFT], ctx[cx.TOUCH_FROM],
                cx.mat_f64(ctx, cx.STATE), cx.vec_i64(ctx, cx.CTRL), cx.vec_f64(ctx, cx.FCTRL),
                cx.vec_i64(ctx, cx.STAMPS), ctx[cx.extra(0)], ctx[cx.extra(1)], cx.mat_i64(ctx, cx.extra(2)),
                cx.mat_f64(ctx, cx.extra(3)), cx.mat_i64(ctx, cx.WRITERS), ctx[cx.RESUM_EVERY], token,
                cx.vec_f64(ctx, cx.LOCKSTATS), ctx[cx.INSERT_PROTOCOL], ctx[cx.CAPACITY], values,
                cx.f64(ctx, cx.EPS), cx.f64(ctx, cx.ALPHA), cx.f64(ctx, cx.VMAX), cx.vec_u8(ctx, cx.ARENA),
                cx.mat_i64(ctx, cx.TABLE), rows, keep)


@njit(nogil=True, cache=True)
def update(ctx, sums, mins, token, indices, values, sampled, use_sampled):
    """A whole sharded update (:func:`_update`) in the shared calling convention."""
    cx.vec_f64(ctx, cx.LOCKSTATS)[KERNEL_CALLS] += 1
    return _update(ctx[cx.KIND], sums, mins, cx.mat_i64(ctx, cx.LAY), ctx[cx.K], ctx[cx.KSHIFT], ctx[cx.TOUCH_FROM],
                   cx.mat_f64(ctx, cx.STATE), cx.vec_i64(ctx, cx.CTRL), cx.vec_f64(ctx, cx.FCTRL),
                   cx.vec_i64(ctx, cx.STAMPS), ctx[cx.extra(0)], ctx[cx.extra(1)], cx.mat_i64(ctx, cx.extra(2)),
                   cx.mat_f64(ctx, cx.extra(3)), ctx[cx.RESUM_EVERY], token, cx.vec_f64(ctx, cx.LOCKSTATS), indices,
                   values, sampled, use_sampled, cx.f64(ctx, cx.EPS), cx.f64(ctx, cx.ALPHA), cx.f64(ctx, cx.VMAX))


# ----------------------------------------------------------------------------- the policy
@register
class Sharded(Policy):
    """S sub-trees, each with its own lock, over one ring (:mod:`impl.concurrent.shards`:
    ring slots dealt to shards in blocks of :data:`~impl.concurrent.shards.BLOCK`).

    * **Sample**: one snapshot of the S shard totals (one aligned load each), one multinomial
      draw of the batch on them (exact for that snapshot), then one descent per shard with
      positions, each under that shard's lock held *shared* (writers of that shard wait; no
      other shard is held). Rows are copied with no lock and stamp-checked (seqlock), as
      lazy-writing's.
    * **Insert**: tickets, stamps -1 and the in-flight record under the ring lock (the tree
      lock word: the one section every insert shares, O(MAX_WRITERS + n) and no tree work);
      the data copy with no lock; then each shard of the batch's slots gets their priorities
      and stamps under its own lock (a ``B``-row batch: one shard, round robin over inserts).
    * **Update**: the entries grouped by shard; each group under its shard's lock only.

    What a sampler may see: **snapshot-exact per shard**. The split of a batch across shards
    is exact for the totals at the snapshot; each shard's descent is exact for that shard's
    tree at the moment of its descent (a writer of that shard is excluded while it draws).
    When no shard changed between the snapshot and its descent (one thread, or no writer in
    between), ``P(i) = p_i / total`` exactly. Otherwise the draw's true probability is
    ``(T_s / T) * (p_i / T_s')`` (``T_s`` the shard's snapshot total, ``T_s'`` its total at
    the descent), and the weight uses it: ``(p_i * T_s / T_s' / p_min) ** -beta`` with ``p_min``
    the smallest shard minimum of the snapshot (a minimum one update old at most). Slots
    being written (stamp -1) are never returned: a position that reaches one is drawn again
    inside its shard. A sample never holds two shard locks, nor the ring lock.

    Locks: ring lock, then shard locks in ascending order; the kernels hold one at a time.
    A lock held past a kernel's spins sends the call to Python at the kernel's grain: an
    update writes its groups one shard lock at a time (:meth:`update`); an insert reserves
    under the ring lock alone and publishes one shard lock at a time (:meth:`finish_insert`);
    a sample waits for the held shard locks (:meth:`await_kernel_locks`) and runs its kernel
    again, up to :attr:`kernel_retries` times. The other Python paths (the sample's after
    those retries, a reserve that meets a lapped or dead writer, recovery) hold the
    ring lock and every shard lock, and may sleep and recover dead holders: a dead ring-lock
    holder's in-flight slots are voided under all shard locks; a dead shard-lock holder's
    shard is rebuilt from its leaves, and the dead writers' slots in it set to 0 (their
    in-flight records are voided by the next writer that meets them). Lock hold time counts
    the ring lock only: shard holds exclude one shard, not the buffer.
    """

    name = "sharded"
    fused_sample = 0  # its own kernels (below); the protocol code is not read by them
    fused_insert = 0
    fused_update = True
    draws_as_one_tree = False
    kernels = SimpleNamespace(sample=sample, add=add, update=update)
    kernel_retries = 4

    @classmethod
    def shard_count(cls, shards) -> int:
        if shards is None:
            return DEFAULT_SHARDS
        if type(shards) is not int or not 1 <= shards <= MAX_SHARDS:
            raise ValueError(f"shards must be an integer from 1 to {MAX_SHARDS} for policy 'sharded', got {shards!r}")
        return shards

    @classmethod
    def tree_for(cls, tree, make_tree, capacity: int, shards: int):
        return ShardedTree.build(make_tree, capacity, shards, BLOCK)

    @classmethod
    def shared_arrays(cls, capacity: int, shards: int) -> dict:
        used, _ = shard_geometry(capacity, shards, BLOCK)
        return {"ctrl": ((used, _CONTROL_WORDS), np.int64), "fctrl": ((used, 4), np.float64)}

    def __init__(self, parts):
        super().__init__(parts)
        self._sctrl, self._sfctrl = parts.arrays["ctrl"], parts.arrays["fctrl"]
        self.shard_locks = [SharedLock(self._sctrl[s], TREE_LOCK, f"shard {s}", on_recover=partial(self._recover_shard, s),
                                       timeout=parts.tree_lock.timeout,
                                       readers=range(READERS_AT, READERS_AT + MAX_READERS))
                            for s in range(self.tree.shards)]

    def kernel_extra(self) -> tuple:
        return (self.tree.shards, self.tree.block, self._sctrl, self._sfctrl)

    def counters(self) -> dict:
        total = self.ring.counters()
        for s in range(self.tree.shards):
            for name, value in counters_of(self._sctrl[s]).items():
                total[name] += value
        return total

    # ------------------------------------------------------------------ the Python paths
    @contextmanager
    def _all_shards(self):
        """Every shard lock, in ascending order (after the ring lock where that is taken)."""
        with ExitStack() as stack:
            for lock in self.shard_locks:
                stack.enter_context(lock)
            yield

    def select(self, n: int, rng) -> Selection:
        return self.select_published(n, rng, self._all_shards, SHARD_ROUNDS)

    def insert(self, arrays, n, vals) -> int:
        res = self._reserve(n)
        self.storage.write(res.first % self.ring.capacity, arrays, n)
        self.finish_insert(res, n, vals)
        return res.first

    def _reserve(self, n: int) -> Reservation:
        """Tickets for ``n`` rows as the kernel takes them, under the ring lock alone; only when
        that finds no free record, or a record of a writer a lap behind, does the ring's own
        reserve run under every shard lock as well (it voids dead writers, whose slots may lie
        in any shard), and a live writer a lap behind is waited for."""
        token = my_token()
        ring = self.ring
        writers, stamps = ring.arrays["writers"], ring.arrays["stamps"]
        backoff = Backoff(self.tree_lock.timeout)
        while True:
            with self.tree_lock:
                t0, row, _ = reserve_slots(ring.control, writers, stamps, n, token, ring.capacity, True)
            if row >= 0:
                return Reservation(int(t0), int(row), 0)
            with self.tree_lock, self._all_shards():
                res = ring.reserve(n, token, wait_for_lapped=True)
            if res.row >= 0:
                return res
            backoff.pause(lambda waited: f"insert of {n} rows waited {waited:.3g} s for ring slots still being "
                                         f"written by pid {token_pid(res.blocker)} (token {res.blocker}), which "
                                         "is alive but not progressing")

    def finish_insert(self, res: Reservation, n: int, vals) -> None:
        """As the kernel's publish: per shard of the slots, their priorities and stamps under that
        shard's lock, one lock at a time (a stalled holder of one shard holds up only its own
        writers), then the in-flight record cleared, which is this writer's own. A shard whose
        slots already hold their tickets was published by the kernel before it handed over, and
        may have been updated since: it is left as it is."""
        slots = self.ring.slots(res.first, n)
        tickets = res.first + np.arange(n, dtype=np.int64)
        shard, _ = self.tree.locate(slots)
        for s in np.unique(shard).tolist():
            at = np.flatnonzero(shard == s)
            with self.shard_locks[s]:
                if np.array_equal(self.ring.stamps_at(slots[at]), tickets[at]):
                    continue
                self._set_new(slots[at], None if vals is None else vals[at])
                self.ring.stamp(slots[at], tickets[at])
        release_record(self.ring.arrays["writers"], res.row, my_token())

    def _set_new(self, slots: np.ndarray, vals) -> None:
        """Under the locks of the shards of ``slots``: their priorities, ``vals`` (raw) or the max."""
        if vals is None:
            self.tree.update(slots, np.full(slots.shape[0], self.ring.max_priority))
        else:
            self.ring.note_max(self.tree.update(slots, vals, eps=self.eps, alpha=self.alpha), atomic=True)
        self._count(slots)

    def update(self, idx, vals, stamps) -> int:
        """As the fused update: the entries grouped by shard, each group checked for staleness and
        written under its own shard's lock, one lock at a time. So a holder that stalls (a
        descheduled process, a dead one being recovered) holds up only the updates of its shard;
        taking every shard lock here made each such stall stop every learner, whose kernels then
        handed their calls here too. (The entries are checked by the buffer before this.)"""
        shard, leaf = self.tree.locate(idx)
        applied = 0
        for s in np.unique(shard).tolist():
            at = np.flatnonzero(shard == s)
            with self.shard_locks[s]:
                at = at[self.ring.fresh(idx[at], None if stamps is None else stamps[at], counts=self._sctrl[s])]
                if at.size:
                    pmax = self.tree.trees[s].update(leaf[at], vals[at], eps=self.eps, alpha=self.alpha)
                    self.ring.note_max(pmax, atomic=True)
                    self._count(idx[at])
            applied += at.size
        return applied

    def await_kernel_locks(self) -> None:
        """Each shard lock whose word is held, waited for (taken and released at once, in
        ascending order, so a dead holder is recovered as any Python acquisition recovers it)."""
        for lock in self.shard_locks:
            if lock.holder() != 0:
                with lock:
                    pass

    def lock_wait_seconds(self) -> float:
        return sum(lock.wait_seconds for lock in self.shard_locks)

    def read_priorities(self, idx) -> np.ndarray:
        return self.tree.get(idx)  # each leaf is one aligned word: never torn, no lock needed

    def _count(self, slots: np.ndarray) -> None:
        """Under the shard locks: count leaf changes per shard for re-summing (the kernels' rule)."""
        kind, sums, mins, lay, K, _, _, state = self.tree.kernel_args
        shard, _ = self.tree.locate(slots)
        for s, c in zip(*np.unique(shard, return_counts=True)):
            count_changes(kind, sums[s], mins[s], lay, K, state[s], self._sctrl[s], self._sfctrl[s],
                          self.ring.resum_every, int(c))

    # ------------------------------------------------------------------ recovery
    def recover(self, dead_token: int) -> None:
        with self._all_shards():  # voiding writes leaves in any shard
            self.ring.recover(dead_token)

    def _recover_shard(self, s: int, dead_token: int) -> None:
        """Shard ``s``'s lock holder died inside its section: its leaves are whole words, so the
        shard's inner nodes are rebuilt from them, after the dead writers' slots in the shard
        are set to 0 and stamped -1 (their in-flight records are voided under the ring lock)."""
        note_recovery(self._sctrl[s])
        tree = self.tree.trees[s]
        for token, first, n in self.ring.in_flight():
            if pid_alive(token_pid(token)):
                continue
            slots = self.ring.slots(first, n)
            shard, leaf = self.tree.locate(slots)
            mine = shard == s
            if mine.any():
                tree.update(leaf[mine], np.zeros(int(mine.sum())))
                self.ring.unstamp(slots[mine])
        tree.rebuild()
        note_rebuild(self._sctrl[s], self._sfctrl[s], tree.total())
