"""The errors a training run raises: a bad argument before anything starts, a worker that failed.

Every engine, algorithm and helper of :mod:`impl.rl` raises these, so callers catch one type
per kind of failure whichever engine ran.
"""

from __future__ import annotations

__all__ = ["ConfigError", "InjectedFailure", "WorkerFailed"]


class ConfigError(ValueError):
    """A training argument that cannot run; ``field`` names it (a :class:`~impl.rl.TrainConfig`
    field, or a field of the algorithm's config) and ``value`` is what was given."""

    def __init__(self, field: str, value, message: str):
        super().__init__(message)
        self.field = field
        self.value = value

    def __reduce__(self):  # pickled across processes (a Ray worker's error reaches the driver)
        return type(self), (self.field, self.value, self.args[0])


class InjectedFailure(RuntimeError):
    """Raised on purpose by a worker when :attr:`TrainConfig.fail` names it (tests)."""


class WorkerFailed(RuntimeError):
    """A worker process raised or died; ``worker`` names it, ``detail`` holds its traceback,
    ``pids`` the process ids of all the run's workers (every one has exited by then)."""

    def __init__(self, worker: str, detail: str, pids: tuple = ()):
        super().__init__(f"worker {worker} failed:\n{detail}")
        self.worker = worker
        self.detail = detail
        self.pids = tuple(pids)

    def __reduce__(self):
        return type(self), (self.worker, self.detail, self.pids)
