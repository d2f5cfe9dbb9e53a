"""Tianshou's PrioritizedReplayBuffer on the micro workloads (variant ``peer:tianshou``).

Tianshou (https://tianshou.org) is a PyTorch RL library whose replay buffers are NumPy arrays
held in a ``Batch``; its ``PrioritizedReplayBuffer`` keeps the priorities in a binary
``SegmentTree`` (float64, level order, reduce and prefix-sum search compiled with numba's
``@njit``, not cached on disk, so each worker compiles them once in the untimed set-up).

The adapter builds ``tianshou.data.PrioritizedReplayBuffer(capacity, alpha=0.6, beta=0.4)``
(Tianshou has no defaults for alpha and beta; these are ours) and otherwise keeps Tianshou's
own behaviour. What a reader of the ratios should know:

- Priorities: ``update_weight(index, w)`` stores ``(|w| + eps) ** alpha`` with
  eps = ``np.finfo(np.float32).eps`` (about 1.2e-7; ours 1e-6): alpha is applied inside, as
  ours. New transitions get ``max_prio ** alpha``, ``max_prio`` being the largest raw
  ``|w| + eps`` seen so far (initially 1).
- Weights: ``(p_j / min_prio) ** -beta`` where ``min_prio`` is the smallest raw ``|w| + eps``
  ever set (never decreases back, and not raised to alpha), then, with the default
  ``weight_norm=True``, divided by their maximum *within the batch* (ours: by the maximum over
  all stored transitions, via the min tree). Both are float64 arrays of shape ``(batch,)``.
- ``add`` takes one transition per call (a ``Batch`` with ``obs, act, rew, terminated,
  truncated, obs_next``); there is no batched add on a single buffer. The adapter's add
  therefore loops over the rows of a batch in Python: ``insert_batch`` of 256 costs 256
  Tianshou adds. ``done`` maps to ``terminated`` (``truncated`` is False), ``action`` to
  ``act``, ``reward`` to ``rew``, ``next_obs`` to ``obs_next``. Each add also does Tianshou's
  episode bookkeeping (episode return and length), which is part of its cost.
- ``sample(n)`` returns ``(batch, indices)``: the fields (scalars with shape ``(n,)``, as
  ours), ``weight``, and int64 indices; it draws positions from NumPy's *global* generator
  (``np.random.rand``), which the adapter seeds from the benchmark's generator once.
- The untimed fill uses Tianshou's bulk copy (``PrioritizedReplayBuffer.update`` from a buffer
  made by ``ReplayBuffer.from_data``, then ``update_weight``), not one ``add`` per row; the
  timed ops are Tianshou's own per-call paths. Its ``SegmentTree`` is float64 level order and
  every ``update`` still walks the new indices in Python (a few us each), so the suites run
  Tianshou only at capacities up to :data:`MAX_CAPACITY` = 2**16; larger grid cells are
  recorded as ``skipped`` with that reason.
"""

from __future__ import annotations

import numpy as np

from replaybench.bench.workloads import Target

__all__ = ["NAME", "STRUCTURE", "PARAMS", "DESCRIPTION", "FORK_AFTER_USE", "MAX_CAPACITY", "version", "target"]

NAME = "tianshou"
STRUCTURE = "tianshou-segment-tree"
PARAMS = {"K": 2, "dtype": "float64", "alpha": 0.6, "beta": 0.4, "eps": float(np.finfo(np.float32).eps),
          "weight_norm": "batch-max"}
DESCRIPTION = "tianshou.data.PrioritizedReplayBuffer, one transition per add (peer library)"
#: The buffer runs no torch op on NumPy input, so the manager may use it before forking the
#: workers: they inherit its numba segment-tree kernels, which are not cached on disk and
#: otherwise cost every worker a compilation of tens of seconds.
FORK_AFTER_USE = True
#: Largest capacity the suites run: the bulk fill still walks every index in Python.
MAX_CAPACITY = 2**16
MAX_CAPACITY_REASON = ("tianshou's fill walks every index in Python (~20 s per worker process for 2**20); "
                       f"capacities above 2**{MAX_CAPACITY.bit_length() - 1} are not run")

#: benchmark field -> Tianshou's reserved key.
KEYS = {"obs": "obs", "action": "act", "reward": "rew", "next_obs": "obs_next", "done": "terminated"}


def version() -> str:
    """Tianshou's version; raises ImportError when it is not installed or fails to load."""
    import tianshou.data  # noqa: F401  (the import itself is the availability check)
    from importlib.metadata import version as dist_version

    return dist_version("tianshou")


def target(capacity: int, fields: dict, rng: np.random.Generator) -> Target:
    """Tianshou's buffer with bound entry points; its global NumPy generator seeded from ``rng``."""
    from tianshou.data import Batch, PrioritizedReplayBuffer, ReplayBuffer

    missing = sorted(set(fields) - set(KEYS))
    if missing:
        raise ValueError(f"tianshou adapter has no mapping for field(s) {missing}")
    np.random.seed(int(rng.integers(2**31)))
    rb = PrioritizedReplayBuffer(capacity, alpha=PARAMS["alpha"], beta=PARAMS["beta"])
    add_one, rb_sample = rb.add, rb.sample
    names = [(KEYS[f], f) for f in fields]

    def rows(batch):
        n = len(next(iter(batch.values())))
        for i in range(n):
            b = Batch(**{key: batch[f][i] for key, f in names}, truncated=False)
            yield b

    def add(batch):
        for b in rows(batch):
            add_one(b)

    def sample(n):
        data, indices = rb_sample(n)
        return {"indices": indices, "data": data}

    def fill_add(batch, priorities):
        # Set-up only: Tianshou's own bulk path (``update`` from a buffer made with ``from_data``)
        # copies the rows in one vectorised write, where ``add`` costs ~0.3 ms per row.
        cols = {key: batch[f] for key, f in names}
        n = len(cols["obs"])
        cols.setdefault("truncated", np.zeros(n, dtype=bool))
        cols["done"] = np.logical_or(cols["terminated"], cols["truncated"])
        rb.update_weight(rb.update(ReplayBuffer.from_data(**cols)), np.asarray(priorities))

    return Target(rb, add, sample, rb.update_weight, "indices", fill_add)
