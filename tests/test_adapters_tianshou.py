"""The Tianshou adapter against tianshou.data.PrioritizedReplayBuffer on the same inputs: the
same priorities after adds, updates and a wrap-around, so the same sampling probabilities
(chi-square on our draws), the same batch-normalised weights, Tianshou's DQN and trainer run
with it unchanged, and bad input gets our errors."""

import numpy as np
import pytest
from scipy import stats

pytest.importorskip("tianshou", reason="the tianshou extra is not installed")

import torch  # noqa: E402
from tianshou.data import Batch  # noqa: E402
from tianshou.data import PrioritizedReplayBuffer as TianshouPrioritized  # noqa: E402

from replaybench.adapters.tianshou import PrioritizedReplayBuffer  # noqa: E402

SIZE = 16


def transition(i, done=False):
    return Batch(obs=np.full(3, i, np.float32), act=i % 2, rew=float(i), terminated=done, truncated=False,
                 obs_next=np.full(3, i + 1, np.float32))


def both(alpha=0.6, beta=0.4, **kw):
    return (PrioritizedReplayBuffer(SIZE, alpha, beta, variant="kary-aligned", **kw),
            TianshouPrioritized(SIZE, alpha, beta, **kw))


def drive(buffers, rng):
    """The same adds (25 of 16 slots: a wrap-around) and TD-error updates on every buffer."""
    for i in range(25):
        for b in buffers:
            b.add(transition(i, done=i % 7 == 6))
        if i % 5 == 4:
            idx = rng.choice(min(i + 1, SIZE), 4, replace=False)
            td = rng.normal(0, 3, 4)                 # signed: both use |td|
            for b in buffers:
                b.update_weight(idx, td)


def their_priorities(rb):
    return np.array([rb.weight[i] for i in range(SIZE)])


def test_same_priorities_probabilities_and_weights_after_updates_and_a_wrap_around():
    ours, theirs = both()
    drive([ours, theirs], np.random.default_rng(0))
    assert len(ours) == len(theirs) == SIZE and ours._insertion_idx == theirs._insertion_idx == 9
    p = their_priorities(theirs)
    assert np.allclose(ours.priorities.tree.leaves()[:SIZE], p, rtol=1e-6)
    assert np.array_equal(ours[np.arange(SIZE)].obs, theirs[np.arange(SIZE)].obs)
    draws = np.concatenate([ours.sample(256)[1] for _ in range(40)])
    counts = np.bincount(draws, minlength=SIZE)
    assert stats.chisquare(counts, counts.sum() * p / p.sum()).pvalue > 1e-3
    idx = np.array([3, 0, 9, 9, 15])
    assert np.allclose(ours[idx].weight, theirs[idx].weight, rtol=1e-6)     # batch-max normalised
    # unnormalised, ours divide by the smallest stored priority (see the adapter's docstring)
    assert np.allclose(ours.get_weight(idx), (p[idx] / p.min()) ** -0.4, rtol=1e-6)


def test_set_beta_new_maximum_and_reset_act_as_tianshou():
    ours, theirs = both(alpha=0.5, beta=0.2)
    drive([ours, theirs], np.random.default_rng(1))
    for b in (ours, theirs):
        b.set_beta(0.9)
        b.update_weight(np.array([2]), np.array([50.0]))   # a new maximum
        b.add(transition(99))                               # gets it
    assert np.allclose(ours.priorities.tree.leaves()[:SIZE], their_priorities(theirs), rtol=1e-6)
    idx = np.arange(SIZE)
    assert np.allclose(ours[idx].weight, theirs[idx].weight, rtol=1e-6)
    ours.reset()
    assert len(ours) == 0 and ours.priorities.tree.total() == 0


def test_bad_input_gets_our_errors_and_changes_nothing():
    with pytest.raises(ValueError, match="alpha must be"):
        PrioritizedReplayBuffer(SIZE, -0.5, 0.4)
    with pytest.raises(ValueError, match="variant 'uniform' keeps no priorities"):
        PrioritizedReplayBuffer(SIZE, 0.6, 0.4, variant="uniform")
    ours, _ = both()
    for i in range(5):
        ours.add(transition(i))
    before = ours.priorities.tree.leaves().copy()
    with pytest.raises(ValueError, match=r"priorities\[1\] = inf is not finite"):
        ours.update_weight(np.array([0, 1]), torch.tensor([1.0, float("inf")]))
    with pytest.raises(IndexError, match=r"indices\[0\] = 7 is out of range: valid indices are 0 .. 4"):
        ours.update_weight(np.array([7]), np.array([1.0]))
    with pytest.raises(ValueError, match="beta must be a number in"):
        ours.set_beta(-1)
    assert np.array_equal(ours.priorities.tree.leaves(), before)


@pytest.mark.slow  # numba compiles Tianshou's n-step kernels per process; seconds of training
def test_tianshou_dqn_and_trainer_run_with_it():
    import gymnasium as gym
    from tianshou.algorithm import DQN
    from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou.data import Collector
    from tianshou.env import DummyVectorEnv
    from tianshou.trainer import OffPolicyTrainerParams
    from tianshou.utils.net.common import Net

    torch.manual_seed(0)
    env = gym.make("CartPole-v1")
    net = Net(state_shape=env.observation_space.shape, action_shape=env.action_space.n, hidden_sizes=[16])
    policy = DiscreteQLearningPolicy(model=net, action_space=env.action_space, eps_training=0.1)
    algorithm = DQN(policy=policy, optim=AdamOptimizerFactory(lr=1e-3), target_update_freq=50)
    buf = PrioritizedReplayBuffer(512, alpha=0.6, beta=0.4)
    collector = Collector(algorithm, DummyVectorEnv([lambda: gym.make("CartPole-v1")]), buf, exploration_noise=True)
    collector.reset()
    collector.collect(n_step=64)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        algorithm.run_training(OffPolicyTrainerParams(
            training_collector=collector, max_epochs=1, epoch_num_steps=256, collection_step_num_env_steps=8,
            batch_size=32, update_step_num_gradient_steps_per_sample=0.25, test_step_num_episodes=0,
            verbose=False, show_progress=False))
    finally:
        torch.set_num_threads(threads)
    assert len(buf) == 64 + 256
    leaves = buf.priorities.tree.leaves()[: len(buf)]
    assert len(np.unique(leaves)) > 20          # |TD error| was written back by the algorithm
