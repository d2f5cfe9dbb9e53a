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


@pytest.mark.parametrize("learners", [1, 2])
def test_a_run_that_reaches_its_threshold_ends_with_its_learners_in_step(learners):
    """Issue 56's stop at the threshold in the process engine: the parent sees the training
    episodes' mean reach it and asks the run to finish; the actors stop at an insert boundary
    and the learners at the update count learner 0 fixes (with 2 learners, one may already wait
    in that update's all-reduce: a count fixed lower would leave it there until the all-reduce's
    timeout). Every learner ends with the same weights, the run well before its budget, every
    process gone, no segment left."""
    cfg = TrainConfig(algo="dqn", env="CartPole-v1", buffer="kary-aligned", policy="atomic-deltas", actors=1,
                      learners=learners, steps=50_000, seed=2, overrides=TINY, threshold=18.0, window=20,
                      stop_at_threshold=True, timeout_s=120, join_timeout_s=5)
    t0 = time.monotonic()
    result = train(cfg)
    assert result.steps_to_threshold is not None and result.env_steps < 10_000
    assert result.updates > 0 and len(result.learner_digests) == learners
    assert len(set(result.learner_digests)) == 1
    assert time.monotonic() - t0 < 60  # no learner waited out an all-reduce timeout (60 s)
    assert_exited(result.worker_pids)
    assert own_segments() == []
