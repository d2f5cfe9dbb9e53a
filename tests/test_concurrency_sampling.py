"""Sampling distribution of every registered policy against the O(N) oracle, with inserts and
updates running beside the sampler; and what the sharded policy's sampler may see
(snapshot-exact per shard), checked on its draw kernel.

The writers keep the distribution fixed while they work: each slot's priority is a fixed
function of the slot, the inserter gives every new row its slot's priority and the updater
sets slots to theirs. So the tree is written (locks taken, leaves rewritten, inner nodes
changed and restored) all the time, and the frequencies must still follow ``p_i / sum p``
of the oracle (:class:`impl.trees.reference.ReferenceSumTree`) over the slots that cannot be
in flight. Rows in flight are not sampleable while they are written (priority 0 or skipped by
stamp), and how long a block stays in flight is the scheduler's choice: an inserter thread
that loses the GIL or its core between reserving 16 slots and publishing them keeps that block
out of reach for milliseconds, so an unconditioned count shows a deficit of one 16-slot block
(optimistic's unlocked sampler showed it in about 1 run in 10 under load, p down to 1e-51 under
two busy loops; the samplers that wait for the inserter's lock never see a block in flight).
So each sample call is compared with the oracle conditioned on the slots that cannot be in
flight during it: the single inserter's block in flight at the call's start (the 16 tickets
before ``inserted`` read before the call) and every block reserved during it. Each draw lands
in proportion to ``p_i`` over the slots sampleable at that moment, a superset of those, so a
draw that lands outside the excluded slots follows ``p_i`` over them exactly.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from scipy import stats

from replaybench.bench import concurrency_workers as C
from replaybench.impl import concurrent
from replaybench.impl.concurrent import SharedPrioritizedBuffer
from replaybench.impl.concurrent.locks import my_token
from replaybench.impl.trees.reference import ReferenceSumTree

NB = C.TRANSITIONS["cartpole"]
FIELDS = C.schema(NB)
CAPACITY = 256
ALPHA, EPS = 0.6, 0.01


def slot_priority(slots: np.ndarray) -> np.ndarray:
    """The raw priority every transition in a slot gets (0.2 .. 4.2: a 10x spread of leaves)."""
    return 0.2 + (slots * 37 % 17) / 4.0


def oracle() -> ReferenceSumTree:
    ref = ReferenceSumTree(CAPACITY)
    slots = np.arange(CAPACITY)
    ref.update(slots, slot_priority(slots), eps=EPS, alpha=ALPHA)
    return ref


def conditioned_counts(indices: np.ndarray, first_ticket: int, last_ticket: int, leaves: np.ndarray):
    """The draws of one sample call outside the slots that may have been in flight during it,
    counted per slot, and their expected counts under ``leaves`` restricted to the other slots
    (the module docstring): the single inserter's 16 tickets before ``first_ticket`` (read
    before the call) up to ``last_ticket`` (read after it)."""
    flight = np.zeros(CAPACITY, dtype=bool)
    flight[np.arange(first_ticket - INSERT_BLOCK, last_ticket) % CAPACITY] = True
    kept = indices[~flight[indices]]
    counts = np.bincount(kept, minlength=CAPACITY)
    q = np.where(flight, 0.0, leaves)
    return counts, (kept.size * q / q.sum() if q.sum() > 0 else np.zeros(CAPACITY))


INSERT_BLOCK = 16  # the inserter's transitions per add
# The threads' timing makes every run of the test below a new draw (the seeded tests elsewhere
# repeat theirs), so its floor is what a run of every policy in every CI may cross by chance:
# 1e-5 (the p-values measured uniform, 40 runs per policy idle and 30 beside two busy loops;
# at 1e-3 a CI of 7 policies failed about 1 run in 140), and twice the draws of a 1e-3 test
# keep its power against a skew of a few slots.
SAMPLE_CALLS, P_FLOOR = 800, 1e-5


@pytest.mark.parametrize("policy", concurrent.names())
def test_sampled_frequencies_match_the_oracle_beside_inserts_and_updates(policy):
    with SharedPrioritizedBuffer.create(CAPACITY, FIELDS, policy=policy, seed=1, alpha=ALPHA, eps=EPS) as buf:
        slots = np.arange(CAPACITY)
        buf.add(C.make_batch(slots, NB), slot_priority(slots))
        ref = oracle()
        stop = threading.Event()
        done = {"inserts": 0, "updates": 0}
        errors = []

        def inserter():  # the only inserter: the next ticket is buf.inserted
            writer = SharedPrioritizedBuffer.attach(buf.handle, seed=2)
            try:
                ids = CAPACITY
                while not stop.is_set():
                    first = writer.inserted
                    block = np.arange(INSERT_BLOCK)
                    got = writer.add(C.make_batch(ids + block, NB), slot_priority((first + block) % CAPACITY))
                    assert np.array_equal(got, (first + block) % CAPACITY)
                    ids += INSERT_BLOCK
                    done["inserts"] += 1
            except BaseException as err:  # reported by the main thread
                errors.append(err)
            finally:
                writer.close()

        def updater():
            writer = SharedPrioritizedBuffer.attach(buf.handle, seed=3)
            rng = np.random.default_rng(4)
            try:
                while not stop.is_set():
                    idx = rng.integers(0, CAPACITY, 32)
                    writer.update_priorities(idx, slot_priority(idx))
                    done["updates"] += 1
            except BaseException as err:
                errors.append(err)
            finally:
                writer.close()

        threads = [threading.Thread(target=inserter), threading.Thread(target=updater)]
        counts, expected = np.zeros(CAPACITY, dtype=np.int64), np.zeros(CAPACITY)
        leaves = ref.leaves()
        [t.start() for t in threads]
        try:
            for _ in range(SAMPLE_CALLS):
                first = buf.inserted
                out = buf.sample(64)
                assert np.all(C.intact_rows(out))
                kept, want = conditioned_counts(out["indices"], first, buf.inserted, leaves)
                counts += kept
                expected += want
        finally:
            stop.set()
            [t.join(60) for t in threads]
        assert not errors, errors
        assert done["inserts"] > 0 and done["updates"] > 0  # the writers did run beside the sampler
        np.testing.assert_allclose(buf.tree.leaves(), ref.leaves(), rtol=1e-5)  # the oracle is the tree's state
        assert counts.sum() > 0.8 * SAMPLE_CALLS * 64  # most draws were outside the blocks in flight
        seen = expected > 0  # not a slot in flight during every call (an inserter starved throughout)
        assert stats.chisquare(counts[seen], expected[seen]).pvalue > P_FLOOR


# ----------------------------------------------------------------------------- sharded: the statement
def _sharded(shards=4):
    buf = SharedPrioritizedBuffer.create(CAPACITY, FIELDS, policy="sharded", seed=0, shards=shards, alpha=ALPHA,
                                         eps=EPS)
    slots = np.arange(CAPACITY)
    buf.add(C.make_batch(slots, NB), slot_priority(slots))
    return buf


def test_sharded_batches_split_by_the_shard_totals_and_each_shard_is_exact():
    """Quiet buffer (snapshot and descents see the same trees): shard counts follow the shard
    totals and, within each shard, the slots follow ``p_i / T_s``; every weight is
    ``(p_i / p_min) ** -beta`` (the ratio is 1)."""
    with _sharded() as buf:
        tree = buf.tree
        counts = np.zeros(CAPACITY, dtype=np.int64)
        for _ in range(300):
            out = buf.sample(64, beta=0.5)
            np.add.at(counts, out["indices"], 1)
            p = buf.priorities(out["indices"])
            np.testing.assert_allclose(out["weights"], (p / tree.min()) ** -0.5, rtol=1e-5)
        shard, _ = tree.locate(np.arange(CAPACITY))
        per_shard = np.bincount(shard, weights=counts, minlength=tree.shards)
        totals = tree.shard_totals()
        assert stats.chisquare(per_shard, per_shard.sum() * totals / totals.sum()).pvalue > 1e-3
        leaves = tree.leaves()
        for s in range(tree.shards):
            mine = shard == s
            assert stats.chisquare(counts[mine], counts[mine].sum() * leaves[mine] / leaves[mine].sum()).pvalue > 1e-3


def test_sharded_descent_is_exact_for_the_shard_now_and_reports_the_snapshot_ratio():
    """What the docstring promises when a shard changed between the snapshot and its descent:
    the descent follows the shard's tree *now* (``p_i / T_s'``), and the ratio ``T_s / T_s'``
    that the weight multiplies in is reported. Run on the kernel a sample calls per shard,
    with a snapshot total that differs from the shard's current one (a writer in between)."""
    from replaybench.impl.concurrent.policies.sharded import _draw_in_shard

    with _sharded() as buf:
        tree = buf.tree
        kind, sums, mins, lay, K, _, touch_from, _ = tree.kernel_args
        s, n = 1, 20000
        t_now = tree.trees[s].total()
        t_snap = 0.8 * t_now  # the snapshot saw less mass in the shard than its descent does
        rng = np.random.default_rng(5)
        frac = rng.random(n)
        out_index, prio = np.empty(n, np.int64), np.empty(n)
        out_stamp, ratio = np.empty(n, np.int64), np.empty(n)
        status = _draw_in_shard(kind, sums[s], lay, K, touch_from, buf.ring.stamps_snapshot(), tree.shards,
                                tree.block, s, 123, np.arange(n), frac, t_snap, out_index, prio, out_stamp, ratio)
        assert status == 0
        np.testing.assert_allclose(ratio, t_snap / t_now)
        shard, _ = tree.locate(out_index)
        assert np.all(shard == s)  # positions stay in the shard the multinomial draw gave them
        np.testing.assert_array_equal(out_stamp, buf.ring.stamps_at(out_index))
        np.testing.assert_allclose(prio, buf.priorities(out_index), rtol=1e-6)
        mine = np.flatnonzero(tree.locate(np.arange(CAPACITY))[0] == s)
        counts = np.bincount(out_index, minlength=CAPACITY)[mine]
        leaves = tree.leaves()[mine]
        assert stats.chisquare(counts, n * leaves / leaves.sum()).pvalue > 1e-3


def test_sharded_samples_never_return_a_slot_being_written():
    """Slots reserved by an insert (stamp -1) keep their old priority in the sharded tree until
    publish; a sample still never returns them (it draws again inside the shard)."""
    with _sharded(shards=2) as buf:
        with buf.tree_lock:  # an insert's reserve step: 24 slots of one block, stamps -1
            res = buf.ring.reserve(24, my_token())
        reserved = set(buf.ring.slots(res.first, 24).tolist())
        for _ in range(50):
            out = buf.sample(64)
            assert not reserved & set(out["indices"].tolist())
            assert np.all(out["stamps"] >= 0) and np.all(C.intact_rows(out))
        with buf.tree_lock:
            buf.tree.fill(res.first % CAPACITY, 24, 1.0)
            buf.ring.publish(res, 24)
        assert buf.fallbacks == 0


def test_sharded_refuses_a_bad_shard_count_by_name():
    with pytest.raises(ValueError, match="shards must be an integer from 1 to 64 for policy 'sharded', got 0"):
        SharedPrioritizedBuffer.create(64, FIELDS, policy="sharded", shards=0)
    with pytest.raises(ValueError, match="shards must be None or 1 for policy 'lazy-writing'"):
        SharedPrioritizedBuffer.create(64, FIELDS, policy="lazy-writing", shards=4)


@pytest.mark.parametrize("path", ["kernel", "python"])
def test_an_unlocked_draw_that_overshoots_a_lagging_node_is_drawn_again(path):
    """optimistic's unlocked draw beside a tree write caught half way: a whole leaf group halved,
    its parent not yet. A draw that lands in the group's missing mass overshoots (the scan's
    last child would take it, and did before overshoots were redrawn); drawn again, every slot,
    the group's last included, is drawn in proportion to its leaf as the leaves now hold it.
    Both paths: the fused sample's, and the policy's ``select`` (the buffer's fallback when a
    kernel cannot finish alone), which runs the same draw."""
    from replaybench.impl.concurrent.deltas import depth, leaf_slot

    with SharedPrioritizedBuffer.create(CAPACITY, FIELDS, policy="optimistic", seed=0, alpha=1.0, eps=0.0) as buf:
        slots = np.arange(CAPACITY)
        buf.add(C.make_batch(slots, NB), 0.5 + (slots * 37 % 17) / 4.0)
        kind, sums, _, lay, *_ = buf.tree.kernel_args
        D = depth(kind, lay)
        for i in range(32, 48):  # the leaves written, the deltas never sent up
            sums[leaf_slot(kind, lay, D, i)] /= 2
        leaves = buf.tree.leaves().astype(np.float64)
        counts = np.zeros(CAPACITY, dtype=np.int64)
        rng = np.random.default_rng(5)
        for _ in range(300):
            drawn = buf.sample(64)["indices"] if path == "kernel" else buf._policy.select(64, rng).indices
            np.add.at(counts, drawn, 1)
        assert stats.chisquare(counts, counts.sum() * leaves / leaves.sum()).pvalue > 1e-3
        assert buf.fallbacks == 0  # every draw was the unlocked one


def _hold_shard(buf, s, release):
    """A thread holding shard ``s``'s lock until ``release`` is set (a stalled holder: a
    descheduled learner, say); returned once it holds it."""
    held = threading.Event()

    def hold():
        with buf._policy.shard_locks[s]:
            held.set()
            release.wait(60)
    t = threading.Thread(target=hold)
    t.start()
    assert held.wait(5)
    return t


def _finishes(fn, timeout=20.0) -> bool:
    """Whether ``fn()``, run in a thread of its own, returns within ``timeout`` seconds."""
    t = threading.Thread(target=fn)
    t.start()
    t.join(timeout)
    return not t.is_alive()


def _handed_over(buf, calls, timeout=30.0) -> bool:
    """Wait until ``calls`` calls of ``buf`` went to the Python path (a kernel's spins are
    counted, not timed: on a loaded machine its yields take a while)."""
    start = time.monotonic()
    while buf.fallbacks < calls and time.monotonic() - start < timeout:
        time.sleep(0.005)
    return buf.fallbacks == calls


def _compiled(buf):
    """Every kernel of ``buf`` loaded (or compiled) before a test waits on one: a first call
    compiles for seconds on a cold cache, holding the GIL."""
    buf.warm_up()
    out = buf.sample(64)
    buf.update_priorities(out["indices"], buf.priorities(out["indices"]) ** (1 / ALPHA) - EPS, out["stamps"])


def _slots_of_shard(buf, s, n):
    shard, _ = buf.tree.locate(np.arange(CAPACITY))
    return np.flatnonzero(shard == s)[:n]


def test_a_stalled_shard_holds_up_only_the_updates_of_its_own_shard():
    """Shard 2's lock held: an update with entries in shards 0 and 2 writes shard 0, finds 2
    held past its spins and goes to the Python path, which waits for shard 2 holding no other
    shard lock; meanwhile an update of shard 0 alone finishes (it waited for the whole hold
    when that path took every shard lock). Both apply every entry."""
    with _sharded() as buf:
        _compiled(buf)
        both = np.concatenate([_slots_of_shard(buf, 0, 4), _slots_of_shard(buf, 2, 4)])
        alone = _slots_of_shard(buf, 0, 8)[4:]
        release = threading.Event()
        holder = _hold_shard(buf, 2, release)
        done = {}
        waiter = threading.Thread(target=lambda: done.update(both=buf.update_priorities(both, np.full(8, 3.0))))
        waiter.start()
        try:
            assert _handed_over(buf, 1) and waiter.is_alive()
            assert _finishes(lambda: done.update(alone=buf.update_priorities(alone, np.full(4, 5.0))))
            assert waiter.is_alive()  # still waiting for shard 2
        finally:
            release.set()
            holder.join()
            waiter.join()
        assert done == {"both": 8, "alone": 4}
        np.testing.assert_allclose(buf.priorities(both), (3.0 + EPS) ** ALPHA)
        np.testing.assert_allclose(buf.priorities(alone), (5.0 + EPS) ** ALPHA)
        assert all(lock.holder() == 0 for lock in buf._policy.shard_locks) and buf.tree_lock.holder() == 0
        assert buf.lock_wait_seconds > 0.0  # the Python path's wait for shard 2 is counted


def test_a_sample_that_meets_a_stalled_shard_waits_for_it_and_runs_its_kernel_again():
    """Shard 1's lock held: a sample's kernel hands the call over after its spins; the call
    waits for that lock alone and runs the kernel again (its result whole), so an update of
    shard 0 meanwhile is not held up (the Python draw takes the tree lock and every shard lock
    in turn, shard 0 first, and never ran)."""
    with _sharded() as buf:
        _compiled(buf)
        release = threading.Event()
        holder = _hold_shard(buf, 1, release)
        got = {}
        kernels = buf.kernel_calls
        sampler = threading.Thread(target=lambda: got.update(out=buf.sample(64)))
        sampler.start()
        try:
            assert _handed_over(buf, 1) and sampler.is_alive()
            assert _finishes(lambda: buf.update_priorities(_slots_of_shard(buf, 0, 4), np.full(4, 2.0)))
            assert sampler.is_alive()
        finally:
            release.set()
            holder.join()
            sampler.join()
        out = got["out"]
        assert np.all(C.intact_rows(out)) and np.all(out["stamps"] == buf.ring.stamps_at(out["indices"]))
        assert buf.kernel_calls >= kernels + 3  # the sample twice (handed over, then again), the update once
        assert buf.tree_lock.acquisitions == 0  # the Python draw never ran


def test_a_stalled_shard_holds_up_only_the_inserts_that_publish_into_it():
    """Shard 2's lock held: an insert of 192 rows (slots of shards 0, 1 and 2) is reserved and
    copied, its kernel publishes shards 0 and 1 and hands the rest to Python, which waits for
    shard 2 holding no other shard lock (nor the ring lock); meanwhile an update of shard 0
    finishes, and once shard 2 is free every row is published with its priority (the
    shards the kernel published are left as they are: the update of shard 0 is not undone)."""
    with _sharded() as buf:
        _compiled(buf)
        first = buf.ring.inserted
        assert first % CAPACITY == 0  # the insert's slots: 0 .. 191, blocks of shards 0, 1, 2
        release = threading.Event()
        holder = _hold_shard(buf, 2, release)
        got = {}
        rows = C.make_batch(np.arange(7000, 7192), NB)
        inserter = threading.Thread(target=lambda: got.update(slots=buf.add(rows, np.full(192, 4.0))))
        inserter.start()
        try:
            assert _handed_over(buf, 1) and inserter.is_alive()
            assert _finishes(lambda: buf.update_priorities(_slots_of_shard(buf, 0, 4), np.full(4, 2.0)))
            assert inserter.is_alive() and buf.tree_lock.holder() == 0
        finally:
            release.set()
            holder.join()
            inserter.join()
        slots = got["slots"]
        np.testing.assert_array_equal(buf.ring.stamps_at(slots), first + np.arange(192))
        np.testing.assert_allclose(buf.priorities(slots[:4]), (2.0 + EPS) ** ALPHA)
        np.testing.assert_allclose(buf.priorities(slots[4:]), (4.0 + EPS) ** ALPHA)
        assert buf.ring.in_flight() == [] and all(lock.holder() == 0 for lock in buf._policy.shard_locks)
