"""impl.ratelimit: the one rate limiter, its bounds, waits and the no-deadlock slack."""

import threading
import time

import pytest

from replaybench.impl.ratelimit import RateLimiter, SampleToInsertRatio, Stopped


def test_the_bounds_by_hand():
    r = SampleToInsertRatio(samples_per_insert=0.5, min_size_to_sample=10, sample_slack=0, insert_slack=2)
    assert not r.may_sample(inserted=11, sampled=0, n=1)      # 0 + 1 > 0.5 * (11 - 10)
    assert r.may_sample(inserted=12, sampled=0, n=1)          # 1 <= 0.5 * 2
    assert not r.may_sample(inserted=12, sampled=1, n=1)
    assert r.may_insert(inserted=12, sampled=0, n=2)          # 0.5 * (14 - 10) - 0 = 2 <= 2
    assert not r.may_insert(inserted=12, sampled=0, n=3)
    assert r.deadlock_free(1, 4).insert_slack == 3.0 and r.deadlock_free(1, 2) is r


def counters():
    box = {"ins": 0, "smp": 0}
    return box, (lambda: box["ins"]), (lambda: box["smp"])


def test_a_blocked_wait_returns_at_its_deadline_and_records_what_it_waited():
    box, ins, smp = counters()
    lim = RateLimiter(SampleToInsertRatio(1.0, insert_slack=1), ins, smp, poll_s=1e-3, max_poll_s=1e-3)
    seen = []
    waited = lim.wait_sample(1, deadline=time.perf_counter() + 0.05, record=seen.append)
    assert waited >= 0.05 and seen == [waited]
    assert lim.wait_insert(1) == 0.0  # a backlog of 1 is within the slack
    assert lim.wait_insert(2, deadline=time.perf_counter() + 0.02) >= 0.02  # 2 is not


def test_a_stop_ends_a_wait_with_stopped_and_the_wait_is_still_recorded():
    box, ins, smp = counters()
    stop = threading.Event()
    lim = RateLimiter(SampleToInsertRatio(1.0), ins, smp, stopped=stop.is_set, poll_s=1e-3, max_poll_s=1e-3)
    threading.Timer(0.05, stop.set).start()
    seen = []
    with pytest.raises(Stopped):
        lim.wait_sample(1, record=seen.append)
    assert len(seen) == 1 and seen[0] >= 0.04


def test_a_writer_and_a_reader_keep_the_ratio_and_never_deadlock():
    """One writer inserting 8 at a time, one reader sampling 4 at a time at 2 samples per
    insert with the deadlock-free slack: both finish, and after every step the bounds held
    (checked by each side under the same lock that updates the counts)."""
    box, ins, smp = counters()
    bounds = SampleToInsertRatio(2.0, 16, 0.0, 0.0).deadlock_free(4, 8)
    lim = RateLimiter(bounds, ins, smp, poll_s=1e-5, max_poll_s=1e-4)
    lock, violations = threading.Lock(), []

    def writer():
        for _ in range(200):
            lim.wait_insert(8, deadline=time.perf_counter() + 10)
            with lock:
                box["ins"] += 8
                if 2.0 * (box["ins"] - 16) - box["smp"] > bounds.insert_slack:
                    violations.append(("insert", dict(box)))

    def reader():
        while box["smp"] < 2 * (1600 - 16):
            lim.wait_sample(4, deadline=time.perf_counter() + 10)
            with lock:
                if box["smp"] + 4 > 2.0 * (box["ins"] - 16):
                    continue  # a stale read let it through: the bound re-checked under the lock
                box["smp"] += 4

    threads = [threading.Thread(target=writer), threading.Thread(target=reader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "deadlock"
    assert violations == [] and box["ins"] == 1600 and box["smp"] == 2 * (1600 - 16)
