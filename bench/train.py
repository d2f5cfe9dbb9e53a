"""The ``training`` scenario: the actor/learner loop end to end, as rows in results/.

Two entry points, both writing ``results/<run-id>/`` through :class:`bench.results.RunWriter`:

- ``replaybench train --algo dqn --env CartPole-v1 --buffer kary-aligned --policy lazy-writing
  --actors 2 --learners 1 --steps 50000 --seed 0``: one run with a progress bar (env steps/s,
  updates/s, mean return of the last 20 episodes). ``--actors 0``, ``--learners 0`` or
  ``--sequential`` runs the sequential baseline.
- ``replaybench run --suite training``: bench/suites/training.json names :func:`run_suite`
  as its runner; it sweeps buffers (variant + policy + parameters) x (actors, learners) x
  seeds, the sequential baseline included, one run after another.

Rows (scenario "training", mode "processes"; the sequential baseline has actors = learners = 0,
policy "none" and ``"baseline": true`` in params), per run:

- op "summary", one row per metric: env_steps_per_s (steps/s), updates_per_s (updates/s),
  sample_latency_s (s, mean per buffer.sample call), time_to_threshold_s (s; status "skipped"
  with error "threshold not reached in N steps" when not reached), steps_to_threshold (steps;
  same), actor_wait_s and learner_wait_s (s, summed over the processes of the role: blocked on
  the rate limiter), buffer_lock_wait_s (s, summed; absent for the lock-free baseline),
  speedup (x: env_steps_per_s over the baseline's with the same buffer and seed, when the
  baseline is in the same run; 1.0 for the baseline itself);
- op "episode", metric "return": one row per finished episode, with env_steps and wall_s
  (seconds since the first env step) and ``repeat`` = the episode's index;
- op "profile", metric env_step / inference / replay / sgd / wait / other: seconds, summed over
  the processes of one role, named in params (``"role"``: "sequential", "actor" or "learner",
  and ``"processes"``). Sum over roles for a run's total process time.

A run that fails (a worker raised, a timeout) is one row with status "failed" and the error;
the suite goes on with the next run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from replaybench.bench import results

__all__ = ["add_parser", "cmd_train", "run_suite", "result_rows", "format_table"]

#: Summary metrics and their units, in the order they are written.
SUMMARY_UNITS = {"env_steps_per_s": "steps/s", "updates_per_s": "updates/s", "sample_latency_s": "s",
                 "time_to_threshold_s": "s", "steps_to_threshold": "steps", "actor_wait_s": "s",
                 "learner_wait_s": "s", "buffer_lock_wait_s": "s", "speedup": "x"}


# ------------------------------------------------------------------------------------------ rows
def _structure_and_k(variant: str, buffer_params: dict):
    from replaybench.impl import registry

    try:
        v = registry.get(variant)
    except KeyError:
        return "unknown", buffer_params.get("K")
    return v.structure, buffer_params.get("K", v.params.get("K"))


def run_base(cfg, acfg, base: dict) -> dict:
    """The columns every row of one run shares."""
    structure, k = _structure_and_k(cfg.buffer, cfg.buffer_params)
    params = {**cfg.buffer_params, "steps": cfg.steps, "updates_per_step": acfg.updates_per_step,
              "batch_size": acfg.batch_size, "insert_batch": cfg.insert_batch}
    if cfg.sequential:
        params["baseline"] = True
    else:
        params.update(weight_sync_every=cfg.weight_sync_every, ratio_tolerance=cfg.ratio_tolerance)
    if cfg.overrides:
        params["overrides"] = {key: list(v) if isinstance(v, tuple) else v for key, v in cfg.overrides.items()}
    return {**base, "scenario": "training", "variant": cfg.buffer, "structure": structure, "K": k,
            "policy": "none" if cfg.sequential else cfg.policy, "algo": cfg.algo, "env": cfg.env,
            "actors": 0 if cfg.sequential else cfg.actors, "learners": 0 if cfg.sequential else cfg.learners,
            "seed": cfg.seed, "mode": "processes", "capacity": acfg.buffer_capacity, "batch": acfg.batch_size,
            "params": params}


def result_rows(result, row: dict, speedup: float | None = None) -> list[dict]:
    """Summary, episode and profile rows of one finished run (``row``: its shared columns)."""
    values = {"env_steps_per_s": result.env_steps_per_s, "updates_per_s": result.updates_per_s,
              "sample_latency_s": result.sample_latency_s, "time_to_threshold_s": result.time_to_threshold_s,
              "steps_to_threshold": result.steps_to_threshold, "actor_wait_s": result.actor_wait_s,
              "learner_wait_s": result.learner_wait_s, "buffer_lock_wait_s": result.buffer_lock_wait_s,
              "speedup": speedup}
    out = []
    for metric, value in values.items():
        if value is None and metric in ("buffer_lock_wait_s", "speedup", "sample_latency_s"):
            continue  # not applicable to this run
        r = {**row, "op": "summary", "metric": metric, "unit": SUMMARY_UNITS[metric], "repeat": 0}
        if value is None:  # the threshold was not reached
            r.update(status="skipped", error=f"threshold not reached in {result.env_steps} steps")
        else:
            r.update(status="ok", value=float(value))
        out.append(r)
    for i, (steps, wall, ret) in enumerate(result.episodes):
        out.append({**row, "op": "episode", "metric": "return", "value": ret, "unit": "return", "repeat": i,
                    "env_steps": steps, "wall_s": wall, "status": "ok"})
    for role, sections in result.profiles.items():
        params = {**row["params"], "role": role, "processes": result.processes[role]}
        for section, seconds in sections.items():
            out.append({**row, "params": params, "op": "profile", "metric": section, "value": seconds, "unit": "s",
                        "repeat": 0, "status": "ok"})
    return out


def failed_row(row: dict, err: BaseException) -> dict:
    message = f"{type(err).__name__}: {err}"
    return {**row, "op": "summary", "metric": "env_steps_per_s", "unit": "steps/s", "status": "failed",
            "error": message[-4000:]}


# ------------------------------------------------------------------------------------------ progress
class ProgressBar:
    """A tqdm bar over env steps fed by the loops' ``progress`` callback."""

    def __init__(self, total: int, desc: str, enabled: bool = True, bar=None):
        from tqdm import tqdm

        self.bar = bar or tqdm(total=total, desc=desc, unit="step", disable=not enabled, dynamic_ncols=True)
        self.own = bar is None
        self._first = None  # (time, env_steps, updates) at the first report: rates are taken from there
        self._n = 0

    def __call__(self, env_steps: int, updates: int, recent) -> None:
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


# ------------------------------------------------------------------------------------------ runs
def _meta(kind: str, configs: list, machine: str, command, suite: dict | None = None) -> dict:
    git = results.git_state()
    return {"scenario": "training", "suite": suite, "kind": kind, "command": command or sys.argv,
            "runs": [c.to_dict() for c in configs], "git_sha": git["sha"], "dirty": git["dirty"],
            "machine_label": machine, "machine": results.machine_info(), "libraries": results.library_versions(),
            "cache_miss_method": None,
            "timing": "wall-clock from the first env step (after start-up and kernel warm-up) until every "
                      "worker finished; per-section time via perf_counter accumulators"}


def _run_one(cfg, writer, base: dict, progress_cb, baselines: dict) -> tuple[list[dict], object]:
    """Run ``cfg`` and append its rows; returns (rows, result or None)."""
    from replaybench.impl.rl import train

    acfg = cfg.algo_config()
    row = run_base(cfg, acfg, base)
    try:
        result = train(cfg, progress_cb)
    except KeyboardInterrupt:
        raise
    except Exception as err:  # one failing run is recorded and the rest go on
        rows = [failed_row(row, err)]
        writer.append(rows)
        return rows, None
    key = (cfg.algo, cfg.env, cfg.buffer, json.dumps(cfg.buffer_params, sort_keys=True), cfg.seed, cfg.steps,
           json.dumps(cfg.overrides, sort_keys=True, default=str))  # same ratio and algorithm settings
    if cfg.sequential:
        baselines[key] = result.env_steps_per_s
    speedup = result.env_steps_per_s / baselines[key] if key in baselines else None
    rows = result_rows(result, row, speedup)
    writer.append(rows)
    return rows, result


def format_table(rows: list[dict]) -> str:
    """One line per run: throughput, time to threshold, waits, speedup, and the replay share:
    replay seconds over all process seconds of the run (every section of every process)."""
    from replaybench.bench.summary import format_table as table

    runs: dict[tuple, dict] = {}
    for r in rows:
        params = json.loads(r["params"]) if isinstance(r["params"], str) else r["params"]  # read back or in memory
        ratio = params.get("updates_per_step")
        key = (r["variant"], r["policy"], ratio, r["actors"], r["learners"], r["seed"])
        entry = runs.setdefault(key, {"profile": {}})
        if r["op"] == "summary":
            entry[r["metric"]] = r.get("value") if r["status"] == "ok" else r["status"]
        elif r["op"] == "profile":
            entry["profile"][r["metric"]] = entry["profile"].get(r["metric"], 0.0) + float(r["value"])

    def num(x, fmt):
        return fmt.format(x) if isinstance(x, (int, float)) else (x or "-")

    body = []
    for (variant, policy, ratio, a, l, seed), e in runs.items():
        total = sum(e["profile"].values())
        share = e["profile"].get("replay", 0.0) / total if total else None
        body.append([variant, policy, str(ratio), str(a), str(l), str(seed),
                     num(e.get("env_steps_per_s"), "{:.0f}"), num(e.get("updates_per_s"), "{:.0f}"), num(e.get("time_to_threshold_s"), "{:.1f}"),
                     num(e.get("speedup"), "{:.2f}"), num(e.get("actor_wait_s"), "{:.1f}"),
                     num(e.get("learner_wait_s"), "{:.1f}"), num(share, "{:.1%}")])
    header = ["variant", "policy", "upd/step", "A", "L", "seed", "steps/s", "upd/s", "t_thresh s", "speedup",
              "actor wait s", "learner wait s", "replay share"]
    return "\n".join(table(header, body, set(range(2, len(header)))))


def _finish(writer, all_rows: list[dict], echo, ok: bool, **extra) -> Path:
    writer.finish(ok, **extra)
    echo(format_table(all_rows))
    echo(f"\nResults: {writer.dir}")
    return writer.dir


def run_configs(configs: list, *, out="results", run_id: str | None = None, machine: str | None = None,
                progress: bool = True, command=None, echo=print, kind: str = "train", suite: dict | None = None,
                name: str = "train") -> Path:
    """Run ``configs`` in order into one run folder; returns it. Baselines (sequential
    configs) should come before the parallel runs they are compared with."""
    from tqdm import tqdm

    machine = machine or results.machine_info()["hostname"]
    run_id = run_id or results.new_run_id(name)
    writer = results.RunWriter(out, run_id, _meta(kind, configs, machine, command, suite))
    base = {"schema_version": results.SCHEMA_VERSION, "run_id": run_id, "git_sha": writer.meta["git_sha"],
            "dirty": writer.meta["dirty"], "machine": machine}
    baselines: dict = {}
    all_rows: list[dict] = []
    counts = {s: 0 for s in results.STATUSES}
    outer = tqdm(configs, desc=name, unit="run", disable=not progress or len(configs) == 1, dynamic_ncols=True)
    try:
        for cfg in outer:
            label = (f"{cfg.buffer}/{cfg.policy} A={cfg.actors} L={cfg.learners} seed={cfg.seed}"
                     if not cfg.sequential else f"{cfg.buffer} sequential seed={cfg.seed}")
            bar = ProgressBar(cfg.steps, label, progress, bar=outer if len(configs) > 1 else None)
            try:
                rows, _ = _run_one(cfg, writer, base, bar, baselines)
            finally:
                bar.close()
            all_rows += rows
            counts[rows[0]["status"]] += 1
    except KeyboardInterrupt:
        outer.close()
        _finish(writer, all_rows, echo, False, interrupted=True, runs_total=len(configs), runs_by_status=counts)
        raise
    outer.close()
    return _finish(writer, all_rows, echo, True, interrupted=False, runs_total=len(configs), runs_by_status=counts)


# ------------------------------------------------------------------------------------------ suite
def suite_configs(suite: dict, variants: list[str] | None = None) -> list:
    """The suite's grid as TrainConfigs: seeds x buffers x layouts, each buffer's baseline first.

    ``suite`` keys: algo, env, steps, seeds, buffers (list of {"variant", "policy", "params"}),
    layouts (list of [actors, learners]; [0, 0] = the sequential baseline), and optionally
    ratios (updates_per_step values, each a grid point with its own baseline; default: the
    algorithm's preset), overrides (algorithm config), insert_batch, weight_sync_every,
    ratio_tolerance, timeout_s, start_method.
    """
    from replaybench.impl.rl import TrainConfig

    buffers = [b for b in suite["buffers"] if variants is None or b["variant"] in variants]
    if variants is not None and not buffers:
        known = sorted({b["variant"] for b in suite["buffers"]})
        raise ValueError(f"no buffer of suite {suite['name']!r} is among {variants}; the suite has {known}")
    layouts = sorted((tuple(x) for x in suite["layouts"]), key=lambda al: (al[0] * al[1] != 0, al))
    overrides = {k: tuple(v) if isinstance(v, list) else v for k, v in (suite.get("overrides") or {}).items()}
    extra = {k: suite[k] for k in ("insert_batch", "weight_sync_every", "ratio_tolerance", "timeout_s",
                                    "start_method") if k in suite}
    ratios = suite.get("ratios") or [None]
    configs = []
    for ratio in ratios:
        ratio_override = {} if ratio is None else {"updates_per_step": ratio}
        for seed in suite["seeds"]:
            for b in buffers:
                for actors, learners in layouts:
                    configs.append(TrainConfig(algo=suite["algo"], env=suite["env"], buffer=b["variant"],
                                               policy=b.get("policy", "lazy-writing"),
                                               buffer_params=dict(b.get("params") or {}), actors=actors,
                                               learners=learners, steps=suite["steps"], seed=seed,
                                               overrides={**overrides, **ratio_override}, **extra))
    return configs


def run_suite(suite: dict, *, variants=None, out="results", run_id=None, machine=None, progress=True, command=None,
              echo=print, **_micro_only) -> Path:
    """Runner hook for ``"runner": "replaybench.bench.train:run_suite"`` suites (see bench.runner.run_suites).

    Keyword arguments that only mean something to the pyperf runner (capacities, ops, params,
    settings) are ignored; ``variants`` keeps the suite's buffers of those variants.
    """
    configs = suite_configs(suite, variants)
    return run_configs(configs, out=out, run_id=run_id or results.new_run_id(suite["name"]), machine=machine,
                       progress=progress, command=command, echo=echo, kind="suite", suite=suite, name=suite["name"])


# ------------------------------------------------------------------------------------------ command
def _value(text: str):
    """``3`` -> 3, ``1e-3`` -> 0.001, ``true`` -> True, ``64,64`` -> (64, 64), else the string."""
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    if "," in text:
        return tuple(_value(p) for p in text.split(",") if p)
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _key_value(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    return key.strip(), _value(value.strip())


def add_parser(sub) -> argparse.ArgumentParser:
    """Add the ``train`` subcommand to ``replaybench``'s subparsers."""
    p = sub.add_parser("train", help="one training run (actor/learner loop) into results/<run_id>/")
    p.add_argument("--algo", default="dqn", help="dqn (discrete) or td3 (continuous)")
    p.add_argument("--env", help="gymnasium id (default: CartPole-v1 for dqn, Pendulum-v1 for td3)")
    p.add_argument("--buffer", default="kary-aligned", help="registered variant (replaybench list)")
    p.add_argument("--policy", default="lazy-writing",
                   help="concurrency policy of the shared buffer: global-lock, pal-locks, lazy-writing, deferred")
    p.add_argument("--param", type=_key_value, action="append", metavar="KEY=VALUE",
                   help="buffer variant parameter, repeatable (K=8, dtype=float64)")
    p.add_argument("--set", type=_key_value, action="append", metavar="KEY=VALUE", dest="overrides",
                   help="algorithm config field, repeatable (lr=5e-4, hidden=64,64, updates_per_step=0.25)")
    p.add_argument("--actors", type=int, default=2, help="actor processes (default 2; 0 = sequential)")
    p.add_argument("--learners", type=int, default=1, help="learner processes (default 1; 0 = sequential)")
    p.add_argument("--sequential", action="store_true", help="the one-process baseline (same as --actors 0)")
    p.add_argument("--steps", type=int, default=50_000, help="env steps over all actors")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--insert-batch", type=int, help="transitions per buffer add (default 8)")
    p.add_argument("--weight-sync-every", type=int, help="learner updates between weight broadcasts (default 10)")
    p.add_argument("--timeout", type=float, help="fail the run after this many seconds")
    p.add_argument("--out", default="results", help="folder that receives <run_id>/ (default: results)")
    p.add_argument("--run-id", help="default: <UTC time>-train")
    p.add_argument("--machine", help="machine label for the rows (default: host name)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_train, parser=p)
    return p


def _validated_config(args):
    """The TrainConfig ``args`` ask for, checked by :meth:`TrainConfig.validate` in this
    process before anything starts; a bad value exits 2 naming the option and the value."""
    from replaybench.impl.rl import ConfigError, TrainConfig, algorithms

    sequential = args.sequential or args.actors == 0 or args.learners == 0
    extra = {k: v for k, v in (("insert_batch", args.insert_batch), ("weight_sync_every", args.weight_sync_every),
                               ("timeout_s", args.timeout)) if v is not None}
    try:
        env = args.env or algorithms.get(args.algo).default_env
        cfg = TrainConfig(algo=args.algo, env=env, buffer=args.buffer, policy=args.policy,
                          buffer_params=dict(args.param or []), actors=0 if sequential else args.actors,
                          learners=0 if sequential else args.learners, steps=args.steps, seed=args.seed,
                          overrides=dict(args.overrides or []), **extra)
        cfg.validate()
    except ConfigError as err:
        # TrainConfig field -> the option that sets it; any other field is the algorithm config's (--set)
        options = {"algo": "--algo", "env": "--env", "buffer": "--buffer", "policy": "--policy",
                   "buffer_params": "--param", "actors": "--actors", "learners": "--learners", "steps": "--steps",
                   "seed": "--seed", "insert_batch": "--insert-batch", "weight_sync_every": "--weight-sync-every",
                   "timeout_s": "--timeout"}
        args.parser.error(f"argument {options.get(err.field, '--set')}: {err}")
    return cfg


def cmd_train(args) -> int:
    cfg = _validated_config(args)
    command = [sys.executable, "-m", "replaybench.bench", *args.argv]
    try:
        run_dir = run_configs([cfg], out=args.out, run_id=args.run_id, machine=args.machine,
                              progress=not args.no_progress, command=command)
    except KeyboardInterrupt:
        return 130
    rows = results.read_rows(run_dir)
    return 1 if any(r["status"] == "failed" for r in rows) else 0
