"""Shared fixtures: the CartPole-sized schema and batch generators."""

import numpy as np
import pytest

CARTPOLE_FIELDS = {
    "obs": ((4,), "float32"),
    "action": ((), "int64"),
    "reward": ((), "float32"),
    "next_obs": ((4,), "float32"),
    "done": ((), "bool"),
}


def make_batch(n, rng, fields=CARTPOLE_FIELDS):
    """A random batch of ``n`` transitions matching ``fields``."""
    out = {}
    for name, (shape, dtype) in fields.items():
        shape = (n, *((shape,) if isinstance(shape, int) else shape))
        dtype = np.dtype(dtype)
        if dtype.kind == "b":
            out[name] = rng.random(shape) < 0.5
        elif dtype.kind in "iu":
            out[name] = rng.integers(0, 100, shape).astype(dtype)
        else:
            out[name] = rng.random(shape).astype(dtype)
    return out


@pytest.fixture
def rng():
    return np.random.default_rng(12345)
