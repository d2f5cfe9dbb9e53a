"""What a learner's replay time is made of in a run, and the same calls timed alone.

A learner's ``replay`` section (:mod:`impl.rl.common.profiler`) covers its sample call and its
priority update. :class:`ReplayParts` splits that lump without touching the profiler's sections
(which must keep summing to the wall time): it keeps the sample call's seconds (one
perf_counter pair per update, no allocation), and reads the buffer's own accumulators, the
lock wait (``lock_wait_seconds``) and the rows redrawn because an insert overwrote them during
the copy (``counters()["redrawn_rows"]``), once at "go" and once at the end. The update's
seconds are the section's rest: ``replay - sample``.

:func:`replay_alone` repeats the same calls (sample into a preallocated output, the tensor
conversion, the priority update; same buffer, batch size and beta) after the run's timed part,
when no actor inserts and no other learner samples, at the run's pace: the learner's own
gradient step between each sample and its update, and the learner's mean wait per update in
the run before each call, both untimed. Timed back to back instead, the calls would find every
line they touch still in cache, as they never do in a run, and the in-run/alone ratio would
count the warm caches as the run's overhead. The in-run seconds per update over these are what the run adds to the
calls (lock waits, redraws, cache lines the actors' inserts evicted, a core shared with busy
processes).

Parts (seconds, summed over a role's processes; ``redrawn_rows`` a count):

============  ==================================================================================
sample        the sample call (with ``learner_prefetch``: waiting for the helper's draw)
update        the priority update: the ``replay`` section minus ``sample``
cpu           CPU seconds of the learner's thread inside the sample and update calls: the rest of
              sample + update is time off the CPU (a core shared with more runnable processes than
              it has, sleeps in a policy's back-off)
lock_wait     waits for the buffer's locks inside those calls (part of sample + update, not added)
redrawn_rows  rows redrawn because their slot changed during the copy (buffer-wide count)
tensor        alone only: ``torch.from_numpy`` over every array of the sample (in a run this
              happens inside ``learn``, in the ``sgd`` section; zero-copy over the preallocated
              output)
learn         alone only: the gradient steps between the samples and their updates (outside the
              timed calls)
pause         alone only: the waits before the calls, the run's pace (outside the timed calls)
============  ==================================================================================

Cost: in the loop one perf_counter pair and two thread_time pairs per update (about 2.5 us
on the 2-core VM, against 50-200 us of replay per update); at the ends two property reads and
one ``counters()`` call. Thread-safety: none; one per learner.
"""

from __future__ import annotations

import math
import time

__all__ = ["ALONE_CALLS", "ALONE_BUDGET_S", "ReplayParts", "replay_alone"]

#: Calls :func:`replay_alone` makes at most (fewer when the run did fewer updates) ...
ALONE_CALLS = 200
#: ... and the seconds it may take at most (it stops at whichever comes first).
ALONE_BUDGET_S = 1.0


class ReplayParts:
    """The parts of one learner's ``replay`` section (module docstring). :meth:`start` at "go",
    ``sample_s += ...`` per sample call, :meth:`finish` with the section's total at the end."""

    __slots__ = ("buf", "sample_s", "cpu_s", "_wait0", "_redrawn0")

    def __init__(self, buf):
        self.buf = buf
        self.sample_s = 0.0
        self.cpu_s = 0.0
        self._wait0 = 0.0
        self._redrawn0 = 0

    def start(self) -> None:
        """Zero the sample and CPU seconds and note the buffer's lock wait and redraw counts now."""
        self.sample_s = self.cpu_s = 0.0
        self._wait0 = self.buf.lock_wait_seconds
        self._redrawn0 = self.buf.counters()["redrawn_rows"]

    def finish(self, replay_s: float) -> dict:
        """``{sample, update, cpu, lock_wait, redrawn_rows}`` since :meth:`start`; ``replay_s`` is
        the learner's ``replay`` section total (the update is its rest, never negative)."""
        return {"sample": self.sample_s, "update": max(0.0, replay_s - self.sample_s), "cpu": self.cpu_s,
                "lock_wait": self.buf.lock_wait_seconds - self._wait0,
                "redrawn_rows": self.buf.counters()["redrawn_rows"] - self._redrawn0}


def replay_alone(buf, batch_size: int, beta: float, priorities, calls: int = ALONE_CALLS,
                 budget_s: float = ALONE_BUDGET_S, *, learn=None, pause_s: float = 0.0) -> dict:
    """Time ``calls`` learner replay steps on ``buf`` alone, at the learner's pace.

    Each call, in the learner loop's order: ``pause_s`` seconds of sleep (untimed: the
    learner's wait for its next update in the run), ``sample(batch_size, beta, out)`` into one
    preallocated output (timed), ``torch.from_numpy`` of each of its arrays (timed apart as
    ``tensor``), ``learn(batch)`` (untimed: the learner's gradient step, which returns the new
    priorities), then ``update_priorities`` of the drawn rows with those priorities (timed).
    Without ``learn`` the update writes ``priorities`` (a learner's last new priorities,
    ``batch_size`` of them, so it does the work of a real one). The pause and the gradient step
    are there so that the timed calls meet the caches as they do in the run (the learner's own
    work between its sample and its update, and the time other processes have between two
    updates to evict its lines); timed back to back the calls would run on warm caches. The
    updates change the drawn rows' priorities, and ``learn`` the learner's weights: call it
    after the run's last update, and read anything of the learner's before. One untimed call
    (pause left out) first: the output's pages and the kernels' first touch. Stops when
    ``budget_s`` seconds have passed, pauses and gradient steps included (at least one call is
    timed).

    Returns ``{"calls", "sample", "tensor", "update", "cpu", "lock_wait", "learn", "pause"}``:
    the calls timed and the seconds of each part summed over them (``cpu``: the thread's CPU
    seconds in sample and update; ``lock_wait``: the buffer's lock waits in them, none expected
    alone; ``learn`` and ``pause``: the untimed gradient steps' and pauses' seconds, 0 without
    them, so the pace can be read back). Raises ValueError naming ``batch_size``, ``calls``,
    ``priorities``, ``pause_s`` or ``learn`` when it is not a positive integer, not
    ``batch_size`` long, not a finite number >= 0, or not callable, before any call. Cost:
    ``calls`` x (pause + sample + learn + update), plus 16-odd ``from_numpy`` per call, at
    most about ``budget_s`` plus one call.
    """
    import torch

    for name, value in (("batch_size", batch_size), ("calls", calls)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if len(priorities) != batch_size:
        raise ValueError(f"priorities must hold batch_size = {batch_size} values, got {len(priorities)}")
    if isinstance(pause_s, bool) or not isinstance(pause_s, (int, float)) or not math.isfinite(pause_s) \
            or pause_s < 0:
        raise ValueError(f"pause_s must be a finite number >= 0, got {pause_s!r}")
    if learn is not None and not callable(learn):
        raise ValueError(f"learn must be callable (batch -> priorities) or None, got {learn!r}")
    out = buf.sample_out(batch_size)
    batch = buf.sample(batch_size, beta=beta, out=out)
    buf.update_priorities(batch["indices"], priorities if learn is None else learn(batch), batch["stamps"])
    sample_s = tensor_s = update_s = cpu_s = learn_s = slept_s = 0.0
    n = 0
    waited = buf.lock_wait_seconds
    clock, cpu = time.perf_counter, time.thread_time
    deadline = clock() + budget_s
    while n < calls and (n == 0 or clock() < deadline):
        if pause_s > 0:
            p0 = clock()
            time.sleep(pause_s)
            slept_s += clock() - p0
        t0, c0 = clock(), cpu()  # the same clock calls, in the same order, as the learner loop's
        batch = buf.sample(batch_size, beta=beta, out=out)
        c1 = cpu()
        t1 = clock()
        for array in batch.values():
            torch.from_numpy(array)
        t2 = clock()
        new = priorities
        if learn is not None:
            new = learn(batch)
            t2l = clock()
            learn_s += t2l - t2
        else:
            t2l = t2
        c2 = cpu()
        buf.update_priorities(batch["indices"], new, batch["stamps"])
        cpu_s += (c1 - c0) + (cpu() - c2)
        t3 = clock()
        sample_s += t1 - t0
        tensor_s += t2 - t1
        update_s += t3 - t2l
        n += 1
    return {"calls": n, "sample": sample_s, "tensor": tensor_s, "update": update_s, "cpu": cpu_s,
            "lock_wait": buf.lock_wait_seconds - waited, "learn": learn_s, "pause": slept_s}
