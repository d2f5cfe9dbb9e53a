"""The Ray backend of the actor/learner loop: actors anywhere in a Ray cluster, a replay server
owning our shared-memory buffer beside the learners.

    driver (run_ray) ── ray.init (local, or cfg.ray_address)
       ├── ReplayServer      one Ray actor: the SharedPrioritizedBuffer and its policy, the
       │                     RateLimiter's counters, the episode log, the newest weights' ref
       ├── LearnerWorker r   pinned to the server's node (they map its shared memory)
       └── ActorWorker i     scheduled with "SPREAD" on any node, restarted by Ray up to
                             ``cfg.actor_max_restarts`` times when its process dies

(:mod:`impl.rl.engines.ray.workers` has the three classes and the data path.) Batches of
``insert_batch`` rows go actor -> server as Ray calls; the server stores one once the
samples-per-insert rate limit allows (the process backend's RateLimiter, same bounds);
learner 0 puts the weights into the object store every ``weight_sync_every`` updates and
the actors pick the reference up from the server's replies. Learners do exactly
:func:`~impl.rl.config.total_updates` updates, as in the other loops. Wall time runs from the
driver's "go" until the last worker's task returned (so it includes Ray's call latency).

Faults:

- an actor whose process dies (``ray.exceptions.RayActorError``) is restarted by Ray; the
  driver ends that life at the server (:meth:`ReplayServer.restart`: the batch it was
  staging, and any insert of that life arriving later, are dropped and counted in
  ``TrainResult.dropped_batches``) and runs the rows still owed on the new life; more than
  ``actor_max_restarts`` deaths, or an exception raised in an actor, fail the run;
- the server's death ends the run with :class:`~impl.rl.config.WorkerFailed` (worker
  "replay-server"); its segments are unlinked by its reaper (below), and by a cleanup task on
  its node before the driver raises, whichever comes first;
- on every exit path (success, failure, timeout, Ctrl-C) the driver stops the counters,
  kills every Ray actor it made, unlinks the buffer, and shuts down a Ray it started itself;
- when the driver cannot (it was SIGKILLed, or the server's raylet died), Ray kills the
  server, and the server's :class:`~impl.concurrent.reaper.SegmentReaper` (a process out of
  the reach of Ray's kill of a worker's children, which takes multiprocessing's resource
  tracker with it) unlinks both segments as soon as the server's process is gone. Ray
  itself ends the rest: the actors and learners of a dead driver's job, and every worker of
  a local cluster whose driver or raylet died.

The scheme is ownership, as in the process backend (the creating process owns a segment;
its tracker unlinks it when it is gone): the server is the one process that creates
segments, learners only map them by name, so one watcher of one process covers a run.
(Unlinking right after the learners attached would leave the whole start-up, seconds to
minutes on a loaded machine, uncovered.)
"""

from __future__ import annotations

import socket
import threading
import time
from typing import TYPE_CHECKING

from replaybench.impl.machine import usable_cores
from replaybench.impl.rl.common.errors import ConfigError, WorkerFailed
from replaybench.impl.rl.common.processes import PROGRESS_EVERY_S, share
from replaybench.impl.rl.common.result import TrainResult

if TYPE_CHECKING:  # the config module imports the engines to check a run against them
    from replaybench.impl.rl.config import TrainConfig

__all__ = ["run_ray", "check", "unreachable_reason"]

STARTUP_TIMEOUT_S = 180.0  # Ray worker start, imports and numba cache loads, on a loaded 2-core machine
ACTOR_CPUS = 1  # each actor asks Ray for one CPU: with SPREAD, that spreads them over the nodes
ADDRESS_TIMEOUT_S = 5.0  # a cluster's GCS port answers a TCP connect in milliseconds, even across a WAN


def check(cfg: TrainConfig, acfg) -> None:
    """The Ray engine's own checks: its actors step one environment each
    (:mod:`impl.rl.engines.ray.workers`), its learners run on the CPU (``device`` "cpu"), and a given ``ray_address`` answers (bounded by
    ADDRESS_TIMEOUT_S). Raises ConfigError naming the field."""
    if cfg.envs_per_actor != 1:
        raise ConfigError("envs_per_actor", cfg.envs_per_actor, f"backend 'ray' steps one environment per "
                                                                f"actor, got envs_per_actor {cfg.envs_per_actor}")
    if cfg.device != "cpu":  # its learners are Ray actors on any node: they build their networks on the CPU
        raise ConfigError("device", cfg.device, f"backend 'ray' runs its learners on the CPU: device must be "
                                                f"'cpu', got {cfg.device!r}")
    if cfg.ray_address is not None:  # ray.init would retry for minutes, saying nothing
        reason = unreachable_reason(cfg.ray_address)
        if reason is not None:
            raise ConfigError("ray_address", cfg.ray_address,
                              f"ray_address {cfg.ray_address!r} is unreachable: {reason}")


def unreachable_reason(address: str, timeout_s: float | None = None) -> str | None:
    """Why no Ray cluster can answer at ``address`` ("host:port" or "ray://host:port"), or
    None when that port takes a TCP connection within ``timeout_s`` (default
    ADDRESS_TIMEOUT_S). Other forms ("auto", "local", a malformed one) give None: ``ray.init``
    resolves or refuses those itself within milliseconds.

    Why: for an address nobody answers at, ``ray.init`` retries for about 14 minutes (20
    attempts of ~40 s each, measured with Ray 2.60) and says nothing. This check is bounded by
    ``timeout_s`` whatever the network does (name lookup included: it runs in a daemon
    thread, which a lookup hanging past the bound leaves behind until it returns). It does
    not tell a Ray GCS from another server on that port: ``ray.init`` then fails on its own,
    after its 20 attempts (~20 s against a server that refuses the calls at once).
    """
    timeout_s = ADDRESS_TIMEOUT_S if timeout_s is None else timeout_s
    rest = address.strip()
    rest = rest[len("ray://"):] if rest.startswith("ray://") else rest
    host, sep, port_text = rest.rpartition(":")
    host = host.strip("[]")  # "[::1]:6379"
    if not sep or not host or not port_text.isdigit():
        return None
    port = int(port_text)
    if not 0 < port < 65536:
        return f"port {port} is not a TCP port (1..65535)"
    outcome: list = []

    def connect():
        try:
            socket.create_connection((host, port), timeout=timeout_s).close()
            outcome.append(None)
        except OSError as err:  # refused, unreachable, name unknown, timed out
            outcome.append(err)

    probe = threading.Thread(target=connect, name=f"ray-address-probe {address}", daemon=True)
    probe.start()
    probe.join(timeout_s)
    if not outcome:
        return f"no answer from {host}:{port} within {timeout_s:g} s"
    if outcome[0] is not None:
        return f"no Ray cluster answers at {host}:{port} ({outcome[0]})"
    return None



class _RayRun:
    """One run's Ray actors and what the driver learned of them; :meth:`teardown` frees them all."""

    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.server = None
        self.placement: dict | None = None
        self.learners: list = []
        self.actors: list = []
        self.restarts = [0] * cfg.actors
        self.worker_pids: dict[str, int] = {}  # worker name -> process id (an actor's current life)
        self.dead_pids: list[int] = []  # earlier lives of restarted actors

    # ------------------------------------------------------------------------------ start
    def start(self) -> None:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        from replaybench.impl.rl.engines.ray.workers import (
            ActorWorker,
            LearnerWorker,
            ReplayServer,
        )

        cfg = self.cfg
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        self.server = ray.remote(ReplayServer).options(
            num_cpus=0, max_concurrency=cfg.actors + cfg.learners + 8, max_restarts=0).remote(cfg)
        # the actors need nothing from the server to start: their processes come up meanwhile
        self.actors = [ray.remote(ActorWorker).options(num_cpus=ACTOR_CPUS, scheduling_strategy="SPREAD",
                                                       max_restarts=cfg.actor_max_restarts, max_task_retries=0)
                       .remote(cfg, i) for i in range(cfg.actors)]
        self.placement = self._get(self.server.placement.remote(), "replay-server", STARTUP_TIMEOUT_S)
        beside = NodeAffinitySchedulingStrategy(self.placement["node"], soft=False)
        self.learners = [ray.remote(LearnerWorker).options(num_cpus=0, scheduling_strategy=beside, max_restarts=0)
                         .remote(cfg, r, self.placement) for r in range(cfg.learners)]
        waits = ([(self.server.ready.remote(), "replay-server")]
                 + [(w.setup.remote(self.server), f"learner-{r}") for r, w in enumerate(self.learners)]
                 + [(w.node.remote(), f"actor-{i}") for i, w in enumerate(self.actors)])
        for ref, name in waits:
            answer = self._get(ref, name, max(1.0, deadline - time.monotonic()))
            if name != "replay-server":
                self.worker_pids[name] = answer[1] if name.startswith("actor") else answer

    def _get(self, ref, name: str, timeout: float | None = None):
        """``ray.get(ref)``, with a failure reported as WorkerFailed naming the worker."""
        import ray

        try:
            return ray.get(ref, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise WorkerFailed(name, f"{name} not ready after {timeout:.0f} s (does the cluster have "
                                     f"{ACTOR_CPUS} free CPU per actor?)") from None
        except ray.exceptions.RayError as err:
            if self.server is not None:
                self._check_server()
            raise WorkerFailed(name, str(err)) from None

    def _check_server(self) -> tuple:
        """The server's ``progress()``; WorkerFailed("replay-server") when it is dead or does
        not answer within 30 s."""
        import ray

        try:
            return ray.get(self.server.progress.remote(), timeout=30.0)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as err:
            raise WorkerFailed("replay-server", "the replay server (the Ray actor owning the shared buffer) died or "
                                                f"stopped answering; the run cannot go on without its buffer: {err}") \
                from None

    # ------------------------------------------------------------------------------ run
    def run(self, progress) -> tuple[dict, float]:
        """Go, wait for every task (restarting dead actors' shares), return (stats, wall seconds)."""
        import ray

        cfg = self.cfg
        ray.get(self.server.go.remote())
        t0 = time.monotonic()
        tasks = {w.run.remote(self.server): ("learner", r) for r, w in enumerate(self.learners)}
        tasks.update({w.run.remote(self.server, 0, share(cfg.steps, cfg.actors, i)): ("actor", i)
                      for i, w in enumerate(self.actors)})
        stats: dict = {}
        next_report = 0.0
        while tasks:
            done, _ = ray.wait(list(tasks), num_returns=1, timeout=PROGRESS_EVERY_S)
            for ref in done:
                role, rank = tasks.pop(ref)
                try:
                    stats[(role, rank)] = ray.get(ref)
                except ray.exceptions.RayActorError as err:
                    self._check_server()
                    if role != "actor" or self.restarts[rank] >= cfg.actor_max_restarts:
                        raise WorkerFailed(f"{role}-{rank}", f"process died: {err}") from None
                    tasks[self._restart(rank)] = ("actor", rank)
                except ray.exceptions.RayError as err:
                    self._check_server()
                    raise WorkerFailed(f"{role}-{rank}", str(err)) from None
            now = time.monotonic()
            if now >= next_report:
                next_report = now + PROGRESS_EVERY_S
                steps, updates, recent = self._check_server()
                if progress is not None:
                    progress(steps, updates, recent, ())  # the episodes stay on the server until the end
            if cfg.timeout_s is not None and now - t0 > cfg.timeout_s:
                raise WorkerFailed("parent", f"run passed its {cfg.timeout_s} s limit")
        wall = time.monotonic() - t0
        stopped = [f"{role}-{rank}" for (role, rank), s in stats.items() if s.get("stopped")]
        if stopped:
            raise WorkerFailed(stopped[0], "stopped by the replay server before its share was done")
        return stats, wall

    def pids(self) -> tuple:
        """The server's process id (the creator's pid names its /dev/shm segments), then the
        workers' (every life of an actor that was restarted)."""
        server = (self.placement["pid"],) if self.placement is not None else ()
        return server + tuple(self.worker_pids.values()) + tuple(self.dead_pids)

    def _restart(self, rank: int):
        """Actor ``rank``'s process died (Ray restarts it): end that life at the server, wait
        for the new one, and start it on the rows still owed; returns the new task's ref."""
        import ray

        self.restarts[rank] += 1
        epoch, stored = self._get(self.server.restart.remote(rank), "replay-server", 60.0)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:  # a call before the restart is done fails with ActorUnavailableError: retry
            try:
                _, pid = ray.get(self.actors[rank].node.remote(), timeout=max(1.0, deadline - time.monotonic()))
                self.dead_pids.append(self.worker_pids[f"actor-{rank}"])
                self.worker_pids[f"actor-{rank}"] = pid
                break
            except ray.exceptions.ActorUnavailableError:
                if time.monotonic() > deadline:
                    raise WorkerFailed(f"actor-{rank}", f"not restarted within {STARTUP_TIMEOUT_S} s") from None
                time.sleep(0.1)
            except ray.exceptions.RayError as err:
                raise WorkerFailed(f"actor-{rank}", f"could not be restarted ({self.restarts[rank]} deaths, "
                                                    f"max_restarts {self.cfg.actor_max_restarts}): {err}") from None
        owed = share(self.cfg.steps, self.cfg.actors, rank) - stored
        return self.actors[rank].run.remote(self.server, epoch, owed)

    # ------------------------------------------------------------------------------ teardown
    def teardown(self) -> None:
        """Stop, unlink the server's segments, kill every Ray actor of the run (idempotent)."""
        import ray

        closed = False
        if self.server is not None:
            try:
                ray.get(self.server.close.remote(), timeout=30.0)  # stop flag, then unlink
                closed = True
            except ray.exceptions.RayError:
                pass
        for handle in [*self.actors, *self.learners, *([self.server] if self.server is not None else [])]:
            ray.kill(handle, no_restart=True)  # a dead actor's kill is a no-op
        self.actors, self.learners = [], []
        if self.server is not None and not closed and self.placement is not None:
            self._remove_segments()
        self.server = None

    def _remove_segments(self) -> None:
        """The server died: unlink its segments with a task on its node, so they are gone when
        the driver raises (its reaper does the same as soon as it sees the server gone; the
        first one finds them)."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from replaybench.impl.concurrent.reaper import unlink_segments

        names = [self.placement["buffer"].arena.name, self.placement["counters"].name]
        task = ray.remote(unlink_segments).options(
            num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(self.placement["node"], soft=True))
        try:
            ray.get(task.remote(names), timeout=60.0)
        except ray.exceptions.RayError:
            pass  # the node is gone with its /dev/shm


def run_ray(cfg: TrainConfig, progress=None) -> TrainResult:
    """Run ``cfg`` (``backend="ray"``) on a Ray cluster: ``cfg.ray_address``'s, or one started
    here for the run (``ray.init`` with as many CPUs as the machine has, at least one per
    actor; beside any other Ray on the machine, never joining it) and shut down after it; a
    Ray already initialised in this process is used as is.

    ``progress(env_steps, updates, recent_mean_return, episodes)`` (see :func:`~impl.rl.train`) is
    called about every 0.25 s. Raises
    ConfigError before anything starts for a bad ``cfg`` (Ray missing included); WorkerFailed
    when a worker raised, the replay server died, an actor died more than
    ``actor_max_restarts`` times, the workers were not ready within STARTUP_TIMEOUT_S or the
    run passed ``cfg.timeout_s``. Every Ray actor of the run is killed and the buffer unlinked
    by then.
    """
    acfg = cfg.validate()
    if cfg.backend != "ray":
        raise ConfigError("backend", cfg.backend, f"run_ray runs backend 'ray', got {cfg.backend!r}")
    import ray

    own = not ray.is_initialized()
    if own:
        local = {"num_cpus": max(usable_cores(), cfg.actors), "include_dashboard": False}
        # "local": a Ray of its own even when another runs on this machine (address None would
        # join that one, found by its processes, and refuse num_cpus)
        ray.init(address=cfg.ray_address or "local", logging_level="error", **({} if cfg.ray_address else local))
    run = _RayRun(cfg)
    try:
        try:
            run.start()
            stats, wall = run.run(progress)
            server = ray.get(run.server.finish.remote())
        except WorkerFailed as err:
            err.pids = run.pids()
            raise
        finally:
            run.teardown()
    finally:
        if own:
            ray.shutdown()
    if progress is not None:
        progress(sum(server["actor_steps"]), stats[("learner", 0)]["updates"], server["recent_mean"],
                 server["episodes"])
    result = _result(cfg, acfg, stats, server, wall, run.restarts)
    result.worker_pids = list(run.pids())
    return result


def _result(cfg, acfg, stats: dict, server: dict, wall: float, restarts: list) -> TrainResult:
    actors = [stats[("actor", i)] for i in range(cfg.actors)]
    learners = [stats[("learner", r)] for r in range(cfg.learners)]
    return TrainResult.from_workers(
        actors, learners, engine="ray", env_steps=sum(server["actor_steps"]), wall_s=wall,
        episodes=server["episodes"], threshold=cfg.resolved_threshold(), window=cfg.window,
        time_to_threshold_s=server["time_to_threshold_s"], steps_to_threshold=server["steps_to_threshold"],
        actor_wait_s=sum(server["actor_wait"]), learner_wait_s=sum(server["learner_wait"]),
        buffer_lock_wait_s=sum(s["lock_wait_s"] for s in learners) + server["lock_wait_s"],
        actor_steps=server["actor_steps"], inserted=server["inserted"], final_weight_min=server["final_weight_min"],
        actor_nodes=[s["node"] for s in actors], actor_restarts=sum(restarts), dropped_batches=server["dropped"])
