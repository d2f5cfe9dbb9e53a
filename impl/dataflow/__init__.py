"""Static dataflow: fixed topologies of processes joined by shared memory and semaphores.

The Lingua Franca paper's point (Kwok, Lohstroh, Lee, arXiv 2312.04704) is that RL workloads
have a *fixed* communication pattern, so a runtime that knows the pattern up front avoids the
per-message scheduling and serialisation a dynamic task scheduler (Ray) pays. Here the pattern
is declared by construction: every node (env workers, server, replay, learner) and every port
(a fixed-size shared-memory array) exists before the first step, and a step is a handful of
semaphore posts. Modules:

- :mod:`.qlearning`: the parts the parallel Q-learning benchmark shares between backends (its
  config, the Q-network learner, the two replays: our prioritized buffer or a plain deque);
- :mod:`.pql`: the parallel Q-learning topology (env workers, server, replay, learner);
- :mod:`.policies`: a bank of per-agent policies evaluated in one batched forward (the
  multi-agent inference node).

The training loop's actor side as a dataflow (one server, env workers in lock step, for the
process engine's learners; ``replaybench train --backend dataflow``) is the engine
:mod:`impl.rl.engines.dataflow`.

The env side is :class:`~impl.rl.common.stepping.SharedVectorEnv` (lock-step shared-memory stepping).
"""

from .policies import PolicyBank
from .pql import PQLResult, run_pql
from .qlearning import REPLAYS, DequeReplay, PQLConfig, QLearner, make_replay

__all__ = ["PQLConfig", "PQLResult", "QLearner", "DequeReplay", "REPLAYS", "make_replay", "run_pql",
           "PolicyBank"]
