"""The shared buffer's one-kernel operations (impl.concurrent.fused) against the in-process
buffer: same seeds, same results (indices, weights, rows, stamps, priorities after update),
under every policy; and the hand-offs to the Python path when a kernel cannot finish alone."""

import os
import threading
import time

import numpy as np
import pytest

from replaybench.bench import concurrency_workers as C
from replaybench.impl import concurrent, registry
from replaybench.impl.concurrent import SharedPrioritizedBuffer, leaked_segments
from replaybench.impl.concurrent import fused as shared_fused
from replaybench.impl.concurrent.policy import get as get_policy

NB = C.TRANSITIONS["cartpole"]
FIELDS = C.schema(NB)


@pytest.fixture(autouse=True)
def no_leaked_segments():
    before = set(leaked_segments(os.getpid()))
    yield
    assert not set(leaked_segments(os.getpid())) - before


def _pair(policy, variant, capacity, stratified=False):
    params = {"stratified": stratified}
    plain = registry.create(variant, capacity, FIELDS, seed=0, **params)
    shared = SharedPrioritizedBuffer.create(capacity, FIELDS, variant=variant, policy=policy, seed=0, **params)
    return plain, shared


@pytest.mark.parametrize("variant,stratified", [("kary-aligned", False), ("binary", True), ("kary-prefix", False)])
@pytest.mark.parametrize("policy", concurrent.names())
def test_one_thread_gives_the_in_process_buffers_results(policy, variant, stratified):
    """From one thread, with the same generator seeds: every sample returns exactly the
    in-process buffer's indices, weights and rows (every policy has a fused sample; sharded
    splits its draw across shards, so only its weights are checked, against its rows'
    priorities), and after the same adds and updates every stored priority is the same, with
    no call handed to the Python path. Stamps are the tickets of the drawn slots.
    (Before the kernels, a shared sample drew from the generator differently: none matched.)"""
    if policy in ("pal-locks", "deferred") and variant == "kary-prefix":
        pytest.skip("split-update policies refuse prefix trees")
    capacity = 512
    plain, shared = _pair(policy, variant, capacity, stratified)
    fused_sample = get_policy(policy).fused_sample is not None
    assert fused_sample
    with shared:
        rng = np.random.default_rng(7)
        for step in range(9):
            ids = np.arange(step * 90, step * 90 + 90)
            batch = C.make_batch(ids, NB)
            if step % 3 == 2:  # explicit priorities on some inserts
                pr = rng.random(90) * 2
                assert np.array_equal(plain.add(batch, pr), shared.add(batch, pr))
            else:
                assert np.array_equal(plain.add(batch), shared.add(batch))
            if get_policy(policy).requires_split_updates:
                # its updates add leaf deltas to the inner nodes (other float32 roundings than a
                # whole update), so both trees are re-summed from their equal leaves first
                plain.tree.rebuild()
                with shared.tree_lock:
                    shared.ring.rebuild()
            mine = plain.sample(64, beta=0.5, rng=np.random.default_rng(step))
            theirs = shared.sample(64, beta=0.5, rng=np.random.default_rng(step))
            if fused_sample and get_policy(policy).draws_as_one_tree:
                np.testing.assert_array_equal(theirs["indices"], mine["indices"])
                np.testing.assert_array_equal(theirs["weights"], mine["weights"])
                for name in FIELDS:
                    np.testing.assert_array_equal(theirs[name], mine[name])
            elif fused_sample:
                np.testing.assert_allclose(theirs["weights"], (plain.tree.get(theirs["indices"]) / plain.tree.min())
                                           ** -0.5, rtol=1e-5)
            assert np.all(theirs["stamps"] % capacity == theirs["indices"])
            assert np.all(C.intact_rows(theirs))
            td = rng.random(64) * 3
            plain.update_priorities(mine["indices"], td)
            stamps = shared.ring.stamps_at(mine["indices"])
            assert shared.update_priorities(mine["indices"], td, stamps) == 64
            np.testing.assert_array_equal(shared.tree.leaves(), plain.tree.leaves())
        # the totals differ by float32 rounding (lazy writing fills 0 first): the drift bound
        assert shared.total() == pytest.approx(plain.tree.total(), rel=1e-5)
        assert shared.max_priority == pytest.approx(plain.max_priority)
        assert shared.fallbacks == 0


@pytest.mark.parametrize("policy", ["global-lock", "lazy-writing", "optimistic"])
def test_sample_out_is_refilled_in_place_and_checked(policy):
    with SharedPrioritizedBuffer.create(256, FIELDS, policy=policy, seed=0) as buf:
        C.prefill(buf, 300, NB)
        out = buf.sample_out(32)
        got = buf.sample(32, out=out)
        assert got is out and out["stamps"].dtype == np.int64 and np.all(C.intact_rows(out))
        first = out["indices"].copy()
        buf.sample(32, out=out)
        assert not np.array_equal(first, out["indices"])  # refilled (32 draws of 256: equal has odds ~0)
        with pytest.raises(ValueError, match=r"out must come from this buffer's sample_out\(16\)"):
            buf.sample(16, out=out)
        with pytest.raises(TypeError, match="rng must be a numpy.random.Generator"):
            buf.sample(4, rng=3)


@pytest.mark.parametrize("policy", ["global-lock", "lazy-writing", "optimistic", "pal-locks", "deferred"])
def test_a_lock_held_past_the_spin_budget_hands_the_call_to_python(policy):
    """Another thread holds the tree lock for 0.3 s, and on until the call has handed itself to
    Python (the kernel's spins are counted, not timed: on a loaded machine its yields can outlast
    any fixed hold): the kernel gives up after its spins (changing nothing), the policy's
    Python path waits for the lock, and the call's result is whole. Optimistic samples take no
    lock, so only its insert and update wait."""
    with SharedPrioritizedBuffer.create(256, FIELDS, policy=policy, seed=0) as buf:
        C.prefill(buf, 256, NB)
        held = threading.Event()
        before = 0

        def hold(fallback: bool):
            with buf.tree_lock:
                held.set()
                start = time.monotonic()
                time.sleep(0.3)
                while fallback and buf.fallbacks == before and time.monotonic() - start < 30:
                    time.sleep(0.01)

        for op in ("sample", "add", "update"):
            before = buf.fallbacks
            holder = threading.Thread(target=hold, args=(not (policy == "optimistic" and op == "sample"),))
            holder.start()
            held.wait(5)
            start = time.monotonic()
            if op == "sample":
                out = buf.sample(64)
                assert np.all(C.intact_rows(out))
            elif op == "add":
                slots = buf.add(C.make_batch(np.arange(5000, 5008), NB))
                assert np.all(buf.ring.stamps_at(slots) >= 0)
            else:
                out = buf.sample(8)
                assert buf.update_priorities(out["indices"], np.full(8, 2.0), out["stamps"]) == 8
            waited = time.monotonic() - start
            holder.join()
            held.clear()
            if policy == "optimistic" and op == "sample":
                assert waited < 0.25 and buf.fallbacks == before
            else:
                assert waited >= 0.2 and buf.fallbacks == before + 1, (op, waited)
        assert buf.lock_wait_seconds >= 0.4 and buf.tree_lock.holder() == 0


def test_reentrant_call_is_refused_as_before():
    """A thread that holds the tree lock and calls the buffer: the kernel sees its own token
    and hands over; the Python lock raises its "not reentrant" error (no deadlock)."""
    with SharedPrioritizedBuffer.create(64, FIELDS, policy="global-lock", seed=0) as buf:
        C.prefill(buf, 64, NB)
        with buf.tree_lock:
            with pytest.raises(RuntimeError, match="not reentrant"):
                buf.sample(4)


def test_kernel_counts_its_lock_hold_time_and_bad_updates_change_nothing():
    with SharedPrioritizedBuffer.create(1024, FIELDS, policy="global-lock", seed=0) as buf:
        C.prefill(buf, 1024, NB)
        before = buf.lock_hold_seconds
        for _ in range(20):
            buf.sample(256)
        assert buf.lock_hold_seconds > before and buf.tree_lock.hold_seconds == 0.0
        leaves = buf.tree.leaves().copy()
        with pytest.raises(ValueError, match="priorities"):
            buf.update_priorities(np.array([0, 1, 2]), np.array([1.0, np.nan, 1.0]))
        with pytest.raises(IndexError):
            buf.update_priorities(np.array([0, 5000]), np.array([1.0, 1.0]))
        np.testing.assert_array_equal(buf.tree.leaves(), leaves)
        assert buf.fallbacks == 0


@pytest.mark.parametrize("policy", concurrent.names())
def test_the_kernels_read_the_fill_level_themselves(policy):
    """The Python around the kernels reads no ring state: an empty buffer's sample is refused
    (STATUS_EMPTY, or the Python path's own check) without a lock taken or a fallback counted,
    and an update's index past the rows inserted so far is refused naming that count, with
    nothing written."""
    with SharedPrioritizedBuffer.create(64, FIELDS, policy=policy, seed=0) as buf:
        stats = buf._lockstats.copy()
        with pytest.raises(ValueError, match="cannot sample from an empty buffer"):
            buf.sample(4)
        np.testing.assert_array_equal(buf._lockstats, stats)
        C.prefill(buf, 10, NB)
        leaves = buf.tree.leaves().copy()
        with pytest.raises(IndexError, match=r"= 10 .*0 \.\. 9\b"):
            buf.update_priorities(np.array([0, 10]), np.array([1.0, 1.0]))
        np.testing.assert_array_equal(buf.tree.leaves(), leaves)
        assert buf.fallbacks == 0


def test_kernel_constants_match_the_ring():
    """The kernels take the tree lock at the ring's TREE_LOCK word, as SharedLock does."""
    from replaybench.impl.concurrent.ring import TREE_LOCK

    assert TREE_LOCK == 0 and shared_fused.LOCK_SPINS > 0


@pytest.fixture
def python_only_policy(monkeypatch):
    """A registered policy "python-only" whose methods override every fused protocol's (so it
    has none: the buffer runs its Python methods)."""
    from replaybench.impl.concurrent import policy
    from replaybench.impl.concurrent.policies.global_lock import GlobalLock

    monkeypatch.setattr(policy, "_policies", policy._policies.copy())

    @policy.register
    class PythonOnly(GlobalLock):
        name = "python-only"

        def select(self, n, rng):
            return super().select(n, rng)

        def insert(self, arrays, n, vals):
            return super().insert(arrays, n, vals)

        def update(self, idx, vals, stamps):
            return super().update(idx, vals, stamps)

    assert PythonOnly.fused_sample is None and PythonOnly.fused_insert is None and not PythonOnly.fused_update
    return PythonOnly


@pytest.mark.usefixtures("python_only_policy")
def test_shared_gil_share_measures_both_learner_calls():
    """bench.concurrency_workers.shared_gil_share: call and kernel times of sample and update, and the
    share between them, for every registered policy (one calling convention: sharded's own
    kernels run in the same compiled loops); refused for a policy without those kernels."""
    res = C.shared_gil_share("lazy-writing", 2048, batch=32, calls=20, repeats=1)
    for op in ("sample", "update", "add", "step"):
        assert 0 < res[op]["kernel_s"] and 0 < res[op]["call_s"] and 0.0 <= res[op]["gil_share"] < 1.0
    for policy in ("deferred", "pal-locks", "sharded", "atomic-deltas"):
        res = C.shared_gil_share(policy, 256, batch=8, calls=2, repeats=1)
        assert all(0 < res[op]["kernel_s"] for op in ("sample", "update", "add"))
    with pytest.raises(ValueError, match="op must be 'sample'"):
        C.shared_gil_share("python-only", 256, calls=2, repeats=1)


@pytest.mark.parametrize("policy", concurrent.names())
def test_every_policy_runs_its_operations_in_its_kernels(policy, monkeypatch):
    """Each registered policy declares all three fused operations, and with its Python
    methods made to raise, inserts (max priority and given), samples and updates still
    succeed from one thread: what the conformance, fuzz and kill tests exercise for it is the
    kernels (the Python methods are only the slow path for waits and recovery). Fails if a
    policy's kernel is bypassed."""
    cls = get_policy(policy)
    assert cls.fused_sample is not None and cls.fused_insert is not None and cls.fused_update
    with SharedPrioritizedBuffer.create(256, FIELDS, policy=policy, seed=0) as buf:
        def python_path(*args, **kwargs):
            raise AssertionError(f"policy {policy!r}: the Python path ran")

        for method in ("select", "insert", "update", "set_new_priorities", "flush", "apply"):
            monkeypatch.setattr(buf._policy, method, python_path)
        C.prefill(buf, 300, NB)
        buf.add(C.make_batch(np.arange(1000, 1016), NB), np.linspace(0.5, 2.0, 16))
        for _ in range(5):
            out = buf.sample(32)
            assert np.all(C.intact_rows(out))
            assert buf.update_priorities(out["indices"], np.full(32, 3.0), out["stamps"]) > 0
        assert buf.fallbacks == 0 and buf.kernel_calls == 12


@pytest.mark.parametrize("op", ["add", "update", "sample"])
def test_pal_locks_leaf_lock_held_past_the_spin_budget(op):
    """pal-locks' kernels take the leaf lock inside the tree lock for leaf writes only: held by
    another thread (a priority read) for 0.3 s, and for an insert or an update on until the
    call has handed itself to Python (the kernel's spins are counted, not timed: on a loaded
    machine they can outlast any fixed hold), an update hands the call to Python with nothing
    written (the stale count not doubled), an insert is finished by Python under the tree
    lock its kernel still holds, and a sample (no leaf write) does not wait."""
    with SharedPrioritizedBuffer.create(256, FIELDS, policy="pal-locks", seed=0) as buf:
        C.prefill(buf, 256, NB)
        held = threading.Event()

        def hold():
            with buf.leaf_lock:
                held.set()
                start = time.monotonic()
                time.sleep(0.3)
                while op != "sample" and buf.fallbacks == 0 and time.monotonic() - start < 30:
                    time.sleep(0.01)

        out = buf.sample(8)
        stamps = out["stamps"].copy()
        stamps[0] -= 256  # one stale entry
        stale = buf.counters()["stale_updates"]
        holder = threading.Thread(target=hold)
        holder.start()
        held.wait(5)
        start = time.monotonic()
        if op == "add":
            slots = buf.add(C.make_batch(np.arange(5000, 5008), NB), np.full(8, 4.0))
        elif op == "update":
            assert buf.update_priorities(out["indices"], np.full(8, 2.0), stamps) == 7
        else:
            assert np.all(C.intact_rows(buf.sample(64)))
        waited = time.monotonic() - start
        holder.join()
        if op == "sample":
            assert waited < 0.25 and buf.fallbacks == 0
        else:
            assert waited >= 0.2 and buf.fallbacks == 1, waited
        if op == "add":
            assert np.all(buf.ring.stamps_at(slots) >= 0)
            np.testing.assert_allclose(buf.priorities(slots), (4.0 + buf.eps) ** buf.alpha, rtol=1e-6)
        if op == "update":
            assert buf.counters()["stale_updates"] == stale + 1
        assert buf.tree_lock.holder() == 0 and buf.leaf_lock.holder() == 0
        leaves = buf.tree.leaves()
        assert buf.total() == pytest.approx(float(leaves.sum()), rel=1e-5)


def test_deferred_sample_drains_the_queue_in_its_kernel():
    """deferred's inserts and updates leave their deltas queued (the root lags the leaves);
    the next fused sample propagates them under the exclusive lock, after which the root is
    the leaves' sum again, with no Python call."""
    from replaybench.impl.concurrent.ring import queue_length

    with SharedPrioritizedBuffer.create(256, FIELDS, policy="deferred", seed=0) as buf:
        C.prefill(buf, 256, NB)
        buf.sample(4)
        ctrl = buf.ring.control
        assert queue_length(ctrl) == 0
        idx = np.arange(0, 64)
        assert buf.update_priorities(idx, np.full(64, 5.0)) == 64
        assert queue_length(ctrl) == 64
        assert buf.tree.total() != pytest.approx(float(buf.tree.leaves().sum()), rel=1e-6)  # inner nodes lag
        buf.sample(4)
        assert queue_length(ctrl) == 0 and buf.fallbacks == 0
        assert buf.tree.total() == pytest.approx(float(buf.tree.leaves().sum()), rel=1e-5)


def test_lock_token_names_the_forked_child():
    """my_token is cached per thread (it is on every fused call's path); a forked child must
    not reuse its parent's cached token, or its locks would name the parent's pid."""
    import multiprocessing as mp

    from replaybench.impl.concurrent.locks import my_token, token_pid

    assert token_pid(my_token()) == os.getpid()  # cached in this thread now
    ctx = mp.get_context("fork")
    with ctx.Pool(1) as pool:
        child_pid, child_token_pid = pool.apply(_child_token)
    assert child_pid != os.getpid() and child_token_pid == child_pid


def _child_token():
    from replaybench.impl.concurrent.locks import my_token, token_pid

    return os.getpid(), token_pid(my_token())


def test_a_subclass_that_overrides_a_method_is_not_bypassed_by_an_inherited_kernel(monkeypatch):
    """A policy deriving from lazy-writing that changes only its updates keeps lazy writing's
    fused insert and sample, but its own update method runs (the inherited fused update would
    have skipped it)."""
    from replaybench.impl.concurrent import policy
    from replaybench.impl.concurrent.policies.lazy_writing import LazyWriting

    monkeypatch.setattr(policy, "_policies", policy._policies.copy())
    calls = []

    @policy.register
    class CountedUpdates(LazyWriting):
        name = "counted-updates"

        def update(self, idx, vals, stamps):
            calls.append(idx.size)
            return super().update(idx, vals, stamps)

    assert CountedUpdates.fused_update is False and CountedUpdates.fused_insert == shared_fused.LAZY
    assert CountedUpdates.fused_sample == shared_fused.DRAW_LOCKED
    with SharedPrioritizedBuffer.create(64, FIELDS, policy="counted-updates", seed=0) as buf:
        C.prefill(buf, 64, NB)
        out = buf.sample(8)
        assert buf.update_priorities(out["indices"], np.ones(8), out["stamps"]) == 8 and calls == [8]
