"""Concurrency policies and the shared-memory buffer: atomics, locks, shared memory cleanup,
stress runs with threads and processes (nothing lost, duplicated or torn; no deadlock), lazy
writing's reserved slots, and recovery from a worker killed mid-insert."""

import multiprocessing as mp
import os
import pathlib
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from replaybench.bench import concurrency_workers as C
from replaybench.impl import concurrent, registry
from replaybench.impl.concurrent import SharedPrioritizedBuffer, leaked_segments
from replaybench.impl.concurrent.atomics import cas, fetch_add
from replaybench.impl.concurrent.guard import BufferClosed, CallGate
from replaybench.impl.concurrent.locks import SharedLock, token_pid
from replaybench.impl.concurrent.shm import SharedArena

from _concurrency_oracle import DEAD_WRITER, die_mid_insert, die_mid_shard_publish, stop_mid_insert, verify_final
from _examples import load_example

NB = C.TRANSITIONS["cartpole"]
FIELDS = C.schema(NB)


@pytest.fixture(autouse=True)
def no_leaked_segments():
    before = set(leaked_segments(os.getpid()))  # only ours: other test runs may share the machine
    yield
    leaked = set(leaked_segments(os.getpid())) - before
    assert not leaked, f"shared-memory segments left behind: {sorted(leaked)}"


def make(policy, capacity=4096, variant="kary-aligned", prefill=1000, **kw):
    buf = SharedPrioritizedBuffer.create(capacity, FIELDS, variant=variant, policy=policy, seed=0, **kw)
    if prefill:
        C.prefill(buf, prefill, NB)
    return buf


# ----------------------------------------------------------------------------- building blocks
def test_atomics_do_not_lose_increments_across_threads():
    from numba import njit

    from replaybench.impl.concurrent.atomics import atomic_add

    @njit(nogil=True)
    def hammer(a, n):
        for _ in range(n):
            atomic_add(a, 0, 1)
            atomic_add(a, 1, 1)  # a plain += here would lose increments; atomic_add must not

    a = np.zeros(2, np.int64)
    threads = [threading.Thread(target=hammer, args=(a, 200_000)) for _ in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert a.tolist() == [800_000, 800_000]
    assert cas(a, 0, 5, 9) == 800_000 and a[0] == 800_000  # failed CAS leaves the value
    assert cas(a, 0, 800_000, 9) == 800_000 and a[0] == 9
    f = np.zeros(1, np.float32)
    assert fetch_add(f, 0, 1.5) == 0.0 and f[0] == 1.5


def test_lock_excludes_threads_and_is_not_reentrant():
    words = np.zeros(2, np.int64)
    counter = [0]

    def work():
        lock = SharedLock(words, 0, "t")
        for _ in range(2000):
            with lock:
                v = counter[0]
                time.sleep(0) if v % 97 == 0 else None  # invite a switch inside the section
                counter[0] = v + 1

    threads = [threading.Thread(target=work) for _ in range(3)]
    [t.start() for t in threads]
    [t.join(60) for t in threads]
    assert counter[0] == 6000 and words[0] == 0
    lock = SharedLock(words, 0, "t")
    with lock:
        with pytest.raises(RuntimeError, match="not reentrant"):
            lock.acquire()
    with pytest.raises(RuntimeError, match="does not hold it"):
        lock.release()


def test_lock_times_out_naming_the_live_holder():
    words = np.zeros(1, np.int64)
    held, done = threading.Event(), threading.Event()

    def holder():
        with SharedLock(words, 0, "x"):
            held.set()
            done.wait(10)

    t = threading.Thread(target=holder)
    t.start()
    held.wait(5)
    try:
        with pytest.raises(TimeoutError, match=f"lock 'x' not acquired .* held by pid {os.getpid()}"):
            SharedLock(words, 0, "x", timeout=0.2).acquire()
    finally:
        done.set()
        t.join()


def test_arena_attach_sees_writes_and_close_unlinks():
    arena = SharedArena.create({"a": ((8,), "float32"), "b": ((3, 2), "int64")})
    other = SharedArena.attach(arena.spec)
    other.arrays["b"][1, 1] = 42
    assert arena.arrays["b"][1, 1] == 42
    assert all(v.ctypes.data % 64 == 0 for v in arena.arrays.values())
    other.close()
    assert arena.spec.name in leaked_segments()
    arena.close()
    arena.close()  # idempotent
    assert arena.spec.name not in leaked_segments()
    with pytest.raises(FileNotFoundError, match="does not exist"):
        SharedArena.attach(arena.spec)


@pytest.mark.parametrize("ending", ["normal", "exception", "killed"])
def test_owner_process_leaves_no_segment(ending):
    """The owner exits normally, by an uncaught exception, or by SIGKILL: no segment remains
    (after a kill, multiprocessing's resource tracker unlinks it)."""
    code = textwrap.dedent(f"""
        import os, signal, sys
        from replaybench.impl.concurrent import SharedPrioritizedBuffer
        from replaybench.bench.concurrency_workers import schema
        buf = SharedPrioritizedBuffer.create(1024, schema(40), variant="binary", policy="lazy-writing")
        print(buf.handle.arena.name, flush=True)
        if "{ending}" == "exception":
            raise RuntimeError("boom")
        if "{ending}" == "killed":
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=os.path.dirname(os.path.dirname(__file__)))
    name = proc.stdout.split()[0]
    for _ in range(100):  # the resource tracker notices its parent's death asynchronously
        if name not in leaked_segments():
            break
        time.sleep(0.1)
    assert name not in leaked_segments(), proc.stderr


# ----------------------------------------------------------------------------- API and errors
def test_bad_arguments_are_refused_by_name():
    with pytest.raises(ValueError, match="unknown policy 'nope'; known: "):
        SharedPrioritizedBuffer.create(64, FIELDS, policy="nope")
    with pytest.raises(NotImplementedError, match="pal-locks.*PrefixKarySumTree"):
        SharedPrioritizedBuffer.create(64, FIELDS, variant="kary-prefix", policy="pal-locks")
    with pytest.raises(ValueError, match="cannot be shared"):
        SharedPrioritizedBuffer.create(64, FIELDS, variant="uniform")
    with pytest.raises(ValueError, match="'stamps' is reserved"):
        SharedPrioritizedBuffer.create(64, {"stamps": ((), "int64")}, variant="binary")
    with make("lazy-writing", capacity=64, prefill=0) as buf:
        with pytest.raises(ValueError, match="empty buffer"):
            buf.sample(4)
        C.prefill(buf, 10, NB)
        with pytest.raises(ValueError, match="batch_size must be a positive integer, got 0"):
            buf.sample(0)
        with pytest.raises(ValueError, match="beta must be a number in \\[0, 1\\], got 2"):
            buf.sample(4, beta=2)
        before = buf.tree.leaves().copy()
        with pytest.raises(ValueError, match="priorities"):
            buf.update_priorities([0, 1], [1.0, float("nan")])
        with pytest.raises(IndexError):
            buf.update_priorities([0, 11], [1.0, 1.0])
        with pytest.raises(ValueError, match="stamps must be an integer array"):
            buf.update_priorities([0, 1], [1.0, 1.0], stamps=[0.5, 1.5])
        np.testing.assert_array_equal(buf.tree.leaves(), before)
        assert buf.tree_lock.holder() == 0  # errors released the lock


def test_closed_buffer_refuses_every_method():
    """After close, every method of the owner and of an attached object raises "buffer is
    closed" and never touches the unmapped memory (it used to end the interpreter with a
    segfault). Run in a child process, so a crash fails this test instead of killing pytest."""
    code = textwrap.dedent("""
        import numpy as np
        from replaybench.impl.concurrent import BufferClosed, SharedPrioritizedBuffer
        from replaybench.bench.concurrency_workers import make_batch, schema

        owner = SharedPrioritizedBuffer.create(64, schema(40), policy="lazy-writing")
        owner.add(make_batch(np.arange(8), 40))
        other = SharedPrioritizedBuffer.attach(owner.handle)
        calls = {
            "len": len, "capacity": lambda b: b.capacity, "owner": lambda b: b.owner,
            "inserted": lambda b: b.inserted, "max_priority": lambda b: b.max_priority,
            "lock_wait_seconds": lambda b: b.lock_wait_seconds, "counters": lambda b: b.counters(),
            "add": lambda b: b.add(make_batch(np.arange(2), 40)), "sample": lambda b: b.sample(4),
            "update_priorities": lambda b: b.update_priorities([0, 1], [1.0, 2.0]),
            "total": lambda b: b.total(), "priorities": lambda b: b.priorities([0]),
            "warm_up": lambda b: b.warm_up(), "tree": lambda b: b.tree, "storage": lambda b: b.storage,
            "ring": lambda b: b.ring, "tree_lock": lambda b: b.tree_lock, "leaf_lock": lambda b: b.leaf_lock,
            "with": lambda b: b.__enter__(),
        }
        for buf in (other, owner):  # the attached object first: the owner's close unlinks
            buf.close()
            buf.close()  # idempotent
            for name, call in calls.items():
                try:
                    call(buf)
                except BufferClosed as err:
                    assert isinstance(err, ValueError) and str(err).startswith("buffer is closed"), (name, err)
                else:
                    raise AssertionError(f"{name} worked on a closed buffer")
            assert buf.closed
        print("all refused")
    """)
    _run_child(code, "all refused")


def test_parts_handed_out_refuse_after_close():
    """Issue 28.2: ``t = b.tree; b.close(); t.total()`` used to segfault. Every part handed
    out before close (tree, storage, ring, locks, and their bound methods) now raises
    BufferClosed naming the part; a raw array taken from a part keeps its memory mapped until
    it is dropped, so reading it after close is safe (it is what the buffer held)."""
    code = textwrap.dedent("""
        import numpy as np
        from replaybench.impl.concurrent import BufferClosed, SharedPrioritizedBuffer
        from replaybench.impl.concurrent.shm import SharedArena
        from replaybench.bench.concurrency_workers import make_batch, schema

        for policy in ("lazy-writing", "deferred"):
            buf = SharedPrioritizedBuffer.create(64, schema(40), policy=policy)
            buf.add(make_batch(np.arange(8), 40))
            parts = {name: getattr(buf, name) for name in ("tree", "storage", "ring", "tree_lock", "leaf_lock")}
            total = parts["tree"].total
            ids = parts["storage"].columns["id"]
            buf.close()
            uses = {"tree.total()": lambda: parts["tree"].total(), "bound tree.total": total,
                    "tree.leaves()": lambda: parts["tree"].leaves(), "storage.columns": lambda: parts["storage"].columns,
                    "ring.stamps_snapshot()": lambda: parts["ring"].stamps_snapshot(),
                    "tree_lock.holder()": lambda: parts["tree_lock"].holder(),
                    "with tree_lock": lambda: parts["tree_lock"].__enter__(),
                    "leaf_lock.acquire()": lambda: parts["leaf_lock"].acquire()}
            for use, call in uses.items():
                part = use.split(".")[0].split()[-1]
                try:
                    call()
                except BufferClosed as err:
                    assert f"its {part} (buf.{part})" in str(err) and "buffer is closed" in str(err), (use, err)
                else:
                    raise AssertionError(f"{use} worked after close")
            assert ids[:8].tolist() == list(range(8))  # still mapped: the view holds the mapping

        arena = SharedArena.create({"a": ((1024,), "float64")})
        view = arena.arrays["a"]
        view[:] = 7.0
        arena.close()
        assert view.sum() == 7.0 * 1024
        print("all refused")
    """)
    _run_child(code, "all refused")


def test_close_waits_for_a_call_in_flight():
    """Issue 28.2: close() from one thread while another is inside a call (here: waiting for
    the tree lock, which this thread holds) waits for that call to return, refuses new calls
    meanwhile, then closes. It used to unmap at once, under the waiting call."""
    code = textwrap.dedent("""
        import threading, time
        import numpy as np
        from replaybench.impl.concurrent import BufferClosed, SharedPrioritizedBuffer
        from replaybench.bench.concurrency_workers import make_batch, schema

        buf = SharedPrioritizedBuffer.create(64, schema(40), policy="global-lock")
        buf.add(make_batch(np.arange(8), 40))
        got = []
        lock = buf.tree_lock
        with lock:
            caller = threading.Thread(target=lambda: got.append(buf.total()))
            caller.start()
            time.sleep(0.2)  # the caller is now waiting for the lock, inside total()
            closer = threading.Thread(target=buf.close)
            closer.start()
            time.sleep(0.2)
            assert closer.is_alive() and not buf.closed, "close() did not wait for the call in flight"
            try:
                buf.sample(2)
                raise AssertionError("a new call was accepted while closing")
            except BufferClosed:
                pass
        caller.join(10)
        closer.join(10)
        assert got == [8.0] and buf.closed and not closer.is_alive(), got
        print("waited")
    """)
    _run_child(code, "waited")


def test_call_gate_refuses_close_from_inside_a_call_and_after_close():
    gate = CallGate("the thing", "seg")
    me = gate.enter()
    with pytest.raises(RuntimeError, match="close\\(\\) was called from inside a call on the thing"):
        gate.shut(1.0)
    assert not gate.shut_down
    gate.leave(me)
    gate.leave(gate.enter())  # still open: the refused close changed nothing
    assert gate.shut(1.0) and not gate.shut(1.0)  # True once
    with pytest.raises(BufferClosed, match="buffer is closed \\(shared segment 'seg'\\): the thing can no"):
        gate.enter()


def _run_child(code: str, done: str) -> None:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=os.path.dirname(os.path.dirname(__file__)))
    assert proc.returncode == 0 and done in proc.stdout, \
        (f"exit status {proc.returncode} (-11: segfault)", proc.stderr[-3000:])


def _state(buf) -> dict:
    """Everything a refused call must leave as it was (deferred's total() drains its queue,
    which changes no stored priority)."""
    return {"len": len(buf), "inserted": buf.inserted, "stamps": buf.ring.stamps_snapshot(),
            "leaves": buf.tree.leaves(), "total": buf.total(), "max_priority": buf.max_priority,
            "in_flight": buf.ring.in_flight(), "counters": buf.counters()}


def assert_same_state(before: dict, after: dict) -> None:
    assert before.keys() == after.keys()
    for key, value in before.items():
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(after[key], value, err_msg=key)
        else:
            assert after[key] == value, key


@pytest.mark.parametrize("policy", concurrent.names())
def test_refused_add_changes_nothing(policy):
    """A priority whose (p + eps) ** alpha the tree cannot hold is refused before any slot is
    reserved: len, stamps, leaves and the in-flight table are as before, and later adds that
    wrap the ring onto those slots work (they used to fail with OverflowError)."""
    with make(policy, capacity=16, prefill=4, alpha=1.0, eps=0.0) as buf:
        before = _state(buf)
        with pytest.raises(ValueError, match=r"priorities\[1\] = 1e\+38 is too large"):
            buf.add(C.make_batch(np.arange(100, 102), NB), priorities=[1.0, 1e38])
        with pytest.raises(ValueError, match=r"priorities\[0\] = nan is not finite"):
            buf.add(C.make_batch(np.arange(100, 102), NB), priorities=[float("nan"), 1.0])
        with pytest.raises(KeyError, match="missing"):
            buf.add({"id": np.arange(2)})
        assert_same_state(before, _state(buf))
        for k in range(10):
            buf.add(C.make_batch(np.arange(4 + 4 * k, 8 + 4 * k), NB), priorities=np.full(4, 2.0))
        assert len(buf) == 16 and buf.inserted == 44
        assert verify_final(buf, {0: 44}) == []  # ids 0 .. 43, the newest 16 stored
        assert np.all(buf.priorities(np.arange(16)) == 2.0)


@pytest.mark.parametrize("policy", ["lazy-writing", "optimistic", "atomic-deltas"])
def test_lapping_writer_times_out_naming_a_stopped_writer(policy):
    """A writer stopped (SIGSTOP) in lazy writing's unlocked copy keeps its slots; a writer
    that comes round the ring to them waits, then raises TimeoutError naming the stopped
    writer's pid (it used to raise OverflowError from its backoff). Once the stopped writer
    is killed, its slots are voided and inserts go on. (atomic-deltas takes its tickets with
    no lock before it checks for a writer a lap behind: each try gives them up unused.)"""
    with make(policy, capacity=64, prefill=64) as buf:
        proc = mp.get_context("spawn").Process(target=stop_mid_insert, args=(buf.handle, 32))
        proc.start()
        try:
            for _ in range(600):  # until the child has stopped itself mid-insert
                with open(f"/proc/{proc.pid}/stat", "rb") as fh:
                    if fh.read().rsplit(b")", 1)[1].split()[0] == b"T":
                        break
                time.sleep(0.05)
            else:
                pytest.fail("the writer never reached its stop")
            lapper = SharedPrioritizedBuffer.attach(buf.handle, timeout=1.5)
            start = time.monotonic()
            with pytest.raises(TimeoutError, match=f"written by pid {proc.pid} "):
                lapper.add(C.make_batch(np.arange(1000, 1064), NB))
            assert time.monotonic() - start >= 1.5
            assert lapper.tree_lock.holder() == 0
            if policy == "atomic-deltas":  # tickets given up whole, no slot written, and counted
                assert buf.inserted >= 96 + 64 and (buf.inserted - 96) % 64 == 0
                assert buf.counters()["given_up_tickets"] == buf.inserted - 96
                assert [token_pid(rec[0]) for rec in buf.ring.in_flight()] == [proc.pid]  # the stopped writer's
            else:
                assert buf.inserted == 96  # the stopped writer's 32; the lapper took nothing
                assert buf.counters()["given_up_tickets"] == 0
        finally:
            proc.kill()
            proc.join(30)
        lapper.add(C.make_batch(np.arange(1000, 1064), NB))
        assert buf.counters()["voided_slots"] == 32 and buf.ring.in_flight() == []
        lapper.close()


def test_attach_refuses_segment_names_that_create_cannot_make(tmp_path):
    """A handle whose segment name leaves /dev/shm, or lacks the project's prefix, is refused
    before anything is opened (it used to map an arbitrary file read-write)."""
    import dataclasses

    victim = tmp_path / "victim"
    with make("lazy-writing", capacity=64, prefill=0) as buf:
        victim.write_bytes(b"\0" * buf.handle.arena.size)
        for name in ["../.." + str(victim), "replaybench_x/../../.." + str(victim), "/" + buf.handle.arena.name,
                     "other_" + buf.handle.arena.name, "replaybench_", ""]:
            handle = dataclasses.replace(buf.handle, arena=dataclasses.replace(buf.handle.arena, name=name))
            with pytest.raises(ValueError, match="segment name must be one path component"):
                SharedPrioritizedBuffer.attach(handle)
        assert victim.read_bytes() == b"\0" * buf.handle.arena.size


@pytest.mark.parametrize("kw,match", [({"alpha": float("inf")}, "alpha must be a finite number >= 0.0, got inf"),
                                      ({"eps": float("inf")}, "eps must be a finite number >= 0.0, got inf"),
                                      ({"alpha": float("nan")}, "alpha must be a finite number >= 0.0, got nan"),
                                      ({"stratified": "no"}, "stratified must be True or False, got 'no'"),
                                      ({"timeout": 0}, "timeout must be a positive finite number"),
                                      ({"policy": "nope"}, "unknown policy 'nope'; known: ")])
def test_create_refuses_impossible_parameters(kw, match):
    with pytest.raises(ValueError, match=match):
        SharedPrioritizedBuffer.create(64, FIELDS, **kw)
    assert leaked_segments(os.getpid()) == []


# ----------------------------------------------------------------------------- the policy interface
def test_policies_are_discovered_from_their_folder():
    from replaybench.impl.concurrent import policy

    assert concurrent.names() == sorted(["atomic-deltas", "deferred", "global-lock", "lazy-writing", "optimistic",
                                         "pal-locks", "sharded"])
    assert all(issubclass(concurrent.get(n), concurrent.Policy) and concurrent.get(n).name == n
               for n in concurrent.names())
    with pytest.raises(ValueError, match="unknown policy 'nope'; known: "):
        concurrent.get("nope")
    with pytest.raises(ValueError, match="already registered"):
        policy.register(type("Other", (concurrent.Policy,), {"name": "lazy-writing"}))
    with pytest.raises(ValueError, match="policy name must be"):
        policy.register(type("Unnamed", (concurrent.Policy,), {}))


def test_no_import_cycle_under_impl_concurrent():
    """buffer.py and the policies do not import each other: the graph of relative imports
    between the modules of impl/concurrent (its __init__ included, as "") is acyclic."""
    import ast

    root = pathlib.Path(concurrent.__file__).parent
    graph = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        parts = parts[:-1] if is_package else parts
        package = list(parts) if is_package else list(parts[:-1])
        deps = graph.setdefault(".".join(parts), set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level and node.level - 1 <= len(package):
                base = package[: len(package) - (node.level - 1)]
                if node.module:
                    deps.add(".".join([*base, *node.module.split(".")]))
                else:  # from . import x: x is a submodule (or a name of the package itself)
                    deps.update(".".join([*base, alias.name]) for alias in node.names)

    def visit(node, stack):
        assert node not in stack, f"import cycle: {' -> '.join([*stack, node])}"
        for dep in graph.get(node, ()):  # names that are not modules end here
            visit(dep, [*stack, node])

    for module in graph:
        visit(module, [])
    assert {"", "buffer", "policy", "ring", "policies", "policies.lazy_writing"} <= graph.keys()


@pytest.fixture
def scratch_policies(monkeypatch):
    """The policy registry as discovered, restored after the test."""
    from replaybench.impl.concurrent import policy

    concurrent.names()
    monkeypatch.setattr(policy, "_policies", policy._policies.copy())
    return policy


def test_one_file_policy_example_works(scratch_policies):
    """examples/policy_chunked_updates.py (docs/extending.md), loaded as a module of
    impl/concurrent/policies/ would be: it registers, stores what the plain buffer stores,
    keeps every guarantee under a threaded stress run, and its main() runs."""
    example = load_example("policy_chunked_updates", "replaybench.impl.concurrent.policies.example_chunked_updates")
    (name,) = set(concurrent.names()) - {"atomic-deltas", "deferred", "global-lock", "lazy-writing", "optimistic",
                                         "pal-locks", "sharded"}
    assert name == "chunked-updates"
    test_single_thread_matches_the_plain_buffer(name, np.random.default_rng(0))
    _stress(name, "threads")
    assert example.main(capacity=2**10) == 1000


@pytest.mark.parametrize("policy", concurrent.names())
def test_single_thread_matches_the_plain_buffer(policy, rng):
    """Used from one thread, every policy stores exactly what PrioritizedReplayBuffer stores."""
    plain = registry.create("kary-aligned", 512, FIELDS, seed=0)
    with make(policy, capacity=512, prefill=0) as shared:
        for step in range(12):
            ids = np.arange(step * 100, step * 100 + 100)
            batch = C.make_batch(ids, NB)
            plain.add(batch)
            shared.add(batch)
            idx = rng.integers(0, len(plain), 64)
            pr = rng.random(64) * 3
            plain.update_priorities(idx, pr)
            assert shared.update_priorities(idx, pr) == 64
        np.testing.assert_allclose(shared.tree.leaves(), plain.tree.leaves(), rtol=1e-6)
        assert shared.total() == pytest.approx(plain.tree.total(), rel=1e-5)
        np.testing.assert_array_equal(shared.storage.columns["id"], plain.storage.columns["id"])
        out = shared.sample(256)
        assert np.all(C.intact_rows(out)) and np.all(out["stamps"] % 512 == out["indices"])
        np.testing.assert_allclose(out["weights"], (shared.priorities(out["indices"]) / shared.tree.min()) ** -0.4,
                                   rtol=1e-5)


def test_stale_update_is_skipped():
    with make("lazy-writing", capacity=64, prefill=64) as buf:
        out = buf.sample(8)
        C.prefill(buf, 64, NB)  # overwrites every slot: the sampled transitions are gone
        assert buf.update_priorities(out["indices"], np.full(8, 5.0), out["stamps"]) == 0
        assert buf.counters()["stale_updates"] == 8
        assert buf.update_priorities(out["indices"], np.full(8, 5.0)) == 8  # no stamps: applied


@pytest.mark.parametrize("policy", ["lazy-writing", "optimistic"])
def test_lazy_writing_never_samples_reserved_slots(policy):
    """Slots reserved by an insert in progress (priority 0) are never drawn, even when they are
    almost all of the buffer; when nothing else is left, sample waits for the writer and,
    if it never publishes, raises TimeoutError naming it (after the object's timeout)."""
    from replaybench.impl.concurrent.locks import my_token

    with make(policy, capacity=256, prefill=256, timeout=0.3) as buf:
        with buf.tree_lock:
            t0 = buf.ring.reserve(250, my_token()).first
            buf.tree.fill(t0 % 256, 250, 0.0)
        reserved = set(((t0 + np.arange(250)) % 256).tolist())
        for _ in range(50):
            out = buf.sample(256)
            assert not reserved & set(out["indices"].tolist())
        assert set(buf.sample(2000)["indices"].tolist()) == set(range(256)) - reserved
        with buf.tree_lock:
            t1 = buf.ring.reserve(6, my_token()).first
            buf.tree.fill(t1 % 256, 6, 0.0)
        with pytest.raises(TimeoutError, match=f"the slots with data are being written by inserts in flight "
                                               f"\\(pid {os.getpid()}, "):
            buf.sample(4)


@pytest.mark.parametrize("policy", ["lazy-writing", "optimistic"])
def test_sample_waits_for_an_insert_that_reserved_every_slot(policy):
    """Issue 28.3: with capacity 8, one insert of 8 rows reserves every slot (priority 0)
    during its copy; a sample then used to fail with "total priority is 0" (so train with
    buffer_capacity=8 failed). It now waits for the insert to publish and draws its rows."""
    from replaybench.impl.concurrent.locks import my_token

    with make(policy, capacity=8, prefill=8) as buf:
        with buf.tree_lock:  # an insert's first phase: every slot reserved at priority 0
            res = buf.ring.reserve(8, my_token())
            buf.tree.fill(res.first % 8, 8, 0.0)

        def publish():  # ... and its last phase, 0.2 s later, from another thread
            time.sleep(0.2)
            with buf.tree_lock:
                buf.tree.fill(res.first % 8, 8, 1.0)
                buf.ring.publish(res, 8)

        writer = threading.Thread(target=publish)
        writer.start()
        start = time.monotonic()
        out = buf.sample(4)
        waited = time.monotonic() - start
        writer.join()
        assert waited >= 0.15 and set(out["stamps"].tolist()) <= set(range(8, 16))


@pytest.mark.parametrize("policy", ["lazy-writing", "optimistic"])
def test_sample_voids_a_dead_writer_that_reserved_every_slot(policy):
    """A writer that died holding every slot is voided by the waiting sample, which then
    refuses as an empty tree does (nothing is coming)."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with make(policy, capacity=8, prefill=8) as buf:
        with buf.tree_lock:
            res = buf.ring.reserve(8, (dead.pid << 22) | 1)
            buf.tree.fill(res.first % 8, 8, 0.0)
        with pytest.raises(ValueError, match="total priority is 0"):
            buf.sample(4)
        assert buf.counters()["voided_slots"] == 8 and buf.ring.in_flight() == []


# ----------------------------------------------------------------------------- stress
def _stress(policy, mode, variant="kary-aligned", nbytes=NB, capacity=2048, window=0.6):
    buf = SharedPrioritizedBuffer.create(capacity, C.schema(nbytes), variant=variant, policy=policy, seed=0)
    try:
        C.prefill(buf, 500, nbytes)
        cfg = {"nbytes": nbytes, "write_batch": 16, "sample_batch": 64, "window_s": window, "verify": True}
        res = C.run_workers(buf.handle, 2, 2, mode, cfg, windows=1, timeout=90)
        counts = {0: 500, **{r["index"]: r["next_seq"] for r in res if r["role"] == "writer"}}
        learners = [r for r in res if r["role"] == "learner"]
        assert sum(r["torn"] for r in learners) == 0
        assert not [p for r in learners for p in r["problems"]]
        assert sum(r["sample"] for r in learners) > 0 and sum(counts.values()) > capacity  # the ring wrapped
        # a policy with all three kernels (every built-in one) did the work in them: each call
        # reached one, and not every one was handed on to the Python slow path
        cls = concurrent.get(policy)
        if cls.fused_sample is not None and cls.fused_insert is not None and cls.fused_update:
            calls = sum(r.get("insert_calls", 0) + 2 * r.get("iteration_calls", 0) for r in res)
            kernel_calls, fallbacks = sum(r["kernel_calls"] for r in res), sum(r["fallbacks"] for r in res)
            assert kernel_calls >= calls > 0 and fallbacks < kernel_calls, (calls, kernel_calls, fallbacks)
        assert verify_final(buf, counts) == []
        return buf.counters()
    finally:
        buf.close()


#: Policies whose stress run with processes stays in ``make test`` (4 spawned workers, 4-7 s
#: each): lazy-writing (the training loop's default; it copies rows outside the lock) and
#: atomic-deltas (its atomics are the only synchronisation, on memory mapped by several
#: processes). Every policy's stress run with threads stays too, and every policy is
#: exercised from a second process by test_concurrency_fuzz.py and the kill tests below; the
#: other processes cases run in ``make test-slow``.
_STRESS_PROCESSES_BY_DEFAULT = {"lazy-writing", "atomic-deltas"}


def _stress_param(policy, mode):
    slow = mode == "processes" and policy not in _STRESS_PROCESSES_BY_DEFAULT
    return pytest.param(policy, mode, marks=pytest.mark.slow if slow else (), id=f"{policy}-{mode}")


@pytest.mark.parametrize("policy,mode", [_stress_param(p, m) for p in concurrent.names()
                                         for m in ("threads", "processes")])
def test_stress_nothing_lost_torn_or_deadlocked(policy, mode):
    _stress(policy, mode)


@pytest.mark.parametrize("policy", ["lazy-writing", "global-lock"])
def test_stress_atari_sized_rows(policy):
    _stress(policy, "threads", nbytes=C.TRANSITIONS["atari"], capacity=256, window=0.5)


def test_stress_prefix_tree_with_lazy_writing():
    _stress("lazy-writing", "threads", variant="kary-prefix")


def test_verify_final_catches_damage():
    """The checks the stress tests rely on fail when something is actually wrong."""
    with make("global-lock", capacity=256, prefill=300) as buf:
        assert verify_final(buf, {0: 300}) == []
        buf.storage.columns["payload"][5, 3] ^= 1  # a torn byte
        assert any("torn" in p for p in verify_final(buf, {0: 300}))
        buf.storage.columns["payload"][5, 3] ^= 1
        buf.storage.columns["id"][7], buf.storage.columns["check"][7] = buf.storage.columns["id"][8], \
            buf.storage.columns["check"][8]
        problems = verify_final(buf, {0: 300})
        assert any("twice" in p for p in problems)
    with make("global-lock", capacity=256, prefill=300) as buf:
        buf.tree._sums[buf.tree._root] *= 1.5
        assert any("root total" in p for p in verify_final(buf, {0: 300}))
        assert any("writer 0" in p for p in verify_final(buf, {0: 310}))  # 10 ids went missing


# ----------------------------------------------------------------------------- dead workers
def test_sharded_writer_killed_between_its_shard_publishes_is_recovered():
    """A sharded insert's Python path publishes one shard lock at a time: its writer killed
    holding the second shard's lock (the first shard published, its other slots still
    reserved). A sample waits for that lock, takes it over and rebuilds the shard (the dead
    writer's slots there voided), and runs its kernel again; the writers that lap the ring void
    the rest of the dead record. Nothing stays locked or in flight, and the tree sums its
    leaves."""
    with make("sharded", capacity=512, prefill=600) as buf:
        proc = mp.get_context("spawn").Process(target=die_mid_shard_publish, args=(buf.handle, 192))
        proc.start()
        proc.join(60)
        assert proc.exitcode == -9
        dead = [lock for lock in buf._policy.shard_locks if lock.holder() != 0]
        assert len(dead) == 1 and len(buf.ring.in_flight()) == 1
        start = time.monotonic()
        out = buf.sample(512)
        assert time.monotonic() - start < 30 and np.all(C.intact_rows(out))
        assert dead[0].holder() == 0 and buf.counters()["recoveries"] == 1
        C.prefill(buf, 1024, NB)  # laps the ring: meets the dead record and voids it
        assert buf.counters()["voided_slots"] == 192 and buf.ring.in_flight() == []
        out = buf.sample(512)
        assert np.all(C.intact_rows(out)) and not np.any(out["id"] // C.ID_STRIDE == DEAD_WRITER)
        assert buf.tree_lock.holder() == 0 and all(lock.holder() == 0 for lock in buf._policy.shard_locks)
        assert buf.total() == pytest.approx(float(buf.tree.leaves().sum()), rel=1e-4)
        assert not np.any(buf.tree.leaves()[buf.ring.stamps_snapshot() < 0] > 0)


@pytest.mark.parametrize("policy,where", [(p, "holding-lock") for p in concurrent.names()]
                         + [("lazy-writing", "copying"), ("optimistic", "copying")])
def test_worker_killed_mid_insert_is_recovered(policy, where):
    """Recovery rule: the dead writer's reserved slots are voided (never sampled), the tree is
    rebuilt from its leaves, and the lock it held is taken over; others go on."""
    with make(policy, capacity=512, prefill=600) as buf:
        proc = mp.get_context("spawn").Process(target=die_mid_insert, args=(buf.handle, where, 32))
        proc.start()
        proc.join(60)
        assert proc.exitcode == -9
        start = time.monotonic()
        if where == "copying" or policy == "atomic-deltas":
            # no lock is held, or inserts take none (atomic-deltas): writers lap the ring until they
            # meet the dead slots, and void them (recovering a lock the dead writer held)
            C.prefill(buf, 1024, NB)
        out = buf.sample(512)
        assert time.monotonic() - start < 30
        assert np.all(C.intact_rows(out))
        assert not np.any(out["id"] // C.ID_STRIDE == DEAD_WRITER)  # nothing of the dead writer's is visible
        C.prefill(buf, 100, NB)  # a locked operation (optimistic samples take no lock)
        counters = buf.counters()
        assert counters["voided_slots"] == 32
        assert counters["recoveries"] == (1 if where == "holding-lock" else 0)
        assert buf.tree_lock.holder() == 0
        assert buf.total() == pytest.approx(float(buf.tree.leaves().sum()), rel=1e-4)
        assert not np.any(buf.tree.leaves()[buf.ring.stamps_snapshot() < 0] > 0)
        assert buf.ring.in_flight() == []
