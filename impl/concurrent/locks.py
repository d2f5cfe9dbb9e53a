"""A mutex in one shared int64 word, usable by threads and processes alike, that survives
the death of its holder.

Why not ``multiprocessing.Lock``: it can only be handed to processes at creation time, cannot
live inside the buffer's shared segment, and a process killed while holding it leaves it
locked forever. This lock is a word in the segment: 0 when free, else the holder's *token*
``pid << 22 | native thread id mod 2**22``, set by compare-and-swap.

Waiting: when the holder is another process, up to :data:`SPINS` immediate retries (a short
critical section ends within them), then :data:`YIELDS` yields of the core, then sleeps that
double from 50 us to 0.5 ms (so a long wait costs almost no CPU on an oversubscribed
machine); when the holder is a thread of this process, yields at once (it needs the GIL to
release). The time spent is counted in :attr:`SharedLock.wait_seconds`, and the time from
each acquisition to its release in :attr:`SharedLock.hold_seconds` (two clock reads per
acquisition, ~0.1 us: what the scaling model uses as the serial part of an operation).

Recovery rule (a holder that died): a waiter that has waited ``check_every`` seconds reads
the holder's pid; if that process no longer exists (or is a zombie), the waiter takes the
lock over with one compare-and-swap (so exactly one waiter wins) and runs the ``on_recover``
callback while holding it, before its own critical section. The callback must restore the
invariants the dead holder may have broken (the buffer rebuilds the tree's inner nodes from
its leaves and voids the slots the dead writer had reserved). A pid reused by a new process
within that window would be mistaken for the holder; Linux allocates pids cyclically, so this
needs ~4 million process creations in between.

Shared holders (optional, ``readers``): compiled kernels may hold the lock *shared*, each with
its token in one of a range of reader words beside the lock word
(:func:`impl.concurrent.fused._acquire_shared`: a sample's draw, which writes nothing).
:meth:`SharedLock.acquire` takes the word (which stops new shared holders), then waits for the
reader words to clear, with the same spin, yield and sleep; a reader whose process is dead
has its word cleared (a draw changes nothing, so there is nothing to recover), and a reader
alive past ``timeout`` makes it release the word and raise TimeoutError naming the reader.

Not reentrant: acquiring a lock the calling thread holds raises RuntimeError instead of
deadlocking. ``timeout`` (default 120 s) turns a deadlock into TimeoutError naming the holder.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np

from .atomics import cas, first_nonzero, load

__all__ = ["SharedLock", "my_token", "token_pid", "pid_alive", "PID_SHIFT"]

PID_SHIFT = _PID_SHIFT = 22  # a token's pid is its bits from here up (kernels shift by it too)
# Waiting for a holder in another process: retry at once this many times (~150 ns each, about
# the length of a short critical section), then yield the core this many times, then sleep.
# Spinning pays on an idle core; sleeping at once cost 30-45% of two learners' time at 2**18.
SPINS = 200
YIELDS = 50


_local = threading.local()


def _forget_tokens() -> None:
    """In a forked child: every thread-local token names the parent's pid; start afresh."""
    global _local
    _local = threading.local()


os.register_at_fork(after_in_child=_forget_tokens)


def my_token() -> int:
    """This thread's lock token (never 0); cached per thread (one attribute read, ~40 ns: it is
    on every fused call's path), recomputed after a fork."""
    try:
        return _local.token
    except AttributeError:
        _local.token = (os.getpid() << _PID_SHIFT) | (threading.get_native_id() & ((1 << _PID_SHIFT) - 1))
        return _local.token


def token_pid(token: int) -> int:
    return int(token) >> _PID_SHIFT


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (a killed, unreaped child)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            state = fh.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except (FileNotFoundError, IndexError):
        return False


class SharedLock:
    """Mutex in ``words[index]`` (an int64 array, typically in shared memory).

    Thread-safety: any number of threads and processes may share one lock word; each thread
    uses it through its own :class:`SharedLock` object or a shared one (the statistics are
    then summed over those threads).
    """

    def __init__(self, words: np.ndarray, index: int, name: str, *, on_recover=None,
                 timeout: float = 120.0, check_every: float = 0.02, readers: range | None = None,
                 on_dead_reader=None):
        if words.dtype != np.int64 or words.ndim != 1:
            raise TypeError(f"lock words must be a 1-d int64 array, got {words.dtype} {words.shape}")
        if readers is not None and (index in readers or not 0 <= readers.start <= readers.stop <= words.shape[0]):
            raise ValueError(f"readers must be a range of words of the array other than the lock word {index}, "
                             f"got {readers!r} for {words.shape[0]} words")
        self.words, self.index, self.name = words, int(index), name
        self.readers = readers if readers is not None else range(0)
        self.on_recover = on_recover
        # Called with the dead tokens once the readers have drained, holding the word, when a
        # dead shared holder's word was cleared: for shared holders that write (atomic-deltas'
        # writers), whose death may leave a write half done. None: nothing to recover.
        self.on_dead_reader = on_dead_reader
        self.timeout, self.check_every = float(timeout), float(check_every)
        self.wait_seconds = 0.0  # total time spent waiting (uncontended acquisitions add 0)
        self.hold_seconds = 0.0  # total time from acquisition to release
        self._acquired_at = 0.0
        self.acquisitions = 0
        self.contended = 0
        self.recoveries = 0

    def acquire(self) -> None:
        token = my_token()
        seen = cas(self.words, self.index, 0, token)
        self.acquisitions += 1
        if seen == 0:
            self._acquired_at = time.perf_counter()
            if self.readers and self._drain_readers(self._acquired_at):
                now = time.perf_counter()
                self.wait_seconds += now - self._acquired_at
                self._acquired_at = now
            return
        if seen == token:
            raise RuntimeError(f"lock {self.name!r} is already held by this thread (not reentrant)")
        self.contended += 1
        start = time.perf_counter()
        last_check = start
        delay = 5e-5
        tries = 0
        pid = os.getpid()
        while True:
            tries += 1
            if token_pid(seen) == pid or tries > SPINS:
                # A holder in this process is a thread that needs the GIL to finish: give it way
                # at once. Past the spin budget, sleep (~50 us at least: the kernel's timer slack).
                if tries <= SPINS + YIELDS:
                    time.sleep(0)
                else:
                    time.sleep(delay)
                    delay = min(delay * 2.0, 5e-4)
            seen = cas(self.words, self.index, 0, token)
            if seen == 0:
                break
            now = time.perf_counter()
            if now - last_check >= self.check_every:
                last_check = now
                if not pid_alive(token_pid(seen)) and cas(self.words, self.index, seen, token) == seen:
                    self._drain_readers(start, restore=seen)
                    self._acquired_at = time.perf_counter()
                    self.wait_seconds += self._acquired_at - start
                    self._recover(seen)
                    return
                if now - start > self.timeout:
                    self.wait_seconds += now - start
                    raise TimeoutError(f"lock {self.name!r} not acquired in {self.timeout:g} s; held by "
                                       f"pid {token_pid(seen)} (token {seen})")
        self._drain_readers(start)
        self._acquired_at = time.perf_counter()
        self.wait_seconds += self._acquired_at - start

    def _drain_readers(self, start: float, restore: int = 0) -> bool:
        """Holding the word: wait until no reader word holds a token (spin, yield, then sleep,
        as :meth:`acquire`), clearing a dead reader's word; whether it had to wait. The caller
        counts the time. Past ``timeout`` from ``start``, the word is set back to ``restore``
        (0, or a dead holder's token this call took over: the next waiter then recovers it)
        and TimeoutError names the reader."""
        words, first, stop = self.words, self.readers.start, self.readers.stop
        waited = False
        dead = []
        while (r := first_nonzero(words, first, stop)) >= 0:
            if not waited:
                waited = True
                self.contended += 1
            first = r
            tries, delay, last_check = 0, 5e-5, time.perf_counter()
            while (reader := load(words, r)) != 0:
                tries += 1
                if tries > SPINS + YIELDS:
                    time.sleep(delay)
                    delay = min(delay * 2.0, 5e-4)
                elif tries > SPINS:
                    time.sleep(0)
                now = time.perf_counter()
                if now - last_check >= self.check_every:
                    last_check = now
                    if not pid_alive(token_pid(reader)):
                        if self.clear_reader(r, reader):  # a draw changes nothing: its word is simply cleared
                            dead.append(reader)
                        continue
                    if now - start > self.timeout:
                        cas(words, self.index, my_token(), restore)
                        self.wait_seconds += now - start
                        raise TimeoutError(f"lock {self.name!r} not acquired in {self.timeout:g} s: a shared "
                                           f"holder, pid {token_pid(reader)} (token {reader}), did not leave")
        if dead and self.on_dead_reader is not None:
            self.recoveries += 1
            try:
                self.on_dead_reader(dead)
            except BaseException:
                cas(words, self.index, my_token(), restore)
                raise
        return waited

    def dead_readers(self) -> list[tuple[int, int]]:
        """``(word, token)`` of each reader word held by a process that is no longer alive
        (:func:`pid_alive`: a zombie counts as dead), this process's own left out: a snapshot,
        without waiting. O(readers) loads plus a pid check (a signal and a /proc read) per
        word another process holds."""
        first, stop = self.readers.start, self.readers.stop
        me = os.getpid()
        # one copy of the words, then read only it: other processes change them meanwhile
        # (numpy's nonzero refuses an array whose count changes while it reads it)
        snapshot = self.words[first:stop].copy()
        return [(first + int(i), t) for i in np.flatnonzero(snapshot).tolist()
                if (t := int(snapshot[i])) != 0 and token_pid(t) != me and not pid_alive(token_pid(t))]

    def clear_reader(self, word: int, token: int) -> bool:
        """Clear reader word ``word`` if it still holds ``token`` (a compare-and-swap: of several
        callers that found the same dead reader, exactly one clears it); whether this call did."""
        return cas(self.words, word, token, 0) == token

    def _recover(self, dead_token: int) -> None:
        self.recoveries += 1
        if self.on_recover is not None:
            try:
                self.on_recover(dead_token)
            except BaseException:
                self.release()
                raise

    def release(self) -> None:
        token = my_token()
        held = time.perf_counter() - self._acquired_at
        seen = cas(self.words, self.index, token, 0)
        if seen != token:
            raise RuntimeError(f"lock {self.name!r} released by a thread that does not hold it "
                               f"(holder token {seen}, this thread {token})")
        self.hold_seconds += held

    def holder(self) -> int:
        """Token of the current holder, 0 if free (a snapshot)."""
        return int(load(self.words, self.index))

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()
        return False
