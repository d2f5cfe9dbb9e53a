"""The gpu scenario: what one ``sample`` costs a GPU learner, per buffer, rows included.

Issue 40's target for the GPU tree (variant ``torch-kary``): a sample of 256 at 2**20 leaves,
the batch's rows gathered in device memory, at least as fast as TorchRL's prioritized buffer
over a CUDA storage, in the same run. bench/suites/gpu-tree-quick.json is that comparison.

Each cell builds one buffer (``contestants`` in the suite: a registered variant or
``peer:torchrl``, the device its tree and rows live on, and where the learner wants the batch),
fills it to ``capacity`` with random CartPole-sized rows and random priorities, makes
``warmup`` calls, then times ``repeats`` blocks of ``calls`` calls of ``sample(batch)``. A call
on a CUDA device ends in ``torch.cuda.synchronize()``, so its time includes the device work
(a learner uses the batch at once); a CPU tree whose batch the learner wants on the GPU
(``"batch_to": "cuda"``) copies it there through :class:`impl.rl.common.device_feed.PinnedBatchFeed`
inside the call, as the training loop's learner does.

Contestants:

- ``torch-kary`` with ``device="cuda"``: tree and rows in GPU memory, ``output="device"``,
  each sample one replay of its CUDA graph (``"cuda_graph": false`` in the contestant: the
  same kernels launched one by one); with ``device="cpu"``: the same code on the CPU (what
  the conformance suite runs).
- the CPU trees (``kary-aligned``, ...): tree and rows in host memory, the batch left there
  (``"batch_to": "cpu"``) or copied to the GPU (``"batch_to": "cuda"``).
- ``peer:torchrl``: ``torchrl.data.PrioritizedReplayBuffer`` over
  ``LazyTensorStorage(capacity, device=...)`` (its sum tree is TorchRL's C++ one, on the
  host; the rows on the device): bench/peers/torchrl_peer.py's ``target(..., device=...)``,
  filled with its ``fill_add`` and timed through its ``sample``. A peer takes the devices its
  module's ``DEVICES`` lists (the CPU where it lists none).

Rows: op "sample", metric "seconds_per_call" (s), one per repeat (``loops`` = calls),
``items_per_call`` = batch, capacity and batch as columns; params: device, batch_to,
output and cuda_graph (torch-kary). A cell that needs CUDA where torch sees none, or TorchRL where it does
not load, is one ``unavailable`` row naming the reason.
"""

from __future__ import annotations

import time

import numpy as np

from replaybench.bench import peers
from replaybench.bench.derive import SCHEMAS
from replaybench.bench.scenarios import Cell, RunState, Scenario, Selection, SelectionError
from replaybench.bench.workloads import random_batch
from replaybench.impl import registry

__all__ = ["Gpu", "SCENARIO", "cuda_missing"]

DEVICES = ("cpu", "cuda")


def cuda_missing() -> str:
    """Why CUDA cannot run here, or "" (imports torch)."""
    import torch

    if torch.cuda.is_available():
        return ""
    return f"torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is False)"


class Gpu(Scenario):
    name = "gpu"
    takes = frozenset({"variants"})
    suite_keys = frozenset({"capacity", "batch", "transitions", "seed", "warmup", "calls", "repeats", "contestants"})

    def cells(self, suite: dict, selection: Selection) -> list[Cell]:
        capacity, batch = int(suite["capacity"]), int(suite["batch"])
        if capacity < 1 or batch < 1:
            raise SelectionError(f"suite {suite['name']!r}: capacity and batch must be positive, got "
                                 f"{capacity} and {batch}")
        if suite["transitions"] not in SCHEMAS:
            raise SelectionError(f"suite {suite['name']!r}: transitions must be one of {sorted(SCHEMAS)}, "
                                 f"got {suite['transitions']!r}")
        missing_cuda = None
        cells = []
        for c in suite["contestants"]:
            variant, device, batch_to = c["variant"], c.get("device", "cpu"), c.get("batch_to", c.get("device", "cpu"))
            if device not in DEVICES or batch_to not in DEVICES:
                raise SelectionError(f"suite {suite['name']!r}: device and batch_to must be one of {DEVICES}, "
                                     f"got {c!r}")
            if selection.variants and variant not in selection.variants:
                continue
            if peers.is_peer(variant):
                module = peers.load(variant)  # UnknownName names the known peers
                if device not in getattr(module, "DEVICES", ("cpu",)) or batch_to != device:
                    raise SelectionError(f"suite {suite['name']!r}: {variant} cannot keep its rows on {device!r} "
                                         f"and hand the batch to {batch_to!r} (its devices: "
                                         f"{getattr(module, 'DEVICES', ('cpu',))})")
                structure = module.STRUCTURE
            else:
                structure = registry.get(variant).structure
            params = {"device": device, "batch_to": batch_to}
            graphed = c.get("cuda_graph", True)
            if not isinstance(graphed, bool) or ("cuda_graph" in c and variant != "torch-kary"):
                raise SelectionError(f"suite {suite['name']!r}: cuda_graph is true or false, for torch-kary only, "
                                     f"got {c!r}")
            if variant == "torch-kary":
                params["output"] = "device" if batch_to == device else "host"
                params["cuda_graph"] = graphed
            skip = ""
            if "cuda" in (device, batch_to):
                if missing_cuda is None:
                    missing_cuda = cuda_missing()
                skip = missing_cuda
            if not skip and peers.is_peer(variant):
                ok, why = peers.availability(variant)
                skip = "" if ok else why
            columns = {"variant": variant, "structure": structure, "policy": "none", "params": params,
                       "capacity": capacity, "batch": batch, "transitions": suite["transitions"], "op": "sample",
                       "metric": "seconds_per_call", "unit": "s", "items_per_call": batch}
            how = ", eager" if not graphed and device == "cuda" else ""
            cells.append(Cell(f"{variant} on {device}{how}, batch to {batch_to}", columns, spec=c, skip=skip,
                              skip_status="unavailable"))
        return cells

    def meta(self, suite: dict, selection: Selection, cells: list[Cell]) -> dict:
        return {"timing": "each call ends in torch.cuda.synchronize() where a CUDA device is involved; "
                          f"{suite['warmup']} warm-up calls, then {suite['repeats']} blocks of {suite['calls']}"}

    def summarize(self, rows: list[dict], meta: dict) -> str:
        return format_table(rows)

    def measure(self, cell: Cell, run: RunState) -> list[dict]:
        suite = run.meta["suite"]
        sample, sync = _contestant(cell, suite)
        for _ in range(int(suite["warmup"])):
            sample()
        sync()
        rows = []
        calls = int(suite["calls"])
        for repeat in range(int(suite["repeats"])):
            start = time.perf_counter()
            for _ in range(calls):
                sample()
                sync()
            rows.append(cell.row("ok", value=(time.perf_counter() - start) / calls, repeat=repeat, loops=calls))
        return rows


def format_table(rows: list[dict]) -> str:
    """One line per contestant (variant, tree device, where the batch lands, and for torch-kary
    on CUDA a graph replay or eager launches): microseconds per sample call, median and range
    over the repeats, and TorchRL's median over this one's where the run has ``peer:torchrl``
    with the same devices (above 1: faster than TorchRL); then the cells not measured."""
    import json
    import statistics

    from replaybench.bench.summary import format_table as table

    cells: dict[tuple, dict] = {}
    for r in rows:
        p = json.loads(r["params"]) if isinstance(r["params"], str) else (r["params"] or {})
        how = ("graph" if p.get("cuda_graph") else "eager") if r["variant"] == "torch-kary" and p.get("device") == "cuda" \
            else "-"
        key = (r["variant"], p.get("device"), p.get("batch_to"), how, r["capacity"])
        cell = cells.setdefault(key, {"values": [], "status": r["status"], "error": r.get("error")})
        if r["status"] == "ok":
            cell["values"].append(1e6 * float(r["value"]))
    medians = {k: statistics.median(c["values"]) for k, c in cells.items() if c["values"]}
    body, missing = [], []
    for key, c in cells.items():
        if key not in medians:
            missing.append([*map(str, key), c["status"], (c["error"] or "")[:100]])
            continue
        peer = medians.get(("peer:torchrl", key[1], key[2], "-", key[4]))
        body.append([*map(str, key), f"{medians[key]:.1f}", f"{min(c['values']):.1f}-{max(c['values']):.1f}",
                     str(len(c["values"])), f"{peer / medians[key]:.2f}" if peer else "-"])
    header = ["variant", "tree on", "batch to", "launch", "capacity"]
    out = ["One sample call: us, median and min-max over repeats; x torchrl = TorchRL's median with the same "
           "devices over this one's"]
    out += table(header + ["us", "min-max", "repeats", "x torchrl"], body, {4, 5, 7, 8}) if body else ["(no rows)"]
    if missing:
        out += ["", "Not measured:", *table(header + ["status", "error"], missing, set())]
    return "\n".join(out)


def _contestant(cell: Cell, suite: dict):
    """``(sample, sync)`` for the cell's buffer, built and filled: ``sample()`` makes one call
    (and the copy to the GPU where asked), ``sync()`` waits for the device (a no-op on the CPU)."""
    import torch

    capacity, batch, params = cell.columns["capacity"], cell.columns["batch"], cell.columns["params"]
    fields = SCHEMAS[suite["transitions"]]
    rng = np.random.default_rng(int(suite["seed"]))
    rows = random_batch(fields, capacity, rng)
    priorities = rng.random(capacity) + 0.01
    sync = torch.cuda.synchronize if "cuda" in (params["device"], params["batch_to"]) else (lambda: None)
    variant = cell.columns["variant"]
    if peers.is_peer(variant):
        target = peers.load(variant).target(capacity, fields, rng, device=params["device"])
        target.fill_add(rows, priorities)
        return (lambda: target.sample(batch)), sync
    extra = ({"device": params["device"], "output": params["output"], "cuda_graph": params["cuda_graph"]}
             if variant == "torch-kary" else {})
    buf = registry.create(variant, capacity, fields, seed=int(suite["seed"]), **extra)
    buf.add(rows, priorities=priorities)
    gen = np.random.default_rng(int(suite["seed"]) + 1)
    out = buf.sample_out(batch)
    if params["batch_to"] == params["device"] or variant == "torch-kary":
        if variant == "torch-kary" and params["batch_to"] != params["device"]:
            raise ValueError(f"torch-kary keeps its batch on its device; batch_to={params['batch_to']!r} "
                             f"with device={params['device']!r} is not a contestant")
        return (lambda: buf.sample(batch, rng=gen, out=out)), sync
    from replaybench.impl.rl.common.device_feed import PinnedBatchFeed

    feed = PinnedBatchFeed(out, [*fields, "weights"], torch.device(params["batch_to"]), slots=1)
    return (lambda: feed.stage(buf.sample(batch, rng=gen, out=out), 0)), sync


SCENARIO = Gpu()
