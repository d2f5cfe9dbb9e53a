"""TrainConfig.learner_prefetch: the process backend's learner draws the next sample while the
update runs (impl.rl.engines.process._SampleSource); off, samples go into one preallocated output."""

import pytest

from replaybench.bench import suites
from replaybench.bench.scenarios import training
from replaybench.impl.rl import ConfigError, train


def _quick(**changes):
    import dataclasses

    cfg = [c for c in training.suite_configs(suites.load("training-quick")) if not c.sequential][0]
    return dataclasses.replace(cfg, **changes)


def test_learner_prefetch_is_checked():
    with pytest.raises(ConfigError, match="learner_prefetch must be True or False, got 'yes'"):
        _quick(learner_prefetch="yes").validate()


@pytest.mark.parametrize("prefetch", [False, True])
def test_a_run_with_and_without_prefetch_does_every_update(prefetch):
    cfg = _quick(learner_prefetch=prefetch)
    acfg = cfg.validate()
    result = train(cfg)
    assert result.updates == int((cfg.steps - acfg.learning_starts) * acfg.updates_per_step)
    assert result.profiles["learner"]["replay"] > 0 and result.sample_calls >= result.updates
    assert sum(result.actor_ids_sampled.values()) == result.updates * acfg.batch_size
