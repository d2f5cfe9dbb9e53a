"""The process engine's L > 1 learners under faults (impl.rl.engines.process, impl.rl.common.allreduce).

A learner killed outright (SIGKILL: no report, no cleanup) while its peer waits in the gradient
all-reduce: the parent names the dead learner, the peer leaves its wait on the stop flag (no
hang: the run ends in seconds, far within the all-reduce's own timeout), every process exits and
no shared-memory segment is left. The contracts of a healthy run (identical learners, every
actor's rows sampled) are test_rl.py's parallel smoke tests.
"""

from __future__ import annotations

import multiprocessing as mp
import time

import pytest

from replaybench.impl.rl import TrainConfig, WorkerFailed, train

from _support import assert_exited, own_segments

TINY = dict(hidden=(16, 16), batch_size=16, learning_starts=100, buffer_capacity=4096, updates_per_step=0.5)


@pytest.mark.slow  # ~25 s on 2 cores; the default suite's test_rl.py covers a learner that raises
def test_a_killed_learner_ends_the_run_naming_it_and_leaves_nothing():
    cfg = TrainConfig(algo="dqn", env="CartPole-v1", buffer="kary-aligned", policy="sharded", actors=1, learners=2,
                      steps=20_000, seed=3, overrides=TINY, timeout_s=120, join_timeout_s=5)
    killed = []

    def kill_learner_1(env_steps, updates, *_):
        if updates >= 5 and not killed:
            for child in mp.active_children():
                if child.name == "learner-1":
                    child.kill()
                    killed.append(time.monotonic())

    with pytest.raises(WorkerFailed) as info:
        train(cfg, kill_learner_1)
    assert killed, "the run ended before learner-1 could be killed"
    err = info.value
    assert err.worker == "learner-1" and "without reporting" in err.detail
    assert len(err.pids) == 3
    assert_exited(err.pids)
    assert own_segments() == []
    assert time.monotonic() - killed[0] < 30  # the all-reduce's own timeout is 60 s: the stop flag ended the wait
