"""Uniform replay: the baseline every prioritized variant is compared with."""

from replaybench.impl import registry
from replaybench.impl.buffers import UniformReplayBuffer


def uniform_buffer(capacity, fields, *, seed=None, alpha=None, beta=None, eps=None):
    """A UniformReplayBuffer. ``alpha``, ``beta`` and ``eps`` are accepted and ignored (no
    priorities), so callers pass every variant the same PER arguments."""
    return UniformReplayBuffer(capacity, fields, seed=seed)


registry.register(
    "uniform", uniform_buffer, structure="uniform",
    description="uniform sampling with replacement, no priorities (baseline)",
)
