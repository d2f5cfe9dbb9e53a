"""analysis/: loading and checking runs, every figure, the report and the run comparison.

A small synthetic results folder (micro, K sweep, cache, concurrency, training and frameworks runs, in
the harness's own format via bench.results.RunWriter) is built once per module; the figures'
CSVs are checked against statistics computed here directly from the rows, without the
analysis code. The stored runs under results/ are drawn too when there are any.
"""

from __future__ import annotations

import csv
import json
import math
import re
import shutil
import statistics
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from replaybench.analysis import compare, load, palette, render, report
from replaybench.analysis.__main__ import main
from replaybench.analysis.plots import modules, training_scaling
from replaybench.bench import contract, results

from _examples import load_example

REPO = Path(__file__).resolve().parent.parent
MACHINE = {"cpu_model": "Synthetic CPU", "usable_cpus": 2, "logical_cpus": 2, "sockets": "1",
           "threads_per_core": "1", "os": "test",
           "caches": [{"level": "1", "type": "Data", "size": "32K", "line_size": "64"},
                      {"level": "1", "type": "Instruction", "size": "32K", "line_size": "64"},
                      {"level": "2", "type": "Unified", "size": "1024K", "line_size": "64"},
                      {"level": "3", "type": "Unified", "size": "16384K", "line_size": "64"}]}
VARIANT_META = {"binary": {"structure": "binary", "params": {"dtype": "float32"}},
                "kary": {"structure": "kary", "params": {"K": 16, "dtype": "float32"}},
                "kary-aligned": {"structure": "kary-aligned", "params": {"K": 16, "dtype": "float32"}},
                "peer:cpprb": {"structure": "cpprb-segment-tree", "params": {"K": 2, "dtype": "float32"}}}

# ---------------------------------------------------------------------------------------------
# synthetic runs


def _row(run_id, scenario, **kw):
    return {"schema_version": results.SCHEMA_VERSION, "run_id": run_id, "git_sha": "0" * 40, "dirty": False,
            "machine": "test", "scenario": scenario, "status": "ok", **kw}


def write_run(root, run_id, suite, scenario, rows, grid=None, scale=1.0, extra=None):
    """A run folder written by the harness's RunWriter; ``scale`` multiplies every value;
    ``extra``: more meta.json entries."""
    meta = {"scenario": scenario, "suite": {"name": suite, "batch": 256, "transitions": "cartpole"},
            "selection": {"params": grid or {}}, "variants": VARIANT_META, "machine": MACHINE,
            "git_sha": "0" * 40, "dirty": False, **(extra or {})}
    writer = results.RunWriter(root, run_id, meta, compact=False)  # CSV: the damage tests edit its lines
    out = []
    for r in rows:
        r = {**r, "run_id": run_id}
        if r.get("value") is not None:
            r["value"] = r["value"] * scale
        out.append(r)
    writer.append(out)
    writer.finish(True)
    return writer.dir


def micro_rows(rng, spread=0.03):
    """binary, kary-aligned and cpprb at 2^10 and 2^16: 6 values per cell, plus a skipped cell."""
    base = {"binary": 1.0, "kary-aligned": 0.7, "peer:cpprb": 3.0}
    rows = []
    for variant, factor in base.items():
        info = VARIANT_META[variant]
        for cap in (1024, 65536):
            for op, per_item in (("sample", 40e-9), ("update", 30e-9), ("insert_batch", 20e-9)):
                for rep in range(6):
                    sec = 256 * per_item * factor * (1 + 0.3 * (cap > 1024)) * (1 + spread * rng.standard_normal())
                    rows.append(_row("", "micro", variant=variant, structure=info["structure"], policy="none",
                                     K=info["params"].get("K"), dtype="float32", params=info["params"], capacity=cap,
                                     batch=256, threads=1, transitions="cartpole", op=op, metric="seconds_per_call",
                                     value=sec, unit="s", items_per_call=256, repeat=rep, loops=100))
    rows.append(_row("", "micro", variant="peer:cpprb", structure="cpprb-segment-tree", capacity=2**22, op="sample",
                     metric="seconds_per_call", status="skipped", error="capacity limit", batch=256))
    rows.append(_row("", "micro", variant="harness", structure="none", op="empty", metric="seconds_per_call",
                     value=5e-8, unit="s", items_per_call=1, repeat=0, threads=1))
    return rows


def sweep_rows(rng):
    rows = []
    for variant in ("kary", "kary-aligned"):
        for K in (2, 3, 4, 16):
            params = {"K": K, "dtype": "float32"}
            if variant == "kary-aligned" and K == 3:
                rows.append(_row("", "micro", variant=variant, structure=variant, K=K, params=params, capacity=65536,
                                 op="sample", metric="seconds_per_call", status="skipped", batch=256,
                                 error="K must be a power of 2"))
                continue
            for op in ("sample", "update"):
                for rep in range(3):
                    sec = 256e-8 * (1 + abs(math.log2(K) - 3)) * (1 + 0.02 * rng.standard_normal())
                    rows.append(_row("", "micro", variant=variant, structure=variant, policy="none", K=K,
                                     dtype="float32", params=params, capacity=65536, batch=256, threads=1,
                                     transitions="cartpole", op=op, metric="seconds_per_call", value=sec, unit="s",
                                     items_per_call=256, repeat=rep, loops=10))
    return rows


def memory_rows(rng):
    """A prefetch x hugepages grid: prefetch halves the time at 2^20, huge pages change nothing."""
    rows = []
    for prefetch in (False, True):
        for huge in (False, True):
            params = {"K": 16, "dtype": "float32", "prefetch": prefetch, "hugepages": huge}
            for rep in range(4):
                sec = 256e-7 * (0.5 if prefetch else 1.0) * (1 + 0.01 * rep)
                rows.append(_row("", "micro", variant="kary-aligned", structure="kary-aligned", policy="none", K=16,
                                 dtype="float32", params=params, capacity=2**20, batch=256, threads=1,
                                 transitions="cartpole", op="sample", metric="seconds_per_call", value=sec, unit="s",
                                 items_per_call=256, repeat=rep, loops=10))
    return rows


def cache_rows():
    rows = []
    for variant in ("binary", "kary-aligned"):
        for cap in (65536, 1048576):
            for op in ("sample", "update"):
                for level, misses in (("L1d", 900.0), ("LL", 200.0)):
                    common = dict(variant=variant, structure=variant, capacity=cap, batch=256, op=op,
                                  metric="misses_per_op", unit="misses", items_per_call=256, level=level,
                                  stream="tree", transitions="cartpole")
                    value = misses * (2 if variant == "binary" else 1) * (cap / 65536) ** 0.25
                    rows.append(_row("", "cache", method="model", value=value, cache_config="synthetic", **common))
                    if cap == 1048576:
                        rows.append(_row("", "cache", method="perf", status="unsupported",
                                         error="perf stat: <not supported> (no hardware counters)", **common))
    return rows


POLICIES = ("global-lock", "pal-locks", "lazy-writing")


def concurrency_rows(rng):
    rows = []
    for policy_i, policy in enumerate(POLICIES):
        for transitions, size in (("cartpole", 1.0), ("atari", 0.05)):
            for actors, learners in ((1, 1), (2, 1), (2, 2), (4, 2)):
                for rep in range(3):
                    common = dict(variant="kary-aligned", structure="kary-aligned", K=16, policy=policy,
                                  capacity=65536, batch=256, transitions=transitions, actors=actors, learners=learners,
                                  threads=actors + learners, mode="threads", repeat=rep,
                                  params={"oversubscribed": actors + learners > 2})
                    for op in ("insert", "sample", "update"):
                        rate = 1e6 * size * (1 + policy_i) * (actors if op == "insert" else learners) ** 0.5
                        rows.append(_row("", "concurrency", op=op, metric="items_per_s", unit="items/s",
                                         value=rate * (1 + 0.05 * rng.standard_normal()), **common))
                        rows.append(_row("", "concurrency", op=op, metric="lock_wait_fraction", unit="1",
                                         value=max(0.0, 0.3 / (1 + policy_i) + 0.02 * rng.standard_normal()),
                                         **common))
    return rows


#: The scaling model that made the rows of the synthetic concurrency-model run (serial bound binding at 2 learners).
MODEL_COSTS = dict(insert_s=100e-6, iteration_s=400e-6, insert_hold_s=10e-6, iteration_hold_s=40e-6,
                   serial_fraction=0.6, write_batch=64, sample_batch=256, samples_per_insert=8.0)


def concurrency_model_rows():
    """Rows of the redesigned scenario whose rates are exactly the model's predictions."""
    from replaybench.bench import derive

    costs = derive.Costs(**MODEL_COSTS)
    rows = []
    for actors, learners in ((1, 0), (0, 1), (0, 2), (1, 1), (1, 2), (2, 1)):
        p = derive.predict(costs, actors, learners, 2)
        common = dict(variant="kary-aligned", structure="kary-aligned", K=16, policy="lazy-writing", capacity=65536,
                      batch=256, transitions="cartpole", actors=actors, learners=learners, threads=actors + learners,
                      mode="processes", repeat=0,
                      params={"oversubscribed": actors + learners > 2, "write_batch": 64, "cores": 2,
                              **({"samples_per_insert": 8.0} if actors and learners else {})})
        rates = {"insert": p.insert_per_s, "sample": p.sample_per_s, "update": p.sample_per_s}
        for op, rate in rates.items():
            if rate:
                rows.append(_row("", "concurrency", op=op, metric="items_per_s", unit="items/s", value=rate, **common))
        for kind, hold, present in (("insert", 10e-6, actors), ("iteration", 40e-6, learners)):
            if present:
                rows.append(_row("", "concurrency", op=kind, metric="lock_hold_s_per_call", unit="s", value=hold,
                                 **common))
        rows.append(_row("", "concurrency", op="all", metric="lock_wait_fraction", unit="1", value=0.1, **common))
    return rows


ROLE_SHARES = {"sequential": {"env_step": 0.4, "inference": 0.1, "replay": 0.15, "sgd": 0.25, "other": 0.1},
               "actor": {"env_step": 0.4, "inference": 0.1, "wait": 0.05, "other": 0.02},
               "learner": {"replay": 0.15, "sgd": 0.25, "wait": 0.1, "other": 0.03}}


def pong_rows(scenario):
    """Pong return curves (algo a2c, ALE/Pong-v5, 3 seeds): our PAAC's (scenario "training", as
    bench/train.py writes them) or Stable-Baselines3's A2C (scenario "frameworks", as
    bench/scenarios/frameworks.py writes them)."""
    if scenario == "training":
        common = dict(variant="kary-aligned", structure="kary-aligned", K=16, policy="none", actors=0, learners=0,
                      mode="processes", params={"baseline": True})
    else:
        common = dict(variant="own", structure="none", policy="none", params={"framework": "sb3"})
    return [_row("", scenario, op="episode", metric="return", value=-21.0 + 0.2 * episode + 0.5 * seed,
                 unit="return", env_steps=900 * (episode + 1), wall_s=1.5 * (episode + 1), repeat=episode,
                 algo="a2c", env="ALE/Pong-v5", seed=seed, **common) for seed in range(3) for episode in range(30)]


def training_rows(rng, updates_per_step=None):
    """As bench/train_command.py writes them: the baseline has policy "none" and actors = learners = 0;
    profiles come one row per role and component. ``updates_per_step`` goes to params (it makes
    a task of its own)."""
    ratio = {} if updates_per_step is None else {"updates_per_step": updates_per_step}
    rows = []
    configs = [(0, 0), (1, 1), (2, 1), (4, 1), (2, 2)]
    for actors, learners in configs:
        base = actors == 0
        rate = 1000.0 * (1 if base else actors ** 0.8)
        for seed in range(3):
            common = dict(variant="kary-aligned", structure="kary-aligned", K=16,
                          policy="none" if base else "pal-locks", algo="dqn", env="CartPole-v1", actors=actors,
                          learners=learners, mode="processes", seed=seed,
                          params={**ratio, "baseline": True} if base else ratio)
            steps = 0
            for episode in range(40):
                steps += int(50 + 10 * episode)
                ret = 500 * (1 - math.exp(-steps / 6000)) + 20 * rng.standard_normal()
                rows.append(_row("", "training", op="episode", metric="return", value=ret, unit="return",
                                 env_steps=steps, wall_s=steps / rate, repeat=episode, **common))
            reached = not (actors == 4 and seed == 2)
            summary = {"env_steps_per_s": rate, "updates_per_s": rate / 4, "sample_latency_s": 1e-4,
                       "speedup": 1.0 if base else rate / 1000.0 * (1 + 0.05 * seed)}
            for metric, value in summary.items():
                rows.append(_row("", "training", op="summary", metric=metric, value=value, unit="1", **common))
            if reached:
                rows.append(_row("", "training", op="summary", metric="time_to_threshold_s", unit="s",
                                 value=8000 / rate * (1 + 0.1 * seed), **common))
            else:
                rows.append(_row("", "training", op="summary", metric="time_to_threshold_s", unit="s",
                                 status="skipped", error="threshold not reached in 9000 steps", **common))
            for role in (["sequential"] if base else ["actor", "learner"]):
                for comp, share in ROLE_SHARES[role].items():
                    rows.append(_row("", "training", op="profile", metric=comp, unit="s",
                                     value=share * 8000 / rate * (1 + 0.02 * seed),
                                     **{**common, "params": {**common["params"], "role": role}}))
    return rows


def gossip_rows():
    """As bench/scenarios/gossip.py writes them (its own result_rows of made-up results): gossip,
    all-reduce and independent at 2 and 4 learners, 3 seeds, and a 2x straggler at 4."""
    from replaybench.bench.scenarios.gossip import _columns, result_rows
    from replaybench.impl.rl.gossip.learner import GossipConfig, GossipResult

    rows = []
    for scheme, n, slow, seed in [(s, n, 1.0, seed) for s in ("gossip", "allreduce", "independent")
                                  for n in (2, 4) for seed in range(3)] + [
                                     (s, 4, 2.0, seed) for s in ("gossip", "allreduce") for seed in range(3)]:
        cfg = GossipConfig(scheme=scheme, nodes=n, learners_per_node=1, seed=seed, straggler_slowdown=slow)
        rate = 1000.0 * n / (slow if scheme == "allreduce" else 1.0)
        result = GossipResult(env_steps=20000, wall_s=20000 / rate, env_steps_per_s=rate,
                              time_to_threshold_s=None if scheme == "independent" else 10.0 + seed,
                              steps_to_threshold=None if scheme == "independent" else 9000,
                              consensus=[(float(k), (0.5 if scheme != "allreduce" else 0.0) / (k + 1))
                                         for k in range(5)],
                              final_consensus=0.0, bytes_sent=0 if scheme == "independent" else 300 * 20000,
                              wait_s=[0.1] * n, episodes=[[0.5 * i, 100 * i, 20.0 * i, 0] for i in range(30)],
                              learners=[{"rank": r, "host": f"127.0.0.{2 + r}", "env_steps": 20000 // n,
                                         "updates": 100, "end_s": 20000 / rate, "wait_s": 0.1, "bytes_sent": 0,
                                         "gossip": {"max_behind": 2} if scheme == "gossip" else None,
                                         "shared_memory": []} for r in range(n)])
        columns = {**_columns(scheme, cfg), "op": "summary", "metric": "env_steps_per_s", "unit": "steps/s"}
        rows += [_row("", **r) for r in result_rows(result, columns, scheme)]
    return rows


def frameworks_rows():
    """Two frameworks with their own buffer and ours, two seeds, as bench/scenarios/frameworks.py
    writes them (its own row maker)."""
    from replaybench.bench.scenarios.frameworks import RunResult, result_rows

    rows = []
    for fw in ("sb3", "tianshou"):
        for seed in (0, 1):
            for variant, cost in (("own", 0.004), ("kary-aligned", 0.003)):
                columns = {"variant": variant, "structure": variant, "policy": "none", "algo": "dqn",
                           "env": "CartPole-v1", "seed": seed, "params": {"framework": fw}}
                episodes = [(100 * i, cost * 100 * i, 500.0 * (1 - math.exp(-i / 10))) for i in range(1, 60)]
                result = RunResult(cost * 6000, 6000, {"replay_sample": 0.3 * cost * 6000}, episodes)
                rows += [_row("", "frameworks", **r) for r in
                         result_rows(result, columns, 475, 20, 0.004 if variant != "own" else None)]
    return rows


def paac_rows():
    """The PAAC scenario's rows as the committed reference run holds them (stepping windows,
    profiles, training summaries and episodes): the paac figures draw from no simpler shape."""
    return [{k: v for k, v in r.items() if k != "run_id"} for r in results.read_rows(REPO / "results" / "reference-paac")]


def gpu_rows(run_id: str, ops=None):
    """A stored run of the 16-core + H200 machine (its ops ``ops``, or every row) as the gpu
    figure reads it: the training summaries of training-gpu-quick, gpu-tree-quick's samples."""
    return [{k: v for k, v in r.items() if k != "run_id"} for r in results.read_rows(REPO / "results" / run_id)
            if ops is None or r["op"] in ops]


def lf_rows(rng):
    """The LF scenario's cells: lock-step, parallel Q-learning and multi-agent, Ray beside the others."""
    rows = []
    common = dict(structure="lf", policy="none")
    for backend, rate in {"ray": 1e3, "dataflow": 1e5, "sync": 9e4, "async": 1e4, "mp-queues": 8e3}.items():
        for rep in range(3):
            rows.append(_row("", "lf", backend=backend, variant=None, op="lockstep", env="CartPole-v1", actors=15, repeat=rep,
                             metric="env_steps_per_s", unit="steps/s", value=rate * (1 + 0.02 * rng.random()),
                             **common))
    for backend, seconds in {"ray": 60.0, "dataflow": 20.0}.items():
        rows.append(_row("", "lf", backend=backend, variant=None, op="pql", env="Blackjack-v1", actors=16, batch=500, repeat=0,
                         metric="time_s", unit="s", value=seconds, **{**common, "policy": "deque"}))
    for backend, rate in {"ray": 200.0, "dataflow": 900.0, "serial": 700.0}.items():
        rows.append(_row("", "lf", backend=backend, variant=None, op="multiagent", env="simple_spread", actors=10, repeat=0,
                         metric="steps_per_s", unit="steps/s", value=rate, **common))
    return rows


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """Runs of a made-up machine (one per scenario); returns the results folder."""
    root = tmp_path_factory.mktemp("results")
    rng = np.random.default_rng(7)
    write_run(root, "20300101T000000Z-micro", "micro", "micro", micro_rows(rng))
    write_run(root, "20300101T000100Z-sweep-k", "sweep-k", "micro", sweep_rows(rng), grid={"K": [2, 3, 4, 16]})
    write_run(root, "20300101T000150Z-sweep-memory", "sweep-memory", "micro", memory_rows(rng),
              grid={"prefetch": [False, True], "hugepages": [False, True]})
    write_run(root, "20300101T000200Z-cache", "cache", "cache", cache_rows())
    write_run(root, "20300101T000300Z-concurrency", "concurrency", "concurrency", concurrency_rows(rng))
    write_run(root, "20300101T000350Z-concurrency-model", "concurrency-model", "concurrency", concurrency_model_rows())
    write_run(root, "20300101T000400Z-training", "training", "training", training_rows(rng))
    write_run(root, "20300101T000500Z-gossip", "gossip", "gossip", gossip_rows())
    write_run(root, "20300101T000600Z-frameworks", "frameworks", "frameworks", frameworks_rows())
    write_run(root, "20300101T000700Z-paac", "paac", "paac", paac_rows())
    write_run(root, "20300101T000800Z-lf", "lf", "lf", lf_rows(rng))
    write_run(root, "20300101T000900Z-training-pong", "training-pong", "training", pong_rows("training"))
    write_run(root, "20300101T001000Z-frameworks-a2c-pong", "frameworks-a2c-pong", "frameworks",
              pong_rows("frameworks"))
    write_run(root, "20300101T001100Z-training-gpu-quick", "training-gpu-quick", "training",
              gpu_rows(GPU_TRAINING_RUN, ops={"summary"}))
    write_run(root, "20300101T001200Z-gpu-tree-quick", "gpu-tree-quick", "gpu", gpu_rows(GPU_TREE_RUN))
    write_run(root, "20300101T001300Z-learning", "learning", "learning", learning_rows())
    return root


def learning_rows():
    """Time to threshold of a sequential loop and 1 actor + 1 learner, 3 seeds each (seed 2 of
    the sequential loop censored), and a peer's trainer."""
    rows = []
    for config, actors, backend, times in (("sequential", 0, "replaybench", (4.0, 5.0, None)),
                                           ("1+1", 1, "replaybench", (3.0, 4.0, 6.0)),
                                           ("sb3", 0, "sb3", (30.0, 40.0, 35.0))):
        for seed, t in enumerate(times):
            base = dict(variant="kary-aligned", algo="dqn", env="CartPole-v1", seed=seed, backend=backend,
                        actors=actors, learners=actors, batch=64, op="learning",
                        params={"config": config, "threshold": 475.0, "updates_per_step": 0.5, "batch_size": 64})
            if t is None:
                rows.append(_row("", "learning", **base, metric="censored_at_s", value=60.0, unit="s"))
            else:
                rows += [_row("", "learning", **base, metric="time_to_threshold_s", value=t, unit="s"),
                         _row("", "learning", **base, metric="env_steps_to_threshold", value=1000 * t, unit="steps"),
                         _row("", "learning", **base, metric="updates_to_threshold", value=500 * t, unit="updates")]
            rows.append(_row("", "learning", **base, metric="final_holds", value=1.0, unit="bool"))
    return rows


GPU_TRAINING_RUN, GPU_TREE_RUN = "device-training-gpu-quick-090911", "device-gpu-tree-quick-091610"


@pytest.fixture(scope="module")
def drawn(synthetic, tmp_path_factory):
    """Every figure drawn from the synthetic runs: (Results, Outcome, output folder)."""
    out = tmp_path_factory.mktemp("figures")
    res = load.load_runs(load.find_runs(synthetic))
    outcome = render.render(res, out, echo=lambda *_: None)
    return res, outcome, out


def raw_rows(run_dir):
    """rows.csv read with the csv module only (independent of analysis/)."""
    with open(Path(run_dir) / "rows.csv", newline="") as fh:
        return list(csv.DictReader(fh))


# ---------------------------------------------------------------------------------------------
# figures


def test_every_figure_is_drawn_as_png_svg_and_csv(drawn):
    res, outcome, out = drawn
    assert not outcome.failed, outcome.failed
    assert not outcome.skipped, outcome.skipped
    names = {m.NAME for m in modules()}
    assert set(outcome.written) == names
    for name in names:
        png, svg, data = (out / f"{name}{ext}" for ext in (".png", ".svg", ".csv"))
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000, name
        assert "<svg" in svg.read_text()[:2000], name
        assert len(pd.read_csv(data)) > 0, name


def test_gpu_figure_draws_each_cell_of_the_newest_cuda_runs_as_measured(drawn):
    """The gpu figure: the learner bars are the training run's process cells' updates/s (one per
    device and way of running the CUDA learner), the tree bars the medians of each contestant's
    seconds per call in microseconds, each panel from one run."""
    res, outcome, out = drawn
    data = pd.read_csv(out / "gpu.csv")
    assert set(data["panel"]) == {"learner", "steps", "tree"}
    assert data.groupby("panel")["run_id"].nunique().eq(1).all()
    rows = gpu_rows(GPU_TRAINING_RUN, ops={"summary"})
    want = sorted(r["value"] for r in rows if r["metric"] == "updates_per_s" and r["engine"] == "process"
                  and r["status"] == "ok")
    learner = data[data["panel"] == "learner"]
    assert sorted(learner["median"]) == pytest.approx(want)
    assert any(lab.endswith("cuda eager") for lab in learner["label"])
    assert any(lab.endswith("cuda graph prefetch") for lab in learner["label"])
    tree = data[data["panel"] == "tree"]
    by_contestant = defaultdict(list)
    for r in gpu_rows(GPU_TREE_RUN):
        if r["metric"] == "seconds_per_call" and r["status"] == "ok":
            p = contract.params_of(r["params"])
            # a torch-kary CUDA cell samples eagerly unless its params say cuda_graph true
            eager = r["variant"] == "torch-kary" and p["device"] == "cuda" and p.get("cuda_graph") is not True
            by_contestant[(r["variant"], p["device"], " eager" if eager else "",
                           p.get("batch_to", p["device"]))].append(r["value"] * 1e6)
    assert len(tree) == len(by_contestant)
    assert any(lab.endswith("cuda tree eager, batch on cuda)") for lab in tree["label"])  # a run of before the graph
    for (variant, device, how, batch_to), values in by_contestant.items():
        got = tree[tree["label"] == f"{variant} ({device} tree{how}, batch on {batch_to})"]
        assert float(got["median"].iloc[0]) == pytest.approx(statistics.median(values))


def test_capacity_csv_medians_equal_medians_of_the_rows(drawn, synthetic):
    _, _, out = drawn
    expect = defaultdict(list)
    for r in raw_rows(synthetic / "20300101T000000Z-micro"):
        if r["status"] == "ok" and r["op"] != "empty":
            expect[r["variant"], r["op"], int(r["capacity"])].append(1e9 * float(r["value"]) / int(r["items_per_call"]))
    got = pd.read_csv(out / "capacity.csv")
    assert len(got) == len(expect)
    for _, g in got.iterrows():
        values = expect[g["variant"], g["op"], g["capacity"]]
        assert g["median"] == pytest.approx(statistics.median(values), rel=1e-12)
        assert (g["min"], g["max"], g["n"]) == (pytest.approx(min(values)), pytest.approx(max(values)), len(values))


def test_k_sweep_csv_medians_equal_throughput_medians_of_the_rows(drawn, synthetic):
    _, _, out = drawn
    expect = defaultdict(list)
    for r in raw_rows(synthetic / "20300101T000100Z-sweep-k"):
        if r["status"] == "ok":
            expect[r["variant"], r["op"], int(r["K"])].append(int(r["items_per_call"]) / float(r["value"]))
    got = pd.read_csv(out / "k_sweep.csv")
    assert sorted(zip(got["variant"], got["op"], got["K"])) == sorted(expect)
    for _, g in got.iterrows():
        assert g["median"] == pytest.approx(statistics.median(expect[g["variant"], g["op"], g["K"]]), rel=1e-12)
    assert 3 not in set(got.loc[got["variant"] == "kary-aligned", "K"])  # skipped, not drawn


def test_grid_effects_are_ratios_to_the_default_setting_in_the_same_run(drawn):
    _, _, out = drawn
    got = pd.read_csv(out / "grid_effects.csv").set_index("setting")
    assert set(got["suite"]) == {"sweep-memory"}  # the K sweep's K is not a speed parameter of this figure
    assert got.loc["prefetch=False hugepages=False", "x_default"] == pytest.approx(1.0)
    assert got.loc["prefetch=True hugepages=False", "x_default"] == pytest.approx(2.0)
    assert got.loc["prefetch=False hugepages=True", "x_default"] == pytest.approx(1.0)
    median = (1e7 / 1.01 + 1e7 / 1.02) / 2  # throughputs of 256 items in 256e-7 s x 1, 1.01, 1.02, 1.03
    assert got.loc["prefetch=False hugepages=False", "median"] == pytest.approx(median, rel=1e-9)
    assert got.loc["prefetch=True hugepages=True", "x_lo"] == pytest.approx(1 / (0.5 * 1.03), rel=1e-9)


def test_concurrency_draws_rates_against_workers_one_run_per_line_with_the_ideal(drawn, synthetic):
    """The scaling figure: the sample rate (insert for actors alone, never a sum) of the
    learners-alone, actors-alone and half-and-half splits, one run per line, and the ideal line
    through each line's first point; other splits are not drawn."""
    _, _, out = drawn
    per_repeat = defaultdict(list)
    for r in raw_rows(synthetic / "20300101T000300Z-concurrency"):
        if r["metric"] == "items_per_s" and r["op"] == "sample":
            per_repeat[r["policy"], r["transitions"], int(r["actors"]), int(r["learners"])].append(float(r["value"]))
    got = pd.read_csv(out / "concurrency.csv")
    assert got.groupby(["mode", "panel", "policy", "variant", "transitions"])["run_id"].nunique().max() == 1
    mine = got[got["run_id"] == "20300101T000300Z-concurrency"]  # (the concurrency-model run is drawn too)
    # of the splits 1A+1L, 2A+1L, 2A+2L, 4A+2L only half and half, at most the machine's 2 cores: 1A+1L
    assert {(a, l_) for a, l_ in zip(mine["actors"], mine["learners"])} == {(1, 1)}
    assert set(mine["panel"]) == {"mixed"}
    assert len(mine) == len([k for k in per_repeat if k[2:] == (1, 1)])
    for _, g in mine.iterrows():
        key = (g["policy"], g["transitions"], g["actors"], g["learners"])
        assert g["median"] == pytest.approx(statistics.median(per_repeat[key]), rel=1e-12)
        assert g["workers"] == 2 and not g["oversubscribed"]
        assert g["ideal"] == pytest.approx(g["median"], rel=1e-12)  # the line's first point (n0 = 2)
    model = got[got["run_id"] == "20300101T000350Z-concurrency-model"]
    panels = {(p, a, l_) for p, a, l_ in zip(model["panel"], model["actors"], model["learners"])}
    assert panels == {("actors", 1, 0), ("learners", 0, 1), ("learners", 0, 2), ("mixed", 1, 1)}  # not 1A+2L: 3 > 2
    learners = model[model["panel"] == "learners"].set_index("learners")
    assert learners.loc[2, "ideal"] == pytest.approx(2 * learners.loc[1, "median"], rel=1e-12)


def test_scaling_figure_recovers_the_model_that_made_the_rows(drawn):
    """The rows of the concurrency-model run are the model's own predictions: fitted from its
    lone cells, the model predicts every other cell exactly, and the figure draws them all."""
    _, _, out = drawn
    got = pd.read_csv(out / "scaling.csv")
    assert set(got["run_id"]) == {"20300101T000350Z-concurrency-model"}
    assert {(a, l_) for a, l_ in zip(got["actors"], got["learners"])} == {(1, 0), (0, 1), (0, 2), (1, 1), (1, 2),
                                                                          (2, 1)}
    assert np.allclose(got["predicted"], got["measured"], rtol=1e-9)
    assert set(got.loc[got["input"], "actors"].astype(str) + got.loc[got["input"], "learners"].astype(str)) == {
        "10", "01", "02"}


def test_cache_figure_keeps_unsupported_cells_as_unsupported(drawn):
    _, _, out = drawn
    got = pd.read_csv(out / "cache_misses.csv")
    perf = got[got["method"] == "perf"]
    assert len(perf) > 0 and set(perf["status"]) == {"unsupported"}
    assert perf["misses_per_transition"].isna().all()  # never zero
    model = got[(got["method"] == "model") & (got["variant"] == "binary") & (got["op"] == "sample")
                & (got["level"] == "L1d") & (got["capacity"] == 65536)]
    assert model["misses_per_transition"].iloc[0] == pytest.approx(1800 / 256)


def test_training_figures_count_unreached_thresholds(drawn):
    _, _, out = drawn
    got = pd.read_csv(out / "training_scaling.csv")
    ttt = got[(got["metric"] == "time_to_threshold_s") & (got["actors"] == 4)]
    assert list(ttt["n_reached"]) == [2] and list(ttt["n_seeds"]) == [3]
    base = got[(got["metric"] == "speedup") & got["baseline"]]
    assert base["median"].iloc[0] == pytest.approx(1.0)
    breakdown = pd.read_csv(out / "training_breakdown.csv")
    shares = breakdown.groupby(["actors", "learners"])["share"].sum()
    assert np.allclose(shares, 1.0)
    # the roles' rows are added up per seed: wait = actor wait + learner wait, median over seeds
    wait = breakdown[(breakdown["actors"] == 2) & (breakdown["learners"] == 1) & (breakdown["component"] == "wait")]
    rate = 1000.0 * 2 ** 0.8
    expect = statistics.median((0.05 + 0.1) * 8000 / rate * (1 + 0.02 * seed) for seed in range(3))
    assert wait["median"].iloc[0] == pytest.approx(expect)
    curves = pd.read_csv(out / "training_curves.csv")
    assert set(curves["x_axis"]) == {"env_steps", "wall_s"} and (curves["n_seeds"] == 3).all()


def test_peer_ratios_are_ratios_of_medians_in_the_same_run(drawn, synthetic):
    _, _, out = drawn
    tput = defaultdict(list)
    for r in raw_rows(synthetic / "20300101T000000Z-micro"):
        if r["status"] == "ok" and r["op"] == "sample" and r["capacity"] == "65536":
            tput[r["variant"]].append(int(r["items_per_call"]) / float(r["value"]))
    got = pd.read_csv(out / "peers.csv")
    g = got[(got["variant"] == "kary-aligned") & (got["op"] == "sample") & (got["capacity"] == 65536)].iloc[0]
    assert g["peer"] == "peer:cpprb"
    assert g["ratio"] == pytest.approx(statistics.median(tput["kary-aligned"]) / statistics.median(tput["peer:cpprb"]))
    assert g["ratio_low"] == pytest.approx(min(tput["kary-aligned"]) / max(tput["peer:cpprb"]))


def test_a_figure_without_rows_is_skipped_with_a_reason(synthetic, tmp_path):
    res = load.load_runs([synthetic / "20300101T000200Z-cache"])
    (tmp_path / "k_sweep.png").write_bytes(b"stale")
    lines = []
    outcome = render.render(res, tmp_path, echo=lines.append)
    assert set(outcome.written) == {"cache_misses"} and not outcome.failed
    assert "k_sweep" in outcome.skipped and any(line.startswith("skipped k_sweep: ") for line in lines)
    assert not (tmp_path / "k_sweep.png").exists()  # a stale figure is not left behind


# ---------------------------------------------------------------------------------------------
# loading and checking


def _copy(synthetic, tmp_path, *names):
    for name in names:
        shutil.copytree(synthetic / name, tmp_path / name)
    return tmp_path


def _edit_line(path, number, edit):
    lines = path.read_text().splitlines(keepends=True)
    lines[number - 1] = edit(lines[number - 1])
    path.write_text("".join(lines))


@pytest.mark.parametrize("damage, message", [
    (lambda p: _edit_line(p, 5, lambda s: ",".join(s.split(",")[:7]) + "\n"), "line 5: 7 fields where the header has"),
    (lambda p: p.write_text(p.read_text()[: len(p.read_text()) - 200]), "fields where the header has"),
    (lambda p: _edit_line(p, 3, lambda s: s.replace("seconds_per_call,", "seconds_per_call,abc", 1)),
     "line 3: column 'value': cannot parse"),
    (lambda p: p.write_text("".join(p.read_text().splitlines(keepends=True)[1:])), "line 1: not a rows.csv header"),
    (lambda p: _edit_line(p, 4, lambda s: "9" + s[1:]), "line 4: schema_version 9 is newer than this reader"),
])
def test_a_broken_rows_csv_names_file_and_line(synthetic, tmp_path, damage, message):
    root = _copy(synthetic, tmp_path, "20300101T000000Z-micro", "20300101T000200Z-cache")
    broken = root / "20300101T000000Z-micro" / "rows.csv"
    damage(broken)
    res = load.load_runs(load.find_runs(root))
    assert len(res.problems) == 1 and message in str(res.problems[0])
    assert str(res.problems[0]).startswith(f"{broken}, line ")
    assert list(res.metas) == ["20300101T000200Z-cache"]  # the intact run still loads


def test_the_other_runs_still_plot_beside_a_broken_one(synthetic, tmp_path, capsys):
    root = _copy(synthetic, tmp_path / "results", "20300101T000000Z-micro", "20300101T000200Z-cache")
    broken = root / "20300101T000000Z-micro" / "rows.csv"
    _edit_line(broken, 5, lambda s: ",".join(s.split(",")[:7]) + "\n")
    runs = [str(p) for p in load.find_runs(root)]
    status = main(["plots", "--runs", *runs, "--out", str(tmp_path / "figs"), "--only", "cache_misses", "capacity"])
    out = capsys.readouterr()
    assert status == 0
    assert f"warning: run left out: {broken}, line 5: 7 fields where the header has {len(contract.COLUMNS)}" in out.err
    assert "skipped capacity: " in out.out  # the micro run was the only source of timings
    (drawn,) = (tmp_path / "figs").glob("*/cache_misses.png")  # each host draws into a folder of its own
    assert drawn.stat().st_size > 0
    # --strict: the same, but a broken run makes the exit status 1
    assert main(["plots", "--strict", "--runs", *runs, "--out", str(tmp_path / "f2"), "--only", "cache_misses"]) == 1


def test_truncated_last_line_is_reported_with_its_number(synthetic, tmp_path):
    root = _copy(synthetic, tmp_path, "20300101T000000Z-micro")
    path = root / "20300101T000000Z-micro" / "rows.csv"
    text = path.read_text()
    n_lines = text.count("\n")
    path.write_text(text[:-40])  # a write cut short in the middle of the last row
    with pytest.raises(load.RunError, match=rf"rows.csv, line {n_lines}: \d+ fields where the header has {len(contract.COLUMNS)}"):
        load.load_run(path.parent)


def test_broken_or_missing_meta_json_is_reported(synthetic, tmp_path):
    root = _copy(synthetic, tmp_path, "20300101T000000Z-micro", "20300101T000200Z-cache")
    (root / "20300101T000000Z-micro" / "meta.json").write_text('{"run_id": "x",\n  oops}')
    (root / "20300101T000200Z-cache" / "meta.json").unlink()
    problems = [str(p) for p in load.load_runs(load.find_runs(root)).problems]
    assert "meta.json, line 2: not valid JSON" in problems[0]
    assert "meta.json: missing" in problems[1]
    assert main(["plots", "--runs", str(root / "20300101T000200Z-cache"), "--out", str(tmp_path / "f")]) == 1


def test_older_and_newer_columns(tmp_path):
    """A run written before the concurrency columns existed loads with them empty; unknown columns are ignored."""
    run = tmp_path / "r1"
    run.mkdir()
    (run / "meta.json").write_text(json.dumps({"run_id": "r1", "schema_version": 1, "suite": {"name": "micro"}}))
    old = [c for c in results.COLUMNS if c not in ("actors", "learners", "wall_s")] + ["future_column"]
    row = {c: "" for c in old}
    row.update(schema_version="1", run_id="r1", scenario="micro", variant="binary", op="sample", capacity="1024",
               metric="seconds_per_call", value="1e-5", items_per_call="256", status="ok", future_column="zzz")
    with open(run / "rows.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, old)
        w.writeheader()
        w.writerow(row)
    res = load.load_runs([run])
    assert not res.problems
    assert "future_column" not in res.table.columns
    assert res.table["actors"].isna().all() and res.table["wall_s"].isna().all()
    assert res.table["capacity"].iloc[0] == 1024 and res.table["suite"].iloc[0] == "micro"


def test_newer_meta_schema_is_refused(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / "meta.json").write_text(json.dumps({"schema_version": results.SCHEMA_VERSION + 1}))
    (run / "rows.csv").write_text(",".join(results.COLUMNS) + "\n")
    with pytest.raises(load.RunError, match="newer than this reader knows"):
        load.load_run(run)


def test_latest_run_wins_per_cell(synthetic, tmp_path):
    root = _copy(synthetic, tmp_path, "20300101T000000Z-micro")
    rows = micro_rows(np.random.default_rng(1))
    write_run(tmp_path, "20300102T000000Z-micro", "micro", "micro", rows, scale=2.0)
    res = load.load_runs(load.find_runs(root))
    kept = load.latest_per_cell(res.table)
    assert set(kept["run_id"]) == {"20300102T000000Z-micro"} and len(kept) == len(rows)


def test_a_newer_run_of_another_suite_replaces_cache_and_training_cells(synthetic, tmp_path):
    root = _copy(synthetic, tmp_path / "r", "20300101T000200Z-cache", "20300101T000400Z-training")
    write_run(root, "20300109T000000Z-cache-small", "cache-small", "cache", cache_rows(), scale=2.0)
    write_run(root, "20300109T000000Z-training-quick", "training-quick", "training",
              training_rows(np.random.default_rng(0)), scale=2.0)
    res = load.load_runs(load.find_runs(root))
    outcome = render.render(res, tmp_path / "f", echo=lambda *_: None,
                            only={"cache_misses", "training_scaling", "training_breakdown"})
    cache = outcome.data["cache_misses"]
    assert len(cache) == len(cache_rows()) and set(cache["run_id"]) == {"20300109T000000Z-cache-small"}
    most = cache.loc[cache["method"] == "model", "misses_per_transition"].max()
    assert most == pytest.approx(2 * 1800 / 256 * 16 ** 0.25)
    scaling = outcome.data["training_scaling"]
    assert set(scaling["run_id"]) == {"20300109T000000Z-training-quick"}
    assert (scaling["n_seeds"] == 3).all()  # the newer run's seeds, not both runs' seeds together
    assert np.allclose(outcome.data["training_breakdown"].groupby(["actors", "learners"])["share"].sum(), 1.0)


def test_paper_and_targets_from_meta_else_the_suite_file_else_said_to_be_missing(tmp_path):
    """What the figures and the report compare with is the run's recorded data (meta.json), for a
    run stored before meta.json held it the shipped suite file of its name, else nothing, said."""

    from replaybench.analysis import references
    from replaybench.analysis.plots import frameworks, gossip_scaling, lf

    def drawn(name, suite, scenario, rows, extra=None):
        write_run(tmp_path / name, f"20300101T000000Z-{name}", suite, scenario, rows, extra=extra)
        res = load.load_runs(load.find_runs(tmp_path / name))
        return res, getattr(sys_modules[scenario], "build")(res.table, res.metas)

    sys_modules = {"frameworks": frameworks, "lf": lf, "gossip": gossip_scaling}
    res, plot = drawn("own", "frameworks", "frameworks", frameworks_rows(),
                      {"paper": {"pal_speedup": {"low": 1.5, "high": 3.0}}})
    assert "PAL reports 1.5-3.0x" in plot.caption
    assert "(PAL: 1.5-3.0x)" in "\n".join(frameworks.report_section(plot.data, res, {"frameworks": plot.data}))
    res, plot = drawn("stored", "frameworks", "frameworks", frameworks_rows())  # frameworks.json's figures
    assert "PAL reports 1.1-2.1x" in plot.caption
    res, plot = drawn("renamed", "frameworks-renamed", "frameworks", frameworks_rows())
    text = "\n".join(frameworks.report_section(plot.data, res, {"frameworks": plot.data}))
    assert references.NOT_RECORDED in plot.caption and references.NOT_RECORDED in text and "PAL:" not in text

    rng = np.random.default_rng(3)
    res, plot = drawn("lf", "lf", "lf", lf_rows(rng))
    paper = {(e.op, e.backend): e.paper for e in plot.data.itertuples()}
    assert paper["lockstep", "dataflow"] == pytest.approx(3814 / 3277) and pd.isna(paper["lockstep", "ray"])
    res, plot = drawn("lf-renamed", "lf-renamed", "lf", lf_rows(rng))
    assert plot.data["paper"].isna().all() and references.NOT_RECORDED in plot.caption
    assert references.NOT_RECORDED in "\n".join(lf.report_section(plot.data, res, {"lf": plot.data}))

    res, plot = drawn("gossip", "gossip-renamed", "gossip", gossip_rows(),
                      {"targets": {"gossip": {"learners": 2, "straggler_at_least_x_allreduce": 1.5}}})
    text = "\n".join(gossip_scaling.report_section(plot.data, res, {"gossip_scaling": plot.data}))
    assert "2 learners: gossip reaches" in text and "4 learners" not in text
    res, plot = drawn("gossip-none", "gossip-renamed", "gossip", gossip_rows())
    text = "\n".join(gossip_scaling.report_section(plot.data, res, {"gossip_scaling": plot.data}))
    assert references.NOT_RECORDED in text and "learners: gossip reaches" not in text
    with pytest.raises(ValueError, match="kind"):
        references.recorded({}, "goals", "gossip")


def test_cache_sizes_from_meta():
    assert load.cache_sizes({"machine": MACHINE}) == {"L1d": 32 * 1024, "L2": 2**20, "L3": 16 * 2**20}


# ---------------------------------------------------------------------------------------------
# compare, report, palette


def test_compare_marks_spread_and_real_differences(synthetic, tmp_path):
    rng = np.random.default_rng(3)
    a = write_run(tmp_path, "a", "micro", "micro", micro_rows(rng, spread=0.05))
    same = write_run(tmp_path, "b", "micro", "micro", micro_rows(np.random.default_rng(3), spread=0.05), scale=1.001)
    slower = write_run(tmp_path, "c", "micro", "micro", micro_rows(np.random.default_rng(3), spread=0.05), scale=2.0)
    tables = {p.name: load.load_runs([p]).table for p in (a, same, slower)}
    close = compare.compare_tables(tables["a"], tables["b"])
    far = compare.compare_tables(tables["a"], tables["c"])
    assert len(close) == len(far) == 18  # 3 variants x 2 capacities x 3 ops (the empty op is left out)
    assert set(close["verdict"]) == {"not significant"}
    timed = far[far["metric"] == "seconds_per_call"]
    assert set(timed["verdict"]) == {"significant"}
    assert np.allclose(timed["ratio"], 0.5)
    text = compare.compare_runs(a, slower)
    assert "[min, max] ranges" in text.splitlines()[1]
    assert "significant" in text and "0.500" in text


def test_compare_command_gives_the_ratio_of_two_single_value_runs(tmp_path, capsys):
    """Moved from bench's removed `compare`: b 5% slower per call is b/a = 1/1.05 of a's throughput,
    and with one value per side there is no spread to judge the difference by."""
    base = {"schema_version": 1, "scenario": "micro", "op": "sample", "capacity": 1024, "batch": 256,
            "transitions": "cartpole", "metric": "seconds_per_call", "unit": "s", "items_per_call": 256,
            "status": "ok", "variant": "binary", "repeat": 0}
    for run_id, seconds in (("a", 1e-4), ("b", 1.05e-4)):
        writer = results.RunWriter(tmp_path, run_id, {"scenario": "micro"})
        writer.append([{**base, "run_id": run_id, "value": seconds}])
        writer.finish(True)
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    text = capsys.readouterr().out
    line = next(ln for ln in text.splitlines() if ln.startswith("sample"))
    assert line.split()[-2:] == [f"{1 / 1.05:.3f}", "n=1"] and "2.56-2.56" in line  # M transitions/s
    assert "cells: 0 significant, 0 not significant, 1 n=1" in text


def test_compare_cli_names_a_broken_file(synthetic, tmp_path, capsys):
    root = _copy(synthetic, tmp_path, "20300101T000000Z-micro")
    path = root / "20300101T000000Z-micro" / "rows.csv"
    _edit_line(path, 2, lambda s: s.replace(",", ";"))
    assert main(["compare", str(path.parent), str(path.parent)]) == 1
    assert f"{path}, line 2:" in capsys.readouterr().err


def test_report_lists_machine_runs_tables_and_figures(drawn, tmp_path):
    res, outcome, out = drawn
    target = tmp_path / "REPORT.md"
    text = report.build(res, outcome, target)
    assert "Synthetic CPU" in text and "L1d 32 KiB" in text
    for run_id in res.metas:
        assert f"`{run_id}`" in text
    assert "### sample (M transitions/s)" in text and "x best peer" in text and "min-max" in text
    assert "## Speed parameters and threads" in text and "prefetch=True hugepages=False" in text
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert sorted(Path(link).stem for link in links) == sorted(outcome.written)
    for link in links:
        assert not Path(link).is_absolute() and (target.parent / link).resolve().exists(), link


def test_report_says_dirty_unknown_for_a_run_that_recorded_no_git_state(tmp_path):
    """A run made where git was not at hand (meta.json ``dirty: null``, as on the device machine's
    copy of the tree) is listed as ``unknown`` in the runs table, not as a clean ``no``."""
    rows = [r for r in training_rows(np.random.default_rng(0)) if r["op"] == "summary"]
    runs = [write_run(tmp_path, "20300101T000000Z-clean", "training", "training", rows),
            write_run(tmp_path, "20300102T000000Z-dirty", "training", "training", rows, extra={"dirty": True}),
            write_run(tmp_path, "20300103T000000Z-nogit", "training", "training", rows,
                      extra={"dirty": None, "git_sha": None})]
    res = load.load_runs(runs)
    outcome = render.render(res, tmp_path / "figs", echo=lambda *_: None, only={"training_scaling"})
    text = report.build(res, outcome, tmp_path / "REPORT.md")
    lines = {run: next(line for line in text.splitlines() if line.startswith(f"| `{run}` |"))
             for run in ("20300101T000000Z-clean", "20300102T000000Z-dirty", "20300103T000000Z-nogit")}
    assert "| `0000000000` | no |" in lines["20300101T000000Z-clean"]
    assert "| `0000000000` | yes |" in lines["20300102T000000Z-dirty"]
    assert "| `-` | unknown |" in lines["20300103T000000Z-nogit"]


def test_every_report_section_has_the_documented_signature_and_returns_lines(drawn):
    """The contract in analysis.plots: report_section(data, res, drawn) -> list[str], for a
    figure that was not drawn (data None, nothing else drawn) and for the figure as drawn."""
    import inspect

    res, outcome, _ = drawn
    with_section = [m for m in modules() if hasattr(m, "report_section")]
    assert len(with_section) >= 8  # the sections that moved out of report.py
    empty = load.Results(table=res.table.iloc[0:0], metas={}, problems=[])
    for module in with_section:
        assert list(inspect.signature(module.report_section).parameters) == ["data", "res", "drawn"], module.NAME
        for lines in (module.report_section(None, empty, {}),
                      module.report_section(outcome.data.get(module.NAME), res, outcome.data)):
            assert isinstance(lines, list) and all(isinstance(line, str) for line in lines), module.NAME
        assert module.report_section(None, empty, {}) == [], module.NAME  # nothing drawn, nothing said


def test_report_collects_a_new_figure_modules_section_in_report_order(drawn, tmp_path, monkeypatch):
    """A figure module with a report_section is picked up from plots.modules() alone (no edit to
    report.py), handed its own drawn data, and placed by REPORT_ORDER before ORDER."""
    import types

    from replaybench.analysis import plots

    res, outcome, _ = drawn
    fake = types.ModuleType("fake_figure")
    fake.NAME, fake.ORDER, fake.REPORT_ORDER, fake.TITLE = "fake_figure", 99, 11, "A fake figure"
    seen = {}

    def report_section(data, res, drawn):
        seen["data"], seen["drawn"] = data, drawn
        return ["## A fake section", "", f"{len(data)} rows drawn", ""]

    fake.report_section = report_section
    real = plots.modules
    monkeypatch.setattr(plots, "modules", lambda: [*real(), fake])
    drawn_data = {**outcome.data, "fake_figure": pd.DataFrame({"x": [1, 2, 3]})}
    with_fake = types.SimpleNamespace(**{**vars(outcome), "data": drawn_data})
    text = report.build(res, with_fake, tmp_path / "R.md")
    assert "## A fake section\n\n3 rows drawn\n" in text and seen["drawn"] is drawn_data
    # REPORT_ORDER 11: after the fan-out section (k_sweep, ORDER 10), before grid_effects' (ORDER 12)
    assert text.index("## Fan-out K") < text.index("## A fake section") < text.index("## Speed parameters")


def test_report_training_table_shows_every_task_with_its_own_baseline(tmp_path):
    """Two tasks (DQN CartPole at 0.5 and at 1/16 updates per env step, as the reference runs
    hold): the table has both, each with its sequential baseline first, times with k/n seeds."""
    rows = (training_rows(np.random.default_rng(1), updates_per_step=0.5)
            + training_rows(np.random.default_rng(2), updates_per_step=0.0625))
    for r in rows:  # the 1/16 task steps twice as fast and never reaches the threshold in any seed
        if r["params"].get("updates_per_step") == 0.0625 and r["metric"] == "env_steps_per_s":
            r["value"] *= 2
        if r["params"].get("updates_per_step") == 0.0625 and r["metric"] == "time_to_threshold_s":
            r.update(status="skipped", value=None, error="threshold not reached")
    run = write_run(tmp_path, "20300101T000000Z-training", "training", "training", rows)
    res = load.load_runs([run])
    outcome = render.render(res, tmp_path / "f", echo=lambda *_: None, only={"training_scaling"})
    text = report.build(res, outcome, tmp_path / "R.md")
    section = text.split("## Training", 1)[1].split("\n## ", 1)[0]
    table = [[c.strip() for c in line.strip("|").split("|")] for line in section.splitlines()
             if line.startswith("| ") and not line.startswith("| task")]
    tasks = ["dqn on CartPole-v1, 0.0625 updates/step", "dqn on CartPole-v1, 0.5 updates/step"]
    assert sorted({line[0] for line in table}) == tasks
    for task in tasks:
        lines = [line for line in table if line[0] == task]
        assert [line[3] for line in lines] == ["sequential", "1 actor, 1 learner", "2 actors, 1 learner",
                                               "2 actors, 2 learners", "4 actors, 1 learner"]
        assert [line[1] for line in lines] == ["sequential"] + ["process"] * 4
        assert lines[0][5] == "1"  # the baseline's own speedup
    half = {line[3]: line for line in table if line[0] == tasks[1]}
    assert half["4 actors, 1 learner"][4].endswith("(2/3 seeds)")  # seed 2 did not reach it
    assert half["sequential"][4].endswith("(3/3 seeds)")
    sixteenth = [line for line in table if line[0] == tasks[0]]
    assert all(line[4] == "not reached (0/3 seeds)" for line in sixteenth)
    rate = 1000.0 * 2 ** 0.8  # env steps/s of 2 actors: each task's own rows
    assert half["2 actors, 1 learner"][6] == f"{rate:,.0f}" and sixteenth[2][6] == f"{2 * rate:,.0f}"


def test_report_training_table_has_one_line_per_engine(tmp_path):
    """One run that trained the same layout on two engines (process and ray, as the training-ray
    suite does): each engine is its own line with its own numbers, not one line for both."""
    rows = [{**r, "mode": None, "engine": "process" if r["actors"] else "sequential"}  # rows as written today
            for r in training_rows(np.random.default_rng(1), updates_per_step=0.5)]
    ray = [{**r, "engine": "ray", **({"value": r["value"] / 2} if r.get("value") is not None else {})}
           for r in rows if r["engine"] == "process"]
    run = write_run(tmp_path, "20300101T000000Z-training", "training", "training", rows + ray)
    res = load.load_runs([run])
    outcome = render.render(res, tmp_path / "f", echo=lambda *_: None, only={"training_scaling"})
    section = report.build(res, outcome, tmp_path / "R.md").split("## Training", 1)[1].split("\n## ", 1)[0]
    table = [[c.strip() for c in line.strip("|").split("|")] for line in section.splitlines()
             if line.startswith("| ") and not line.startswith("| task")]
    assert [(line[1], line[3]) for line in table] == [("sequential", "sequential")] + [
        (engine, who) for engine in ("process", "ray")
        for who in ("1 actor, 1 learner", "2 actors, 1 learner", "2 actors, 2 learners", "4 actors, 1 learner")]
    rate = {line[1]: line[6] for line in table if line[3] == "2 actors, 1 learner"}
    assert rate == {"process": f"{1000.0 * 2 ** 0.8:,.0f}", "ray": f"{500.0 * 2 ** 0.8:,.0f}"}


def test_training_scaling_draws_one_line_per_engine_and_no_panel_for_baseline_only_tasks(tmp_path):
    """The process and ray engines of one task are two lines (not one zigzag through both), each
    with its own numbers; a task with only a sequential row (PAAC's batched runs) gets no panel,
    though its rows stay in the CSV the report reads."""
    rows = [{**r, "mode": None, "engine": "process" if r["actors"] else "sequential"}
            for r in training_rows(np.random.default_rng(1), updates_per_step=0.5)]
    ray = [{**r, "engine": "ray", **({"value": r["value"] / 2} if r.get("value") is not None else {})}
           for r in rows if r["engine"] == "process"]
    pong = [{**r, "env": "ALE/Pong-v5", "algo": "a2c", "engine": "paac"} for r in rows
            if r["engine"] == "sequential" and r["op"] == "summary"]
    run = write_run(tmp_path, "20300101T000000Z-training", "training", "training", rows + ray + pong)
    res = load.load_runs([run])
    plot = training_scaling.build(res.table, res.metas)
    titles = {ax.get_title() for ax in plot.figure.axes if ax.get_title()}
    assert titles == {"dqn on CartPole-v1\n0.5 updates/step"}  # two lines: long tasks overran the next panel
    rates = next(ax for ax in plot.figure.axes if ax.get_ylabel() == "environment steps/s")
    lines = [ln for ln in rates.get_lines() if len(ln.get_xdata()) > 2]  # the 3-actor-count lines
    by_style = {}
    for ln in lines:
        by_style.setdefault(ln.get_linestyle(), []).append(np.asarray(ln.get_ydata(), float))
    # one style per engine (process solid, ray dashed; dotted is the sequential baseline)
    assert {"-", "--"} <= set(by_style) and "-." not in by_style
    one_learner = np.array([1000.0, 1000.0 * 2 ** 0.8, 1000.0 * 4 ** 0.8])  # actors 1, 2, 4
    assert any(np.allclose(y, one_learner) for y in by_style["-"])
    assert any(np.allclose(y, one_learner / 2) for y in by_style["--"])
    assert "ALE/Pong-v5" in " ".join(plot.data["task"])


def test_training_scaling_never_joins_two_runs_nor_averages_their_baselines(tmp_path):
    """Where the newest run per cell differs from cell to cell (an older run with a seed or a
    layout that a newer one lacks), each run keeps its own line and its own dotted baseline,
    labelled with its id: no line through one run's point and another's, no baseline at the
    mean of two machines' sequential loops."""
    old = training_rows(np.random.default_rng(1), updates_per_step=0.5)
    new = [{**r, **({"value": r["value"] * 3} if r.get("value") is not None and r["metric"] != "speedup" else {})}
           for r in training_rows(np.random.default_rng(2), updates_per_step=0.5)
           if r["seed"] < 2 and r["actors"] in (0, 1)]  # seeds 0-1, sequential and 1 + 1 only: a faster machine
    first = write_run(tmp_path, "20300101T000000Z-older", "training", "training", old)
    second = write_run(tmp_path, "20300102T000000Z-newer", "training", "training", new)
    res = load.load_runs([first, second])
    plot = training_scaling.build(res.table, res.metas)
    rates = next(ax for ax in plot.figure.axes if ax.get_ylabel() == "environment steps/s")
    dotted = sorted(float(ln.get_ydata()[0]) for ln in rates.get_lines() if ln.get_linestyle() == ":")
    assert dotted == [1000.0, 3000.0]  # the older run's seed 2, the newer run's seeds 0-1: each its own
    process = [np.asarray(ln.get_ydata(), float) for ln in rates.get_lines()
               if ln.get_linestyle() == "-" and len(ln.get_xdata()) >= 2]
    older_line = np.array([1000.0, 1000.0 * 2 ** 0.8, 1000.0 * 4 ** 0.8])  # its seed 2 at 2 workers, then 3, 5
    assert any(np.allclose(y, older_line) for y in process)
    assert not any(np.isclose(y, 3000.0).any() and len(y) > 1 for y in process)  # the newer point stands alone
    labels = {t.get_text() for t in rates.texts}  # each run's baseline carries its tag ...
    assert {"r1 seq.", "r2 seq."} <= labels
    legend = {t.get_text() for leg in plot.figure.legends for t in leg.get_texts()}  # ... that the legend names
    assert {"r1: 20300101T000000Z-older", "r2: 20300102T000000Z-newer"} <= legend


def test_training_rows_take_every_metric_of_a_cell_from_its_newest_run(tmp_path):
    """A newer run of one layout without a sequential loop (so without a speedup row) replaces the
    older run's rows of that layout whole: its rates are drawn, and the older run's speedup is
    not kept beside them (a cell's panels showing two runs)."""
    old = training_rows(np.random.default_rng(1), updates_per_step=0.5)
    new = [{**r, "value": r["value"] * 3} for r in training_rows(np.random.default_rng(2), updates_per_step=0.5)
           if r["actors"] == 4 and r["op"] == "summary" and r["metric"] in ("env_steps_per_s", "updates_per_s")]
    first = write_run(tmp_path, "20300101T000000Z-older", "training", "training", old)
    second = write_run(tmp_path, "20300102T000000Z-newer", "training", "training", new)
    res = load.load_runs([first, second])
    data = training_scaling.build(res.table, res.metas).data
    four = data[data["actors"] == 4]
    assert set(four["run_id"]) == {"20300102T000000Z-newer"}
    assert set(four["metric"]) == {"env_steps_per_s", "updates_per_s"}  # no speedup: its newest run had none
    others = data[data["actors"] != 4]
    assert set(others["run_id"]) == {"20300101T000000Z-older"} and "speedup" in set(others["metric"])


def test_training_figures_keep_a_cuda_learner_and_a_setting_apart_from_the_cpu_learner(tmp_path):
    """One run, the same layouts with the learner on the CPU, on CUDA, and on CUDA with lag=1:
    three configurations (never one point with bars spanning devices), each its own line in the
    figure and its own row in the report, named by device and setting; bench's summary and the
    figures read one definition of the settings (contract.training_settings)."""
    cpu = [r for r in training_rows(np.random.default_rng(1), updates_per_step=0.5) if r["op"] == "summary"]
    cuda = [{**r, "params": {**r["params"], "device": "cuda"},
             **({"value": r["value"] * 2} if r.get("value") is not None and r["metric"] == "env_steps_per_s" else {})}
            for r in cpu if r["actors"]]
    lag = [{**r, "params": {**r["params"], "priority_lag": 1},
            **({"value": r["value"] * 1.5} if r["metric"] == "env_steps_per_s" else {})} for r in cuda]
    assert contract.training_settings(lag[0]["params"]) == "lag=1"
    assert contract.training_device(cpu[0]["params"]) == "cpu"
    run = write_run(tmp_path, "20300101T000000Z-training", "training", "training", cpu + cuda + lag)
    res = load.load_runs([run])
    plot = training_scaling.build(res.table, res.metas)
    rates = next(ax for ax in plot.figure.axes if ax.get_ylabel() == "environment steps/s")
    one_learner = np.array([1000.0, 1000.0 * 2 ** 0.8, 1000.0 * 4 ** 0.8])
    drawn = [np.asarray(ln.get_ydata(), float) for ln in rates.get_lines() if len(ln.get_xdata()) == 3]
    for factor in (1.0, 2.0, 3.0):  # cpu, cuda, cuda lag=1: a line each, none a median across them
        assert any(np.allclose(y, factor * one_learner) for y in drawn), factor
    legend = {t.get_text() for t in plot.figure.legends[0].get_texts()}
    assert {"1 learner", "1 learner, cuda", "1 learner, cuda, lag=1"} <= legend
    text = "\n".join(training_scaling.report_section(plot.data, res, {}))
    for who in ("| 1 actor, 1 learner |", "| 1 actor, 1 learner (cuda) |", "| 1 actor, 1 learner (cuda, lag=1) |"):
        assert who in text


def test_training_scaling_draws_speedup_against_workers_and_leaves_out_unreached_time_panels(tmp_path):
    """Issue 42.5: per task, speedup over the sequential loop against workers (actors + learners,
    log2) with the ideal line through (1, 1) first; a task where no run reached the threshold
    has no time panel (its row is one panel shorter) and the report says so in one line."""
    rows = (training_rows(np.random.default_rng(1), updates_per_step=0.5)
            + training_rows(np.random.default_rng(2), updates_per_step=0.0625))
    for r in rows:  # the 1/16 task never reaches the threshold, the baseline neither
        if r["params"].get("updates_per_step") == 0.0625 and r["metric"] == "time_to_threshold_s":
            r.update(status="skipped", value=None, error="threshold not reached")
    run = write_run(tmp_path, "20300101T000000Z-training", "training", "training", rows)
    res = load.load_runs([run])
    plot = training_scaling.build(res.table, res.metas)
    panels = {}
    for ax in plot.figure.axes:
        if ax.get_title():
            panels.setdefault(ax.get_title(), []).append(ax.get_ylabel())
    # updates/s is env steps/s x updates per step: no panel of its own (the CSV and the table keep it)
    speedup_label = "speedup over the sequential loop\n(same run and learner device) (x)"
    assert panels == {"dqn on CartPole-v1\n0.5 updates/step": [speedup_label, "time to threshold (s)",
                                                               "environment steps/s"],
                      "dqn on CartPole-v1\n0.0625 updates/step": [speedup_label, "environment steps/s"]}
    assert "updates_per_s" in set(plot.data["metric"])
    speedup = next(ax for ax in plot.figure.axes if ax.get_ylabel().startswith("speedup"))
    assert speedup.get_xscale() == "log"
    ideal = [ln for ln in speedup.get_lines() if ln.get_linestyle() == "--"]
    assert len(ideal) == 1 and list(ideal[0].get_xdata()) == list(ideal[0].get_ydata()) == [1, 2, 3, 4, 5]
    one_learner = [ln for ln in speedup.get_lines()  # 1+1, 2+1, 4+1 (the caps of its bars are lines too)
                   if ln.get_linestyle() == "-" and list(ln.get_xdata()) == [2.0, 3.0, 5.0]]
    assert len(one_learner) == 1
    assert training_scaling.unreached_tasks(plot.data) == ["dqn on CartPole-v1, 0.0625 updates/step"]
    assert set(plot.data.loc[plot.data["baseline"], "workers"]) == {1}
    # a layout that never ran (skipped past the machine's cores) is no point, and no "not reached" mark
    past = [{**r, "actors": 15, "learners": 1, "value": None, "status": "skipped",
             "error": "16 workers (15 actors + 1 learner) past this machine's 2 usable cores"}
            for r in rows if r["op"] == "summary" and r["actors"] == 1 and r["seed"] == 0]
    run = write_run(tmp_path, "20300101T000001Z-training", "training", "training", rows + past)
    again = training_scaling.build(load.load_runs([run]).table, {})
    assert 16 not in set(again.data["workers"])
    assert not [t for ax in again.figure.axes for t in ax.texts if t.get_text() == "not reached"
                and not ax.get_ylabel().startswith("time")]
    outcome = render.render(res, tmp_path / "f", echo=lambda *_: None, only={"training_scaling"})
    text = report.build(res, outcome, tmp_path / "R.md")
    said = [line for line in text.splitlines() if line.startswith("The figure leaves out the time-to-threshold")]
    assert said == ["The figure leaves out the time-to-threshold panel of dqn on CartPole-v1, 0.0625 updates/step: "
                    "no run of that task reached the reward threshold."]


def test_training_scaling_marks_each_buffer_when_there_are_several(tmp_path):
    """Two buffers with one learner on the process engine: one colour and one dash (the learner
    count and the engine), so each buffer gets a marker of its own (they once looked alike)."""
    rows = [{**r, "mode": None, "engine": "process" if r["actors"] else "sequential"}
            for r in training_rows(np.random.default_rng(1), updates_per_step=0.5)]
    other = [{**r, "policy": "lazy-writing"} for r in rows if r["engine"] == "process"]
    run = write_run(tmp_path, "20300101T000000Z-training", "training", "training", rows + other)
    res = load.load_runs([run])
    plot = training_scaling.build(res.table, res.metas)
    rates = next(ax for ax in plot.figure.axes if ax.get_ylabel() == "environment steps/s")
    one_learner = [ln for ln in rates.get_lines() if len(ln.get_xdata()) > 2 and ln.get_linestyle() == "-"]
    assert len(one_learner) == 2 and one_learner[0].get_color() == one_learner[1].get_color()
    assert one_learner[0].get_marker() != one_learner[1].get_marker()


def test_report_command_writes_the_report(synthetic, tmp_path):
    status = main(["report", "--runs", str(synthetic / "20300101T000000Z-micro"), "--figures",
                   str(tmp_path / "figs"), "--out", str(tmp_path / "R.md"), "--only", "capacity", "peers"])
    assert status == 0
    # the host's page beside R.md draws its figures, linked relative to the page
    (page,) = (tmp_path / "report").glob("*.md")
    text = page.read_text()
    host = page.stem
    assert f"](../figs/{host}/capacity.png)" in text and f"](../figs/{host}/peers.png)" in text
    assert f"](report/{host}.md)" in (tmp_path / "R.md").read_text()


def test_palette_is_stable_and_distinct():
    assert palette.variant_colour("binary") != palette.variant_colour("kary-aligned")
    assert palette.variant_colour("someone-elses-tree") == palette.variant_colour("someone-elses-tree")
    assert palette.variant_colour("someone-elses-tree") not in palette.VARIANT_COLOURS.values()
    assert palette.variant_label("kary", "kary", 16) == "kary (K=16)"
    assert palette.variant_label("peer:cpprb", "cpprb-segment-tree", pd.NA) == "peer:cpprb (cpprb-segment-tree)"


# ---------------------------------------------------------------------------------------------
# the stored runs


REFERENCE = sorted((REPO / "results").glob("reference-*"))


@pytest.mark.slow  # ~50 s: every figure from every committed run (the synthetic runs cover every figure by default)
def test_the_committed_reference_runs_plot(tmp_path):
    """Every figure draws from the committed reference runs (as `make plots` on a fresh clone),
    and the capacity figure's medians are the medians of the stored rows."""
    assert REFERENCE, "the committed reference runs results/reference-* are missing"
    res = load.load_runs(REFERENCE)
    assert not res.problems, [str(p) for p in res.problems]
    outcome = render.render(res, tmp_path, echo=lambda *_: None)
    assert not outcome.failed, outcome.failed
    assert set(outcome.written) == {m.NAME for m in modules()}  # the pong figure draws the sides it has
    for name, paths in outcome.written.items():
        assert all(p.stat().st_size > 0 for p in paths), name
    figure = pd.read_csv(tmp_path / "capacity.csv")
    rows = pd.DataFrame(results.read_rows(REPO / "results" / "reference-micro"))
    rows = rows[(rows["status"] == "ok") & (rows["metric"] == "seconds_per_call")]
    for _, point in figure.sample(10, random_state=0).iterrows():
        cell = rows[(rows["variant"] == point["variant"]) & (rows["op"] == point["op"])
                    & (rows["capacity"] == point["capacity"])]
        ns_per_item = 1e9 * cell["value"] / cell["items_per_call"]
        assert point["median"] == pytest.approx(float(np.median(ns_per_item)), rel=1e-9), point.to_dict()
        assert point["n"] == len(cell)


@pytest.mark.slow  # 10-16 s: `make test-slow` (keeps `make test` within its 10 minutes)
def test_one_file_figure_example_draws_the_reference_runs():
    """examples/figure_sample_cost.py (docs/extending.md), loaded as a module of analysis/plots/
    would be, on the committed reference runs: it builds a figure, and the medians in its data
    equal medians computed here from the micro run's rows; its main() draws the micro run."""
    from replaybench.analysis.plots import Plot

    example = load_example("figure_sample_cost", "replaybench.analysis.plots.example_sample_cost")
    res = load.load_runs(REFERENCE)
    plot = example.build(res.table, res.metas)
    assert isinstance(plot, Plot) and plot.figure.axes and example.NAME == "sample_cost"
    micro = res.table[(res.table["run_id"] == "reference-micro") & (res.table["status"] == "ok")
                      & (res.table["op"] == "sample") & (res.table["variant"] == "kary-aligned")
                      & (res.table["capacity"] == 2**20)]
    expected = (1e9 * micro["value"] / micro["items_per_call"]).median()
    got = plot.data[(plot.data["variant"] == "kary-aligned") & (plot.data["capacity"] == 2**20)]["median"]
    assert len(got) == 1 and abs(got.iloc[0] - expected) <= 1e-9 * expected
    assert example.main().data.equals(plot.data)  # only the micro run holds sample timings without a grid


def test_older_runs_training_mode_and_gossip_policy_are_read_as_engine_and_topology():
    """Runs stored before the engine and topology columns: the reader maps them
    (analysis.load.legacy_columns); rows that have the new columns stay as written."""
    import pandas as pd

    from replaybench.bench import contract

    base = {c: None for c in contract.COLUMNS}
    rows = [{**base, "scenario": "training", "algo": "dqn", "actors": 0, "mode": "processes"},
            {**base, "scenario": "training", "algo": "dqn", "actors": 2, "mode": "processes"},
            {**base, "scenario": "training", "algo": "dqn", "actors": 2, "mode": "ray"},
            {**base, "scenario": "training", "algo": "a2c", "actors": 0, "mode": "processes"},
            {**base, "scenario": "training", "algo": "dqn", "actors": 2, "engine": "dataflow"},
            {**base, "scenario": "gossip", "variant": "gossip", "policy": "ring/p1/k1", "mode": "processes"},
            {**base, "scenario": "gossip", "variant": "paac", "policy": "none", "mode": "processes"},
            {**base, "scenario": "concurrency", "mode": "threads"}]
    frame = load.legacy_columns(pd.DataFrame(rows, columns=contract.COLUMNS).astype(object))
    assert list(frame["engine"]) == ["sequential", "process", "ray", "paac", "dataflow", None, "paac", None]
    assert list(frame["topology"]) == [None] * 5 + ["ring/p1/k1", None, None]
    assert list(frame["policy"][5:7]) == ["none", "none"]
    assert list(frame["mode"]) == [None] * 7 + ["threads"]


def test_older_lf_and_paac_rows_read_their_backend_and_stepping_method_out_of_variant():
    """Runs stored before the ``backend`` (lf) and ``stepping`` (paac) columns held those in
    ``variant``: the reader moves them (analysis.load.legacy_columns) and leaves ``variant``
    empty, as new rows do; paac training rows (their run's label), rows that have the new
    columns and other scenarios' variants stay as written."""
    import pandas as pd

    from replaybench.bench import contract

    base = {c: None for c in contract.COLUMNS}
    rows = [{**base, "scenario": "lf", "op": "lockstep", "variant": "ray"},
            {**base, "scenario": "lf", "op": "pql", "variant": "dataflow", "policy": "deque"},
            {**base, "scenario": "lf", "op": "multiagent", "backend": "serial"},
            {**base, "scenario": "paac", "op": "step", "structure": "batched", "variant": "paac-halves"},
            {**base, "scenario": "paac", "op": "profile", "structure": "per-env", "variant": "per-env"},
            {**base, "scenario": "paac", "op": "step", "structure": "batched", "stepping": "envpool"},
            {**base, "scenario": "paac", "op": "summary", "structure": "kary-aligned", "variant": "pal-dqn"},
            {**base, "scenario": "paac", "op": "profile", "structure": "kary-aligned", "variant": "paac-a2c"},
            {**base, "scenario": "micro", "op": "sample", "variant": "binary"}]
    frame = load.legacy_columns(pd.DataFrame(rows, columns=contract.COLUMNS).astype(object))
    assert list(frame["backend"]) == ["ray", "dataflow", "serial"] + [None] * 6
    assert list(frame["stepping"]) == [None] * 3 + ["paac-halves", "per-env", "envpool", None, None, None]
    assert list(frame["variant"]) == [None] * 6 + ["pal-dqn", "paac-a2c", "binary"]
    assert list(frame["policy"][:2]) == [None, "deque"]


def test_stored_lf_and_paac_runs_load_with_backend_and_stepping_columns():
    """The committed reference runs, written before the split, load with every lf row's backend
    and every paac stepping row's method in their own columns (the figures read those)."""
    res = load.load_runs([REPO / "results" / "reference-lf", REPO / "results" / "reference-paac"])
    assert not res.problems
    lf = res.table[res.table["scenario"] == "lf"]
    assert not lf.empty and lf["backend"].notna().all() and lf["variant"].isna().all()
    assert {"ray", "dataflow"} <= set(lf["backend"])
    paac = res.table[res.table["scenario"] == "paac"]
    step = paac[paac["structure"].isin(["batched", "per-env"])]
    assert set(step["op"]) == {"step", "profile"}
    assert step["stepping"].notna().all() and step["variant"].isna().all()
    assert {"paac", "per-env"} <= set(step["stepping"])
    runs = paac.drop(step.index)  # the training runs: their labels stay in variant
    assert set(runs["op"]) >= {"summary", "profile"} and runs["stepping"].isna().all()
    assert {"paac-a2c", "pal-dqn"} <= set(runs["variant"])


def test_frameworks_figure_takes_the_newest_run_per_framework_not_a_pool_of_runs(tmp_path):
    """Two frameworks runs of different settings: each framework's panel draws the newest run
    that has it, never seeds of both (pooling mixed an older suite's seeds into the medians)."""
    from replaybench.analysis.plots import frameworks as fw_plot

    older = frameworks_rows()
    newer = [r for r in frameworks_rows() if contract.params_of(r["params"]).get("framework") == "sb3"]
    write_run(tmp_path, "20300101T000600Z-frameworks", "frameworks", "frameworks", older)
    write_run(tmp_path, "20300102T000600Z-frameworks-sb3", "frameworks-sb3", "frameworks", newer, scale=2.0)
    res = load.load_runs(sorted(tmp_path.iterdir()))
    rows = fw_plot.framework_rows(res.table)
    runs = rows.groupby("framework")["run_id"].unique().to_dict()
    assert {k: list(v) for k, v in runs.items()} == {"sb3": ["20300102T000600Z-frameworks-sb3"],
                                                     "tianshou": ["20300101T000600Z-frameworks"]}
    data = fw_plot.summary(rows)
    assert set(data.loc[data["framework"] == "sb3", "n_seeds"]) == {2}  # not 4: the older run's seeds left out


def test_every_host_gets_its_own_figures_and_report_section(tmp_path):
    """Issues 38 and 58: runs of two hosts measuring the same cells are never drawn together. A
    host is its CPU and caches (meta.json ``machine``), not its ``--machine`` label. Each host gets
    figures/<host>/ and a page of its own (report/<host>.md), each from its own runs only."""
    rng = np.random.default_rng(3)
    root = tmp_path / "results"
    big = {**MACHINE, "cpu_model": "Big CPU", "logical_cpus": 16, "usable_cpus": 16}
    write_run(root, "20300101T000000Z-micro", "micro", "micro", micro_rows(rng))
    write_run(root, "20300101T000200Z-cache", "cache", "cache", cache_rows())
    write_run(root, "20300102T000000Z-micro", "micro", "micro", micro_rows(rng), scale=10.0,
              extra={"machine_label": "big-16core", "machine": big})
    res = load.load_runs(load.find_runs(root))
    parts = res.by_host()
    assert [(m, sorted(p.metas)) for m, p in parts] == [
        ("synthetic-2cpu-32k-1m-16m", ["20300101T000000Z-micro", "20300101T000200Z-cache"]),
        ("big-16cpu-32k-1m-16m", ["20300102T000000Z-micro"])]
    figures, target = tmp_path / "figures", tmp_path / "REPORT.md"
    assert main(["report", "--runs", *map(str, load.find_runs(root)), "--figures", str(figures),
                 "--out", str(target), "--only", "capacity"]) == 0
    home = pd.read_csv(figures / "synthetic-2cpu-32k-1m-16m" / "capacity.csv")
    other = pd.read_csv(figures / "big-16cpu-32k-1m-16m" / "capacity.csv")
    assert set(home["run_id"]) == {"20300101T000000Z-micro"} and set(other["run_id"]) == {"20300102T000000Z-micro"}
    assert (other["median"].to_numpy() > 5 * home["median"].to_numpy()).all()  # 10x slower: not the home run's values
    text = target.read_text()
    assert text.count("# replaybench report") == 1 and "](report/big-16cpu-32k-1m-16m.md)" in text
    page = (tmp_path / "report" / "big-16cpu-32k-1m-16m.md").read_text()
    assert page.startswith("# Host `big-16cpu-32k-1m-16m`")
    assert "20300102T000000Z-micro" in page and "20300101T000000Z-micro" not in page
    assert "](../figures/big-16cpu-32k-1m-16m/capacity.png)" in page and "## Runs used" in page
