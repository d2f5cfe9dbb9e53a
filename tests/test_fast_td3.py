"""The compiled TD3 update (impl/rl/algorithms/td3_kernels.py, CompiledTD3Step in
compiled_step.py) against the eager torch step it stands in for: same critic losses, priorities
and parameters (policy, critics, targets) within float32 rounding on fixed batches, with the
same smoothing noise; the learner contract kept (grad hook calls, shared networks, digests, two
learners averaging gradients); the compiled actor's forward and its unchanged exploration draws;
the update choice checked before any work."""

import copy
import multiprocessing as mp
import threading

import numpy as np
import pytest
import torch

from replaybench.impl.rl.algorithms import mlp_kernels as mk
from replaybench.impl.rl.algorithms import td3_kernels as td3k
from replaybench.impl.rl.algorithms.base import resolve_update
from replaybench.impl.rl.algorithms.nets import flat_params
from replaybench.impl.rl.algorithms.td3 import TD3Actor, TD3Config, TD3Learner
from replaybench.impl.rl.common.allreduce import SharedAllreduce, SharedGradientAverager
from replaybench.impl.rl.common.errors import ConfigError

gym = pytest.importorskip("gymnasium")


def _spaces(obs_dim=3, act_dim=2):
    return (gym.spaces.Box(-1, 1, (obs_dim,), np.float32), gym.spaces.Box(-2, 2, (act_dim,), np.float32))


def _batches(n, rows, seed, obs_dim=3, act_dim=2):
    rng = np.random.default_rng(seed)
    return [{"obs": rng.standard_normal((rows, obs_dim)).astype(np.float32),
             "action": rng.uniform(-1, 1, (rows, act_dim)).astype(np.float32),
             "reward": rng.standard_normal(rows).astype(np.float32),
             "next_obs": rng.standard_normal((rows, obs_dim)).astype(np.float32),
             "done": rng.random(rows) < 0.1,
             "weights": rng.uniform(0.2, 1.0, rows).astype(np.float32)} for _ in range(n)]


def _run(update, overrides, batches, seed=7):
    """A learner of ``update`` built from ``seed`` (which seeds torch: its initial weights and
    the smoothing noise), its initial weights, and what each update returned. Run one learner to
    its end before building the next: both draw the noise from torch's one CPU generator."""
    learner = TD3Learner(_spaces(), TD3Config.for_env("Pendulum-v1", update=update, **overrides), seed=seed)
    initial = [flat_params(m) for m in learner.modules()]
    return learner, initial, [learner.learn(b) for b in batches]


@pytest.mark.parametrize("overrides", [
    {"hidden": (32, 32)},                                               # the preset's shape, smaller
    {"hidden": (16, 8, 4), "max_grad_norm": 0.05, "policy_delay": 3, "tau": 0.2, "gamma": 0.9},  # clipping at work
])
def test_the_compiled_update_matches_the_eager_one(overrides):
    """10 updates on fixed batches (several policy updates among them): each critic loss and
    priority vector, and every network's parameters after them, agree within float32 rounding."""
    batches = _batches(10, 64, seed=3)
    eager, initial_e, out_e = _run("torch", overrides, batches)
    fast, initial_f, out_f = _run("numba", overrides, batches)
    assert (eager.update, fast.update) == ("torch", "numba")
    assert all(torch.equal(a, b) for a, b in zip(initial_e, initial_f))  # the same initial weights
    for (loss_e, td_e), (loss_f, td_f) in zip(out_e, out_f):
        assert loss_f == pytest.approx(loss_e, rel=1e-4, abs=1e-6)
        assert td_f.dtype == np.float64 and td_f.shape == (64,)
        np.testing.assert_allclose(td_f, td_e, rtol=1e-4, atol=1e-5)
    for a, b in zip(eager.modules(), fast.modules()):  # pi, q1, q2 and their targets
        np.testing.assert_allclose(flat_params(b).numpy(), flat_params(a).numpy(), rtol=1e-4, atol=2e-5)
    moved = [not torch.equal(flat_params(m), w) for m, w in zip(fast.modules(), initial_f)]
    assert all(moved), moved  # every network took steps, the targets' Polyak updates included


def test_the_grad_hook_is_called_as_the_eager_learner_calls_it():
    """The hook gets the critics' parameters (q1's then q2's) at every update and the policy's
    at every policy_delay-th, with their gradients before clipping, in both updates; what it
    writes is what the step applies (a zero gradient: Adam leaves every parameter in place)."""
    batches = _batches(4, 32, seed=0)
    calls = {}
    for update in ("torch", "numba"):
        learner = TD3Learner(_spaces(), TD3Config(hidden=(8,), update=update, max_grad_norm=1e-3), seed=1)
        before = learner.digest()
        seen = calls[update] = []
        critic_ids = [id(p) for p in learner.critic_params]
        policy_ids = [id(p) for p in learner.pi.parameters()]

        def hook(params, seen=seen, critic_ids=critic_ids, policy_ids=policy_ids):
            params = list(params)
            ids = [id(p) for p in params]
            assert ids in (critic_ids, policy_ids)
            seen.append(("critics" if ids == critic_ids else "policy", [p.grad.clone() for p in params]))
            for p in params:
                p.grad.mul_(0.0)

        learner.grad_hook = hook
        for b in batches:
            learner.learn(b)
        assert learner.digest() == before, update
    assert [k for k, _ in calls["numba"]] == [k for k, _ in calls["torch"]] == [
        "critics", "critics", "policy", "critics", "critics", "policy"]
    for (_, fast), (_, eager) in zip(calls["numba"], calls["torch"]):
        for f, e in zip(fast, eager):
            np.testing.assert_allclose(f.numpy(), e.numpy(), rtol=1e-4, atol=1e-6)


def test_the_networks_are_views_of_the_compiled_parameters():
    """An actor sharing the learner's policy (the sequential loop) and the flat-weight broadcast
    see every compiled update; an actor of its own loads the broadcast; equal seeds keep
    learners bitwise equal."""
    a, b = (TD3Learner(_spaces(), TD3Config(hidden=(16,), update="numba", policy_delay=1), seed=2) for _ in range(2))
    shared = TD3Actor(_spaces(), a.cfg, seed=0, net=a.policy_net)
    obs = np.ones((2, 3), np.float32)
    before = shared.greedy_batch(obs)
    batches = _batches(3, 16, seed=5)
    built = torch.get_rng_state()  # b's build left torch's generator where a's did
    for batch in batches:
        a.learn(batch)
    torch.set_rng_state(built)  # so b draws the smoothing noise a drew
    for batch in batches:
        b.learn(batch)
    assert not np.array_equal(shared.greedy_batch(obs), before)
    assert torch.equal(a.get_flat_weights(), flat_params(a.policy_net))
    assert a.digest() == b.digest()
    own = TD3Actor(_spaces(), a.cfg, seed=0)
    own.set_flat_weights(a.get_flat_weights())
    assert np.array_equal(own.greedy_batch(obs), shared.greedy_batch(obs))


def test_the_compiled_actor_draws_what_the_eager_one_draws():
    """The compiled forward gives the eager forward's actions within float32 rounding, and the
    exploration draws (uniform before learning_starts, Gaussian after) are the same stream."""
    actors = {}
    for update in ("torch", "numba"):
        cfg = TD3Config(hidden=(32, 32), learning_starts=100, update=update, batch_size=16)
        actors[update] = TD3Actor(_spaces(), cfg, seed=np.random.SeedSequence(11))
    assert mk.bound_vector(actors["torch"].pi) is None and mk.bound_vector(actors["numba"].pi) is not None
    actors["numba"].set_flat_weights(flat_params(actors["torch"].pi))
    obs = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    for steps in (0, 50, 100, 500, 1000):
        eager, fast = actors["torch"].act_batch(obs, steps), actors["numba"].act_batch(obs, steps)
        assert fast.dtype == np.float32 and fast.shape == (5, 2)
        np.testing.assert_allclose(fast, eager, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(actors["numba"].greedy_batch(obs), actors["torch"].greedy_batch(obs), atol=1e-6)
    assert actors["numba"].act(obs[0], 1000).shape == (2,)


def test_two_learners_averaging_gradients_stay_identical_and_step_as_one():
    """PAL's scheme with the compiled update: two learners on half batches, gradients averaged
    through the shared-memory all-reduce at each hook call (critics, then the policy), hold the
    same bits after every update, and track one learner on the whole batch (no smoothing noise:
    the two draw from one torch generator here, in threads)."""
    cfg = TD3Config(hidden=(16, 16), update="numba", policy_noise=0.0, policy_delay=2)
    whole = TD3Learner(_spaces(), cfg, seed=5)
    pair = [TD3Learner(_spaces(), cfg, seed=5) for _ in range(2)]
    size = sum(p.numel() for m in whole.modules() for p in m.parameters())
    group = SharedAllreduce(mp.get_context("spawn"), 2, size, timeout_s=20)
    for rank, learner in enumerate(pair):
        learner.grad_hook = SharedGradientAverager(copy.copy(group).bind(rank))
    for batch in _batches(6, 32, seed=9):
        whole.learn(batch)
        errors = []

        def half(rank):
            try:
                pair[rank].learn({k: v[rank * 16:(rank + 1) * 16] for k, v in batch.items()})
            except BaseException as err:  # reported to the test's thread
                errors.append(err)

        threads = [threading.Thread(target=half, args=(r,)) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors and not any(t.is_alive() for t in threads), errors
        assert pair[0].digest() == pair[1].digest()
    assert pair[0].grad_hook.calls == 6 + 3
    for a, b in zip(whole.modules(), pair[0].modules()):
        np.testing.assert_allclose(flat_params(b).numpy(), flat_params(a).numpy(), rtol=1e-4, atol=2e-5)


def test_the_first_update_loads_every_kernel():
    """A warm-up of a few updates (impl.rl.common.device.warm_up_learner) pays every kernel's
    loading, however far apart the policy updates: the first update, a critic-only one here,
    loads the policy step's kernels too."""
    learner = TD3Learner(_spaces(), TD3Config(hidden=(8,), update="numba", policy_delay=7), seed=0)
    learner.learn(_batches(1, 8, seed=1)[0])
    assert learner._compiled._loaded
    for kernel in (td3k.critic_gradients, td3k.policy_gradients, mk.clip_and_adam, mk.soft_update):
        assert kernel.signatures, kernel


def test_update_choices_are_checked_before_any_work(monkeypatch):
    assert resolve_update(TD3Config(), "cpu") == "numba"
    assert resolve_update(TD3Config(update="torch"), "cpu") == "torch"
    assert resolve_update(TD3Config(), "cuda") == "torch"
    with pytest.raises(ConfigError, match="update") as err:
        TD3Config.for_env("Pendulum-v1", update="fast")
    assert err.value.field == "update"
    state = torch.get_rng_state()
    with pytest.raises(ConfigError, match="CPU only") as err:
        TD3Learner(_spaces(), TD3Config(update="numba"), seed=0, device="cuda")
    assert (err.value.field, err.value.value) == ("update", "numba")
    assert torch.equal(torch.get_rng_state(), state)  # refused before seeding or building anything

    # and a run's config is refused before any process starts, where a GPU would take the learners
    from replaybench.impl.rl import TrainConfig
    import replaybench.impl.rl.config as config_module

    def no_env(*args, **kwargs):
        raise AssertionError("validate went on past a refused update")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(config_module, "make_env", no_env)
    with pytest.raises(ConfigError, match="CPU only") as err:
        TrainConfig(algo="td3", env="Pendulum-v1", steps=300, device="cuda", overrides={"update": "numba"}).validate()
    assert err.value.field == "update"


def test_a_batch_that_does_not_fit_the_networks_is_refused_before_any_work():
    """The kernels do not check their bounds: the compiled step checks the batch's shapes."""
    learner = TD3Learner(_spaces(), TD3Config(hidden=(8,), update="numba"), seed=0)
    before = learner.digest()
    good = _batches(1, 8, seed=1)[0]
    for field, bad in (("action", good["action"][:, :1]), ("obs", good["obs"][:, :2]), ("reward", good["reward"][:4]),
                       ("next_obs", good["next_obs"][:4])):
        with pytest.raises(ValueError, match="do not fit"):
            learner.learn({**good, field: bad})
    assert learner.digest() == before
    learner.learn(good)
