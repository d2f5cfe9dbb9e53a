"""Parallel Q-learning on a static dataflow: four nodes, fixed ports, two semaphores per round.

Topology, declared before the first step::

    env workers --(SharedVectorEnv arrays)--> server --(staging block)--> replay + learner
         ^                                      |  ^                                |
         +------------ actions ----------------+  +------- weights (flat vector) --+

- **env workers**: :class:`~impl.rl.common.stepping.SharedVectorEnv`, ``actors`` environments over
  ``workers`` processes, stepped in lock step through shared arrays;
- **server** (this process): the actors' policy, one batched epsilon-greedy forward for all
  ``actors`` environments per step, writing each transition into the staging block;
- **staging block**: ``actors x steps_per_round`` transition rows in shared memory (the round's
  port from server to replay: its size is known up front, so nothing is allocated, queued or
  pickled per message);
- **replay + learner** (one process): adds the block to the replay (our prioritized buffer or a
  deque, :mod:`.qlearning`), makes one update, writes the flat weight vector into shared memory.

Per round the server posts ``filled`` and waits on ``weights``; the learner does the opposite.
Those two posts and the env workers' own start/done signals are the whole coordination: no
scheduler decides where a message goes, because where every message goes was fixed at start.

Failure: a learner that raises sends its traceback and exits; the server sees it within
0.2 s and raises RuntimeError with it; a learner whose server died exits on its own; every exit
path joins (then terminates) the learner and closes the env workers, leaving no process or
shared memory behind.
"""

from __future__ import annotations

import multiprocessing as mp
import time
import traceback
from dataclasses import dataclass, field

import numpy as np

from .qlearning import (PQLConfig, QLearner, epsilon_greedy, learn_round, load_weights, make_replay, transition_fields,
                        warm_up)

__all__ = ["PQLResult", "run_pql"]

_DTYPES = {"float32": ("f", np.float32), "int64": ("q", np.int64), "bool": ("b", np.bool_)}


@dataclass
class PQLResult:
    """What one parallel Q-learning run measured: ``seconds`` from the first env step of round
    0 to the weights of the last round (start-up excluded), ``env_steps`` (actors x steps x
    rounds), ``updates`` (rounds whose replay held a mini-batch), the returns of the episodes
    that finished, and the learner's final weights."""

    seconds: float
    rounds: int
    env_steps: int
    updates: int
    returns: list = field(default_factory=list)
    weights: np.ndarray | None = None


def _shared(ctx, fields: dict, rows: int) -> dict:
    """RawArrays for ``rows`` transitions of ``fields`` (no lock: the semaphores order access)."""
    out = {}
    for name, (shape, dtype) in fields.items():
        code, _ = _DTYPES[dtype]
        out[name] = (ctx.RawArray(code, rows * int(np.prod(shape, dtype=np.int64))), (rows, *shape), dtype)
    return out


def _views(arrays: dict) -> dict:
    return {name: np.frombuffer(raw, dtype=_DTYPES[dtype][1]).reshape(shape)
            for name, (raw, shape, dtype) in arrays.items()}


def _learner_main(cfg: PQLConfig, obs_dim: int, n_actions: int, staging, weights_raw, filled, weights_ready,
                  stop, errors) -> None:
    """The replay + learner node (a spawned process)."""
    import torch

    torch.set_num_threads(1)
    parent = mp.parent_process()
    try:
        batch = _views(staging)
        weights = np.frombuffer(weights_raw, dtype=np.float32)
        warm_up(cfg.replay, transition_fields(obs_dim))
        replay = make_replay(cfg.replay, cfg.replay_capacity, transition_fields(obs_dim), seed=cfg.seed + 1)
        learner = QLearner(obs_dim, n_actions, cfg, seed=cfg.seed)
        weights[:] = learner.flat_weights()
        weights_ready.release()
        while True:
            while not filled.acquire(timeout=0.5):
                if parent is not None and not parent.is_alive():
                    return  # the server is gone: nobody will read our weights
            if stop.value:
                return
            learn_round(replay, learner, batch, cfg.batch_size)
            weights[:] = learner.flat_weights()
            weights_ready.release()
    except BaseException:
        errors.put(traceback.format_exc())
        raise


def run_pql(cfg: PQLConfig, progress=None) -> PQLResult:
    """Run ``cfg.rounds`` rounds on the static-dataflow topology (module docstring).

    ``progress(round)`` is called after each round. Raises ConfigError for a bad config before
    any process starts, RuntimeError with the learner's traceback if it fails, TimeoutError if
    it gives no weights within ``cfg.timeout_s``; WorkerFailed from the env workers.
    """
    import torch
    from torch import nn

    from replaybench.impl.rl.algorithms.nets import mlp
    from replaybench.impl.rl.common.stepping import SharedVectorEnv

    cfg.validate()
    torch.set_num_threads(1)
    ctx = mp.get_context("spawn")
    rng = np.random.default_rng(cfg.seed)
    venv = SharedVectorEnv(cfg.env, cfg.actors, cfg.workers, seed=cfg.seed)
    proc = None
    stop = ctx.RawValue("b", 0)
    filled = ctx.Semaphore(0)
    try:
        obs_dim = int(np.prod(venv.obs_shape))
        n_actions = int(venv.single_action_space.n)
        fields = transition_fields(obs_dim)
        rows = cfg.actors * cfg.steps_per_round
        staging = _shared(ctx, fields, rows)
        batch = _views(staging)
        net: nn.Module = mlp([obs_dim, cfg.hidden, n_actions])
        n_params = sum(p.numel() for p in net.parameters())
        weights_raw = ctx.RawArray("f", n_params)
        weights = np.frombuffer(weights_raw, dtype=np.float32)
        weights_ready, errors = ctx.Semaphore(0), ctx.SimpleQueue()
        proc = ctx.Process(target=_learner_main, name="pql-learner", daemon=True,
                           args=(cfg, obs_dim, n_actions, staging, weights_raw, filled, weights_ready, stop, errors))
        proc.start()

        def wait_weights() -> None:
            deadline = time.monotonic() + cfg.timeout_s
            while not weights_ready.acquire(timeout=0.2):
                if not proc.is_alive():
                    err = errors.get() if not errors.empty() else f"exit code {proc.exitcode}"
                    raise RuntimeError(f"the learner process failed:\n{err}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the learner gave no weights within timeout_s={cfg.timeout_s}")
            load_weights(net, weights)

        wait_weights()
        obs = np.asarray(venv.reset(), dtype=np.float32).reshape(cfg.actors, obs_dim)
        a = cfg.actors
        returns, updates = [], 0
        start = time.perf_counter()
        for r in range(cfg.rounds):
            for s in range(cfg.steps_per_round):
                act = epsilon_greedy(net, obs, cfg.epsilon, n_actions, rng)
                nxt, rew, term, trunc = venv.step(act)
                block = slice(s * a, (s + 1) * a)
                batch["obs"][block] = obs
                batch["action"][block] = act
                batch["reward"][block] = rew
                batch["done"][block] = term
                ended = np.asarray(term) | np.asarray(trunc)
                batch["next_obs"][block] = np.asarray(nxt, dtype=np.float32).reshape(a, obs_dim)
                if ended.any():  # the env auto-reset: the transition ends in the episode's last observation
                    final = np.asarray(venv.final_obs, dtype=np.float32).reshape(a, obs_dim)
                    batch["next_obs"][block][ended] = final[ended]
                obs = np.array(nxt, dtype=np.float32).reshape(a, obs_dim)
            filled.release()
            wait_weights()
            updates += int((r + 1) * rows >= cfg.batch_size)
            returns.extend(ret for _, ret, _ in venv.pop_episodes())
            if progress is not None:
                progress(r + 1)
        seconds = time.perf_counter() - start
        return PQLResult(seconds, cfg.rounds, rows * cfg.rounds, updates, returns, weights.copy())
    finally:
        stop.value = 1
        filled.release()
        if proc is not None:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join()
        venv.close()
