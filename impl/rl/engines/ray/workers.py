"""The three kinds of Ray actor of the Ray backend (:mod:`impl.rl.engines.ray.driver`) and the
counters they share.

    ReplayServer   owns the SharedPrioritizedBuffer (our shared-memory buffer and its
                   concurrency policy) and the run's counters; takes the actors' batches,
                   holds them back with the RateLimiter, logs their episodes, keeps the
                   newest weights' object reference
    LearnerWorker  on the server's node: attaches to the buffer and the counters, samples,
                   learns (gradients all-reduced over gloo when L > 1), writes priorities
                   back; learner 0 puts the weights into the object store every
                   ``weight_sync_every`` updates and hands the reference to the server
    ActorWorker    on any node: EnvRunner steps, one batch of ``insert_batch`` rows per
                   ``server.insert`` call (one call in flight: the actor steps its next batch
                   while the server stores the previous one), new weights from the reply

They are plain classes; the backend wraps them with ``ray.remote`` (so this module imports
without Ray, and each class runs as one Ray actor process). The rate limit is the process
backend's :class:`~impl.rl.common.shared_state.RateLimiter` over :class:`RunCounters`, a SharedArena on the
server's node that the server (env steps per actor, written under its insert lock) and the
learners (updates, one slot each) write, so the samples-per-insert bound holds exactly as
there: an actor's insert waits in the server until the learners' backlog allows it.

A dead actor's life is fenced by an epoch: :meth:`ReplayServer.restart` starts a new epoch
for that actor and returns how many of its rows the buffer holds; an insert the dead life
left in flight arrives with the old epoch and is dropped (counted), so no row is stored
twice and none is counted for a life that the driver has written off.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import warnings

import numpy as np
from replaybench.impl.rl import algorithms
from replaybench.impl.rl.common.envs import (
    EnvRunner,
    EpisodeLog,
    TransitionStager,
    make_env,
    transition_fields,
)
from replaybench.impl.rl.common.local_replay import buffer_kwargs
from replaybench.impl.rl.common.processes import free_port
from replaybench.impl.rl.common.profiler import SectionProfiler
from replaybench.impl.rl.common.seeding import RunSeeds
from replaybench.impl.rl.common.shared_state import RateLimiter, Stopped, learners_end_at

__all__ = ["RunCounters", "ReplayServer", "ActorWorker", "LearnerWorker"]


def _node_id() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


def _one_thread() -> None:
    import torch

    torch.set_num_threads(1)  # one core per worker, as in the process backend


class RunCounters:
    """The counters the RateLimiter reads, in one SharedArena on the replay server's node.

    The same view as :class:`~impl.rl.common.shared_state.SharedState` gives the limiter: ``env_steps()``,
    ``updates()``, ``stopped``, ``finishing``, and the ``actor_wait`` / ``learner_wait`` slots it
    adds to. One writer per slot (the server for ``actor_steps``, ``actor_wait``, the stop and
    finish flags, learner 0 for the learners' end, learner r for its update count and wait).
    The server owns (and unlinks) the segment.
    """

    def __init__(self, arena, actors: int, learners: int):
        self.arena = arena
        self.actors, self.learners = int(actors), int(learners)
        a = arena.arrays
        self.flags, self.actor_steps, self.learner_updates = a["flags"], a["actor_steps"], a["learner_updates"]
        self.actor_wait, self.learner_wait = a["actor_wait"], a["learner_wait"]

    @classmethod
    def create(cls, actors: int, learners: int) -> "RunCounters":
        from replaybench.impl.concurrent.shm import SharedArena

        arena = SharedArena.create({"flags": ((3,), "int64"), "actor_steps": ((actors,), "int64"),
                                    "learner_updates": ((learners,), "int64"), "actor_wait": ((actors,), "float64"),
                                    "learner_wait": ((learners,), "float64")}, tag="raycounters")
        return cls(arena, actors, learners)

    @classmethod
    def attach(cls, spec, actors: int, learners: int) -> "RunCounters":
        from replaybench.impl.concurrent.shm import SharedArena

        return cls(SharedArena.attach(spec), actors, learners)

    @property
    def spec(self):
        return self.arena.spec

    @property
    def stopped(self) -> bool:
        return bool(self.flags[0])

    def stop(self) -> None:
        self.flags[0] = 1

    @property
    def finishing(self) -> bool:
        """The run reached its threshold (``stop_at_threshold``): workers end cleanly."""
        return bool(self.flags[1])

    def finish(self) -> None:
        self.flags[1] = 1

    def learners_end_at(self, rank: int, u: int) -> int | None:
        """:func:`~impl.rl.common.shared_state.learners_end_at` over this run's slot."""
        return learners_end_at(self.flags[2:3], rank, u)

    def env_steps(self) -> int:
        return int(self.actor_steps.sum())

    def updates(self) -> int:
        return int(self.learner_updates[0])

    def close(self) -> None:
        self.arena.close()


def _limiter(cfg, acfg, counters: RunCounters) -> RateLimiter:
    return RateLimiter(counters, acfg.updates_per_step, acfg.learning_starts, cfg.ratio_tolerance, cfg.insert_batch)



# ---------------------------------------------------------------------------------------------- server
class ReplayServer:
    """The buffer's owner and the run's bookkeeper (a threaded Ray actor: each actor's insert
    waits on the rate limiter in its own thread; stores are serialised by one lock, and the
    buffer's concurrency policy arbitrates between this process and the learners').

    Episode times are taken when their batch arrives (up to one batch after the episode ended).

    Its two segments (the buffer's and the counters') are unlinked by :meth:`close`, and
    otherwise by a :class:`~impl.concurrent.reaper.SegmentReaper` when this process is gone:
    Ray kills a worker's children with it (driver SIGKILLed, raylet dead), multiprocessing's
    resource tracker included, and the reaper is out of that reach.
    """

    def __init__(self, cfg):
        from replaybench.impl.concurrent import SharedPrioritizedBuffer
        from replaybench.impl.concurrent.reaper import SegmentReaper

        self.cfg = cfg
        self.acfg = acfg = cfg.algo_config()
        env = make_env(cfg.env, algorithms.get(cfg.algo))
        fields = transition_fields(env)
        env.close()
        self.reaper = SegmentReaper()  # before the segments: each is handed over right after its create
        try:
            self.buf = SharedPrioritizedBuffer.create(acfg.buffer_capacity, fields, variant=cfg.buffer,
                                                      policy=cfg.policy, seed=RunSeeds(cfg.seed).buffer,
                                                      **buffer_kwargs(cfg, acfg))
            self.reaper.watch(self.buf.handle.arena.name)
            self.counters = RunCounters.create(cfg.actors, cfg.learners)
            self.reaper.watch(self.counters.spec.name)
        except BaseException:
            for part in (getattr(self, "counters", None), getattr(self, "buf", None), self.reaper):
                if part is not None:
                    part.close()
            raise
        self.limiter = _limiter(cfg, acfg, self.counters)
        self.log = EpisodeLog(cfg.resolved_threshold(), cfg.window)
        self.lock = threading.Lock()
        self.epochs = [0] * cfg.actors
        self.dropped = 0
        self.weights = (0, None)  # (version, ObjectRef)
        self.t0 = time.monotonic()
        self.inserts = 0
        self.kill_at = cfg.failure_point("server-kill", 0)
        self.closed = False

    def placement(self) -> dict:
        """Where learners attach: this node's id, the buffer handle, the counters' spec, a port."""
        return {"node": _node_id(), "buffer": self.buf.handle, "counters": self.counters.spec,
                "port": free_port(), "pid": os.getpid()}

    def ready(self) -> bool:
        self.buf.warm_up()
        return True

    def go(self) -> None:
        self.t0 = time.monotonic()

    def publish(self, version: int, ref: list) -> None:
        """Learner 0: ``ref[0]`` (in a list, so Ray passes the reference, not the array) holds
        the flat policy weights of ``version``."""
        with self.lock:
            if version > self.weights[0]:
                self.weights = (version, ref[0])

    def weights_since(self, have: int):
        """``(version, [ref])`` when weights newer than ``have`` are published, else ``(have, None)``."""
        version, ref = self.weights
        return (version, [ref]) if version > have and ref is not None else (have, None)

    def insert(self, rank: int, epoch: int, batch: dict, episodes: list, have: int) -> dict:
        """Store actor ``rank``'s batch once the rate limiter allows; log its ``episodes``
        ((env_steps, return) pairs). Returns ``{"env_steps", "stopped", "finishing", "weights":
        (version, [ref] or None)}``; a batch from a life that :meth:`restart` ended is dropped.
        With ``stop_at_threshold``, the insert whose episodes reach the threshold sets the
        counters' finish flag: the actors send their staged batch and end, the learners stop
        together (:meth:`RunCounters.learners_end_at`)."""
        n = len(batch["reward"])
        if epoch == self.epochs[rank]:
            try:
                self.limiter.wait_insert(rank, n)
            except Stopped:
                return {"env_steps": self.counters.env_steps(), "stopped": True, "finishing": False,
                        "weights": (have, None)}
        with self.lock:
            if self.closed:
                return {"env_steps": 0, "stopped": True, "finishing": False, "weights": (have, None)}
            if epoch != self.epochs[rank]:
                self.dropped += 1
            else:
                self.buf.add(batch)
                self.counters.actor_steps[rank] += n
                now = time.monotonic() - self.t0
                for steps, ret in episodes:
                    self.log.record(steps, now, ret)
                if self.cfg.stop_at_threshold and self.log.reached:
                    self.counters.finish()
                self.inserts += 1
                if self.kill_at is not None and self.inserts >= self.kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)  # test hook: the server dies mid-run
        return {"env_steps": self.counters.env_steps(), "stopped": self.counters.stopped,
                "finishing": self.counters.finishing, "weights": self.weights_since(have)}

    def restart(self, rank: int) -> tuple[int, int]:
        """The driver saw actor ``rank`` die: end its life (its partial batch is lost, counted
        here) and return ``(new epoch, rows of that actor in the buffer)``."""
        with self.lock:
            self.epochs[rank] += 1
            self.dropped += 1
            return self.epochs[rank], int(self.counters.actor_steps[rank])

    def progress(self) -> tuple:
        return self.counters.env_steps(), self.counters.updates(), self.log.recent_mean()

    def stop(self) -> None:
        self.counters.stop()

    def finish(self) -> dict:
        """What the run measured on this side (call after every worker finished)."""
        final = self.buf.sample(min(1024, len(self.buf)), beta=1.0)
        log = self.log
        return {"actor_steps": self.counters.actor_steps.tolist(), "actor_wait": self.counters.actor_wait.tolist(),
                "learner_wait": self.counters.learner_wait.tolist(), "inserted": self.buf.inserted,
                "lock_wait_s": self.buf.lock_wait_seconds, "final_weight_min": float(np.min(final["weights"])),
                "episodes": log.episodes, "time_to_threshold_s": log.time_to_threshold_s,
                "steps_to_threshold": log.steps_to_threshold, "recent_mean": log.recent_mean(),
                "dropped": self.dropped}

    def close(self) -> None:
        """Stop the run (waiting inserts and learners return), then unlink the buffer and the
        counters and let the reaper go; later inserts answer "stopped". Idempotent."""
        self.counters.stop()
        with self.lock:
            self.closed = True
            self.buf.close()
            self.counters.close()
            self.reaper.close()


# ---------------------------------------------------------------------------------------------- actor
class ActorWorker:
    """Actor ``rank``: steps its environment and sends batches to the server.

    Ray restarts it when its process dies (``max_restarts``); the driver then calls
    :meth:`run` again with the rows still owed. Its env is reseeded per life
    (``SeedSequence([env seed, epoch])``), so a restarted actor does not replay its episodes.
    """

    def __init__(self, cfg, rank: int):
        import ray

        _one_thread()
        self.cfg, self.rank = cfg, int(rank)
        algo = algorithms.get(cfg.algo)
        acfg = cfg.algo_config()
        self.seeds = RunSeeds(cfg.seed).actor(rank)
        self.env = make_env(cfg.env, algo)
        self.actor = algo.actor_cls((self.env.observation_space, self.env.action_space), acfg, self.seeds.explore)
        self.prof = SectionProfiler()
        self.episodes: list = []
        self.runner = EnvRunner([self.env], self.actor, TransitionStager(transition_fields(self.env), cfg.insert_batch),
                                rank, self.prof, lambda steps, ret: self.episodes.append((steps, ret)))
        with warnings.catch_warnings():  # Ray's own deprecated call inside this property
            warnings.simplefilter("ignore", DeprecationWarning)
            first_life = not ray.get_runtime_context().was_current_actor_reconstructed
        self.kill_at = cfg.failure_point("actor-kill", rank) if first_life else None
        self.fail_at = cfg.failure_point("actor", rank)
        self.version = 0

    def node(self) -> tuple[str, int]:
        """(node id, process id) of this life."""
        return _node_id(), os.getpid()

    def _apply(self, weights) -> None:
        import ray

        version, ref = weights
        if ref is not None:
            self.actor.set_flat_weights(np.array(ray.get(ref[0])))  # a writable copy of the read-only store view
            self.version = version
            self.weight_loads += 1

    def _reply(self, pending) -> dict:
        """Wait for an insert's reply; the time blocked (the server's rate limiter, and the
        call's round trip where stepping the next batch did not cover it) goes to "wait"."""
        import ray

        t0 = time.perf_counter()
        reply = ray.get(pending)
        self.prof.add("wait", time.perf_counter() - t0)
        return reply

    def run(self, server, epoch: int, steps: int) -> dict:
        """Step ``steps`` env steps (this life's share), inserting every ``insert_batch`` into
        ``server``; returns this life's stats, or ``{"stopped": True}`` when the server stopped
        the run. When a reply says the run is finishing (its threshold reached), the batch
        staged meanwhile is sent and the life ends with its stats. (The server comes with each call, not to the constructor, so that a restart
        needs no argument kept in the object store.)"""
        import ray

        seed = self.seeds.env if epoch == 0 else int(np.random.SeedSequence([self.seeds.env, epoch])
                                                     .generate_state(1, np.uint32)[0])
        self.runner.reset([seed])
        self.prof.restart()
        self.weight_loads = 0
        self._apply(ray.get(server.weights_since.remote(self.version)))
        stage, replay = self.runner.stage, self.prof.section("replay")  # replay: sending a batch
        pending, base, done, finishing = None, 0, 0, False
        while done < steps and not finishing:
            full = self.runner.step(base + stage.n)
            done += 1
            if full or done == steps:
                if pending is not None:  # the previous insert's reply: the limiter's verdict, new weights
                    reply = self._reply(pending)
                    if reply["stopped"]:
                        return {"stopped": True}
                    base, finishing = reply["env_steps"], reply["finishing"]
                    self._apply(reply["weights"])
                with replay:
                    pending = server.insert.remote(self.rank, epoch, stage.batch(), self.episodes, self.version)
                self.episodes = []
            if self.kill_at is not None and done >= self.kill_at:
                os.kill(os.getpid(), signal.SIGKILL)  # test hook: this process dies mid-run
            if self.fail_at is not None and done >= self.fail_at:
                from replaybench.impl.rl.common.errors import InjectedFailure

                raise InjectedFailure(f"actor {self.rank}: injected failure at env step {done}")
        if pending is not None and self._reply(pending)["stopped"]:
            return {"stopped": True}
        return {"steps": done, "profile": self.prof.breakdown(), "weight_loads": self.weight_loads,
                "node": _node_id()}


# ---------------------------------------------------------------------------------------------- learner
class LearnerWorker:
    """Learner ``rank`` of ``cfg.learners``, on the server's node (it maps the server's buffer)."""

    def __init__(self, cfg, rank: int, placement: dict):
        from replaybench.impl.concurrent import SharedPrioritizedBuffer

        _one_thread()
        self.cfg, self.rank, self.placement = cfg, int(rank), placement
        self.acfg = cfg.algo_config()
        algo = algorithms.get(cfg.algo)
        env = make_env(cfg.env, algo)
        spaces = (env.observation_space, env.action_space)
        env.close()
        self.buf = SharedPrioritizedBuffer.attach(placement["buffer"], seed=RunSeeds(cfg.seed).learner(rank))
        self.counters = RunCounters.attach(placement["counters"], cfg.actors, cfg.learners)
        self.learner = algo.learner_cls(spaces, self.acfg, RunSeeds(cfg.seed).networks)  # same weights on every rank
        self.version = 0

    def setup(self, server) -> int:
        """Join the gloo group (every learner must call it concurrently when L > 1), warm the
        buffer's kernels up; learner 0 publishes the initial weights. Returns the process id."""
        world = self.cfg.learners
        if world > 1:
            from datetime import timedelta

            import torch.distributed as dist
            from replaybench.impl.rl.algorithms.nets import GradientAverager

            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{self.placement['port']}", rank=self.rank,
                                    world_size=world, timeout=timedelta(seconds=max(60.0, self.cfg.join_timeout_s)))
            for module in self.learner.modules():
                for p in module.parameters():
                    dist.broadcast(p.data, src=0)
            self.learner.grad_hook = GradientAverager(world)
        self.buf.warm_up()
        if self.rank == 0:
            import ray

            ray.get(self._publish(server))
        return os.getpid()

    def _publish(self, server):
        import ray

        self.version += 1
        ref = ray.put(self.learner.get_flat_weights().numpy())
        return server.publish.remote(self.version, [ref])

    def run(self, server) -> dict:
        """Do :func:`~impl.rl.config.total_updates` updates under the rate limiter (fewer when the
        run finishes at its threshold: every learner stops at the same count); returns stats."""
        from replaybench.impl.rl.common.errors import InjectedFailure
        from replaybench.impl.rl.common.result import total_updates

        cfg, acfg, counters = self.cfg, self.acfg, self.counters
        limiter = _limiter(cfg, acfg, counters)
        n_updates = total_updates(cfg.steps, acfg.updates_per_step, acfg.learning_starts)
        batch_size = acfg.batch_size // cfg.learners
        fail_at = cfg.failure_point("learner", self.rank)
        actor_ids = np.zeros(cfg.actors, dtype=np.int64)
        prof = SectionProfiler()
        replay, sgd = prof.section("replay"), prof.section("sgd")
        sample_s = 0.0
        done = 0
        try:
            for u in range(n_updates):
                prof.add("wait", limiter.wait_update(self.rank, u))
                if counters.stopped:
                    raise Stopped()
                if counters.finishing:
                    end = counters.learners_end_at(self.rank, u)
                    if end is not None and u >= end:
                        break
                with replay:
                    s0 = time.perf_counter()
                    batch = self.buf.sample(batch_size, beta=acfg.beta(counters.env_steps()))
                    sample_s += time.perf_counter() - s0
                with sgd:
                    _, priorities = self.learner.learn(batch)
                with replay:
                    self.buf.update_priorities(batch["indices"], priorities, batch["stamps"])
                actor_ids += np.bincount(batch["actor"], minlength=cfg.actors)[: cfg.actors]
                counters.learner_updates[self.rank] = done = u + 1
                if self.rank == 0 and (u + 1) % cfg.weight_sync_every == 0:
                    self._publish(server)
                if fail_at is not None and u + 1 >= fail_at:
                    raise InjectedFailure(f"learner {self.rank}: injected failure at update {u + 1}")
        except Stopped:
            return {"stopped": True}
        if cfg.learners > 1:
            import torch.distributed as dist

            dist.barrier()  # nobody tears the group down while a peer still talks to it
        return {"updates": done, "profile": prof.breakdown(), "lock_wait_s": self.buf.lock_wait_seconds,
                "sample_s": sample_s, "digest": self.learner.digest(), "actor_ids": actor_ids.tolist()}
