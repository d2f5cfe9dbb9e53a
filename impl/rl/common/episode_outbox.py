"""A worker's finished episodes, sent to the parent a batch at a time.

An actor process (and the dataflow engine's server) reports each finished episode to the
parent for its :class:`~impl.rl.common.envs.EpisodeLog`. One queue message per episode wakes
the queue's feeder thread in the worker and the parent's reader each time: with CartPole's
short episodes that is hundreds of wake-ups a second, and on a machine with no core to spare
they land on the learner in the middle of its update. :class:`EpisodeOutbox` holds an
episode until the oldest one held is :data:`EPISODES_EVERY_S` old, then sends all it holds
as one message ``(EpisodeOutbox.KIND, [(env_steps, wall_s, return), ...])``, in the order
they ended; the parent records each row as it recorded one episode's message before
(``for row in rows: log.record(*row)``), so the log holds the same rows in the same order
per worker, up to :data:`EPISODES_EVERY_S` (plus one insert batch) later.

Exit paths: :meth:`EpisodeOutbox.flush` sends what is held now; the worker calls it on every
exit (normal end, stop request, exception: a ``finally``, or the ``with`` form) before it
reports done, stopped or its error, so no finished episode is lost and the parent has every
episode before the worker's last word (one queue keeps one process's messages in order).
"""

from __future__ import annotations

import math
import time

__all__ = ["EPISODES_EVERY_S", "EpisodeOutbox"]

EPISODES_EVERY_S = 0.05
"""Seconds an outbox holds a finished episode at most before it sends it (with the others
held): at most 20 messages a second per worker, against a progress callback every 0.25 s."""


class EpisodeOutbox:
    """Batches one worker's finished episodes into queue messages (module docstring).

    ``out``: anything with ``put`` (a ``multiprocessing`` queue); ``interval_s``: how long the
    oldest held episode may wait (default :data:`EPISODES_EVERY_S`; 0 sends each episode at
    once); ``clock``: seconds, monotonic. Cost: one clock read per :meth:`add` and
    :meth:`poll`, one ``put`` per batch. Thread-safety: none; one per worker process.
    """

    KIND = "episodes"

    def __init__(self, out, interval_s: float = EPISODES_EVERY_S, clock=time.monotonic):
        if isinstance(interval_s, bool) or not isinstance(interval_s, (int, float)) or not math.isfinite(interval_s) \
                or interval_s < 0:
            raise ValueError(f"interval_s must be a finite number >= 0, got {interval_s!r}")
        self.out = out
        self.interval_s = float(interval_s)
        self.clock = clock
        self._rows: list[tuple[int, float, float]] = []
        self._due = math.inf  # when the oldest held episode must go

    def add(self, env_steps: int, wall_s: float, ret: float) -> None:
        """Hold one finished episode; sends every held one if the oldest is due."""
        now = self.clock()
        if not self._rows:
            self._due = now + self.interval_s
        self._rows.append((int(env_steps), float(wall_s), float(ret)))
        if now >= self._due:
            self.flush()

    def poll(self) -> None:
        """Send the held episodes if the oldest is due: call it between episodes (e.g. once per
        insert batch), so that a worker whose episodes are long does not hold one until the next."""
        if self._rows and self.clock() >= self._due:
            self.flush()

    def flush(self) -> None:
        """Send every held episode now, as one message (nothing when none is held)."""
        if not self._rows:
            return
        # a new list, not clear(): a multiprocessing queue pickles the message later, in its
        # feeder thread, and must see the rows as they are now
        rows, self._rows, self._due = self._rows, [], math.inf
        self.out.put((self.KIND, rows))

    def __enter__(self) -> EpisodeOutbox:
        return self

    def __exit__(self, *exc) -> None:
        self.flush()
