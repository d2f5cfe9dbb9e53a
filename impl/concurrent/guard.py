"""What makes ``close()`` safe while other threads still call: an in-flight call counter per
object, and guarded views of the parts an object hands out.

* :class:`CallGate` counts the calls in flight on one object. :meth:`CallGate.shut` (used by
  ``close()``) refuses new calls with :class:`BufferClosed`, waits for the calls in flight to
  return, and only then lets the caller release what they use. The :func:`guarded` decorator
  puts a method behind the object's gate.
* :class:`GuardedView` stands for a part handed out (a tree, a storage, a lock): it forwards
  attribute reads and method calls through the same gate, so after ``close()`` it raises
  :class:`BufferClosed` naming the part instead of reading memory the buffer let go of.

This module is about the Python objects; it is not what keeps memory valid. The shared
segment's mapping is released only when the last NumPy view over it is gone
(:mod:`impl.concurrent.shm`), so a raw array reached through a part before ``close()``
stays readable memory (of a buffer nobody updates any more), never a dangling pointer.

Cost per guarded call: one frame, one ``list.append`` and one ``list.remove`` of the
thread id, one flag read: about 0.2 us on CPython 3.11 (timeit, best of 15 runs on a busy
2-core machine: 270 ns for the guarded ``capacity`` property against 42 ns unguarded; see
:func:`guarded`), under 1% of a 32-row ``sample``. Correctness rests on the GIL: ``list.append``/``remove`` are atomic and
every thread sees the flag and the list in one order, so a call that enters after
``shut()`` set the flag sees it and backs out, and one that entered before is seen by the
drain loop.
"""

from __future__ import annotations

import functools
import inspect
import threading
import time
from _thread import get_ident

__all__ = ["BufferClosed", "CallGate", "GuardedView", "guarded"]

FIRST_WAIT = 1e-5  # seconds; shut()'s wait for calls in flight doubles from here ...
LONGEST_WAIT = 1e-3  # ... up to here (a call in flight usually returns within microseconds)


class BufferClosed(ValueError):
    """A call on a closed shared buffer, or on a part it handed out (a ValueError, as before
    this class existed, so callers that caught ValueError still do)."""

    def __init__(self, what: str, segment: str):
        self.what, self.segment = what, segment
        super().__init__(f"buffer is closed (shared segment {segment!r}): {what} can no longer be used; "
                         "attach(handle) again while the owner keeps it open")

    def __reduce__(self):  # so that it crosses process boundaries (multiprocessing, Ray) intact
        return type(self), (self.what, self.segment)


class CallGate:
    """In-flight call counter of one object; thread-safe (see the module docstring).

    ``what`` and ``segment`` name the object in :class:`BufferClosed`.
    """

    __slots__ = ("what", "segment", "_calls", "_shut", "_closing", "_lock")

    def __init__(self, what: str, segment: str):
        self.what, self.segment = what, segment
        self._calls: list[int] = []  # the thread id of every call in flight (a thread may appear twice)
        self._shut = False  # True once shut() returned: refused for good
        self._closing = False  # True from the start of shut(): new calls are refused
        self._lock = threading.Lock()  # one shut() at a time

    def enter(self, what: str | None = None) -> int:
        """Count a call in; returns the token for :meth:`leave`. BufferClosed (naming ``what``,
        default this object) once shutting."""
        me = get_ident()
        self._calls.append(me)
        if self._closing:  # read after the append: see the module docstring for why this order
            self._calls.remove(me)
            raise BufferClosed(what or self.what, self.segment)
        return me

    def leave(self, me: int) -> None:
        self._calls.remove(me)

    def refuse(self, what: str | None = None) -> None:
        """Raise BufferClosed (naming ``what``, default this object) when shut or shutting."""
        if self._closing:
            raise BufferClosed(what or self.what, self.segment)

    @property
    def shut_down(self) -> bool:
        return self._shut

    def shut(self, timeout: float) -> bool:
        """Refuse new calls and wait (up to ``timeout`` seconds) until the calls in flight
        have returned.

        Returns True for the one call that shut the gate, False when it was already shut
        (so the caller releases its resources exactly once). Raises RuntimeError when the
        calling thread itself has a call in flight (``close()`` from inside a call, e.g. a
        signal handler: waiting would never end), and TimeoutError when calls are still in
        flight after ``timeout`` seconds; both leave the object open, as it was.
        """
        with self._lock:
            if self._shut:
                return False
            if get_ident() in self._calls:
                raise RuntimeError(f"close() was called from inside a call on {self.what} in the same thread "
                                   "(a signal handler?): it would wait for itself; close after that call returns")
            self._closing = True
            start, wait = time.monotonic(), FIRST_WAIT
            while self._calls:
                if time.monotonic() - start > timeout:
                    self._closing = False
                    raise TimeoutError(f"close(): {len(self._calls)} call(s) on {self.what} still in flight after "
                                       f"{timeout:g} s (waiting for a lock or a writer?); the buffer stays open, "
                                       "close it again later")
                time.sleep(wait)
                wait = min(2.0 * wait, LONGEST_WAIT)
            self._shut = True
            return True


def guarded(method):
    """Decorator: run ``method`` as a call counted on ``self._gate`` (BufferClosed once the
    object is closing or closed). Works under ``@property`` too.

    The wrapper is generated with ``method``'s own parameters (as :mod:`dataclasses` makes
    its methods), because forwarding ``*args, **kwargs`` and calling :meth:`CallGate.enter` /
    :meth:`CallGate.leave` would each add a Python-level step to the cost every public call
    pays (together about 2.5x the inline count). Only plain parameters (positional or
    keyword, with or without defaults) are supported; anything else is refused here.
    """
    params = list(inspect.signature(method).parameters.values())
    if not params or any(p.kind is not p.POSITIONAL_OR_KEYWORD for p in params):
        raise TypeError(f"guarded: {method.__qualname__} must take self and plain parameters only")
    defaults = {f"_default_{p.name}": p.default for p in params if p.default is not p.empty}
    signature = ", ".join(p.name if p.default is p.empty else f"{p.name}=_default_{p.name}" for p in params)
    forward = ", ".join(p.name for p in params)
    self_name = params[0].name
    source = (f"def make(method, get_ident, BufferClosed, {', '.join(defaults) or '_=None'}):\n"
              f"    def call({signature}):\n"
              f"        gate = {self_name}._gate\n"
              f"        me = get_ident()\n"
              f"        calls = gate._calls\n"
              f"        calls.append(me)\n"
              f"        try:\n"
              f"            if gate._closing:\n"
              f"                raise BufferClosed(gate.what, gate.segment)\n"
              f"            return method({forward})\n"
              f"        finally:\n"
              f"            calls.remove(me)\n"
              f"    return call\n")
    namespace = {}
    exec(source, namespace)  # noqa: S102 -- the source is built above from parameter names only
    call = namespace["make"](method, get_ident, BufferClosed, **defaults)
    return functools.wraps(method)(call)


class GuardedView:
    """A part ``target`` handed out by an object with gate ``gate``, named ``what`` in errors.

    Reading an attribute and calling a method go through the gate: after ``close()`` both
    raise BufferClosed naming ``what``; a method call in progress delays ``close()`` as the
    object's own calls do. Attribute writes go to the target. Also a context manager when
    the target is one (the locks). Values read from the target (arrays, dicts) are the
    target's own, not guarded: see the module docstring for why they stay safe.
    """

    __slots__ = ("_target", "_gate", "_what")

    def __init__(self, target, gate: CallGate, what: str):
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_gate", gate)
        object.__setattr__(self, "_what", what)

    def __getattr__(self, name):
        self._gate.refuse(self._what)
        value = getattr(self._target, name)
        if callable(value) and hasattr(value, "__self__"):  # a bound method: guard the call too
            return _guarded_call(value, self._gate, self._what)
        return value

    def __setattr__(self, name, value):
        self._gate.refuse(self._what)
        setattr(self._target, name, value)

    def __enter__(self):
        self._gate.refuse(self._what)
        self._target.__enter__()
        return self

    def __exit__(self, *exc):
        return self._target.__exit__(*exc)  # always: a lock taken before close() must be released

    def __repr__(self) -> str:
        state = "closed" if self._gate.shut_down else "open"
        return f"<{self._what} ({state} buffer {self._gate.segment!r}): {type(self._target).__name__}>"


def _guarded_call(method, gate: CallGate, what: str):
    @functools.wraps(method)
    def call(*args, **kwargs):
        me = gate.enter(what)
        try:
            return method(*args, **kwargs)
        finally:
            gate.leave(me)

    return call
