"""Gossip actor-learners against their baselines, in one run (scenario "gossip").

Each cell is one training run started by :func:`impl.rl.gossip.launch.launch` (fresh learner
processes, node ``i`` on 127.0.0.(2 + i)), or, for the scheme ``paac``, one run of
:func:`impl.rl.engines.paac.run_paac`: one learner whose ``n_envs`` environments are stepped by
``paac_workers`` worker processes (default 2) through shared memory, with the same A2C
settings. A suite declares::

    {"name": ..., "scenario": "gossip", "env": "CartPole-v1", "steps": 200000, "seeds": [0, 1, 2],
     "learners": [1, 2, 4, 8], "learners_per_node": 1,
     "schemes": [{"scheme": "gossip", "topology": "exponential", "peers": 1, "staleness": 1,
                  "lr_scaling": "sqrt"},
                 {"scheme": "gossip", "label": "gossip-free", "staleness": null},
                 {"scheme": "allreduce"}, {"scheme": "independent"}, {"scheme": "paac"}],
     "stragglers": [1.0, 2.0],              # slowdown of the last learner; 1.0 = none
     "straggler_learners": [4],             # the learner counts slowed runs are made at (default: all >= 2)
     "n_envs": 16, "overrides": {...}, "timeout_s": 120, "time_limit_s": 600}

Grid: seeds x stragglers x schemes x learners (``paac`` once per seed, without straggler: it
has one learner; at 1 learner only ``independent`` runs, since every scheme is that there;
stragglers only where there are at least 2 learners). ``--variants`` keeps the schemes with those labels. Every configuration is
checked (:func:`impl.rl.gossip.launch.check_launch`: the config and the nodes this machine can host) while
the suite is expanded, before any process.

Rows: variant = the scheme's label (default: its scheme), topology = the gossip topology
(``exponential/p1/k1``; empty otherwise; runs stored before that column hold it in policy),
policy "none", engine "paac" for the PAAC line, learners = N, algo "a2c";
params hold nodes, learners_per_node, topology, peers, staleness, lr_scaling (gossip: the
A2C rate times sqrt(N), or not; see :class:`GossipConfig`), straggler_slowdown, n_envs and
steps. Per run:

- op "summary": env_steps_per_s (steps/s, all learners), time_to_threshold_s (s; pooled
  episodes of all learners, mean of the last 20 >= the env's threshold; status "skipped"
  when not reached), steps_to_threshold (steps), final_consensus (l2: mean ||theta_i - mean
  theta|| of the final models), max_consensus (l2: largest snapshot value), bytes_per_step
  (B/step: bytes sent over env steps; nominal ring volume for allreduce), wait_fraction
  (fraction: mean over learners of seconds blocked / run seconds), max_behind (rounds: gossip
  only, how far behind its due messages the slowest in-peer got);
- op "consensus", metric "distance" (l2): one row per snapshot round (``repeat`` = its index;
  every ``snapshot_every`` updates), with wall_s (the learners' mean time of that round);
- op "learner", metric "env_steps_per_s": one row per learner (``repeat`` = its rank);
- op "episode", metric "return": every episode, pooled, with env_steps (its learner's) and wall_s;
  ``repeat`` numbers them in the order written.

Episode rows reach rows.csv as the run goes (:class:`EpisodeStream`: the learners' episodes
every :data:`bench.scenarios.training.WRITE_EVERY_S` seconds, through the driver's
``RunState.write``), the other rows when it ends; so a run that fails, or cannot write its
last rows (a full disk), keeps the episodes finished before the last write.
"""

from __future__ import annotations

import collections
import statistics

from replaybench.bench.scenarios import Cell, RunState, Scenario, Selection, SelectionError, suite_errors

__all__ = ["Gossip", "SCENARIO", "configs", "result_rows", "EpisodeStream", "format_table", "add_parser",
           "run_command"]

#: Summary metrics and their units, in the order they are written.
SUMMARY_UNITS = {"env_steps_per_s": "steps/s", "time_to_threshold_s": "s", "steps_to_threshold": "steps",
                 "final_consensus": "l2", "max_consensus": "l2", "bytes_per_step": "B/step",
                 "wait_fraction": "fraction", "max_behind": "rounds"}

_SCHEME_KEYS = {"scheme", "label", "topology", "peers", "staleness", "lr_scaling"}


def _label(entry: dict) -> str:
    return entry.get("label") or entry["scheme"]


def configs(suite: dict, variants: list[str] | None = None) -> list[tuple[str, object]]:
    """The suite's grid as (label, GossipConfig, or TrainConfig for paac), in run order."""
    from replaybench.impl.rl import TrainConfig
    from replaybench.impl.rl.gossip.learner import GossipConfig

    schemes = [e for e in suite["schemes"] if variants is None or _label(e) in variants]
    if variants is not None and not schemes:
        raise ValueError(f"no scheme of suite {suite['name']!r} is labelled among {variants}; "
                         f"it has {sorted(_label(e) for e in suite['schemes'])}")
    for e in schemes:
        extra = set(e) - _SCHEME_KEYS
        if extra:
            raise ValueError(f"scheme entry {e}: unknown key(s) {sorted(extra)} (known: {sorted(_SCHEME_KEYS)})")
    per_node = suite.get("learners_per_node", 1)
    common = {k: suite[k] for k in ("n_envs", "timeout_s", "time_limit_s", "snapshot_every") if k in suite}
    out = []
    for seed in suite["seeds"]:
        for slowdown in suite.get("stragglers", [1.0]):
            for e in schemes:
                base = dict(env=suite["env"], steps=suite["steps"], seed=seed,
                            overrides=dict(suite.get("overrides") or {}), **common)
                if e["scheme"] == "paac":  # one learner, its envs stepped by worker processes
                    if slowdown == 1.0:
                        a2c = {**base["overrides"], "n_envs": suite.get("n_envs", 16),
                               "n_workers": suite.get("paac_workers", 2)}
                        out.append((_label(e), TrainConfig(algo="a2c", env=suite["env"], steps=suite["steps"],
                                                           seed=seed, overrides=a2c,
                                                           timeout_s=suite.get("time_limit_s"))))
                    continue
                for n in suite["learners"]:
                    if n == 1 and e["scheme"] != "independent":
                        continue  # one learner has no one to talk to: every scheme is "independent"
                    if slowdown != 1.0 and (n < 2 or n not in suite.get("straggler_learners", [n])):
                        continue  # a straggler among one learner is just a slower run
                    if n % per_node:
                        raise ValueError(f"learners {n} is not a multiple of learners_per_node {per_node}")
                    gossip = {k: e[k] for k in ("topology", "peers", "staleness", "lr_scaling") if k in e}
                    out.append((_label(e), GossipConfig(scheme=e["scheme"], nodes=n // per_node,
                                                        learners_per_node=per_node,
                                                        straggler_slowdown=float(slowdown), **gossip, **base)))
    return out


def _columns(label: str, cfg) -> dict:
    from replaybench.impl.rl import TrainConfig

    if isinstance(cfg, TrainConfig):  # paac
        params = {"n_envs": cfg.overrides["n_envs"], "env_workers": cfg.overrides["n_workers"], "steps": cfg.steps,
                  "straggler_slowdown": 1.0}
        return {"scenario": "gossip", "variant": label, "structure": "a2c", "policy": "none", "algo": "a2c",
                "env": cfg.env, "actors": 0, "learners": 1, "seed": cfg.seed, "engine": "paac", "params": params}
    params = {"nodes": cfg.nodes, "learners_per_node": cfg.learners_per_node, "n_envs": cfg.n_envs,
              "env_workers": cfg.env_workers, "steps": cfg.steps, "straggler_slowdown": cfg.straggler_slowdown}
    topology = None
    if cfg.scheme == "gossip":
        params.update(topology=cfg.topology, peers=cfg.peers, staleness=cfg.staleness,
                      lr_scaling=cfg.lr_scaling)
        topology = f"{cfg.topology}/p{cfg.peers}/k{'-' if cfg.staleness is None else cfg.staleness}"
    if cfg.overrides:
        params["overrides"] = cfg.overrides
    return {"scenario": "gossip", "variant": label, "structure": "a2c", "policy": "none", "topology": topology,
            "algo": "a2c", "env": cfg.env, "actors": 0, "learners": cfg.learners, "seed": cfg.seed, "params": params}


def _episode_rows(episodes, row: dict, start: int) -> list[dict]:
    return [{**row, "op": "episode", "metric": "return", "unit": "return", "value": float(ret), "repeat": i,
             "env_steps": int(steps), "wall_s": float(wall), "status": "ok"}
            for i, (wall, steps, ret, _rank) in enumerate(episodes, start)]


class EpisodeStream:
    """Writes a gossip run's episode rows as they come: ``stream(new)`` (the launcher's
    ``episodes`` callback: ``[(wall_s, env_steps, return, rank), ...]``) buffers them and
    writes through ``write`` (the driver's ``RunState.write``) at most every ``every_s``
    seconds (default :data:`bench.scenarios.training.WRITE_EVERY_S`). :attr:`written` holds
    what was written, for :func:`result_rows` to leave out. ``write`` None: nothing is written.
    """

    def __init__(self, write, row: dict, every_s: float | None = None):
        import collections
        import time

        from replaybench.bench.scenarios import training

        self.write, self.row = write, row
        self.every_s = training.WRITE_EVERY_S if every_s is None else every_s
        self.written: collections.Counter = collections.Counter()
        self._pending: list = []
        self._last = time.monotonic()

    def __call__(self, new) -> None:
        import time

        if self.write is None:
            return
        self._pending += [(float(w), int(s), float(r), int(k)) for w, s, r, k in new]
        if self._pending and time.monotonic() - self._last >= self.every_s:
            self._last = time.monotonic()
            batch, self._pending = self._pending, []
            self.write(_episode_rows(batch, self.row, sum(self.written.values())))
            self.written.update(batch)


def result_rows(result, row: dict, scheme: str, written=None) -> list[dict]:
    """The rows of one finished run (``result``: a GossipResult; ``row``: the run's columns).
    ``written``: episodes already written as the run went (:attr:`EpisodeStream.written`);
    they are left out, and the others numbered after them."""
    waits = [w / result.wall_s for w in result.wait_s] if result.wall_s > 0 else []
    values = {"env_steps_per_s": result.env_steps_per_s, "time_to_threshold_s": result.time_to_threshold_s,
              "steps_to_threshold": result.steps_to_threshold, "final_consensus": result.final_consensus,
              "max_consensus": max((d for _, d in result.consensus), default=result.final_consensus),
              "bytes_per_step": result.bytes_sent / max(result.env_steps, 1),
              "wait_fraction": statistics.mean(waits) if waits else 0.0,
              "max_behind": (max(l["gossip"]["max_behind"] for l in result.learners)
                             if scheme == "gossip" else None)}
    out = []
    for metric, value in values.items():
        if value is None and metric == "max_behind":
            continue
        r = {**row, "op": "summary", "metric": metric, "unit": SUMMARY_UNITS[metric], "repeat": 0}
        if value is None:
            r.update(status="skipped", error=f"threshold not reached in {result.env_steps} steps")
        else:
            r.update(status="ok", value=float(value))
        out.append(r)
    for k, (wall, d) in enumerate(result.consensus):
        out.append({**row, "op": "consensus", "metric": "distance", "unit": "l2", "value": float(d), "repeat": k,
                    "wall_s": float(wall), "status": "ok"})
    for l in result.learners:
        out.append({**row, "op": "learner", "metric": "env_steps_per_s", "unit": "steps/s",
                    "value": l["env_steps"] / l["end_s"], "repeat": l["rank"], "env_steps": l["env_steps"],
                    "wall_s": l["end_s"], "status": "ok"})
    left = collections.Counter(written or ())
    rest = []
    for e in result.episodes:
        key = (float(e[0]), int(e[1]), float(e[2]), int(e[3]))
        if left[key]:
            left[key] -= 1
        else:
            rest.append(key)
    return out + _episode_rows(rest, row, sum((written or {}).values()))


class Gossip(Scenario):
    """Gossip learners and baselines end to end (see the module docstring)."""

    name = "gossip"
    suite_keys = frozenset({"env", "steps", "seeds", "learners", "learners_per_node", "schemes", "n_envs", "overrides",
                            "paac_workers", "stragglers", "straggler_learners", "snapshot_every", "timeout_s",
                            "time_limit_s"})
    unit = "run"
    #: Keyword arguments of :func:`impl.rl.gossip.launch.launch` besides the config.
    launch_args: dict = {}

    def cells(self, suite: dict, selection: Selection) -> list[Cell]:
        from replaybench.impl.rl import ConfigError, TrainConfig
        from replaybench.impl.rl.gossip.launch import check_launch

        with suite_errors(suite):
            grid = configs(suite, selection.variants)
        cells = []
        for label, spec in grid:
            columns = {**_columns(label, spec), "op": "summary", "metric": "env_steps_per_s", "unit": "steps/s"}
            text = (f"{label} N={columns['learners']} straggler={columns['params']['straggler_slowdown']:g} "
                    f"seed={columns['seed']}")
            try:
                if isinstance(spec, TrainConfig):
                    spec.validate()
                else:
                    check_launch(spec, **self.launch_args)  # the config, and the nodes this machine can host
            except ConfigError as err:
                raise SelectionError(f"gossip run {text}: {err}") from None
            cells.append(Cell(text, columns, spec))
        return cells

    def meta(self, suite: dict, selection: Selection, cells: list[Cell]) -> dict:
        return {"runs": [{"label": c.columns["variant"], **c.spec.to_dict()} for c in cells],
                "timing": "wall-clock from the learners' common start (a barrier after start-up) to the last "
                          "learner's end; each learner a fresh process, node i listening on 127.0.0.(2+i)"}

    def measure(self, cell: Cell, run: RunState) -> list[dict]:
        from replaybench.impl.rl import TrainConfig
        from replaybench.impl.rl.gossip.launch import launch

        cfg = cell.spec
        bar = _StepBar(run, cell, cfg.steps)
        stream = EpisodeStream(run.write, cell.columns)
        try:
            if isinstance(cfg, TrainConfig):
                return result_rows(_paac_result(cfg, bar, stream), cell.columns, "paac", stream.written)
            result = launch(cfg, progress=bar, episodes=stream, **self.launch_args)
        finally:
            bar.close()
        return result_rows(result, cell.columns, cfg.scheme, stream.written)

    def summarize(self, rows: list[dict], meta: dict) -> str:
        return format_table(rows)


def _paac_result(cfg, progress, episodes=None):
    """A PAAC run (impl/rl/engines/paac.py) as a one-learner GossipResult: no messages, no waits;
    ``episodes`` gets its episodes as they finish (as :func:`launch`'s does)."""
    from replaybench.impl.rl.engines.paac import run_paac
    from replaybench.impl.rl.gossip.learner import GossipResult

    seen = 0

    def report(steps, _updates, _recent, done):
        nonlocal seen
        progress(steps)
        if episodes is not None and len(done) > seen:
            count = len(done)
            episodes([(wall, s, ret, 0) for s, wall, ret in done[seen:count]])
            seen = count

    r = run_paac(cfg, report)
    return GossipResult(env_steps=r.env_steps, wall_s=r.wall_s, env_steps_per_s=r.env_steps / r.wall_s,
                        time_to_threshold_s=r.time_to_threshold_s, steps_to_threshold=r.steps_to_threshold,
                        consensus=[], final_consensus=0.0, bytes_sent=0, wait_s=[0.0],
                        learners=[{"rank": 0, "host": "local", "env_steps": r.env_steps, "updates": r.updates,
                                   "end_s": r.wall_s, "wait_s": 0.0, "bytes_sent": 0, "gossip": None,
                                   "shared_memory": None}],
                        episodes=[[wall, steps, ret, 0] for steps, wall, ret in r.episodes])


class _StepBar:
    """Progress of one run in env steps: the driver's bar's postfix when the run has several
    cells, else a bar of its own (the ``gossip`` command's single run)."""

    def __init__(self, run: RunState, cell: Cell, total: int):
        from tqdm import tqdm

        self.run, self.label, self.total = run, cell.label, total
        self.own = None
        if run.cells == 1:
            self.own = tqdm(total=total, desc=cell.label, unit="step", disable=not run.progress, dynamic_ncols=True)

    def __call__(self, steps: int) -> None:
        if self.own is not None:
            self.own.update(min(steps, self.total) - self.own.n)
        elif self.run.bar is not None:
            self.run.bar.set_postfix_str(f"{self.label} {steps}/{self.total} steps")

    def close(self) -> None:
        if self.own is not None:
            self.own.close()


def format_table(rows: list[dict]) -> str:
    """One line per run: scheme, topology, N, straggler, seed and the summary metrics."""
    import json

    from replaybench.bench.summary import format_table as table

    runs: dict[tuple, dict] = {}
    for r in rows:
        if r["op"] != "summary":
            continue
        params = json.loads(r["params"]) if isinstance(r["params"], str) else r["params"]
        key = (r["variant"], r.get("topology") or "none", r["learners"], params.get("straggler_slowdown"), r["seed"])
        runs.setdefault(key, {})[r["metric"]] = r.get("value") if r["status"] == "ok" else r["status"]

    def num(x, fmt):
        return fmt.format(x) if isinstance(x, (int, float)) else (x or "-")

    body = [[v, p, str(n), num(s, "{:g}x"), str(seed), num(e.get("env_steps_per_s"), "{:.0f}"),
             num(e.get("time_to_threshold_s"), "{:.1f}"), num(e.get("final_consensus"), "{:.3g}"),
             num(e.get("bytes_per_step"), "{:.0f}"), num(e.get("wait_fraction"), "{:.1%}"),
             num(e.get("max_behind"), "{:.0f}")]
            for (v, p, n, s, seed), e in runs.items()]
    header = ["scheme", "topology", "N", "straggler", "seed", "steps/s", "t_thresh s", "consensus", "B/step",
              "wait", "max behind"]
    return "\n".join(table(header, body, set(range(5, len(header)))))


SCENARIO = Gossip()


# ---------------------------------------------------------------------------------------------- command
#: GossipConfig fields (and the launch's) set by the ``replaybench gossip`` option of the same name ...
_OPTION_FIELDS = ("scheme", "env", "steps", "seed", "nodes", "learners_per_node", "topology", "peers", "staleness",
                  "lr_scaling", "n_envs", "env_workers", "straggler_slowdown", "rdzv_endpoint", "node_rank", "node_addr")
#: ... and those whose option is named otherwise.
_RENAMED = {"timeout_s": "--timeout", "time_limit_s": "--time-limit"}


def _staleness(text: str):
    return None if text.lower() in ("none", "off") else int(text)


def add_parser(sub):
    """Add ``replaybench gossip``: one run of N learners, launched like torchrun."""
    from replaybench.bench import arguments

    p = sub.add_parser("gossip", help="one run of gossip (or all-reduce / independent) A2C learners, "
                                      "one process each, over loopback nodes or machines")
    p.add_argument("--scheme", default="gossip", help="gossip (default), allreduce or independent")
    p.add_argument("--nodes", type=int, default=1, help="nodes (default 1); on one machine node i listens on "
                                                         "127.0.0.(2+i)")
    p.add_argument("--learners-per-node", type=int, default=4, help="learner processes per node (default 4)")
    p.add_argument("--rdzv-endpoint", default="127.0.0.1:0",
                   help="HOST:PORT of the rendezvous store, hosted by node 0's launcher (default 127.0.0.1 "
                        "and a free port; give a real address and port to run across machines)")
    p.add_argument("--node-rank", type=int, help="start only this node's learners (one launcher per machine); "
                                                  "default: every node on this machine")
    p.add_argument("--node-addr", help="this machine's address, which the other machines reach (with --node-rank)")
    p.add_argument("--env", default="CartPole-v1")
    p.add_argument("--steps", type=int, default=200_000, help="env steps over all learners")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--topology", default="exponential", help="ring or exponential (time-varying; default)")
    p.add_argument("--peers", type=int, default=1, help="out-peers per gossip round: 1 or 2")
    p.add_argument("--staleness", type=_staleness, default=1,
                   help="process lock: a learner more than K rounds ahead of an in-peer waits (default 1; none)")
    p.add_argument("--lr-scaling", default="sqrt",
                   help="gossip learners' learning rate: sqrt (default: the A2C rate times sqrt(learners)) or none")
    p.add_argument("--n-envs", type=int, default=16, help="environments per learner")
    p.add_argument("--env-workers", type=int, default=0, help="processes stepping each learner's envs (0: in-process)")
    p.add_argument("--straggler-slowdown", type=float, default=1.0, help="slow the last learner this many times")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds a silent peer may take before the run fails")
    p.add_argument("--time-limit", type=float, help="stop every learner after this many seconds")
    p.add_argument("--set", type=arguments.key_value, action="append", metavar="KEY=VALUE", dest="overrides",
                   help="A2C config field, repeatable (lr=7e-4, hidden=64,64)")
    arguments.add_output_options(p, "default: <UTC time>-gossip")
    p.set_defaults(func=run_command, parser=p)
    return p


def run_command(args) -> int:
    """``replaybench gossip``: check everything, then one run through the scenario driver
    (node 0, or every node) or just this node's learners (``--node-rank`` > 0)."""
    import sys

    from replaybench.bench import arguments, driver, results
    from replaybench.impl.rl import ConfigError
    from replaybench.impl.rl.gossip.launch import check_launch, launch
    from replaybench.impl.rl.gossip.learner import GossipConfig

    try:
        cfg = GossipConfig(scheme=args.scheme, env=args.env, steps=args.steps, seed=args.seed, nodes=args.nodes,
                           learners_per_node=args.learners_per_node, topology=args.topology, peers=args.peers,
                           staleness=args.staleness, lr_scaling=args.lr_scaling, n_envs=args.n_envs,
                           env_workers=args.env_workers,
                           straggler_slowdown=args.straggler_slowdown, timeout_s=args.timeout,
                           time_limit_s=args.time_limit, overrides=dict(args.overrides or []))
        check_launch(cfg, rdzv_endpoint=args.rdzv_endpoint, node_rank=args.node_rank, node_addr=args.node_addr)
    except ConfigError as err:
        arguments.config_error(args.parser, err, _OPTION_FIELDS, _RENAMED)
    if args.node_rank not in (None, 0):  # this node's learners only; node 0 writes the results
        from replaybench.impl.rl.gossip.launch import LaunchFailed

        try:
            launch(cfg, rdzv_endpoint=args.rdzv_endpoint, node_rank=args.node_rank, node_addr=args.node_addr)
        except ConfigError as err:
            arguments.config_error(args.parser, err, _OPTION_FIELDS, _RENAMED)
        except LaunchFailed as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            return 130
        return 0
    label = cfg.scheme
    columns = {**_columns(label, cfg), "op": "summary", "metric": "env_steps_per_s", "unit": "steps/s"}
    launch_args = {"rdzv_endpoint": args.rdzv_endpoint, "node_rank": args.node_rank, "node_addr": args.node_addr}
    suite = {"name": "gossip", "scenario": "gossip", "description": "the gossip command: the run in meta.json"}
    plan = driver.Plan(suite, _Command(launch_args), [Cell(f"{label} N={cfg.learners}", columns, cfg)], Selection())
    command = [sys.executable, "-m", "replaybench.bench", *args.argv]
    try:
        run_dir = driver.execute(plan, out=args.out, run_id=args.run_id or results.new_run_id("gossip"),
                                 machine=args.machine, progress=not args.no_progress, command=command)
    except KeyboardInterrupt:
        return 130
    except results.ResultsWriteError as err:  # a full disk: what was written stays, marked incomplete
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 1 if any(r["status"] == "failed" for r in results.read_rows(run_dir)) else 0


class _Command(Gossip):
    """The scenario with the command line's rendezvous and node options."""

    def __init__(self, launch_args: dict):
        self.launch_args = launch_args
