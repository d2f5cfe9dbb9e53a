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

Rows: op ``learn``, ``backend`` the update implementation, ``algo``, ``env``, ``batch``,
``threads`` (torch's and the BLAS pools' threads: 1, set for the run), params ``device``;
metric ``seconds_per_call`` (one per block, ``loops`` = calls, ``items_per_call`` = batch, so
samples learned per second follow), and per cell one ``flops_per_call`` and one
``floor_seconds_per_call`` row. A cell that needs CUDA where torch sees none, or an update the
algorithm does not have, is one ``unavailable`` / ``skipped`` row naming the reason.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from replaybench.bench.scenarios import Cell, RunState, Scenario, Selection, SelectionError
from replaybench.bench.summary import format_table

__all__ = ["Learner", "SCENARIO", "BOUND_FACTOR"]

DEVICES = ("cpu", "cuda")
UPDATES = ("torch", "numba")
#: An update within this factor of its arithmetic floor is called arithmetic-bound.
BOUND_FACTOR = 2.0


class Learner(Scenario):
    name = "learner"
    takes = frozenset()
    suite_keys = frozenset({"algos", "batches", "updates", "devices", "seed", "warmup", "calls", "repeats"})

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
        cuda = _cuda_missing() if "cuda" in suite["devices"] else ""
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
                    for batch in suite["batches"]:
                        columns = {"scenario": self.name, "backend": update, "algo": entry["algo"],
                                   "env": entry["env"], "batch": batch, "threads": 1, "op": "learn",
                                   "metric": "seconds_per_call", "unit": "s", "items_per_call": batch,
                                   "params": {"device": device}}
                        skip, status = "", "skipped"
                        if device == "cuda" and cuda:
                            skip, status = cuda, "unavailable"
                        elif update == "numba" and not compiled:
                            skip = f"{entry['algo']} has no compiled update (its config has no 'update' field)"
                        elif update == "numba" and device != "cpu":
                            skip = "the compiled update runs on the CPU only"
                        cells.append(Cell(f"{entry['algo']} {entry['env']} {update} {device} batch={batch}",
                                          columns, spec=(algo, entry["env"], update, device, batch), skip=skip,
                                          skip_status=status))
        return cells

    def meta(self, suite: dict, selection: Selection, cells: list[Cell]) -> dict:
        return {"timing": f"{suite['warmup']} warm-up updates, then {suite['repeats']} blocks of {suite['calls']} "
                          "updates on fixed random batches; torch and BLAS on one thread; a CUDA block ends in "
                          "torch.cuda.synchronize()",
                "bound_factor": BOUND_FACTOR}

    def measure(self, cell: Cell, run: RunState) -> list[dict]:
        import torch

        algo, env_id, update, device, batch = cell.spec
        suite = run.meta["suite"]
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


def format_summary(rows: list[dict], factor: float = BOUND_FACTOR) -> str:
    """Per (algo, env, device, batch): each update's median microseconds per update, samples
    learned per second, its floor and bound, and the compiled update over the eager one."""
    cells: dict[tuple, dict] = {}
    for r in rows:
        if r["status"] != "ok":
            continue
        device = (r.get("params") or {}).get("device", "cpu") if isinstance(r.get("params"), dict) else "cpu"
        key = (r["algo"], r["env"], device, r["batch"])
        cells.setdefault(key, {}).setdefault(r["backend"], {}).setdefault(r["metric"], []).append(r["value"])
    body = []
    for (algo, env, device, batch), by_update in sorted(cells.items()):
        eager = by_update.get("torch", {}).get("seconds_per_call")
        for update, metrics in sorted(by_update.items()):
            values = metrics.get("seconds_per_call", [])
            if not values:
                continue
            median = statistics.median(values)
            floor = statistics.median(metrics["floor_seconds_per_call"]) if metrics.get("floor_seconds_per_call") else None
            bound = "-" if floor is None else (
                "arithmetic" if median <= factor * floor else ("dispatch" if device == "cpu" else "dispatch/copies"))
            body.append([algo, env, device, str(batch), update, f"{median * 1e6:.1f}",
                         f"{min(values) * 1e6:.0f}-{max(values) * 1e6:.0f}", f"{batch / median:,.0f}",
                         "-" if floor is None else f"{floor * 1e6:.1f}",
                         "-" if floor is None else f"{median / floor:.1f}", bound,
                         "-" if not eager or update == "torch" else f"{statistics.median(eager) / median:.2f}"])
    header = ["algo", "env", "device", "batch", "update", "us/update", "min-max", "samples/s", "floor us",
              "x floor", "bound", "x torch"]
    return "\n".join(format_table(header, body, {3, 5, 7, 8, 9, 11}))


def _cuda_missing() -> str:
    import torch

    if torch.cuda.is_available():
        return ""
    return f"torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is False)"


def _one_thread() -> None:
    """torch and the BLAS pools on one thread: the learner's cost on one core."""
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
