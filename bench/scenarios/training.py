"""The training scenario: the actor/learner loop end to end, one cell per training run.

Two entry points, both run by the driver (:mod:`bench.driver`) into ``results/<run-id>/``:

- ``replaybench train --algo dqn --env CartPole-v1 --buffer kary-aligned --policy lazy-writing
  --actors 2 --learners 1 --steps 50000 --seed 0``: one run with a progress bar (env steps/s,
  updates/s, mean return of the last 20 episodes). ``--actors 0``, ``--learners 0`` or
  ``--sequential`` runs the sequential baseline.
- ``replaybench run --suite training``: bench/suites/training.json's grid (:func:`suite_configs`):
  buffers (variant + policy + parameters) x (actors, learners) x seeds, the sequential
  baseline included, one run after another. Selection: ``--variants`` keeps the suite's
  buffers of those variants. A suite's ``backends`` (default ``["process"]``) runs each
  parallel layout on each engine of the loop, the process backend first
  (bench/suites/training-ray.json: Ray against processes in one run;
  bench/suites/training-dataflow.json: processes, the static dataflow and Ray).

Rows (scenario "training", ``engine`` the engine that ran: "sequential" for the baseline,
"process", "ray" or "dataflow" for the parallel layouts; runs stored before the engine column
have ``mode`` "processes", "ray" or "dataflow" instead, which the readers map; the sequential
baseline has actors = learners = 0, policy "none" and ``"baseline": true`` in params;
params.envs_per_actor is E, the environments each actor, and the sequential loop, steps with
one batched forward; params.device is where the learners computed, "cpu" or "cuda"
(``TrainConfig.device``; ``device_setting`` "auto" when so asked), params.device_name the GPU's
name or the CPU's model), per run:

- op "summary", one row per metric: env_steps_per_s (steps/s), updates_per_s (updates/s),
  sample_latency_s (s, mean per buffer.sample call), time_to_threshold_s (s; status "skipped"
  with error "threshold not reached in N steps" when not reached), steps_to_threshold (steps;
  same), actor_wait_s and learner_wait_s (s, summed over the processes of the role: blocked on
  the rate limiter), buffer_lock_wait_s (s, summed; absent for the lock-free baseline),
  speedup (x: env_steps_per_s over the baseline's with the same buffer, seed and E, when the
  baseline is in the same run; 1.0 for the baseline itself); vs_process (x, Ray and dataflow
  runs: env_steps_per_s over the process backend's run of the same configuration in the same run);
  actor_restarts and dropped_batches (Ray runs only: actor processes restarted, batches lost
  with them); bound_steps_per_s (steps/s) and bound_fraction (x), with params.bound = "actor",
  "learner" or "buffer" and params.bound_role (the role that sets it): what bounds the run and
  the fraction of that bound it reached, from its profile (:mod:`bench.bound`; absent when the
  profile cannot say, e.g. a run without updates); a run resumed from a checkpoint (PAAC) has
  its rates and bound of the part it ran after the resume (``TrainResult.part_steps`` over
  ``part_wall_s``), its episodes, time_to_threshold_s and steps_to_threshold of the whole run;
  learner_replay_inrun_s and learner_replay_alone_s (s per update: a learner's ``replay``
  section, sample + priority update, in the run, and the same calls timed alone after it, when
  no actor inserts, paced as in the run: the learner's gradient step between sample and update
  and its mean wait per update before each call, untimed) and learner_replay_inrun_over_alone (x: the first over the second, what the
  run adds to the calls; issue 26's target is <= 1.5x) and learner_replay_cpu_inrun_over_alone
  (x: the same for the learner thread's CPU seconds in those calls; the difference is time off
  the CPU), for the engines that measure them (process, dataflow);
- op "replay_part", metric sample / update / cpu / lock_wait (s) / redrawn_rows (rows, in-run
  only) / tensor, learn, pause (s, alone only; learn and pause are the untimed gradient steps
  and waits that pace the calls alone as the run paced them): what the learners' replay
  seconds are made of, summed over the learners, with params.when "in-run" or "alone" and
  params.calls (:func:`replay_part_rows`, :mod:`impl.rl.common.replay_timing`); beside the
  profile rows, never summed with them;
- op "episode", metric "return": one row per finished episode, with env_steps and wall_s
  (seconds since the first env step) and ``repeat`` = the episode's index;
- op "profile", metric env_step / inference / replay / sgd / wait / other: seconds, summed over
  the processes of one role, named in params (``"role"``: "sequential", "actor" or "learner",
  and ``"processes"``; dataflow runs: "actor" is the server, "env_worker" its env processes).
  Sum over roles for a run's total process time.

A run that fails (a worker raised, a timeout) is one row (op "summary", metric
env_steps_per_s) with status "failed" and the error; the suite goes on with the next run. A
run on a device this machine lacks (``devices: ["cpu", "cuda"]`` without a GPU) is one such
row with status "unavailable" and the reason. A parallel layout of a ``"layouts": "cores"``
grid with more workers (actors + learners) than the machine's usable cores is one such row
with status "skipped", the reason, and params.cores (bench/suites/training-cores.json).

A suite's ``devices`` runs its grid once per learner device, and ``parts`` (a list of grids,
each the suite's keys with its own in their place) puts several algorithms or environments in
one suite: bench/suites/training-gpu-quick.json runs DQN on CartPole and PAAC on Pong, each on
the CPU and on CUDA.

Episode rows reach rows.csv as the run goes (:class:`EpisodeRows`: every
:data:`WRITE_EVERY_S` seconds, through the driver's ``RunState.write``), the summary and
profile rows when it ends; so a run that fails, is interrupted, or cannot write its last rows
(a full disk) keeps the episodes finished before the last write (its failed row, if any, after
them).
Every configuration is built and checked (``TrainConfig.validate``) when the suite is
expanded, before the first run starts.
"""

from __future__ import annotations

import json
from pathlib import Path

from replaybench.bench import contract
from replaybench.bench.bound import run_bound
from replaybench.bench.scenarios import Cell, RunState, Scenario, Selection, SelectionError, suite_errors

__all__ = ["SUMMARY_UNITS", "REPLAY_PART_UNITS", "WRITE_EVERY_S", "run_base", "episode_rows", "result_rows",
           "replay_part_rows", "EpisodeRows", "ProgressBar",
           "format_table", "suite_configs", "suite_grid", "core_layouts", "Training", "SCENARIO", "run_configs"]

#: Seconds between two writes of a run's new episode rows while it trains (:class:`EpisodeRows`):
#: what a failure at the end can lose at most, against an fsync per write in the loop's process.
WRITE_EVERY_S = 5.0

#: Summary metrics and their units, in the order they are written.
SUMMARY_UNITS = {"env_steps_per_s": "steps/s", "updates_per_s": "updates/s", "sample_latency_s": "s",
                 "time_to_threshold_s": "s", "steps_to_threshold": "steps", "actor_wait_s": "s",
                 "learner_wait_s": "s", "buffer_lock_wait_s": "s", "speedup": "x", "vs_process": "x",
                 "actor_restarts": "count", "dropped_batches": "count", "bound_steps_per_s": "steps/s",
                 "bound_fraction": "x", "learner_replay_inrun_s": "s", "learner_replay_alone_s": "s",
                 "learner_replay_inrun_over_alone": "x", "learner_replay_cpu_inrun_over_alone": "x", "warmup_s": "s"}

#: Units of the op "replay_part" rows' metrics (:mod:`impl.rl.common.replay_timing`).
REPLAY_PART_UNITS = {"sample": "s", "update": "s", "cpu": "s", "lock_wait": "s", "redrawn_rows": "rows",
                     "tensor": "s", "learn": "s", "pause": "s"}

#: Summary metrics a run may lack (not applicable to it, or not measured by its engine): no row then.
_OPTIONAL = ("buffer_lock_wait_s", "speedup", "sample_latency_s", "vs_process", "actor_restarts", "dropped_batches",
             "learner_replay_inrun_s", "learner_replay_alone_s", "learner_replay_inrun_over_alone",
             "learner_replay_cpu_inrun_over_alone", "warmup_s")


# ------------------------------------------------------------------------------------------ rows
def _structure_and_k(variant: str, buffer_params: dict):
    from replaybench.impl import registry

    try:
        v = registry.get(variant)
    except KeyError:
        return "unknown", buffer_params.get("K")
    return v.structure, buffer_params.get("K", v.params.get("K"))


def device_params(setting: str) -> dict:
    """What a run's rows say of its learners' device (``TrainConfig.device``): ``device``, the
    kind it resolves to here ("cpu" or "cuda"), ``device_name`` (the GPU's name or the CPU's
    model; None for a device this machine lacks) and, for "auto", ``device_setting``."""
    from replaybench.impl.rl.common.device import device_name, resolve_device, unavailable_reason

    device = resolve_device(setting)
    out = {"device": device.type,
           "device_name": None if unavailable_reason(setting) is not None else device_name(device)}
    if setting != device.type:
        out["device_setting"] = setting
    return out


def run_base(cfg, acfg, base: dict) -> dict:
    """The columns every row of one run shares."""
    structure, k = _structure_and_k(cfg.buffer, cfg.buffer_params)
    params = {**cfg.buffer_params, "steps": cfg.steps, "updates_per_step": acfg.updates_per_step,
              "batch_size": acfg.batch_size, "insert_batch": cfg.insert_batch, "envs_per_actor": cfg.envs_per_actor,
              **device_params(cfg.device)}
    if cfg.sequential:
        params["baseline"] = True
    else:
        params.update(weight_sync_every=cfg.weight_sync_every, ratio_tolerance=cfg.ratio_tolerance)
        if cfg.learner_prefetch:
            params["learner_prefetch"] = True
        if cfg.priority_lag:
            params["priority_lag"] = cfg.priority_lag
    if cfg.overrides:
        params["overrides"] = {key: list(v) if isinstance(v, tuple) else v for key, v in cfg.overrides.items()}
    return {**base, "scenario": "training", "variant": cfg.buffer, "structure": structure, "K": k,
            "policy": "none" if cfg.sequential else cfg.policy, "algo": cfg.algo, "env": cfg.env,
            "actors": 0 if cfg.sequential else cfg.actors, "learners": 0 if cfg.sequential else cfg.learners,
            "seed": cfg.seed, "engine": cfg.engine,
            "capacity": acfg.buffer_capacity, "batch": acfg.batch_size,
            "params": params}


def episode_rows(episodes, row: dict, start: int = 0) -> list[dict]:
    """Rows of ``episodes[start:]`` ((env_steps, wall_s, return) each; ``repeat`` = its index in
    ``episodes``) of one run (``row``: its shared columns)."""
    return [{**row, "op": "episode", "metric": "return", "value": ret, "unit": "return", "repeat": i,
             "env_steps": steps, "wall_s": wall, "status": "ok"}
            for i, (steps, wall, ret) in enumerate(episodes[start:], start)]


def result_rows(result, row: dict, speedup: float | None = None, vs_process: float | None = None,
                first_episode: int = 0) -> list[dict]:
    """Summary, episode and profile rows of one finished run (``row``: its shared columns);
    the episodes from index ``first_episode`` on (those before it were written as it ran)."""
    ray = result.engine == "ray"
    values = {"env_steps_per_s": result.env_steps_per_s, "updates_per_s": result.updates_per_s,
              "sample_latency_s": result.sample_latency_s, "time_to_threshold_s": result.time_to_threshold_s,
              "steps_to_threshold": result.steps_to_threshold, "actor_wait_s": result.actor_wait_s,
              "learner_wait_s": result.learner_wait_s, "buffer_lock_wait_s": result.buffer_lock_wait_s,
              "speedup": speedup, "vs_process": vs_process, "actor_restarts": result.actor_restarts if ray else None,
              "dropped_batches": result.dropped_batches if ray else None,
              "learner_replay_inrun_s": result.learner_replay_inrun_s if result.replay_alone else None,
              "learner_replay_alone_s": result.learner_replay_alone_s,
              "learner_replay_inrun_over_alone": result.learner_replay_inrun_over_alone,
              "learner_replay_cpu_inrun_over_alone": result.learner_replay_cpu_inrun_over_alone,
              "warmup_s": result.warmup_s}
    out = []
    for metric, value in values.items():
        if value is None and metric in _OPTIONAL:
            continue  # not applicable to this run
        r = {**row, "op": "summary", "metric": metric, "unit": SUMMARY_UNITS[metric], "repeat": 0}
        if value is None:  # the threshold was not reached
            r.update(status="skipped", error=f"threshold not reached in {result.env_steps} steps")
        else:
            r.update(status="ok", value=float(value))
        out.append(r)
    # the profiles, like the rates, are of the part this call ran (a resumed run's second part)
    bound = run_bound(result.profiles, result.processes, result.part_steps, result.part_updates, result.part_wall_s)
    if bound is not None:
        params = {**row["params"], "bound": bound.kind, "bound_role": bound.role}
        for metric, value in (("bound_steps_per_s", bound.steps_per_s), ("bound_fraction", bound.fraction)):
            out.append({**row, "params": params, "op": "summary", "metric": metric, "unit": SUMMARY_UNITS[metric],
                        "repeat": 0, "status": "ok", "value": float(value)})
    out += episode_rows(result.episodes, row, first_episode)
    for role, sections in result.profiles.items():
        params = {**row["params"], "role": role, "processes": result.processes[role]}
        for section, seconds in sections.items():
            out.append({**row, "params": params, "op": "profile", "metric": section, "value": seconds, "unit": "s",
                        "repeat": 0, "status": "ok"})
    return out + replay_part_rows(result, row)


def replay_part_rows(result, row: dict) -> list[dict]:
    """Op "replay_part" rows of one run: what the learners' ``replay`` section is made of in the
    run (params.when "in-run", params.calls = the learners' updates) and the same calls alone
    after it (params.when "alone", params.calls = the calls timed), summed over the learners
    (params.processes); units :data:`REPLAY_PART_UNITS`. None for a run that did not measure them."""
    out = []
    n = result.processes.get("learner", 0)
    measured = [("in-run", result.replay_parts.get("learner") or {}, n * result.updates)]
    alone = dict(result.replay_alone)
    measured.append(("alone", alone, alone.pop("calls", 0)))
    for when, parts, calls in measured:
        if not parts:
            continue
        params = {**row["params"], "role": "learner", "processes": n, "when": when, "calls": calls}
        out += [{**row, "params": params, "op": "replay_part", "metric": part, "value": float(value),
                 "unit": REPLAY_PART_UNITS[part], "repeat": 0, "status": "ok"} for part, value in parts.items()]
    return out


# ------------------------------------------------------------------------------------------ progress
class EpisodeRows:
    """A training loop's ``progress`` callback that writes the run's new episode rows every
    ``every_s`` seconds (default :data:`WRITE_EVERY_S`) through ``write`` (the driver's ``RunState.write``: appended to
    rows.csv and fsync'ed), so they are on disk before the run ends. ``then``, when given, is
    called first with the same arguments (the progress bar).

    :attr:`written` counts the episodes written; the run's final rows start there
    (:func:`result_rows`'s ``first_episode``). ``write`` None: nothing is written. Cost: one
    append and fsync per ``every_s`` seconds, in the process that calls ``progress``.
    """

    def __init__(self, write, row: dict, then=None, every_s: float | None = None):
        import time

        self.write, self.row, self.then = write, row, then
        self.every_s = WRITE_EVERY_S if every_s is None else every_s
        self.written = 0
        self._last = time.monotonic()

    def __call__(self, env_steps: int, updates: int, recent, episodes=()) -> None:
        import time

        if self.then is not None:
            self.then(env_steps, updates, recent, episodes)
        now = time.monotonic()
        if self.write is None or now - self._last < self.every_s or len(episodes) <= self.written:
            return
        self._last = now
        count = len(episodes)  # the list may grow meanwhile (it is the loop's own)
        self.write(episode_rows(episodes[:count], self.row, self.written))
        self.written = count


class ProgressBar:
    """A tqdm bar over env steps fed by the loops' ``progress`` callback."""

    def __init__(self, total: int, desc: str, enabled: bool = True, bar=None):
        from tqdm import tqdm

        self.bar = bar or tqdm(total=total, desc=desc, unit="step", disable=not enabled, dynamic_ncols=True)
        self.own = bar is None
        self._first = None  # (time, env_steps, updates) at the first report: rates are taken from there
        self._n = 0

    def __call__(self, env_steps: int, updates: int, recent, episodes=()) -> None:
        import time

        now = time.monotonic()
        if self._first is None:
            self._first = (now, env_steps, updates)
        t0, s0, u0 = self._first
        ret = "-" if recent is None else f"{recent:.1f}"
        if now - t0 > 0.1:
            rates = f"{(env_steps - s0) / (now - t0):.0f} steps/s {(updates - u0) / (now - t0):.0f} upd/s "
        else:
            rates = ""
        self.bar.set_postfix_str(f"{rates}return {ret}")
        if self.own:
            self.bar.update(env_steps - self._n)
            self._n = env_steps

    def close(self) -> None:
        if self.own:
            self.bar.close()


# ------------------------------------------------------------------------------------------ table
def format_table(rows: list[dict]) -> str:
    """One line per run (its learners' device and settings among the keys:
    :func:`bench.contract.training_settings`): throughput, time to threshold, waits, speedup,
    the replay share (replay seconds over all process seconds of the run: every section of
    every process), and what bounds the run with the fraction of that bound reached
    (:mod:`bench.bound`), and the learner's replay seconds per update in the run over the same
    calls alone."""
    from replaybench.bench.summary import format_table as table

    runs: dict[tuple, dict] = {}
    for r in rows:
        params = json.loads(r["params"]) if isinstance(r["params"], str) else r["params"]  # read back or in memory
        ratio = params.get("updates_per_step")
        key = (r["variant"], r["policy"], ratio, params.get("envs_per_actor", 1), r["actors"], r["learners"],
               r["seed"], r.get("engine"), contract.training_device(params), contract.training_settings(params),
               r.get("algo"), r.get("env"))
        entry = runs.setdefault(key, {"profile": {}})
        if r["op"] == "summary":
            entry[r["metric"]] = r.get("value") if r["status"] == "ok" else r["status"]
            if r["metric"] == "bound_fraction":
                entry["bound"] = params.get("bound")
        elif r["op"] == "profile":
            entry["profile"][r["metric"]] = entry["profile"].get(r["metric"], 0.0) + float(r["value"])

    def num(x, fmt):
        return fmt.format(x) if isinstance(x, (int, float)) else (x or "-")

    body = []
    for (variant, policy, ratio, envs, a, l, seed, engine, device, settings, _, _), e in runs.items():
        total = sum(e["profile"].values())
        share = e["profile"].get("replay", 0.0) / total if total else None
        body.append([variant, policy, str(engine), str(device), settings, str(ratio), str(envs), str(a), str(l), str(seed),
                     num(e.get("env_steps_per_s"), "{:.0f}"), num(e.get("updates_per_s"), "{:.0f}"), num(e.get("time_to_threshold_s"), "{:.1f}"),
                     num(e.get("speedup"), "{:.2f}"), num(e.get("vs_process"), "{:.2f}"),
                     num(e.get("actor_wait_s"), "{:.1f}"),
                     num(e.get("learner_wait_s"), "{:.1f}"), num(share, "{:.1%}"), e.get("bound") or "-",
                     num(e.get("bound_steps_per_s"), "{:.0f}"), num(e.get("bound_fraction"), "{:.0%}"),
                     num(e.get("learner_replay_inrun_over_alone"), "{:.2f}")])
    header = ["variant", "policy", "engine", "device", "settings", "upd/step", "E", "A", "L", "seed", "steps/s", "upd/s",
              "t_thresh s", "speedup", "vs process", "actor wait s", "learner wait s", "replay share", "bound",
              "bound steps/s", "of bound", "replay/alone"]
    return "\n".join(table(header, body, set(range(5, len(header)))))


# ------------------------------------------------------------------------------------------ suite
#: The keys of a training suite's grid (:func:`suite_configs`), which a part may set.
GRID_KEYS = ("algo", "env", "steps", "seeds", "buffers", "layouts", "max_workers", "ratios", "envs_per_actor",
             "backends", "devices", "overrides", "insert_batch", "weight_sync_every", "ratio_tolerance", "timeout_s",
             "start_method", "learner_prefetch", "priority_lag")


def core_layouts(max_workers: int) -> list[tuple[int, int]]:
    """The ``"cores"`` layouts: the sequential baseline, then at every worker count ``w`` in
    2, 4, 8, ... up to ``max_workers`` (and ``max_workers`` itself when it is not a power of
    two) the splits of ``w`` processes into ``w - L`` actors and ``L`` learners for L = 1, 2,
    4, ... while ``L <= w / 2`` (the actors, which bound a run at a low update ratio, never
    fewer than the learners): 2 -> (1, 1); 4 -> (3, 1), (2, 2); 8 -> (7, 1), (6, 2), (4, 4);
    ... A worker is one process (the parent only watches)."""
    if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 2:
        raise ValueError(f"max_workers must be an integer >= 2, got {max_workers!r}")
    counts = [1 << k for k in range(1, max_workers.bit_length()) if 1 << k <= max_workers]
    counts += [max_workers] if counts[-1] != max_workers else []
    out = [(0, 0)]
    for w in counts:
        learners = 1
        while learners <= w // 2:
            out.append((w - learners, learners))
            learners *= 2
    return out


#: The keys of one entry of a training suite's ``buffers``; ``variant`` is required.
BUFFER_KEYS = ("variant", "policy", "params")


def _buffers(value) -> list[dict]:
    """The suite's ``buffers``, or a ValueError naming what is wrong: not a non-empty list of
    objects, an entry without ``variant``, or an entry's key outside :data:`BUFFER_KEYS` (with
    the allowed keys and the nearest one: ``"polic"`` would otherwise be ignored and the run go
    on under the default policy). Checks keys only; the values are TrainConfig's to check."""
    import difflib

    if not isinstance(value, list) or not value:
        raise ValueError(f"'buffers' must be a non-empty list of {{\"variant\", \"policy\", \"params\"}} objects, "
                         f"got {value!r}")
    allowed = ", ".join(repr(k) for k in sorted(BUFFER_KEYS))
    for i, entry in enumerate(value):
        if not isinstance(entry, dict):
            raise ValueError(f"'buffers' entry {i} must be an object with keys {allowed}, got {entry!r}")
        for key in sorted(set(entry) - set(BUFFER_KEYS), key=str):
            near = difflib.get_close_matches(str(key), BUFFER_KEYS, n=1)
            hint = f"did you mean {near[0]!r}? " if near else ""
            raise ValueError(f"'buffers' entry {i} {entry!r}: unknown key {key!r}; {hint}an entry may set {allowed}")
        if "variant" not in entry:
            raise ValueError(f"'buffers' entry {i} {entry!r} lacks 'variant'; an entry may set {allowed}")
    return value


def _layouts(value, max_workers=None) -> list[tuple[int, int]]:
    """The suite's ``layouts`` as ``(actors, learners)`` pairs, or a ValueError naming the value:
    a list of two-item lists of integers >= 0 (``"2,1"`` or ``[2, 1]`` is not one), or
    ``"cores"``: :func:`core_layouts` up to the larger of ``max_workers`` (an integer, or
    ``"cores"``: no more than the machine's) and this machine's usable cores
    (:func:`impl.machine.usable_cores`)."""
    if value == "cores":
        from replaybench.impl.machine import usable_cores

        if max_workers is None or max_workers == "cores":
            max_workers = usable_cores()
        elif isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 2:
            raise ValueError(f"'max_workers' must be an integer >= 2 or \"cores\", got {max_workers!r}")
        return core_layouts(max(2, max_workers, usable_cores()))
    if max_workers is not None:
        raise ValueError(f"'max_workers' goes with 'layouts': \"cores\", not with layouts {value!r}")

    def pair(x) -> bool:
        return (isinstance(x, (list, tuple)) and len(x) == 2
                and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in x))

    if not isinstance(value, list) or not value or not all(pair(x) for x in value):
        raise ValueError(f"'layouts' must be a non-empty list of [actors, learners] pairs of integers >= 0 "
                         f"([0, 0]: the sequential baseline) or \"cores\", got {value!r}")
    return [tuple(x) for x in value]


def suite_configs(suite: dict, variants: list[str] | None = None) -> list:
    """The suite's grid as TrainConfigs: seeds x buffers x layouts, each buffer's baseline first
    (:func:`suite_grid` without the cores each run may use)."""
    return [cfg for cfg, _ in suite_grid(suite, variants)]


def suite_grid(suite: dict, variants: list[str] | None = None) -> list[tuple]:
    """The suite's grid as ``(TrainConfig, cores)`` pairs: seeds x buffers x layouts, each
    buffer's baseline first; ``cores`` is this machine's usable cores for a grid whose layouts
    are ``"cores"`` (a run of more workers is a skipped row, :func:`cells_for`), else None.

    ``suite`` keys: algo, env, steps, seeds, buffers (list of {"variant", "policy", "params"},
    "variant" required, any other key refused: :func:`_buffers`),
    layouts (list of [actors, learners]; [0, 0] = the sequential baseline, and the only layout
    of an algorithm with its own engine, e.g. a2c on PAAC; or ``"cores"``: :func:`core_layouts`
    up to ``max_workers`` or the machine's usable cores, whichever is more, those past the usable
    cores listed as skipped rows so that a small machine's run names the cells it could not
    measure: bench/suites/training-cores.json), and optionally
    ratios (updates_per_step values, each a grid point with its own baseline; default: the
    algorithm's preset), envs_per_actor (E values, each a grid point with its own sequential
    baseline stepping E envs too; default [1]), backends (engines of the parallel layouts,
    "process", "ray" and/or "dataflow"; default ["process"]; the baseline runs once), devices
    (the learners' ``TrainConfig.device`` values, each a grid point with its own baseline;
    default ["cpu"]), overrides (algorithm config), insert_batch, weight_sync_every,
    ratio_tolerance, timeout_s, start_method, learner_prefetch, priority_lag.

    ``parts`` (optional): a list of objects, each a grid of its own made of the suite's keys with
    its own (any of :data:`GRID_KEYS`) in their place, run in order: several algorithms or
    environments in one suite (bench/suites/training-gpu-quick.json).
    """
    if suite.get("parts") is not None:
        parts = suite["parts"]
        if not isinstance(parts, list) or not parts or not all(isinstance(p, dict) for p in parts):
            raise ValueError(f"'parts' must be a non-empty list of objects, got {parts!r}")
        configs = []
        for part in parts:
            unknown = sorted(set(part) - set(GRID_KEYS))
            if unknown:
                raise ValueError(f"a part may set {list(GRID_KEYS)}, not {unknown}")
            whole = {k: v for k, v in suite.items() if k != "parts"}
            configs += suite_grid({**whole, **part}, variants)
        return configs
    from replaybench.impl.rl import TrainConfig

    devices = suite.get("devices") or ["cpu"]
    if not isinstance(devices, list):
        raise ValueError(f"'devices' must be a list of TrainConfig.device values, got {devices!r}")
    buffers = [b for b in _buffers(suite["buffers"]) if variants is None or b["variant"] in variants]
    if variants is not None and not buffers:
        known = sorted({b["variant"] for b in suite["buffers"]})
        raise ValueError(f"no buffer of suite {suite['name']!r} is among {variants}; the suite has {known}")
    layouts = sorted(_layouts(suite["layouts"], suite.get("max_workers")), key=lambda al: (al[0] * al[1] != 0, al))
    if suite["layouts"] == "cores":
        from replaybench.impl.machine import usable_cores

        cores = usable_cores()
    else:
        cores = None
    overrides = {k: tuple(v) if isinstance(v, list) else v for k, v in (suite.get("overrides") or {}).items()}
    extra = {k: suite[k] for k in ("insert_batch", "weight_sync_every", "ratio_tolerance", "timeout_s",
                                    "start_method", "learner_prefetch", "priority_lag") if k in suite}
    ratios = suite.get("ratios") or [None]
    backends = sorted(suite.get("backends") or ["process"], key=lambda b: b != "process")  # process runs first
    configs = []
    for device in devices:
        for ratio in ratios:
            ratio_override = {} if ratio is None else {"updates_per_step": ratio}
            for envs in suite.get("envs_per_actor") or [1]:
                for seed in suite["seeds"]:
                    for b in buffers:
                        for actors, learners in layouts:
                            for backend in (["process"] if actors * learners == 0 else backends):
                                configs.append((TrainConfig(algo=suite["algo"], env=suite["env"], buffer=b["variant"],
                                                            policy=b.get("policy", "lazy-writing"),
                                                            buffer_params=dict(b.get("params") or {}), actors=actors,
                                                            learners=learners, steps=suite["steps"], seed=seed,
                                                            envs_per_actor=envs,
                                                            overrides={**overrides, **ratio_override},
                                                            backend=backend, device=device, **extra), cores))
    return configs


# ------------------------------------------------------------------------------------------ scenario
def _baseline_key(cfg) -> tuple:
    """Runs with the same key compare with the same sequential baseline (same buffer, seed,
    length, ratio and algorithm settings)."""
    return (cfg.algo, cfg.env, cfg.buffer, json.dumps(cfg.buffer_params, sort_keys=True), cfg.seed, cfg.steps,
            cfg.envs_per_actor, json.dumps(cfg.overrides, sort_keys=True, default=str), cfg.device)


def _resolved(cfg) -> dict:
    """``{"resolved_storage": ..., "resolved_prefetch": ...}`` of the run's replay buffer
    (:func:`impl.rl.common.local_replay.resolved_params`, from the env's transition schema);
    ``{}`` for an algorithm with its own engine, which keeps no replay buffer."""
    from replaybench.impl.rl import algorithms
    from replaybench.impl.rl.common.envs import make_env, transition_fields
    from replaybench.impl.rl.common.local_replay import resolved_params

    algo = algorithms.get(cfg.algo)
    if algo.engine is not None:
        return {}
    env = make_env(cfg.env, algo)
    try:
        fields = transition_fields(env)
    finally:
        env.close()
    return {f"resolved_{k}": v for k, v in resolved_params(cfg, cfg.validate(), fields).items()}


def cells_for(configs: list) -> list[Cell]:
    """One cell per TrainConfig (or ``(TrainConfig, cores)`` pair, :func:`suite_grid`), each
    checked (SelectionError naming the run). A run whose ``device`` this machine lacks (``cuda``
    where torch sees no GPU) is an ``unavailable`` cell naming the reason; a parallel run of more
    workers (actors + learners) than ``cores`` a ``skipped`` cell saying so; the rest of its
    config is checked all the same. A cell's label names the algorithm overrides that differ
    between the cells (e.g. ``cuda_graph=False``)."""
    import dataclasses

    from replaybench.impl.rl import algorithms
    from replaybench.impl.rl.common.device import DEVICES, unavailable_reason

    cells = []
    plain = [item[0] if isinstance(item, tuple) else item for item in configs]
    # the algorithm overrides that tell cells apart (their labels name them); the ratio has its own key
    varying = {k for cfg in plain for k in cfg.overrides
               if k != "updates_per_step" and len({repr(c.overrides.get(k)) for c in plain}) > 1}
    for item in configs:
        cfg, cores = item if isinstance(item, tuple) else (item, None)
        own = algorithms.ALGORITHMS.get(cfg.algo).engine if cfg.algo in algorithms.ALGORITHMS else None
        if own is not None:  # an algorithm's own engine: no buffer, no layout
            label = f"{cfg.algo} {cfg.env} {own} seed={cfg.seed}"
        else:
            label = (f"{cfg.buffer}/{cfg.policy} A={cfg.actors} L={cfg.learners} seed={cfg.seed}"
                     + ("" if cfg.backend == "process" else f" {cfg.backend}")
                     if not cfg.sequential else f"{cfg.buffer} sequential seed={cfg.seed}")
        if cfg.envs_per_actor != 1:
            label += f" E={cfg.envs_per_actor}"
        if cfg.learner_prefetch and not cfg.sequential and own is None:
            label += " prefetch"
        if cfg.priority_lag and not cfg.sequential and own is None:
            label += f" lag={cfg.priority_lag}"
        label += "".join(f" {k}={v}" for k, v in sorted(cfg.overrides.items()) if k in varying)
        if cfg.device != "cpu":
            label += f" device={cfg.device}"
        missing = unavailable_reason(cfg.device) if cfg.device in DEVICES else None
        try:
            # every field, the buffer, the policy and the env/algorithm fit (a missing device aside)
            acfg = (dataclasses.replace(cfg, device="cpu") if missing else cfg).validate()
        except ValueError as err:
            raise SelectionError(f"training run {label}: {err}") from None
        columns = {**run_base(cfg, acfg, {}), "op": "summary", "metric": "env_steps_per_s", "unit": "steps/s"}
        if missing:
            cells.append(Cell(label, columns, cfg, skip=f"device {cfg.device!r}: {missing}", skip_status="unavailable"))
        elif cores is not None and not cfg.sequential and cfg.actors + cfg.learners > cores:
            cells.append(Cell(label, {**columns, "params": {**columns["params"], "cores": cores}}, cfg,
                              skip=f"{cfg.actors + cfg.learners} workers ({cfg.actors} actors + {cfg.learners} "
                                   f"learner{'s' * (cfg.learners != 1)}) past this machine's {cores} usable "
                                   f"core{'s' * (cores != 1)}", skip_status="skipped"))
        else:
            cells.append(Cell(label, columns, cfg))
    return cells


class Training(Scenario):
    """Training runs end to end (see the module docstring)."""

    name = "training"
    suite_keys = frozenset({"algo", "env", "steps", "seeds", "buffers", "layouts", "max_workers", "ratios",
                            "envs_per_actor",
                            "backends", "overrides", "insert_batch", "weight_sync_every", "ratio_tolerance",
                            "timeout_s", "start_method", "devices", "parts", "learner_prefetch",
                            "priority_lag"})
    unit = "run"

    def cells(self, suite: dict, selection: Selection) -> list[Cell]:
        with suite_errors(suite):
            configs = suite_grid(suite, selection.variants)
        return cells_for(configs)

    def meta(self, suite: dict, selection: Selection, cells: list[Cell]) -> dict:
        return {"runs": [c.spec.to_dict() for c in cells],
                "timing": "wall-clock from the first env step (after start-up and kernel warm-up) until every "
                          "worker finished; per-section time via perf_counter accumulators"}

    def measure(self, cell: Cell, run: RunState) -> list[dict]:
        from replaybench.impl.rl import train

        cfg = cell.spec
        # every row of the run records what the buffer's "auto" settings chose (docs/using.md)
        columns = {**cell.columns, "params": {**(cell.columns.get("params") or {}), **_resolved(cfg)}}
        bar = ProgressBar(cfg.steps, cell.label, run.progress, bar=run.bar if run.cells > 1 else None)
        episodes = EpisodeRows(run.write, columns, then=bar)
        try:
            result = train(cfg, episodes)
        finally:
            bar.close()
        baselines = run.state.setdefault("baselines", {})
        key = _baseline_key(cfg)
        if cfg.sequential:
            baselines[key] = result.env_steps_per_s
        speedup = result.env_steps_per_s / baselines[key] if key in baselines else None
        engines = run.state.setdefault("process_backend", {})  # same config on processes -> its steps/s
        layout = (*key, cfg.policy, cfg.actors, cfg.learners)
        if not cfg.sequential and cfg.backend == "process":
            engines[layout] = result.env_steps_per_s
        vs_process = (result.env_steps_per_s / engines[layout] if cfg.backend != "process" and layout in engines
                      else None)
        return result_rows(result, columns, speedup, vs_process, first_episode=episodes.written)

    def summarize(self, rows: list[dict], meta: dict) -> str:
        return format_table(rows)


SCENARIO = Training()


def run_configs(configs: list, *, run_id: str | None = None, **kwargs) -> Path:
    """Run ``configs`` in order into one run folder through the driver; returns it.

    Baselines (sequential configs) should come before the parallel runs they are compared
    with. The run's suite is named "training" (as ``--suite training`` runs are) and its id
    defaults to ``<UTC time>-train``. Keyword arguments go to :func:`bench.driver.execute`.
    """
    from replaybench.bench import driver, results

    suite = {"name": "training", "scenario": "training",
             "description": "the train command: the runs listed in meta.json's 'runs'"}
    plan = driver.Plan(suite, SCENARIO, cells_for(configs), Selection())
    return driver.execute(plan, run_id=run_id or results.new_run_id("train"), **kwargs)
