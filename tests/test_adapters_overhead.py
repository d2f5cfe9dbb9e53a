"""What keeps the adapters' own per-call work down, checked without timing (spies and shared
memory): each framework call reaches our buffer through one call, tensors view the arrays our
gather made instead of copying them again, and weights come from the draw itself. Plus the
overhead benchmark (bench/adapters_overhead.py) runs and refuses bad arguments."""

import numpy as np
import pytest

pytest.importorskip("stable_baselines3", reason="the sb3 extra is not installed")
pytest.importorskip("tianshou", reason="the tianshou extra is not installed")
pytest.importorskip("torchrl", reason="the torchrl extra is not installed")

import torch  # noqa: E402
from gymnasium import spaces  # noqa: E402
from tianshou.data import Batch  # noqa: E402

from replaybench.adapters import sb3, tianshou, torchrl  # noqa: E402
from replaybench.adapters import _core  # noqa: E402
from replaybench.adapters._core import PriorityIndex  # noqa: E402
from replaybench.bench import adapters_overhead  # noqa: E402


def spy(monkeypatch, obj, name):
    """Record every call of ``obj.name`` (still calling it) in the returned list."""
    calls, real = [], getattr(obj, name)

    def recorded(*args, **kwargs):
        result = real(*args, **kwargs)
        calls.append(result)
        return result
    monkeypatch.setattr(obj, name, recorded)
    return calls


def test_sb3_sample_is_one_call_and_its_tensors_view_the_gathered_arrays(monkeypatch):
    obs_space = spaces.Box(-1.0, 1.0, (3,), np.float32)
    buf = sb3.PrioritizedReplayBuffer(16, obs_space, spaces.Discrete(4), "cpu", variant="kary-aligned", seed=0)
    rng = np.random.default_rng(0)
    for _ in range(10):
        buf.add(rng.random((1, 3), dtype=np.float32), rng.random((1, 3), dtype=np.float32), np.array([1]),
                np.array([1.0]), np.array([False]), [{}])
    samples, updates = spy(monkeypatch, buf.store, "sample"), spy(monkeypatch, buf.store, "update_priorities")
    data = buf.sample(8)
    assert len(samples) == 1
    out = samples[0]
    # No second copy: the tensors are the arrays the gather filled (fresh per call) ...
    for tensor, name in ((data.observations, "obs"), (data.next_observations, "next_obs"),
                         (data.actions, "action"), (data.weights, "weights")):
        assert tensor.data_ptr() == out[name].ctypes.data, name
    assert data.indices is out["indices"]
    # ... which the caller owns: the next sample does not overwrite them.
    kept = data.observations.clone()
    buf.sample(8)
    assert torch.equal(data.observations, kept)
    buf.update_priorities(data.indices, torch.ones(8, 1))
    assert len(updates) == 1


def test_sb3_sample_for_another_device_gathers_into_reused_arrays_and_copies_once(monkeypatch):
    obs_space = spaces.Box(-1.0, 1.0, (3,), np.float32)
    buf = sb3.PrioritizedReplayBuffer(16, obs_space, spaces.Discrete(4), "cpu", variant="kary-aligned", seed=0)
    for i in range(10):
        buf.add(np.full((1, 3), i, np.float32), np.full((1, 3), i + 1, np.float32), np.array([1]), np.array([1.0]),
                np.array([False]), [{}])
    buf.device = torch.device("meta")       # a device the tensors are copied to (as CUDA), testable on a CPU
    samples = spy(monkeypatch, buf.store, "sample")
    first, second = buf.sample(4), buf.sample(4)
    assert samples[0] is samples[1]          # the same output arrays, refilled
    assert first.observations.device.type == "meta" and first.weights.shape == (4, 1)
    assert first.indices is not samples[0]["indices"]       # the indices are the caller's: copied out
    assert np.array_equal(second.indices, samples[1]["indices"])
    buf.reset()                              # a new store: new output arrays
    buf.add(np.zeros((1, 3), np.float32), np.zeros((1, 3), np.float32), np.array([0]), np.array([0.0]),
            np.array([False]), [{}])
    assert buf.sample(4).indices.tolist() == [0, 0, 0, 0] and buf._outs[4].owner is buf.store
    assert "_outs" not in buf.__getstate__()


def transition(i):
    return Batch(obs=np.full(3, i, np.float32), act=i % 2, rew=float(i), terminated=False, truncated=False,
                 obs_next=np.full(3, i + 1, np.float32))


@pytest.mark.parametrize("vector", [False, True])
def test_tianshou_sample_weights_come_from_the_draw_not_a_second_pass_over_the_tree(monkeypatch, vector):
    buf = (tianshou.PrioritizedVectorReplayBuffer(16, 1, 0.6, 0.4) if vector
           else tianshou.PrioritizedReplayBuffer(16, 0.6, 0.4))
    for i in range(12):
        buf.add(Batch.stack([transition(i)]), buffer_ids=[0]) if vector else buf.add(transition(i))
    buf.update_weight(np.arange(12), np.linspace(0.1, 5.0, 12))
    draws = spy(monkeypatch, buf.priorities, "sample_priorities")
    reads = spy(monkeypatch, buf.priorities.tree, "get")
    batch, idx = buf.sample(32)
    assert len(draws) == 1 and reads == []                 # one descent; no priority read back
    weight = buf.get_weight(idx)                           # the per-index path: the same float64 values
    assert batch.weight.dtype == np.float64 and np.array_equal(batch.weight, weight / weight.max())
    assert np.array_equal(batch.obs, buf[idx].obs)


def test_tianshou_vector_update_weight_on_full_sub_buffers_is_one_tree_call(monkeypatch):
    buf = tianshou.PrioritizedVectorReplayBuffer(6, 2, 0.6, 0.4)
    checks = spy(monkeypatch, tianshou, "_first_unwritten")    # the compiled written-slot check
    naming = spy(monkeypatch, buf, "_check_written")           # the NumPy one that names a bad slot
    rows = Batch.stack([transition(0), transition(1)])
    buf.add(rows, buffer_ids=[0, 1])
    buf.update_weight(np.array([0, 3]), np.array([1.0, 2.0]))
    assert checks == [-1] and naming == []                 # partly written: slots checked per sub-buffer
    with pytest.raises(IndexError, match=r"indices\[1\] = 4 is not written yet: sub-buffer 1 has written slots 3 .. 3"):
        buf.update_weight(np.array([0, 4]), np.array([1.0, 2.0]))
    assert checks == [-1, 1]                               # found, then named by the NumPy check
    for _ in range(2):
        buf.add(rows, buffer_ids=[0, 1])
    assert len(buf) == buf.maxsize
    buf.update_weight(np.array([2, 5]), np.array([1.0, 4.0]))
    assert len(checks) == 2                                # full: the tree's own range check suffices
    assert np.allclose(buf.priorities.tree.get(np.array([2, 5])), (np.array([1.0, 4.0]) + tianshou.FLOAT32_EPS) ** 0.6)
    before = buf.priorities.tree.leaves().copy()
    with pytest.raises(IndexError, match=r"indices\[1\] = 6 is out of range: slots are 0 .. 5"):
        buf.update_weight(np.array([0, 6]), np.array([1.0, 1.0]))   # named as for a partly written buffer
    assert np.array_equal(buf.priorities.tree.leaves(), before)


def test_tianshou_batch_rows_is_len_of_the_batch_without_its_per_key_checks(monkeypatch):
    n = 3
    collector_like = Batch(obs=np.zeros((n, 4)), act=np.zeros(n, int), rew=np.zeros(n), terminated=np.zeros(n, bool),
                           truncated=np.zeros(n, bool), obs_next=np.zeros((n, 4)), info=Batch())
    uneven = Batch(obs=np.zeros((5, 2)), rew=np.zeros(4))                     # the least length, as len()
    nested = Batch(obs=np.zeros((n, 2)), info=Batch(env_id=np.arange(2)))     # left to len(batch)
    with_none = Batch(obs=np.zeros((n, 2)), policy=None)
    for batch in (collector_like, uneven, nested, with_none, Batch()):
        assert tianshou.batch_rows(batch) == len(batch)
    with pytest.raises(TypeError):                                         # scalars: len's own error
        tianshou.batch_rows(Batch(a=1.0))
    from tianshou.data import ReplayBufferManager

    ours, theirs = (tianshou.PrioritizedVectorReplayBuffer(8, 2, 0.6, 0.4) for _ in range(2))
    lens = spy(monkeypatch, Batch, "__len__")
    ReplayBufferManager.add(theirs, collector_like[:2], buffer_ids=[0, 1])   # Tianshou's add alone
    tianshou_own = len(lens)
    ours.add(collector_like[:2], buffer_ids=[0, 1])
    assert len(lens) == 2 * tianshou_own and len(ours) == 2           # our checks add no Batch.__len__


def test_priority_index_marks_new_slots_in_one_tree_call(monkeypatch):
    index = PriorityIndex("kary-aligned", 8, seed=0)
    checks, writes = spy(monkeypatch, index, "checked_slots"), spy(monkeypatch, _core.ops, "update")
    index.mark_new([0, 1, 2])
    assert checks == [] and len(writes) == 1                 # one compiled call
    with pytest.raises(IndexError, match=r"indices\[1\] = 8 is out of range"):
        index.mark_new([3, 8])
    assert index.tree.total() == 3.0


def test_priority_index_update_of_loop_arrays_is_one_compiled_call_without_conversions(monkeypatch):
    index = PriorityIndex("kary-aligned", 8, alpha=0.5, eps=0.0, seed=0)
    calls, converted = spy(monkeypatch, _core.ops, "update"), spy(monkeypatch, _core, "as_priorities")
    index.update(np.array([1, 6]), np.array([4.0, 9.0]), n_valid=8)           # int64 and float64: as given
    assert len(calls) == 1 and converted == [] and index.max_priority == 3.0
    index.update([2], np.array([16.0], np.float32), n_valid=8)                # anything else: converted
    assert len(calls) == 2 and len(converted) == 1
    assert np.allclose(index.tree.get(np.array([1, 6, 2])), [2.0, 3.0, 4.0])
    with pytest.raises(IndexError, match=r"indices\[0\] = 3 is out of range"):
        index.update(np.array([3]), np.array([1.0]), n_valid=3)
    with pytest.raises(ValueError, match=r"priorities\[1\] = nan"):
        index.update(np.array([0, 1]), np.array([1.0, np.nan]), n_valid=8)
    assert np.allclose(index.tree.get(np.array([0, 1, 3])), [0.0, 2.0, 0.0])   # nothing written by either


class CountingStorage:
    """What TorchRL's sampler reads of a storage: its length (counted here) and ndim."""

    ndim = 1

    def __init__(self, n):
        self.n, self.lens = n, 0

    def __len__(self):
        self.lens += 1
        return self.n


def test_torchrl_sample_and_update_reach_the_index_once_and_read_the_length_once(monkeypatch):
    sampler = torchrl.PrioritizedSampler(16, 0.6, 0.4)
    storage = CountingStorage(10)
    sampler.mark_update(torch.arange(10), storage=storage)
    draws, updates = spy(monkeypatch, sampler._index, "sample"), spy(monkeypatch, sampler._index, "update")
    storage.lens = 0
    index, info = sampler.sample(storage, 8)
    assert storage.lens == 1 and len(draws) == 1
    idx, weights = draws[0]
    assert index.numpy() is not None and index.data_ptr() == idx.ctypes.data           # views, no copy
    assert info["priority_weight"].data_ptr() == weights.ctypes.data
    sampler.update_priority(index, torch.rand(8), storage=storage)
    assert len(updates) == 1 and storage.lens == 2


@pytest.mark.parametrize("framework", adapters_overhead.FRAMEWORKS)
def test_overhead_benchmark_times_each_kind_and_summarizes(framework, monkeypatch):
    from tianshou.data import ReplayBufferManager

    # Tianshou's manager compiles its numba prev/next kernels when made (seconds per process);
    # a sample with stored obs_next and stack_num 1 never calls them.
    monkeypatch.setattr(ReplayBufferManager, "_compile", lambda self: None)
    named = adapters_overhead.calls(framework, capacity=64, batch=8)
    assert {*adapters_overhead.KINDS, *(f"add-{k}" for k in adapters_overhead.KINDS)} <= set(named)
    times = adapters_overhead.measure(named, repeats=3, number=2, warmup=1)
    assert all(len(v) == 3 and min(v) > 0 for v in times.values())
    row = adapters_overhead.summarize(framework, times)
    assert row["share"] == pytest.approx(row["adapter"] - row["bare"])
    assert row["adapter/own"] == pytest.approx(row["adapter"] / row["own"])
    assert row["adapter code"] == pytest.approx(row["adapter"] - row["container"])
    assert row["add"]["adapter/own"] == pytest.approx(row["add"]["adapter"] / row["add"]["own"])
    assert framework in adapters_overhead.format_rows([row])


def test_overhead_benchmark_refuses_bad_arguments_before_any_set_up():
    with pytest.raises(ValueError, match="framework must be one of .* got 'keras'"):
        adapters_overhead.calls("keras")
    with pytest.raises(ValueError, match="capacity must be a positive integer, got 0"):
        adapters_overhead.calls("sb3", capacity=0)
    with pytest.raises(ValueError, match="repeats must be a positive integer, got 0"):
        adapters_overhead.measure({}, repeats=0)
    for argv in (["--frameworks", "keras"], ["--repeats", "0"], ["--batch", "-1"]):
        with pytest.raises(SystemExit):
            adapters_overhead.main(argv)


def test_sb3_add_fills_kept_rows_and_writes_them_in_one_store_call(monkeypatch):
    """SB3's one-row add: no dict, checks or arrays per call; the rows kept across calls are
    filled in place and written by the store's add_staged, cast and reshaped as SB3's own add."""
    buf = sb3.PrioritizedReplayBuffer(16, spaces.Discrete(5), spaces.Discrete(4), "cpu", n_envs=2, seed=0)
    adds, staged = spy(monkeypatch, buf.store, "add"), spy(monkeypatch, buf.store, "add_staged")
    for i in range(3):   # a Discrete observation comes as (n_envs,), float64 rewards, bool dones
        buf.add(np.array([i, i + 1]), np.array([i + 1, i + 2]), np.array([[1], [2]]), np.array([0.5, 1.5]),
                np.array([False, i == 2]), [{}, {"TimeLimit.truncated": i == 2}])
    assert adds == [] and len(staged) == 3 and buf._staging.owner is buf.store
    rows = buf.store.storage.gather(np.arange(6))
    assert rows["obs"].ravel().tolist() == [0, 1, 1, 2, 2, 3] and rows["action"].ravel().tolist() == [1, 2] * 3
    assert rows["reward"].tolist() == [0.5, 1.5] * 3 and rows["done"].tolist() == [0, 0, 0, 0, 0, 1]
    assert rows["timeout"].tolist() == [0, 0, 0, 0, 0, 1] and buf.pos == 3
    assert "_staging" not in buf.__getstate__()
    buf.reset()                                  # a new store: new kept rows
    buf.add(np.array([4, 4]), np.array([4, 4]), np.array([[0], [0]]), np.array([0.0, 0.0]), np.array([False, False]),
            [{}, {}])
    assert buf._staging.owner is buf.store and len(buf.store) == 2


def test_priority_index_draws_in_one_compiled_call(monkeypatch):
    """The draw, the leaf reads and the weights in the buffers' one compiled sample call (no
    Python pass of the tree's), with the weights (p / p_min) ** -beta of the draw itself."""
    index = PriorityIndex("kary-aligned", 64, alpha=0.6, beta=0.4, seed=0)
    index.update(np.arange(40), np.linspace(0.1, 4.0, 40), n_valid=40)

    def no_python_pass(*args, **kwargs):
        raise AssertionError("the tree's Python sample was called")
    monkeypatch.setattr(index.tree, "sample", no_python_pass)
    idx, weights = index.sample(256, beta=0.7)
    assert weights.dtype == np.float32 and idx.dtype == np.int64 and 0 <= idx.min() and idx.max() < 40
    expected = np.power(index.tree.get(idx) / index.tree.min(), -0.7)
    np.testing.assert_allclose(weights, expected, rtol=1e-6)
    slots, prio = index.sample_priorities(64)
    assert np.array_equal(prio, index.tree.get(slots))
    index.reseed(7)
    first = index.sample(32)[0]
    index.reseed(7)
    assert np.array_equal(index.sample(32)[0], first)


def test_torchrl_priorities_and_new_slots_are_read_without_conversion(monkeypatch):
    """A CPU tensor of a NumPy dtype (the loss's TD errors) is viewed, not converted, and
    marking new slots makes no priority array; other input still goes through the checks."""
    sampler = torchrl.PrioritizedSampler(16, 0.6, 0.4)
    storage = CountingStorage(10)
    conversions = spy(monkeypatch, torchrl, "real_array")
    sampler.mark_update(torch.arange(10), storage=storage)
    sampler.mark_update(torch.tensor([-1, 3]), storage=storage)        # -1: not written, skipped
    sampler.update_priority(torch.arange(4), torch.tensor([0.5, 1.0, 2.0, 4.0]), storage=storage)
    assert conversions == []
    np.testing.assert_allclose(sampler._sum_tree[np.arange(4)], (np.array([0.5, 1.0, 2.0, 4.0]) + 1e-8) ** 0.6,
                               rtol=1e-6)
    sampler.update_priority(torch.arange(2), [3.0, 3.0], storage=storage)   # a list: checked and converted
    assert len(conversions) == 1
    with pytest.raises(TypeError, match="priority must be numbers"):
        sampler.update_priority(torch.arange(2), torch.tensor([1 + 1j, 2.0]), storage=storage)
