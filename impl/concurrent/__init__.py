"""Concurrent use of one replay buffer by threads and processes.

* :class:`SharedPrioritizedBuffer` -- a registered variant's tree and storage in shared memory.
* :func:`names` / :func:`get` -- the registered concurrency policies (how operations
  synchronise: global-lock, pal-locks, lazy-writing, optimistic, deferred, sharded, and any module
  added to ``impl/concurrent/policies/``); :mod:`.policy` defines the interface.
* :mod:`.ring` -- the shared ring state every policy builds on (tickets, stamps, writers).
* :class:`BufferClosed` -- what a closed buffer, or a part it handed out, raises (:mod:`.guard`).
* :mod:`.shards` -- the sharded policy's structure: S trees over one ring, block-interleaved.
* :mod:`.locks`, :mod:`.shm`, :mod:`.atomics` -- the building blocks.
"""

from .buffer import BufferHandle, SharedPrioritizedBuffer
from .guard import BufferClosed
from .policy import Policy, get, names
from .shm import leaked_segments

__all__ = ["BufferHandle", "BufferClosed", "SharedPrioritizedBuffer", "Policy", "get", "names", "leaked_segments"]
