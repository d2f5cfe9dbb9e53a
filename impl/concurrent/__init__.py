"""Concurrent use of one replay buffer by threads and processes.

* :class:`SharedPrioritizedBuffer` -- a registered variant's tree and storage in shared memory.
* :data:`POLICIES` -- how operations synchronise: global-lock, pal-locks, lazy-writing, optimistic,
  deferred.
* :mod:`.locks`, :mod:`.shm`, :mod:`.atomics` -- the building blocks.
"""

from .buffer import BufferHandle, SharedPrioritizedBuffer
from .policies import POLICIES
from .shm import leaked_segments

__all__ = ["BufferHandle", "SharedPrioritizedBuffer", "POLICIES", "leaked_segments"]
