"""Where a training process spends its time: perf_counter accumulators per section.

Every loop (sequential, actor, learner) wraps its phases in ``with prof.section("env_step"):``
and at the end reports :meth:`SectionProfiler.breakdown`: seconds per section plus ``other``,
the part of the wall time no section covered (Python bookkeeping, queue messages, progress).

Sections (:data:`SECTIONS`):

=========  ==========================================================================
env_step   ``env.step`` and ``env.reset``
inference  the policy's forward pass and exploration noise (actors)
replay     buffer operations: add, sample, update_priorities (lock waits included)
sgd        loss, backward, gradient all-reduce across learners, optimizer step
wait       blocked on the samples-per-insert rate limiter (or on start-up barriers)
other      wall time minus the sections above
=========  ==========================================================================

Cost: about 0.3 us per ``with`` block (two perf_counter calls and a dict update).
Thread-safety: none; one profiler per thread of execution.
"""

from __future__ import annotations

import time

__all__ = ["SECTIONS", "SectionProfiler"]

SECTIONS = ("env_step", "inference", "replay", "sgd", "wait", "other")


class _Section:
    """A reusable context manager that adds its elapsed time to one accumulator."""

    __slots__ = ("_totals", "_name", "_t0")

    def __init__(self, totals: dict, name: str):
        self._totals = totals
        self._name = name
        self._t0 = 0.0

    def __enter__(self):
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self._totals[self._name] += time.perf_counter() - self._t0
        return False


class SectionProfiler:
    """Accumulates seconds per section; ``other`` is derived from the wall time at the end."""

    def __init__(self):
        self.totals = {name: 0.0 for name in SECTIONS if name != "other"}
        self._sections = {name: _Section(self.totals, name) for name in self.totals}
        self.start = time.perf_counter()

    def section(self, name: str) -> _Section:
        """Context manager timing one phase; ``name`` is one of :data:`SECTIONS` but ``other``."""
        return self._sections[name]

    def add(self, name: str, seconds: float) -> None:
        """Credit ``seconds`` measured elsewhere (e.g. a rate limiter's wait) to ``name``."""
        self.totals[name] += seconds

    def restart(self) -> None:
        """Zero every accumulator and restart the wall clock (after a warm-up, at "go")."""
        for name in self.totals:
            self.totals[name] = 0.0
        self.start = time.perf_counter()

    def breakdown(self, wall_s: float | None = None) -> dict[str, float]:
        """Seconds per section including ``other`` = wall - sum(sections) (never negative)."""
        wall = time.perf_counter() - self.start if wall_s is None else wall_s
        out = dict(self.totals)
        out["other"] = max(0.0, wall - sum(out.values()))
        return out
