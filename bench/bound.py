"""What bounds a training run's throughput, from its profile: the actors, the learners, or the buffer.

Every process of a run reports seconds per section (:mod:`impl.rl.common.profiler`: env_step,
inference, replay, sgd, wait, other), summed per role in ``TrainResult.profiles``. A role's
*busy* seconds are all but ``wait`` (blocked on the rate limiter or a start-up barrier): what
it would need for the same work if it never waited. So each role caps the run at

- the acting roles (``actor``; in dataflow runs also ``env_worker``, the server's env
  processes; ``sequential`` for the one-process loop): ``env_steps / (busy / processes)``
  env steps per second, the rate at which the role's processes, working in parallel, produce
  the run's steps;
- the learners: ``updates / (busy / processes)`` updates per second (the learners work in
  lockstep, each doing every update's share) times the run's env steps per update,
  ``env_steps / updates``. That is the nominal ``1 / updates_per_step`` plus the steps taken
  before learning starts (which need no update), so a short run is not held to a rate its
  first steps never needed.

Every cap is thus ``env_steps / (busy / processes)``: the run can be no shorter than its
busiest role's busy time per process.

The run's **bound** is the smallest cap; its kind is the role that sets it ("actor" or
"learner"), or "buffer" when ``replay`` (add, sample, update, lock waits included) is the
largest busy section of that role: then the buffer, not the role's own work, is what a
faster run must cut. The **fraction** is the run's env steps per second over the bound
(1.0 = the binding role never waited; it is the binding role's busy share of the wall
time). A sequential run's cap is its own busy rate; its kind
is the largest of acting (env_step + inference), learning (sgd) and replay.

What this leaves out (so a fraction below 1 does not say which): cores shared by more
processes than the machine has (each process's busy time then includes time it was runnable
but not running), the time from spawn to "go", and the waits of the binding role, which are
what the fraction measures. Cost: O(roles x sections).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Bound", "BOUND_KINDS", "run_bound"]

BOUND_KINDS = ("actor", "learner", "buffer")
_ACTING = ("env_step", "inference")


@dataclass(frozen=True)
class Bound:
    """A run's bound (see the module docstring): ``kind`` in :data:`BOUND_KINDS`, the env steps
    per second the binding role could sustain (``steps_per_s``), the run's fraction of it, the
    role that sets it, and every role's cap (env steps/s)."""

    kind: str
    steps_per_s: float
    fraction: float
    role: str
    caps: dict


def _busy(sections: dict) -> float:
    return sum(v for k, v in sections.items() if k != "wait")


def _largest(sections: dict) -> str:
    busy = {k: v for k, v in sections.items() if k != "wait"}
    return max(busy, key=busy.get)


def run_bound(profiles: dict, processes: dict, env_steps: int, updates: int, wall_s: float) -> Bound | None:
    """The bound of one run from its ``TrainResult`` fields; None when the profile cannot give
    one (no env steps, no wall time, a role with no busy time, or learners without updates).

    ``profiles``: role -> {section: seconds}, summed over the role's ``processes[role]``
    processes. Raises ValueError
    naming the argument for a negative or non-finite number, or a role missing from
    ``processes``.
    """
    for name, value in (("env_steps", env_steps), ("updates", updates), ("wall_s", wall_s)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    missing = sorted(set(profiles) - set(processes))
    if missing:
        raise ValueError(f"processes has no count for role(s) {missing} of profiles")
    if env_steps == 0 or wall_s == 0 or not profiles:
        return None
    caps = {}
    for role, sections in profiles.items():
        busy = _busy(sections) / max(1, processes[role])
        if busy <= 0.0:
            return None
        if role == "learner" and updates == 0:
            return None
        caps[role] = env_steps / busy  # for the learners: updates / busy x env_steps / updates
    role = min(caps, key=caps.get)
    sections = profiles[role]
    if role == "sequential":
        parts = {"actor": sum(sections.get(k, 0.0) for k in _ACTING), "learner": sections.get("sgd", 0.0),
                 "buffer": sections.get("replay", 0.0)}
        kind = max(parts, key=parts.get)
    elif _largest(sections) == "replay":
        kind = "buffer"
    else:
        kind = "learner" if role == "learner" else "actor"
    bound = caps[role]
    return Bound(kind, bound, (env_steps / wall_s) / bound, role, caps)
