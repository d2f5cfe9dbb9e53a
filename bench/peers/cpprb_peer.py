"""cpprb's PrioritizedReplayBuffer on the micro workloads (variant ``peer:cpprb``).

cpprb (https://ymd_h.gitlab.io/cpprb/) is a C++/Cython replay-buffer library. The adapter
builds ``cpprb.PrioritizedReplayBuffer(capacity, env_dict)`` with the benchmark's fields as
``{name: {"shape": shape, "dtype": dtype}}`` and keeps cpprb's own defaults.

Differences from replaybench's buffers, which a reader of the ratios should know:

- Priorities: cpprb stores ``(priority + eps) ** alpha`` with alpha = 0.6 (as ours) but
  eps = 1e-4 (ours 1e-6), in float32 sum and min segment trees (binary, K = 2).
- ``add`` takes keyword arrays, so the adapter calls ``add(**batch)``: one extra Python call
  (about 0.1 us) on top of cpprb's own cost. New transitions get the largest priority so far.
- ``sample(batch_size, beta=0.4)`` draws positions with cpprb's internal C++ generator, not
  the NumPy generator our variants get; it returns the fields plus ``indexes`` (uint64) and
  ``weights`` (float32, normalised by the weight of the smallest priority), and scalar
  fields come back with shape ``(batch, 1)`` rather than ``(batch,)``.
- ``update_priorities(indexes, priorities)`` does not check its input the way ours does
  (no error for an index beyond the stored size).
- cpprb's ``add`` of one transition costs about 20 us, so filling 2**22 slots one at a time
  would take minutes; :func:`bench.workloads.fill` adds in chunks of 2**16.
"""

from __future__ import annotations

import numpy as np

from replaybench.bench.workloads import Target

__all__ = ["NAME", "STRUCTURE", "PARAMS", "DESCRIPTION", "version", "target"]

NAME = "cpprb"
STRUCTURE = "cpprb-segment-tree"
PARAMS = {"K": 2, "dtype": "float32", "alpha": 0.6, "beta": 0.4, "eps": 1e-4}
DESCRIPTION = "cpprb.PrioritizedReplayBuffer with its defaults (peer library)"


def version() -> str:
    """cpprb's version; raises ImportError when it is not installed or fails to load."""
    import cpprb  # noqa: F401  (the import itself is the availability check)
    from importlib.metadata import version as dist_version

    return dist_version("cpprb")


def target(capacity: int, fields: dict, rng: np.random.Generator) -> Target:
    """cpprb's buffer with bound entry points. ``rng`` is unused: cpprb samples with its own."""
    import cpprb

    env_dict = {}
    for name, (shape, dtype) in fields.items():
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        env_dict[name] = {"shape": shape or 1, "dtype": np.dtype(dtype).type}
    rb = cpprb.PrioritizedReplayBuffer(capacity, env_dict)
    add = rb.add

    def add_batch(batch):
        return add(**batch)

    def add_with_priorities(batch, priorities):
        return add(priorities=priorities, **batch)

    return Target(rb, add_batch, rb.sample, rb.update_priorities, "indexes", add_with_priorities)
