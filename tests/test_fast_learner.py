"""The compiled DQN update (impl/rl/algorithms/mlp_kernels.py, compiled_step.py) against the
eager torch step it stands in for: same losses, priorities and parameters within float32
rounding on fixed batches; the learner contract kept (grad hook, shared networks, digests)."""

import numpy as np
import pytest
import torch

from replaybench.impl.rl.algorithms.dqn import DQNConfig, DQNLearner, resolve_update
from replaybench.impl.rl.algorithms.nets import flat_params
from replaybench.impl.rl.common.errors import ConfigError

gym = pytest.importorskip("gymnasium")


def _spaces(obs_dim=4, actions=2):
    return (gym.spaces.Box(-1, 1, (obs_dim,), np.float32), gym.spaces.Discrete(actions))


def _batches(n, rows, rng, obs_dim=4, actions=2):
    for _ in range(n):
        yield {"obs": rng.standard_normal((rows, obs_dim)).astype(np.float32),
               "action": rng.integers(0, actions, rows),
               "reward": rng.standard_normal(rows).astype(np.float32),
               "next_obs": rng.standard_normal((rows, obs_dim)).astype(np.float32),
               "done": rng.random(rows) < 0.1,
               "weights": rng.uniform(0.2, 1.0, rows).astype(np.float32)}


@pytest.mark.parametrize("overrides", [
    {},                                                          # CartPole's preset: soft target every update
    {"double_q": False, "max_grad_norm": None, "target_update_every": 3, "tau": 1.0},
    {"max_grad_norm": 0.05, "hidden": (16, 8, 4)},                # clipping at work, three hidden layers
])
def test_the_compiled_update_matches_the_eager_one(overrides):
    """10 updates on fixed batches: each loss and priority vector, and the parameters of both
    networks after them, agree within float32 rounding."""
    cfg = {u: DQNConfig.for_env("CartPole-v1", update=u, **overrides) for u in ("torch", "numba")}
    spaces = _spaces(4, 3)
    eager, fast = (DQNLearner(spaces, cfg[u], seed=7) for u in ("torch", "numba"))
    assert (eager.update, fast.update) == ("torch", "numba")
    assert torch.equal(flat_params(eager.q), flat_params(fast.q))  # the same initial weights
    for batch in _batches(10, 64, np.random.default_rng(3), actions=3):
        loss_e, td_e = eager.learn(batch)
        loss_f, td_f = fast.learn(batch)
        assert loss_f == pytest.approx(loss_e, rel=1e-4, abs=1e-6)
        np.testing.assert_allclose(td_f, td_e, rtol=1e-4, atol=1e-5)
    for a, b in ((eager.q, fast.q), (eager.target, fast.target)):
        np.testing.assert_allclose(flat_params(b).numpy(), flat_params(a).numpy(), rtol=1e-4, atol=2e-5)


def test_a_grad_hook_sees_and_changes_the_gradients():
    """The hook gets the online network's parameters with their gradients between backward and
    the step, in both updates, and what it writes is what the step applies (the L-learner
    all-reduce averages in place there)."""
    seen = {}

    def halve(params):
        params = list(params)
        seen[len(seen)] = [p.grad.clone() for p in params]
        for p in params:
            p.grad.mul_(0.0)  # a zero gradient: Adam leaves the parameters where they are

    batch = next(_batches(1, 32, np.random.default_rng(0)))
    for update in ("torch", "numba"):
        learner = DQNLearner(_spaces(), DQNConfig(hidden=(8,), update=update, target_update_every=1000), seed=1)
        before = flat_params(learner.q)
        learner.grad_hook = halve
        learner.learn(batch)
        assert torch.equal(flat_params(learner.q), before), update
    np.testing.assert_allclose(torch.cat([g.reshape(-1) for g in seen[1]]).numpy(),
                               torch.cat([g.reshape(-1) for g in seen[0]]).numpy(), rtol=1e-4, atol=1e-6)


def test_the_network_is_a_view_of_the_compiled_parameters():
    """An actor sharing the learner's network (the sequential loop) and the flat-weight
    broadcast see every compiled update; equal seeds keep learners bitwise equal."""
    a, b = (DQNLearner(_spaces(), DQNConfig(hidden=(16,), update="numba"), seed=2) for _ in range(2))
    net = a.policy_net
    obs = torch.ones(1, 4)
    before = net(obs).detach().clone()
    batches = list(_batches(3, 16, np.random.default_rng(5)))
    for batch in batches:
        a.learn(batch)
        b.learn(batch)
    assert not torch.equal(net(obs).detach(), before)
    assert torch.equal(a.get_flat_weights(), flat_params(net))
    assert a.digest() == b.digest()


def test_update_choices_are_checked():
    assert resolve_update(DQNConfig(), "cpu") == "numba"
    assert resolve_update(DQNConfig(update="torch"), "cpu") == "torch"
    with pytest.raises(ConfigError, match="update"):
        DQNConfig.for_env("CartPole-v1", update="fast")
    with pytest.raises(ConfigError, match="CPU only"):
        resolve_update(DQNConfig(update="numba"), "cuda")
