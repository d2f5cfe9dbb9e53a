"""Learning checks (``make test-slow``): the agents reach their reward thresholds.

DQN on CartPole-v1 with the preset in impl/rl/algorithms/dqn.py must reach a mean return of 475 over 20
consecutive training episodes within BUDGET = 80,000 env steps, on at least NEEDED = 2 of the
SEEDS = (1, 2, 4) (stopping once two have). The sequential loop is deterministic for a fixed
seed on one machine (environment, networks, exploration and buffer sampling all seeded from
it through impl/rl/common/seeding.py; one torch thread), so this is a regression test of the
algorithm, not a statistical one; but another CPU's floating-point kernels change the
trajectory, and DQN on CartPole is not sure of any one seed. On the machine that chose the
seeds, 1, 2 and 4 reached it at 31.8k, 42.7k and 53.1k steps, and 0, 3 and 5 did not (best
20-episode means 470.8 and 468.0 for 0 and 5). On another (a 2-core Xeon VM) seed 1
never did, not even in 200k steps (best 471.4), while 2 and 4 reached it at 20.4k and 38.4k,
and 0, 3 and 5 at 40.7k, 50.2k and 41.5k: so one seed is a test of the machine, two of three
a test of the algorithm. A broken learner reaches it on none. The parallel loop is not
deterministic (actor interleaving), so it is checked by the training suite's return curves,
not here.
"""

from __future__ import annotations

import pytest

from replaybench.impl.rl import TrainConfig, train

pytestmark = pytest.mark.slow

SEEDS = (1, 2, 4)
NEEDED = 2
BUDGET = 80_000  # env steps


def test_dqn_cartpole_reaches_475_over_20_episodes():
    outcomes = {}
    for seed in SEEDS:
        result = train(TrainConfig(algo="dqn", env="CartPole-v1", buffer="kary-aligned", steps=BUDGET, seed=seed,
                                   stop_at_threshold=True))
        eps = result.episodes
        best = max((sum(r for _, _, r in eps[i - 20 : i]) / 20 for i in range(20, len(eps) + 1)), default=0.0)
        outcomes[seed] = (f"reached at {result.steps_to_threshold} steps" if result.reached else
                          f"best 20-episode mean {best:.1f} in {result.env_steps} steps")
        if result.reached:
            assert result.threshold == 475.0 and result.steps_to_threshold <= BUDGET
            assert result.recent_mean(20) >= 475.0
        if sum(o.startswith("reached") for o in outcomes.values()) >= NEEDED:
            return
    pytest.fail(f"DQN reached 475 on fewer than {NEEDED} of seeds {SEEDS}: {outcomes}")
