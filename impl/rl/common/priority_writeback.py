"""A learner's new priorities written back to the buffer: at once, or one update late.

:class:`PriorityWriteBack` is the last step of a learner's update in the process engine
(:attr:`TrainConfig.priority_lag <impl.rl.config.TrainConfig.priority_lag>`):

- lag 0: update ``n``'s priorities are waited for and written before the learner draws sample
  ``n + 1`` (every engine's order);
- lag 1: they are written once update ``n + 1`` has been queued, so a learner on a GPU waits
  for update ``n`` while the device already runs ``n + 1`` (and the host has drawn and staged
  its sample meanwhile). The indices and stamps of the update owed are copied when it is
  pushed: the sampler refills its outputs with the next draws.

Either way every update's priorities are written exactly once, in update order, with the
stamps its sample read (an update whose slots were overwritten since is skipped by the
buffer, as at lag 0); :meth:`PriorityWriteBack.flush` writes the one still owed (the run's
last). The wait for a result counts as ``waiting`` (the learner's sgd section), the write as
``writing`` (its replay section). Thread-safety: one learner thread.
"""

from __future__ import annotations

import time

import numpy as np

__all__ = ["PriorityWriteBack"]


class PriorityWriteBack:
    """Write ``(indices, priorities, stamps)`` of each update to ``buf`` ``lag`` updates late.

    Parameters
    ----------
    buf : a shared buffer (``update_priorities(indices, priorities, stamps)``)
    lag : 0 or 1
    waiting, writing : context managers timing the wait for a result and the write
    parts : an object with a ``cpu_s`` float, to which the writes' thread CPU seconds are added
    """

    def __init__(self, buf, lag: int, waiting, writing, parts):
        if lag not in (0, 1) or isinstance(lag, bool):
            raise ValueError(f"lag must be 0 or 1, got {lag!r}")
        self.buf, self.lag = buf, lag
        self.waiting, self.writing, self.parts = waiting, writing, parts
        self.last: np.ndarray | None = None  # the priorities written last
        self._owed = None

    @property
    def owed(self) -> bool:
        """Whether an update's priorities are still to be written."""
        return self._owed is not None

    def push(self, batch: dict, pending) -> None:
        """Update ``n`` was queued on ``batch`` (its ``indices`` and ``stamps``) and gives its
        ``(loss, priorities)`` through ``pending.result()``: write update ``n - 1``'s owed
        priorities (lag 1) then owe these, or (lag 0) write these now."""
        if self._owed is not None:
            self._write()
        if self.lag:
            self._owed = (batch["indices"].copy(), batch["stamps"].copy(), pending)
        else:
            self._owed = (batch["indices"], batch["stamps"], pending)
            self._write()

    def flush(self) -> None:
        """Write the priorities still owed, if any."""
        if self._owed is not None:
            self._write()

    def _write(self) -> None:
        idx, stamps, pending = self._owed
        self._owed = None
        with self.waiting:
            _, priorities = pending.result()
        with self.writing:
            c = time.thread_time()
            self.buf.update_priorities(idx, priorities, stamps)
            self.parts.cpu_s += time.thread_time() - c
        self.last = priorities
