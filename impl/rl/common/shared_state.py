"""State the parallel loop's processes share: counters, the rate limiter, the weight broadcast.

Everything lives in ``multiprocessing.RawArray`` blocks (anonymous shared memory whose file is
unlinked at creation, so nothing is left in /dev/shm whatever way the processes end). They
reach the workers as Process arguments. No locks: each slot has exactly one writer (one
actor's step count, one learner's update count, the parent's stop and go flags, learner 0's
weight version), writes are aligned 8-byte stores, and readers tolerate a value that is
one write old. A pipe whose only writer is the parent tells workers when the parent is gone
(:attr:`SharedState.stopped`). Start workers with "spawn" or "forkserver": with "fork" they
would inherit the pipe's write end and never see it close.

Weight broadcast (:class:`SharedWeights`) is a seqlock: the single writer (learner 0) makes
the version odd, copies the flat weights, then makes it even; a reader copies only an even
version and keeps the copy only if the version did not change meanwhile. This relies on
stores becoming visible in program order (x86-64's TSO; other CPUs would need fences).
"""

from __future__ import annotations

import ctypes
import time

import numpy as np

from replaybench.impl.ratelimit import RateLimiter as _Limiter
from replaybench.impl.ratelimit import SampleToInsertRatio, Stopped

__all__ = ["SharedState", "RateLimiter", "SharedWeights", "Stopped", "learners_end_at"]

_STOP, _GO, _VERSION, _FINISH, _END_AT = 0, 1, 2, 3, 4
_N_FLAGS = 5
_T0 = 0  # float slot: time.monotonic() at "go"


class SharedState:
    """Flags and per-worker counters (int64) plus wait seconds (float64), one slot per writer."""

    def __init__(self, ctx, actors: int, learners: int):
        self.actors = int(actors)
        self.learners = int(learners)
        self._ints = ctx.RawArray(ctypes.c_int64, _N_FLAGS + self.actors + self.learners)
        self._floats = ctx.RawArray(ctypes.c_double, 1 + self.actors + self.learners)
        # A pipe only the parent can write to: workers see EOF on it once the parent is gone.
        self._alive_r, self._alive_w = ctx.Pipe(duplex=False)
        self._views()

    def close(self) -> None:
        """Parent, after the workers have exited: close the liveness pipe."""
        for conn in (self._alive_r, self._alive_w):
            if conn is not None:
                conn.close()

    def _views(self) -> None:
        ints = np.frombuffer(self._ints, dtype=np.int64)
        floats = np.frombuffer(self._floats, dtype=np.float64)
        self.flags = ints[:_N_FLAGS]
        self.actor_steps = ints[_N_FLAGS : _N_FLAGS + self.actors]
        self.learner_updates = ints[_N_FLAGS + self.actors :]
        self.clock = floats[:1]
        self.actor_wait = floats[1 : 1 + self.actors]
        self.learner_wait = floats[1 + self.actors :]

    def __getstate__(self):
        return {"actors": self.actors, "learners": self.learners, "_ints": self._ints, "_floats": self._floats,
                "_alive_r": self._alive_r}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._alive_w = None  # a worker: only the parent holds the write end
        self._views()

    # flags -------------------------------------------------------------------------------
    @property
    def stopped(self) -> bool:
        """True once the parent set the stop flag, or (in a worker) once the process that
        started it is gone (EOF on the liveness pipe): a parent killed with SIGKILL cannot set
        the flag, and the workers would otherwise train on, or wait forever, with nobody to
        report to. Cost in a worker: one poll() system call (~1 us)."""
        # (With forkserver the OS parent is the fork server, which outlives a killed main process,
        # so the parent's pid or multiprocessing's own sentinel cannot tell.)
        return bool(self.flags[_STOP]) or (self._alive_w is None and self._alive_r.poll())

    def stop(self) -> None:
        self.flags[_STOP] = 1

    @property
    def finishing(self) -> bool:
        """True once the parent asked the run to end early and cleanly (:meth:`finish`): the
        workers wind down at their next clean point and report their stats, as at the end of
        their share (a stop, by contrast, abandons the run)."""
        return bool(self.flags[_FINISH])

    def finish(self) -> None:
        """Ask the workers to end the run now, cleanly (parent; the run reached its threshold)."""
        self.flags[_FINISH] = 1

    def learners_end_at(self, rank: int, u: int) -> int | None:
        """While :attr:`finishing`: the update count at which every learner stops
        (:func:`learners_end_at`, over this state's slot)."""
        return learners_end_at(self.flags[_END_AT:_END_AT + 1], rank, u)

    def go(self) -> None:
        """Start the clock and release the workers waiting in :meth:`wait_for_go` (parent)."""
        self.clock[_T0] = time.monotonic()
        self.flags[_GO] = 1

    def wait_for_go(self, poll_s: float = 1e-3) -> float:
        """Block until :meth:`go`; returns the shared start time. Raises Stopped on stop."""
        while not self.flags[_GO]:
            if self.stopped:
                raise Stopped()
            time.sleep(poll_s)
        return float(self.clock[_T0])

    @property
    def t0(self) -> float:
        return float(self.clock[_T0])

    # counters ----------------------------------------------------------------------------
    def env_steps(self) -> int:
        """Transitions inserted so far by all actors (O(actors))."""
        return int(self.actor_steps.sum())

    def updates(self) -> int:
        """Updates done by the learners (learner 0's count; the learners move in lockstep)."""
        return int(self.learner_updates[0])


def learners_end_at(slot: np.ndarray, rank: int, u: int) -> int | None:
    """The update count at which every learner of a run that is finishing early stops, agreed
    through ``slot`` (one shared int64, 0 until fixed), called by learner ``rank`` at the top of
    its update ``u`` (0-based) once it sees the run finishing. Learner 0 fixes it to ``u + 1``:
    it still does update ``u``, in whose gradient all-reduce its peers may already wait; none
    can be further on, since that all-reduce needs learner 0. A learner stops before update
    ``v`` when ``v >= end``; another learner reads None until learner 0 has fixed it, and then
    goes on with its update ``u``, which learner 0 does too. Learner 0 writes before its
    all-reduce of update ``u``, which every peer passes before its update ``u + 1``, so all
    read the same end before it matters (one learner: no all-reduce, it ends after ``u``)."""
    if rank == 0 and slot[0] == 0:
        slot[0] = u + 2  # stored + 1: 0 means "not fixed"
    end = int(slot[0])
    return end - 1 if end else None


class RateLimiter:
    """Holds learner updates per env step near ``ratio`` across processes: the one rate
    limiter (:class:`impl.ratelimit.RateLimiter`) over a run's counters.

    With ``steps`` the transitions inserted, ``starts`` the learning start and
    ``due = ratio * (steps - starts)``:

    - a learner may do update ``u + 1`` only when ``u + 1 <= due`` (it never runs ahead of
      the ratio, and never samples before ``starts`` transitions are stored);
    - an actor may insert ``n`` more transitions only while the learners' backlog after the
      insert, ``ratio * (steps + n - starts) - updates``, stays <= ``tolerance``.

    ``tolerance`` is raised to ``1 + ratio * insert_batch`` where smaller, so one side can
    always proceed (no deadlock). Once ``state.finishing`` (the run ends early, cleanly) a
    wait returns at once: the caller winds down. ``state`` is a :class:`SharedState` or any
    object with ``env_steps()``, ``updates()``, ``stopped``, ``finishing``, ``actor_wait`` and
    ``learner_wait`` (the Ray engine's counters); the time a worker spends blocked is added
    to its slot of ``actor_wait`` / ``learner_wait`` and returned.
    """

    def __init__(self, state, ratio: float, starts: int, tolerance: float, insert_batch: int,
                 poll_s: float = 5e-5, max_poll_s: float = 1e-3):
        self.state = state
        self.bounds = SampleToInsertRatio(float(ratio), int(starts), 0.0, float(tolerance)).deadlock_free(1, insert_batch)
        self.tolerance = self.bounds.insert_slack
        self._limiter = _Limiter(self.bounds, state.env_steps, state.updates, lambda: state.stopped, poll_s,
                                 max_poll_s, released=lambda: state.finishing)

    def wait_insert(self, actor: int, n: int) -> float:
        """Block actor ``actor`` until it may insert ``n`` transitions; returns seconds waited."""
        def record(seconds):
            self.state.actor_wait[actor] += seconds

        return self._limiter.wait_insert(n, record=record)

    def wait_update(self, learner: int, u: int) -> float:
        """Block learner ``learner`` (which has done ``u`` updates) until update ``u + 1`` is due."""
        def record(seconds):
            self.state.learner_wait[learner] += seconds

        return self._limiter.wait_sample(1, sampled=u, record=record)


class SharedWeights:
    """A float32 vector in shared memory with a version counter (seqlock; one writer)."""

    def __init__(self, ctx, state: SharedState, size: int):
        self.size = int(size)
        self._raw = ctx.RawArray(ctypes.c_float, self.size)
        self.state = state
        self.array = np.frombuffer(self._raw, dtype=np.float32)

    def __getstate__(self):
        return {"size": self.size, "_raw": self._raw, "state": self.state}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.array = np.frombuffer(self._raw, dtype=np.float32)

    @property
    def version(self) -> int:
        """Even: a complete vector; odd: a write is in progress. 0: nothing published yet."""
        return int(self.state.flags[_VERSION])

    def publish(self, flat) -> int:
        """Write ``flat`` (tensor or array of ``size`` floats); returns the new version.
        Only one process may publish. Cost: one copy of the vector."""
        flags = self.state.flags
        v = int(flags[_VERSION])
        flags[_VERSION] = v + 1
        self.array[:] = np.asarray(flat, dtype=np.float32)
        flags[_VERSION] = v + 2
        return v + 2

    def read_if_newer(self, have: int):
        """``(version, copy)`` when a complete version newer than ``have`` is there, else None."""
        flags = self.state.flags
        v1 = int(flags[_VERSION])
        if v1 == have or v1 & 1 or v1 == 0:
            return None
        copy = self.array.copy()
        return (v1, copy) if int(flags[_VERSION]) == v1 else None
