"""Gossip actor-learners and their baselines: one learner process's training loop.

Each learner steps its own ``n_envs`` environments with one batched forward pass per step
(:class:`~impl.rl.common.stepping.SharedVectorEnv`, in-process or over ``env_workers`` processes),
trains A2C on its own rollouts (:class:`~impl.rl.algorithms.a2c.A2CLearner`) and, by ``scheme``:

- ``gossip``: after each optimizer step, one gossip round (:mod:`impl.rl.gossip.exchange`);
- ``allreduce``: gradients averaged over all learners before every optimizer step (one
  gloo all-reduce per step; PAL's synchronous learners);
- ``independent``: no communication at all (the floor).

All learners start from rank 0's initial model. The run ends when the env steps of all
learners together reach ``steps`` (a counter in the rendezvous store, added to after each
rollout), so fast learners do more of the work. A learner talks to the others only through
the gloo process group and the store (TCP): no shared memory, so learners may be on
different machines.

Started by :mod:`impl.rl.gossip.launch` (or torchrun): ``python -m
replaybench.impl.rl.gossip.learner --config JSON [--result PATH]`` with RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT and REPLAYBENCH_NODE_ADDR (the address this learner listens on;
default: this machine's address on the route to MASTER_ADDR) in the environment. Rank 0 gathers every learner's report through the store and writes the
run's :class:`GossipResult` as JSON to ``--result``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import sys
import time
from dataclasses import asdict, dataclass, field, replace

import numpy as np
from replaybench.impl.rl.common.errors import ConfigError
from replaybench.impl.rl.gossip.exchange import TOPOLOGIES, Topology

__all__ = ["SCHEMES", "LR_SCALINGS", "GossipConfig", "GossipResult", "run_learner", "shared_memory_maps", "summarize",
           "main"]

#: The training schemes a run can use.
SCHEMES = ("gossip", "allreduce", "independent")

#: How a gossip learner's learning rate follows the number of learners (GossipConfig.lr_scaling).
LR_SCALINGS = ("sqrt", "none")

#: The learners' keys in the rendezvous store live under this prefix (``<prefix>/env_steps``: the
#: run's step counter; ``<prefix>/episodes/<rank>``: that learner's finished episodes, one
#: ``"wall_s env_steps return"`` line each, appended as they finish, which the launcher reads).
STORE_PREFIX = "replaybench-gossip"


@dataclass(frozen=True)
class GossipConfig:
    """One run of N learners. Checked by :meth:`validate` before any process starts.

    scheme : "gossip", "allreduce" or "independent".
    env : gymnasium id. steps : env steps over all learners together. seed : run seed.
    nodes, learners_per_node : the layout; learners = nodes * learners_per_node. Node ``i``'s
        learners listen on 127.0.0.(2 + i) when the launcher runs every node on one machine.
    topology, peers, staleness : the gossip (see :mod:`impl.rl.gossip.exchange`); staleness None = no lock.
    lr_scaling : "sqrt" (default): a gossip learner's RMSProp learning rate is the A2C rate
        (preset or ``overrides``) times sqrt(learners); "none": the A2C rate. Other schemes
        always use the A2C rate. Why: each gossip learner normalizes its own gradient, of a
        batch 1/N of all-reduce's, by its own RMS; where gradient noise dominates that RMS is
        sqrt(N) times the RMS of the averaged gradient, so the mean of the N gossip steps is
        all-reduce's step shrunk by sqrt(N). Scaling the rate by sqrt(N) gives the learners'
        mean model all-reduce's step at the A2C rate (the square-root scaling rule of
        adaptive optimizers; GALA's example runs 4 learners at twice its A2C rate).
    n_envs : environments per learner; env_workers : processes stepping them (0 = in-process).
    straggler_slowdown : the last learner sleeps ``slowdown - 1`` times the time each of its
        steps (rollout + update + exchange) took, so it runs that many times slower.
    timeout_s : a peer silent this long fails the run. time_limit_s : wall-clock cap (None: none).
    snapshot_every : every this many updates (rounds) each learner keeps a copy of its model;
        the consensus distance compares the learners' copies of the same round.
    overrides : A2CConfig fields (``{"hidden": [64, 64], "lr": 7e-4}``).
    fail_rank, fail_after_rounds : fault injection for tests: that learner exits abruptly
        (status 3, no goodbye) after that many rounds.
    """

    scheme: str = "gossip"
    env: str = "CartPole-v1"
    steps: int = 200_000
    seed: int = 0
    nodes: int = 1
    learners_per_node: int = 4
    topology: str = "exponential"
    peers: int = 1
    staleness: int | None = 1
    lr_scaling: str = "sqrt"
    n_envs: int = 16
    env_workers: int = 0
    straggler_slowdown: float = 1.0
    timeout_s: float = 60.0
    time_limit_s: float | None = None
    snapshot_every: int = 25
    overrides: dict = field(default_factory=dict)
    fail_rank: int | None = None
    fail_after_rounds: int = 0

    @property
    def learners(self) -> int:
        return self.nodes * self.learners_per_node

    def validate(self):
        """Check every field; returns the A2CConfig each learner trains with (its ``lr``
        scaled per ``lr_scaling``). Raises ConfigError naming the field."""
        from replaybench.impl.rl.algorithms.a2c import A2CConfig, check_env

        def need(ok, name, text):
            if not ok:
                raise ConfigError(name, getattr(self, name), f"{name} {text}, got {getattr(self, name)!r}")

        def is_int(v):
            return isinstance(v, int) and not isinstance(v, bool)

        need(self.scheme in SCHEMES, "scheme", f"must be one of {', '.join(SCHEMES)}")
        need(is_int(self.nodes) and self.nodes >= 1, "nodes", "must be an integer >= 1")
        need(is_int(self.learners_per_node) and self.learners_per_node >= 1, "learners_per_node",
             "must be an integer >= 1")
        need(is_int(self.steps) and self.steps >= 1, "steps", "must be an integer >= 1")
        need(is_int(self.seed) and self.seed >= 0, "seed", "must be an integer >= 0")
        need(self.topology in TOPOLOGIES, "topology", f"must be one of {', '.join(TOPOLOGIES)}")
        need(self.staleness is None or (is_int(self.staleness) and self.staleness >= 0), "staleness",
             "must be an integer >= 0 or None")
        need(self.lr_scaling in LR_SCALINGS, "lr_scaling", f"must be one of {', '.join(LR_SCALINGS)}")
        need(is_int(self.n_envs) and self.n_envs >= 1, "n_envs", "must be an integer >= 1")
        need(is_int(self.env_workers) and 0 <= self.env_workers <= self.n_envs, "env_workers",
             "must be an integer in [0, n_envs]")
        need(isinstance(self.straggler_slowdown, (int, float)) and 1.0 <= self.straggler_slowdown <= 100,
             "straggler_slowdown", "must be a number in [1, 100]")
        # finite: the store and the process group take it as a timedelta (inf overflows)
        need(isinstance(self.timeout_s, (int, float)) and math.isfinite(self.timeout_s) and self.timeout_s > 0,
             "timeout_s", "must be a finite number > 0")
        need(self.time_limit_s is None or (isinstance(self.time_limit_s, (int, float))
                                           and math.isfinite(self.time_limit_s) and self.time_limit_s > 0),
             "time_limit_s", "must be a finite number > 0 or None")
        need(is_int(self.snapshot_every) and self.snapshot_every >= 1, "snapshot_every", "must be an integer >= 1")
        need(self.fail_rank is None or (is_int(self.fail_rank) and 0 <= self.fail_rank < self.learners),
             "fail_rank", f"must be None or a rank in [0, {self.learners})")
        if self.scheme == "gossip":
            Topology(self.topology, self.learners, self.peers)  # ConfigError naming topology or peers
        if not isinstance(self.overrides, dict):
            raise ConfigError("overrides", self.overrides, f"overrides must be a dict, got {self.overrides!r}")
        for name in ("n_envs", "n_workers"):
            if name in self.overrides:
                raise ConfigError(name, self.overrides[name], f"{name} is set by the run (n_envs, env_workers), "
                                                              "not by an A2C override")
        acfg = A2CConfig.for_env(self.env, **self.overrides, n_envs=self.n_envs, n_workers=self.env_workers)
        check_env(self.env, acfg)  # ConfigError ("env"): an unknown id, or spaces the network cannot take
        if self.scheme == "gossip" and self.lr_scaling == "sqrt":
            acfg = replace(acfg, lr=acfg.lr * math.sqrt(self.learners))
        return acfg

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "GossipConfig":
        return cls(**d)


@dataclass
class GossipResult:
    """What a run measured (rank 0 computes it from every learner's report).

    env_steps : over all learners; wall_s : from the common start to the last learner's end;
    env_steps_per_s = env_steps / wall_s. time_to_threshold_s : when the mean return of the
    last 20 episodes of all learners (pooled in order of time) first reached the env's
    threshold (None: not reached); steps_to_threshold : env steps of all learners then (each
    learner's count at its last episode end before that time). consensus : [(wall_s,
    distance)], the mean ||theta_i - mean theta|| of the learners' models kept at each
    snapshot round (every ``snapshot_every`` updates, at the learners' mean wall time of that
    round); final_consensus : the same for the final models. bytes_sent : gossip
    message bytes (gossip) or the nominal ring all-reduce volume 2 (N-1)/N x gradient bytes per
    learner per step (allreduce); wait_s : per learner, seconds blocked (staleness bound or
    send queue for gossip; inside the all-reduce for allreduce). learners : per learner
    report (rank, host, env steps, updates, end_s, wait, bytes, gossip stats, and
    shared_memory: :func:`shared_memory_maps` at its end). episodes : [(wall_s, env_steps of that
    learner, return, rank)].
    """

    env_steps: int
    wall_s: float
    env_steps_per_s: float
    time_to_threshold_s: float | None
    steps_to_threshold: int | None
    consensus: list
    final_consensus: float
    bytes_sent: int
    wait_s: list
    learners: list
    episodes: list

    def to_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------------------------------------- learner
def _flat(net):
    import torch

    return torch.nn.utils.parameters_to_vector(net.parameters()).detach().clone()


def _load(net, flat) -> None:
    import torch

    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(flat, net.parameters())


class _GradientAverager:
    """``A2CLearner.grad_hook`` for the all-reduce scheme: averages the gradients over all
    learners with one gloo all-reduce per step, a stop vote appended (so every learner takes
    the same number of steps). Keeps the seconds spent in the all-reduce."""

    def __init__(self, group, world: int):
        self.group, self.world = group, world
        self.vote = False      # this learner wants to stop after this step
        self.stop = False      # some learner voted to stop
        self.wait_s = 0.0

    def __call__(self, params) -> None:
        import torch

        flat = torch.cat([p.grad.reshape(-1) for p in params] + [torch.tensor([float(self.vote)])])
        t0 = time.perf_counter()
        self.group.allreduce([flat]).wait()
        self.wait_s += time.perf_counter() - t0
        self.stop = bool(flat[-1] > 0)
        flat = flat[:-1] / self.world
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset: offset + p.numel()].view_as(p))
            offset += p.numel()


def run_learner(cfg: GossipConfig, rank: int, store, host: str, describe=str) -> dict:
    """Train learner ``rank`` of ``cfg`` until the run's step budget is spent; returns its
    report (steps, updates, waits, gossip stats, episodes, model snapshots, final model).

    ``store``: the run's rendezvous store (shared counter and reports); ``host``: the address
    this learner listens on. Raises PeerFailed when a peer fails, ConfigError for a bad cfg.
    """
    import torch
    import torch.distributed as dist
    from replaybench.impl.rl.algorithms.a2c import A2CLearner, collect
    from replaybench.impl.rl.common.stepping import SharedVectorEnv
    from replaybench.impl.rl.gossip.exchange import GossipExchange, make_group

    acfg = cfg.validate()
    world = cfg.learners
    torch.set_num_threads(1)
    group = make_group(dist.PrefixStore("pg", store), rank, world, host=host, timeout_s=cfg.timeout_s)
    seed = cfg.seed * 100_003 + rank * 1_009
    straggler = world - 1 if cfg.straggler_slowdown > 1 else None
    with SharedVectorEnv(cfg.env, cfg.n_envs, cfg.env_workers, seed=seed) as venv:
        learner = A2CLearner(venv.single_observation_space, venv.single_action_space, acfg, seed=seed)
        model = _flat(learner.net)
        group.broadcast(model, 0).wait()  # one initial model for every scheme
        _load(learner.net, model)
        exchange = averager = None
        if cfg.scheme == "allreduce":
            averager = learner.grad_hook = _GradientAverager(group, world)
        if cfg.scheme == "gossip":
            exchange = GossipExchange(group, Topology(cfg.topology, world, cfg.peers), model,
                                      staleness=cfg.staleness, timeout_s=cfg.timeout_s, describe=describe)
        group.barrier().wait()
        t0 = time.monotonic()
        obs = venv.reset()
        steps = updates = pushed = 0
        episodes, snapshots = [], []
        per_rollout = cfg.n_envs * acfg.t_max
        while True:
            t_step = time.perf_counter()
            rollout, obs = collect(venv, learner, obs, acfg.t_max)
            steps += per_rollout
            total = store.add("env_steps", per_rollout)
            elapsed = time.monotonic() - t0
            stop = total >= cfg.steps or (cfg.time_limit_s is not None and elapsed >= cfg.time_limit_s)
            if averager is not None:
                averager.vote = stop
            learner.update(rollout)
            if averager is not None:
                stop = averager.stop
            if exchange is not None:
                _load(learner.net, exchange.round(_flat(learner.net)))
            updates += 1
            if rank == cfg.fail_rank and updates >= cfg.fail_after_rounds:
                os._exit(3)  # an abrupt crash: no goodbye, the OS closes the sockets
            if rank == straggler:
                time.sleep((cfg.straggler_slowdown - 1.0) * (time.perf_counter() - t_step))
            wall = time.monotonic() - t0
            for _env, ret, _length in venv.pop_episodes():
                episodes.append((wall, steps, float(ret)))
            if len(episodes) > pushed:  # for the launcher, which writes them as the run goes
                store.append(f"episodes/{rank}", "".join(f"{w!r} {s} {r!r}\n" for w, s, r in episodes[pushed:]))
                pushed = len(episodes)
            if (updates - 1) % cfg.snapshot_every == 0:  # rounds 1, 1 + m, ...: the same rounds everywhere
                snapshots.append((wall, _flat(learner.net).numpy()))
            if stop:
                break
        if exchange is not None:
            _load(learner.net, exchange.finish(_flat(learner.net)))
        end = time.monotonic() - t0
        shared = shared_memory_maps()  # while the envs are open: a learner's own env workers would show here
    n_params = model.numel()
    if cfg.scheme == "gossip":
        gossip = exchange.stats.to_dict()
        bytes_sent, wait = gossip["bytes_sent"], gossip["wait_s"]
    else:
        gossip = None
        bytes_sent = int(2 * (world - 1) / world * 4 * (n_params + 1) * updates) if cfg.scheme == "allreduce" else 0
        wait = averager.wait_s if averager is not None else 0.0
    return {"rank": rank, "host": host, "env_steps": steps, "updates": updates, "end_s": end, "wait_s": wait,
            "bytes_sent": bytes_sent, "gossip": gossip, "episodes": episodes, "snapshots": snapshots,
            "final": _flat(learner.net).numpy(), "n_params": n_params, "shared_memory": shared}


def shared_memory_maps(maps: str = "/proc/self/maps") -> list[str]:
    """This process's mappings of memory it could share with another process: writable
    shared mappings, and any mapping of /dev/shm, memfd or System V segments. Read-only shared
    file mappings (a locale cache) are not counted: nothing can be written through them."""
    found = []
    with open(maps) as f:
        for line in f:
            parts = line.split(maxsplit=5)
            perms, path = parts[1], (parts[5].strip() if len(parts) > 5 else "")
            if perms[3] != "s":
                continue
            if perms[1] == "w" or path.startswith(("/dev/shm", "/memfd:", "/SYSV")):
                found.append(f"{perms} {path or '[anonymous]'}")
    return found


# ---------------------------------------------------------------------------------------------- result
def summarize(cfg: GossipConfig, reports: list[dict]) -> GossipResult:
    """The run's :class:`GossipResult` from every learner's report (pure: used by rank 0)."""
    from replaybench.impl.rl.common.envs import THRESHOLDS, EpisodeLog
    from replaybench.impl.rl.gossip.exchange import consensus_distance

    reports = sorted(reports, key=lambda r: r["rank"])
    env_steps = sum(r["env_steps"] for r in reports)
    wall = max(r["end_s"] for r in reports)
    pooled = sorted((w, s, ret, r["rank"]) for r in reports for (w, s, ret) in r["episodes"])
    log = EpisodeLog(THRESHOLDS.get(cfg.env))
    for w, s, ret, _ in pooled:
        log.record(s, w, ret)
    steps_then = None
    if log.time_to_threshold_s is not None:
        t = log.time_to_threshold_s
        steps_then = sum(max((s for (w, s, _) in r["episodes"] if w <= t), default=0) for r in reports)
    ticks = min(len(r["snapshots"]) for r in reports)
    consensus = []
    for k in range(ticks):
        wall_k = float(np.mean([r["snapshots"][k][0] for r in reports]))
        consensus.append((wall_k, consensus_distance([r["snapshots"][k][1] for r in reports])))
    return GossipResult(env_steps=env_steps, wall_s=wall, env_steps_per_s=env_steps / wall,
                        time_to_threshold_s=log.time_to_threshold_s, steps_to_threshold=steps_then,
                        consensus=consensus, final_consensus=consensus_distance([r["final"] for r in reports]),
                        bytes_sent=sum(r["bytes_sent"] for r in reports), wait_s=[r["wait_s"] for r in reports],
                        learners=[{k: r[k] for k in ("rank", "host", "env_steps", "updates", "end_s", "wait_s",
                                                     "bytes_sent", "gossip", "shared_memory")} for r in reports],
                        episodes=[list(e) for e in pooled])


# ---------------------------------------------------------------------------------------------- process
def _store_from_env(timeout_s: float):
    import datetime

    import torch.distributed as dist

    world = int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False,
                          timeout=datetime.timedelta(seconds=timeout_s))
    return dist.PrefixStore(STORE_PREFIX, store)


def _address_towards(host: str, port: int) -> str:
    """This machine's address on the route to ``host`` (what the rendezvous host, and so the
    other learners, can reach): a UDP socket's local address after ``connect``, which sends
    nothing. Used when REPLAYBENCH_NODE_ADDR is not set (e.g. under torchrun)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, port))
        return s.getsockname()[0]


def main(argv=None) -> int:
    """The learner process: ``--config`` JSON (a GossipConfig), ``--result`` PATH (rank 0
    writes the run's result there). Exit status 0, or 1 with the error on stderr."""
    p = argparse.ArgumentParser(prog="python -m replaybench.impl.rl.gossip.learner")
    p.add_argument("--config", required=True, help="GossipConfig as JSON")
    p.add_argument("--result", help="where rank 0 writes the run's result (JSON)")
    args = p.parse_args(argv)
    cfg = GossipConfig.from_dict(json.loads(args.config))
    rank = int(os.environ["RANK"])
    if int(os.environ["WORLD_SIZE"]) != cfg.learners:
        print(f"learner {rank}: WORLD_SIZE={os.environ['WORLD_SIZE']} but the config has {cfg.learners} learners",
              file=sys.stderr)
        return 1
    host = os.environ.get("REPLAYBENCH_NODE_ADDR") or _address_towards(os.environ["MASTER_ADDR"],
                                                                        int(os.environ["MASTER_PORT"]))
    try:
        store = _store_from_env(cfg.timeout_s)
        store.set(f"addr/{rank}", host)

        def describe(j: int) -> str:
            return f"node {store.get(f'addr/{j}').decode()}"

        report = run_learner(cfg, rank, store, host, describe)
        store.set(f"report/{rank}", pickle.dumps(report))
        if rank == 0:
            reports = [pickle.loads(store.get(f"report/{r}")) for r in range(cfg.learners)]
            result = summarize(cfg, reports)
            if args.result:
                tmp = args.result + ".tmp"
                with open(tmp, "w") as f:
                    json.dump(result.to_dict(), f)
                os.replace(tmp, args.result)
    except Exception as err:  # reported to the launcher; the threads are daemons, so exit now
        text = " | ".join(line for line in str(err).splitlines() if line.strip())
        print(f"learner {rank} ({host}): {type(err).__name__}: {text}", file=sys.stderr, flush=True)
        os._exit(1)
    sys.stdout.flush()
    os._exit(0)  # skip the process group's teardown: every message has been delivered


if __name__ == "__main__":
    sys.exit(main())
