"""TrainConfig.priority_lag: a process-engine learner writes update n's priorities once update
n + 1 is queued (impl.rl.common.priority_writeback), through Learner.learn_async and the
non-waiting device-to-host copies of impl.rl.common.device.HostCopies."""

import contextlib
import dataclasses

import gymnasium as gym
import numpy as np
import pytest
import torch

from replaybench.bench import suites
from replaybench.bench.scenarios import training
from replaybench.impl.rl import ConfigError, train
from replaybench.impl.rl.common.device import HostCopies, host_arrays
from replaybench.impl.rl.common.priority_writeback import PriorityWriteBack

HAS_CUDA = torch.cuda.is_available()


def _quick(**changes):
    cfg = [c for c in training.suite_configs(suites.load("training-quick")) if not c.sequential][0]
    return dataclasses.replace(cfg, **changes)


@pytest.mark.parametrize("bad", [2, -1, True, "1", 1.0, None])
def test_a_bad_priority_lag_is_refused_naming_the_field(bad):
    with pytest.raises(ConfigError, match=f"priority_lag must be 0 or 1 \\(updates\\), got {bad!r}") as err:
        _quick(priority_lag=bad).validate()
    assert err.value.field == "priority_lag"


class _Log:
    """A buffer and a clock of events: every write, every push."""

    def __init__(self):
        self.events = []
        self.cpu_s = 0.0

    def update_priorities(self, idx, priorities, stamps):
        self.events.append(("write", idx.tolist(), priorities.tolist(), stamps.tolist()))


class _Pending:
    def __init__(self, log, u):
        self.log, self.u, self.taken = log, u, 0

    def result(self):
        self.taken += 1
        self.log.events.append(("wait", self.u))
        return 0.0, np.full(2, float(self.u))


def _pushes(lag: int, n: int):
    log = _Log()
    wb = PriorityWriteBack(log, lag, contextlib.nullcontext(), contextlib.nullcontext(), log)
    indices, stamps = np.zeros(2, np.int64), np.zeros(2, np.int64)  # the sampler's outputs, refilled per draw
    pendings = []
    for u in range(n):
        indices[:] = (2 * u, 2 * u + 1)
        stamps[:] = (10 + u, 20 + u)
        pendings.append(_Pending(log, u))
        log.events.append(("push", u))
        wb.push({"indices": indices, "stamps": stamps}, pendings[-1])
    log.events.append(("flush",))
    wb.flush()
    assert not wb.owed and all(p.taken == 1 for p in pendings)  # each result waited for once
    assert wb.last.tolist() == [n - 1.0, n - 1.0]
    return log.events


def _write(u):
    return ("write", [2 * u, 2 * u + 1], [float(u)] * 2, [10 + u, 20 + u])


def test_at_lag_0_each_update_s_priorities_are_written_before_the_next_push():
    want = []
    for u in range(4):
        want += [("push", u), ("wait", u), _write(u)]
    assert _pushes(0, 4) == want + [("flush",)]


def test_at_lag_1_each_update_s_priorities_are_written_after_the_next_push_and_the_last_at_the_flush():
    """Update u's wait and write come after update u + 1 was pushed (queued), with u's own
    indices and stamps although the sampler's arrays were refilled since; none is lost."""
    want = [("push", 0)]
    for u in range(1, 4):
        want += [("push", u), ("wait", u - 1), _write(u - 1)]
    assert _pushes(1, 4) == want + [("flush",), ("wait", 3), _write(3)]


def test_a_writeback_refuses_a_bad_lag():
    with pytest.raises(ValueError, match="lag must be 0 or 1, got 2"):
        PriorityWriteBack(_Log(), 2, None, None, None)


def test_host_copies_on_the_cpu_hand_back_the_tensors_own_memory():
    loss, td = torch.tensor(0.5), torch.arange(4, dtype=torch.float32)
    got = HostCopies(torch.device("cpu"), 5).start(loss, td).result()
    want = host_arrays(loss, td)
    assert [g.tolist() for g in got] == [w.tolist() for w in want]
    assert np.shares_memory(got[1], td.numpy())


def _dqn_batches(n_batches: int, n: int = 64, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"obs": rng.normal(size=(n, 4)).astype(np.float32), "action": rng.integers(2, size=n),
             "reward": rng.normal(size=n).astype(np.float32), "next_obs": rng.normal(size=(n, 4)).astype(np.float32),
             "done": rng.random(n) < 0.1, "weights": rng.random(n).astype(np.float32)} for _ in range(n_batches)]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[
    pytest.mark.cuda, pytest.mark.skipif(not HAS_CUDA, reason="torch sees no CUDA device")])])
def test_dqn_s_learn_async_one_update_behind_gives_what_learn_gives(device):
    """Two seeded learners on the same batches: learn() on one, learn_async() taken one update
    late on the other (as at priority_lag 1): the same losses and priorities (bit for bit on
    the CPU, to float32 rounding on a GPU, where the second is graphed), the same weights."""
    from replaybench.impl.rl.algorithms.dqn import DQNConfig, DQNLearner

    env = gym.make("CartPole-v1")
    spaces = (env.observation_space, env.action_space)
    plain, lagged = (DQNLearner(spaces, DQNConfig.for_env("CartPole-v1", cuda_graph=g), 3, device=device)
                     for g in (False, True))
    batches = _dqn_batches(8)
    want = [plain.learn(b) for b in batches]
    got, owed = [], None
    for b in batches:
        pending = lagged.learn_async(b)
        if owed is not None:
            got.append(owed.result())
        owed = pending
    got.append(owed.result())
    for i, ((lw, pw), (lg, pg)) in enumerate(zip(want, got)):
        if device == "cpu":
            assert lg == lw and pg.tobytes() == pw.tobytes(), i
        else:
            assert lg == pytest.approx(lw, rel=1e-4), i
            np.testing.assert_allclose(pg, pw, rtol=1e-4, atol=1e-5, err_msg=f"update {i}")
    if device == "cpu":
        assert lagged.digest() == plain.digest()


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="torch sees no CUDA device")
def test_host_copies_on_a_gpu_wait_for_their_own_copy_and_refuse_a_third_owed_one():
    copies = HostCopies(torch.device("cuda"), 3, slots=2)
    first = copies.start(torch.full((3,), 1.0, device="cuda"))
    second = copies.start(torch.full((3,), 2.0, device="cuda"))
    with pytest.raises(RuntimeError, match="every one of the 2 pinned slots still holds a copy"):
        copies.start(torch.zeros(3, device="cuda"))
    assert first.result()[0].tolist() == [1.0] * 3 and second.result()[0].tolist() == [2.0] * 3
    with pytest.raises(RuntimeError, match="result was taken already"):
        first.result()
    grown = copies.start(torch.arange(5, dtype=torch.float32, device="cuda"))  # nothing owed: the slots grow
    assert grown.result()[0].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_a_run_at_priority_lag_1_does_every_update():
    cfg = _quick(priority_lag=1)
    acfg = cfg.validate()
    result = train(cfg)
    assert result.updates == int((cfg.steps - acfg.learning_starts) * acfg.updates_per_step)
    assert sum(result.actor_ids_sampled.values()) == result.updates * acfg.batch_size
    assert result.replay_alone  # the learner's last priorities reached the calls timed alone
