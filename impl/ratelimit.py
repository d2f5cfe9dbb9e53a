"""The one rate limiter: Reverb's SampleToInsertRatio over two counters that processes share.

Writers insert items, readers sample them; the limiter keeps samples near
``samples_per_insert`` times the inserts made after a warm-up of ``min_size_to_sample``:

- a reader may take ``n`` more samples while ``sampled + n <= spi * (inserted - min_size)
  + sample_slack`` (never before ``min_size`` items exist; ``sample_slack = 0`` means
  readers never run ahead of the ratio);
- a writer may insert ``n`` more items while ``spi * (inserted + n - min_size) - sampled
  <= insert_slack`` (the readers' backlog after the insert stays within the slack).

With ``insert_slack >= sample_n + spi * insert_n`` (the largest step of each side) one side
can always move when both are blocked, so the limiter cannot deadlock; callers that take
their slack from the user raise it to that (:meth:`SampleToInsertRatio.deadlock_free`).
Reverb states the same bounds as an error buffer around ``spi * inserts - samples``.

:class:`RateLimiter` waits on those conditions: it reads the counters through callables
(each user keeps its counters where its processes can see them), sleeps between polls with a
back-off from ``poll_s`` to ``max_poll_s`` (a blocked writer must not eat a reader's core),
and stops waiting at a ``deadline`` or when ``stopped()`` turns true (then it raises
:class:`Stopped`). Cost of an unblocked call: two counter reads and a comparison.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["SampleToInsertRatio", "RateLimiter", "Stopped"]


class Stopped(Exception):
    """The run asked every worker to stop (another worker failed, a timeout, Ctrl-C)."""


@dataclass(frozen=True)
class SampleToInsertRatio:
    """The bounds (module docstring); pure arithmetic on the two counts."""

    samples_per_insert: float
    min_size_to_sample: float = 0.0
    sample_slack: float = 0.0
    insert_slack: float = 0.0

    def may_sample(self, inserted: float, sampled: float, n: float) -> bool:
        return sampled + n <= self.samples_per_insert * (inserted - self.min_size_to_sample) + self.sample_slack

    def may_insert(self, inserted: float, sampled: float, n: float) -> bool:
        return self.samples_per_insert * (inserted + n - self.min_size_to_sample) - sampled <= self.insert_slack

    def deadlock_free(self, sample_n: float, insert_n: float) -> SampleToInsertRatio:
        """This ratio with ``insert_slack`` raised to ``sample_n + spi * insert_n`` where it is
        smaller: when every writer is blocked the backlog then exceeds one reader step."""
        need = sample_n + self.samples_per_insert * insert_n
        return self if self.insert_slack >= need else SampleToInsertRatio(
            self.samples_per_insert, self.min_size_to_sample, self.sample_slack, need)


class RateLimiter:
    """Blocks readers and writers on a :class:`SampleToInsertRatio` over shared counters.

    ``inserted()`` and ``sampled()`` read the counts (each may be a few writes stale: the
    bounds then hold within one step); ``stopped()`` says the run is over (a wait raises
    Stopped); ``released()`` says the run is ending early and cleanly (a wait returns at once,
    whatever the bounds: the caller checks why and winds down). Thread- and process-safe as far
    as the callables are; holds no state of its own.
    """

    def __init__(self, ratio: SampleToInsertRatio, inserted: Callable[[], float], sampled: Callable[[], float],
                 stopped: Callable[[], bool] = lambda: False, poll_s: float = 5e-5, max_poll_s: float = 1e-3,
                 released: Callable[[], bool] = lambda: False):
        self.ratio = ratio
        self.inserted = inserted
        self.sampled = sampled
        self.stopped = stopped
        self.released = released
        self.poll_s = poll_s
        self.max_poll_s = max_poll_s

    def wait_sample(self, n: float, deadline: float = math.inf, *, sampled: float | None = None,
                    record: Callable[[float], None] | None = None) -> float:
        """Block until ``n`` more samples are allowed, ``deadline`` (a perf_counter time)
        passes or ``released()``; returns the seconds waited. ``sampled``: the caller's own count of samples,
        when it is fresher than the shared one (a learner knows its updates). ``record(s)``
        gets the seconds waited on every exit, a Stopped one included. Raises Stopped when
        the run stops meanwhile."""
        if sampled is None:
            ready = lambda: self.ratio.may_sample(self.inserted(), self.sampled(), n)  # noqa: E731
        else:
            ready = lambda: self.ratio.may_sample(self.inserted(), sampled, n)  # noqa: E731
        return self._wait(ready, deadline, record)

    def wait_insert(self, n: float, deadline: float = math.inf, *,
                    record: Callable[[float], None] | None = None) -> float:
        """Block until ``n`` more inserts are allowed (or ``deadline``); as :meth:`wait_sample`."""
        return self._wait(lambda: self.ratio.may_insert(self.inserted(), self.sampled(), n), deadline, record)

    def _wait(self, ready: Callable[[], bool], deadline: float, record) -> float:
        if ready():
            return 0.0
        t0 = time.perf_counter()
        pause = self.poll_s
        try:
            while not ready() and not self.released():
                if self.stopped():
                    raise Stopped()
                if time.perf_counter() >= deadline:
                    break
                time.sleep(pause)
                pause = min(2.0 * pause, self.max_poll_s)
        finally:
            waited = time.perf_counter() - t0
            if record is not None:
                record(waited)
        return waited
