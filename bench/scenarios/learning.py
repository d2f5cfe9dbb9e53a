"""The learning scenario: time to a good policy, per layout and per peer, same protocol, same
machine (issue 56; PAL's "3.1-10.8x shorter convergence time").

Each cell is one training run of one configuration on one task and seed: ours through
:func:`impl.rl.train` (the sequential loop when ``actors`` is 0, else the process engine), or a
peer's own trainer (``"peer": "tianshou"`` or ``"sb3"``: :mod:`bench.peers.trainers`). Every
run takes weight snapshots every ``snapshot_every`` learner updates; after the run, in this
process (so the evaluation takes nothing from the run it measures), the snapshots are evaluated
in order with ``eval_episodes`` greedy episodes on fixed seeds
(:mod:`impl.rl.common.snapshots`) until the first whose mean return holds the task's threshold,
and the last one. Time to threshold is that snapshot's wall time (from the run's first env
step); a run with none is censored at its budget and counted (:mod:`bench.time_to_policy`).

Suite keys: ``tasks`` (``{"algo", "env"}``, optional ``"threshold"``: gymnasium's by default,
:data:`impl.rl.common.envs.THRESHOLDS`; optional ``"steps"``: the task's budget), ``configs`` (each ``{"name", "actors", "learners",
"overrides", "held", "envs"}`` or ``{"name", "peer", "buffer", "envs"}``: ``envs``, the tasks' env
ids it runs on (default: every task); ``overrides`` are the algorithm's
fields, e.g. ``updates_per_step`` and ``batch_size``; ``held`` says which side of the replay
ratio the layout holds against the sequential loop, ``"updates"`` (PAL: updates per env step
and the global batch) or ``"batch"`` (Ape-X and after: a larger batch, fewer updates)),
``seeds``, ``steps`` (the budget, env steps), ``snapshot_every``, ``eval_episodes``,
``timeout_s`` (per run), ``buffer`` and ``policy`` (ours: the variant and, in parallel layouts,
its concurrency policy).

Rows (backend ``replaybench`` or the peer's name): op ``learning`` with metrics
``time_to_threshold_s`` (or ``censored_at_s``: the run's wall time, when censored),
``env_steps_to_threshold``, ``updates_to_threshold``, ``final_holds`` (1 or 0),
``train_time_to_threshold_s`` (the old criterion, the mean of the last 20 *training* episodes,
exploration on; absent when it never crossed), ``env_steps_per_s`` and ``updates_per_s``; op
``snapshot`` with metric ``eval_return`` per evaluated snapshot (``env_steps``, ``wall_s``,
params ``updates``). Every row's params state the replay ratio: ``updates_per_step``,
``batch_size``, ``samples_per_step`` (their product), ``held``, and the learner's update
implementation.
"""

from __future__ import annotations

import statistics

from replaybench.bench import time_to_policy as ttp
from replaybench.bench.scenarios import Cell, RunState, Scenario, Selection, SelectionError
from replaybench.bench.summary import format_table

__all__ = ["Learning", "SCENARIO", "format_summary"]

_CONFIG_KEYS = {"name", "actors", "learners", "overrides", "held", "peer", "buffer", "envs"}
HELD = ("updates", "batch")


class Learning(Scenario):
    name = "learning"
    takes = frozenset()
    unit = "run"
    suite_keys = frozenset({"tasks", "configs", "seeds", "steps", "snapshot_every", "eval_episodes", "timeout_s",
                            "buffer", "policy"})

    def cells(self, suite: dict, selection: Selection) -> list[Cell]:
        from replaybench.impl.rl.common.envs import THRESHOLDS
        from replaybench.impl.rl.common.errors import ConfigError
        from replaybench.impl.rl.common.snapshots import MIN_EPISODES

        where = f"suite {suite['name']!r}"
        for key in ("tasks", "configs", "seeds"):
            if not isinstance(suite.get(key), list) or not suite[key]:
                raise SelectionError(f"{where}: {key!r} must be a non-empty list, got {suite.get(key)!r}")
        for key, low in (("steps", 1), ("snapshot_every", 1), ("eval_episodes", MIN_EPISODES)):
            if not isinstance(suite.get(key), int) or suite[key] < low:
                raise SelectionError(f"{where}: {key!r} must be an integer >= {low}, got {suite.get(key)!r}")
        names = [c.get("name") if isinstance(c, dict) else None for c in suite["configs"]]
        if len(set(names)) != len(names):
            raise SelectionError(f"{where}: config names must be unique, got {names}")
        cells = []
        for task in suite["tasks"]:
            if not isinstance(task, dict) or not {"algo", "env"} <= set(task) <= {"algo", "env", "threshold", "steps"}:
                raise SelectionError(f"{where}: a task is {{\"algo\", \"env\"[, \"threshold\", \"steps\"]}}, got {task!r}")
            if not isinstance(task.get("steps", 1), int) or task.get("steps", 1) < 1:
                raise SelectionError(f"{where}: task {task['env']!r}: steps must be a positive integer, got {task['steps']!r}")
            threshold = task.get("threshold", THRESHOLDS.get(task["env"]))
            if threshold is None:
                raise SelectionError(f"{where}: task {task!r} has no threshold (none is known for {task['env']!r})")
            for config in suite["configs"]:
                _check_config(where, config)
                if task["env"] not in config.get("envs", [task["env"]]):
                    continue
                for seed in suite["seeds"]:
                    if "peer" not in config:  # ours: the whole config checked now, before any run
                        try:
                            acfg = _train_config(suite, task, config, seed).validate()
                        except ConfigError as err:
                            raise SelectionError(f"{where}: config {config['name']!r}: {err}") from None
                        batch, ratio, update = acfg.batch_size, acfg.updates_per_step, getattr(acfg, "update", "torch")
                    else:
                        batch = ratio = update = None
                    columns = {"scenario": self.name, "algo": task["algo"], "env": task["env"], "seed": seed,
                               "backend": config.get("peer", "replaybench"),
                               "variant": config.get("buffer", suite.get("buffer", "kary-aligned")),
                               "actors": config.get("actors", 0), "learners": config.get("learners", 0),
                               "batch": batch, "op": "learning",
                               "params": {"config": config["name"], "threshold": float(threshold),
                                          "updates_per_step": ratio, "batch_size": batch,
                                          "samples_per_step": None if batch is None else batch * ratio,
                                          "held": config.get("held"), "update": update,
                                          "snapshot_every": suite["snapshot_every"],
                                          "eval_episodes": suite["eval_episodes"],
                                          "budget_steps": task.get("steps", suite["steps"])}}
                    cells.append(Cell(f"{task['env']} {config['name']} seed={seed}", columns,
                                      spec=(task, config, seed, float(threshold))))
        return cells

    def meta(self, suite: dict, selection: Selection, cells: list[Cell]) -> dict:
        return {"protocol": "weight snapshots every snapshot_every learner updates and at the end; after each run, "
                            "in the scenario's process, greedy evaluation of the snapshots in order (eval_episodes "
                            "episodes on fixed seeds) until the first holding the threshold, and the last; time to "
                            "threshold = that snapshot's wall time from the run's first env step; censored runs "
                            "counted at their budget"}

    def measure(self, cell: Cell, run: RunState) -> list[dict]:
        task, config, seed, threshold = cell.spec
        suite = run.meta["suite"]
        if "peer" in config:
            from replaybench.bench.peers.trainers import train_peer

            peer = train_peer(config["peer"], task["algo"], task["env"], seed, task.get("steps", suite["steps"]),
                              suite["snapshot_every"],
                              buffer=config.get("buffer"), timeout_s=suite.get("timeout_s"))
            snaps = [(s.wall_s, s.env_steps, s.updates, s.policy) for s in peer.snapshots]
            wall, env_steps, updates, train_ttt = peer.wall_s, peer.env_steps, peer.updates, None
            extra = {"params": {**cell.columns["params"], "hyper": peer.hyper}}
        else:
            from replaybench.impl.rl import train
            from replaybench.impl.rl.common.snapshots import snapshot_policy

            cfg = _train_config(suite, task, config, seed)
            acfg = cfg.validate()
            result = train(cfg)
            snaps = [(s.wall_s, s.env_steps, s.updates, snapshot_policy(task["algo"], task["env"], acfg, s.weights))
                     for s in result.snapshots]
            wall, env_steps, updates = result.wall_s, result.env_steps, result.updates
            train_ttt = result.time_to_threshold_s
            extra = {}
        return _rows(cell, task["env"], threshold, suite["eval_episodes"], snaps, wall, env_steps, updates,
                     train_ttt, extra)

    def summarize(self, rows: list[dict], meta: dict) -> str:
        return format_summary(rows)


def _check_config(where: str, config) -> None:
    if not isinstance(config, dict) or "name" not in config:
        raise SelectionError(f"{where}: a config is an object with a 'name', got {config!r}")
    unknown = set(config) - _CONFIG_KEYS
    if unknown:
        raise SelectionError(f"{where}: config {config['name']!r}: unknown key(s) {sorted(unknown)}; "
                             f"a config may set {sorted(_CONFIG_KEYS)}")
    if "peer" in config:
        from replaybench.bench.peers.trainers import PEER_TRAINERS

        if config["peer"] not in PEER_TRAINERS:
            raise SelectionError(f"{where}: config {config['name']!r}: peer must be one of {list(PEER_TRAINERS)}, "
                                 f"got {config['peer']!r}")
        bad = set(config) & {"actors", "learners", "overrides", "held"}
        if bad:
            raise SelectionError(f"{where}: config {config['name']!r}: a peer runs its own trainer and takes no "
                                 f"{sorted(bad)}")
    if "envs" in config and (not isinstance(config["envs"], list) or not config["envs"]):
        raise SelectionError(f"{where}: config {config['name']!r}: envs must be a non-empty list of env ids, "
                             f"got {config['envs']!r}")
    if config.get("held") is not None and config["held"] not in HELD:
        raise SelectionError(f"{where}: config {config['name']!r}: held must be one of {list(HELD)}, "
                             f"got {config['held']!r}")


def _train_config(suite: dict, task: dict, config: dict, seed: int):
    from replaybench.impl.rl import TrainConfig

    actors, learners = int(config.get("actors", 0)), int(config.get("learners", 0))
    return TrainConfig(algo=task["algo"], env=task["env"], buffer=config.get("buffer", suite.get("buffer", "kary-aligned")),
                       policy=suite.get("policy", "atomic-deltas"), actors=actors, learners=learners,
                       steps=int(task.get("steps", suite["steps"])), seed=int(seed), overrides=dict(config.get("overrides", {})),
                       threshold=task.get("threshold"), snapshot_every=int(suite["snapshot_every"]),
                       timeout_s=suite.get("timeout_s"))


def _rows(cell: Cell, env_id: str, threshold: float, episodes: int, snaps: list, wall: float, env_steps: int,
          updates: int, train_ttt, extra: dict) -> list[dict]:
    """Evaluate ``snaps`` ((wall_s, env_steps, updates, policy) in order) until the first holding
    ``threshold``, and the last; the run's rows."""
    from replaybench.impl.rl.common.snapshots import evaluate

    rows, first = [], None
    order = list(range(len(snaps)))
    last = order[-1] if order else None
    for i in order:
        if first is not None and i != last:
            continue
        s_wall, s_steps, s_updates, policy = snaps[i]
        mean = float(evaluate(policy, env_id, episodes).mean())
        rows.append(cell.row("ok", op="snapshot", metric="eval_return", unit="return", value=mean, env_steps=s_steps,
                             wall_s=s_wall, params={**cell.columns["params"], **extra.get("params", {}),
                                                    "updates": s_updates}))
        if first is None and mean >= threshold:
            first = (s_wall, s_steps, s_updates)
    holds = bool(rows) and rows[-1]["value"] >= threshold
    base = {**extra}

    def metric(name, value, unit):
        return cell.row("ok", metric=name, value=float(value), unit=unit, **base)

    out = [metric("time_to_threshold_s", first[0], "s"), metric("env_steps_to_threshold", first[1], "steps"),
           metric("updates_to_threshold", first[2], "updates")] if first else [metric("censored_at_s", wall, "s")]
    out.append(metric("final_holds", 1.0 if holds else 0.0, "bool"))
    if train_ttt is not None:
        out.append(metric("train_time_to_threshold_s", train_ttt, "s"))
    if wall > 0:
        out += [metric("env_steps_per_s", env_steps / wall, "steps/s"), metric("updates_per_s", updates / wall, "updates/s")]
    return out + rows


def _fmt_s(x: float) -> str:
    return "not reached" if x == float("inf") else f"{x:.1f}"


def format_summary(rows: list[dict]) -> str:
    """Per task: each configuration's k/n, median time to threshold [quartiles], env steps and
    updates to threshold, final policies holding, env steps/s, and the per-seed speedup over
    the best sequential configuration (median of the seeds both reached; '>' / '<' bounds)."""
    runs = ttp.outcomes(rows)
    kinds = ttp.layouts(rows)
    rates: dict[tuple, list] = {}
    for r in rows:
        if r.get("op") == "learning" and r.get("metric") == "env_steps_per_s":
            rates.setdefault(ttp.config_key(r), []).append(r["value"])
    lines = []
    for task in sorted({k[:2] for k in runs}):
        configs = {k[2]: v for k, v in runs.items() if k[:2] == task}
        sequential = {n: v for n, v in configs.items() if kinds.get((*task, n)) == "sequential"}
        best = ttp.best_reference(sequential)
        body = []
        for name, outs in configs.items():
            s = ttp.summarize(outs)
            speed = "-"
            if best is not None and name != best:
                ratios = ttp.per_seed_speedups(sequential[best], outs)
                exact = [x for _, rel, x in ratios if rel == "="]
                bounds = "".join(rel for _, rel, _ in ratios if rel != "=")
                speed = (f"{statistics.median(exact):.2f}" if exact else "-") + (f" ({bounds})" if bounds else "")
            body.append([name, kinds.get((*task, name), "-"), s.label, _fmt_s(s.median_s),
                         "-" if s.q1_s == float("inf") else f"{_fmt_s(s.q1_s)}-{_fmt_s(s.q3_s)}",
                         "-" if s.median_env_steps is None else f"{s.median_env_steps:,.0f}",
                         "-" if s.median_updates is None else f"{s.median_updates:,.0f}", f"{s.final_holds}/{s.n}",
                         f"{statistics.median(rates[(*task, name)]):,.0f}" if rates.get((*task, name)) else "-",
                         speed])
        lines += [f"{task[1]} ({task[0]}): time to threshold (greedy evaluation of snapshots); speedup over the "
                  f"best sequential configuration ({best or 'none'}), per seed, median", *format_table(
                      ["config", "layout", "reached", "median s", "IQR s", "env steps", "updates", "final holds",
                       "env steps/s", "x best seq"], body, {3, 5, 6, 8}), ""]
    return "\n".join(lines)


SCENARIO = Learning()
