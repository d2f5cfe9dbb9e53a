"""Test oracle and failure injection for the shared buffer, through its public parts only
(``buf.ring``, ``buf.tree``, ``buf.storage``, ``buf.tree_lock``).

:func:`verify_final` checks a quiescent buffer after a stress run of bench/concurrency_workers.py's
tagged workers; :func:`die_mid_insert` is a process target that kills itself mid-insert.
"""

from __future__ import annotations

import os
import signal

import numpy as np

from replaybench.bench.concurrency_workers import ID_STRIDE, TRANSITIONS, intact_rows, make_batch

__all__ = ["verify_final", "die_mid_insert", "stop_mid_insert", "die_mid_shard_publish", "DEAD_WRITER"]

DEAD_WRITER = 7  # writer number of the transitions die_mid_insert leaves half-written


def verify_final(buf, writer_counts: dict[int, int]) -> list[str]:
    """Check a quiescent buffer after a run; returns the problems found (empty: all good).

    ``writer_counts[w]`` is how many transitions writer ``w`` inserted (ids ``w * ID_STRIDE +
    0 .. count-1``; the prefill is writer 0). Checks: every stored row is intact; ids are
    unique; the stored slots hold exactly the newest ``capacity`` tickets, each in slot
    ``ticket % capacity`` (FIFO eviction), minus slots voided by crash recovery, and but for
    the slots of tickets that a lapped lock-free writer gave up (atomic-deltas: those slots keep
    older rows, at most ``given_up_tickets`` of them); each writer's stored ids are the newest
    of its own, contiguous (nothing lost in between; not checked after a recovery or a given-up
    ticket); the root total equals the sum of the leaves within the float32 drift bound.
    """
    problems = []
    cap = buf.capacity
    stamps = buf.ring.stamps_snapshot()
    live = np.flatnonzero(stamps >= 0)
    rows = {k: col[live] for k, col in buf.storage.columns.items()}
    counters = buf.counters()
    voided, given_up = counters["voided_slots"], counters["given_up_tickets"]
    if not np.all(intact_rows(rows)):
        problems.append(f"{int((~intact_rows(rows)).sum())} stored rows are torn")
    ids = rows["id"]
    if np.unique(ids).size != ids.size:
        problems.append("an id is stored twice")
    if np.any(stamps[live] % cap != live):
        problems.append("a slot holds a ticket that belongs to another slot")
    total = buf.inserted
    expected = np.arange(max(0, total - cap), total)
    older = int(np.count_nonzero(~np.isin(stamps[live], expected)))
    if older > given_up:
        problems.append(f"{older} slots hold a transition older than the newest `capacity` (FIFO broken; "
                        f"{given_up} tickets given up)")
    if live.size + min(voided, cap) < expected.size:
        problems.append(f"{expected.size - live.size} of the newest {expected.size} transitions are missing "
                        f"({voided} voided by recovery)")
    for w, count in writer_counts.items():
        seqs = np.sort(ids[ids // ID_STRIDE == w] % ID_STRIDE)
        if seqs.size and not voided and not given_up and (seqs[-1] != count - 1 or np.any(np.diff(seqs) != 1)):
            problems.append(f"writer {w}: stored ids are not its newest {seqs.size} in a row "
                            f"(last {seqs[-1]}, inserted {count})")
    if buf.ring.in_flight():
        problems.append(f"inserts still recorded in flight: {buf.ring.in_flight()}")
    leaves = buf.tree.leaves()
    if np.any(leaves[stamps < 0] > 0):
        problems.append("a slot being written or voided has a positive priority")
    root = buf.total()
    exact = float(leaves.sum())
    bound = (buf.handle.resum_every + 4096) * 2.0**-24 * max(exact, root) + 1e-12
    if buf.tree.dtype == np.float64:
        bound = 1e-9 * max(exact, 1.0)
    if abs(root - exact) > bound:
        problems.append(f"root total {root!r} differs from the sum of leaves {exact!r} by more than {bound:.3g}")
    return problems


def _start_insert(handle, where: str, n: int):
    """Attach, reserve ``n`` slots as an insert does and copy half the rows: with the tree lock
    still held (``"holding-lock"``), or after lazy writing's locked phase released it
    (``"copying"``: slots at priority 0)."""
    from replaybench.impl.concurrent import SharedPrioritizedBuffer
    from replaybench.impl.concurrent.locks import my_token

    if where not in ("holding-lock", "copying"):
        raise ValueError(f"where must be 'holding-lock' or 'copying', got {where!r}")
    buf = SharedPrioritizedBuffer.attach(handle)
    batch = make_batch(np.arange(n, dtype=np.int64) + DEAD_WRITER * ID_STRIDE, TRANSITIONS["cartpole"])
    half = {k: v[: n // 2] for k, v in batch.items()}
    buf.tree_lock.acquire()
    res = buf.ring.reserve(n, my_token())
    if where == "copying":
        buf.tree.fill(res.first % buf.capacity, n, 0.0)
        buf.tree_lock.release()
    buf.storage.write(res.first % buf.capacity, half, n // 2)
    return buf


def die_mid_insert(handle, where: str, n: int = 32) -> None:
    """Process target: start an insert of ``n`` rows (see :func:`_start_insert`), then SIGKILL
    ourselves."""
    _start_insert(handle, where, n)
    os.kill(os.getpid(), signal.SIGKILL)


def stop_mid_insert(handle, n: int = 32) -> None:
    """Process target: start an insert in lazy writing's unlocked copy, then SIGSTOP ourselves
    (alive, holding ring slots, never progressing until SIGCONT or a kill)."""
    _start_insert(handle, "copying", n)
    os.kill(os.getpid(), signal.SIGSTOP)


def die_mid_shard_publish(handle, n: int = 192) -> None:
    """Process target (sharded): an insert of ``n`` rows through the policy's Python path, which
    publishes one shard lock at a time; SIGKILL ourselves holding the second shard's lock, its
    priorities set and its stamps not yet (the first shard published, the rest still -1)."""
    from replaybench.impl.concurrent import SharedPrioritizedBuffer

    buf = SharedPrioritizedBuffer.attach(handle)
    policy = buf._policy
    stamped = []

    def stamp(slots, tickets):
        if stamped:
            os.kill(os.getpid(), signal.SIGKILL)
        stamped.append(len(slots))
        real_stamp(slots, tickets)

    real_stamp = policy.ring.stamp
    policy.ring.stamp = stamp
    batch = make_batch(np.arange(n, dtype=np.int64) + DEAD_WRITER * ID_STRIDE, TRANSITIONS["cartpole"])
    arrays, rows = buf.storage.check_batch(batch)
    policy.insert(arrays, rows, None)
