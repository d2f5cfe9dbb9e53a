"""What a training run is asked to do (:class:`TrainConfig`) and what it measured (:class:`TrainResult`).

``actors == 0`` or ``learners == 0`` selects the sequential baseline (:mod:`impl.rl.sequential`);
otherwise :mod:`impl.rl.parallel` runs ``actors`` actor processes and ``learners`` learner
processes over a shared-memory buffer (with ``backend="ray"``, :mod:`impl.rl.ray_backend` runs
them as Ray actors on a Ray cluster). Every loop does the same number of learner updates for
the same ``steps`` (:func:`total_updates`), so their throughputs compare at the same ratio.

:meth:`TrainConfig.validate` checks a run before anything starts (both loops call it first):
every field, the algorithm config with its overrides, and that the environment exists and
has the action space the algorithm handles. A bad value raises
:class:`~impl.rl.base.ConfigError` naming the field and the value.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from replaybench.impl import concurrent, registry

from . import algorithms
from .base import AlgoConfig, ConfigError
from .envs import THRESHOLDS, WINDOW, make_env
from .profiler import SECTIONS

__all__ = ["TrainConfig", "TrainResult", "InjectedFailure", "WorkerFailed", "total_updates", "allowed_updates"]

START_METHODS = ("forkserver", "spawn")
BACKENDS = ("process", "ray", "dataflow")


class InjectedFailure(RuntimeError):
    """Raised on purpose by a worker when :attr:`TrainConfig.fail` names it (tests)."""


class WorkerFailed(RuntimeError):
    """A worker process raised or died; ``worker`` names it, ``detail`` holds its traceback,
    ``pids`` the process ids of all the run's workers (every one has exited by then)."""

    def __init__(self, worker: str, detail: str, pids: tuple = ()):
        super().__init__(f"worker {worker} failed:\n{detail}")
        self.worker = worker
        self.detail = detail
        self.pids = tuple(pids)


@dataclass
class TrainConfig:
    """One training run; :meth:`validate` checks it (both loops call it before any work)."""

    algo: str = "dqn"
    """Algorithm name in :data:`impl.rl.algorithms.ALGORITHMS` ("dqn", "td3")."""
    env: str = "CartPole-v1"
    """gymnasium environment id."""
    buffer: str = "kary-aligned"
    """Registered buffer variant (impl.registry) for both loops."""
    policy: str = "lazy-writing"
    """Concurrency policy of the shared buffer (parallel loop only; "none" in the baseline)."""
    buffer_params: dict = field(default_factory=dict)
    """Variant parameters (K, dtype, ...) for registry.create / SharedPrioritizedBuffer.create."""
    actors: int = 0
    """Actor processes; 0 (or learners 0) = the sequential baseline."""
    learners: int = 0
    """Learner processes (each samples batch_size // learners, gradients all-reduced)."""
    steps: int = 50_000
    """Environment steps in total, over all actors and all their environments."""
    envs_per_actor: int = 1
    """Environments each actor process steps (the sequential loop too), with ONE batched
    policy forward per vector step (``--envs-per-actor``); each actor inserts its E
    transitions per step into the buffer, staged in whole vector steps
    (:func:`~impl.rl.envs.stage_rows`). Env seeds: :meth:`~impl.rl.seeding.ActorSeeds.env_seed`."""
    seed: int = 0
    """Seeds environments, networks, exploration and buffer sampling."""
    overrides: dict = field(default_factory=dict)
    """Fields of the algorithm's config to change from its preset for ``env`` (typed by the
    fields: ``{"hidden": 64}`` becomes ``(64,)``, ``{"lr": 1}`` 1.0)."""
    threshold: float | None = None
    """Reward threshold timed to (None: :data:`impl.rl.envs.THRESHOLDS` for ``env``)."""
    window: int = WINDOW
    """Episodes averaged for the threshold."""
    stop_at_threshold: bool = False
    """End the run once the threshold is reached (sequential loop only)."""
    insert_batch: int = 8
    """Transitions an actor stages before one buffer add (both loops)."""
    weight_sync_every: int = 10
    """Learner updates between weight broadcasts to the actors (parallel loop)."""
    ratio_tolerance: float = 32.0
    """How many updates the learners may fall behind ``updates_per_step * steps`` before
    actors wait (raised to ``1 + ratio * rows`` when smaller, ``rows`` the transitions per buffer add
    (:func:`~impl.rl.envs.stage_rows`), which rules out deadlock)."""
    start_method: str = "forkserver"
    """multiprocessing start method of the workers: "forkserver" or "spawn"."""
    timeout_s: float | None = None
    """Stop and fail the run after this many wall seconds (None: no limit)."""
    join_timeout_s: float = 10.0
    """How long to wait for workers to exit after a stop before terminating them."""
    fail: str | None = None
    """Test hook "role:rank:count": that worker raises InjectedFailure after ``count`` env
    steps (role "actor" or "sequential") or updates (role "learner"). The Ray backend also
    takes "actor-kill" (that actor's process SIGKILLs itself after ``count`` env steps, in its
    first life only) and "server-kill" (the replay server's, at its ``count``-th insert); the
    dataflow backend has role "server" (its one acting process) instead of "actor"."""
    # --- backend of the parallel loop (impl.rl.ray_backend) ---------------------------------
    backend: str = "process"
    """Engine of the parallel loop: "process" (:mod:`impl.rl.parallel`, one machine), "ray"
    (:mod:`impl.rl.ray_backend`: actors anywhere in a Ray cluster) or "dataflow"
    (:mod:`impl.dataflow.train`: one server process infers for all ``actors x envs_per_actor``
    environments, stepped in lock step by ``actors`` env worker processes)."""
    ray_address: str | None = None
    """Ray backend: address of a running cluster for ``ray.init`` (None: a local Ray started
    for the run and shut down after it). :meth:`validate` refuses one whose port takes no TCP
    connection within 5 s (:func:`~impl.rl.ray_backend.unreachable_reason`)."""
    actor_max_restarts: int = 3
    """Ray backend: how many times Ray restarts an actor whose process died before the run fails."""

    @property
    def sequential(self) -> bool:
        return self.actors == 0 or self.learners == 0

    def algo_config(self) -> AlgoConfig:
        """The algorithm's config: preset for ``env`` plus ``overrides``, typed and checked
        (ConfigError naming the field). Cost: microseconds."""
        cfg = algorithms.get(self.algo).config_cls.for_env(self.env, **self.overrides)
        if not self.sequential and cfg.batch_size % self.learners:
            raise ConfigError("batch_size", cfg.batch_size,
                              f"batch_size {cfg.batch_size} must be divisible by learners={self.learners}")
        return cfg

    def validate(self) -> AlgoConfig:
        """Check every field, the algorithm config and the environment; returns the algorithm
        config. Raises ConfigError (``field``: the TrainConfig field, or the algorithm config
        field an override names) before anything is started. Cost: one ``gym.make``
        (milliseconds) besides imports, and with ``ray_address`` one TCP connect (at most 5 s)."""
        algo = algorithms.get(self.algo)
        for name, low in (("steps", 1), ("envs_per_actor", 1), ("insert_batch", 1), ("actors", 0), ("learners", 0),
                          ("seed", 0), ("weight_sync_every", 1), ("window", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ConfigError(name, value, f"{name} must be an integer >= {low}, got {value!r}")
        per_actor = self.steps // (1 if self.sequential else self.actors)
        if self.envs_per_actor > per_actor:  # some environments would never step
            raise ConfigError("envs_per_actor", self.envs_per_actor,
                              f"envs_per_actor {self.envs_per_actor} exceeds the {per_actor} env steps each actor "
                              f"takes (steps={self.steps} over {1 if self.sequential else self.actors} actor(s))")
        for name, optional, low_open in (("timeout_s", True, True), ("join_timeout_s", False, False),
                                         ("ratio_tolerance", False, True)):
            value = getattr(self, name)
            if value is None and optional:
                continue
            if (not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value)
                    or value < 0 or (low_open and value == 0)):
                raise ConfigError(name, value, f"{name} must be a finite number {'>' if low_open else '>='} 0, "
                                               f"got {value!r}")
        if self.start_method not in START_METHODS:
            raise ConfigError("start_method", self.start_method,
                              f"start_method must be one of {START_METHODS}, got {self.start_method!r} (a forked "
                              "worker would inherit the parent's end of the liveness pipe, and torch does not "
                              "survive fork well)")
        try:
            registry.get(self.buffer)
        except KeyError as err:
            raise ConfigError("buffer", self.buffer, err.args[0]) from None
        if not self.sequential and self.policy not in concurrent.names():
            raise ConfigError("policy", self.policy,
                              f"policy must be one of {concurrent.names()}, got {self.policy!r}")
        if self.fail is not None:
            self._parse_fail()
        self._validate_backend()
        acfg = self.algo_config()
        make_env(self.env, algo).close()
        return acfg

    def _validate_backend(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError("backend", self.backend, f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if not isinstance(self.actor_max_restarts, int) or isinstance(self.actor_max_restarts, bool) \
                or self.actor_max_restarts < 0:
            raise ConfigError("actor_max_restarts", self.actor_max_restarts,
                              f"actor_max_restarts must be an integer >= 0, got {self.actor_max_restarts!r}")
        if self.backend == "dataflow":
            if algorithms.get(self.algo).run is not None:
                raise ConfigError("backend", self.backend, f"backend 'dataflow' runs the replay loop; algo "
                                                           f"{self.algo!r} runs its own processes")
            if self.sequential:
                raise ConfigError("backend", self.backend, f"backend 'dataflow' runs the parallel loop: it needs "
                                                           f"actors >= 1 (its env worker processes) and learners "
                                                           f">= 1, got actors={self.actors}, "
                                                           f"learners={self.learners}")
            if self.fail is not None and self._parse_fail()[0] == "actor":
                raise ConfigError("fail", self.fail, f"backend 'dataflow' has no actor processes (its roles: "
                                                     f"'server', 'learner'), got fail={self.fail!r}")
        if self.ray_address is not None and (self.backend != "ray" or not isinstance(self.ray_address, str)
                                             or not self.ray_address.strip()):
            raise ConfigError("ray_address", self.ray_address,
                              f"ray_address must be a non-empty string and needs backend 'ray', got "
                              f"{self.ray_address!r} with backend {self.backend!r}")
        if self.backend == "ray":
            if self.sequential:
                raise ConfigError("backend", self.backend, f"backend 'ray' runs the parallel loop: it needs "
                                                           f"actors >= 1 and learners >= 1, got {self.actors}, "
                                                           f"{self.learners}")
            if self.envs_per_actor != 1:  # its actors step one env each (impl.rl.ray_workers)
                raise ConfigError("envs_per_actor", self.envs_per_actor, f"backend 'ray' steps one environment per "
                                                                         f"actor, got envs_per_actor "
                                                                         f"{self.envs_per_actor}")
            from .ray_backend import unavailable_reason

            reason = unavailable_reason()
            if reason is not None:
                raise ConfigError("backend", self.backend, f"backend 'ray' is unavailable: {reason}")
            if self.ray_address is not None:  # ray.init would retry for minutes, saying nothing
                from .ray_backend import unreachable_reason

                reason = unreachable_reason(self.ray_address)
                if reason is not None:
                    raise ConfigError("ray_address", self.ray_address,
                                      f"ray_address {self.ray_address!r} is unreachable: {reason}")

    def _parse_fail(self) -> tuple[str, str, int]:
        try:
            role, rank, count = self.fail.split(":")
            if rank not in ("", "*"):
                int(rank)
            return role, rank, int(count)
        except ValueError:
            raise ConfigError("fail", self.fail, f"fail must be 'role:rank:count', got {self.fail!r}") from None

    def resolved_threshold(self) -> float | None:
        return self.threshold if self.threshold is not None else THRESHOLDS.get(self.env)

    def failure_point(self, role: str, rank: int) -> int | None:
        """The count at which worker (role, rank) must raise, or None."""
        if not self.fail:
            return None
        want_role, want_rank, count = self._parse_fail()
        if want_role == role and (want_rank in ("", "*") or int(want_rank) == rank):
            return count
        return None

    def to_dict(self) -> dict:
        return asdict(self)


def allowed_updates(env_steps: int, ratio: float, learning_starts: int) -> int:
    """Learner updates due after ``env_steps`` stored steps: floor(ratio * (steps - starts))."""
    return max(0, int(ratio * (env_steps - learning_starts)))


def total_updates(steps: int, ratio: float, learning_starts: int) -> int:
    """Updates a run of ``steps`` env steps does in either loop."""
    return allowed_updates(steps, ratio, learning_starts)


@dataclass
class TrainResult:
    """What one run measured. Seconds are wall-clock from the first env step ("go")."""

    mode: str                         # "sequential", "parallel", "ray" or "dataflow"
    env_steps: int
    updates: int
    wall_s: float
    episodes: list                    # (env_steps, wall_s, return) per finished episode
    threshold: float | None
    window: int
    time_to_threshold_s: float | None
    steps_to_threshold: int | None
    sample_calls: int
    sample_latency_s: float | None    # mean seconds per buffer.sample call (learners)
    actor_wait_s: float               # summed over actors: blocked by the rate limiter
    learner_wait_s: float             # summed over learners
    profiles: dict                    # role -> {section: seconds}, summed over that role's processes
    processes: dict                   # role -> number of processes
    buffer_lock_wait_s: float | None  # summed over processes (shared buffer), None when unknown
    learner_digests: list             # one params_digest per learner at the end
    actor_steps: list                 # env steps per actor
    actor_ids_sampled: dict           # actor id -> times a learner sampled one of its transitions
    inserted: int                     # transitions the buffer received
    final_weight_min: float | None    # smallest importance weight in a final sample (1.0: all equal)
    worker_pids: list = field(default_factory=list)  # parallel loop: the (exited) worker processes (ray: server first)
    actor_nodes: list = field(default_factory=list)  # ray backend: the node id each actor ran on (last life)
    actor_restarts: int = 0           # ray backend: actor processes that died and were restarted
    dropped_batches: int = 0          # ray backend: per actor death, the batch it was staging (0 to insert_batch - 1
    #                                   rows, lost with the process), plus each insert of a dead life arriving late

    @classmethod
    def from_workers(cls, actors: list, learners: list, **fields) -> TrainResult:
        """A result of a multi-process run, from each actor's and each learner's final stats.

        Fills the fields that both process backends (:mod:`impl.rl.parallel`,
        :mod:`impl.rl.ray_backend`) compute alike from the workers' stats dicts: ``profiles``
        (seconds per section summed over each role), ``processes``, ``updates``,
        ``sample_calls``, ``sample_latency_s`` (a learner's mean seconds per sample call,
        averaged over learners), ``learner_digests`` and ``actor_ids_sampled`` (summed over
        learners). Every learner does the same number of updates, so learner 0's count is the
        run's. ``fields`` gives the rest, which the backends measure differently. Cost:
        O((actors + learners) * sections + learners * actors).
        """
        profiles = {role: {k: sum(s["profile"][k] for s in group) for k in SECTIONS}
                    for role, group in (("actor", actors), ("learner", learners))}
        updates = learners[0]["updates"]
        sample_s = sum(s["sample_s"] for s in learners) / len(learners)
        actor_ids: dict[int, int] = {}
        for s in learners:
            for a, count in enumerate(s["actor_ids"]):
                actor_ids[a] = actor_ids.get(a, 0) + count
        return cls(updates=updates, sample_calls=updates * len(learners),
                   sample_latency_s=sample_s / updates if updates else None, profiles=profiles,
                   processes={"actor": len(actors), "learner": len(learners)},
                   learner_digests=[s["digest"] for s in learners], actor_ids_sampled=actor_ids, **fields)

    @property
    def env_steps_per_s(self) -> float:
        return self.env_steps / self.wall_s if self.wall_s > 0 else float("nan")

    @property
    def updates_per_s(self) -> float:
        return self.updates / self.wall_s if self.wall_s > 0 else float("nan")

    @property
    def reached(self) -> bool:
        return self.time_to_threshold_s is not None

    def recent_mean(self, window: int | None = None) -> float | None:
        window = window or self.window
        rets = [r for _, _, r in self.episodes[-window:]]
        return sum(rets) / len(rets) if rets else None
