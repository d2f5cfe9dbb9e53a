"""Uniform replay: the baseline every prioritized variant is compared with."""

from replaybench.impl import registry
from replaybench.impl.buffers import UniformReplayBuffer


def uniform_buffer(capacity, fields, *, seed=None, alpha=None, beta=None, eps=None, storage="auto",
                   hugepages=False, prefetch="auto"):
    """A UniformReplayBuffer. ``alpha``, ``beta`` and ``eps`` are accepted and ignored (no
    priorities), so callers pass every variant the same PER arguments; ``storage``,
    ``hugepages`` and ``prefetch`` are the buffer's (impl.buffers.ReplayBuffer)."""
    return UniformReplayBuffer(capacity, fields, seed=seed, storage=storage, hugepages=hugepages, prefetch=prefetch)


registry.register(
    "uniform", uniform_buffer, structure="uniform",
    params={"storage": "auto", "hugepages": False, "prefetch": "auto"},
    description="uniform sampling with replacement, no priorities (baseline)",
)
