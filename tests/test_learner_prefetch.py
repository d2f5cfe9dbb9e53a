"""TrainConfig.learner_prefetch: the process backend's learner draws the next sample while the
update runs (impl.rl.engines.process._SampleSource); off, samples go into one preallocated output."""

import dataclasses

import numpy as np
import pytest
import torch

from replaybench.bench import suites
from replaybench.bench.scenarios import training
from replaybench.impl.rl import ConfigError, train


def _quick(**changes):
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


# ------------------------------------------------------------------ the feed to a learner's device
_FIELDS = {"obs": ((4,), "float32"), "action": ((), "int64"), "reward": ((), "float32"),
           "next_obs": ((4,), "float32"), "done": ((), "bool"), "actor": ((), "int32")}


def _draws(source, n: int) -> tuple[list[dict], list[dict]]:
    """``n`` batches from a _SampleSource, each copied out to numpy at once (the outputs are
    reused), and where each field was handed over ("numpy" or a torch device type)."""
    values, places = [], []
    for u in range(n):
        batch = source.take(0.5, u + 1 < n)
        values.append({k: (v.cpu().numpy() if isinstance(v, torch.Tensor) else np.asarray(v)).copy()
                       for k, v in batch.items()})
        places.append({k: v.device.type if isinstance(v, torch.Tensor) else "numpy" for k, v in batch.items()})
    return values, places


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[
    pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")])])
def test_the_staged_prefetching_source_hands_over_the_same_batches_in_the_same_order(device):
    """The learner's samples through the pinned feed (pinning off on the CPU, where no page can
    be locked for a device) with prefetch, against plain samples into one output, both from the
    learner's seed stream: the same rows in the same order, the learner's fields as tensors on
    the device, the rest host arrays."""
    from replaybench.impl.concurrent import SharedPrioritizedBuffer
    from replaybench.impl.rl.algorithms.base import LEARNER_FIELDS
    from replaybench.impl.rl.common.seeding import RunSeeds
    from replaybench.impl.rl.engines.process import _SampleSource
    from replaybench.impl.storage import random_batch

    cfg = _quick(learner_prefetch=False)
    buf = SharedPrioritizedBuffer.create(512, _FIELDS, variant="kary-aligned", policy="lazy-writing", seed=0)
    attached, sources = [], []
    try:
        rng = np.random.default_rng(3)
        for _ in range(4):
            buf.add(random_batch(_FIELDS, 100, rng, int_high=100))
        for _ in range(2):
            attached.append(SharedPrioritizedBuffer.attach(buf.handle, seed=RunSeeds(cfg.seed).learner(0)))
        plain = _SampleSource(cfg, 0, attached[0], 32)
        sources.append(plain)
        staged = _SampleSource(dataclasses.replace(cfg, learner_prefetch=True), 0, attached[1], 32,
                               torch.device(device), staged=True)
        sources.append(staged)
        assert plain.feed is None and staged.feed is not None and staged.feed.pin == (device == "cuda")
        if device == "cuda":
            assert all(t.is_pinned() for slot in staged.feed.staging for t in slot.values())
        (want, want_at), (got, got_at) = _draws(plain, 12), _draws(staged, 12)
        assert len({w["indices"].tobytes() for w in want}) > 1  # the draws differ from one another
        assert all(set(p.values()) == {"numpy"} for p in want_at)
        for p in got_at:
            assert {k for k, place in p.items() if place != "numpy"} == set(LEARNER_FIELDS)
            assert {p[k] for k in LEARNER_FIELDS} == {device}
        for w, g in zip(want, got):
            assert w.keys() == g.keys()
            for k in w:
                np.testing.assert_array_equal(g[k], w[k], err_msg=k)
    finally:
        for source in sources:
            source.close()
        for a in attached:
            a.close()
        buf.close()


def test_a_feed_refuses_fields_the_batch_lacks():
    from replaybench.impl.rl.common.device_feed import PinnedBatchFeed

    with pytest.raises(ValueError, match=r"fields \['weights'\] are not in the batch"):
        PinnedBatchFeed({"obs": np.zeros((2, 4), np.float32)}, ("obs", "weights"), torch.device("cpu"), 1)
