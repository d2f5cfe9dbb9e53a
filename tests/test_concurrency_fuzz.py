"""Fuzz test of the shared buffer: random sequences of valid and invalid calls (add, sample,
update_priorities), each made by this process or by a second process attached to the same
buffer. Calls are made one at a time, so after every call the expected outcome is known:
an invalid call must be refused with a clear error (never a crash, an OverflowError or a
RuntimeError) and change nothing (len, stamps, leaves, root total, max priority, in-flight
table, counters); a valid one must work. After each sequence the stress oracle checks the
whole buffer; at the end nothing of ours is left in /dev/shm and the child has exited.

``make test`` runs a few examples per policy (a few seconds); ``make test-slow`` many more.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from replaybench.bench import concurrency_workers as C
from replaybench.impl import concurrent
from replaybench.impl.concurrent import SharedPrioritizedBuffer, leaked_segments

from _concurrency_oracle import verify_final

NB = C.TRANSITIONS["cartpole"]
CAPACITY = 32
REFUSALS = (ValueError, TypeError, IndexError, KeyError)  # what bad input may raise, nothing else
GOOD = st.floats(0.0, 100.0)
# Each example starts calls in a second process: no per-example deadline, and no health check on
# how fast examples are made (a loaded machine is slow at that, which says nothing of the buffer).
SETTINGS = dict(deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
BAD = st.sampled_from([float("nan"), float("inf"), -1.0, 1e300])  # 1e300: (p + eps) ** alpha overflows


@st.composite
def calls(draw) -> dict:
    """One call: who makes it, what, and whether some argument is invalid (``bad``)."""
    who = draw(st.sampled_from(["parent", "child"]))
    op = draw(st.sampled_from(["add", "add", "sample", "update", "update"]))
    call = {"who": who, "op": op, "bad": False}
    if op == "add":
        n = draw(st.integers(1, CAPACITY + 8))
        call["n"] = n
        call["fault"] = draw(st.sampled_from([None, None, None, "missing-field", "payload-shape", "ragged"]))
        kind = draw(st.sampled_from(["max", "given", "bad"]))
        call["priorities"] = None if kind == "max" else draw(st.lists(GOOD, min_size=n, max_size=n))
        if kind == "bad":
            call["priorities"][draw(st.integers(0, n - 1))] = draw(BAD)
        call["bad"] = call["fault"] is not None or kind == "bad"
    elif op == "sample":
        call["batch_size"] = draw(st.one_of(st.integers(1, 64), st.sampled_from([0, -3, 2.5, True])))
        call["beta"] = draw(st.one_of(st.none(), st.floats(0.0, 1.0), st.sampled_from([1.5, -0.1, "x"])))
        call["bad"] = not (type(call["batch_size"]) is int and call["batch_size"] >= 1) or \
            not (call["beta"] is None or isinstance(call["beta"], float) and 0.0 <= call["beta"] <= 1.0)
    else:
        n = draw(st.integers(1, 16))
        call["where"] = draw(st.lists(st.floats(0.0, 0.999), min_size=n, max_size=n))  # fractions of len
        call["priorities"] = draw(st.lists(GOOD, min_size=n, max_size=n))
        call["stamps"] = draw(st.sampled_from(["none", "sampled", "sampled", "float", "short"]))
        fault = draw(st.sampled_from([None, None, None, "index", "negative-index", "priority", "length"]))
        if fault == "priority":  # placed when the call is made: a sampled update may use fewer than n entries
            call["bad_priority"] = (draw(st.floats(0.0, 0.999)), draw(BAD))
        call["fault"] = fault
        call["bad"] = fault is not None or call["stamps"] in ("float", "short")
    return call


def perform(buf, call: dict, first_id: int, last_sample):
    """Make ``call`` on ``buf``; returns what the parent needs (the sampled indices and stamps)."""
    if call["op"] == "add":
        batch = C.make_batch(np.arange(first_id, first_id + call["n"]), NB)
        if call["fault"] == "missing-field":
            del batch["check"]
        elif call["fault"] == "payload-shape":
            batch["payload"] = batch["payload"][:, :-1]
        elif call["fault"] == "ragged":
            batch["id"] = batch["id"][:-1]
        buf.add(batch, priorities=call["priorities"])
        return None
    if call["op"] == "sample":
        out = buf.sample(call["batch_size"], beta=call["beta"])
        assert np.all(C.intact_rows(out)) and np.all(buf.priorities(out["indices"]) > 0)
        return out["indices"], out["stamps"]
    n = len(call["where"])
    if call["stamps"] in ("sampled", "float", "short") and last_sample is not None:
        idx, stamps = last_sample[0][:n].copy(), last_sample[1][:n].copy()
        n = idx.size
    else:
        idx, stamps = (np.array(call["where"]) * len(buf)).astype(np.int64), None
    vals = np.array(call["priorities"][:n])
    if call["fault"] == "priority":
        at, value = call["bad_priority"]
        vals[int(at * n)] = value
    elif call["fault"] == "index":
        idx[-1] = len(buf)
    elif call["fault"] == "negative-index":
        idx[0] = -1
    elif call["fault"] == "length":
        vals = vals[:-1] if n > 1 else np.ones(2)
    if call["stamps"] == "float":
        stamps = np.zeros(n) + 0.5
    elif call["stamps"] == "short":
        stamps = np.zeros(n + 1, np.int64)
    buf.update_priorities(idx, vals, stamps)
    return None


def refused_when_valid(buf, call: dict, last_sample) -> bool:
    """Whether a call with valid arguments must still be refused in the buffer's state."""
    if call["op"] == "sample" or (call["op"] == "update" and call["stamps"] == "none"):
        return len(buf) == 0  # nothing to sample, no valid index
    if call["op"] == "update" and last_sample is None:
        return len(buf) == 0
    return False


def serve(conn) -> None:
    """Child process: attach to the handles it is sent and make the calls it is sent."""
    buf = None
    while True:
        msg = conn.recv()
        if msg is None:
            break
        kind, payload = msg
        if kind == "attach":
            buf = SharedPrioritizedBuffer.attach(payload, seed=1)
            conn.send(("ok", None))
        elif kind == "close":
            buf.close()
            conn.send(("ok", None))
        else:
            try:
                conn.send(("ok", perform(buf, *payload)))
            except Exception as err:  # the parent judges whether this refusal was right
                conn.send(("refused", f"{type(err).__name__}: {err}", type(err) in REFUSALS))


@pytest.fixture(scope="module")
def child():
    """One attached second process for the whole module; on teardown it must exit and leave
    no segment behind."""
    ctx = mp.get_context("spawn")
    conn, theirs = ctx.Pipe()
    proc = ctx.Process(target=serve, args=(theirs,), daemon=True)
    proc.start()
    yield conn
    conn.send(None)
    proc.join(60)
    alive = proc.is_alive()
    if alive:
        proc.kill()
        proc.join(10)
    assert not alive and proc.exitcode == 0, "the fuzz child did not exit cleanly"
    assert leaked_segments(os.getpid()) == []  # the segments' names carry their creator's pid


def _ask(conn, msg):
    conn.send(msg)
    if not conn.poll(120):
        raise TimeoutError("the fuzz child did not answer in 120 s (deadlock?)")
    return conn.recv()


def _state(buf) -> dict:
    return {"len": len(buf), "inserted": buf.inserted, "stamps": buf.ring.stamps_snapshot(),
            "leaves": buf.tree.leaves(), "total": buf.total(), "max_priority": buf.max_priority,
            "in_flight": buf.ring.in_flight(), "counters": buf.counters()}


def _same(before: dict, after: dict) -> bool:
    return all(np.array_equal(after[k], v) if isinstance(v, np.ndarray) else after[k] == v
               for k, v in before.items())


def run_sequence(child, policy: str, sequence: list[dict]) -> None:
    with SharedPrioritizedBuffer.create(CAPACITY, C.schema(NB), policy=policy, seed=0, alpha=1.0,
                                        eps=0.01) as buf:
        assert _ask(child, ("attach", buf.handle))[0] == "ok"
        next_id, last_sample, accepted = 0, None, 0
        try:
            for step, call in enumerate(sequence):
                expect_refusal = call["bad"] or refused_when_valid(buf, call, last_sample)
                before = _state(buf)
                if call["who"] == "child":
                    status, *rest = _ask(child, ("call", (call, next_id, last_sample)))
                else:
                    try:
                        status, rest = "ok", [perform(buf, call, next_id, last_sample)]
                    except Exception as err:
                        status, rest = "refused", [f"{type(err).__name__}: {err}", type(err) in REFUSALS]
                where = f"step {step}, {call}"
                if status == "refused":
                    message, clear = rest
                    assert expect_refusal, f"valid call refused: {message} at {where}"
                    assert clear, f"refused with an unclear error: {message} at {where}"
                    assert _same(before, _state(buf)), f"refused call changed the buffer: {message} at {where}"
                    continue
                assert not expect_refusal, f"invalid call accepted at {where}"
                if call["who"] == "parent":
                    accepted += 1
                if call["op"] == "add":
                    next_id += call["n"]
                elif call["op"] == "sample":
                    last_sample = rest[0]
            assert verify_final(buf, {0: next_id}) == []
            # every call of ours that was accepted ran in the policy's fused kernel (the Python
            # path is only the slow path behind it)
            assert buf.kernel_calls >= accepted, (buf.kernel_calls, accepted)
        finally:
            assert _ask(child, ("close", None))[0] == "ok"


def _add(who, n, priorities=None, fault=None, bad=False):
    return {"who": who, "op": "add", "n": n, "priorities": priorities, "fault": fault, "bad": bad}


#: Always tried first: issue 11.2's repro (a refused add that used to reserve slots, so that
#: adds wrapping onto them failed), from both processes, then a sample and an update.
REPRO = [_add("parent", 4), _add("child", 2, [1.0, 1e300], bad=True), _add("parent", 2, [1e300, 1.0], bad=True),
         *[_add(who, 4) for who in ("child", "parent") * 5],
         {"who": "child", "op": "sample", "batch_size": 8, "beta": None, "bad": False},
         {"who": "parent", "op": "update", "where": [0.5] * 8, "priorities": [2.0] * 8, "stamps": "sampled",
          "fault": None, "bad": False}]


@pytest.mark.parametrize("policy", concurrent.names())
def test_random_calls_from_two_processes(child, policy):
    settings(max_examples=8, **SETTINGS)(
        given(st.lists(calls(), min_size=1, max_size=20))(
            example(REPRO)(lambda seq: run_sequence(child, policy, seq))))()


@pytest.mark.slow
@pytest.mark.parametrize("policy", concurrent.names())
def test_random_calls_from_two_processes_long(child, policy):
    settings(max_examples=200, **SETTINGS)(
        given(st.lists(calls(), min_size=1, max_size=60))(lambda seq: run_sequence(child, policy, seq)))()


# ----------------------------------------------------------------------------- close() racing with calls
#: Child process of the close race (a segfault there fails the test instead of killing pytest):
#: for each policy in turn, three threads add, sample, and update and read priorities on one
#: buffer object while the main thread closes it at a random moment (0-1 ms after they start). Every call must either finish
#: normally or be refused with BufferClosed, and a tree handed out before the close must
#: refuse too; anything else is printed and ends the child with exit status 1.
CLOSE_RACE = """
import random, sys, threading, time
import numpy as np
from replaybench.bench import concurrency_workers as C
from replaybench.impl import concurrent
from replaybench.impl.concurrent import BufferClosed, SharedPrioritizedBuffer

rounds, seed = int(sys.argv[1]), int(sys.argv[2])
pick = random.Random(seed)
sys.setswitchinterval(1e-5)  # hand the GIL over often: more calls caught mid-way, and less waiting
NB = 40

def worker(buf, op, go, errors):
    rng = np.random.default_rng(pick.randrange(2**32))
    ids = 10**6
    go.wait()
    try:
        while True:
            if op == "add":
                buf.add(C.make_batch(np.arange(ids, ids + 4), NB)); ids += 4
            elif op == "sample":
                out = buf.sample(8)
                assert np.all(C.intact_rows(out)), "torn row sampled"
            else:
                buf.update_priorities(rng.integers(0, 16, 4), rng.random(4) + 0.1)
                buf.priorities(rng.integers(0, 16, 4))
                buf.total()
    except BufferClosed:
        pass
    except BaseException as err:
        errors.append(f"{op}: {type(err).__name__}: {err}")

errors = []
for r in range(rounds):
    policy = concurrent.names()[r % len(concurrent.names())]
    buf = SharedPrioritizedBuffer.create(32, C.schema(NB), policy=policy, seed=r)
    buf.add(C.make_batch(np.arange(16), NB))
    tree = buf.tree
    go = threading.Barrier(4)  # the three workers and this thread start together
    threads = [threading.Thread(target=worker, args=(buf, op, go, errors)) for op in ("add", "sample", "update")]
    for t in threads:
        t.start()
    go.wait()
    time.sleep(pick.random() * 1e-3)
    buf.close()
    for t in threads:
        t.join(30)
        if t.is_alive():
            errors.append(f"a thread is still in a call 30 s after close()")
    try:
        tree.total()
        errors.append(f"round {r} ({policy}): a tree handed out before close() still worked after it")
    except BufferClosed:
        pass
    if errors:
        print(f"round {r} ({policy}):", *errors[:5], sep="\\n  ")
        sys.exit(1)
print(f"{rounds} rounds, no crash")
"""


def _close_race(rounds: int, seed: int, timeout: float) -> None:
    proc = subprocess.run([sys.executable, "-c", CLOSE_RACE, str(rounds), str(seed)], capture_output=True,
                          text=True, timeout=timeout, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert proc.returncode == 0 and "no crash" in proc.stdout, \
        (f"exit status {proc.returncode} (-11: segfault)", proc.stdout[-2000:], proc.stderr[-2000:])


def test_close_racing_with_calls_in_other_threads():
    """Issue 28.2: close() while other threads are in add, sample, update or priorities used
    to unmap the memory under them (segfault in 3-5 of 6 tries). Now close waits for calls in
    flight, later calls are refused with BufferClosed, and nothing crashes."""
    _close_race(rounds=300, seed=0, timeout=120)


@pytest.mark.slow
def test_close_racing_with_calls_in_other_threads_long():
    _close_race(rounds=2000, seed=1, timeout=600)


@pytest.mark.parametrize("policy", ["pal-locks", "deferred"])
def test_an_overflowing_priority_is_refused_before_stale_entries_are_dropped(policy):
    """The policies without a fused update (their Python path) refuse a priority whose
    (p + eps) ** alpha overflows the tree whether or not its entry's stamp is stale, and change
    nothing (no stale-update count either): the fuzz found both an overflow accepted because its
    entry was stale and a refusal that had already counted the stale entries."""
    with SharedPrioritizedBuffer.create(CAPACITY, C.schema(NB), policy=policy, seed=0, alpha=1.0,
                                        eps=0.01) as buf:
        buf.add(C.make_batch(np.arange(4), NB))
        out = buf.sample(4)
        buf.add(C.make_batch(np.arange(4, 4 + CAPACITY), NB))  # every sampled slot overwritten: stale
        for vals in ([1e300] * 4, [1.0, 1.0, 1.0, 1e300]):
            before = _state(buf)
            with pytest.raises(ValueError, match="too large"):
                buf.update_priorities(out["indices"], vals, out["stamps"])
            assert _same(before, _state(buf))
