"""Gradient averaging between the learner processes of one machine, over shared memory.

PAL's learners (context/papers.md, section 1) each sample B/L, compute gradients, average them
behind a barrier and take the same optimizer step. :class:`SharedAllreduce` is that average for
the process engine's L learners: a reduce-scatter and an all-gather over one shared-memory
block, with no socket, no rendezvous port and no collective library.

    inputs   [L, n] float32   rank r writes its gradient vector into row r       (phase 1)
    result   [n]    float32   rank r sums the chunk r of every row, in rank order (phase 2)
                              every rank copies the whole result back          (after phase 2)
    arrived  [L]    int64     rank r's count of phases it reached (its only writer), one cache line each
    since    [L]    float64   when rank r began its current wait (time.monotonic; 0: not waiting)

A phase ends with a barrier. Under one lock, rank r stores the phase into its own counter
``arrived[r]`` (each counter on a cache line of its own: its rank is its only writer) and looks
whether every counter has reached the phase; the rank that sees them all wakes the ranks that
went to sleep meanwhile. A rank that does not see every peer in polls the counters, yielding its core
between polls (``os.sched_yield``: a peer queued on the same core runs at once), for up to
``_SPIN_S``: learners on cores of their own meet within tens of microseconds, and a sleeping rank
costs its wake-up (a futex and, in a VM, an interrupt to a halted virtual CPU: tens to hundreds of
microseconds), which, paid at every barrier, kept two learners' phases apart for good. Past it the
rank counts itself as a sleeper (``sleepers``, by the phase's parity, under the lock) and blocks
on the phase's semaphore, which the last rank in posts once per sleeper. No wake-up is lost: each
rank's look under the lock comes after its own counter's store, so the last of those looks sees
every counter, and a sleeper counts itself in under the same lock after seeing a counter short.
Single buffers suffice: rank r writes ``inputs[r]`` for the next call only after the phase-2
barrier of this one (every rank has read every row), and writes its chunk of ``result`` only
after the next phase-1 barrier (every rank has copied the last result out).

Why not torch.distributed's gloo on localhost (what the process engine used before, and what
the Ray engine still uses across machines): for the small networks the harness trains (DQN
CartPole's preset: 17,410 parameters) an all-reduce is latency, not bandwidth; gloo's goes through TCP
sockets (tens to hundreds of microseconds per call, each a system call per peer), this one is
two barriers on shared counters (bench/allreduce_latency.py measures both; figures in
docs/engines/process.md). gloo's rendezvous also needs a free port (a race
with any other process on the machine) and its timeout ends in an error that does not say which
peer is missing; here a wait past ``timeout_s`` raises :class:`AllreduceTimeout` naming the
learners that did not arrive, and a stop flag (a dead peer seen by the parent) ends every wait.
``arrived`` and ``since`` also tell the parent, at any moment, who waits for whom
(:meth:`SharedAllreduce.stall`): a run that passes its own time limit first (``--timeout``
shorter than the all-reduce's) names the learner its peers were waiting for, as the all-reduce's
own timeout would.

Determinism: every element of the mean is summed by one rank, in rank order 0..L-1, in float32,
then divided by L; every rank copies those same bits. So the L learners hold identical weights
after every step (the same optimizer step on the same gradients), run after run, whatever the
order in which they arrive. With L = 1 the engine sets no hook at all: the one learner computes
what it computed before this module existed, bit for bit.

Memory order: a rank's stores (its row, its chunk) come before its counter's store, which it
makes under the lock; a reader that sees the counter under the lock, or is woken by the
semaphore, reads after the lock's release and the post, which order them on every CPU (POSIX,
futex-based). Polling the counters without the lock relies on x86-64's total store order, and is
done there only.

Cost per call, per rank: one copy of n floats in, n floats summed over L rows of one chunk
(n reads + n/L writes), one copy of n floats out, two barriers (each one lock section, polls of
the L counters until they are in, one clock read and two stores for ``since``). Memory:
(L + 1) * n * 4 bytes plus 72 per learner, in ``multiprocessing.RawArray`` blocks (anonymous:
nothing stays in /dev/shm whatever way the processes end), one lock and two semaphores.
"""

from __future__ import annotations

import ctypes
import os
import platform
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from replaybench.impl.ratelimit import Stopped

__all__ = ["SharedAllreduce", "AllreduceStall", "AllreduceTimeout", "SharedGradientAverager"]

#: How long a waiting rank polls its peers' counters (yielding its core between polls) before it
#: blocks: learners on cores of their own (the same step on the same batch size) meet well within it.
#: Without the lock a poller relies on x86-64's store order (a peer's data, stored before its
#: counter, is seen before it), so elsewhere every wait goes through the lock and the semaphore.
_SPIN_S = 0.002 if platform.machine().lower() in ("x86_64", "amd64") else 0.0
#: Non-blocking tries of the lock (yielding the core between them) before a rank blocks on it.
_LOCK_TRIES = 100
#: int64 slots between two ranks' counters in ``arrived``: one 64-byte cache line per rank, so a
#: rank's store invalidates only the line its peers poll for it.
_STRIDE = 8
#: The longest a blocked rank waits before it checks the stop flag and its deadline again.
_CHECK_EVERY_S = 0.05


class AllreduceTimeout(RuntimeError):
    """A learner waited longer than the all-reduce's ``timeout_s`` for its peers;
    ``missing`` lists the ranks that had not arrived."""

    def __init__(self, rank: int, missing: list[int], phase: int, timeout_s: float):
        names = ", ".join(f"learner-{m}" for m in missing)
        super().__init__(f"learner-{rank} waited {timeout_s:g} s at gradient all-reduce phase {phase} for {names}, "
                         f"which did not arrive (stuck or dead)")
        self.rank = rank
        self.missing = missing
        self.phase = phase


@dataclass(frozen=True)
class AllreduceStall:
    """Rank ``waiter`` has waited ``waited_s`` seconds at barrier ``phase`` for the ranks
    ``missing`` (ascending), which have not reached it: what :meth:`SharedAllreduce.stall` reads."""

    waiter: int
    missing: list[int]
    phase: int
    waited_s: float

    @property
    def names(self) -> str:
        """The missing ranks as the engine names its workers: ``"learner-1"``, ``"learner-1, learner-2"``."""
        return ", ".join(f"learner-{m}" for m in self.missing)

    def __str__(self) -> str:
        return (f"learner-{self.waiter} waited {self.waited_s:.1f} s at gradient all-reduce phase {self.phase} for "
                f"{self.names}, which did not arrive (stopped, stuck or dead)")


class SharedAllreduce:
    """The mean of L float32 vectors of up to ``size`` elements, one per learner process.

    Built once by the parent (``ctx``: a multiprocessing context) and passed to the learner
    processes as a Process argument; each calls :meth:`bind` with its rank, then every rank
    calls the same sequence of :meth:`mean` (with vectors of equal length) and :meth:`barrier`.

    ``stopped``: a callable polled while waiting (the run's stop flag): when it returns True the
    wait raises ``Stopped`` (:mod:`impl.ratelimit`), so a peer that died, which the parent sees
    and stops the run for, never leaves the others waiting. ``timeout_s``: a wait longer than
    this raises :class:`AllreduceTimeout` naming the ranks that did not arrive.
    Thread-safety: one thread per rank.
    """

    def __init__(self, ctx, world: int, size: int, timeout_s: float = 60.0):
        for name, value, low in (("world", world, 1), ("size", size, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        self.world = world
        self.size = size
        self.timeout_s = float(timeout_s)
        self._inputs = ctx.RawArray(ctypes.c_float, world * size)
        self._result = ctx.RawArray(ctypes.c_float, size)
        self._arrived = ctx.RawArray(ctypes.c_int64, world * _STRIDE)
        self._since = ctx.RawArray(ctypes.c_double, world)
        self._sleepers = ctx.RawArray(ctypes.c_int64, 2)  # ranks blocked, per phase parity (under _lock)
        self._lock = ctx.Lock()
        self._sems = (ctx.Semaphore(0), ctx.Semaphore(0))
        self.rank = None
        self._views()

    def _views(self) -> None:
        self.inputs = np.frombuffer(self._inputs, dtype=np.float32).reshape(self.world, self.size)
        self.result = np.frombuffer(self._result, dtype=np.float32)
        self.arrived = np.frombuffer(self._arrived, dtype=np.int64)[::_STRIDE]
        self.since = np.frombuffer(self._since, dtype=np.float64)
        self.sleepers = np.frombuffer(self._sleepers, dtype=np.int64)
        self._phase = 0
        self._stopped: Callable[[], bool] = lambda: False

    def __getstate__(self):
        return {"world": self.world, "size": self.size, "timeout_s": self.timeout_s, "_inputs": self._inputs,
                "_result": self._result, "_arrived": self._arrived, "_since": self._since, "_sleepers": self._sleepers,
                "_lock": self._lock, "_sems": self._sems, "rank": None}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._views()

    def bind(self, rank: int, stopped: Callable[[], bool] | None = None) -> SharedAllreduce:
        """Make this (a learner process's) copy rank ``rank``; returns self."""
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.world:
            raise ValueError(f"rank must be an integer in [0, {self.world}), got {rank!r}")
        self.rank = rank
        self._phase = int(self.arrived[rank])
        if stopped is not None:
            self._stopped = stopped
        return self

    def _chunk(self, n: int, rank: int) -> slice:
        per = -(-n // self.world)
        return slice(min(n, rank * per), min(n, (rank + 1) * per))

    def _missing(self, phase: int) -> list[int]:
        return [r for r in range(self.world) if int(self.arrived[r]) < phase]

    def stall(self) -> AllreduceStall | None:
        """Who waits for whom now, from any process holding this object (the parent: no
        :meth:`bind` needed): the rank waiting longest at a barrier that some rank has not
        reached yet, with those ranks, the phase and the seconds waited; None when no rank waits
        for one that is missing. Read without the lock while the ranks run: a rank passing a
        barrier meanwhile can make one call see a wait that just ended (a wait of microseconds)
        or miss one that just began. Cost: O(L) reads of shared memory."""
        now = time.monotonic()
        since = self.since.copy()
        arrived = self.arrived.copy()
        for waiter in sorted((r for r in range(self.world) if since[r] > 0), key=lambda r: since[r]):
            phase = int(arrived[waiter])
            missing = [r for r in range(self.world) if int(arrived[r]) < phase]
            if missing:
                return AllreduceStall(waiter, missing, phase, max(0.0, now - float(since[waiter])))
        return None

    def _arrive_and_wait(self) -> None:
        """End one phase: this rank's counter in, then wait until every counter is (module
        docstring). ``since`` holds the time this rank came in until it leaves (any way)."""
        self._phase += 1
        phase = self._phase
        self.since[self.rank] = time.monotonic()  # diagnostics only: stall() reads both without the lock
        try:
            self._wait_for_all(phase)
        finally:
            self.since[self.rank] = 0.0

    def _all_in(self, phase: int) -> bool:
        return int(self.arrived.min()) >= phase

    def _locked(self, phase: int) -> None:
        """Take the lock: held for a few instructions (unless its holder died in them), so a
        rank that finds it taken yields and tries again before it blocks on it (a futex wait,
        whose wake-up would cost more than the section)."""
        for _ in range(_LOCK_TRIES):
            if self._lock.acquire(False):
                return
            os.sched_yield()
        if not self._lock.acquire(timeout=self.timeout_s):
            raise AllreduceTimeout(self.rank, self._missing(phase), phase, self.timeout_s)

    def _wait_for_all(self, phase: int) -> None:
        parity = phase & 1
        self._locked(phase)
        try:
            self.arrived[self.rank] = phase  # stored under the lock: its release publishes this rank's data too
            done = self._all_in(phase)
            wake = int(self.sleepers[parity]) if done else 0
            if done:
                self.sleepers[parity] = 0
        finally:
            self._lock.release()
        if done:
            for _ in range(wake):
                self._sems[parity].release()
            return
        give_up = time.perf_counter() + _SPIN_S  # polling without the lock: x86-64 only (see _SPIN_S)
        while time.perf_counter() < give_up:
            os.sched_yield()
            if self._all_in(phase):
                return
        self._locked(phase)
        try:
            done = self._all_in(phase)
            if not done:
                self.sleepers[parity] += 1
        finally:
            self._lock.release()
        if done:
            return
        deadline = time.monotonic() + self.timeout_s
        while not self._sems[parity].acquire(timeout=_CHECK_EVERY_S):
            if self._stopped():
                raise Stopped()
            if time.monotonic() > deadline:
                raise AllreduceTimeout(self.rank, self._missing(phase), phase, self.timeout_s)

    def _checked(self, vector: np.ndarray, call: str) -> int:
        """The length of ``vector`` once it is a 1-D float32 vector of at most ``size``
        elements and this object is bound to a rank; RuntimeError / ValueError otherwise."""
        if self.rank is None:
            raise RuntimeError(f"SharedAllreduce.{call} before bind(rank)")
        n = vector.shape[0]
        if vector.ndim != 1 or vector.dtype != np.float32 or n > self.size:
            raise ValueError(f"vector must be 1-D float32 of at most {self.size} elements, got "
                             f"{vector.dtype} of shape {vector.shape}")
        return n

    def mean(self, vector: np.ndarray) -> np.ndarray:
        """The element-wise mean of every rank's ``vector`` (float32, 1-D, at most ``size``
        elements, the same length on every rank), written into ``vector`` and returned.
        Identical bits on every rank. Raises Stopped or :class:`AllreduceTimeout` (above)."""
        n = self._checked(vector, "mean")
        if self.world == 1:
            return vector
        self.inputs[self.rank, :n] = vector
        self._arrive_and_wait()
        part = self._chunk(n, self.rank)
        if part.start < part.stop:
            rows = self.inputs[:, part]
            acc = rows[0].copy()
            for r in range(1, self.world):  # rank order: the same bits whoever arrived first
                acc += rows[r]
            acc /= np.float32(self.world)
            self.result[part] = acc
        self._arrive_and_wait()
        vector[:] = self.result[:n]
        return vector

    def broadcast(self, vector: np.ndarray, root: int = 0) -> np.ndarray:
        """Rank ``root``'s ``vector`` (1-D float32, at most ``size`` elements, the same length on
        every rank) copied into every rank's ``vector``, which is returned. Two barriers."""
        n = self._checked(vector, "broadcast")
        if self.world == 1:
            return vector
        self._arrive_and_wait()  # nobody still reads the last result
        if self.rank == root:
            self.result[:n] = vector
        self._arrive_and_wait()
        vector[:] = self.result[:n]
        return vector

    def barrier(self) -> None:
        """Wait until every rank has called this (the same raises as :meth:`mean`)."""
        if self.rank is None:
            raise RuntimeError("SharedAllreduce.barrier before bind(rank)")
        if self.world > 1:
            self._arrive_and_wait()


class SharedGradientAverager:
    """A learner's ``grad_hook``: replaces the gradients of ``params`` by their mean over the
    learners (:meth:`SharedAllreduce.mean` on one flat float32 vector: one all-reduce per call,
    however many tensors), on whatever device they live (a GPU's go through one host copy each
    way). Every rank must call it the same number of times with parameters of the same shapes.
    Cost: one :meth:`SharedAllreduce.mean`, in place, when the gradients are consecutive pieces
    of one float32 CPU vector (the compiled updates': :mod:`impl.rl.algorithms.compiled_step`),
    else also a gather into one vector and a scatter back (O(parameters) copies, a few torch
    calls per tensor)."""

    def __init__(self, allreduce: SharedAllreduce):
        self.allreduce = allreduce
        self.calls = 0
        self.seconds = 0.0

    def __call__(self, params: Iterable) -> None:
        import torch

        t0 = time.perf_counter()
        grads = [p.grad for p in params if p.grad is not None]
        whole = _one_vector(grads)
        if whole is not None:  # averaged where they lie: no gather, no scatter
            self.allreduce.mean(whole)
        else:
            flat = torch.cat([g.reshape(-1) for g in grads]).to("cpu", torch.float32)
            averaged = torch.from_numpy(self.allreduce.mean(flat.numpy()))
            offset = 0
            for g in grads:
                n = g.numel()
                g.copy_(averaged[offset : offset + n].view_as(g))
                offset += n
        self.calls += 1
        self.seconds += time.perf_counter() - t0


def _one_vector(grads: list) -> np.ndarray | None:
    """One float32 vector over the memory of every tensor of ``grads`` when they are contiguous
    float32 CPU tensors lying back to back, in order (as the compiled updates' gradients do:
    views of one numpy vector, each its own torch storage), so that averaging it in place
    averages each of them; else None. The vector does not own the memory: use it while the
    tensors live. Cost: a few attribute reads per tensor."""
    import ctypes

    import torch

    if not grads:
        return None
    start = grads[0].data_ptr()
    at = start
    for g in grads:
        if g.device.type != "cpu" or g.dtype != torch.float32 or not g.is_contiguous() or g.data_ptr() != at:
            return None
        at += 4 * g.numel()
    return np.ctypeslib.as_array((ctypes.c_float * ((at - start) // 4)).from_address(start))
