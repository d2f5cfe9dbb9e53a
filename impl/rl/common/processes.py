"""Small helpers every multi-process engine uses: ports, work shares, progress cadence.

One definition each, so that engines agree: a run's progress callback fires every
:data:`PROGRESS_EVERY_S` and work is split by :func:`share`. The cores an engine counts are
:func:`impl.machine.usable_cores`'s.
"""

from __future__ import annotations

import socket

__all__ = ["PROGRESS_EVERY_S", "free_port", "share"]

PROGRESS_EVERY_S = 0.25
"""Seconds between two calls of a run's ``progress`` callback (every engine)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free when asked (the OS picks it; another process may
    take it before the caller binds, which gloo's rendezvous then reports)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def share(total: int, parts: int, rank: int) -> int:
    """Rank ``rank``'s share when ``total`` is split as evenly as possible into ``parts``
    (the first ``total % parts`` ranks get one more)."""
    return total // parts + (1 if rank < total % parts else 0)
