"""impl.rl.common.replay_timing: the parts of a learner's replay section, and the same calls
timed alone, on a real shared buffer (in this process, no run)."""

import numpy as np
import pytest

from replaybench.bench import concurrency_workers as C
from replaybench.impl.concurrent import SharedPrioritizedBuffer
from replaybench.impl.rl.common.replay_timing import ReplayParts, replay_alone

NB = C.TRANSITIONS["cartpole"]


@pytest.fixture
def buf():
    b = SharedPrioritizedBuffer.create(4096, C.schema(NB), variant="kary-aligned", policy="lazy-writing", seed=0)
    C.prefill(b, 1000, NB)
    yield b
    b.close()


def test_replay_alone_times_sample_tensor_and_update_of_each_call(buf):
    got = replay_alone(buf, 64, 0.4, np.full(64, 2.0), calls=20, budget_s=30.0)
    assert got["calls"] == 20
    for part in ("sample", "tensor", "update", "cpu"):
        assert got[part] > 0.0, part
    assert got["lock_wait"] >= 0.0
    # the thread's CPU seconds in sample + update cannot exceed their wall seconds (clock granularity aside)
    assert got["cpu"] <= got["sample"] + got["update"] + 1e-3
    # the updates landed: the drawn rows now hold priority 2 (the max priority the ring notes rises to it)
    assert buf.max_priority == pytest.approx(2.0 ** buf.alpha, rel=1e-6)


def test_replay_alone_stops_at_its_time_budget(buf):
    got = replay_alone(buf, 64, 0.4, np.ones(64), calls=10_000_000, budget_s=0.05)
    assert 1 <= got["calls"] < 10_000_000


@pytest.mark.parametrize("kwargs,match", [
    ({"batch_size": 0}, "batch_size must be a positive integer, got 0"),
    ({"calls": True}, "calls must be a positive integer, got True"),
    ({"priorities": np.ones(3)}, "priorities must hold batch_size = 64 values, got 3"),
])
def test_replay_alone_refuses_bad_arguments_before_any_call(buf, kwargs, match):
    args = {"batch_size": 64, "beta": 0.4, "priorities": np.ones(64), "calls": 5, **kwargs}
    before = buf.max_priority
    with pytest.raises(ValueError, match=match):
        replay_alone(buf, **args)
    assert buf.max_priority == before


def test_replay_parts_split_the_section_and_read_the_buffer_counters(buf):
    parts = ReplayParts(buf)
    parts.start()
    parts.sample_s, parts.cpu_s = 0.3, 0.25
    got = parts.finish(0.5)
    assert got["sample"] == 0.3 and got["update"] == pytest.approx(0.2) and got["cpu"] == 0.25
    assert got["lock_wait"] >= 0.0 and got["redrawn_rows"] == 0
    assert parts.finish(0.1)["update"] == 0.0  # never negative
