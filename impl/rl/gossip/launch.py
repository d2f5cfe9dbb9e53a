"""Start the learner processes of a gossip run, as torchrun does, and watch them.

    from replaybench.impl.rl.gossip.launch import launch
    result = launch(GossipConfig(scheme="gossip", nodes=2, learners_per_node=2, steps=50_000))

A *node* is a group of learners with one network address. Run on one machine with every node
(``node_rank=None``), the launcher gives node ``i`` the loopback address 127.0.0.(2 + i): its
learners' gloo sockets listen there, and learners talk only by TCP through the rendezvous
store and the gloo process group, never through shared memory. On several machines, start
the launcher once per machine with the same config and rendezvous endpoint, its
``node_rank`` and ``node_addr`` (an address the other machines reach). The launcher of node 0
hosts the rendezvous store (a TCPStore at the endpoint) and returns the run's result; the
others return None.

Each learner is a fresh interpreter (``python -m replaybench.impl.rl.gossip.learner``; nothing
inherited but its environment variables: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT, REPLAYBENCH_NODE_ADDR), in its own session, with stdout and stderr in a log
file. When one exits with an error, the others get ``timeout_s`` plus 10 s to notice and exit
by themselves (their errors name the failed peer's rank), then the rest are terminated
(SIGTERM, then SIGKILL); :class:`LaunchFailed` lists every learner's error. On Ctrl-C
(KeyboardInterrupt) every learner is terminated the same way, and the temporary log folder
removed, before it is raised again. No learner, and no temporary folder but a failed run's
logs, outlives :func:`launch`.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from replaybench.impl.rl.common.errors import ConfigError
from replaybench.impl.rl.gossip.learner import GossipConfig, GossipResult

__all__ = ["LaunchFailed", "parse_endpoint", "node_address", "check_launch", "launch"]

_GRACE_S = 10.0


class LaunchFailed(RuntimeError):
    """A learner exited with an error; ``errors`` maps rank -> its last stderr lines."""

    def __init__(self, message: str, errors: dict):
        super().__init__(message)
        self.errors = errors


def parse_endpoint(text: str) -> tuple[str, int]:
    """``host:port`` -> (host, port); port 0 = a free port. ConfigError ("rdzv_endpoint")."""
    host, sep, port = str(text).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigError("rdzv_endpoint", text, f"rdzv_endpoint must be HOST:PORT, got {text!r}")
    return host, int(port)


def node_address(node: int) -> str:
    """The loopback address of node ``node`` when every node runs on this machine: 127.0.0.(2 + node),
    so at most 250 nodes (ConfigError naming ``nodes`` beyond)."""
    if not 0 <= node < 250:
        raise ConfigError("nodes", node + 1, f"nodes must be at most 250 when every node runs on this machine "
                                             f"(node i listens on 127.0.0.(2+i)), got {node + 1}")
    return f"127.0.0.{2 + node}"


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _tail(path: Path) -> str:
    """The learner's error line (its last line starting "learner "), else its last line."""
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    mine = [line for line in text if line.startswith("learner ")]
    return (mine or text or [""])[-1]


def check_launch(cfg: GossipConfig, *, rdzv_endpoint: str = "127.0.0.1:0", node_rank: int | None = None,
                 node_addr: str | None = None) -> tuple[str, int, dict]:
    """Check what :func:`launch` is given, starting nothing; returns (store host, port,
    {node: the address its learners listen on}) for the nodes this machine runs.

    ConfigError naming the argument: a config field (:meth:`GossipConfig.validate`),
    ``rdzv_endpoint``, ``node_rank``, ``node_addr``, or ``nodes`` when every node is to run on
    this machine and there are more than its loopback addresses (:func:`node_address`).
    Cost: that of :meth:`GossipConfig.validate` (one ``gym.make``).
    """
    cfg.validate()
    host, port = parse_endpoint(rdzv_endpoint)
    if node_rank is None:
        node_address(cfg.nodes - 1)  # the last node first: a refusal names the count asked for
        addrs = {n: node_address(n) for n in range(cfg.nodes)}
    else:
        if not isinstance(node_rank, int) or not 0 <= node_rank < cfg.nodes:
            raise ConfigError("node_rank", node_rank, f"node_rank must be in [0, {cfg.nodes}), got {node_rank!r}")
        if node_addr is None and not _is_loopback(host):
            raise ConfigError("node_addr", node_addr, "node_addr (this machine's address) is needed when the "
                                                      f"rendezvous endpoint {host!r} is not a loopback address")
        addrs = {node_rank: node_addr or node_address(node_rank)}
    if port == 0 and next(iter(addrs)) != 0:
        raise ConfigError("rdzv_endpoint", rdzv_endpoint, "nodes other than 0 need the endpoint's real port")
    return host, port, addrs


def launch(cfg: GossipConfig, *, rdzv_endpoint: str = "127.0.0.1:0", node_rank: int | None = None,
           node_addr: str | None = None, progress=None, log_dir: str | None = None, episodes=None,
           episodes_every_s: float = 5.0) -> GossipResult | None:
    """Run ``cfg``'s learners of this machine (every node when ``node_rank`` is None); returns
    the run's result on node 0, None on other nodes.

    Everything is checked first, before any process starts (:func:`check_launch`: ConfigError
    naming the argument: a config field, ``rdzv_endpoint``, ``node_rank``, ``node_addr``, ``nodes``).
    ``progress(env_steps)`` is called about twice a second on node 0, and ``episodes(new)``
    about every ``episodes_every_s`` seconds and once when every learner has ended, with the
    episodes finished since its last call, ``[(wall_s, env_steps, return, rank), ...]`` (each
    learner's in order; over a run that succeeds, the calls get exactly the result's
    ``episodes``, which are pooled by time). ``log_dir``: where the
    learners' logs go (default: a temporary folder, removed afterwards unless the run failed
    with an error: kept for LaunchFailed, removed after a success or an interrupt).
    Raises LaunchFailed if a learner fails, KeyboardInterrupt if interrupted.
    """
    import datetime

    import torch.distributed as dist

    host, port, addrs = check_launch(cfg, rdzv_endpoint=rdzv_endpoint, node_rank=node_rank, node_addr=node_addr)
    nodes = list(addrs)
    store = None
    if nodes[0] == 0:  # node 0 hosts the rendezvous store, as torchrun's agent does
        store = dist.TCPStore(host, port, None, True, timeout=datetime.timedelta(seconds=cfg.timeout_s),
                              wait_for_workers=False)
        port = store.port
    own_logs = log_dir is None
    logs = Path(log_dir or tempfile.mkdtemp(prefix="replaybench-gossip-"))
    logs.mkdir(parents=True, exist_ok=True)
    result_path = logs / "result.json"
    procs: dict[int, subprocess.Popen] = {}
    failed = False  # an error to look into: the learners' logs stay (not on an interrupt)
    try:
        for node in nodes:
            for local in range(cfg.learners_per_node):
                rank = node * cfg.learners_per_node + local
                env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(cfg.learners), "LOCAL_RANK": str(local),
                       "MASTER_ADDR": host, "MASTER_PORT": str(port), "REPLAYBENCH_NODE_ADDR": addrs[node],
                       "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
                args = [sys.executable, "-m", "replaybench.impl.rl.gossip.learner", "--config",
                        json.dumps(cfg.to_dict())]
                if rank == 0:
                    args += ["--result", str(result_path)]
                with open(logs / f"learner-{rank}.log", "wb") as log:
                    procs[rank] = subprocess.Popen(args, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                                   stderr=subprocess.STDOUT, start_new_session=True)
        _watch(procs, cfg, logs, store, progress, episodes, episodes_every_s)
        if store is None:
            return None
        return GossipResult(**json.loads(result_path.read_text()))
    except Exception:
        failed = True
        raise
    finally:  # also on KeyboardInterrupt (Ctrl-C; SIGTERM under the driver's latch): nothing left
        _stop(procs)
        if own_logs and not failed:
            shutil.rmtree(logs, ignore_errors=True)
        del store


class _EpisodeFeed:
    """The learners' episodes as they finish: each learner appends its lines to
    ``episodes/<rank>`` in the store; :meth:`read` returns those not read before.
    Cost: one store read per learner (the whole value: a few bytes per episode)."""

    def __init__(self, store, ranks):
        self.store, self.ranks = store, list(ranks)
        self.seen = dict.fromkeys(self.ranks, 0)  # lines read per rank

    def read(self) -> list[tuple]:
        new = []
        for rank in self.ranks:
            key = f"episodes/{rank}"
            try:
                if not self.store.check([key]):  # no episode yet (get would wait for the key)
                    continue
                lines = self.store.get(key).decode().splitlines()
            except RuntimeError:  # the store is going away with the run
                continue
            for line in lines[self.seen[rank]:]:
                wall, steps, ret = line.split()
                new.append((float(wall), int(steps), float(ret), rank))
            self.seen[rank] = len(lines)
        return new


def _watch(procs: dict, cfg: GossipConfig, logs: Path, store, progress, episodes=None,
           episodes_every_s: float = 5.0) -> None:
    """Wait for every learner; on the first failure, give the others a grace period to fail
    by themselves, then raise LaunchFailed with every learner's error. Meanwhile feed
    ``progress`` and ``episodes`` (node 0, which holds the store)."""
    import torch.distributed as dist

    from replaybench.impl.rl.gossip.learner import STORE_PREFIX

    first_failure = None
    last_report = last_episodes = 0.0
    learners = dist.PrefixStore(STORE_PREFIX, store) if store is not None else None  # the learners' keys
    feed = _EpisodeFeed(learners, range(cfg.learners)) if episodes is not None and learners is not None else None
    while True:
        codes = {rank: p.poll() for rank, p in procs.items()}
        bad = {rank: c for rank, c in codes.items() if c not in (None, 0)}
        if bad and first_failure is None:
            first_failure = time.monotonic()
        running = [rank for rank, c in codes.items() if c is None]
        if not running or (first_failure is not None and time.monotonic() - first_failure > cfg.timeout_s + _GRACE_S):
            break
        if progress is not None and learners is not None and time.monotonic() - last_report > 0.5:
            last_report = time.monotonic()
            try:
                progress(int(learners.add("env_steps", 0)))
            except RuntimeError:
                pass  # the store is going away with the run
        if feed is not None and first_failure is None and time.monotonic() - last_episodes > episodes_every_s:
            last_episodes = time.monotonic()
            new = feed.read()
            if new:
                episodes(new)
        time.sleep(0.05)
    if first_failure is None:
        new = feed.read() if feed is not None else []  # the last ones: every learner has ended
        if new:
            episodes(new)
        return
    errors = {}
    for rank, p in sorted(procs.items()):
        code = p.poll()
        if code is None:
            errors[rank] = "still running after the grace period: terminated"
        elif code != 0:
            errors[rank] = f"exit status {code}: {_tail(logs / f'learner-{rank}.log') or '(no output)'}"
    lines = "\n".join(f"  rank {rank}: {text}" for rank, text in errors.items())
    raise LaunchFailed(f"{len(errors)} of {len(procs)} learners failed (logs in {logs}):\n{lines}", errors)


def _stop(procs: dict) -> None:
    """Terminate every learner still running (its whole session), then kill what is left."""
    for sig, wait_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        alive = [p for p in procs.values() if p.poll() is None]
        if not alive:
            return
        for p in alive:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        for p in alive:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
