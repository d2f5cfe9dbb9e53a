"""Lock-step sampling with random actions: ``n_envs`` environments, one server that sends an
action to each and gathers every result each round (the paper's Gym and Atari benchmarks).

Backends (:data:`BACKENDS`), each constructed with ``(env_id, n_envs, seed, workers)`` and
stepped one round at a time with :meth:`round`:

================  ===========================================================================
``ray``           one ``@ray.remote`` actor per environment, ``ray.get([env.step.remote(a) ...])``
                  per round, as the paper's Ray code drives it (results pickled via the object
                  store)
``dataflow``      ours: :class:`~impl.rl.common.stepping.SharedVectorEnv` over ``workers`` processes
                  (shared-memory arrays, one start/done signal per worker per round)
``sync``          gymnasium ``SyncVectorEnv``: every env in the server's process, the bar any
                  parallel stepping must clear
``async``         gymnasium ``AsyncVectorEnv``: one process per env, pipes, shared-memory obs
``mp-queues``     one process per env, a ``multiprocessing.Queue`` in and one out (pickling
                  per message): the plain baseline
================  ===========================================================================

In every backend the server draws the actions (a seeded numpy generator over the action
space), an environment that ends its episode is reset before the next round, and every env
is made by :func:`make` (:func:`impl.rl.common.envs.make_env`), so they step the same environments. ``workers`` is
used by ``dataflow`` only.
"""

from __future__ import annotations

import multiprocessing as mp
from functools import partial

import numpy as np

__all__ = ["BACKENDS", "make", "random_actions", "open_backend", "Ray", "Dataflow", "Sync", "Async", "MPQueues"]


def random_actions(space, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` uniform actions of a Discrete or Box ``space``."""
    import gymnasium as gym

    if isinstance(space, gym.spaces.Discrete):
        return rng.integers(space.start, space.start + space.n, size=n)
    if isinstance(space, gym.spaces.Box):
        return rng.uniform(space.low, space.high, size=(n, *space.shape)).astype(space.dtype)
    raise ValueError(f"unsupported action space {space!r}: need Discrete or Box")


def make(env_id: str):
    """:func:`impl.rl.common.envs.make_env`: the environment SharedVectorEnv steps (Atari preprocessed
    to 4x84x84 frames, Blackjack's tuple flattened), so every backend steps the same one."""
    from replaybench.impl.rl.common.envs import make_env

    return make_env(env_id)


class _Backend:
    name = ""

    def __init__(self, env_id: str, n_envs: int, seed: int, workers: int):
        self.env_id, self.n_envs, self.seed = env_id, n_envs, seed
        self._rng = np.random.default_rng(seed)
        probe = make(env_id)
        self.action_space = probe.action_space
        probe.close()

    def actions(self) -> np.ndarray:
        return random_actions(self.action_space, self.n_envs, self._rng)

    def round(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class EnvActor:
    """One environment behind Ray (``ray.remote(EnvActor)``) or a queue worker."""

    def __init__(self, env_id: str, seed: int):
        self.env = make(env_id)
        self.env.reset(seed=seed)

    def step(self, action):
        obs, reward, terminated, truncated, _ = self.env.step(action)
        if terminated or truncated:
            obs, _ = self.env.reset()
        return obs, reward, terminated, truncated


class Ray(_Backend):
    name = "ray"

    def __init__(self, env_id, n_envs, seed, workers):
        import ray

        super().__init__(env_id, n_envs, seed, workers)
        actor = ray.remote(EnvActor)
        self._ray = ray
        self._envs = [actor.remote(env_id, seed + i) for i in range(n_envs)]
        ray.get([e.__ray_ready__.remote() for e in self._envs])  # every actor constructed before timing

    def round(self):
        self._ray.get([env.step.remote(a) for env, a in zip(self._envs, self.actions())])

    def close(self):
        for e in self._envs:
            self._ray.kill(e)
        self._envs = []


class Dataflow(_Backend):
    name = "dataflow"

    def __init__(self, env_id, n_envs, seed, workers):
        from replaybench.impl.rl.common.stepping import SharedVectorEnv

        super().__init__(env_id, n_envs, seed, workers)
        self._venv = SharedVectorEnv(env_id, n_envs, workers, seed=seed)
        self._venv.reset()

    def round(self):
        self._venv.step(self.actions())

    def close(self):
        self._venv.close()


class Sync(_Backend):
    name = "sync"

    def _vector(self, env_id, n_envs):
        import gymnasium as gym

        return gym.vector.SyncVectorEnv([partial(make, env_id)] * n_envs)

    def __init__(self, env_id, n_envs, seed, workers):
        super().__init__(env_id, n_envs, seed, workers)
        self._venv = self._vector(env_id, n_envs)
        self._venv.reset(seed=[seed + i for i in range(n_envs)])

    def round(self):
        self._venv.step(self.actions())

    def close(self):
        self._venv.close()


class Async(Sync):
    name = "async"

    def _vector(self, env_id, n_envs):
        import gymnasium as gym

        return gym.vector.AsyncVectorEnv([partial(make, env_id)] * n_envs, shared_memory=True, context="spawn")


def _queue_worker(env_id: str, seed: int, index: int, inbox, outbox) -> None:
    env = EnvActor(env_id, seed)
    while (action := inbox.get()) is not None:
        outbox.put((index, *env.step(action)))


class MPQueues(_Backend):
    name = "mp-queues"

    def __init__(self, env_id, n_envs, seed, workers):
        super().__init__(env_id, n_envs, seed, workers)
        ctx = mp.get_context("spawn")
        self._out = ctx.Queue()
        self._in = [ctx.Queue() for _ in range(n_envs)]
        self._procs = [ctx.Process(target=_queue_worker, args=(env_id, seed + i, i, q, self._out), daemon=True)
                       for i, q in enumerate(self._in)]
        for p in self._procs:
            p.start()
        self.round()  # every worker made its env before timing

    def round(self):
        for q, a in zip(self._in, self.actions()):
            q.put(a)
        for _ in range(self.n_envs):
            self._out.get(timeout=120)

    def close(self):
        for q in self._in:
            q.put(None)
        for p in self._procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
        for q in (*self._in, self._out):
            q.close()
            q.join_thread()
        self._procs = []


#: Backend name -> class, in table order.
BACKENDS = {cls.name: cls for cls in (Ray, Dataflow, Sync, Async, MPQueues)}


def open_backend(name: str, env_id: str, n_envs: int, seed: int, workers: int) -> _Backend:
    """Construct backend ``name`` (a key of :data:`BACKENDS`); ValueError naming it otherwise."""
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {list(BACKENDS)}, got {name!r}")
    return BACKENDS[name](env_id, n_envs, seed, workers)
