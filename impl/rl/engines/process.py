"""A actor processes and L learner processes over one shared-memory prioritized buffer.

    parent ── creates SharedPrioritizedBuffer (owner), SharedState, SharedWeights, a queue;
       │      starts the workers, waits for "ready" from all, then says "go" (the clock starts)
       ├── actor i (A of them)      EnvRunner.step over envs_per_actor = E environments with a
       │     CPU copy of the policy (1 torch thread, ONE batched forward per vector step);
       │     stages ~insert_batch transitions (whole vector steps), waits on the rate limiter,
       │     buffer.add; refreshes its weights from SharedWeights when the version changed;
       │     sends its finished episodes to the parent's log in one message per 50 ms
       │     (impl.rl.common.episode_outbox), the rest on every exit
       └── learner r (L of them)    waits on the rate limiter, samples batch_size // L,
             learn() with gradients averaged across the learners (L > 1: PAL's scheme, over
             shared memory, impl.rl.common.allreduce) on TrainConfig.device
             (samples reach it through pinned memory: impl.rl.common.device_feed),
             update_priorities (with TrainConfig.priority_lag, once the next update is queued:
             impl.rl.common.priority_writeback);
             learner 0 publishes the policy weights every weight_sync_every updates; after the
             last update (the clock stopped) it times its replay calls alone, at its own pace
             in the run (its gradient step and its mean wait between them, untimed), once the
             actors are done, one learner at a time (impl.rl.common.replay_timing)

Ratio control (:class:`~impl.rl.common.shared_state.RateLimiter`): learners never run ahead of
``updates_per_step * (env_steps - learning_starts)`` and actors wait when the learners' backlog
passes ``ratio_tolerance``; both record the time they waited. Learners do exactly
:func:`~impl.rl.config.total_updates` updates, the same number as the sequential loop.

Seeds: :class:`~impl.rl.common.seeding.RunSeeds` gives each actor its env, exploration and
buffer-handle streams, each learner its buffer-handle stream, and every learner the same torch
seed. Only ``TrainConfig`` travels to the workers; each derives its own seeds from it.

Learners (L > 1): every learner starts from the same seeded weights (learner 0's are broadcast
to make sure), samples its own batch of ``batch_size // L`` rows from the shared buffer, writes
its own priority updates to it, and averages its gradients with the others' before each
optimizer step (:class:`~impl.rl.common.allreduce.SharedAllreduce`: a reduce-scatter in rank
order, so every learner gets the same bits and all hold identical weights after every update).
Learner 0 publishes the weights the actors read. A learner that dies is seen by the parent,
which stops the run: its peers leave the all-reduce's wait on the stop flag; a learner that
hangs (or is stopped) makes the others' wait end after ``max(60, join_timeout_s)`` seconds with
:class:`~impl.rl.common.allreduce.AllreduceTimeout` naming it, or, should the run's own
``timeout_s`` come first, the parent's timeout names it (it reads who waits for whom,
:meth:`~impl.rl.common.allreduce.SharedAllreduce.stall`). With L = 1 there is no hook:
the learner runs exactly as it did before the all-reduce existed.

Stop at the threshold (``cfg.stop_at_threshold``): once the parent's episode log reaches the
threshold (the mean of the last ``window`` training episodes), it sets the shared "finishing"
flag. Rate-limiter waits end at once; each actor stops at its next insert boundary (nothing
staged is lost); the learners stop together at the update count learner 0 fixes
(:meth:`~impl.rl.common.shared_state.SharedState.learners_end_at`: one more than the update it
was at, so no learner is left alone in an all-reduce). Every worker then reports its stats as
at the end of its share: the result counts the env steps and updates actually done.

Exit paths: each worker reports ``done`` (or ``error`` with its traceback) on a queue and
closes its attachment to the buffer. The parent watches the queue and the processes' exit
codes; on an error, a death without a report, a timeout or Ctrl-C it sets the stop flag (every
wait loop checks it), joins with a timeout, terminates and then kills what is left, and in a
``finally`` closes (unlinks) the buffer; the counters and weights live in anonymous shared
memory that vanishes with the last process. A failed worker surfaces as
:class:`~impl.rl.config.WorkerFailed` carrying the worker's traceback.

The lifecycle (:func:`run_workers`) takes the actor side as a :class:`Role`: the A actor
processes here, one server process in the static-dataflow backend (:mod:`impl.rl.engines.dataflow`).
"""

from __future__ import annotations

import functools
import queue as queue_mod
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from replaybench.impl.rl import algorithms
from replaybench.impl.rl.algorithms.base import LEARNER_FIELDS
from replaybench.impl.rl.common.device import resolve_device, warm_up_learner
from replaybench.impl.rl.common.device_feed import PinnedBatchFeed
from replaybench.impl.rl.common.envs import (
    EnvRunner,
    EpisodeLog,
    TransitionStager,
    make_env,
    stage_rows,
    transition_fields,
)
from replaybench.impl.rl.common.episode_outbox import EpisodeOutbox
from replaybench.impl.rl.common.errors import ConfigError, InjectedFailure, WorkerFailed
from replaybench.impl.rl.common.local_replay import buffer_kwargs
from replaybench.impl.rl.common.allreduce import AllreduceStall, SharedAllreduce, SharedGradientAverager
from replaybench.impl.rl.common.priority_writeback import PriorityWriteBack
from replaybench.impl.rl.common.processes import PROGRESS_EVERY_S, share
from replaybench.impl.rl.common.profiler import SectionProfiler
from replaybench.impl.rl.common.replay_timing import ALONE_BUDGET_S, ALONE_CALLS, ReplayParts, replay_alone
from replaybench.impl.rl.common.result import TrainResult, smallest_weight, total_updates
from replaybench.impl.rl.common.seeding import RunSeeds
from replaybench.impl.rl.common.snapshots import SnapshotLog
from replaybench.impl.rl.common.shared_state import (
    RateLimiter,
    SharedState,
    SharedWeights,
    Stopped,
)

if TYPE_CHECKING:  # the config module imports the engines to check a run against them
    from replaybench.impl.rl.config import TrainConfig

__all__ = ["run_parallel", "run_workers", "Role", "WorkerRun", "worker_result"]

STARTUP_TIMEOUT_S = 180.0  # imports and numba cache loads, on a loaded 2-core machine



# ---------------------------------------------------------------------------------------------- workers
def _actor_loop(cfg: TrainConfig, rank: int, buf, state: SharedState, weights: SharedWeights, out) -> dict:
    algo = algorithms.get(cfg.algo)
    acfg = cfg.algo_config()
    seeds = RunSeeds(cfg.seed).actor(rank)
    n_envs = cfg.envs_per_actor
    envs = []
    outbox = EpisodeOutbox(out)
    try:
        envs.extend(make_env(cfg.env, algo) for _ in range(n_envs))
        spaces = (envs[0].observation_space, envs[0].action_space)
        fields = transition_fields(envs[0])
        actor = algo.actor_cls(spaces, acfg, seeds.explore)
        prof = SectionProfiler()
        rows = stage_rows(cfg.insert_batch, n_envs)
        runner = EnvRunner(envs, actor, TransitionStager(fields, rows), rank, prof,
                           lambda steps, ret: outbox.add(steps, time.monotonic() - t0, ret))
        stage = runner.stage
        limiter = RateLimiter(state, acfg.updates_per_step, acfg.learning_starts, cfg.ratio_tolerance, rows)
        fail_at = cfg.failure_point("actor", rank)
        my_steps = share(cfg.steps, state.actors, rank)
        replay = prof.section("replay")
        buf.warm_up()
        out.put(("ready", f"actor-{rank}"))
        t0 = state.wait_for_go()
        prof.restart()

        have_version, weight_loads, done, base = 0, 0, 0, 0
        runner.reset([seeds.env_seed(j) for j in range(n_envs)])
        while done < my_steps:
            if stage.n == 0:  # start of a batch: hold the ratio, refresh the policy, send due episodes
                outbox.poll()
                n = min(rows, my_steps - done)
                prof.add("wait", limiter.wait_insert(rank, n))
                if state.stopped:
                    raise Stopped()
                if state.finishing:  # the run reached its threshold: nothing is staged here
                    break
                fresh = weights.read_if_newer(have_version)
                if fresh is not None:
                    have_version = fresh[0]
                    actor.set_flat_weights(fresh[1])
                    weight_loads += 1
                base = state.env_steps()
            k = min(n_envs, my_steps - done)
            full = runner.step(base + stage.n, k)
            done += k
            if full or done == my_steps:
                with replay:
                    batch = stage.batch()
                    buf.add(batch)
                state.actor_steps[rank] += len(batch["reward"])
            if fail_at is not None and done >= fail_at:
                raise InjectedFailure(f"actor {rank}: injected failure at env step {done}")
        end = time.monotonic() - t0
        return {"role": "actor", "rank": rank, "steps": done, "end_s": end, "profile": prof.breakdown(),
                "wait_s": float(state.actor_wait[rank]), "lock_wait_s": buf.lock_wait_seconds,
                "weight_loads": weight_loads}
    finally:
        try:
            outbox.flush()  # every exit, an error's or a stop's too: the parent gets each finished episode
        finally:
            for env in envs:
                env.close()


def _replay_alone(cfg, rank: int, group: SharedAllreduce | None, buf, state: SharedState, batch_size: int,
                  beta: float, priorities, n_updates: int, learner, pause_s: float) -> dict | None:
    """The learner's replay calls timed alone (:func:`~impl.rl.common.replay_timing.replay_alone`),
    after the timed part: once every actor has inserted its last step (waited for at most
    ``ALONE_BUDGET_S``; the stop flag ends the wait), and one learner after another (a barrier
    between turns), so no other process touches the buffer meanwhile. At the run's pace:
    ``learner``'s own gradient step between each sample and its update, and ``pause_s`` (its
    mean wait per update in the run) before each call. Those steps change the learner's weights
    (read its digest before) and run without the gradient all-reduce (its peers wait at the
    barrier meanwhile; the weights are not used after this). None without updates.
    ``group``: the learners' all-reduce, whose barrier separates the turns (None: one learner)."""
    deadline = time.monotonic() + ALONE_BUDGET_S
    while (state.env_steps() < cfg.steps and not state.stopped and not state.finishing
           and time.monotonic() < deadline):
        time.sleep(0.001)
    alone = None
    for turn in range(1 if group is None else group.world):  # every rank meets every barrier
        if turn == rank and priorities is not None and n_updates > 0 and not state.stopped:
            learner.grad_hook = None
            alone = replay_alone(buf, batch_size, beta, priorities, min(ALONE_CALLS, n_updates),
                                 learn=lambda batch: learner.learn(batch)[1], pause_s=pause_s)
        if group is not None:
            group.barrier()
    return alone


def _learner_loop(cfg: TrainConfig, rank: int, buf, state: SharedState, weights: SharedWeights, out, *,
                  group: SharedAllreduce | None = None) -> dict:
    """Learner ``rank``'s updates (module docstring); ``group``: the learners' all-reduce, None
    for one learner."""
    import torch

    algo = algorithms.get(cfg.algo)
    acfg = cfg.algo_config()
    env = make_env(cfg.env, algo)
    spaces = (env.observation_space, env.action_space)
    env.close()
    world = state.learners
    if world > 1:
        group.bind(rank, stopped=lambda: state.stopped)
    device = resolve_device(cfg.device)
    batch_size = acfg.batch_size // world
    template = buf.sample_out(batch_size)
    warmup_s = warm_up_learner(algo.learner_cls, spaces, acfg, RunSeeds(cfg.seed).networks, device,
                               {f: np.zeros_like(template[f]) for f in LEARNER_FIELDS})
    learner = algo.learner_cls(spaces, acfg, RunSeeds(cfg.seed).networks,  # every rank: same initial weights
                               device=device)
    if world > 1:
        for module in learner.modules():  # and make sure of it: learner 0's, bit for bit
            for p in module.parameters():
                flat = p.data.reshape(-1).to("cpu", torch.float32, copy=True)
                p.data.copy_(torch.from_numpy(group.broadcast(flat.numpy())).view_as(p.data))
        learner.grad_hook = SharedGradientAverager(group)
    if rank == 0:
        weights.publish(learner.get_flat_weights())
    limiter = RateLimiter(state, acfg.updates_per_step, acfg.learning_starts, cfg.ratio_tolerance,
                          stage_rows(cfg.insert_batch, cfg.envs_per_actor))
    fail_at = cfg.failure_point("learner", rank)
    n_updates = total_updates(cfg.steps, acfg.updates_per_step, acfg.learning_starts)
    actor_ids = np.zeros(state.actors, dtype=np.int64)
    prof = SectionProfiler()
    replay, sgd = prof.section("replay"), prof.section("sgd")
    buf.warm_up()
    out.put(("ready", f"learner-{rank}"))
    t0 = state.wait_for_go()
    prof.restart()

    parts = ReplayParts(buf)
    parts.start()
    paced_wait = 0.0  # the waits for updates 2..n: the run's pace, without the wait for learning_starts
    draw = _SampleSource(cfg, rank, buf, batch_size, device)
    writeback = PriorityWriteBack(buf, cfg.priority_lag, sgd, replay, parts)
    snaps = SnapshotLog(cfg.snapshot_every if rank == 0 else 0)
    done = 0  # updates done: n_updates, or fewer when the run ends early (state.finishing)
    try:
        for u in range(n_updates):
            waited = limiter.wait_update(rank, u)
            prof.add("wait", waited)
            if u > 0:
                paced_wait += waited
            if state.stopped:
                raise Stopped()
            if state.finishing:
                end = state.learners_end_at(rank, u)
                if end is not None and u >= end:
                    break
            beta = acfg.beta(state.env_steps())  # bookkeeping (a sum over the actors' counters), not replay
            with replay:
                s0, c0 = time.perf_counter(), time.thread_time()
                batch = draw.take(beta, u + 1 < n_updates)
                parts.cpu_s += time.thread_time() - c0
                parts.sample_s += time.perf_counter() - s0
            with sgd:
                pending = learner.learn_async(batch)
            writeback.push(batch, pending)  # this update's priorities, or (priority_lag) the last one's
            actor_ids += np.bincount(batch["actor"], minlength=state.actors)[: state.actors]
            state.learner_updates[rank] = u + 1
            if rank == 0 and (u + 1) % cfg.weight_sync_every == 0:
                weights.publish(learner.get_flat_weights())
            if snaps.due(u + 1):  # the clock is the run's (since "go"), the env steps all actors'
                snaps.take(time.monotonic() - t0, state.env_steps(), u + 1, learner.get_flat_weights())
            done = u + 1
            if fail_at is not None and u + 1 >= fail_at:
                raise InjectedFailure(f"learner {rank}: injected failure at update {u + 1}")
        writeback.flush()  # the last update's, with priority_lag
    finally:
        lock_wait = draw.close()
    end = time.monotonic() - t0
    if rank == 0 and cfg.snapshot_every:
        snaps.take(end, state.env_steps(), done, learner.get_flat_weights())
    profile = prof.breakdown()
    in_run = parts.finish(profile["replay"])
    if rank > 0:  # the redraw count is the buffer's, not this learner's: learner 0 reports it for all
        in_run["redrawn_rows"] = 0
    priorities = writeback.last
    lock_wait += buf.lock_wait_seconds
    digest = learner.digest()  # before the calls alone: their gradient steps change the weights
    alone = _replay_alone(cfg, rank, group, buf, state, batch_size, acfg.beta(state.env_steps()), priorities,
                          done, learner, paced_wait / (done - 1) if done > 1 else 0.0)
    return {"role": "learner", "rank": rank, "updates": done, "end_s": end, "profile": profile,
            "wait_s": float(state.learner_wait[rank]), "lock_wait_s": lock_wait,
            "sample_s": in_run["sample"], "replay_parts": in_run, "replay_alone": alone,
            "digest": digest, "actor_ids": actor_ids.tolist(), "warmup_s": warmup_s, "snapshots": snaps.snapshots}


class _SampleSource:
    """A learner's samples, into preallocated outputs (no allocation per update); with
    ``cfg.learner_prefetch`` the next one is drawn by a helper thread, with its own attachment
    of the buffer (an object's generator and lock statistics belong to one thread), while the
    caller's update runs. Either way the draws come from the learner's seed stream.

    For a learner off the CPU (``device``), or with ``staged`` True, each sample goes on through
    a :class:`~impl.rl.common.device_feed.PinnedBatchFeed` (one pinned slot per output): its
    learner fields become device tensors whose copies are enqueued by the thread that drew it,
    so with prefetch the sample and copy for update ``n + 1`` overlap update ``n``. On the CPU
    the learner reads the outputs themselves (``staged`` False), as before the feed existed."""

    def __init__(self, cfg: TrainConfig, rank: int, buf, batch_size: int, device=None, staged: bool | None = None):
        import torch

        self.batch_size = batch_size
        self.prefetch = cfg.learner_prefetch
        self.pending = None
        self.turn = 0
        if self.prefetch:
            from concurrent.futures import ThreadPoolExecutor

            self.buf = type(buf).attach(buf.handle, seed=RunSeeds(cfg.seed).learner(rank))
            self.pool = ThreadPoolExecutor(1, thread_name_prefix=f"learner-{rank}-prefetch")
            self.outs = [self.buf.sample_out(batch_size) for _ in range(2)]
        else:
            self.buf, self.pool, self.outs = buf, None, [buf.sample_out(batch_size)]
        device = torch.device("cpu") if device is None else torch.device(device)
        if staged is None:
            staged = device.type != "cpu"
        self.feed = (PinnedBatchFeed(self.outs[0], LEARNER_FIELDS, device, slots=len(self.outs)) if staged
                     else None)

    def _draw(self, beta: float):
        slot = self.turn % len(self.outs)
        self.turn += 1
        batch = self.buf.sample(self.batch_size, beta=beta, out=self.outs[slot])
        return batch if self.feed is None else self.feed.stage(batch, slot)

    def take(self, beta: float, more: bool):
        """The batch for this update (drawn now, or the one drawn during the last update); with
        prefetch and ``more``, starts drawing the next one (into the other output)."""
        if self.pool is None:
            return self._draw(beta)
        batch = self.pending.result() if self.pending is not None else self._draw(beta)
        self.pending = self.pool.submit(self._draw, beta) if more else None
        return batch

    def close(self) -> float:
        """Stop the helper; returns its attachment's lock wait seconds (0 without prefetch)."""
        if self.pool is None:
            return 0.0
        self.pool.shutdown(wait=True, cancel_futures=True)
        waited = self.buf.lock_wait_seconds
        self.buf.close()
        return waited


@dataclass(frozen=True)
class Role:
    """``count`` worker processes named ``name-rank`` that each run
    ``loop(cfg, rank, buf, state, weights, out) -> stats`` over an attachment of the shared
    buffer. ``loop`` must be a module-level function (or a ``functools.partial`` of one): it
    reaches the process by name. A loop puts ``("ready", name[, child_pids])`` on ``out`` once
    set up (``child_pids``: processes it started itself, counted as the run's workers), waits
    for :meth:`SharedState.wait_for_go`, and returns its stats dict; ``daemon=False`` for a
    loop that starts processes of its own (a daemonic process may not have children)."""

    name: str
    count: int
    loop: Callable
    daemon: bool = True


def _worker(role: str, rank: int, loop, cfg: TrainConfig, handle, state: SharedState, weights: SharedWeights,
            out) -> None:
    """Process entry point: run one worker's loop, report done / stopped / error, detach."""
    import torch

    torch.set_num_threads(1)
    name = f"{role}-{rank}"
    buf = None
    try:
        from replaybench.impl.concurrent import SharedPrioritizedBuffer

        seeds = RunSeeds(cfg.seed)
        buf = SharedPrioritizedBuffer.attach(handle, seed=seeds.learner(rank) if role == "learner"
                                             else seeds.actor(rank).buffer)
        out.put(("done", name, loop(cfg, rank, buf, state, weights, out)))
    except Stopped:
        out.put(("stopped", name))
    except BaseException:
        out.put(("error", name, traceback.format_exc()))
        raise SystemExit(1)
    finally:
        if buf is not None:
            buf.close()


# ---------------------------------------------------------------------------------------------- parent
#: A learner that has waited this long at the gradient all-reduce when the run passes its limit
#: waits for a stuck peer, which the timeout's error names (a healthy wait lasts one update of
#: the slowest peer; a shorter one says only that the run was slow, and the parent is named).
STALLED_S = 1.0


class _Monitor:
    """The parent's view of the run: messages from the queue, process liveness, progress.

    ``stall``: a callable returning who the learners wait for at the all-reduce now
    (:meth:`SharedAllreduce.stall`, an :class:`~impl.rl.common.allreduce.AllreduceStall` or
    None), read when the run passes ``timeout_s``; None with one learner."""

    def __init__(self, procs, state: SharedState, out, log: EpisodeLog, progress, timeout_s,
                 stall: Callable[[], AllreduceStall | None] | None = None, stop_at_threshold: bool = False):
        self.procs = procs
        self.stop_at_threshold = stop_at_threshold
        self.state = state
        self.out = out
        self.log = log
        self.progress = progress
        self.timeout_s = timeout_s
        self.stall = stall
        self.ready: set[str] = set()
        self.child_pids: list[int] = []  # processes the workers started themselves
        self.stats: dict[str, dict] = {}
        self.failure: tuple[str, str] | None = None

    def _handle(self, msg) -> None:
        kind = msg[0]
        if kind == EpisodeOutbox.KIND:
            for row in msg[1]:  # in the order they ended in their worker
                self.log.record(*row)
        elif kind == "ready":
            self.ready.add(msg[1])
            self.child_pids.extend(msg[2] if len(msg) > 2 else ())
        elif kind == "done":
            self.stats[msg[1]] = msg[2]
        elif kind == "error" and self.failure is None:
            self.failure = (msg[1], msg[2])

    def drain(self, timeout: float = 0.0) -> None:
        try:
            msg = self.out.get(timeout=timeout) if timeout > 0 else self.out.get_nowait()
            self._handle(msg)
            while True:
                self._handle(self.out.get_nowait())
        except queue_mod.Empty:
            pass

    def _check_deaths(self) -> None:
        """A process that exited without reporting done is a failure (after one more drain)."""
        dead = [p for p in self.procs if p.exitcode is not None and p.name not in self.stats]
        if dead and self.failure is None:
            self.drain()
            for p in dead:
                if p.name not in self.stats and self.failure is None:
                    self.failure = (p.name, f"process {p.name} (pid {p.pid}) exited with code {p.exitcode} "
                                            "without reporting")

    def wait_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while len(self.ready) < len(self.procs) and self.failure is None:
            self.drain(0.05)
            self._check_deaths()
            if time.monotonic() > deadline:
                self.failure = ("parent", f"workers not ready after {STARTUP_TIMEOUT_S} s: "
                                          f"{sorted({p.name for p in self.procs} - self.ready)}")

    def wait_done(self, t0: float) -> None:
        next_report = 0.0
        while len(self.stats) < len(self.procs) and self.failure is None:
            self.drain(0.05)
            self._check_deaths()
            if self.stop_at_threshold and self.log.reached and not self.state.finishing:
                self.state.finish()  # the workers wind down and report, as at the end of their share
            now = time.monotonic()
            if now >= next_report:
                next_report = now + PROGRESS_EVERY_S
                if self.progress is not None:
                    self.progress(self.state.env_steps(), self.state.updates(), self.log.recent_mean(),
                                  self.log.episodes)
            if self.timeout_s is not None and now - t0 > self.timeout_s:
                self.failure = self._timed_out()

    def _timed_out(self) -> tuple[str, str]:
        """The failure of a run past its limit: the learner(s) the others have waited for at
        the all-reduce for :data:`STALLED_S` or more (a stopped or hung learner), with the wait;
        else "parent". Read before the shutdown's stop flag ends the waits."""
        limit = f"run passed its {self.timeout_s} s limit"
        stall = self.stall() if self.stall is not None else None
        if stall is not None and stall.waited_s >= STALLED_S:
            return stall.names, f"{limit}: {stall}"
        return "parent", limit

    def shutdown(self, join_timeout_s: float) -> None:
        """Stop every worker: stop flag, join (draining the queue so none blocks on it),
        then SIGTERM, then SIGKILL. Returns when every process has exited."""
        self.state.stop()
        deadline = time.monotonic() + join_timeout_s
        while any(p.is_alive() for p in self.procs) and time.monotonic() < deadline:
            self.drain(0.05)
        signalled = False
        for signal_name in ("terminate", "kill"):
            alive = [p for p in self.procs if p.is_alive()]
            signalled = signalled or bool(alive)
            for p in alive:
                getattr(p, signal_name)()
            for p in alive:
                p.join(2.0)
        for p in self.procs:
            if p.pid is not None:  # started (a start that raised leaves later ones unstarted)
                p.join(0.1)
        if not signalled:  # a process killed mid-write may leave half a message: do not read it
            self.drain()


def run_parallel(cfg: TrainConfig, progress=None) -> TrainResult:
    """Run ``cfg`` with ``cfg.actors`` actor and ``cfg.learners`` learner processes.

    ``progress(env_steps, updates, recent_mean_return, episodes)`` (see :func:`~impl.rl.train`) is
    called about every 0.25 s. Raises
    ConfigError for a bad ``cfg`` before any process starts (:meth:`TrainConfig.validate`);
    WorkerFailed when a worker raised or died (its traceback is in the message), or with
    worker "parent" when the workers were not ready within STARTUP_TIMEOUT_S or the run passed
    ``cfg.timeout_s``, except that a run past its limit while learners waited at the gradient
    all-reduce for a peer (stopped, hung) names that peer ("learner-1") and the wait; every
    process has exited (a stopped one is killed) and the shared buffer is unlinked by then.
    """
    acfg = cfg.validate()
    if cfg.sequential:
        raise ConfigError("actors" if cfg.actors < 1 else "learners", min(cfg.actors, cfg.learners),
                          f"the parallel loop needs actors >= 1 and learners >= 1, got {cfg.actors}, {cfg.learners}")
    run = run_workers(cfg, acfg, Role("actor", cfg.actors, _actor_loop), progress)
    result = worker_result(cfg, acfg, run.stats, run.log, run.final, run.inserted, run.lock_wait_s)
    result.worker_pids = run.pids
    return result


@dataclass
class WorkerRun:
    """What :func:`run_workers` hands back: each worker's stats by name, the episode log, a
    final sample of 1024 rows (beta 1), the buffer's insert count and the parent's lock wait,
    and the pids of every worker process (all exited)."""

    stats: dict
    log: EpisodeLog
    final: dict
    inserted: int
    lock_wait_s: float
    pids: list


def run_workers(cfg: TrainConfig, acfg, actor_side: Role, progress=None) -> WorkerRun:
    """The parallel loop's lifecycle with ``actor_side`` as the processes that insert and
    ``cfg.learners`` learner processes (:func:`_learner_loop`) over one shared buffer: create the
    buffer, the shared state (``cfg.actors`` actor slots) and the weights, start every process,
    wait for "ready", say "go", watch, shut down, unlink (module docstring: the exit paths).
    ``cfg`` is validated by the caller. Raises WorkerFailed as :func:`run_parallel` does."""
    import multiprocessing as mp

    from replaybench.impl.concurrent import SharedPrioritizedBuffer

    algo = algorithms.get(cfg.algo)
    seeds = RunSeeds(cfg.seed)
    env = make_env(cfg.env, algo)
    fields = transition_fields(env)
    env.close()
    probe = algo.learner_cls((env.observation_space, env.action_space), acfg, seeds.networks)
    policy_size = probe.get_flat_weights().numel()
    # the most floats one gradient all-reduce may carry: every parameter of every network
    grad_size = sum(p.numel() for module in probe.modules() for p in module.parameters())
    del probe

    ctx = mp.get_context(cfg.start_method)
    if cfg.start_method == "forkserver":  # imported once
        ctx.set_forkserver_preload(["torch", "replaybench.impl.concurrent", "replaybench.impl.rl.engines.process",
                                    getattr(actor_side.loop, "__module__", __name__)])
    log = EpisodeLog(cfg.resolved_threshold(), cfg.window)
    buf = SharedPrioritizedBuffer.create(acfg.buffer_capacity, fields, variant=cfg.buffer, policy=cfg.policy,
                                         seed=seeds.buffer, **buffer_kwargs(cfg, acfg))
    procs, state = [], None
    try:
        state = SharedState(ctx, cfg.actors, cfg.learners)
        weights = SharedWeights(ctx, state, policy_size)
        out = ctx.Queue()
        group = (SharedAllreduce(ctx, cfg.learners, grad_size, timeout_s=max(60.0, cfg.join_timeout_s))
                 if cfg.learners > 1 else None)
        learners = Role("learner", cfg.learners, functools.partial(_learner_loop, group=group))
        for role in (learners, actor_side):
            for rank in range(role.count):
                procs.append(ctx.Process(target=_worker, name=f"{role.name}-{rank}", daemon=role.daemon,
                                         args=(role.name, rank, role.loop, cfg, buf.handle, state, weights, out)))
        monitor = _Monitor(procs, state, out, log, progress, cfg.timeout_s, None if group is None else group.stall,
                           stop_at_threshold=cfg.stop_at_threshold)
        try:
            for p in procs:
                p.start()
            monitor.wait_ready()
            if monitor.failure is None:
                state.go()
                monitor.wait_done(state.t0)
        finally:
            monitor.shutdown(cfg.join_timeout_s if monitor.failure is None else min(cfg.join_timeout_s, 5.0))
        pids = [p.pid for p in procs if p.pid is not None] + monitor.child_pids
        if monitor.failure is not None:
            worker, detail = monitor.failure
            raise WorkerFailed(worker, detail, pids)
        if progress is not None:
            progress(state.env_steps(), state.updates(), log.recent_mean(), log.episodes)
        final = buf.sample(min(1024, len(buf)), beta=1.0)
        inserted = buf.inserted
        lock_wait = buf.lock_wait_seconds
    finally:
        buf.close()
        if state is not None:
            state.close()
    return WorkerRun(monitor.stats, log, final, inserted, lock_wait, pids)


def worker_result(cfg, acfg, stats: dict, log: EpisodeLog, final: dict, inserted: int, parent_lock_wait: float):
    actors = [stats[f"actor-{r}"] for r in range(cfg.actors)]
    learners = [stats[f"learner-{r}"] for r in range(cfg.learners)]
    return TrainResult.from_workers(
        actors, learners, engine="process", env_steps=sum(s["steps"] for s in actors),
        wall_s=max(s["end_s"] for s in actors + learners), episodes=log.episodes, threshold=log.threshold,
        window=log.window, time_to_threshold_s=log.time_to_threshold_s, steps_to_threshold=log.steps_to_threshold,
        actor_wait_s=sum(s["wait_s"] for s in actors), learner_wait_s=sum(s["wait_s"] for s in learners),
        buffer_lock_wait_s=sum(s["lock_wait_s"] for s in actors + learners) + parent_lock_wait,
        actor_steps=[s["steps"] for s in actors], inserted=inserted,
        final_weight_min=smallest_weight(final["weights"]), snapshots=learners[0].get("snapshots", []))
