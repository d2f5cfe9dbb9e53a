"""Training runs under faults (issue 55, items 8 and 9).

Item 8: a sequential run over ``torch-kary`` with ``output=device`` trained to the end and then
failed on its last line, ``np.min`` of the final sample's weights (a torch tensor there): the
run's results were lost. Item 9: a learner stopped (SIGSTOP) under ``--timeout`` made the run
end "worker parent failed: run passed its limit", naming no one, although its peer waited for
it at the gradient all-reduce the whole time; the timeout now names the learner waited for.
"""

from __future__ import annotations

import copy
import multiprocessing as mp
import os
import signal
import threading
import time

import numpy as np
import pytest

from replaybench.impl.rl import TrainConfig, WorkerFailed, train
from replaybench.impl.rl.common.allreduce import SharedAllreduce

from _support import assert_exited, own_segments

TINY = dict(hidden=(16, 16), batch_size=16, learning_starts=100, buffer_capacity=1024, updates_per_step=0.5)


# ----------------------------------------------------------------------------------------- item 8
def test_smallest_weight_takes_arrays_and_tensors():
    import torch

    from replaybench.impl.rl.common.result import smallest_weight

    assert smallest_weight(np.array([0.5, 0.25, 1.0], dtype=np.float32)) == 0.25
    got = smallest_weight(torch.tensor([0.5, 0.125, 1.0]))
    assert type(got) is float and got == 0.125
    assert smallest_weight([0.75, 0.5]) == 0.5  # anything numpy takes


def test_a_sequential_run_over_torch_kary_with_device_output_completes():
    """The final weights are a tensor on the buffer's device: the run's result comes back."""
    cfg = TrainConfig(algo="dqn", env="CartPole-v1", buffer="torch-kary",
                      buffer_params={"output": "device", "device": "cpu"}, steps=300, seed=3,
                      overrides=dict(TINY), timeout_s=120)
    result = train(cfg)
    assert result.engine == "sequential" and result.env_steps == 300 and result.updates > 0
    assert type(result.final_weight_min) is float and 0 < result.final_weight_min < 0.999


# ----------------------------------------------------------------------------------------- item 9
def test_the_allreduce_says_who_a_waiting_rank_waits_for():
    """The record the parent reads: rank 0 waits at a barrier for rank 1 (a thread here), named
    with the phase and how long; nothing once rank 1 arrives."""
    group = SharedAllreduce(mp.get_context("fork"), 3, 4, timeout_s=30)
    assert group.stall() is None
    ranks = [copy.copy(group).bind(r) for r in range(3)]
    waiters = [threading.Thread(target=ranks[r].barrier) for r in (0, 2)]
    waiters[0].start()
    time.sleep(0.3)
    waiters[1].start()
    time.sleep(0.1)
    stall = group.stall()
    assert stall is not None and stall.waiter == 0 and stall.missing == [1] and stall.phase == 1
    assert stall.waited_s >= 0.3
    assert "learner-0 waited" in str(stall) and "for learner-1" in str(stall) and stall.names == "learner-1"
    ranks[1].barrier()
    for t in waiters:
        t.join(10)
    assert not any(t.is_alive() for t in waiters)
    assert group.stall() is None


@pytest.mark.slow  # ~30 s on 2 cores (start-up, the limit, the shutdown), as the killed-learner test
def test_a_stopped_learner_is_named_when_the_run_passes_its_limit():
    """learner-1 SIGSTOPped once training runs: learner-0 waits for it at the all-reduce until the
    run's 8 s limit; the error names learner-1 and the wait, the engine kills the stopped
    process itself, and no process or shared-memory segment is left."""
    cfg = TrainConfig(algo="dqn", env="CartPole-v1", buffer="kary-aligned", policy="sharded", actors=1, learners=2,
                      steps=200_000, seed=3, overrides={**TINY, "buffer_capacity": 4096}, timeout_s=8,
                      join_timeout_s=2)
    stopped = []

    def stop_learner_1(env_steps, updates, *_):
        if updates >= 5 and not stopped:
            for child in mp.active_children():
                if child.name == "learner-1":
                    os.kill(child.pid, signal.SIGSTOP)
                    stopped.append(child.pid)

    try:
        with pytest.raises(WorkerFailed) as info:
            train(cfg, stop_learner_1)
    finally:
        for pid in stopped:  # the engine kills it; should it not, do not leave it stopped
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert stopped, "the run ended before learner-1 could be stopped"
    err = info.value
    assert err.worker == "learner-1", str(err)
    assert "passed its 8 s limit" in err.detail or "passed its 8.0 s limit" in err.detail
    assert "learner-0 waited" in err.detail and "for learner-1" in err.detail, err.detail
    assert len(err.pids) == 3 and stopped[0] in err.pids
    assert_exited(err.pids)
    assert own_segments() == []
