"""Building the replay buffer a run uses, and warming its kernels up before the clock starts.

The numba kernels behind every tree variant are compiled (or loaded from numba's on-disk
cache) on first call; :func:`warm_up` makes those first calls on a tiny buffer of the same
variant and schema so that neither loop times compilation. Every variant takes the PER
constants (``uniform`` accepts and ignores them), so both loops pass the same arguments.
"""

from __future__ import annotations

import numpy as np
from replaybench.impl import registry, working_set
from replaybench.impl.storage import parse_schema, random_batch

__all__ = ["buffer_kwargs", "check_buffer", "make_local_buffer", "resolved_params", "warm_up"]

#: Slots of the throw-away buffer :func:`check_buffer` builds: the variants' parameter checks do
#: not depend on the capacity (the algorithm config checks ``buffer_capacity`` itself).
_CHECK_CAPACITY = 64
_CHECK_FIELDS = {"x": ((), "float32")}


def buffer_kwargs(cfg, acfg) -> dict:
    """Keyword arguments for registry.create / SharedPrioritizedBuffer.create besides the
    capacity, fields and seed: the PER constants of the algorithm plus the variant's parameters."""
    return {"alpha": acfg.per_alpha, "beta": acfg.per_beta_start, "eps": acfg.per_eps, **cfg.buffer_params}


def check_buffer(cfg, acfg) -> None:
    """Refuse ``cfg.buffer_params`` (and ``cfg.policy``, in the parallel loops) as the run's
    buffer would, without starting anything.

    Builds the run's buffer at 64 slots with a one-field schema and drops it: the variant's
    own checks through ``registry.create`` (``K=abc``; ``K=3`` where the layout needs a power
    of 2; ``alpha=-1``; an unknown parameter) and, for the parallel loops, the shared buffer's
    (:meth:`~impl.concurrent.SharedPrioritizedBuffer.check`: a policy the structure cannot
    take, such as pal-locks over kary-prefix; a variant it cannot share, such as uniform).
    Raises ConfigError: field ``buffer_params`` (value: the parameters) for a refused
    parameter, ``policy`` for a refused pairing, ``buffer`` for a variant that cannot be shared.
    Cost: microseconds (no shared memory, no kernel call).
    """
    from replaybench.impl.concurrent import SharedPrioritizedBuffer

    from replaybench.impl.rl.common.errors import ConfigError

    kwargs = buffer_kwargs(cfg, acfg)
    try:
        registry.create(cfg.buffer, capacity=_CHECK_CAPACITY, fields=_CHECK_FIELDS, seed=0, **kwargs)
    except (TypeError, ValueError) as err:  # the variant's (or the sampler's) own refusal
        raise ConfigError("buffer_params", cfg.buffer_params, f"buffer {cfg.buffer!r} refuses parameters "
                                                              f"{cfg.buffer_params}: {err}") from None
    if cfg.sequential:
        return
    try:
        SharedPrioritizedBuffer.check(_CHECK_CAPACITY, _CHECK_FIELDS, variant=cfg.buffer, policy=cfg.policy,
                                      **kwargs)
    except NotImplementedError as err:  # the policy's fit to the structure
        raise ConfigError("policy", cfg.policy, f"policy {cfg.policy!r} cannot run over buffer {cfg.buffer!r}: "
                                                f"{err}") from None
    except (TypeError, ValueError) as err:  # a variant the shared buffer cannot hold
        raise ConfigError("buffer", cfg.buffer, f"buffer {cfg.buffer!r} cannot run in the parallel loops: "
                                                f"{err}") from None


def make_local_buffer(cfg, acfg, fields, seed):
    """The in-process buffer of the sequential loop: ``registry.create(cfg.buffer, ...)``;
    ``seed`` (anything numpy.random.default_rng takes) seeds its sampling."""
    return registry.create(cfg.buffer, capacity=acfg.buffer_capacity, fields=fields, seed=seed,
                           **buffer_kwargs(cfg, acfg))


def resolved_params(cfg, acfg, fields) -> dict:
    """``{"storage": ..., "prefetch": ...}``: what the run's buffer (``cfg.buffer`` of
    ``acfg.buffer_capacity`` slots of ``fields``) resolves ``"auto"`` to on this machine, as its
    ``resolved_params`` say, for the result rows, without building a buffer of the run's size.

    Storage is :func:`impl.working_set.choose_storage` of the same arguments. Prefetch turns on
    once tree plus storage outgrow the private cache: when the rows alone do, that is decided
    (True under ``"auto"``); otherwise everything is small (the rows within the cache) and the
    buffer is built and asked, which also gives ``kernel`` where the tree has a choice. Cost: a
    few microseconds, or one build of at most a cache-sized buffer."""
    kwargs = buffer_kwargs(cfg, acfg)
    capacity = acfg.buffer_capacity
    row_bytes = [spec.nbytes for spec in parse_schema(fields).values()]
    if capacity * sum(row_bytes) <= working_set.private_cache_bytes():
        buf = registry.create(cfg.buffer, capacity=capacity, fields=fields, seed=0, **kwargs)
        return dict(getattr(buf, "resolved_params", {}))
    return {"storage": working_set.choose_storage(kwargs.get("storage", working_set.AUTO), capacity, row_bytes),
            "prefetch": working_set.choose_prefetch(kwargs.get("prefetch", working_set.AUTO),
                                                    capacity * sum(row_bytes))}


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
