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


@pytest.fixture(scope="session", autouse=True)
def sb3_logs_in_a_temporary_folder(tmp_path_factory):
    """Stable-Baselines3's learn makes its log folder (``SB3-<time>`` under /tmp, empty at
    verbose=0) unless SB3_LOGDIR names one: the tests' go into pytest's temporary folders."""
    with pytest.MonkeyPatch.context() as patch:  # restored after the session
        patch.setenv("SB3_LOGDIR", str(tmp_path_factory.mktemp("sb3-logs")))
        yield


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


#: Conformance tests whose cases for the GPU tree (variant ``torch-kary``) are marked slow: each
#: of its operations is a handful of torch calls (about 10 us each on the CPU, against the numba
#: trees' microsecond), so the drift tests' 10**6 updates, the boundary sweep and the cache
#: tracer's probe take it half a minute. They still run in ``make test-slow``; its other
#: conformance cases run by default. Its ``tiny-cache`` cases are marked too: that fixture
#: changes the host storage and touch-pass choices, which a device buffer does not make, so
#: they repeat the ``machine-cache`` cases.
_SLOW_FOR_TORCH_KARY = {"test_random_updates_stay_within_documented_bound",
                        "test_falling_total_keeps_relative_error_small", "test_traces_follow_the_real_kernels",
                        "test_descent_on_every_boundary_matches_reference"}


@pytest.hookimpl(tryfirst=True)  # before the "-m 'not slow'" deselection
def pytest_collection_modifyitems(config, items):
    for item in items:
        if "torch-kary" in item.name and (getattr(item, "originalname", "") in _SLOW_FOR_TORCH_KARY
                                          or "tiny-cache" in item.name):
            item.add_marker(pytest.mark.slow)
