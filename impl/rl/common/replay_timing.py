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
when no actor inserts and no other learner samples: the in-run seconds per update over these
are what the run adds to the calls (lock waits, redraws, cache lines the actors' inserts
evicted, a core shared with busy processes).

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
============  ==================================================================================

Cost: in the loop one perf_counter pair and two thread_time pairs per update (about 2.5 us
on the 2-core VM, against 50-200 us of replay per update); at the ends two property reads and
one ``counters()`` call. Thread-safety: none; one per learner.
"""

from __future__ import annotations

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
                 budget_s: float = ALONE_BUDGET_S) -> dict:
    """Time ``calls`` learner replay steps on ``buf`` alone: ``sample(batch_size, beta, out)``
    into one preallocated output, ``torch.from_numpy`` of each of its arrays, then
    ``update_priorities`` of the drawn rows with ``priorities`` (a learner's last new
    priorities, ``batch_size`` of them: the update does the work of a real one; it changes the
    drawn rows' priorities, so call it after the run's last update). One untimed call first
    (the output's pages and the kernels' first touch). Stops after ``budget_s`` seconds.

    Returns ``{"calls", "sample", "tensor", "update", "cpu", "lock_wait"}``: the calls timed and
    the seconds of each part summed over them (``cpu``: the thread's CPU seconds in sample and
    update; ``lock_wait``: the buffer's lock waits in them, none expected alone). Raises ValueError naming ``batch_size``, ``calls`` or
    ``priorities`` when it is not a positive integer, or not ``batch_size`` long, before any
    call. Cost: ``calls`` x (sample + update), plus 16-odd ``from_numpy`` per call.
    """
    import torch

    for name, value in (("batch_size", batch_size), ("calls", calls)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if len(priorities) != batch_size:
        raise ValueError(f"priorities must hold batch_size = {batch_size} values, got {len(priorities)}")
    out = buf.sample_out(batch_size)
    batch = buf.sample(batch_size, beta=beta, out=out)
    buf.update_priorities(batch["indices"], priorities, batch["stamps"])
    sample_s = tensor_s = update_s = cpu_s = 0.0
    n = 0
    waited = buf.lock_wait_seconds
    clock, cpu = time.perf_counter, time.thread_time
    deadline = clock() + budget_s
    while n < calls and clock() < deadline:
        t0, c0 = clock(), cpu()  # the same clock calls, in the same order, as the learner loop's
        batch = buf.sample(batch_size, beta=beta, out=out)
        c1 = cpu()
        t1 = clock()
        for array in batch.values():
            torch.from_numpy(array)
        t2 = clock()
        c2 = cpu()
        buf.update_priorities(batch["indices"], priorities, batch["stamps"])
        cpu_s += (c1 - c0) + (cpu() - c2)
        t3 = clock()
        sample_s += t1 - t0
        tensor_s += t2 - t1
        update_s += t3 - t2
        n += 1
    return {"calls": n, "sample": sample_s, "tensor": tensor_s, "update": update_s, "cpu": cpu_s,
            "lock_wait": buf.lock_wait_seconds - waited}
