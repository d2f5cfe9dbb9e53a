"""Shared fixtures: the CartPole-sized schema and batch generators."""

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
