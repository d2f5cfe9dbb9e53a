"""The learner scenario: what one learner update costs, beside the cost of its arithmetic.

A training run that learns is bound by its learner (SGD and replay take most of the sequential
loop's time at the ratios that learn), so the update's cost decides what any actor layout can
show. Each cell builds one learner (``algos`` in the suite: an algorithm and the environment
whose spaces shape its networks), on one ``device``, with one update implementation
(``updates``: ``"torch"``, the eager reference; ``"numba"``, the compiled kernels of
:mod:`impl.rl.algorithms.mlp_kernels`, for an algorithm whose config has an ``update`` field),
at one ``batch`` size; makes ``warmup`` updates (compilation and loading are paid there), then
times ``repeats`` blocks of ``calls`` updates on fixed random batches (numpy arrays, as a
buffer's sample gives them: the conversion to the update's inputs is part of the update). On a
CUDA device each block ends in ``torch.cuda.synchronize()``.

Beside each cell, its **arithmetic floor**: the update's matrix FLOPs (counted once on the
eager step by ``torch.utils.flop_counter``: forward and backward products of every network)
over this machine's measured matrix rate (``torch.mm`` on one thread at the cell's largest
layer shape, best of a few). The summary names each cell's bound: ``arithmetic`` when the
update costs at most twice its floor, otherwise ``dispatch`` (operator calls and Python
between the products) on the CPU or ``dispatch/copies`` off it.

``learners`` (default ``[1]``) adds learner groups: L spawned learner processes, one thread
each, every one on its own batch of ``batch`` rows, averaging gradients through the process
engine's shared-memory all-reduce (a global batch of L x batch, as PAL's learners and ours
split one); a block's time is its slowest rank's, and the all-reduce alone on the gradient
vector is a row of its own.

Rows: op ``learn``, ``backend`` the update implementation, ``algo``, ``env``, ``batch`` (per
learner), ``learners``, ``threads`` (torch's and the BLAS pools' threads: 1, set for the run),
params ``device``; metric ``seconds_per_call`` (one per block, ``loops`` = calls,
``items_per_call`` = the global batch, so samples learned per second follow), per single-learner
cell one ``flops_per_call`` and one ``floor_seconds_per_call`` row, per group one
``allreduce_seconds_per_call`` row. A cell that needs CUDA where torch sees none, or an update the
algorithm does not have, is one ``unavailable`` / ``skipped`` row naming the reason.
"""

from __future__ import annotations

import time

import numpy as np

from replaybench.bench.learner_costs import BOUND_FACTOR, cell_medians
from replaybench.bench.scenarios import Cell, RunState, Scenario, Selection, SelectionError
from replaybench.bench.scenarios.gpu import cuda_missing
from replaybench.bench.summary import format_table

__all__ = ["Learner", "SCENARIO", "BOUND_FACTOR", "format_summary"]

DEVICES = ("cpu", "cuda")
UPDATES = ("torch", "numba")


class Learner(Scenario):
    name = "learner"
    takes = frozenset()
    suite_keys = frozenset({"algos", "batches", "updates", "devices", "seed", "warmup", "calls", "repeats", "learners"})

    def cells(self, suite: dict, selection: Selection) -> list[Cell]:
        from replaybench.impl.rl import algorithms

        where = f"suite {suite['name']!r}"
        for key in ("batches", "updates", "devices", "algos"):
            if not isinstance(suite.get(key), list) or not suite[key]:
                raise SelectionError(f"{where}: {key!r} must be a non-empty list, got {suite.get(key)!r}")
        bad = [b for b in suite["batches"] if not isinstance(b, int) or b < 1]
        if bad:
            raise SelectionError(f"{where}: batches must be positive integers, got {bad}")
        for key, allowed in (("updates", UPDATES), ("devices", DEVICES)):
            wrong = [v for v in suite[key] if v not in allowed]
            if wrong:
                raise SelectionError(f"{where}: {key} must be among {list(allowed)}, got {wrong}")
        for key in ("warmup", "calls", "repeats"):
            if not isinstance(suite.get(key), int) or suite[key] < (0 if key == "warmup" else 1):
                raise SelectionError(f"{where}: {key!r} must be a positive integer, got {suite.get(key)!r}")
        group_sizes = suite.get("learners", [1])
        if (not isinstance(group_sizes, list) or not group_sizes
                or any(not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in group_sizes)):
            raise SelectionError(f"{where}: 'learners' must be a non-empty list of positive integers, got {group_sizes!r}")
        cuda = cuda_missing() if "cuda" in suite["devices"] else ""
        cells = []
        for entry in suite["algos"]:
            if not isinstance(entry, dict) or set(entry) != {"algo", "env"}:
                raise SelectionError(f"{where}: an 'algos' entry is {{\"algo\": ..., \"env\": ...}}, got {entry!r}")
            try:
                algo = algorithms.get(entry["algo"])
            except ValueError as err:
                raise SelectionError(f"{where}: {err}") from None
            if algo.actor_cls is None:
                raise SelectionError(f"{where}: algo {entry['algo']!r} has no replay learner to time")
            compiled = "update" in algo.config_cls.__dataclass_fields__
            for device in suite["devices"]:
                for update in suite["updates"]:
                    for batch, learners in ((b, n) for n in group_sizes for b in suite["batches"]):
                        columns = {"scenario": self.name, "backend": update, "algo": entry["algo"],
                                   "env": entry["env"], "batch": batch, "threads": 1, "op": "learn",
                                   "learners": learners, "metric": "seconds_per_call", "unit": "s",
                                   "items_per_call": batch * learners, "params": {"device": device}}
                        skip, status = "", "skipped"
                        if device == "cuda" and cuda:
                            skip, status = cuda, "unavailable"
                        elif update == "numba" and not compiled:
                            skip = f"{entry['algo']} has no compiled update (its config has no 'update' field)"
                        elif update == "numba" and device != "cpu":
                            skip = "the compiled update runs on the CPU only"
                        elif learners > 1 and device != "cpu":
                            skip = "learner groups are measured on the CPU (one process per learner, one core each)"
                        cells.append(Cell(f"{entry['algo']} {entry['env']} {update} {device} batch={batch}"
                                          + (f" learners={learners}" if learners > 1 else ""),
                                          columns, spec=(algo, entry["env"], update, device, batch, learners),
                                          skip=skip, skip_status=status))
        return cells

    def meta(self, suite: dict, selection: Selection, cells: list[Cell]) -> dict:
        return {"timing": f"{suite['warmup']} warm-up updates, then {suite['repeats']} blocks of {suite['calls']} "
                          "updates on fixed random batches; torch and BLAS on one thread; a CUDA block ends in "
                          "torch.cuda.synchronize()",
                "bound_factor": BOUND_FACTOR}

    def measure(self, cell: Cell, run: RunState) -> list[dict]:
        import torch

        algo, env_id, update, device, batch, learners = cell.spec
        suite = run.meta["suite"]
        if learners > 1:
            return _measure_group(cell, suite, algo.name, env_id, update, batch, learners)
        _one_thread()
        learner, batches = _learner(algo, env_id, update, device, batch, int(suite["seed"]))
        flops = _flops(algo, env_id, device, batch, batches[0], int(suite["seed"]))
        for i in range(int(suite["warmup"])):
            learner.learn(batches[i % len(batches)])
        sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        sync()
        rows, calls = [], int(suite["calls"])
        for repeat in range(int(suite["repeats"])):
            start = time.perf_counter()
            for i in range(calls):
                learner.learn(batches[i % len(batches)])
            sync()
            rows.append(cell.row("ok", value=(time.perf_counter() - start) / calls, repeat=repeat, loops=calls))
        rate = _matmul_rate(_widest(learner), batch, device)
        rows.append(cell.row("ok", metric="flops_per_call", unit="flop", value=float(flops)))
        rows.append(cell.row("ok", metric="floor_seconds_per_call", value=flops / rate))
        return rows

    def summarize(self, rows: list[dict], meta: dict) -> str:
        return format_summary(rows, meta.get("bound_factor", BOUND_FACTOR))


def _measure_group(cell: Cell, suite: dict, algo_name: str, env_id: str, update: str, batch: int,
                   learners: int) -> list[dict]:
    """``learners`` learner processes (spawned, one thread each) on batches of ``batch``,
    averaging their gradients through :class:`impl.rl.common.allreduce.SharedAllreduce` as the
    process engine's learners do (a global batch of ``learners x batch``): each times the same
    blocks of updates after a barrier; a block's time is its slowest rank's. Then the
    all-reduce alone on the gradient vector, a row of its own (``allreduce_seconds_per_call``)."""
    import multiprocessing as mp

    from replaybench.impl.rl.common.allreduce import SharedAllreduce

    ctx = mp.get_context("spawn")
    probe, _ = _learner(_algorithm(algo_name), env_id, update, "cpu", batch, int(suite["seed"]))
    size = sum(p.numel() for net in probe.modules() for p in net.parameters())  # at least any averaged gradient
    group = SharedAllreduce(ctx, learners, size, timeout_s=120)
    out = ctx.Queue()
    policy_size = sum(p.numel() for p in probe.policy_net.parameters())
    args = (algo_name, env_id, update, batch, int(suite["seed"]), int(suite["warmup"]), int(suite["calls"]),
            int(suite["repeats"]), policy_size)
    procs = [ctx.Process(target=_group_member, args=(rank, group, args, out), name=f"learner-{rank}")
             for rank in range(learners)]
    for p in procs:
        p.start()
    try:
        results = collect_group(procs, out, group, GROUP_LIMIT_S)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
    failed = [r for r in results if "error" in r]
    if failed:
        raise RuntimeError(f"learner-{failed[0]['rank']} failed: {failed[0]['error']}")
    blocks = [max(r["blocks"][i] for r in results) for i in range(int(suite["repeats"]))]
    calls = int(suite["calls"])
    rows = [cell.row("ok", value=b / calls, repeat=i, loops=calls) for i, b in enumerate(blocks)]
    rows.append(cell.row("ok", metric="allreduce_seconds_per_call",
                         value=max(r["allreduce_s"] for r in results), items_per_call=policy_size))
    return rows


#: The most a learner group's cell may take, from its processes' start to their last report.
GROUP_LIMIT_S = 600.0


def collect_group(procs: list, out, group, limit_s: float, poll_s: float = 0.1) -> list[dict]:
    """Each member's report (a dict with its ``"rank"``) from ``out``, in rank order, for the
    started processes ``procs`` (``procs[r]`` is rank r). Raises RuntimeError naming the member:
    one that exited without reporting (killed, or died in set-up), with its pid and exit code,
    as soon as that is seen; past ``limit_s`` seconds, the members that have not reported, with
    who waits for whom at ``group``'s all-reduce (:meth:`SharedAllreduce.stall`) where a rank
    waits. The caller ends the processes either way."""
    import queue

    results: dict[int, dict] = {}

    def drain(timeout: float) -> None:
        try:
            report = out.get(timeout=timeout) if timeout > 0 else out.get_nowait()
            while True:
                results[report["rank"]] = report
                report = out.get_nowait()
        except queue.Empty:
            pass

    deadline = time.monotonic() + limit_s
    while len(results) < len(procs):
        drain(poll_s)
        exited = [r for r, p in enumerate(procs) if r not in results and p.exitcode is not None]
        if exited:
            drain(0.0)  # a report put just before its process exited
            for r in exited:
                if r not in results:
                    raise RuntimeError(f"learner-{r} (pid {procs[r].pid}) exited with code {procs[r].exitcode} "
                                       "without reporting")
        if len(results) < len(procs) and time.monotonic() > deadline:
            missing = ", ".join(f"learner-{r}" for r in range(len(procs)) if r not in results)
            stall = group.stall()
            raise RuntimeError(f"learner group: {missing} did not report within {limit_s:.0f} s"
                               + (f"; {stall}" if stall is not None else ""))
    return [results[r] for r in range(len(procs))]


def _group_member(rank: int, group, args: tuple, out) -> None:
    """In a spawned learner process: rank ``rank``'s timed blocks, put on ``out``."""
    try:
        algo_name, env_id, update, batch, seed, warmup, calls, repeats, policy_size = args
        from replaybench.impl.rl.common.allreduce import SharedGradientAverager

        _one_thread()
        group.bind(rank)
        learner, batches = _learner(_algorithm(algo_name), env_id, update, "cpu", batch, seed)  # every rank: the same weights
        learner.grad_hook = SharedGradientAverager(group)
        for i in range(warmup):
            learner.learn(batches[i % len(batches)])
        blocks = []
        for _ in range(repeats):
            group.barrier()
            start = time.perf_counter()
            for i in range(calls):
                learner.learn(batches[i % len(batches)])
            blocks.append(time.perf_counter() - start)
        vector = np.ones(policy_size, np.float32)  # the policy network's gradient, as one all-reduce
        group.barrier()
        start = time.perf_counter()
        for _ in range(calls):
            group.mean(vector)
        out.put({"rank": rank, "blocks": blocks, "allreduce_s": (time.perf_counter() - start) / calls})
    except BaseException as err:  # the parent names the rank
        out.put({"rank": rank, "error": f"{type(err).__name__}: {err}"})


def _algorithm(name: str):
    from replaybench.impl.rl import algorithms

    return algorithms.get(name)


def format_summary(rows: list[dict], factor: float = BOUND_FACTOR) -> str:
    """Per (algo, env, device, batch, learners): each update's median microseconds per update,
    samples learned per second (the global batch over the time), its floor and bound, the
    compiled update over the eager one, and for a learner group its samples per second over
    one learner's at the same batch and update, with the all-reduce's own cost
    (:func:`cell_medians`)."""
    body = []
    for c in cell_medians(rows, factor):
        floor = c["floor"]
        body.append([c["algo"], c["env"], c["device"], str(c["batch"]), str(c["learners"]), c["update"],
                     f"{c['seconds'] * 1e6:.1f}", f"{c['low'] * 1e6:.0f}-{c['high'] * 1e6:.0f}",
                     f"{c['samples_per_s']:,.0f}", "-" if floor is None else f"{floor * 1e6:.1f}",
                     "-" if floor is None else f"{c['seconds'] / floor:.1f}", c["bound"],
                     "-" if c["x_torch"] is None else f"{c['x_torch']:.2f}",
                     "-" if c["x_one"] is None else f"{c['x_one']:.2f}",
                     "-" if c["allreduce"] is None else f"{c['allreduce'] * 1e6:.0f}"])
    header = ["algo", "env", "device", "batch", "learners", "update", "us/update", "min-max", "samples/s",
              "floor us", "x floor", "bound", "x torch", "x 1 learner", "allreduce us"]
    return "\n".join(format_table(header, body, {3, 4, 6, 8, 9, 10, 12, 13, 14}))


def _one_thread() -> None:
    """torch and the BLAS pools on one thread: the learner's cost on one core."""
    import scipy.linalg.cython_blas  # noqa: F401  (numba's BLAS: loaded first, or the limit would not reach it)
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(1)
    threadpool_limits(1, user_api="blas")


def _spaces(env_id: str):
    import gymnasium as gym

    env = gym.make(env_id)
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()


def _batches(spaces, batch: int, seed: int, count: int = 8) -> list[dict]:
    """``count`` random batches of a buffer sample's learner fields for ``spaces``."""
    obs_space, act_space = spaces
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        if hasattr(act_space, "n"):
            action = rng.integers(0, act_space.n, batch)
        else:
            action = rng.uniform(act_space.low, act_space.high, (batch, *act_space.shape)).astype(np.float32)
        out.append({"obs": rng.standard_normal((batch, *obs_space.shape)).astype(np.float32),
                    "next_obs": rng.standard_normal((batch, *obs_space.shape)).astype(np.float32),
                    "action": action, "reward": rng.standard_normal(batch).astype(np.float32),
                    "done": rng.random(batch) < 0.05, "weights": rng.uniform(0.2, 1.0, batch).astype(np.float32)})
    return out


def _config(algo, env_id: str, update: str, batch: int):
    overrides = {"batch_size": batch, "learning_starts": max(batch, 1)}
    if "update" in algo.config_cls.__dataclass_fields__:
        overrides["update"] = update
    return algo.config_cls.for_env(env_id, **overrides)


def _learner(algo, env_id: str, update: str, device: str, batch: int, seed: int):
    import torch

    spaces = _spaces(env_id)
    learner = algo.learner_cls(spaces, _config(algo, env_id, update, batch), seed, device=torch.device(device))
    return learner, _batches(spaces, batch, seed)


def _flops(algo, env_id: str, device: str, batch: int, sample: dict, seed: int) -> int:
    """Matrix FLOPs of one eager update (forward and backward), counted by torch."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    spaces = _spaces(env_id)
    learner = algo.learner_cls(spaces, _config(algo, env_id, "torch", batch), seed, device=torch.device(device))
    learner.learn(sample)  # a TD3 actor update comes every policy_delay calls: count a cycle
    delay = int(getattr(learner.cfg, "policy_delay", 1))
    counter = FlopCounterMode(display=False)
    with counter:
        for _ in range(delay):
            learner.learn(sample)
    return counter.get_total_flops() // delay


def _widest(learner) -> int:
    """The largest layer width of the learner's networks (the products' inner size)."""
    from torch import nn

    widths = [max(m.in_features, m.out_features) for net in learner.modules() for m in net.modules()
              if isinstance(m, nn.Linear)]
    return max(widths) if widths else 1


def _matmul_rate(width: int, batch: int, device: str, repeats: int = 5) -> float:
    """FLOP/s of ``torch.mm`` of (batch x width) by (width x width) here, best of ``repeats``
    blocks: what the update's products can reach at their largest shape."""
    import torch

    a = torch.randn(batch, width, device=device)
    b = torch.randn(width, width, device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    calls = max(10, int(2e8 / (2 * batch * width * width + 1)))
    best = float("inf")
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        for _ in range(calls):
            torch.mm(a, b)
        sync()
        best = min(best, (time.perf_counter() - start) / calls)
    return 2 * batch * width * width / best


SCENARIO = Learner()
