"""The TorchRL adapter against TorchRL's own PrioritizedSampler, each in a TensorDictReplayBuffer
over the same storage and inputs: the same priorities after extends, updates through the
priority key and a wrap-around, so the same probabilities (chi-square on our draws) and the
same globally normalised weights; a DQN loop with TorchRL's DQNLoss runs with it; bad input
gets our errors."""

import json
import shutil

import numpy as np
import pytest
from scipy import stats

pytest.importorskip("torchrl", reason="the torchrl extra is not installed")

import torch  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from torchrl.data import LazyTensorStorage, TensorDictPrioritizedReplayBuffer, TensorDictReplayBuffer  # noqa: E402

from replaybench.adapters import torchrl as adapter  # noqa: E402
from replaybench.adapters.torchrl import PrioritizedSampler  # noqa: E402

SIZE = 16
#: How the tests built on ``both`` make our buffer (set per test by ``ours_kind``).
OURS = {"kind": "sampler"}


@pytest.fixture(autouse=True, params=["sampler", "buffer"])
def ours_kind(request):
    """Every test built on ``both`` runs twice: with our sampler in TorchRL's
    ``TensorDictReplayBuffer``, and with our ``TensorDictPrioritizedReplayBuffer`` (its fast
    extend, sample and update paths), so each TorchRL contract is checked on both."""
    OURS["kind"] = request.param
    yield request.param
    OURS["kind"] = "sampler"


def both(alpha=0.6, beta=0.4):
    if OURS["kind"] == "buffer":
        ours = adapter.TensorDictPrioritizedReplayBuffer(alpha=alpha, beta=beta, storage=LazyTensorStorage(SIZE),
                                                         priority_key="td_error", variant="kary-aligned")
    else:
        ours = TensorDictReplayBuffer(storage=LazyTensorStorage(SIZE), priority_key="td_error",
                                      sampler=PrioritizedSampler(SIZE, alpha, beta, variant="kary-aligned"))
    theirs = TensorDictPrioritizedReplayBuffer(alpha=alpha, beta=beta, storage=LazyTensorStorage(SIZE))
    return ours, theirs


def data(start, n, td=None):
    fields = {"x": torch.arange(start, start + n, dtype=torch.float32)}
    if td is not None:
        fields["td_error"] = torch.as_tensor(td, dtype=torch.float32)
    return TensorDict(fields, batch_size=[n])


def leaves(rb):
    sampler = rb._sampler
    if isinstance(sampler, PrioritizedSampler):
        return sampler._index.tree.leaves()[:SIZE]
    return np.array([sampler._sum_tree[i] for i in range(SIZE)])


def drive(buffers):
    """The same extends (one carrying TD errors, 26 items in 16 slots: a wrap-around) and
    priority updates, every priority at most 1 so far (see test_new_data_gets_the_stored_maximum)."""
    rng = np.random.default_rng(0)
    for b in buffers:
        b.extend(data(0, 10))
    for step in range(4):
        idx = torch.as_tensor(rng.choice(10, 4, replace=False))
        prio = torch.as_tensor(rng.uniform(0.05, 1.0, 4), dtype=torch.float32)
        for b in buffers:
            b.update_priority(idx, prio)
    td = rng.uniform(0.1, 0.9, 10)
    for b in buffers:
        b.extend(data(10, 10, td))
        b.extend(data(20, 6))


def test_same_priorities_probabilities_and_weights_after_updates_and_a_wrap_around():
    ours, theirs = both()
    drive([ours, theirs])
    assert len(ours) == len(theirs) == SIZE
    assert torch.equal(ours.storage[:]["x"], theirs.storage[:]["x"])      # the storage is TorchRL's
    p = leaves(theirs)
    assert np.allclose(leaves(ours), p, rtol=1e-5)
    draws = np.concatenate([ours.sample(256)["index"].numpy() for _ in range(40)])
    counts = np.bincount(draws, minlength=SIZE)
    assert stats.chisquare(counts, counts.sum() * p / p.sum()).pvalue > 1e-3
    torch.manual_seed(0)
    got = theirs.sample(64)
    ours_w = ours._sampler._index.weights(got["index"].numpy())
    assert np.allclose(got["priority_weight"].numpy(), ours_w, rtol=1e-5)
    mine = ours.sample(64)
    assert mine["priority_weight"].dtype == torch.float32 and mine["index"].dtype == torch.int64
    assert np.allclose(mine["priority_weight"].numpy(), (p[mine["index"].numpy()] / p.min()) ** -0.4, rtol=1e-5)


def test_update_tensordict_priority_and_new_data_gets_the_stored_maximum():
    ours, theirs = both(alpha=0.5)
    drive([ours, theirs])
    for b in (ours, theirs):
        sample = b.sample(8)
        sample["td_error"] = torch.full((8,), 16.0)     # the loss writes it; a new maximum, p = 4
        b.update_tensordict_priority(sample)
        assert np.allclose(leaves(b)[sample["index"].numpy()], 4.0, rtol=1e-5)
        b.extend(data(100, 2))
    # Ours: new data gets the largest stored p = 4 (Schaul et al.); TorchRL raises its default
    # priority to alpha a second time: 4 ** 0.5 (documented in the adapter).
    assert np.allclose(leaves(ours)[[10, 11]], 4.0, rtol=1e-5)     # 26 items so far: slots 10 and 11 are next
    assert np.allclose(leaves(theirs)[[10, 11]], 2.0, rtol=1e-5)


def test_dumps_and_loads_round_trip(tmp_path):
    ours, _ = both()
    drive([ours])
    ours.dumps(tmp_path / "rb")
    other, _ = both()
    other.loads(tmp_path / "rb")
    assert len(other) == SIZE and np.array_equal(leaves(other), leaves(ours))


def test_bad_input_gets_our_errors_and_changes_nothing():
    with pytest.raises(ValueError, match="variant 'uniform' keeps no priorities"):
        PrioritizedSampler(SIZE, 0.6, 0.4, variant="uniform")
    ours, _ = both()
    with pytest.raises(ValueError, match="cannot sample from an empty storage"):
        ours.sample(4)
    ours.extend(data(0, 5))
    before = leaves(ours).copy()
    with pytest.raises(ValueError, match=r"priorities\[1\] = nan is not finite"):
        ours.update_priority(torch.tensor([0, 1]), torch.tensor([1.0, float("nan")]))
    with pytest.raises(ValueError, match=r"priorities\[0\] = -1.0 is negative"):
        ours.update_priority(torch.tensor([2]), torch.tensor([-1.0]))
    with pytest.raises(IndexError, match=r"indices\[0\] = 7 is out of range: valid indices are 0 .. 4"):
        ours.update_priority(torch.tensor([7]), torch.tensor([1.0]))
    with pytest.raises(ValueError, match="beta must be a finite number >= 0"):
        ours._sampler.beta = -1
    assert np.array_equal(leaves(ours), before)


@pytest.mark.slow  # a few seconds of training
def test_a_dqn_loop_with_torchrl_dqnloss_runs_with_it(ours_kind, monkeypatch):
    from torch import nn
    from torchrl.envs import GymEnv
    from torchrl.modules import EGreedyModule, QValueActor
    from torchrl.objectives import DQNLoss, SoftUpdate
    from tensordict.nn import TensorDictSequential

    torch.manual_seed(0)
    env = GymEnv("CartPole-v1")
    env.set_seed(0)
    actor = QValueActor(nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2)), in_keys=["observation"],
                        spec=env.action_spec)
    policy = TensorDictSequential(actor, EGreedyModule(env.action_spec, eps_init=0.2, eps_end=0.2))
    loss = DQNLoss(actor, action_space=env.action_spec, delay_value=True)
    target = SoftUpdate(loss, eps=0.95)
    optim = torch.optim.Adam(loss.parameters(), lr=1e-3)
    if ours_kind == "buffer":
        rb = adapter.TensorDictPrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=LazyTensorStorage(512),
                                                       priority_key="td_error", batch_size=32)
    else:
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(512), priority_key="td_error", batch_size=32,
                                    sampler=PrioritizedSampler(512, alpha=0.6, beta=0.4))
    torchrl_paths = []                  # our buffer's calls that went through TorchRL's own paths
    for name in ("extend", "sample", "update_tensordict_priority"):
        def spy(self, *a, _name=name, _call=getattr(TensorDictReplayBuffer, name), **k):
            torchrl_paths.append(_name)
            return _call(self, *a, **k)
        monkeypatch.setattr(TensorDictReplayBuffer, name, spy)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        td = env.reset()
        for step in range(300):
            td = policy(td)
            td = env.step(td)
            rb.extend(td.unsqueeze(0).exclude("next").update({"next": td["next"].unsqueeze(0)}))
            td = env.step_mdp(td)
            if td["done"].item():
                td = env.reset()
            if len(rb) >= 64 and step % 4 == 0:
                sample = rb.sample()
                out = loss(sample)
                optim.zero_grad()
                out["loss"].backward()
                optim.step()
                target.step()
                rb.update_tensordict_priority(sample)
    finally:
        torch.set_num_threads(threads)
    assert len(rb) == 300
    assert len(np.unique(rb._sampler._index.tree.leaves()[:300])) > 20   # TD errors written back
    if ours_kind == "buffer":           # the first extend makes the storage; then all are ours
        assert torchrl_paths == ["extend"]
        stored = rb.storage._storage
        going = ~stored["next", "done"][:299, 0]    # within an episode: a step starts where the last ended
        assert torch.equal(stored["observation"][1:300][going], stored["next", "observation"][:299][going])


def test_string_and_complex_priorities_are_named_and_all_zero_priorities_are_not_an_empty_buffer():
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(SIZE), priority_key="td_error",
                                sampler=PrioritizedSampler(SIZE, 0.6, 0.4, eps=0.0))
    rb.extend(data(0, 3))
    before = leaves(rb).copy()
    for bad, shown in ((torch.tensor([1.0, 2 + 1j]), r"priority\[1\] = \(2\+1j\)"),
                       (np.array(["1.0", "2.0"]), r"priority\[0\] = '1\.0'")):
        with pytest.raises(TypeError, match=rf"priority must be numbers, got dtype \S+: {shown} is not a real"):
            rb._sampler.update_priority(torch.tensor([0, 1]), bad)
    assert np.array_equal(leaves(rb), before)
    rb.update_priority(torch.arange(3), torch.zeros(3))    # zero TD errors with eps=0: every priority 0
    with pytest.raises(ValueError, match=r"all 3 stored priorities are 0 \(eps=0\.0") as err:
        rb.sample(4)
    assert "empty" not in str(err.value)


def corruptions(folder):
    """Ways a dumped sampler folder can be damaged, each a function that damages it."""
    meta = folder / "sampler_metadata.json"
    prio = folder / "priorities.npy"

    def edit_meta(**changes):
        return lambda: meta.write_text(json.dumps({**json.loads(meta.read_text()), **changes}))

    def drop_meta_key():
        m = json.loads(meta.read_text())
        del m["max_priority"]
        meta.write_text(json.dumps(m))

    def save_prio(values):
        return lambda: np.save(prio, values)

    return {"truncated priorities": lambda: prio.write_bytes(prio.read_bytes()[:40]),
            "nan priority": save_prio(np.r_[np.ones(SIZE - 1), np.nan]),
            "negative priority": save_prio(np.r_[-np.ones(1), np.ones(SIZE - 1)]),
            "short priorities": save_prio(np.ones(SIZE - 2)),
            "missing priorities": prio.unlink,
            "metadata not json": lambda: meta.write_text("{"),
            "metadata without max_priority": drop_meta_key,
            "alpha nan": edit_meta(alpha=float("nan")),
            "beta negative": edit_meta(beta=-1.0),
            "max_priority a string": edit_meta(max_priority="big")}


def test_loads_is_all_or_nothing_a_corrupt_folder_leaves_the_sampler_as_it_was(tmp_path):
    source, _ = both()
    drive([source])
    source.update_priority(torch.tensor([3]), torch.tensor([9.0]))      # a max priority above 1
    source._sampler.dumps(tmp_path / "good")      # the sampler's own folder (a buffer's dumps nests it)
    target, _ = both(alpha=0.5, beta=0.7)
    drive([target])
    sampler = target._sampler
    state = (leaves(target).copy(), sampler._index.max_priority, sampler.alpha, sampler.beta, sampler._eps)
    for name in corruptions(tmp_path / "good"):
        folder = tmp_path / name.replace(" ", "-")
        shutil.copytree(tmp_path / "good", folder)
        corruptions(folder)[name]()
        with pytest.raises(ValueError, match=r"sampler_metadata\.json|priorities\.npy"):
            sampler.loads(folder)
        after = (leaves(target), sampler._index.max_priority, sampler.alpha, sampler.beta, sampler._eps)
        assert np.array_equal(after[0], state[0]) and after[1:] == state[1:], name
    target.sample(8)                                                      # still samples as before
    sampler.loads(tmp_path / "good")                                      # and a good folder loads
    assert np.array_equal(leaves(target), leaves(source)) and sampler.alpha == 0.6


# Compatibility with code written against TorchRL's own PrioritizedSampler (issue 29)

def test_alpha_and_beta_as_0d_tensors_and_a_schedule_past_1_as_torchrl_takes_them(ours_kind):
    from torchrl.data.replay_buffers.scheduler import LinearScheduler

    if ours_kind == "buffer":
        ours = adapter.TensorDictPrioritizedReplayBuffer(alpha=torch.tensor(0.6), beta=torch.tensor(0.4),
                                                         storage=LazyTensorStorage(SIZE))
    else:
        ours = TensorDictReplayBuffer(storage=LazyTensorStorage(SIZE), priority_key="td_error",
                                      sampler=PrioritizedSampler(SIZE, torch.tensor(0.6), torch.tensor(0.4)))
    theirs = TensorDictPrioritizedReplayBuffer(alpha=torch.tensor(0.6), beta=torch.tensor(0.4),
                                               storage=LazyTensorStorage(SIZE))
    drive([ours, theirs])
    schedules = [LinearScheduler(b, "beta", final_value=1.5, num_steps=4) for b in (ours, theirs)]
    for _ in range(6):                                   # past num_steps: beta ends at 1.5, above 1
        for schedule in schedules:
            schedule.step()
    assert float(ours.sampler.beta) == pytest.approx(1.5) == float(theirs.sampler.beta)
    ours.sampler.alpha = torch.tensor(0.5)               # a 0-d tensor, as a scheduler of alpha gives
    assert ours.sampler.alpha == 0.5
    torch.manual_seed(0)
    got = theirs.sample(64)
    p = leaves(theirs)
    assert np.allclose(got["priority_weight"].numpy(), (p[got["index"].numpy()] / p.min()) ** -1.5, rtol=1e-5)
    mine = ours.sample(64)
    assert np.allclose(mine["priority_weight"].numpy(), (p[mine["index"].numpy()] / p.min()) ** -1.5, rtol=1e-5)
    with pytest.raises(ValueError, match=r"beta must be a number or a 0-d tensor, got shape \(2,\)"):
        ours.sampler.beta = torch.tensor([0.5, 0.6])
    assert float(ours.sampler.beta) == 1.5


def test_resetting_the_buffers_generator_repeats_the_samples_as_in_torchrl(ours_kind):
    for sampler in (PrioritizedSampler(SIZE, 0.6, 0.4), None):
        kw = {"sampler": sampler} if sampler is not None else {"alpha": 0.6, "beta": 0.4}
        cls = TensorDictReplayBuffer if sampler is not None else TensorDictPrioritizedReplayBuffer
        if ours_kind == "buffer" and sampler is not None:
            cls, kw = adapter.TensorDictPrioritizedReplayBuffer, {"alpha": 0.6, "beta": 0.4}
        rb = cls(storage=LazyTensorStorage(SIZE), generator=torch.Generator().manual_seed(7), **kw)
        drive([rb])
        start = rb._rng.get_state()
        first, second = rb.sample(32)["index"], rb.sample(32)["index"]
        assert not torch.equal(first, second)
        rb._rng.set_state(start)                         # the same generator object, reset
        assert torch.equal(rb.sample(32)["index"], first) and torch.equal(rb.sample(32)["index"], second)
        rb._rng.manual_seed(7)
        rb.set_rng(torch.Generator().manual_seed(8))     # a new generator: another stream
        assert not torch.equal(rb.sample(32)["index"], first)


def test_an_empty_storage_raises_runtime_error_as_torchrl_and_value_error_as_ours():
    ours, theirs = both()
    for b in (ours, theirs):
        with pytest.raises(RuntimeError, match="(?i)cannot sample from an empty storage"):
            b.sample(4)
    with pytest.raises(ValueError, match="cannot sample from an empty storage"):
        ours.sample(4)


def test_sum_min_and_max_priority_views_read_as_torchrls():
    ours, theirs = both()
    for rb in (ours, theirs):
        assert rb.sampler._max_priority == (None, None)
    drive([ours, theirs])
    for rb in (ours, theirs):
        rb.update_priority(torch.tensor([5, 2]), torch.tensor([6.0, 0.5]))
    a, b = ours.sampler, theirs.sampler
    assert np.allclose([a._sum_tree[i] for i in range(SIZE)], [b._sum_tree[i] for i in range(SIZE)], rtol=1e-5)
    idx = torch.tensor([3, 0, 9, 9])
    assert isinstance(a._sum_tree[idx], torch.Tensor)
    assert np.allclose(a._sum_tree[idx].numpy(), b._sum_tree[idx].numpy(), rtol=1e-5)
    assert np.allclose(a._sum_tree[np.array([1, 4])], b._sum_tree[np.array([1, 4])], rtol=1e-5)
    for lo, hi in ((0, SIZE), (3, 9), (0, 5), (7, SIZE)):
        assert a._sum_tree.query(lo, hi) == pytest.approx(b._sum_tree.query(lo, hi), rel=1e-5)
        assert a._min_tree.query(lo, hi) == pytest.approx(b._min_tree.query(lo, hi), rel=1e-5)
    assert a._min_tree[4] == pytest.approx(b._min_tree[4], rel=1e-5) and len(a._sum_tree) == len(b._sum_tree)
    assert float(a._max_priority[0]) == pytest.approx(6.0) == float(b._max_priority[0])
    assert int(a._max_priority[1]) == 5 == int(b._max_priority[1])
    with pytest.raises(TypeError, match="read-only view .* update_priority"):
        a._sum_tree[0] = 1.0
    with pytest.raises(AttributeError):
        a._max_priority = None
    with pytest.raises(IndexError, match=r"indices\[0\] = 16 is out of range"):
        a._sum_tree[SIZE]
    fresh = PrioritizedSampler(4, 0.6, 0.4)              # unwritten slots: sum 0, min inf, as TorchRL's
    assert fresh._sum_tree[0] == 0 and fresh._min_tree[0] == np.inf and fresh._min_tree.query(0, 4) == np.inf
    for rb in (ours, theirs):
        rb.empty()
        assert rb.sampler._max_priority == (None, None) and rb.sampler._sum_tree.query(0, SIZE) == 0


def test_what_stays_refused_is_named_and_changes_no_priority():
    """A slot past the capacity and a multi-dimensional storage (see the adapter's docstring)."""
    sampler = PrioritizedSampler(SIZE, 0.6, 0.4)
    with pytest.raises(IndexError, match=rf"indices\[0\] = {SIZE} is out of range: valid indices are 0 .. {SIZE - 1}"):
        sampler.update_priority(torch.tensor([SIZE]), torch.tensor([1.0]))   # TorchRL writes past its leaves
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(SIZE, ndim=2), sampler=sampler)
    with pytest.raises(ValueError, match=r"got shape \(\d+, 2\): a multi-dimensional storage is not supported"):
        rb.extend(TensorDict({"x": torch.zeros(8, 2)}, batch_size=[8, 2]))
    assert sampler._sum_tree.query(0, SIZE) == 0


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_max_priority_within_buffer_gives_new_data_the_largest_priority_stored_now(dtype, tmp_path):
    """The definition, against an O(N) oracle over random extends and updates (with wrap-arounds,
    the maximum's slot overwritten and lowered); TorchRL's own mode falls back to priority 1
    after an overwrite of the maximum's slot, so it is no oracle here."""
    cap = 8
    sampler = PrioritizedSampler(cap, 0.7, 0.4, max_priority_within_buffer=True, variant_params={"dtype": dtype})
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(cap), sampler=sampler)
    rng = np.random.default_rng(0)
    written, lowered_max, overwritten_max = 0, 0, 0
    for step in range(60):
        n = int(rng.integers(1, 4))
        before = sampler._index.tree.leaves()
        slots = (written + np.arange(n)) % cap
        kept = np.setdiff1d(np.arange(min(written, cap)), slots)   # stored, and not overwritten now
        expect = before[kept].max() if kept.size and before[kept].max() > 0 else 1.0
        overwritten_max += written > 0 and int(np.argmax(before)) in slots
        rb.extend(data(step * 10, n))
        written += n
        after = sampler._index.tree.leaves()
        assert np.array_equal(after[slots], np.full(n, expect)), step
        assert after[sampler._max_priority[1]] == after.max()
        idx = rng.choice(min(written, cap), 2, replace=False)
        lowered_max += int(np.argmax(after)) in idx
        rb.update_priority(torch.as_tensor(idx), torch.as_tensor(rng.uniform(0.0, 3.0, 2)))
    assert lowered_max > 3 and overwritten_max > 3                # both rescan paths were taken
    sampler.dumps(tmp_path / "s")
    other = PrioritizedSampler(cap, 0.7, 0.4, max_priority_within_buffer=True, variant_params={"dtype": dtype})
    other.loads(tmp_path / "s")                                   # the maximum is found again in the leaves
    assert other._index.max_priority == sampler._index.tree.leaves().max()


# Our TensorDictPrioritizedReplayBuffer: its fast extend, sample and update paths

def steps(start, n):
    """``n`` CartPole-shaped steps as TorchRL's ``GymEnv.step`` gives them (a nested "next",
    booleans, int64 one-hot actions), with values that name their step."""
    k = torch.arange(start, start + n)
    return TensorDict({"observation": k[:, None].float().expand(n, 4).clone(),
                       "action": torch.stack([k % 2, 1 - k % 2], 1), "done": (k % 3 == 0)[:, None],
                       "next": TensorDict({"observation": k[:, None].float().expand(n, 4) + 0.5,
                                           "reward": torch.ones(n, 1), "done": (k % 3 == 0)[:, None]}, [n])}, [n])


def fast_and_torchrl(cap=SIZE, storage=LazyTensorStorage, **kw):
    fast = adapter.TensorDictPrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=storage(cap), **kw)
    own = TensorDictReplayBuffer(storage=storage(cap), sampler=PrioritizedSampler(cap, 0.6, 0.4), **kw)
    return fast, own


@pytest.mark.parametrize("storage", ["LazyTensorStorage", "LazyMemmapStorage"])
def test_fast_paths_write_and_read_what_torchrls_paths_do_through_a_wrap_around(storage, monkeypatch):
    import torchrl.data

    fast, own = fast_and_torchrl(storage=getattr(torchrl.data, storage))
    for rb in (fast, own):
        rb.extend(steps(0, 5))              # the first extend creates the storage: TorchRL's path
    # From here on ours must not fall back to TorchRL's paths (they would also give the right
    # contents; this checks that the fast ones are taken).
    refuse = {name: getattr(TensorDictReplayBuffer, name) for name in ("extend", "sample",
                                                                     "update_tensordict_priority")}

    def refusing(name):
        def call(self, *a, **k):
            if self is fast:
                raise AssertionError(f"{name} fell back to TorchRL's path")
            return refuse[name](self, *a, **k)
        return call
    for name in refuse:
        monkeypatch.setattr(TensorDictReplayBuffer, name, refusing(name))
    for start, n in ((5, 1), (6, 7), (13, 1), (14, 9), (23, SIZE)):   # wraps at 16 and 32
        got, want = fast.extend(steps(start, n)), own.extend(steps(start, n))
        assert torch.equal(got, want) and got.dtype == torch.int64
        assert (len(fast), fast._writer._cursor, fast.write_count) == (len(own), own._writer._cursor, own.write_count)
        written = len(own)                  # unwritten slots hold whatever torch.empty left there
        assert (fast.storage._storage[:written] == own.storage._storage[:written]).all()
    sample, info = fast.sample(12, return_info=True)
    assert sample.batch_size == torch.Size([12]) and sample["next"].batch_size == torch.Size([12])
    assert set(sample.keys(True, True)) == set(own.sample(12).keys(True, True))
    stored = fast.storage._storage[sample["index"]]
    for key in stored.keys(True, True):
        if key != "index":
            assert torch.equal(sample[key], stored[key]) and sample[key].dtype == stored[key].dtype
    assert torch.equal(info["index"], sample["index"]) and torch.equal(info["priority_weight"], sample["priority_weight"])
    oracle = fast.sampler._index.weights(sample["index"].numpy())
    assert sample["priority_weight"].dtype == torch.float32
    assert np.allclose(sample["priority_weight"].numpy(), oracle, rtol=1e-6)
    # A sample held by the caller is its own: later samples and writes leave it as it was.
    held = sample.clone()
    fast.sample(12)
    fast.extend(steps(100, SIZE))
    assert (sample == held).all()
    sample.set("td_error", torch.linspace(0.5, 3.0, 12))
    fast.update_tensordict_priority(sample)
    want = (torch.linspace(0.5, 3.0, 12).double().numpy() + 1e-8) ** 0.6
    last = {}
    for i, p in zip(sample["index"].tolist(), want):   # a slot drawn twice keeps its last priority
        last[i] = p
    assert np.allclose(leaves(fast)[list(last)], list(last.values()), rtol=1e-5)


def test_what_the_fast_paths_do_not_cover_goes_through_torchrls_paths():
    from torchrl.envs.transforms import Compose, RenameTransform

    fast, own = fast_and_torchrl(priority_key="td_error")
    for rb in (fast, own):
        rb.extend(data(0, 4, td=[1.0, 2.0, 3.0, 4.0]))    # the priority key given at extend
        rb.extend(data(4, 2, td=[9.0, 0.5]))
        assert np.allclose(leaves(rb)[4:6], (np.array([9.0, 0.5]) + 1e-8) ** 0.6, rtol=1e-5)
    # Another dtype, a key the storage lacks: TorchRL's own path decides, for ours too.
    for bad in (TensorDict({"x": torch.arange(6, 8), "td_error": torch.ones(2)}, [2]),
                TensorDict({"y": torch.ones(2)}, [2])):
        outcomes = []
        for rb in (fast, own):
            try:
                outcomes.append(rb.extend(bad.clone()).tolist())
            except Exception as err:  # noqa: BLE001  (whatever TorchRL raises, both must raise it)
                outcomes.append(type(err))
        assert outcomes[0] == outcomes[1]
        assert (len(fast), fast._writer._cursor) == (len(own), own._writer._cursor)
        assert set(fast.storage._storage.keys(True, True)) == set(own.storage._storage.keys(True, True))
    with pytest.warns(UserWarning, match="conflicting batch_sizes"):   # TorchRL's warning
        warn_rb = adapter.TensorDictPrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=LazyTensorStorage(8),
                                                            batch_size=4)
        warn_rb.extend(data(0, 3))
        assert warn_rb.sample(2).batch_size == torch.Size([2])
    renamed = adapter.TensorDictPrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=LazyTensorStorage(8),
                                                        transform=Compose(RenameTransform(["x"], ["z"])))
    renamed.extend(data(0, 3))
    renamed.extend(data(3, 3))
    assert "z" in renamed.sample(4).keys()


def test_state_dict_and_loads_replace_the_tensors_the_fast_paths_read(tmp_path):
    source, _ = fast_and_torchrl()
    source.extend(steps(0, 10))
    source.extend(steps(10, 3))
    source.dumps(tmp_path / "rb")
    for restore in ("load_state_dict", "loads"):
        target, _ = fast_and_torchrl()
        target.extend(steps(50, 4))
        target.extend(steps(60, 2))                        # the fast path has read the storage
        if restore == "loads":
            target.loads(tmp_path / "rb")
        else:
            target.load_state_dict(source.state_dict())
        assert len(target) == 13 and np.array_equal(leaves(target), leaves(source))
        sample = target.sample(32)
        assert torch.equal(sample["observation"][:, 0], sample["index"].float()), restore
        target.extend(steps(13, 2))                        # and writes land where samples read
        assert torch.equal(target.storage._storage["observation"][13:15, 0], torch.tensor([13.0, 14.0]))


def test_a_pickled_or_copied_buffer_writes_and_reads_its_own_storage():
    import copy
    import pickle

    rb, _ = fast_and_torchrl()
    rb.extend(steps(0, 5))
    rb.extend(steps(5, 3))                                 # the fast path has read the storage
    for other in (pickle.loads(pickle.dumps(rb)), copy.deepcopy(rb)):
        other.extend(steps(8, 2))
        assert torch.equal(other.storage._storage["observation"][:10, 0], torch.arange(10.0))
        sample = other.sample(16)
        assert torch.equal(sample["observation"][:, 0], sample["index"].float())
    assert len(rb) == 8                                    # the original is left as it was
    assert rb.prioritized_sampler is rb.sampler and isinstance(rb.sampler, PrioritizedSampler)
