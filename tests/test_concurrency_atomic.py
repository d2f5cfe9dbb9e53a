"""The atomic-deltas policy's own statements: atomic float adds and exchanges across processes
on shared memory, the drift bound and its exact rebuild, and what a sampler may see (exact
with no writer in flight; stale by at most one batch while one is)."""

from __future__ import annotations

import multiprocessing as mp
import os

import numpy as np
import pytest
from numba import njit
from scipy import stats

from replaybench.bench import concurrency_workers as C
from replaybench.impl.concurrent import SharedPrioritizedBuffer, leaked_segments
from replaybench.impl.concurrent.atomics import atomic_add, atomic_xchg, yield_core
from replaybench.impl.concurrent.deltas import add_deltas, depth, exchange_leaves, set_leaves, settle_mins
from replaybench.impl.concurrent.locks import _PID_SHIFT, token_pid
from replaybench.impl.concurrent.policies.atomic_deltas import DRIFT_TOLERANCE_F32, HEAL_EVERY, drift_bound, rebuild_due
from replaybench.impl.concurrent.ring import MAX_WRITERS, RECORD_WORDS, release_record, reserve_unlocked, ring_arrays
from replaybench.impl.concurrent.shm import SharedArena
from replaybench.impl.trees.kernels import addr

NB = C.TRANSITIONS["cartpole"]
FIELDS = C.schema(NB)
WORKERS, ROUNDS = 4, 100_000


@pytest.fixture(autouse=True)
def no_leaked_segments():
    before = set(leaked_segments(os.getpid()))
    yield
    assert not set(leaked_segments(os.getpid())) - before


# ----------------------------------------------------------------------------- the intrinsics
@njit(nogil=True)
def _hammer(sums, swaps, w, rounds):
    """Worker ``w``: float adds into shared words 0 and 1 and its own word 2 + w; exchanges on
    ``swaps[0]``, summing what each of its exchanges changed (``new - old``) into its word 1 + w
    of ``swaps`` (its own: plain adds)."""
    for r in range(rounds):
        atomic_add(sums, 0, 0.5)
        atomic_add(sums, 1, 2.0**-20)
        atomic_add(sums, 2 + w, 1.0)
        new = float(w * rounds + r + 1)
        old = atomic_xchg(swaps, 0, new)
        swaps[1 + w] += new - old


def _worker(spec, w):
    arena = SharedArena.attach(spec)
    try:
        _hammer(arena.arrays["sums"], arena.arrays["swaps"], w, ROUNDS)
    finally:
        arena.close()


def test_atomic_float_add_and_exchange_lose_nothing_across_processes():
    """Several processes add into the same float64 words of one shared segment: every sum of
    exactly representable steps is exact (a lost add, or a torn read-modify-write, would show
    as a missing step). Exchanges on one word form one chain: the changes each process saw
    add up exactly to the last value minus the first."""
    arena = SharedArena.create({"sums": ((2 + WORKERS,), np.float64), "swaps": ((1 + WORKERS,), np.float64)})
    try:
        _hammer(np.zeros(2 + WORKERS), np.zeros(1 + WORKERS), 0, 1)  # compiled here, once, before the fork
        ctx = mp.get_context("fork")
        procs = [ctx.Process(target=_worker, args=(arena.spec, w)) for w in range(WORKERS)]
        [p.start() for p in procs]
        [p.join(120) for p in procs]
        assert [p.exitcode for p in procs] == [0] * WORKERS
        sums, swaps = arena.arrays["sums"], arena.arrays["swaps"]
        assert sums[0] == 0.5 * WORKERS * ROUNDS
        assert sums[1] == WORKERS * ROUNDS * 2.0**-20
        assert sums[2:].tolist() == [float(ROUNDS)] * WORKERS
        assert swaps[1:].sum() == swaps[0]  # from 0.0: every exchange's change, each counted once
    finally:
        arena.close()


# ----------------------------------------------------------------------------- drift
def test_drift_past_the_tolerance_triggers_an_exact_rebuild():
    """Updates at a steady total keep the drift bound far below the tolerance: no rebuild. A
    fall of the total by 10**9 makes the bound pass it (the same rounding error, relative to
    a far smaller total): the writer rebuilds, and the root is the exact sum of the leaves."""
    with SharedPrioritizedBuffer.create(1024, FIELDS, policy="atomic-deltas", seed=0, alpha=1.0, eps=0.0,
                                        resum_every=2**62) as buf:
        rng = np.random.default_rng(0)
        slots = np.arange(1024)
        buf.add(C.make_batch(slots, NB), rng.uniform(1e5, 1e6, 1024))
        for _ in range(20):
            idx = rng.integers(0, 1024, 64)
            buf.update_priorities(idx, rng.uniform(1e5, 1e6, 64))
        assert buf.counters()["rebuilds"] == 0
        t_max = buf.total()
        assert drift_bound(2 * 1024 + 20 * 64, t_max, buf.tree.depth) < DRIFT_TOLERANCE_F32 * t_max
        tiny = rng.uniform(1e-4, 1e-3, 1024)
        for k in range(0, 1024, 128):  # the total falls 10**9-fold
            buf.update_priorities(slots[k:k + 128], tiny[k:k + 128])
        assert buf.counters()["rebuilds"] >= 1
        leaves = buf.tree.leaves()
        np.testing.assert_array_equal(leaves, tiny.astype(np.float32))  # a float32 variant's leaf values
        assert buf.total() == pytest.approx(float(np.sum(leaves)), rel=1e-13)
        assert buf.fallbacks == 0


def test_the_drift_tolerance_follows_the_leaves_dtype():
    """At depth 5 a change adds at most 8 roundings of 2**-53 T_max: float64 leaves allow 2**20
    changes at a steady total (2**-30), float32 leaves 2**26 (2**-24, one float32 rounding of the
    total, within what the variant's own float32 tree carries)."""
    T = 3.0
    assert not rebuild_due(2**20, T, T, 5, False) and rebuild_due(2**20 + 1, T, T, 5, False)
    assert not rebuild_due(2**26, T, T, 5, True) and rebuild_due(2**26 + 1, T, T, 5, True)
    assert rebuild_due(2**20 + 1, T, T / 64, 5, True)  # a total fallen 64-fold: the float64 count again


# ----------------------------------------------------------------------------- what a sampler sees
CAPACITY = 256  # kary-aligned, K = 16: two levels; leaf group g = leaves 16 g .. 16 g + 15


def _quiet_buffer():
    buf = SharedPrioritizedBuffer.create(CAPACITY, FIELDS, policy="atomic-deltas", seed=0, alpha=1.0, eps=0.0)
    slots = np.arange(CAPACITY)
    buf.add(C.make_batch(slots, NB), 0.5 + (slots * 37 % 17) / 4.0)
    return buf


def _counts(buf, draws=300, n=64):
    counts = np.zeros(CAPACITY, dtype=np.int64)
    for _ in range(draws):
        out = buf.sample(n, beta=0.5)
        assert np.all(C.intact_rows(out)) and np.all(out["stamps"] >= 0)
        assert np.all(out["weights"] <= 1.0)
        np.add.at(counts, out["indices"], 1)
    return counts


def test_with_no_writer_in_flight_a_sample_is_exact():
    with _quiet_buffer() as buf:
        leaves = buf.tree.leaves()
        counts = _counts(buf)
        assert stats.chisquare(counts, counts.sum() * leaves / leaves.sum()).pvalue > 1e-3
        out = buf.sample(256, beta=0.5)
        np.testing.assert_allclose(out["weights"], (buf.priorities(out["indices"]) / leaves.min()) ** -0.5,
                                   rtol=1e-6)  # weights are float32
        assert buf.fallbacks == 0


def test_with_a_batch_in_flight_a_sample_is_stale_by_that_batch_only():
    """A writer stopped between its leaf exchange and its deltas (the widest window a batch
    has): leaf group 1 changed (8 leaves to 0, 8 raised fourfold), the inner nodes not yet.
    Every slot outside that group is drawn in proportion to its priority; the group as a whole
    gets the smaller of its mass before and after the batch (here the one before: the batch
    raises it), and never a leaf the batch set to 0. Once the deltas arrive, draws are exact
    again."""
    with _quiet_buffer() as buf:
        kind, sums, mins, lay, K, kshift, _, _ = buf.tree.kernel_args
        old = buf.tree.leaves()
        group = np.arange(16, 32)
        new = np.concatenate([np.zeros(8), 4.0 * old[24:32]])
        before = np.empty(16)
        exchange_leaves(kind, sums, lay, group, new, before)  # the batch in flight: leaves only
        counts = _counts(buf)
        assert counts[16:24].sum() == 0
        total = counts.sum()
        outside = np.setdiff1d(np.arange(CAPACITY), group)
        reach = min(old[group].sum(), new.sum())
        assert reach == old[group].sum()
        t_old = old[outside].sum() + reach
        expected = np.append(total * old[outside] / t_old, total * reach / t_old)
        observed = np.append(counts[outside], counts[group].sum())
        assert stats.chisquare(observed, expected).pvalue > 1e-3
        add_deltas(kind, sums, lay, K, kshift, group, new - before)  # the batch returns
        settle_mins(kind, sums, mins, lay, K, kshift, group, before, new)
        leaves = buf.tree.leaves()
        assert buf.total() == pytest.approx(leaves.sum(), rel=1e-13) and buf.tree.min() == leaves[leaves > 0].min()
        counts = _counts(buf)
        live = leaves > 0
        assert counts[~live].sum() == 0
        assert stats.chisquare(counts[live], counts.sum() * leaves[live] / leaves.sum()).pvalue > 1e-3
        assert buf.fallbacks == 0


# ----------------------------------------------------------------------------- writers at once
@njit(nogil=True)
def _writer(kind, sums, mins, lay, K, kshift, idx, vals, repeat):
    for _ in range(repeat):
        for r in range(idx.shape[0]):
            set_leaves(kind, sums, mins, lay, K, kshift, idx[r], vals[r])


@pytest.mark.parametrize("variant,capacity", [("binary", 16), ("kary-aligned", 256), ("kary-prefix", 256)])
def test_writers_at_once_leave_exact_minima_and_sums(variant, capacity):
    """Four threads (the kernels release the GIL) set overlapping leaves of one tree at once,
    zeros included: afterwards every minimum is its subtree's (the compare-and-swap agreement
    loop lost no raise or lowering; the inner nodes', as the policy keeps no leaf min slots),
    and every sum is its leaves' within rounding (no delta lost: an exchange's deltas chain,
    and every add is atomic). Checked against a rebuild from the same leaves. (A plain ``+=`` in place of the atomic add fails this on every tree;
    the minima's race window is narrower, and a loop without its re-check after a swap was not
    caught in the runs tried.)"""
    from replaybench.impl import registry
    from replaybench.impl.trees import ops

    tree = registry.create(variant, capacity, {"x": ((), "uint8")}).tree.widened()
    tree.fill(0, capacity, 1.0)
    kind, sums, mins, lay, K, kshift, _, state = tree.kernel_args
    rng = np.random.default_rng(1)
    jobs = []
    for w in range(4):
        idx = rng.integers(0, capacity, (1000, 8))
        vals = np.where(rng.random((1000, 8)) < 0.2, 0.0, rng.integers(1, 64, (1000, 8)) / 8.0)
        jobs.append((idx, vals))
    _writer(kind, sums, mins, lay, K, kshift, jobs[0][0][:1], jobs[0][1][:1], 1)  # compiled before the threads
    import threading

    threads = [threading.Thread(target=_writer, args=(kind, sums, mins, lay, K, kshift, i, v, 100))
               for i, v in jobs]  # 0.1-0.5 s each: they overlap, whatever starting a thread costs
    [t.start() for t in threads]
    [t.join(120) for t in threads]
    got_sums, got_mins = sums.copy(), mins.copy()
    ops.rebuild(kind, sums, mins, lay, K, state)
    D = depth(kind, lay)
    inner = np.ones(mins.size, dtype=bool)
    inner[[addr(lay, D, j) for j in range(K**D)]] = False  # the leaves' min slots, not kept
    np.testing.assert_array_equal(got_mins[inner], mins[inner])
    np.testing.assert_allclose(got_sums, sums, rtol=0, atol=1e-9)


# ----------------------------------------------------------------------------- a writer killed mid-write
def _die_mid_write(handle, slots):
    """Process target: hold the policy's lock shared, as a writer does, exchange some leaves
    (their deltas never sent), and die there."""
    import signal

    from replaybench.impl.concurrent import fused
    from replaybench.impl.concurrent.locks import my_token

    buf = SharedPrioritizedBuffer.attach(handle)
    lctrl = buf._policy.kernel_extra()[0]
    status, _ = fused.acquire_shared(lctrl, my_token(), np.zeros(fused.LOCKSTATS_SIZE))
    assert status == 0
    kind, sums, _, lay, _, _, _, _ = buf.tree.kernel_args
    exchange_leaves(kind, sums, lay, slots, np.full(slots.size, 50.0), np.empty(slots.size))
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_writer_killed_mid_write_is_repaired_by_a_rebuild_that_comes_due_first():
    """A writer that dies between its leaf exchange and its deltas leaves the inner nodes
    short of its changes, and its token in a reader word. A rebuild that comes due before the
    object's next check for dead writers (tests/test_concurrency_heal.py) cannot take the lock
    in the kernel (the dead word holds it off): the update goes to the Python path, which
    clears the dead word and rebuilds from the leaves (counted as a recovery). The rebuild is
    made due by a fall of the total (every slot set 10**6 times lower), within the 16 calls
    before the object's next check."""
    with SharedPrioritizedBuffer.create(1024, FIELDS, policy="atomic-deltas", seed=0, alpha=1.0, eps=0.0) as buf:
        C.prefill(buf, 1024, NB)
        proc = mp.get_context("fork").Process(target=_die_mid_write, args=(buf.handle, np.arange(100, 110)))
        proc.start()
        proc.join(120)
        assert proc.exitcode == -9
        assert buf.total() < buf.tree.leaves().sum() - 400  # 10 leaves at 50: their deltas never arrived
        assert buf._policy._calls[0] % HEAL_EVERY == 1  # the prefill's call was a check: the next is 31 calls away
        rng = np.random.default_rng(0)
        for k in range(0, 1024, 64):
            idx = np.arange(k, k + 64)
            assert buf.update_priorities(idx, rng.uniform(1e-6, 2e-6, 64)) == 64
            if buf.fallbacks:
                break
        assert buf.fallbacks == 1 and buf.counters()["recoveries"] == 1
        assert buf.total() == pytest.approx(float(buf.tree.leaves().sum()), rel=1e-12)
        out = buf.sample(256)
        assert np.all(C.intact_rows(out)) and np.all(out["stamps"] >= 0)


def test_a_draw_that_overshoots_a_lagging_node_is_drawn_again():
    """A batch in flight that lowers a whole leaf group (every leaf halved, the parent not yet):
    a draw that lands in the group's missing mass overshoots (the scan's last child would
    take it) and is drawn again, so every slot, the group's last included, is drawn in
    proportion to its priority as the leaves now hold it."""
    with _quiet_buffer() as buf:
        kind, sums, mins, lay, K, kshift, _, _ = buf.tree.kernel_args
        group = np.arange(32, 48)
        exchange_leaves(kind, sums, lay, group, buf.tree.leaves()[group] / 2.0, np.empty(16))  # deltas never sent
        leaves = buf.tree.leaves()
        counts = _counts(buf)
        assert stats.chisquare(counts, counts.sum() * leaves / leaves.sum()).pvalue > 1e-3
        assert buf.fallbacks == 0


# ----------------------------------------------------------------------------- inserts with no lock
_CAP = 1 << 12


@njit(nogil=True)
def _reserve_and_release(ctrl, writers, stamps, token, n, rounds, firsts, given_up):
    """Reserve ``n`` tickets and release the record, ``rounds`` times, trying again after a range
    given up (a writer descheduled a lap behind: this core is yielded to it first, as the
    buffer's Python path backs off); ``firsts[r]`` gets the first ticket of round ``r`` (-2
    where no record was free), ``given_up[1:]`` the first tickets of the ranges given up (-1
    past the last) and ``given_up[0]`` how many there were."""
    g = 0
    for r in range(rounds):
        while True:
            t0, row, blocker = reserve_unlocked(ctrl, writers, stamps, n, token, stamps.shape[0])
            if row >= 0:
                firsts[r] = t0
                release_record(writers, row, token)
                break
            if blocker < 0:
                firsts[r] = -2
                break
            g += 1
            given_up[0] = g
            if g < given_up.shape[0]:
                given_up[g] = t0
            yield_core()


def _reserver(spec, w, rounds):
    arena = SharedArena.attach(spec)
    try:
        a = arena.arrays
        # tokens of one home row (token % MAX_WRITERS): the processes race for the same records
        _reserve_and_release(a["ctrl"], a["writers"], a["stamps"], 1000 + MAX_WRITERS * w, 1 + w, rounds,
                             a[f"firsts{w}"], a[f"given_up{w}"])
    finally:
        arena.close()


def _ring_arena(**extra):
    arrays = {k: v for k, v in ring_arrays(_CAP).items() if k in ("ctrl", "writers", "stamps")}
    return SharedArena.create({**arrays, **extra})


def test_inserts_reserving_with_no_lock_across_processes_get_disjoint_tickets():
    """Processes reserve (n = 1 + their number) and release records at once: every ticket is
    handed out exactly once, in a reservation or a range given up because a descheduled
    writer was a lap behind (a lost or torn ticket add would hand one out twice or skip one),
    every round found a record, and every record is free at the end."""
    rounds = 20_000
    arena = _ring_arena(**{f"firsts{w}": ((rounds,), np.int64) for w in range(WORKERS)},
                        **{f"given_up{w}": ((1 + rounds,), np.int64) for w in range(WORKERS)})
    try:
        a = arena.arrays
        a["stamps"][:] = -1
        for w in range(WORKERS):
            a[f"given_up{w}"][:] = -1
            a[f"given_up{w}"][0] = 0
        _reserve_and_release(np.zeros(64, np.int64), np.zeros((MAX_WRITERS, RECORD_WORDS), np.int64),
                             np.zeros(8, np.int64), 1, 1, 1, np.zeros(1, np.int64),
                             np.zeros(1, np.int64))  # compiled here, before the fork
        ctx = mp.get_context("fork")
        procs = [ctx.Process(target=_reserver, args=(arena.spec, w, rounds)) for w in range(WORKERS)]
        [p.start() for p in procs]
        [p.join(120) for p in procs]
        assert [p.exitcode for p in procs] == [0] * WORKERS
        covered = np.zeros(int(a["ctrl"][2]), dtype=np.int64)  # word 2: the ticket
        for w in range(WORKERS):
            firsts, given_up = a[f"firsts{w}"], a[f"given_up{w}"][1:]
            assert firsts.min() >= 0 and a[f"given_up{w}"][0] <= rounds  # every range given up was recorded
            for t0 in np.concatenate([firsts, given_up[given_up >= 0]]):
                covered[t0: t0 + 1 + w] += 1
        assert np.all(covered == 1)
        assert not a["writers"][:, [0, 2]].any()  # every record free (a freed one keeps its stale first ticket)
    finally:
        arena.close()


def test_a_reservation_that_would_lap_a_writer_in_flight_gives_its_tickets_up():
    """The record states of reserve_unlocked: a whole record a lap behind blocks (the tickets are
    taken and given up, nothing written, the record freed); so does a provisional one (count
    -1, from its first ticket at most); a claimed one (count 0) does not (its tickets come
    after); a full table takes nothing."""
    from replaybench.impl.concurrent.ring import _TICKET as TICKET

    ctrl, writers = np.zeros(ring_arrays(_CAP)["ctrl"][0], np.int64), np.zeros((MAX_WRITERS, RECORD_WORDS), np.int64)
    stamps = np.arange(_CAP, dtype=np.int64)
    ctrl[TICKET] = 3 * _CAP  # the ticket: three laps in
    writers[5, :3] = (77, 2 * _CAP + 10, 8)  # in flight a lap behind, on slots 10 .. 17
    t0, row, blocker = reserve_unlocked(ctrl, writers, stamps, 16, 88, _CAP)
    assert (t0, row, blocker) == (3 * _CAP, -1, 5)
    others = [r for r in range(MAX_WRITERS) if r != 5]
    assert ctrl[TICKET] == 3 * _CAP + 16 and not writers[others][:, [0, 2]].any()  # freed: no token, no count
    assert np.array_equal(stamps, np.arange(_CAP))  # nothing written
    writers[5, :3] = (77, 2 * _CAP + 10, -1)  # provisional: still a lap behind
    assert reserve_unlocked(ctrl, writers, stamps, 16, 88, _CAP)[2] == 5
    writers[5, :3] = (77, 0, 0)  # claimed only: ignored
    t0, row, blocker = reserve_unlocked(ctrl, writers, stamps, 16, 88, _CAP)
    assert (t0, row, blocker) == (3 * _CAP + 32, 88 % MAX_WRITERS, -1)  # the token's home row
    assert writers[row, :3].tolist() == [88, t0, 16] and np.all(stamps[32:48] == -1) and stamps[48] == 48
    writers[:, 0] = 99
    assert reserve_unlocked(ctrl, writers, stamps, 16, 88, _CAP) == (-1, -1, -1)
    assert ctrl[TICKET] == t0 + 16


def test_the_control_words_many_workers_write_have_cache_lines_of_their_own():
    """The ticket, the changes since the rebuild and the stale/redrawn counts are written by
    every insert or update; each sits on a line apart from the tree-lock word (which every
    shared acquisition reads twice), from the leaf lock and from the reader slots, so that a
    write to one does not make the others miss."""
    from replaybench.impl.concurrent import ring

    line = lambda word: word // 8  # noqa: E731 (64-byte lines of int64 words; the block is line-aligned)
    hot = [ring._TICKET, ring._SINCE_REBUILD, ring._STALE]
    lines = [line(ring.TREE_LOCK), line(ring.LEAF_LOCK), *map(line, hot)]
    assert len(set(lines)) == len(lines) and line(ring._REDRAWN) == line(ring._STALE)
    assert ring.READERS_AT % 8 == 0 and line(ring.READERS_AT) > max(lines)
    assert ring_arrays(1024)["ctrl"][0] == (ring.READERS_AT + ring.MAX_READERS,)


def test_in_flight_records_are_a_cache_line_each_and_claimed_from_the_token_s_home_row():
    """Each record is its own 64-byte line (writers on two cores never write one line), and a
    writer claims the first free record from row ``token % MAX_WRITERS`` on, wrapping round:
    writers of different processes (tokens) do not race for the first row."""
    with SharedPrioritizedBuffer.create(256, FIELDS, policy="atomic-deltas", seed=0) as buf:
        writers = buf.ring.arrays["writers"]
        assert writers.strides[0] == 64 and writers.ctypes.data % 64 == 0
    ctrl, writers = np.zeros(64, np.int64), np.zeros((MAX_WRITERS, RECORD_WORDS), np.int64)
    stamps = np.arange(_CAP, dtype=np.int64)
    token = 3 * MAX_WRITERS - 1  # home row MAX_WRITERS - 1, the last
    assert reserve_unlocked(ctrl, writers, stamps, 4, token, _CAP)[1] == MAX_WRITERS - 1
    assert reserve_unlocked(ctrl, writers, stamps, 4, token, _CAP)[1] == 0  # taken: on from the top
    assert reserve_unlocked(ctrl, writers, stamps, 4, 7, _CAP)[1] == 7
    assert sorted(writers[writers[:, 0] != 0, 0].tolist()) == [7, token, token]


def test_a_dead_insert_whose_record_was_not_whole_voids_nothing():
    """An insert that died between its claim (or its ticket) and its whole record leaves its
    slots as they were: voiding frees its record and touches no slot."""
    with SharedPrioritizedBuffer.create(256, FIELDS, policy="atomic-deltas", seed=0) as buf:
        C.prefill(buf, 256, NB)
        proc = mp.get_context("fork").Process(target=lambda: None)
        proc.start()
        proc.join(30)
        dead = (proc.pid << _PID_SHIFT) | 1  # a token of that (now dead) pid
        assert token_pid(dead) == proc.pid
        writers = buf.ring.arrays["writers"]
        writers[3, :3] = (dead, buf.inserted - 8, -1)
        stamps, total = buf.ring.stamps_snapshot(), buf.total()
        with buf.tree_lock:
            assert buf.ring.void_dead_writers() == 0
        assert not writers.any() and np.array_equal(buf.ring.stamps_snapshot(), stamps) and buf.total() == total
        assert buf.counters()["voided_slots"] == 0
