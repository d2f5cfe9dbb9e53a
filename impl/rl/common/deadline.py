"""A run's time limit over work that may never return: :func:`alarm_at`.

An engine checks its deadline between steps; an environment that hangs inside one ``step``
(in this process) never gives it the chance. :func:`alarm_at` arms a one-shot SIGALRM for the
deadline that raises TimeoutError in the main thread wherever it is (in Python code, or a
blocking call that a signal interrupts: ``time.sleep``, a pipe read), so the engine's
``finally`` blocks run and close what it started. C code that never returns to the
interpreter (a native loop holding the GIL) is not interrupted: the alarm lands when it does.

The alarm is armed only on the main thread and only where SIGALRM has Python's default
handler (a caller's own handler and timer are left alone); otherwise the block runs with the
engine's own checks alone. It is disarmed, and the previous handler put back, when the block
ends. Cost: two system calls per block.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time

__all__ = ["alarm_at"]


@contextlib.contextmanager
def alarm_at(deadline: float | None, what: str = "the run"):
    """Raise TimeoutError (naming ``what``) in the main thread once ``time.monotonic()``
    passes ``deadline`` inside the block (None: no limit). Wrap the work, not the clean-up:
    the alarm must not land in the code that closes what the work started."""
    if (deadline is None or threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGALRM) != signal.SIG_DFL):
        yield
        return

    def expired(signum, frame):
        signal.setitimer(signal.ITIMER_REAL, 0)
        raise TimeoutError(f"{what} passed its time limit (an env step, or other work, did not return)")

    previous = signal.signal(signal.SIGALRM, expired)
    try:
        signal.setitimer(signal.ITIMER_REAL, max(1e-3, deadline - time.monotonic()))
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
