"""NumPy arrays in one POSIX shared-memory segment, mapped by several processes.

:class:`SharedArena` lays out named arrays (64-byte aligned, so a K=16 float32 sibling group
stays on one cache line) in a single segment under ``/dev/shm``. The process that creates it
owns it; other processes :meth:`~SharedArena.attach` by name, from the picklable
:attr:`~SharedArena.spec`.

Room: :meth:`SharedArena.create` refuses a segment larger than what ``/dev/shm`` has free,
and reserves the segment's pages before mapping them (``posix_fallocate``), raising OSError
(ENOSPC) naming both sizes; a tmpfs allocates pages on first touch, so an unreserved segment
larger than the room left (Docker's 64 MB default) killed its first writer with SIGBUS.

Cleanup, on every exit path:

* the owner unlinks the segment in :meth:`close`, on garbage collection and at interpreter
  exit (``weakref.finalize``), so a normal exit or an exception that unwinds leaves nothing;
* if the owner is killed (SIGKILL), the segment was registered with multiprocessing's
  resource tracker, a separate process that unlinks it when the owner and all its children
  are gone;
* attached processes only map the segment (they never register it, so their exit, clean or
  killed, neither unlinks it early nor leaks it): the kernel drops a dead process's mapping;
* only the creating process unlinks: a child made by ``os.fork()`` inherits the owner's
  objects and their exit hooks, and its exit (``sys.exit(0)``) or its ``close()`` leaves the
  segment to the owner (the pid is checked).

Memory lifetime: nothing here ever unmaps explicitly. Every array is a NumPy view whose
``base`` is the ``mmap`` object, and the mapping goes when that object is garbage, i.e. when
the last view is gone. Closing an ``mmap`` (or a ``SharedMemory``) would unmap at once even
with views alive, because NumPy keeps a reference to the object but no buffer export that
would make ``close()`` refuse; a view used afterwards read freed pages and crashed the
interpreter (issue 28.2). So :meth:`SharedArena.close` drops the arena's references and the
owner unlinks the name (no new attach); a view kept elsewhere keeps its pages (of a segment
nobody else can reach) until it is dropped. The cost is memory held for as long as a caller
keeps a view, the same contract as ``numpy.memmap``.

Thread-safety: the arena object itself is immutable after construction; what the arrays hold
is the callers' business (see :mod:`impl.concurrent.locks`).
"""

from __future__ import annotations

import errno
import mmap
import os
import re
import secrets
import weakref
from dataclasses import dataclass
from multiprocessing import shared_memory

import numpy as np

__all__ = ["ArenaSpec", "SharedArena", "PREFIX", "SHM_DIR", "leaked_segments", "shm_free_bytes"]

PREFIX = "replaybench_"  # every segment's name starts with this, so leaks can be found
SHM_DIR = "/dev/shm"  # where POSIX shared memory lives on Linux
_ALIGN = 64
_NAME = re.compile(re.escape(PREFIX) + r"[A-Za-z0-9_]+")  # what create() makes: one path component


@dataclass(frozen=True)
class ArenaSpec:
    """Everything another process needs to map the arena: name, size and array layout."""

    name: str
    size: int
    arrays: tuple  # ((name, offset, shape, dtype str), ...)


def _layout(arrays: dict) -> tuple[tuple, int]:
    entries, offset = [], 0
    for name, (shape, dtype) in arrays.items():
        dtype = np.dtype(dtype)
        shape = tuple(int(s) for s in np.atleast_1d(shape)) if shape != () else ()
        offset = -(-offset // _ALIGN) * _ALIGN
        entries.append((name, offset, shape, dtype.str))
        offset += int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    return tuple(entries), max(offset, 1)


def _views(buf, entries) -> dict[str, np.ndarray]:
    return {name: np.ndarray(shape, dtype=np.dtype(dt), buffer=buf, offset=off) for name, off, shape, dt in entries}


def shm_free_bytes() -> int | None:
    """Bytes free in ``/dev/shm`` for this process (``statvfs``: available blocks times their
    size), or None where it cannot be read."""
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _mib(nbytes: int) -> str:
    return f"{nbytes} bytes ({nbytes / 2**20:.1f} MiB)"


def _no_room(size: int, free) -> OSError:
    have = "an unknown amount" if free is None else _mib(free)
    return OSError(errno.ENOSPC, f"a shared segment of {_mib(size)} does not fit in {SHM_DIR}, which has {have} "
                                 f"free: use a smaller capacity, or give {SHM_DIR} more room (Docker: --shm-size)")


def _check_room(size: int) -> None:
    """OSError (ENOSPC) naming both sizes when ``size`` bytes exceed what /dev/shm has free.
    Pages of a tmpfs file are allocated on first touch: without this check (and the reservation
    in :func:`_map`) a segment larger than the room left is created, and the first write past
    the room kills the process with SIGBUS."""
    free = shm_free_bytes()
    if free is not None and size > free:
        raise _no_room(size, free)


def _map(name: str, size: int, reserve: bool = False) -> mmap.mmap:
    """Map ``/dev/shm/name`` read-write (the mapping lives until the returned object is garbage).
    ``reserve``: first allocate every page of the file (``posix_fallocate``), so that a /dev/shm
    filled meanwhile by others fails here, with OSError (ENOSPC) naming the sizes, and never
    later as SIGBUS on a write. Cost of the reservation: the kernel zeroing ``size`` bytes once
    (the pages a buffer would touch anyway)."""
    fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR)
    try:
        if reserve and hasattr(os, "posix_fallocate"):
            try:
                os.posix_fallocate(fd, 0, size)
            except OSError as err:
                if err.errno in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
                    raise _no_room(size, shm_free_bytes()) from None
                if err.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # a file system that cannot reserve
                    raise
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


def _unlink(shm: shared_memory.SharedMemory, creator: int) -> None:
    if os.getpid() != creator:  # a forked child running the owner's finalizer: not its segment
        return
    shm.close()  # its own mapping, which no view uses (see create)
    try:
        shm.unlink()
    except FileNotFoundError:
        pass


class SharedArena:
    """Named arrays in one shared-memory segment.

    ``SharedArena.create({"sums": ((n,), "float32"), ...})`` allocates (zero-filled, as fresh
    shared memory is) and owns; ``SharedArena.attach(arena.spec)`` maps it elsewhere.
    ``arena.arrays[name]`` are the NumPy views. Cost: one ``open`` + ``mmap`` (create: a
    second, unused mapping from SharedMemory, unmapped at once, and the reservation of every
    page, see the module docstring); attach commits pages on first touch.
    """

    def __init__(self, spec: ArenaSpec, mapping: mmap.mmap, owner: bool):
        self.spec = spec
        self._owner = owner
        self._pid = os.getpid()
        self.arrays = _views(mapping, spec.arrays)
        self._closed = False
        self._unlinker = None  # the owner's weakref.finalize that unlinks the name

    @classmethod
    def create(cls, arrays: dict, tag: str = "buf") -> "SharedArena":
        entries, size = _layout(arrays)
        tag = re.sub(r"[^A-Za-z0-9_]", "", tag)  # so that attach() accepts the name
        name = f"{PREFIX}{tag}_{os.getpid()}_{secrets.token_hex(4)}"
        # SharedMemory creates the segment and registers it with the resource tracker (the
        # cleanup after a SIGKILL); the views go over a mapping of our own, since SharedMemory
        # unmaps its own in close() and __del__ whatever views remain (see the module docstring).
        _check_room(size)  # before anything is created
        shm = shared_memory.SharedMemory(name=name, create=True, size=size)
        try:
            mapping = _map(shm.name, size, reserve=True)
        except BaseException:
            _unlink(shm, os.getpid())
            raise
        shm.close()
        arena = cls(ArenaSpec(shm.name, size, entries), mapping, True)
        arena._unlinker = weakref.finalize(arena, _unlink, shm, os.getpid())
        return arena

    @property
    def owner(self) -> bool:
        """True in the process that created the segment (not in one forked from it)."""
        return self._owner and os.getpid() == self._pid

    @classmethod
    def attach(cls, spec: ArenaSpec) -> "SharedArena":
        """Map the arena ``spec`` describes; ValueError for a name that create() cannot have
        made, FileNotFoundError when the segment is gone."""
        # Only names create() makes: anything else ("../x", "/etc/passwd", a nested path) would
        # map an arbitrary file read-write.
        if not isinstance(spec.name, str) or not _NAME.fullmatch(spec.name):
            raise ValueError(f"shared segment name must be one path component of letters, digits and '_' "
                             f"starting with {PREFIX!r}, got {spec.name!r}")
        # Map the file directly instead of SharedMemory(name): in Python 3.11 that registers the
        # segment with this process's resource tracker, which would unlink it when we exit.
        try:
            mapping = _map(spec.name, spec.size)
        except FileNotFoundError:
            raise FileNotFoundError(f"shared buffer segment {spec.name!r} does not exist (its owner closed it "
                                    f"or exited)") from None
        return cls(spec, mapping, False)

    def close(self) -> None:
        """Drop this object's views; the owner also unlinks the segment (no new attach).
        Idempotent. Never unmaps under a view: views handed out earlier stay valid memory
        until they are dropped (see the module docstring)."""
        self.arrays = {}
        self._closed = True
        if self._unlinker is not None:
            self._unlinker()

    @property
    def closed(self) -> bool:
        return self._closed


def leaked_segments(pid: int | None = None) -> list[str]:
    """Names of this project's segments currently in /dev/shm, or only those created by
    process ``pid`` (the creator's pid is part of the name). For tests and diagnostics."""
    try:
        names = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n.startswith(PREFIX) and (pid is None or f"_{pid}_" in n))
