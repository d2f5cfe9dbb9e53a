"""What a training run measured (:class:`TrainResult`) and the update schedule every engine keeps.

Every engine does the same number of learner updates for the same ``steps``
(:func:`total_updates`), so their throughputs compare at the same ratio.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from replaybench.impl.rl.common.profiler import SECTIONS

__all__ = ["TrainResult", "allowed_updates", "smallest_weight", "total_updates"]


def _summed(dicts: list) -> dict:
    """Key-wise sums of ``dicts`` (the same keys each); {} for none."""
    return {k: sum(d[k] for d in dicts) for k in dicts[0]} if dicts else {}


def allowed_updates(env_steps: int, ratio: float, learning_starts: int) -> int:
    """Learner updates due after ``env_steps`` stored steps: floor(ratio * (steps - starts))."""
    return max(0, int(ratio * (env_steps - learning_starts)))


def total_updates(steps: int, ratio: float, learning_starts: int) -> int:
    """Updates a run of ``steps`` env steps does in either loop."""
    return allowed_updates(steps, ratio, learning_starts)


def smallest_weight(weights) -> float:
    """The smallest of a sample's importance weights as a Python float (:attr:`TrainResult.final_weight_min`).

    ``weights`` is what the buffer's ``sample`` gave: a numpy array, or a torch tensor where the
    buffer hands its output over on its device (``torch-kary`` with ``output=device``), on
    which ``np.min`` fails (numpy passes ``axis=None`` on to the tensor's own ``min``). Either
    array reduces through its own ``min`` method, so torch is never imported here; a device
    tensor costs one copy of the scalar to the host. Anything else goes through numpy.
    Non-empty ``weights``; O(len(weights))."""
    reduce = getattr(weights, "min", None)
    return float(reduce() if callable(reduce) else np.min(weights))


@dataclass
class TrainResult:
    """What one run measured. Seconds are wall-clock from the first env step ("go").

    A run resumed from a checkpoint (the PAAC engine) counts the whole run in ``env_steps``,
    ``updates``, ``wall_s`` and ``episodes`` (the checkpointed part's recorded steps, updates
    and seconds included, so episode times and the time to the threshold go on from it), and
    says how much of each the checkpoint brought in (``resumed_steps``, ``resumed_updates``,
    ``resumed_wall_s``; 0 for a run from scratch). Its rates (:attr:`env_steps_per_s`,
    :attr:`updates_per_s`) and its ``profiles`` are of the part this call ran
    (:attr:`part_steps` over :attr:`part_wall_s`): each part is counted once, under the speed
    settings it ran with (a resume may change them).
    """

    engine: str                       # the engine that ran it: "sequential", "process", "ray", "dataflow", "paac"
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
    replay_parts: dict = field(default_factory=dict)  # role -> what its "replay" section is made of, summed over
    #                                   its processes: {sample, update, lock_wait (s), redrawn_rows}; beside the
    #                                   profiles, never in them (impl.rl.common.replay_timing); {} when not measured
    replay_alone: dict = field(default_factory=dict)  # the learners' replay calls timed alone after the run:
    #                                   {calls, sample, tensor, update (s)}, summed over learners; {} when not measured
    warmup_s: float | None = None     # seconds before the first env step spent on the learner's one-time work
    #                                   (kernels loaded, cuBLAS and cuDNN set up: A2CLearner.warm_up, and
    #                                   impl.rl.common.device.warm_up_learner), outside wall_s and the rates;
    #                                   the slowest learner's; None for an engine that does not warm up (the
    #                                   sequential, process and paac engines do)
    snapshots: list = field(default_factory=list)  # learner 0's weight snapshots (impl.rl.common.snapshots.Snapshot),
    #                                   every TrainConfig.snapshot_every updates and at the end; [] when none
    resumed_steps: int = 0            # of env_steps, updates and wall_s: what a checkpoint brought in (resumed runs)
    resumed_updates: int = 0
    resumed_wall_s: float = 0.0

    @classmethod
    def from_workers(cls, actors: list, learners: list, **fields) -> TrainResult:
        """A result of a multi-process run, from each actor's and each learner's final stats.

        Fills the fields that both process backends (:mod:`impl.rl.engines.process`,
        :mod:`impl.rl.engines.ray.driver`) compute alike from the workers' stats dicts: ``profiles``
        (seconds per section summed over each role), ``processes``, ``updates``,
        ``sample_calls``, ``sample_latency_s`` (a learner's mean seconds per sample call,
        averaged over learners), ``learner_digests`` and ``actor_ids_sampled`` (summed over
        learners). Every learner does the same number of updates, so learner 0's count is the
        run's; ``replay_parts`` and ``replay_alone`` (summed over learners, {} unless every learner
        reported them). ``fields`` gives the rest, which the backends measure differently. Cost:
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
        parts = [s["replay_parts"] for s in learners if s.get("replay_parts") is not None]
        alone = [s["replay_alone"] for s in learners if s.get("replay_alone") is not None]
        warmups = [s["warmup_s"] for s in learners if s.get("warmup_s") is not None]
        return cls(updates=updates, sample_calls=updates * len(learners),
                   sample_latency_s=sample_s / updates if updates else None, profiles=profiles,
                   processes={"actor": len(actors), "learner": len(learners)},
                   learner_digests=[s["digest"] for s in learners], actor_ids_sampled=actor_ids,
                   replay_parts={"learner": _summed(parts)} if len(parts) == len(learners) else {},
                   replay_alone=_summed(alone) if len(alone) == len(learners) else {},
                   warmup_s=max(warmups) if warmups and len(warmups) == len(learners) else None, **fields)

    @property
    def learner_replay_inrun_s(self) -> float | None:
        """A learner's ``replay`` seconds per update in the run (sample + priority update, lock
        waits included); None without learners or updates."""
        n = self.processes.get("learner", 0)
        replay = self.profiles.get("learner", {}).get("replay")
        if not n or not self.updates or replay is None:
            return None
        return replay / (n * self.updates)

    @property
    def learner_replay_alone_s(self) -> float | None:
        """The same calls' seconds per update timed alone after the run (:attr:`replay_alone`:
        sample + update, the tensor conversion left out as the run's ``replay`` leaves it out);
        None when not measured."""
        a = self.replay_alone
        if not a or not a.get("calls"):
            return None
        return (a["sample"] + a["update"]) / a["calls"]

    @property
    def learner_replay_cpu_inrun_over_alone(self) -> float | None:
        """The learner thread's CPU seconds per update in its sample and update calls, in the
        run over alone (x): above 1, the calls themselves do more work or miss caches more in
        the run; the rest of :attr:`learner_replay_inrun_over_alone` is time off the CPU. None
        when either was not measured."""
        parts, a = self.replay_parts.get("learner") or {}, self.replay_alone
        n = self.processes.get("learner", 0) * self.updates
        if not n or not parts.get("cpu") or not a or not a.get("calls") or not a.get("cpu"):
            return None
        return (parts["cpu"] / n) / (a["cpu"] / a["calls"])

    @property
    def learner_replay_inrun_over_alone(self) -> float | None:
        """:attr:`learner_replay_inrun_s` over :attr:`learner_replay_alone_s` (x): what the run
        adds to the learner's replay calls (1.0 = nothing); None when either is unknown."""
        alone = self.learner_replay_alone_s
        inrun = self.learner_replay_inrun_s if alone else None
        return inrun / alone if inrun is not None else None

    @property
    def part_steps(self) -> int:
        """Env steps this call ran (all of them unless resumed)."""
        return self.env_steps - self.resumed_steps

    @property
    def part_updates(self) -> int:
        """Learner updates this call did (all of them unless resumed)."""
        return self.updates - self.resumed_updates

    @property
    def part_wall_s(self) -> float:
        """Wall seconds of this call's part (all of them unless resumed)."""
        return self.wall_s - self.resumed_wall_s

    @property
    def env_steps_per_s(self) -> float:
        """:attr:`part_steps` over :attr:`part_wall_s` (a run from scratch: all of them)."""
        return self.part_steps / self.part_wall_s if self.part_wall_s > 0 else float("nan")

    @property
    def updates_per_s(self) -> float:
        """:attr:`part_updates` over :attr:`part_wall_s`."""
        return self.part_updates / self.part_wall_s if self.part_wall_s > 0 else float("nan")

    @property
    def reached(self) -> bool:
        return self.time_to_threshold_s is not None

    def recent_mean(self, window: int | None = None) -> float | None:
        window = window or self.window
        rets = [r for _, _, r in self.episodes[-window:]]
        return sum(rets) / len(rets) if rets else None
