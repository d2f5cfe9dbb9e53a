"""The fused copy-outside-the-lock sample against writers that change slots while it copies:
the seqlock check after the copy must read each stamp once and trust no index it did not
check, or a concurrent insert makes it index out of bounds (in 2026-11 it did: a count of
changed rows and the positions of those rows were read in two passes, so a stamp that changed
between them wrote past the positions array and corrupted the heap).

Bounds are checked by numba (``boundscheck``) in two ways: here, the seqlock check alone
compiled with bounds checks in this process (fast: its callees come from the normal cache);
and, marked slow, whole samples of every copy-outside-the-lock policy in a child process run
with ``NUMBA_BOUNDSCHECK=1`` and a private numba cache (so the checked machine code never
reaches the normal cache), beside real inserts, where any IndexError, crash or heap
corruption fails the test through the child's exit status.
"""

import os
import pathlib
import subprocess
import sys
import tempfile
import threading

import numpy as np
import pytest
from numba import njit

from replaybench.bench import concurrency_workers as C
from replaybench.impl.concurrent import SharedPrioritizedBuffer
from replaybench.impl.concurrent import fused as shared_fused
from replaybench.impl.concurrent.atomics import cpu_relax
from replaybench.impl.concurrent.locks import my_token

NB = C.TRANSITIONS["cartpole"]
HAMMER = pathlib.Path(__file__).with_name("_seqlock_hammer.py")


@njit(nogil=True)
def bump_stamps(stamps, stop, pauses):
    """Until ``stop[0]`` is set: move slot after slot (stride 7) on to the next ticket it
    would get, one every ``pauses`` spin-wait hints: what a sampler copying the slot sees when
    a writer overwrote it meanwhile. Returns how many slots were bumped."""
    cap = stamps.shape[0]
    s = 0
    bumps = 0
    while stop[0] == 0:
        s = (s + 7) % cap
        if stamps[s] >= 0:
            stamps[s] += cap
            bumps += 1
        for _ in range(pauses):
            cpu_relax()
    return bumps


def test_seqlock_check_reads_each_stamp_once_while_slots_change():
    """The redraw loop after a copy (``_redraw_changed``), compiled with bounds checks, run
    over and over while another thread moves slots on: never an out-of-bounds index, and
    every row it settles on carries a valid stamp of its own slot. Before the fix (changed
    rows counted in one pass, found in a second) this raised IndexError within a few hundred
    calls on 2 busy cores."""
    checked = njit(boundscheck=True, nogil=True)(shared_fused._redraw_changed.py_func)
    cap, n = 256, 64
    with SharedPrioritizedBuffer.create(cap, C.schema(NB), policy="lazy-writing", seed=0) as buf:
        C.prefill(buf, cap, NB)
        out = buf.sample_out(n)
        r = buf.ring.arrays
        tree_ring = (*buf.tree.kernel_args, r["ctrl"], r["fctrl"], r["stamps"], r["queue_idx"], r["queue_delta"],
                     buf.ring.resum_every)
        token, lockstats = my_token(), np.zeros(shared_fused.LOCKSTATS_SIZE)
        arena, table, block, block_table = buf.storage.arena, buf.storage.table, out.block, out.block_table
        stamps = r["stamps"]
        rng = np.random.default_rng(0)
        stop = np.zeros(1, np.int64)
        bumps = []
        bumper = threading.Thread(target=lambda: bumps.append(bump_stamps(stamps, stop, 4)))
        bump_stamps(stamps, np.ones(1, np.int64), 0)  # compiled before the thread starts
        bumper.start()
        settled = 0
        try:
            for call in range(3000):
                index = rng.choice(cap, n, replace=False).astype(np.int64)
                stamp = stamps[index].copy()
                stamp[: n // 2] -= cap  # half the rows changed already: every call redraws
                prio = np.ones(n)
                status = checked(*tree_ring, token, lockstats, shared_fused.DRAW_LOCKED, 0, call, False, arena,
                                 table, block, block_table, index, prio, stamp)
                if status == shared_fused.STATUS_OK:
                    settled += 1
                    assert np.all((index >= 0) & (index < cap)) and np.all(stamp % cap == index)
                    assert np.all(stamp >= 0)
        finally:
            stop[0] = 1
            bumper.join()
        assert bumps[0] > 0 and settled > 0
        assert buf.tree_lock.holder() == 0


def _boundscheck_cache() -> pathlib.Path:
    """The checked kernels' numba cache, named by a digest of every kernel source (impl/ and
    bench/): numba keys a cached kernel on its own file only, so one compiled before a change
    to a constant or a callee in another file would run stale (a cache kept across edits once
    ran kernels that read a moved control word). Older caches of this test are removed."""
    import hashlib
    import shutil

    root = pathlib.Path(C.__file__).resolve().parents[1]  # the package: bench/ and impl/ under it
    digest = hashlib.sha256()
    for path in sorted(p for d in ("impl", "bench") for p in (root / d).rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    prefix = f"replaybench-boundscheck-{os.getuid()}"
    cache = pathlib.Path(tempfile.gettempdir()) / f"{prefix}-{digest.hexdigest()[:16]}"
    for old in pathlib.Path(tempfile.gettempdir()).glob(f"{prefix}*"):
        if old != cache:
            shutil.rmtree(old, ignore_errors=True)
    return cache


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["lazy-writing", "optimistic", "pal-locks", "atomic-deltas", "sharded"])
def test_fused_samples_stay_in_bounds_beside_inserts(policy):
    """Whole fused samples and updates beside a writer thread's inserts and slots moved on
    during copies, in a child process with every kernel bounds-checked: it must exit 0 and
    report intact rows with stamps of their own slots. ~1-2 minutes the first time (the
    checked kernels compile into the private cache), seconds after."""
    env = {**os.environ, "NUMBA_BOUNDSCHECK": "1", "NUMBA_CACHE_DIR": str(_boundscheck_cache())}
    proc = subprocess.run([sys.executable, str(HAMMER), policy, "12000"], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    assert "ok" in proc.stdout, proc.stdout


def test_unlocked_draw_checks_a_leaf_is_in_the_ring_before_reading_its_stamp():
    """Optimistic's unlocked draw trusts nothing it read without the lock: a descent that
    reaches a leaf past the ring's slots (here a padding leaf given mass by hand, as a torn
    view of the inner sums could make it look) is a miss, not an index into the stamps.
    Compiled with bounds checks; before the check it raised IndexError."""
    from replaybench.impl.trees.kernels import addr

    checked = njit(boundscheck=True, nogil=True)(shared_fused.draw_unlocked.py_func)
    cap, n = 200, 32  # K = 16: 256 leaves, 56 of them padding
    with SharedPrioritizedBuffer.create(cap, C.schema(NB), policy="optimistic", seed=0) as buf:
        C.prefill(buf, cap, NB)
        kind, sums, mins, lay, K, _, touch_from = buf.tree.kernel_args[:7]
        stamps = buf.ring.stamps_snapshot()
        sums[addr(lay, lay.shape[0] - 1, 250)] = 1e6  # every draw lands on padding leaf 250
        buf.tree.rebuild()
        index, prio, stamp = np.empty(n, np.int64), np.empty(n), np.empty(n, np.int64)
        pmin = checked(kind, sums, mins, lay, K, touch_from, stamps, 7, False, 3, index, prio, stamp)
        assert pmin == -1.0  # the draw gives up to the locked one
        assert np.all(stamp == -1)
