"""The Stable-Baselines3 adapter against SB3's own ReplayBuffer (SB3 has no prioritized buffer:
its pull requests #1622 and #2221 were not merged), and against the definition of prioritized
sampling: same stored transitions (with n_envs > 1 and across a wrap-around), P(i) = p_i /
sum p (chi-square), weights (p_i / p_min) ** -beta, DQN runs, save/load, clear errors."""

import numpy as np
import pytest
from scipy import stats

pytest.importorskip("stable_baselines3", reason="the sb3 extra is not installed")

import torch as th  # noqa: E402
from gymnasium import spaces  # noqa: E402
from stable_baselines3 import DQN  # noqa: E402
from stable_baselines3.common.buffers import ReplayBuffer  # noqa: E402
from stable_baselines3.common.env_util import make_vec_env  # noqa: E402

from replaybench.adapters.sb3 import PrioritizedDQN, PrioritizedReplayBuffer  # noqa: E402

OBS = spaces.Box(-1.0, 1.0, (3,), np.float32)
ACT = spaces.Discrete(4)


def fill(buffers, steps, n_envs, rng):
    """Add the same ``steps`` vector-env steps to every buffer."""
    for t in range(steps):
        obs = rng.random((n_envs, 3), dtype=np.float32)
        nxt = rng.random((n_envs, 3), dtype=np.float32)
        act = rng.integers(0, 4, (n_envs,))
        rew = rng.random(n_envs)
        done = rng.random(n_envs) < 0.3
        infos = [{"TimeLimit.truncated": bool(d and t % 2)} for d in done]
        for b in buffers:
            b.add(obs, nxt, act, rew, done, infos)


def test_stores_what_sb3_stores_with_vector_envs_across_a_wrap_around():
    n_envs, size = 3, 15                      # 5 rows of 3 environments
    ours = PrioritizedReplayBuffer(size, OBS, ACT, "cpu", n_envs=n_envs, variant="binary", seed=0)
    theirs = ReplayBuffer(size, OBS, ACT, "cpu", n_envs=n_envs)
    fill([ours, theirs], 12, n_envs, np.random.default_rng(1))   # wraps round twice
    assert (ours.pos, ours.full, ours.size()) == (theirs.pos, theirs.full, theirs.size()) == (2, True, 5)
    rows = np.repeat(np.arange(5), n_envs)
    envs = np.tile(np.arange(n_envs), 5)
    slots = rows * n_envs + envs
    got = ours._tensors(ours.store.storage.gather(slots), None)
    want = (theirs.observations[rows, envs], theirs.actions[rows, envs], theirs.next_observations[rows, envs],
            (theirs.dones * (1 - theirs.timeouts))[rows, envs].reshape(-1, 1),
            theirs.rewards[rows, envs].reshape(-1, 1))
    for g, w in zip(got, want):
        assert np.array_equal(g.numpy(), w)


def test_sampling_probabilities_weights_and_updates():
    ours = PrioritizedReplayBuffer(8, OBS, ACT, "cpu", n_envs=2, variant="kary-aligned", alpha=0.7, beta=0.5,
                                   eps=0.0, seed=3)
    fill([ours], 4, 2, np.random.default_rng(0))
    raw = np.array([1.0, 2.0, 4.0, 8.0, 0.5, 3.0, 6.0, 1.5])
    ours.update_priorities(np.arange(8), th.tensor(raw))   # a tensor, as PrioritizedDQN passes
    p = raw ** 0.7
    draws = np.concatenate([ours.sample(512).indices for _ in range(40)])
    counts = np.bincount(draws, minlength=8)
    assert stats.chisquare(counts, counts.sum() * p / p.sum()).pvalue > 1e-3
    sample = ours.sample(64)
    assert sample.weights.shape == (64, 1) and sample.weights.dtype == th.float32
    assert np.allclose(sample.weights.numpy().ravel(), (p[sample.indices] / p.min()) ** -0.5, rtol=1e-5)
    # an update moves the mass: slot 4 becomes the most likely one, the others keep theirs
    ours.update_priorities([4], [100.0])
    p[4] = 100.0 ** 0.7
    counts = np.bincount(np.concatenate([ours.sample(512).indices for _ in range(40)]), minlength=8)
    assert stats.chisquare(counts, counts.sum() * p / p.sum()).pvalue > 1e-3


def test_bad_input_gets_our_errors_and_changes_nothing():
    with pytest.raises(ValueError, match="optimize_memory_usage"):
        PrioritizedReplayBuffer(8, OBS, ACT, optimize_memory_usage=True, handle_timeout_termination=False)
    with pytest.raises(ValueError, match="beta must be a number in"):
        PrioritizedReplayBuffer(8, OBS, ACT, beta=2.0)
    with pytest.raises(KeyError, match="unknown variant 'nope'"):
        PrioritizedReplayBuffer(8, OBS, ACT, variant="nope")
    with pytest.raises(ValueError, match="Dict spaces"):
        PrioritizedReplayBuffer(8, spaces.Dict({"a": OBS}), ACT)
    with pytest.raises(ValueError, match="replay_buffer_class must be"):
        PrioritizedDQN("MlpPolicy", "CartPole-v1", replay_buffer_class=ReplayBuffer)
    buf = PrioritizedReplayBuffer(8, OBS, ACT, "cpu", variant="binary", seed=0)
    with pytest.raises(ValueError, match="empty buffer"):
        buf.sample(4)
    fill([buf], 3, 1, np.random.default_rng(0))
    before = buf.store.tree.leaves().copy()
    with pytest.raises(ValueError, match=r"priorities\[1\] = nan is not finite"):
        buf.update_priorities([0, 1], [1.0, np.nan])
    with pytest.raises(IndexError, match=r"indices\[0\] = 5 is out of range: valid indices are 0 .. 2"):
        buf.update_priorities([5], [1.0])
    assert np.array_equal(buf.store.tree.leaves(), before)


@pytest.fixture
def one_torch_thread():
    """Tiny networks: one thread avoids oversubscribing a shared machine."""
    threads = th.get_num_threads()
    th.set_num_threads(1)
    yield
    th.set_num_threads(threads)


def test_uniform_variant_samples_uniformly_with_unit_weights():
    buf = PrioritizedReplayBuffer(8, OBS, ACT, "cpu", n_envs=2, variant="uniform", seed=0)
    fill([buf], 4, 2, np.random.default_rng(0))
    draws = buf.sample(4000)
    assert th.equal(draws.weights, th.ones(4000, 1))
    counts = np.bincount(draws.indices, minlength=8)
    assert stats.chisquare(counts).pvalue > 1e-3


def test_prioritized_dqn_learns_with_vector_envs_and_round_trips_its_buffer(tmp_path, one_torch_thread):
    variant = "kary-aligned"
    env = make_vec_env("CartPole-v1", n_envs=2, seed=0)
    model = PrioritizedDQN("MlpPolicy", env, learning_starts=64, buffer_size=512, batch_size=32, train_freq=2,
                           target_update_interval=50, seed=0, device="cpu", policy_kwargs={"net_arch": [16]},
                           replay_buffer_kwargs={"variant": variant, "alpha": 0.6, "beta": 0.4, "seed": 0})
    model.learn(300)
    buf = model.replay_buffer
    assert buf.size() == 150 and buf.store.capacity == 512
    leaves = buf.store.tree.leaves()[:300]   # TD errors were written back, and beta annealed to 1
    assert len(np.unique(leaves)) > 50 and buf.beta == 1.0
    path = tmp_path / "buffer.pkl"
    model.save_replay_buffer(path)
    other = DQN("MlpPolicy", env, replay_buffer_class=PrioritizedReplayBuffer, buffer_size=512, learning_starts=0,
                batch_size=32, device="cpu", policy_kwargs={"net_arch": [16]})
    other.load_replay_buffer(path)
    loaded = other.replay_buffer
    assert isinstance(loaded, PrioritizedReplayBuffer) and loaded.device == th.device("cpu")
    assert (loaded.pos, loaded.full, loaded.size()) == (buf.pos, buf.full, buf.size())
    for name, col in buf.store.storage.columns.items():
        assert np.array_equal(loaded.store.storage.columns[name], col)
    a, b = buf.sample(16), loaded.sample(16)     # same generator state: the same draw
    assert np.array_equal(a.indices, b.indices) and th.equal(a.observations, b.observations)
    other.learn(40)                               # plain DQN trains on it (weights ignored)
    assert loaded.size() == 150 + 20


def test_string_and_complex_priorities_are_named_and_change_nothing():
    buf = PrioritizedReplayBuffer(8, OBS, ACT, "cpu", variant="binary", seed=0, eps=0.0)
    fill([buf], 3, 1, np.random.default_rng(0))
    before = buf.store.tree.leaves().copy()
    for bad, shown in ((["1.0", "abc"], r"priorities\[0\] = '1\.0'"), (np.array([1.0, 3j]), r"priorities\[1\] = 3j"),
                       (th.tensor([1.0, 2 - 2j]), r"priorities\[1\] = \(2-2j\)")):
        with pytest.raises(TypeError, match=rf"priorities must be numbers, got dtype \S+: {shown} is not a real"):
            buf.update_priorities([0, 1], bad)
    assert np.array_equal(buf.store.tree.leaves(), before)
    buf.update_priorities([0, 1, 2], th.zeros(3, 1))       # the loss's (batch, 1) column; eps=0: all zero
    with pytest.raises(ValueError, match="total priority is 0") as err:
        buf.sample(4)
    assert "empty" not in str(err.value)


def test_prioritized_dqn_refuses_a_plain_sb3_buffer_at_load(tmp_path, one_torch_thread):
    """Issue 41 item 19: loading a plain SB3 ReplayBuffer succeeded and ``learn`` then failed
    with ``AttributeError: ... 'beta'``. Refused at load, naming the type; the model keeps its
    own buffer."""
    env = make_vec_env("CartPole-v1", n_envs=1, seed=0)
    plain = DQN("MlpPolicy", env, buffer_size=64, device="cpu", policy_kwargs={"net_arch": [8]})
    path = tmp_path / "plain.pkl"
    plain.save_replay_buffer(path)
    model = PrioritizedDQN("MlpPolicy", env, buffer_size=64, learning_starts=0, device="cpu",
                           policy_kwargs={"net_arch": [8]}, replay_buffer_kwargs={"variant": "binary", "seed": 0})
    own = model.replay_buffer
    with pytest.raises(TypeError, match=r"plain.pkl holds a stable_baselines3.common.buffers.ReplayBuffer; "
                                        r"PrioritizedDQN needs a replaybench.adapters.sb3.PrioritizedReplayBuffer"):
        model.load_replay_buffer(path)
    assert model.replay_buffer is own
