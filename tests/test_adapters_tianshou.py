"""The Tianshou adapters against tianshou.data.PrioritizedReplayBuffer and
PrioritizedVectorReplayBuffer on the same inputs: the same priorities after adds, updates and a
wrap-around (per sub-buffer for the vector one), so the same sampling probabilities (chi-square
on our draws), the same batch-normalised weights, Tianshou's DQN and trainer (and a vector-env
collector) run with them unchanged, and bad input gets our errors."""

import numpy as np
import pytest
from scipy import stats

pytest.importorskip("tianshou", reason="the tianshou extra is not installed")

import torch  # noqa: E402
from tianshou.data import Batch  # noqa: E402
from tianshou.data import PrioritizedReplayBuffer as TianshouPrioritized  # noqa: E402
from tianshou.data import PrioritizedVectorReplayBuffer as TianshouPrioritizedVector  # noqa: E402

from replaybench.adapters.tianshou import PrioritizedReplayBuffer, PrioritizedVectorReplayBuffer  # noqa: E402

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


def their_priorities(rb, size=SIZE):
    return np.array([rb.weight[i] for i in range(size)])


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
    from tianshou.data import ReplayBuffer

    same_batches(ours.gather(idx), ReplayBuffer.__getitem__(theirs, idx))  # our gather: Tianshou's batch
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


# PrioritizedVectorReplayBuffer: 3 sub-buffers of 4 slots against Tianshou's on the same rows

ENVS, SUB = 3, 4


def rows(t, ids):
    n = len(ids)
    return Batch(obs=np.array([[t, j, 0] for j in ids], np.float32), act=np.zeros(n, int), rew=np.full(n, float(t)),
                 terminated=np.array([t % 5 == 4] * n), truncated=np.zeros(n, bool),
                 obs_next=np.array([[t + 1, j, 0] for j in ids], np.float32))


@pytest.fixture
def no_prev_next_warm_up(monkeypatch):
    """Tianshou's manager compiles its numba prev/next kernels in its constructor (seconds of
    CPU per process); the parity tests never call prev/next, so skip that warm-up."""
    from tianshou.data import ReplayBufferManager

    monkeypatch.setattr(ReplayBufferManager, "_compile", lambda self: None)


def both_vector(alpha=0.6, beta=0.4):
    return (PrioritizedVectorReplayBuffer(ENVS * SUB, ENVS, alpha, beta, variant="kary-aligned"),
            TianshouPrioritizedVector(ENVS * SUB, ENVS, alpha=alpha, beta=beta))


def drive_vector(buffers, rng):
    """Uneven rows per environment (env 0 every step: it wraps twice; env 2 from step 4 on) and
    TD-error updates on written slots; returns the slots the adds wrote (the same in both)."""
    written = []
    for t in range(10):
        ids = [0] + ([1] if t % 2 else []) + ([2] if t >= 4 else [])
        slots = [b.add(rows(t, ids), buffer_ids=ids)[0] for b in buffers]
        assert all(np.array_equal(slots[0], s) for s in slots)
        written.append(slots[0])
        if t % 3 == 2:
            idx = rng.choice(np.unique(np.concatenate(written)), 3, replace=False)
            td = rng.normal(0, 3, 3)
            for b in buffers:
                b.update_weight(idx, td)
    return written


def test_vector_same_slots_priorities_probabilities_and_weights_with_a_wrap_around_per_sub_buffer(no_prev_next_warm_up):
    ours, theirs = both_vector()
    written = drive_vector([ours, theirs], np.random.default_rng(0))
    env0 = [int(s[0]) for s in written]
    assert env0 == [0, 1, 2, 3] * 2 + [0, 1]                       # sub-buffer 0 wrapped inside its slots
    assert list(ours._lengths) == list(theirs._lengths) == [4, 4, 4] and len(ours) == 12
    p = their_priorities(theirs, ENVS * SUB)
    assert np.allclose(ours.priorities.tree.leaves()[: ENVS * SUB], p, rtol=1e-6)
    draws = np.concatenate([ours.sample(256)[1] for _ in range(40)])   # over all sub-buffers at once
    counts = np.bincount(draws, minlength=ENVS * SUB)
    assert stats.chisquare(counts, counts.sum() * p / p.sum()).pvalue > 1e-3
    idx = np.array([3, 0, 9, 9, 11, 5])
    assert np.array_equal(ours[idx].obs, theirs[idx].obs)
    assert np.allclose(ours[idx].weight, theirs[idx].weight, rtol=1e-6)
    ours.update_weight(idx[:2], np.array([-40.0, 0.0]))                # a new maximum and a near-zero
    theirs.update_weight(idx[:2], np.array([-40.0, 0.0]))
    assert np.allclose(ours.priorities.tree.leaves()[: ENVS * SUB], their_priorities(theirs, ENVS * SUB), rtol=1e-6)
    for b in (ours, theirs):
        b.add(rows(10, [1]), buffer_ids=[1])                              # gets the new maximum
    assert np.allclose(ours.priorities.tree.leaves()[: ENVS * SUB], their_priorities(theirs, ENVS * SUB), rtol=1e-6)
    assert np.allclose(ours[idx].weight, theirs[idx].weight, rtol=1e-6)


def test_vector_set_beta_changes_the_weights(no_prev_next_warm_up):
    ours, theirs = both_vector()
    drive_vector([ours, theirs], np.random.default_rng(1))
    idx = np.arange(ENVS * SUB)
    ours.set_beta(0.9)
    p = their_priorities(theirs, ENVS * SUB)
    assert np.allclose(ours[idx].weight, p ** -0.9 / np.max(p ** -0.9), rtol=1e-6)
    ours.reset()
    assert len(ours) == 0 and ours.priorities.tree.total() == 0


def test_vector_bad_input_gets_our_errors_and_changes_nothing(no_prev_next_warm_up):
    for kw, msg in (({"total_size": 0}, "total_size must be a positive integer, got 0"),
                    ({"buffer_num": 2.5}, "buffer_num must be a positive integer, got 2.5")):
        with pytest.raises(ValueError, match=msg):
            PrioritizedVectorReplayBuffer(**{"total_size": 8, "buffer_num": 2, "alpha": 0.6, "beta": 0.4, **kw})
    with pytest.raises(ValueError, match="alpha must be"):
        PrioritizedVectorReplayBuffer(8, 2, -1.0, 0.4)
    ours, _ = both_vector()
    ours.add(rows(0, [0, 2]), buffer_ids=[0, 2])
    state = ours.priorities.tree.leaves().copy(), ours._lengths.copy(), ours.last_index.copy()
    for ids, err, msg in (([0, 3], ValueError, r"buffer_ids\[1\] = 3 is out of range: sub-buffers are 0 .. 2"),
                          ([-1, 0], ValueError, r"buffer_ids\[0\] = -1 is out of range"),
                          ([0], ValueError, "buffer_ids has 1 ids for a batch of 2 rows"),
                          (None, ValueError, "batch has 2 rows but buffer_ids is None"),
                          ([[0, 1]], ValueError, "buffer_ids must be a 1-D sequence of integers")):
        with pytest.raises(err, match=msg):
            ours.add(rows(1, [0, 1]), buffer_ids=ids)
    with pytest.raises(IndexError, match=r"indices\[1\] = 4 is not written yet: sub-buffer 1 has written nothing"):
        ours.update_weight(np.array([0, 4]), np.array([1.0, 1.0]))
    with pytest.raises(IndexError, match=r"indices\[0\] = 12 is out of range: slots are 0 .. 11"):
        ours.update_weight(np.array([12]), np.array([1.0]))
    with pytest.raises(ValueError, match=r"priorities\[0\] = nan is not finite"):
        ours.update_weight(np.array([8]), np.array([np.nan]))
    after = ours.priorities.tree.leaves(), ours._lengths, ours.last_index
    assert all(np.array_equal(a, b) for a, b in zip(state, after))


@pytest.mark.slow  # numba compiles Tianshou's n-step kernels per process; seconds of training
def test_tianshou_dqn_with_a_vector_env_collector_runs_with_the_vector_buffer():
    import gymnasium as gym
    from tianshou.algorithm import DQN
    from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou.data import Collector
    from tianshou.env import DummyVectorEnv
    from tianshou.utils.net.common import Net
    from tianshou.utils.torch_utils import policy_within_training_step

    torch.manual_seed(0)
    envs = DummyVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(ENVS)])
    envs.seed(0)
    space = envs.observation_space[0], envs.action_space[0]
    policy = DiscreteQLearningPolicy(model=Net(state_shape=space[0].shape, action_shape=space[1].n, hidden_sizes=[16]),
                                     action_space=space[1], eps_training=0.1)
    algorithm = DQN(policy=policy, optim=AdamOptimizerFactory(lr=1e-3), target_update_freq=20)
    buf = PrioritizedVectorReplayBuffer(300, ENVS, alpha=0.6, beta=0.4)
    collector = Collector(algorithm, envs, buf, exploration_noise=True)
    collector.reset()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with policy_within_training_step(policy):
            for _ in range(40):                                    # 40 x 9 env steps: sub-buffers wrap
                collector.collect(n_step=3 * ENVS)
                algorithm.update(buffer=buf, sample_size=32)
    finally:
        torch.set_num_threads(threads)
    assert buf.maxsize == 300 and len(buf) == 300 and list(buf._lengths) == [100] * ENVS
    assert len(np.unique(buf.priorities.tree.leaves())) > 20     # |TD error| written back by the algorithm


def test_string_and_complex_td_errors_are_named_and_change_nothing(no_prev_next_warm_up):
    single, vector = both()[0], both_vector()[0]
    for i in range(3):
        single.add(transition(i))
    vector.add(rows(0, [0]), buffer_ids=[0])
    for ours in (single, vector):
        before = ours.priorities.tree.leaves().copy()
        for bad, shown in ((np.array(["1.0"]), r"new_weight\[0\] = '1\.0'"),
                           (np.array([3 + 4j]), r"new_weight\[0\] = \(3\+4j\)"),
                           (torch.tensor([1j]), r"new_weight\[0\] = 1j")):
            with pytest.raises(TypeError, match=rf"new_weight must be numbers, got dtype \S+: {shown} is not a real"):
                ours.update_weight(np.array([0]), bad)
        assert np.array_equal(ours.priorities.tree.leaves(), before)


def test_an_empty_buffer_an_empty_batch_and_all_zero_priorities_are_named():
    ours = PrioritizedReplayBuffer(SIZE, 0.6, 0.4, eps=0.0)
    with pytest.raises(ValueError, match=r"cannot sample batch_size=4 from an empty buffer"):
        ours.sample(4)
    with pytest.raises(IndexError, match="cannot index an empty buffer"):
        ours.sample(0)                                     # Tianshou's "every stored transition": none
    for i in range(3):
        ours.add(transition(i))
    batch = ours[np.array([], dtype=np.int64)]             # an empty sample: no maximum to normalise by
    assert len(batch) == 0 and batch.weight.shape == (0,)
    ours.update_weight(np.arange(3), np.zeros(3))          # zero TD errors with eps=0: every priority 0
    with pytest.raises(ValueError, match=r"all 3 stored priorities are 0 \(eps=0\.0") as err:
        ours.sample(4)
    assert "empty" not in str(err.value)


def test_weight_alpha_and_beta_read_as_tianshous():
    ours, theirs = both(alpha=0.5, beta=0.3)
    drive([ours, theirs], np.random.default_rng(2))
    assert len(ours.weight) == len(theirs.weight) == SIZE
    assert np.allclose([ours.weight[i] for i in range(SIZE)], their_priorities(theirs), rtol=1e-6)
    idx = np.array([[3, 0], [9, 15]])                   # an index array keeps its shape, as NumPy's
    assert ours.weight[idx].shape == theirs.weight[idx].shape == (2, 2)
    assert np.allclose(ours.weight[idx], theirs.weight[idx], rtol=1e-6)
    for args in ((), (2, 9), (0, -1), (5,), (3, 3)):
        assert ours.weight.reduce(*args) == pytest.approx(theirs.weight.reduce(*args), rel=1e-6, abs=1e-12)
    assert (ours._alpha, ours._beta) == (theirs._alpha, theirs._beta) == (0.5, 0.3)
    for b in (ours, theirs):
        b.set_beta(0.7)
    assert ours._beta == theirs._beta == 0.7
    ours._beta = 0.9                                     # Tianshou's set_beta writes it; ours checks it
    assert ours._beta == 0.9 and np.allclose(ours.get_weight(np.arange(3)), ours.priorities.weights(np.arange(3), 0.9))
    with pytest.raises(ValueError, match="beta must be a number in"):
        ours._beta = 2.0
    with pytest.raises(TypeError, match="read-only view .* update_weight"):
        ours.weight[0] = 1.0
    with pytest.raises(AttributeError):
        ours._alpha = 0.1


def test_vector_weight_covers_every_sub_buffer(no_prev_next_warm_up):
    ours, theirs = both_vector()
    drive_vector([ours, theirs], np.random.default_rng(3))
    assert len(ours.weight) == len(theirs.weight) == ENVS * SUB
    assert ours.weight.reduce() == pytest.approx(theirs.weight.reduce(), rel=1e-6)
    assert np.allclose(ours.weight[np.arange(ENVS * SUB)], theirs.weight[np.arange(ENVS * SUB)], rtol=1e-6)


# The vector buffer writes a Collector's rows and gathers the sampled batch itself: the same
# storage, bookkeeping and batches as Tianshou's manager on the same rows.

def collector_rows(t, ids, rng):
    """A Collector's batch for environments ``ids`` at step ``t``: episodes of uneven length,
    ``info`` with the env ids, an empty ``policy``; a key Tianshou does not store (``dist``)."""
    n = len(ids)
    ended = rng.random(n) < 0.3
    return Batch(obs=rng.normal(size=(n, 4)).astype(np.float32), act=rng.integers(0, 2, n), policy=Batch(),
                 obs_next=rng.normal(size=(n, 4)).astype(np.float32), rew=rng.random(n),
                 terminated=ended & (rng.random(n) < 0.5), truncated=ended & (rng.random(n) >= 0.5),
                 done=np.zeros(n, bool), info=Batch(env_id=np.asarray(ids)), dist=np.zeros(n))


def same_batches(a, b, ordered=True):
    keys = (list if ordered else sorted)(a.get_keys())
    assert keys == (list if ordered else sorted)(b.get_keys())
    for key in keys:
        if isinstance(a[key], Batch):
            same_batches(a[key], b[key], ordered)
        else:
            assert a[key].dtype == b[key].dtype and np.array_equal(a[key], b[key]), key


def test_vector_add_and_gather_own_the_storage_with_tianshous_result(no_prev_next_warm_up, monkeypatch):
    from tianshou.data import ReplayBuffer, ReplayBufferManager

    ours, theirs = both_vector()
    managed = []
    real_add = ReplayBufferManager.add
    monkeypatch.setattr(ReplayBufferManager, "add",
                        lambda self, *a, **k: managed.append(self) or real_add(self, *a, **k))
    rng = np.random.default_rng(0)
    for t in range(30):                                     # every sub-buffer wraps several times
        ids = rng.permutation(ENVS)[: rng.integers(1, ENVS + 1)]
        batch = collector_rows(t, ids, rng)
        got, want = ours.add(batch, buffer_ids=ids), theirs.add(batch, buffer_ids=ids)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and np.array_equal(g, w)
        assert list(ours._lengths) == list(theirs._lengths) and np.array_equal(ours.last_index, theirs.last_index)
        assert np.array_equal(ours.unfinished_index(), theirs.unfinished_index())
    assert managed.count(ours) == 1                         # only the first add (it allocates the storage)
    same_batches(ours._meta, theirs._meta)
    for mine, its in zip(ours.buffers, theirs.buffers):
        for field in ("_insertion_idx", "_size", "_ep_len", "_ep_start_idx", "_ep_return", "last_index"):
            assert np.array_equal(getattr(mine, field), getattr(its, field)), field
        assert np.array_equal(mine.unfinished_index(), its.unfinished_index())
    idx = np.arange(ENVS * SUB)
    assert np.array_equal(ours.next(idx), theirs.next(idx)) and np.array_equal(ours.prev(idx), theirs.prev(idx))
    batch, drawn = ours.sample(32)
    same_batches(Batch({k: v for k, v in batch.items() if k != "weight"}), ReplayBuffer.__getitem__(theirs, drawn))
    same_batches(ours[drawn], theirs[drawn])                # with the weights (Tianshou's float64 values)


def test_vector_add_takes_tianshous_path_for_a_new_key_repeated_ids_and_ignore_obs_next(no_prev_next_warm_up):
    rng = np.random.default_rng(1)
    ours, theirs = both_vector()
    for t, ids in enumerate(([0, 1, 2], [1, 1, 0], [2], [0, 2, 2, 2, 2, 1])):   # repeated ids: rows in order
        batch = collector_rows(t, ids, rng)
        if t == 2:
            batch.info.lives = np.array([3])                # a key appears: Tianshou allocates it
        for g, w in zip(ours.add(batch, buffer_ids=ids), theirs.add(batch, buffer_ids=ids)):
            assert np.array_equal(g, w)
    same_batches(ours._meta, theirs._meta)
    skipping = PrioritizedVectorReplayBuffer(6, 2, 0.6, 0.4, ignore_obs_next=True)
    for t in range(4):
        skipping.add(collector_rows(t, [0, 1], rng), buffer_ids=[0, 1])
    assert "obs_next" not in skipping._meta.get_keys() and len(skipping) == 6
    assert np.array_equal(skipping[np.array([1])].obs_next, skipping._meta.obs[skipping.next(np.array([1]))])
    ours, theirs = both_vector()
    for t in range(2):
        objects = collector_rows(t, [0, 1], rng)
        objects.__dict__["rew"] = objects.rew.astype(object)    # numbers in an object array: Tianshou's path
        for g, w in zip(ours.add(objects, buffer_ids=[0, 1]), theirs.add(objects, buffer_ids=[0, 1])):
            assert np.array_equal(g, w)
    same_batches(ours._meta, theirs._meta)
    with pytest.raises(ValueError, match=r"batch.rew has shape \(2, 2\)"):
        PrioritizedVectorReplayBuffer(6, 2, 0.6, 0.4).add(Batch(collector_rows(0, [0, 1], rng), rew=np.ones((2, 2))))


@pytest.mark.parametrize("how", ["pickle", "hdf5"])
def test_vector_pickle_and_hdf5_keep_the_sub_buffers_on_the_managers_bookkeeping(no_prev_next_warm_up, how, tmp_path):
    import pickle

    ours, theirs = both_vector()
    rng = np.random.default_rng(2)
    for t in range(5):
        batch = collector_rows(t, [0, 1, 2], rng)
        ours.add(batch)
        theirs.add(batch)
    if how == "pickle":
        copy = pickle.loads(pickle.dumps(ours))
    else:  # Tianshou's HDF5 pickles each sub-buffer on its own
        ours.save_hdf5(str(tmp_path / "buffer.h5"))
        copy = PrioritizedVectorReplayBuffer.load_hdf5(str(tmp_path / "buffer.h5"))
    assert all(buf._sub_state is copy._sub_state for buf in copy.buffers)
    assert all(np.shares_memory(buf._meta.obs, copy._meta.obs) for buf in copy.buffers)
    for t in range(5, 9):                                   # the copy goes on as the original would
        batch = collector_rows(t, [2, 0], rng)
        for g, w in zip(copy.add(batch, buffer_ids=[2, 0]), theirs.add(batch, buffer_ids=[2, 0])):
            assert np.array_equal(g, w)
    same_batches(copy._meta, theirs._meta, ordered=False)     # HDF5 stores the keys sorted
    assert [b._insertion_idx for b in copy.buffers] == [b._insertion_idx for b in theirs.buffers]


@pytest.mark.slow  # numba compiles Tianshou's n-step kernels per process
def test_vector_collector_and_dqn_n_step_targets_see_what_tianshous_buffer_holds():
    import gymnasium as gym
    from tianshou.algorithm import DQN
    from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou.data import Collector
    from tianshou.env import DummyVectorEnv
    from tianshou.utils.net.common import Net
    from tianshou.utils.torch_utils import policy_within_training_step

    torch.manual_seed(0)
    probe = gym.make("CartPole-v1")
    policy = DiscreteQLearningPolicy(model=Net(state_shape=(4,), action_shape=2, hidden_sizes=[16]),
                                     action_space=probe.action_space, eps_training=0.3)
    algorithm = DQN(policy=policy, optim=AdamOptimizerFactory(lr=1e-3), n_step_return_horizon=3, target_update_freq=5)
    buffers, stats = [], []
    for buf in (PrioritizedVectorReplayBuffer(60, ENVS, 0.6, 0.4),
                TianshouPrioritizedVector(60, ENVS, alpha=0.6, beta=0.4)):
        envs = DummyVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(ENVS)])
        envs.seed(0)
        np.random.seed(0)                                   # the exploration's draws
        collector = Collector(algorithm, envs, buf, exploration_noise=True)
        collector.reset()
        with policy_within_training_step(policy):
            stats.append(collector.collect(n_step=150))     # 20 slots per env: each wraps
        buffers.append(buf)
    ours, theirs = buffers
    assert list(stats[0].returns) == list(stats[1].returns) and len(stats[0].returns) > 3
    same_batches(ours._meta, theirs._meta)
    assert np.array_equal(ours.unfinished_index(), theirs.unfinished_index())
    idx = np.arange(60)
    targets = [algorithm.compute_nstep_return(b[idx], b, idx, algorithm._target_q, gamma=0.9, n_step=3).returns
               for b in buffers]
    assert torch.equal(targets[0], targets[1])
    with policy_within_training_step(policy):
        for _ in range(3):
            algorithm.update(buffer=ours, sample_size=16)
    assert len(np.unique(ours.priorities.tree.leaves()[:60])) > 10  # |TD error| written back


def test_vector_length_after_full_reset_and_refill_is_tianshous(no_prev_next_warm_up):
    rng = np.random.default_rng(3)
    ours, theirs = both_vector()
    for t in range(SUB + 1):                                # every sub-buffer full, then wrapped
        batch = collector_rows(t, [0, 1, 2], rng)
        ours.add(batch)
        theirs.add(batch)
        assert len(ours) == len(theirs)
    for b in (ours, theirs):
        b.reset()
        b.add(collector_rows(9, [1], rng), buffer_ids=[1])
    assert len(ours) == len(theirs) == 1 and list(ours._lengths) == list(theirs._lengths)


@pytest.mark.parametrize("make", [lambda td: torch.tensor(td, dtype=torch.float32, requires_grad=True) * 1,  # DQN's
                                  lambda td: torch.tensor(td).reshape(-1, 1),          # a column, float64
                                  lambda td: torch.tensor(td, dtype=torch.bfloat16),   # numpy() refuses it
                                  lambda td: td.astype(np.float32), lambda td: list(td)])
def test_vector_update_weight_with_tensors_and_arrays_is_the_general_path(no_prev_next_warm_up, make):
    """update_weight's one-call path (the magnitudes in the compiled update) stores what the
    general path (``real_array``, ``np.abs`` to float64, ``PriorityIndex.update``) stores, bit
    for bit, while sub-buffers fill and once all are full; and what Tianshou's buffer stores."""
    ours, general = (PrioritizedVectorReplayBuffer(ENVS * SUB, ENVS, 0.6, 0.4, variant="kary-aligned")
                     for _ in range(2))
    theirs = TianshouPrioritizedVector(ENVS * SUB, ENVS, alpha=0.6, beta=0.4)
    rng = np.random.default_rng(5)
    written = set()
    for t in range(2 * SUB):
        for b in (ours, general, theirs):
            slots = b.add(rows(t, list(range(ENVS))), buffer_ids=list(range(ENVS)))[0]
        written |= set(slots.tolist())
        idx = rng.choice(sorted(written), 3, replace=False)
        td = rng.normal(0, 3, 3)
        given = make(td)
        ours.update_weight(idx, given)
        seen = given.detach().double().numpy() if isinstance(given, torch.Tensor) else given  # widened: exact
        magnitudes = np.abs(np.asarray(seen, dtype=np.float64).reshape(-1))
        general.priorities.update(idx, magnitudes, n_valid=general.maxsize)
        theirs.update_weight(idx, magnitudes)      # Tianshou's takes neither a column nor bfloat16
        assert np.array_equal(ours.priorities.tree.leaves(), general.priorities.tree.leaves())
        assert ours.priorities.max_priority == general.priorities.max_priority
    assert ours._full
    assert np.allclose(ours.priorities.tree.leaves()[: ENVS * SUB], their_priorities(theirs, ENVS * SUB), rtol=1e-6)


def test_td_array_views_cpu_tensors_and_names_bad_entries():
    from replaybench.adapters.tianshou import td_array

    td = torch.tensor([1.0, -2.0], requires_grad=True) * 1
    out = td_array(td)
    assert out.dtype == np.float32 and np.shares_memory(out, td.detach().numpy())   # no copy
    assert td_array(np.ones((3, 1))).shape == (3,) and td_array(2.5).tolist() == [2.5]
    for bad, shown in ((torch.tensor([1 + 2j]), r"new_weight\[0\] = \(1\+2j\)"), (["x"], r"new_weight\[0\] = 'x'")):
        with pytest.raises(TypeError, match=shown):
            td_array(bad)


def test_vector_add_marks_new_slots_in_its_compiled_call_as_init_weight_does(no_prev_next_warm_up, monkeypatch):
    """The fast add sets the new slots' priorities in the same compiled call that moves the
    sub-buffers on: the same tree as init_weight's (a subclass that overrides init_weight,
    which is then called as it is) and as Tianshou's, with no mark_new call of its own."""
    from replaybench.adapters._core import PriorityIndex

    class Overriding(PrioritizedVectorReplayBuffer):
        calls = 0

        def init_weight(self, index):
            Overriding.calls += 1
            super().init_weight(index)

    fused, overriding = (cls(ENVS * SUB, ENVS, 0.6, 0.4, variant="kary-aligned")
                         for cls in (PrioritizedVectorReplayBuffer, Overriding))
    theirs = TianshouPrioritizedVector(ENVS * SUB, ENVS, alpha=0.6, beta=0.4)
    marks = []
    original = PriorityIndex.mark_new
    monkeypatch.setattr(PriorityIndex, "mark_new", lambda self, slots: (marks.append(self), original(self, slots)))
    drive_vector([fused, overriding, theirs], np.random.default_rng(1))
    assert marks.count(fused.priorities) == 1                 # the first add only: Tianshou's path
    assert Overriding.calls == 10 and marks.count(overriding.priorities) == 10
    assert np.array_equal(fused.priorities.tree.leaves(), overriding.priorities.tree.leaves())
    assert fused.priorities.max_priority == overriding.priorities.max_priority
    assert np.allclose(fused.priorities.tree.leaves()[: ENVS * SUB], their_priorities(theirs, ENVS * SUB), rtol=1e-6)


def test_vector_compiled_written_check_finds_what_the_numpy_check_names(no_prev_next_warm_up):
    """While sub-buffers fill, update_weight checks the slots in one compiled pass
    (_first_unwritten) and names a bad one with the NumPy check: both find a bad slot in the
    same batches (slots outside the storage, slots not yet written), and the compiled pass
    finds the first one."""
    from replaybench.adapters.tianshou import _first_unwritten

    ours = PrioritizedVectorReplayBuffer(ENVS * SUB, ENVS, 0.6, 0.4, variant="kary-aligned")
    for t in range(3):                                   # lengths 3, 2, 1: each sub-buffer partly written
        ids = [0, 1, 2][: 3 - t]
        ours.add(rows(t, ids), buffer_ids=ids)
    assert list(ours._lengths) == [3, 2, 1]
    rng = np.random.default_rng(2)
    found = set()
    for _ in range(300):
        idx = rng.integers(-2, ENVS * SUB + 2, 4)
        first = _first_unwritten(idx, ours._sub_size, ours._lengths)
        try:
            ours._check_written(idx)
            named = -1
        except IndexError as err:
            named = int(str(err).split("]")[0].split("[")[1])
        assert (first >= 0) == (named >= 0)
        if first >= 0:
            with pytest.raises(IndexError):
                ours._check_written(idx[first: first + 1])   # the one it found is bad on its own
        found.add(first)
    assert -1 in found and len(found) > 2


def filled_unevenly(rng):
    """Ours and Tianshou's vector buffer after the same uneven adds: sub-buffer 0 wraps, 1 is
    partly written, 2 holds nothing (its length 0 is a case of Tianshou's kernels)."""
    ours, theirs = both_vector()
    for t in range(7):
        ids = [0] + ([1] if t % 3 == 0 else [])
        batch = collector_rows(t, ids, rng)
        ours.add(batch, buffer_ids=ids)
        theirs.add(batch, buffer_ids=ids)
    assert list(ours._lengths) == [4, 3, 0]
    return ours, theirs


def test_vector_compiled_next_prev_and_unfinished_index_are_tianshous(no_prev_next_warm_up):
    from tianshou.data import ReplayBufferManager

    rng = np.random.default_rng(5)
    ours, theirs = filled_unevenly(rng)
    # every slot, slots beyond the storage and negative ones (both kernels take them modulo it)
    idx = np.concatenate([np.arange(ENVS * SUB), [12, 13, 17, 25, -1, -5, -12, -13]]).astype(np.int64)
    for _ in range(3):
        for method in ("next", "prev"):
            got = getattr(ours, method)(idx)
            assert got.dtype == np.int64
            assert np.array_equal(got, getattr(theirs, method)(idx)), method
            # Tianshou's own kernel on our storage
            assert np.array_equal(got, getattr(ReplayBufferManager, method)(ours, idx)), method
        assert np.array_equal(ours.unfinished_index(), theirs.unfinished_index())
        assert np.array_equal(ours.unfinished_index(), ReplayBufferManager.unfinished_index(ours))
        ours._meta.done[:] = theirs._meta.done[:] = rng.random(ENVS * SUB) < 0.5   # other episode ends
    for other in ([1, 2, 5], np.array([1, 2, 5], np.int32), 6):   # Tianshou's path, its results
        for method in ("next", "prev"):
            assert np.array_equal(getattr(ours, method)(other), getattr(theirs, method)(other)), (method, other)
    assert ours.next(np.empty(0, np.int64)).shape == (0,)


def test_vector_indexing_by_an_array_is_the_general_paths_result(no_prev_next_warm_up, monkeypatch):
    ours, theirs = filled_unevenly(np.random.default_rng(6))
    for b in (ours, theirs):
        b.update_weight(np.array([0, 5, 6]), np.array([3.0, -0.5, 1e-3]))
    idx = np.array([5, 0, 4, 1, 1, 2], np.int64)      # not slot 6, the least priority: the maximum weight is below 1
    got = ours[idx]
    want = ours.gather(idx)
    weight = ours.get_weight(idx)
    want.weight = weight / np.max(weight)
    same_batches(got, want)                                   # bit for bit, weights included
    assert got.weight.max() == 1.0 and weight.max() < 1.0
    its = theirs[idx]
    same_batches(Batch({k: v for k, v in got.items() if k != "weight"}),
                 Batch({k: v for k, v in its.items() if k != "weight"}))
    assert np.allclose(got.weight, its.weight, rtol=1e-6)     # Tianshou's (normalised) weights
    assert np.array_equal(ours[idx.astype(np.uint32)].weight, got.weight)
    unnormalised = PrioritizedVectorReplayBuffer(ENVS * SUB, ENVS, 0.6, 0.4, weight_norm=False)
    unnormalised.add(collector_rows(0, [0, 1, 2], np.random.default_rng(0)))
    unnormalised.update_weight(np.array([0, 4]), np.array([2.0, 0.1]))
    slots = np.array([4, 0, 8])
    assert np.array_equal(unnormalised[slots].weight, unnormalised.get_weight(slots))
    with pytest.raises(IndexError, match=r"indices\[1\] = -2 is out of range"):
        ours[np.array([0, -2])]
    with pytest.raises(IndexError):
        ours[np.array([0, ENVS * SUB])]

    class OwnWeights(PrioritizedVectorReplayBuffer):     # a subclass's get_weight is still called
        def get_weight(self, index):
            return np.full(np.shape(index), 7.0)

    sub = OwnWeights(ENVS * SUB, ENVS, 0.6, 0.4)
    sub.add(collector_rows(0, [0, 1, 2], np.random.default_rng(0)))
    assert np.array_equal(sub[np.array([0, 4])].weight, [1.0, 1.0])
