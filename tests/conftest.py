"""Shared fixtures: the CartPole-sized schema, batch generators, and the cache sizes that the
"auto" speed settings read."""

import numpy as np
import pytest

from replaybench.bench.workloads import random_batch

CARTPOLE_FIELDS = {
    "obs": ((4,), "float32"),
    "action": ((), "int64"),
    "reward": ((), "float32"),
    "next_obs": ((4,), "float32"),
    "done": ((), "bool"),
}


def make_batch(n, rng, fields=CARTPOLE_FIELDS):
    """A random batch of ``n`` transitions matching ``fields`` (bench's one generator;
    integers in [0, 100) so that rows are told apart)."""
    return random_batch(fields, n, rng, int_high=100)


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


@pytest.fixture(params=["machine-cache", "tiny-cache"])
def cache(request, monkeypatch):
    """The machine's cache sizes, or a 64-byte private cache with every tree level counted as
    leaving it, so that prefetch="auto" (and storage="auto") pick the touch passes (and rows),
    and the touch passes run over every level, even at test capacities."""
    if request.param == "tiny-cache":
        from replaybench.impl import working_set
        from replaybench.impl.trees import array_trees

        monkeypatch.setattr(working_set, "private_cache_bytes", lambda: 64)
        monkeypatch.setattr(array_trees, "TOUCH_LEVEL_BYTES", 0)
    return request.param
