"""What a training run is asked to do: :class:`TrainConfig`.

The run's engine (:attr:`TrainConfig.engine`, :mod:`impl.rl.engines`) is the algorithm's own
when it names one (a2c: ``paac``); else ``actors == 0`` or ``learners == 0`` selects the
sequential baseline; else ``backend`` names the parallel loop's engine ("process", "ray",
"dataflow"). What a run measured is :class:`~impl.rl.common.result.TrainResult`.

:meth:`TrainConfig.validate` checks a run before anything starts (every engine calls it
first): every field, the algorithm config with its overrides, the buffer's parameters and
its policy (the variant's own checks, :func:`~impl.rl.common.local_replay.check_buffer`),
the engine's own checks and what it needs installed, and that the environment exists and
has the action space the algorithm handles. A bad value raises
:class:`~impl.rl.common.errors.ConfigError` naming the field and the value.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field

from replaybench.impl import concurrent, registry
from replaybench.impl.rl import algorithms, engines
from replaybench.impl.rl.algorithms.base import AlgoConfig, resolve_update
from replaybench.impl.rl.common.device import check_device, resolve_device
from replaybench.impl.rl.common.checkpoint import check_target as check_checkpoint_target
from replaybench.impl.rl.common.envs import THRESHOLDS, WINDOW, make_env
from replaybench.impl.rl.common.local_replay import check_buffer
from replaybench.impl.rl.common.errors import ConfigError

__all__ = ["TrainConfig"]

START_METHODS = ("forkserver", "spawn")


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
    (:func:`~impl.rl.common.envs.stage_rows`). Env seeds: :meth:`~impl.rl.common.seeding.ActorSeeds.env_seed`."""
    seed: int = 0
    """Seeds environments, networks, exploration and buffer sampling."""
    overrides: dict = field(default_factory=dict)
    """Fields of the algorithm's config to change from its preset for ``env`` (typed by the
    fields: ``{"hidden": 64}`` becomes ``(64,)``, ``{"lr": 1}`` 1.0)."""
    threshold: float | None = None
    """Reward threshold timed to (None: :data:`impl.rl.common.envs.THRESHOLDS` for ``env``)."""
    window: int = WINDOW
    """Episodes averaged for the threshold."""
    stop_at_threshold: bool = False
    """End the run once the threshold is reached on the training episodes (the mean of the last
    ``window`` returns), in every engine: the workers stop at their next clean point and the
    result counts the env steps and updates done."""
    snapshot_every: int = 0
    """Learner updates between weight snapshots for the greedy evaluation after the run
    (:mod:`impl.rl.common.snapshots`; learner 0's, in the sequential and process engines); 0:
    none. A run that takes any also takes one at its end."""
    insert_batch: int = 8
    """Transitions an actor stages before one buffer add (both loops)."""
    weight_sync_every: int = 10
    """Learner updates between weight broadcasts to the actors (parallel loop)."""
    ratio_tolerance: float = 32.0
    """How many updates the learners may fall behind ``updates_per_step * steps`` before
    actors wait (raised to ``1 + ratio * rows`` when smaller, ``rows`` the transitions per buffer add
    (:func:`~impl.rl.common.envs.stage_rows`), which rules out deadlock)."""
    learner_prefetch: bool = False
    """Process backend's learners: draw the sample for update ``n + 1`` (from a helper thread
    with its own attachment of the buffer, into the second of two preallocated outputs) while
    update ``n`` runs, so the learner's replay time is the part of a sample that SGD did not
    hide. The sample then predates update ``n``'s new priorities and the rate limiter's check
    for update ``n + 1`` (one update of staleness, as Ape-X's and PAL's learners prefetch).
    False: each sample is drawn just before its update (outputs preallocated either way)."""
    priority_lag: int = 0
    """Process backend's learners: updates by which an update's new priorities may reach the
    buffer late, 0 or 1. With 1 the learner queues update ``n + 1`` (its sample drawn and
    staged, its step launched) before it waits for update ``n``'s priorities and writes them
    (:meth:`~impl.rl.algorithms.base.Learner.learn_async`), so a learner on a GPU does not
    wait for its device at every update: the host's sample, staging and priority write run
    while the device computes. Sample ``n + 1`` then predates update ``n``'s priorities (one
    update of staleness, as with ``learner_prefetch``); the last update's are written before
    the learner returns. On the CPU the step is done when it returns, so 1 only reorders the
    writes. 0: each update's priorities are written before the next sample (today's order; the
    other engines always write so)."""
    device: str = "cpu"
    """Where the learners compute (:mod:`impl.rl.common.device`): "cpu", "cuda" or "auto" (a GPU
    when torch sees one, else the CPU). The network, its optimizer state and its targets live
    there, as does PAAC's batched inference; actors run CPU copies of the policy, refreshed
    every ``weight_sync_every`` updates (the sequential loop's actor too, off the CPU). "cpu"
    is the default because nothing has been measured faster yet, and it computes what the
    learners computed before the setting existed, bit for bit. The sequential, process,
    dataflow and PAAC engines take every value; Ray's learners only "cpu". ConfigError for another value, or "cuda" where torch sees no GPU."""
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
    # --- checkpoints (the PAAC engine: impl.rl.common.checkpoint) -----------------------------------
    checkpoint: str | None = None
    """Write the run's checkpoint to this file every ``checkpoint_every`` env steps (rounded up
    to whole rollouts) and at its end (PAAC engine only; None: none). :meth:`validate` refuses
    a directory, a path under a folder that does not exist, and a folder it cannot write in."""
    checkpoint_every: int = 0
    """Env steps between checkpoints (0: only at the end); needs ``checkpoint``."""
    resume: str | None = None
    """Continue the run saved in this checkpoint file (same algo, env, seed and algorithm
    settings) up to ``steps`` env steps in all (PAAC engine only)."""
    # --- backend of the parallel loop (impl.rl.engines.ray.driver) ---------------------------------
    backend: str = "process"
    """Engine of the parallel loop: "process" (:mod:`impl.rl.engines.process`, one machine), "ray"
    (:mod:`impl.rl.engines.ray.driver`: actors anywhere in a Ray cluster) or "dataflow"
    (:mod:`impl.rl.engines.dataflow`: one server process infers for all ``actors x envs_per_actor``
    environments, stepped in lock step by ``actors`` env worker processes)."""
    ray_address: str | None = None
    """Ray backend: address of a running cluster for ``ray.init`` (None: a local Ray started
    for the run and shut down after it). :meth:`validate` refuses one whose port takes no TCP
    connection within 5 s (:func:`~impl.rl.engines.ray.driver.unreachable_reason`)."""
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
        """Check every field, the algorithm config, the buffer's parameters and policy, and the
        environment; returns the algorithm config. Raises ConfigError (``field``: the TrainConfig field, or the algorithm config
        field an override names) before anything is started. Cost: one ``gym.make``
        (milliseconds) besides imports, and with ``ray_address`` one TCP connect (at most 5 s)."""
        algo = algorithms.get(self.algo)
        for name, low in (("steps", 1), ("envs_per_actor", 1), ("insert_batch", 1), ("actors", 0), ("learners", 0),
                          ("seed", 0), ("weight_sync_every", 1), ("window", 1), ("snapshot_every", 0)):
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
        check_device(self.device)
        if not isinstance(self.learner_prefetch, bool):
            raise ConfigError("learner_prefetch", self.learner_prefetch,
                              f"learner_prefetch must be True or False, got {self.learner_prefetch!r}")
        lag = self.priority_lag
        if not isinstance(lag, int) or isinstance(lag, bool) or lag not in (0, 1):
            raise ConfigError("priority_lag", self.priority_lag,
                              f"priority_lag must be 0 or 1 (updates), got {self.priority_lag!r}")
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
        self._validate_checkpoint()
        self._validate_backend()
        acfg = self.algo_config()
        if hasattr(acfg, "update"):  # a compiled update runs on the CPU only: refused here, not in a learner process
            resolve_update(acfg, resolve_device(self.device))
        if algo.engine is None:  # the replay loops' buffer (an algorithm with its own engine has none)
            check_buffer(self, acfg)
        engines.get(self.engine).check(self, acfg)
        make_env(self.env, algo).close()
        return acfg

    @property
    def engine(self) -> str:
        """The engine this run runs on (:mod:`impl.rl.engines`): the algorithm's own when it
        names one, else "sequential" when ``actors`` or ``learners`` is 0, else ``backend``.
        ConfigError (field "algo" or "backend") for a name that is neither."""
        self._check_backend_name()
        own = algorithms.get(self.algo).engine
        return own or ("sequential" if self.sequential else self.backend)

    def _check_backend_name(self) -> None:
        parallel = engines.parallel_names()
        if self.backend not in parallel:
            raise ConfigError("backend", self.backend, f"backend must be one of {parallel}, got {self.backend!r}")

    def _validate_backend(self) -> None:
        """The backend field and what the chosen engine needs installed (its own checks,
        :attr:`Engine.check`, follow once the algorithm config is known)."""
        engine = self.engine  # refuses an unknown backend
        if not isinstance(self.actor_max_restarts, int) or isinstance(self.actor_max_restarts, bool) \
                or self.actor_max_restarts < 0:
            raise ConfigError("actor_max_restarts", self.actor_max_restarts,
                              f"actor_max_restarts must be an integer >= 0, got {self.actor_max_restarts!r}")
        if self.ray_address is not None and (self.backend != "ray" or not isinstance(self.ray_address, str)
                                             or not self.ray_address.strip()):
            raise ConfigError("ray_address", self.ray_address,
                              f"ray_address must be a non-empty string and needs backend 'ray', got "
                              f"{self.ray_address!r} with backend {self.backend!r}")
        if self.backend != "process":  # the default names no choice; any other backend is one
            if algorithms.get(self.algo).engine is not None:
                raise ConfigError("backend", self.backend, f"backend {self.backend!r} runs the replay loop; algo "
                                                           f"{self.algo!r} runs its own engine "
                                                           f"({algorithms.get(self.algo).engine!r})")
            if self.sequential:
                raise ConfigError("backend", self.backend, f"backend {self.backend!r} runs the parallel loop: it "
                                                           f"needs actors >= 1 and learners >= 1, got "
                                                           f"actors={self.actors}, learners={self.learners}")
        reason = engines.get(engine).unavailable_reason()
        if reason is not None:
            raise ConfigError("backend", self.backend, f"backend {self.backend!r} is unavailable: {reason}")

    def _validate_checkpoint(self) -> None:
        for name in ("checkpoint", "resume"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ConfigError(name, value, f"{name} must be a file path or None, got {value!r}")
        if not isinstance(self.checkpoint_every, int) or isinstance(self.checkpoint_every, bool) \
                or self.checkpoint_every < 0 or (self.checkpoint_every and self.checkpoint is None):
            raise ConfigError("checkpoint_every", self.checkpoint_every,
                              f"checkpoint_every must be an integer >= 0 (> 0 needs checkpoint), got "
                              f"{self.checkpoint_every!r} with checkpoint={self.checkpoint!r}")
        if (self.checkpoint or self.resume) and self.engine != "paac":
            field_ = "checkpoint" if self.checkpoint else "resume"
            raise ConfigError(field_, getattr(self, field_), f"{field_}={getattr(self, field_)!r}: only the PAAC "
                                                             f"engine (algo 'a2c') checkpoints, this run's engine "
                                                             f"is {self.engine!r}")
        if self.resume is not None and not os.path.isfile(self.resume):
            raise ConfigError("resume", self.resume, f"resume: no checkpoint file {self.resume!r}")
        if self.checkpoint is not None:
            check_checkpoint_target(self.checkpoint)  # found out here, not when the first save fails

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


