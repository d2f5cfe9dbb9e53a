"""Faults of the shared-memory buffer found by the third adversarial round (issue 41, items
8-12 and 20): bad argument types, copies and pickles of a buffer, forked children, a
creator's resolved layout, too little shared or process memory, duplicate update indices."""

import os

import numpy as np
import pytest

from replaybench.bench import concurrency_workers as C
from replaybench.impl import concurrent, registry
from replaybench.impl.concurrent import SharedPrioritizedBuffer, leaked_segments

NB = C.TRANSITIONS["cartpole"]
FIELDS = C.schema(NB)


@pytest.fixture(autouse=True)
def no_leaked_segments():
    before = set(leaked_segments(os.getpid()))
    yield
    leaked = set(leaked_segments(os.getpid())) - before
    assert not leaked, f"shared-memory segments left behind: {sorted(leaked)}"


@pytest.mark.parametrize("storage", [["rows"], ("rows",), np.array(["rows", "columns"]), 3])
def test_storage_of_another_type_is_refused_by_name(storage):
    """Item 12: a list (unhashable) used to raise ``TypeError: unhashable type: 'list'``."""
    with pytest.raises(ValueError, match=r"storage must be one of \['columns', 'rows', 'rows-packed'\]"):
        registry.create("binary", 64, FIELDS, storage=storage)
    with pytest.raises(ValueError, match="storage must be one of"):
        SharedPrioritizedBuffer.create(64, FIELDS, variant="binary", storage=storage)


def test_pickle_and_copy_are_refused_naming_the_handle():
    """Item 11: pickling failed on a ``_thread.lock`` without naming the handle, and
    ``copy.copy`` of an attached buffer succeeded, its close closing the original."""
    import copy
    import pickle

    with SharedPrioritizedBuffer.create(64, FIELDS, variant="binary", policy="global-lock", seed=0) as owner:
        C.prefill(owner, 8, NB)
        attached = SharedPrioritizedBuffer.attach(owner.handle)
        for buf in (owner, attached):
            for call in (pickle.dumps, copy.copy, copy.deepcopy):
                with pytest.raises(TypeError, match=r"pass its handle \(buf.handle.*attach\(handle\)"):
                    call(buf)
        assert not attached.closed and len(attached) == 8
        pickle.loads(pickle.dumps(owner.handle))  # the handle itself travels
        attached.close()
        assert len(owner) == 8


def _run(code: str, **kw) -> "subprocess.CompletedProcess":
    import subprocess
    import sys
    import textwrap

    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=600, cwd=os.path.dirname(os.path.dirname(__file__)), **kw)


def test_forked_child_exit_leaves_the_owners_segment():
    """Item 10: an ``os.fork()`` child that closed the owner's object, or just exited with
    ``sys.exit(0)`` (running the inherited exit hooks), unlinked the owner's segment."""
    proc = _run("""
        import os, sys
        from replaybench.impl.concurrent import SharedPrioritizedBuffer, leaked_segments
        from replaybench.bench.concurrency_workers import prefill, schema
        buf = SharedPrioritizedBuffer.create(64, schema(40), variant="binary", policy="global-lock", seed=0)
        name = buf.handle.arena.name
        for close_first in (True, False):
            pid = os.fork()
            if pid == 0:
                if close_first:
                    assert not buf.owner
                    buf.close()
                sys.exit(0)
            assert os.waitpid(pid, 0)[1] == 0
            assert name in leaked_segments(), f"close_first={close_first}: the child unlinked the segment"
        other = SharedPrioritizedBuffer.attach(buf.handle)  # still reachable
        other.close()
        assert buf.owner
        buf.close()
        assert name not in leaked_segments()
        print("ok")
    """)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_attach_keeps_the_creators_resolved_storage(monkeypatch):
    """Item 9: ``attach`` resolved ``storage="auto"`` again from its own process's cache sizes;
    one that read other sizes mapped the creator's rows as columns and sampled garbage. Here the
    creator sees a 64-byte cache (rows: 56-byte transitions of three fields) and the attaching
    object the machine's (columns, at 64 slots)."""
    from replaybench.impl import working_set

    with monkeypatch.context() as m:
        m.setattr(working_set, "private_cache_bytes", lambda: 64)
        owner = SharedPrioritizedBuffer.create(64, FIELDS, variant="binary", policy="global-lock", seed=0)
    with owner:
        assert owner.storage.layout == "rows" and owner.handle.storage == "rows"
        assert working_set.choose_storage("auto", 64, [8, 8, NB]) == "columns"  # what a re-choice gives
        C.prefill(owner, 32, NB)
        other = SharedPrioritizedBuffer.attach(owner.handle)
        try:
            assert other.storage.layout == "rows"
            batch = other.sample(16)
            np.testing.assert_array_equal(batch["id"], owner.storage.columns["id"][batch["indices"]])
            assert C.intact_rows(batch).all()  # every payload matches its id's checksum
        finally:
            other.close()


# ----------------------------------------------------------------------------- item 8: room
def test_create_refuses_a_segment_larger_than_dev_shm_has_free(monkeypatch):
    """Item 8: with too little room in /dev/shm, create succeeded and the first adds died with
    SIGBUS. The free space is read from statvfs (here: a source that reports 4 KiB)."""
    from replaybench.impl.concurrent import shm

    monkeypatch.setattr(shm, "shm_free_bytes", lambda: 4096)
    with pytest.raises(OSError, match=r"a shared segment of \d+ bytes .* does not fit in /dev/shm, which has "
                                      r"4096 bytes \(0.0 MiB\) free") as err:
        SharedPrioritizedBuffer.create(1024, FIELDS, variant="binary", policy="global-lock")
    assert err.value.errno == 28  # ENOSPC


def test_create_reserves_the_segment_and_refuses_when_the_reservation_fails(monkeypatch):
    """Item 8: a /dev/shm that fills between the check and the first write (another process)
    is found by the reservation at create (posix_fallocate), and the segment is unlinked."""
    import errno

    calls = []

    def full(fd, offset, length):
        calls.append(length)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(OSError, match=r"does not fit in /dev/shm"):
        SharedPrioritizedBuffer.create(1024, FIELDS, variant="binary", policy="global-lock")
    assert calls and calls[0] > 1024 * (8 + 8 + NB)  # the whole segment was asked for


@pytest.mark.slow
def test_small_dev_shm_refuses_at_create_instead_of_sigbus():
    """Item 8 on a real 16 MB /dev/shm (a tmpfs mounted in a private mount namespace, seen by
    this child only): the 29 MB buffer used to be created and its adds killed by SIGBUS; a
    buffer that fits still works."""
    import shutil
    import subprocess
    import sys

    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=16m tmpfs /dev/shm"],
                           capture_output=True) if shutil.which("unshare") else None
    if probe is None or probe.returncode != 0:
        pytest.skip("needs unshare -m and mount (root in a private mount namespace)")
    code = """
import sys
from replaybench.impl.concurrent import SharedPrioritizedBuffer
from replaybench.bench.concurrency_workers import prefill, schema
with SharedPrioritizedBuffer.create(1024, schema(40), variant="binary", policy="global-lock") as small:
    prefill(small, 1024, 40)
try:
    buf = SharedPrioritizedBuffer.create(2**19, schema(40), variant="binary", policy="global-lock")
except OSError as err:
    print("refused:", err)
    sys.exit(0)
prefill(buf, 2**19, 40)
print("created and filled")
"""
    mount_then_run = 'mount -t tmpfs -o size=16m tmpfs /dev/shm && exec "$0" -c "$1"'
    proc = subprocess.run(["unshare", "-m", "sh", "-c", mount_then_run, sys.executable, code], capture_output=True, text=True, timeout=600,
                          cwd=os.path.dirname(os.path.dirname(__file__)))
    assert proc.returncode == 0, f"rc={proc.returncode} (-7: SIGBUS) {proc.stderr[-2000:]}"
    assert "refused: [Errno 28] a shared segment of" in proc.stdout and "16777216 bytes" in proc.stdout, proc.stdout


def test_in_process_arrays_larger_than_the_memory_available_are_refused(monkeypatch):
    """Item 8: ``create("kary-aligned", 2**31, ...)`` grew the process to the machine's memory
    until the kernel killed it. Refused before any allocation, naming both sizes (here against
    a reported 1 MiB; and against the machine's real memory at 2**50 slots, which no machine has)."""
    from replaybench.impl import machine
    from replaybench.impl.storage import make_storage
    from replaybench.impl.trees import AlignedKarySumTree

    with pytest.raises(MemoryError, match=r"capacity=1125899906842624 .* needs \d+ bytes .* of memory are available"):
        registry.create("kary-aligned", 2**50, FIELDS)
    monkeypatch.setattr(machine, "available_memory_bytes", lambda: 2**20)
    with pytest.raises(MemoryError, match=r"a buffer of capacity=65536 .* needs 4194304 bytes .* only 1048576 bytes"):
        registry.create("kary-aligned", 2**16, FIELDS)
    with pytest.raises(MemoryError, match=r"AlignedKarySumTree of capacity=262144 .* only 1048576 bytes"):
        AlignedKarySumTree(2**18)
    with pytest.raises(MemoryError, match=r"'columns' storage of capacity=32768 .* only 1048576 bytes"):
        make_storage("columns", 2**15, FIELDS)
    with pytest.raises(MemoryError, match="capacity=65536"):
        SharedPrioritizedBuffer.create(2**16, FIELDS, variant="binary", policy="global-lock")
    registry.create("kary-aligned", 1024, FIELDS)  # what fits is built


# ----------------------------------------------------------------------------- item 20: duplicates
def _last_wins(indices, values) -> dict:
    return dict(zip(indices.tolist(), values.tolist()))  # later entries overwrite earlier ones


@pytest.mark.parametrize("policy", ["plain", *concurrent.names()])
def test_duplicate_indices_in_one_update_last_priority_wins(policy):
    """Item 20: an update that names a slot several times (a batch sampled with replacement
    does) leaves the slot at the priority given last, and the total equals the sum of the
    stored leaves, under every policy, with stamps (the fused path) and without."""
    rng = np.random.default_rng(7)
    if policy == "plain":
        buf, closer = registry.create("kary-aligned", 64, FIELDS, alpha=0.6, eps=1e-6, seed=0), None
    else:
        buf = closer = SharedPrioritizedBuffer.create(64, FIELDS, variant="kary-aligned", policy=policy, seed=0)
    try:
        C.prefill(buf, 8, NB)
        for with_stamps in (False, True):
            out = buf.sample(48)  # 48 draws of 8 slots: duplicates
            idx = out["indices"]
            assert np.unique(idx).size < idx.size
            vals = rng.uniform(0.1, 10.0, idx.size)
            stamps = out["stamps"] if with_stamps and "stamps" in out else None
            applied = buf.update_priorities(idx, vals, stamps) if stamps is not None else \
                buf.update_priorities(idx, vals)
            if closer is not None:
                assert applied == idx.size
            want = _last_wins(idx, vals)
            slots = np.array(sorted(want))
            expected = (np.array([want[s] for s in slots]) + 1e-6) ** 0.6
            got = buf.priorities(slots) if closer is not None else buf.tree.get(slots)
            np.testing.assert_allclose(got, expected, rtol=1e-5)
            leaves = buf.priorities(np.arange(8)) if closer is not None else buf.tree.get(np.arange(8))
            np.testing.assert_allclose(buf.total() if closer is not None else buf.tree.total(), leaves.sum(),
                                       rtol=1e-5)
    finally:
        if closer is not None:
            closer.close()


# ----------------------------------------------------------------------------- issue 55, item 7: batch size
@pytest.mark.parametrize("policy", concurrent.names())
def test_a_batch_size_no_output_could_hold_is_refused_by_name_and_changes_nothing(policy):
    """Issue 55, item 7: ``sample(2**62)`` raised a bare OverflowError (the output block's byte
    count past int64) under every policy, and ``sample(2**40)`` numpy's MemoryError for 56 TiB,
    neither naming ``batch_size``. A batch size whose output arrays need more memory than is
    available (or than an int64 counts) is refused with a ValueError naming it and its value,
    as a non-positive one is, before anything is drawn: the buffer, its counters and the
    object's generator are as they were, and a sample of a sane size follows."""
    with SharedPrioritizedBuffer.create(64, FIELDS, variant="kary-aligned", policy=policy, seed=0) as buf:
        C.prefill(buf, 8, NB)
        state = (buf.counters(), buf.ring.stamps_snapshot(), buf.tree.leaves(), buf.total(), buf.kernel_calls)
        rng = buf._rng.bit_generator.state
        for n in (2**62, 2**63 - 1, 2**64, 10**30, 2**40):
            with pytest.raises(ValueError, match=rf"batch_size={n} .*bytes"):
                buf.sample(n)
            with pytest.raises(ValueError, match=rf"batch_size={n} "):
                buf.sample_out(n)
        with pytest.raises(ValueError, match=r"batch_size must be a positive integer, got 0"):
            buf.sample(0)
        after = (buf.counters(), buf.ring.stamps_snapshot(), buf.tree.leaves(), buf.total(), buf.kernel_calls)
        assert after[0] == state[0] and after[3] == state[3] and after[4] == state[4]
        assert np.array_equal(after[1], state[1]) and np.array_equal(after[2], state[2])
        assert buf._rng.bit_generator.state == rng
        assert buf.sample(16)["indices"].shape == (16,)
