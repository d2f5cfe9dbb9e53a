"""The tree lock held shared: draws (lazy-writing, pal-locks, optimistic's locked fallback) run
together and exclude only tree writers, which wait for them (impl.concurrent.fused's
``_acquire_shared`` and the writers' drain; SharedLock's ``readers``)."""

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from replaybench.bench import concurrency_workers as C
from replaybench.impl import registry
from replaybench.impl.concurrent import SharedPrioritizedBuffer, fused, leaked_segments
from replaybench.impl.concurrent.locks import SharedLock, token_pid
from replaybench.impl.concurrent.policy import get as get_policy
from replaybench.impl.concurrent.ring import MAX_READERS, READERS_AT, TREE_LOCK

NB = C.TRANSITIONS["cartpole"]
FIELDS = C.schema(NB)
SHARED_DRAWS = ["lazy-writing", "pal-locks"]


@pytest.fixture(autouse=True)
def no_leaked_segments():
    before = set(leaked_segments(os.getpid()))
    yield
    assert not set(leaked_segments(os.getpid())) - before


def _live_foreign_token() -> int:
    """A token of this (living) process that no thread of it holds."""
    return (os.getpid() << 22) | ((threading.get_native_id() + 7919) & ((1 << 22) - 1))


def _dead_token() -> int:
    """A token of a process that has exited and been reaped."""
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                           check=True)
    return int(child.stdout) << 22 | 1


@pytest.mark.parametrize("policy", SHARED_DRAWS)
def test_a_draw_runs_beside_another_shared_holder_and_a_writer_waits_for_it(policy):
    """A reader word holds a live token (another draw in progress): a sample still draws in its
    kernel (no Python fallback); an update's kernel gives up without writing, leaving the word
    free, and the Python lock waits for the reader and, past the timeout, raises TimeoutError
    naming its pid with the tree and the word as they were. Once the reader leaves, the update
    goes through. (Before, draws took the lock exclusively and no reader words existed.)"""
    with SharedPrioritizedBuffer.create(256, FIELDS, policy=policy, seed=0, timeout=0.3) as buf:
        C.prefill(buf, 256, NB)
        ctrl = buf.ring.control
        reader = _live_foreign_token()
        ctrl[READERS_AT + 3] = reader
        before = buf.fallbacks
        out = buf.sample(64)
        assert np.all(C.intact_rows(out)) and buf.fallbacks == before
        leaves = buf.tree.leaves().copy()
        start = time.monotonic()
        with pytest.raises(TimeoutError, match=f"pid {token_pid(reader)}"):
            buf.update_priorities(out["indices"], np.full(64, 5.0), out["stamps"])
        assert time.monotonic() - start >= 0.25
        np.testing.assert_array_equal(buf.tree.leaves(), leaves)
        assert ctrl[TREE_LOCK] == 0 and ctrl[READERS_AT + 3] == reader
        ctrl[READERS_AT + 3] = 0
        assert buf.update_priorities(out["indices"], np.full(64, 5.0), out["stamps"]) == 64
        assert buf.fallbacks == before + get_policy(policy).fused_update  # the refused update's kernel handed over


@pytest.mark.parametrize("policy", SHARED_DRAWS + ["optimistic", "global-lock"])
def test_a_dead_readers_word_is_cleared_by_the_next_writer(policy):
    """A process that died inside a draw leaves its token in a reader word: the next insert and
    update go through (the kernel hands over, the Python lock clears the dead reader's word)."""
    with SharedPrioritizedBuffer.create(128, FIELDS, policy=policy, seed=0, timeout=5.0) as buf:
        C.prefill(buf, 128, NB)
        ctrl = buf.ring.control
        ctrl[READERS_AT + MAX_READERS - 1] = _dead_token()
        slots = buf.add(C.make_batch(np.arange(1000, 1008), NB))
        assert np.all(buf.ring.stamps_at(slots) >= 0)
        out = buf.sample(16)
        assert buf.update_priorities(out["indices"], np.full(16, 2.0), out["stamps"]) == 16
        assert not ctrl[READERS_AT:READERS_AT + MAX_READERS].any() and ctrl[TREE_LOCK] == 0


@pytest.mark.parametrize("policy", SHARED_DRAWS)
def test_a_draw_that_reaches_a_zero_leaf_is_redone_exclusively_with_the_same_result(policy):
    """Leaves zeroed behind the inner sums (as float drift leaves mass over an empty leaf): a
    shared draw that reaches one hands over to the exclusive draw with the same key, whose
    redraw may rebuild; the result is the in-process buffer's for the same tree and seed, and
    never a zeroed slot."""
    capacity = 256
    plain = registry.create("kary-aligned", capacity, FIELDS, seed=0)
    with SharedPrioritizedBuffer.create(capacity, FIELDS, policy=policy, seed=0) as shared:
        batch = C.make_batch(np.arange(capacity), NB)
        plain.add(batch)
        shared.add(batch)
        zeroed = np.arange(1, capacity, 2)  # each group's last leaf among them: where an overshoot lands
        plain.tree.write_leaves(zeroed, np.zeros(zeroed.size))
        with shared.tree_lock:
            shared.tree.write_leaves(zeroed, np.zeros(zeroed.size))
        taken = shared._lockstats[fused.ACQUISITIONS]
        for seed in range(5):
            mine = plain.sample(32, rng=np.random.default_rng(seed))
            theirs = shared.sample(32, rng=np.random.default_rng(seed))
            np.testing.assert_array_equal(theirs["indices"], mine["indices"])
            np.testing.assert_array_equal(theirs["weights"], mine["weights"])
            assert np.all(theirs["indices"] % 2 == 0)
        assert shared.fallbacks == 0
        # every draw took the lock twice: shared, then exclusively for the redraw
        assert shared._lockstats[fused.ACQUISITIONS] - taken == 10


def test_draws_of_two_threads_overlap_and_writers_stay_exclusive():
    """Two threads sampling while a third updates, on one lazy-writing buffer: every sample
    is whole and its weights finite, the updates all land, and after the writers stop the
    root is the sum of the leaves (a draw under a writer, or a write under a draw, would
    break one of them); no lock or reader word is left held."""
    with SharedPrioritizedBuffer.create(4096, FIELDS, policy="lazy-writing", seed=0) as buf:
        C.prefill(buf, 4096, NB)
        stop = threading.Event()
        failures: list = []
        applied = []

        def sampler(seed):
            mine = SharedPrioritizedBuffer.attach(buf.handle, seed=seed)
            try:
                while not stop.is_set():
                    out = mine.sample(128)
                    if not (np.all(C.intact_rows(out)) and np.all(np.isfinite(out["weights"]))):
                        failures.append("a torn or weightless sample")
            except BaseException as err:
                failures.append(err)
            finally:
                mine.close()

        def updater():
            mine = SharedPrioritizedBuffer.attach(buf.handle, seed=99)
            rng = np.random.default_rng(1)
            try:
                for _ in range(300):
                    idx = rng.integers(0, 4096, 64)
                    applied.append(mine.update_priorities(idx, rng.random(64) + 0.1))
            except BaseException as err:
                failures.append(err)
            finally:
                mine.close()

        threads = [threading.Thread(target=sampler, args=(s,)) for s in (1, 2)]
        writer = threading.Thread(target=updater)
        for t in threads + [writer]:
            t.start()
        writer.join(60)
        stop.set()
        for t in threads:
            t.join(60)
        assert not failures and not writer.is_alive() and not any(t.is_alive() for t in threads)
        assert sum(applied) == 300 * 64
        ctrl = buf.ring.control
        assert ctrl[TREE_LOCK] == 0 and not ctrl[READERS_AT:READERS_AT + MAX_READERS].any()
        leaves = buf.tree.leaves().astype(np.float64)
        assert buf.tree.total() == pytest.approx(leaves.sum(), rel=1e-4)


def test_shared_lock_waits_for_readers_and_restores_a_taken_over_word_on_timeout():
    """SharedLock with reader words: acquire waits until a live reader leaves (counted as wait);
    a reader that stays past the timeout makes it release the word and name the reader; when
    the acquisition took over a dead holder's word, the word goes back to that holder, so the
    next waiter still recovers it."""
    words = np.zeros(8, dtype=np.int64)
    lock = SharedLock(words, 0, "t", timeout=0.2, check_every=0.01, readers=range(4, 8))
    words[5] = _live_foreign_token()
    threading.Timer(0.1, lambda: words.__setitem__(5, 0)).start()
    with lock:
        assert lock.wait_seconds >= 0.08
    words[6] = _live_foreign_token()
    with pytest.raises(TimeoutError, match="shared holder"):
        lock.acquire()
    assert words[0] == 0
    dead = _dead_token()
    words[0] = dead
    recovered = []
    lock = SharedLock(words, 0, "t", timeout=0.2, check_every=0.01, readers=range(4, 8),
                      on_recover=recovered.append)
    with pytest.raises(TimeoutError, match="shared holder"):
        lock.acquire()
    assert words[0] == dead and not recovered
    words[6] = 0
    with lock:
        assert recovered == [dead]
    with pytest.raises(ValueError, match="readers"):
        SharedLock(words, 0, "t", readers=range(0, 4))
