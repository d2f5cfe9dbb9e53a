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


class _Spy:
    """``buf`` with its sample and update calls noted in ``events`` (the rest passes through)."""

    def __init__(self, buf, events):
        self._buf, self.events = buf, events

    def __getattr__(self, name):
        return getattr(self._buf, name)

    def sample(self, *args, **kwargs):
        self.events.append("sample")
        return self._buf.sample(*args, **kwargs)

    def update_priorities(self, indices, priorities, stamps):
        self.events.append(("update", float(np.asarray(priorities)[0])))
        return self._buf.update_priorities(indices, priorities, stamps)


def test_replay_alone_paces_each_call_pause_sample_learn_update(buf, monkeypatch):
    """The pause comes before each timed call (not before the untimed first one), the learn
    step between each sample and its update, and the update writes learn's priorities."""
    import time

    events = []
    monkeypatch.setattr(time, "sleep", lambda s: events.append(("pause", s)))

    def learn(batch):
        assert len(batch["indices"]) == 64 and events[-1] == "sample"
        events.append("learn")
        return np.full(64, 3.0)

    got = replay_alone(_Spy(buf, events), 64, 0.4, np.ones(64), calls=3, budget_s=30.0, learn=learn, pause_s=0.004)
    step = ["sample", "learn", ("update", 3.0)]
    assert events == step + 3 * [("pause", 0.004), *step]
    assert got["calls"] == 3 and got["learn"] > 0.0
    assert buf.max_priority == pytest.approx(3.0 ** buf.alpha, rel=1e-6)


def test_replay_alone_leaves_the_learn_step_and_the_pause_out_of_the_timed_seconds(buf):
    """A learn step of 50 ms and a pause of 30 ms per call: 4 calls spend over 0.3 s outside
    the timed calls, none of it in sample, tensor or update (64 rows each: well under 10 ms)."""
    import time

    def learn(batch):
        time.sleep(0.05)
        return np.full(64, 2.0)

    got = replay_alone(buf, 64, 0.4, np.ones(64), calls=4, budget_s=30.0, learn=learn, pause_s=0.03)
    assert got["calls"] == 4
    assert got["learn"] >= 4 * 0.05 and got["pause"] >= 4 * 0.03
    assert got["sample"] + got["tensor"] + got["update"] < 0.04, got
    assert got["cpu"] < 0.04, got


def test_replay_alone_counts_pauses_in_its_budget(buf):
    got = replay_alone(buf, 64, 0.4, np.ones(64), calls=1000, budget_s=0.1, pause_s=0.04)
    assert 1 <= got["calls"] <= 3 and got["pause"] >= got["calls"] * 0.04
    # without a pace: nothing outside the timed calls
    plain = replay_alone(buf, 64, 0.4, np.ones(64), calls=5, budget_s=30.0)
    assert plain["learn"] == 0.0 and plain["pause"] == 0.0


@pytest.mark.parametrize("kwargs,match", [
    ({"pause_s": -0.001}, r"pause_s must be a finite number >= 0, got -0.001"),
    ({"pause_s": float("nan")}, r"pause_s must be a finite number >= 0, got nan"),
    ({"pause_s": "1"}, r"pause_s must be a finite number >= 0, got '1'"),
    ({"learn": 3}, r"learn must be callable \(batch -> priorities\) or None, got 3"),
])
def test_replay_alone_refuses_a_bad_pace_before_any_call(buf, kwargs, match):
    before = buf.max_priority
    with pytest.raises(ValueError, match=match):
        replay_alone(buf, 64, 0.4, np.ones(64), calls=5, **kwargs)
    assert buf.max_priority == before
