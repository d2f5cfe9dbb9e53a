"""The learners' gradient all-reduce over shared memory (impl.rl.common.allreduce).

What it promises, checked: the mean of every rank's vector, the same bits on every rank (the
sum in rank order, whoever arrives first), across processes as well as threads; a peer that
never arrives ends the wait with an error naming it, and a stop flag ends it at once; bad
arguments are refused naming them. And PAL's scheme with it: L learners each on 1/L of a batch
with averaged gradients take (to rounding) the step one learner takes on the whole batch, and
stay bitwise identical; with one learner the hook changes nothing, bit for bit.
"""

from __future__ import annotations

import copy
import multiprocessing as mp
import threading
import time

import numpy as np
import pytest

from replaybench.impl.ratelimit import Stopped
from replaybench.impl.rl.common.allreduce import AllreduceTimeout, SharedAllreduce, SharedGradientAverager


def _ranks(group: SharedAllreduce, stopped=None) -> list[SharedAllreduce]:
    """One bound copy per rank over the same shared arrays (for threads of one process)."""
    return [copy.copy(group).bind(r, stopped) for r in range(group.world)]


def _run_threads(fn, ranks):
    out, errors = [None] * len(ranks), []

    def body(r):
        try:
            out[r] = fn(ranks[r], r)
        except BaseException as err:  # reported to the test's thread
            errors.append(err)

    threads = [threading.Thread(target=body, args=(r,)) for r in range(len(ranks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "a rank is still waiting"
    if errors:
        raise errors[0]
    return out


def _vectors(world: int, rounds: int, size: int) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(7)
    lengths = rng.integers(1, size + 1, rounds)  # the length changes between calls (TD3: critic, then actor)
    return [[rng.standard_normal(n).astype(np.float32) * np.float32(10.0 ** rng.integers(-3, 3)) for _ in range(world)]
            for n in lengths]


def _expected(vectors: list[np.ndarray]) -> np.ndarray:
    acc = vectors[0].copy()
    for v in vectors[1:]:
        acc += v
    return acc / np.float32(len(vectors))


@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_mean_is_the_rank_order_sum_on_every_rank_in_threads(world):
    rounds, size = 40, 37
    data = _vectors(world, rounds, size)
    group = SharedAllreduce(mp.get_context("spawn"), world, size, timeout_s=20)

    def body(g, r):
        got = []
        for k in range(rounds):
            if (k + r) % 3 == 0:
                time.sleep(0.001)  # ranks arrive in a different order each round
            got.append(g.mean(data[k][r].copy()))
            if k % 7 == 0:
                g.barrier()
        return got

    results = _run_threads(body, _ranks(group))
    for k in range(rounds):
        want = _expected(data[k])
        for r in range(world):
            assert np.array_equal(results[r][k], want), (k, r)
        np.testing.assert_allclose(want, np.mean(np.stack(data[k]), axis=0, dtype=np.float64), rtol=1e-5, atol=1e-6)


def _process_rank(group, rank, data, out):
    group.bind(rank)
    vec = np.empty(0, np.float32)
    for round_ in data:
        vec = group.mean(round_[rank].copy())
        if rank == 0:
            time.sleep(0.002)  # learner 0 is late every round
    out.put((rank, vec.tobytes()))


def _run_processes(ctx, group, target, args, wait_s: float) -> dict:
    """``target(group, rank, *args, out)`` in one forked process per rank; each puts one
    ``(rank, report)`` on ``out``: the reports by rank, once every process exited with 0 (none
    is left running, whatever happens)."""
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(group, r, *args, out)) for r in range(group.world)]
    for p in procs:
        p.start()
    try:
        got = dict(out.get(timeout=wait_s) for _ in procs)
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    assert all(p.exitcode == 0 for p in procs)
    return got


def test_mean_across_processes_gives_every_rank_the_same_bits():
    ctx = mp.get_context("fork")  # numpy only in the children: fork is safe and starts in milliseconds
    world, data = 3, _vectors(3, 25, 101)
    got = _run_processes(ctx, SharedAllreduce(ctx, world, 101, timeout_s=60), _process_rank, (data,), 90)
    want = _expected(data[-1]).tobytes()
    assert got == {r: want for r in range(world)}


def _mixed_rank(group, rank, data, delays, out):
    group.bind(rank)
    for round_, delay in zip(data, delays[rank]):
        time.sleep(delay)
        vec = group.mean(round_[rank].copy())
        if not np.array_equal(vec, _expected(round_)):
            out.put((rank, "wrong"))
            return
    out.put((rank, "ok"))


def test_ranks_that_poll_and_ranks_that_sleep_are_all_woken(monkeypatch):
    """Each round some ranks arrive within the polling window and some long after it (so their
    peers go to sleep on the semaphore, and the last one in must wake exactly those): a lost
    wake-up would leave a rank asleep until the all-reduce's timeout, an extra one would let a
    later phase through early and mix rounds' vectors."""
    from replaybench.impl.rl.common import allreduce

    monkeypatch.setattr(allreduce, "_SPIN_S", 0.0005)  # inherited by the forked ranks
    ctx = mp.get_context("fork")
    world, rounds = 3, 60
    data = _vectors(world, rounds, 64)
    rng = np.random.default_rng(3)
    delays = rng.choice([0.0, 0.0001, 0.002], size=(world, rounds), p=[0.5, 0.2, 0.3]).tolist()
    group = SharedAllreduce(ctx, world, 64, timeout_s=5)
    assert _run_processes(ctx, group, _mixed_rank, (data, delays), 30) == {r: "ok" for r in range(world)}
    assert group.sleepers.tolist() == [0, 0]  # every sleeper counted in was woken


def test_a_peer_that_never_arrives_is_named_after_the_timeout():
    group = SharedAllreduce(mp.get_context("spawn"), 3, 8, timeout_s=0.3)
    ranks = _ranks(group)
    t0 = time.monotonic()
    with pytest.raises(AllreduceTimeout) as info:
        # ranks 0 and 1 meet, rank 2 never comes
        _run_threads(lambda g, r: g.mean(np.ones(8, np.float32)), ranks[:2])
    assert info.value.missing == [2] and "learner-2" in str(info.value)
    assert time.monotonic() - t0 < 10


def test_the_stop_flag_ends_the_wait():
    stop = threading.Event()
    group = SharedAllreduce(mp.get_context("spawn"), 2, 4, timeout_s=60)
    g0 = copy.copy(group).bind(0, stopped=stop.is_set)
    threading.Timer(0.1, stop.set).start()
    t0 = time.monotonic()
    with pytest.raises(Stopped):
        g0.mean(np.ones(4, np.float32))
    assert time.monotonic() - t0 < 5


def test_broadcast_copies_the_roots_vector():
    group = SharedAllreduce(mp.get_context("spawn"), 3, 5, timeout_s=20)
    got = _run_threads(lambda g, r: g.broadcast(np.full(5, r + 1, np.float32), root=1), _ranks(group))
    assert all(np.array_equal(v, np.full(5, 2, np.float32)) for v in got)


@pytest.mark.parametrize("kwargs,name", [(dict(world=0, size=4), "world"), (dict(world=2, size=0), "size"),
                                         (dict(world=True, size=4), "world"),
                                         (dict(world=2, size=4, timeout_s=0), "timeout_s")])
def test_bad_arguments_are_refused_by_name(kwargs, name):
    with pytest.raises(ValueError, match=name):
        SharedAllreduce(mp.get_context("spawn"), **kwargs)


def test_bad_rank_and_vector_are_refused_by_name():
    group = SharedAllreduce(mp.get_context("spawn"), 2, 4)
    with pytest.raises(RuntimeError, match="bind"):
        group.mean(np.ones(4, np.float32))
    with pytest.raises(ValueError, match="rank must be"):
        group.bind(2)
    g = copy.copy(group).bind(0)
    for bad in (np.ones(5, np.float32), np.ones(4, np.float64), np.ones((2, 2), np.float32)):
        with pytest.raises(ValueError, match="vector must be"):
            g.mean(bad)


# ------------------------------------------------------------------------------------- PAL's scheme
def _dqn(seed=5, update="auto"):
    import gymnasium as gym

    from replaybench.impl.rl.algorithms.dqn import DQNConfig, DQNLearner

    env = gym.make("CartPole-v1")
    spaces = (env.observation_space, env.action_space)
    env.close()
    return DQNLearner(spaces, DQNConfig(hidden=(16, 16), batch_size=32, max_grad_norm=None, update=update), seed=seed)


def _batch(rows: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {"obs": rng.standard_normal((rows, 4)).astype(np.float32),
            "next_obs": rng.standard_normal((rows, 4)).astype(np.float32),
            "action": rng.integers(0, 2, rows).astype(np.int64), "reward": rng.standard_normal(rows).astype(np.float32),
            "done": (rng.random(rows) < 0.1), "weights": rng.uniform(0.5, 1.0, rows).astype(np.float32)}


def _half(batch: dict, part: int) -> dict:
    n = len(batch["reward"]) // 2
    return {k: v[part * n:(part + 1) * n] for k, v in batch.items()}


@pytest.mark.parametrize("update", ["torch", "numba"])  # the gradients gathered, or averaged where they lie
def test_two_learners_on_half_batches_step_as_one_on_the_whole_batch(update):
    """PAL: L learners each sample B/L and average gradients. The mean of the halves' mean-loss
    gradients is the whole batch's: the weights agree to rounding with one learner's, and the
    two learners agree bit for bit after every step."""
    import torch

    torch.manual_seed(0)
    whole = _dqn(update=update)
    pair = [_dqn(update=update), _dqn(update=update)]
    group = SharedAllreduce(mp.get_context("spawn"), 2, sum(p.numel() for p in whole.q.parameters()), timeout_s=20)
    for learner, g in zip(pair, _ranks(group)):
        learner.grad_hook = SharedGradientAverager(g)
    batches = [_batch(32, s) for s in range(6)]
    for b in batches:
        whole.learn(b)
        _run_threads(lambda learner, r: learner.learn(_half(b, r)), pair)
        assert pair[0].digest() == pair[1].digest()  # after every step
    for p, q in zip(whole.q.parameters(), pair[0].q.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
    assert pair[0].grad_hook.calls == len(batches)


def test_gradients_lying_back_to_back_are_averaged_in_place_and_others_gathered():
    """The averager's two paths: views of one vector, in order, are averaged where they lie
    (the vector seen over them is theirs); separate tensors, or views out of order or with a
    gap, are gathered, averaged and scattered back. Either way each tensor holds the mean."""
    import torch

    from replaybench.impl.rl.common.allreduce import _one_vector

    backing = np.arange(10, dtype=np.float32)
    views = [torch.from_numpy(backing[0:6]).view(2, 3), torch.from_numpy(backing[6:10])]
    whole = _one_vector(views)
    assert whole is not None and whole.shape == (10,)
    whole[:] *= 2  # the tensors' own memory
    assert views[0][1, 2].item() == 10.0 and views[1][3].item() == 18.0
    assert _one_vector(views[::-1]) is None
    assert _one_vector([views[0], torch.from_numpy(backing[7:10])]) is None  # a gap
    assert _one_vector([torch.from_numpy(np.zeros(4))]) is None  # float64
    ranks = _ranks(SharedAllreduce(mp.get_context("spawn"), 2, 16, timeout_s=20))
    pairs = [[torch.from_numpy(b[0:6]).view(2, 3), torch.from_numpy(b[6:10])]
             for b in (np.zeros(10, np.float32), np.full(10, 4.0, np.float32))]
    # the same views in the other order: not back to back, so gathered
    loose = [[torch.from_numpy(b[6:10]), torch.from_numpy(b[0:6]).view(2, 3)]
             for b in (np.zeros(10, np.float32), np.full(10, 4.0, np.float32))]
    for tensors in (pairs, loose):
        params = [[torch.nn.Parameter(torch.zeros_like(t)) for t in ts] for ts in tensors]
        for ps, ts in zip(params, tensors):
            for p, t in zip(ps, ts):
                p.grad = t
        _run_threads(lambda ps, r: SharedGradientAverager(ranks[r])(ps), params)
        for ps in params:
            assert all(torch.equal(p.grad, torch.full_like(p.grad, 2.0)) for p in ps)


def test_one_learner_with_the_hook_is_bit_identical_to_one_without():
    plain, hooked = _dqn(), _dqn()
    hooked.grad_hook = SharedGradientAverager(SharedAllreduce(mp.get_context("spawn"), 1, 10_000).bind(0))
    for s in range(5):
        b = _batch(32, s)
        plain.learn(b)
        hooked.learn(b)
    assert plain.digest() == hooked.digest()


@pytest.mark.slow  # starts 4 processes (gloo's import and rendezvous): ~15 s on 2 cores
def test_latency_bench_measures_both_methods():
    from replaybench.bench import allreduce_latency

    for method in ("shm", "gloo"):
        assert 0 < allreduce_latency.measure(method, 2, 64, 5) < 5
    with pytest.raises(ValueError, match="method"):
        allreduce_latency.measure("mpi", 2, 64, 5)
