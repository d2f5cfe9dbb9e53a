"""Building the replay buffer a run uses, and warming its kernels up before the clock starts.

The numba kernels behind every tree variant are compiled (or loaded from numba's on-disk
cache) on first call; :func:`warm_up` makes those first calls on a tiny buffer of the same
variant and schema so that neither loop times compilation. Every variant takes the PER
constants (``uniform`` accepts and ignores them), so both loops pass the same arguments.
"""

from __future__ import annotations

import numpy as np
from replaybench.impl import registry
from replaybench.impl.storage import random_batch

__all__ = ["buffer_kwargs", "make_local_buffer", "warm_up"]


def buffer_kwargs(cfg, acfg) -> dict:
    """Keyword arguments for registry.create / SharedPrioritizedBuffer.create besides the
    capacity, fields and seed: the PER constants of the algorithm plus the variant's parameters."""
    return {"alpha": acfg.per_alpha, "beta": acfg.per_beta_start, "eps": acfg.per_eps, **cfg.buffer_params}


def make_local_buffer(cfg, acfg, fields, seed):
    """The in-process buffer of the sequential loop: ``registry.create(cfg.buffer, ...)``;
    ``seed`` (anything numpy.random.default_rng takes) seeds its sampling."""
    return registry.create(cfg.buffer, capacity=acfg.buffer_capacity, fields=fields, seed=seed,
                           **buffer_kwargs(cfg, acfg))


def warm_up(cfg, acfg, fields) -> None:
    """Call add, sample and update_priorities once on a 64-slot buffer of ``cfg.buffer``.

    Its random streams are fixed (seed 0) and separate from the run's. Cost: milliseconds
    with numba's cache warm; seconds the first time a kernel compiles.
    """
    rng = np.random.default_rng(0)
    buf = registry.create(cfg.buffer, capacity=64, fields=fields, seed=0, **buffer_kwargs(cfg, acfg))
    buf.add(random_batch(fields, 16, rng))
    out = buf.sample(8, beta=acfg.per_beta_start)
    buf.update_priorities(out["indices"], rng.random(8))
