"""The GPU tree (variant ``torch-kary``: impl/trees/torch_tree.py, impl/device_buffer.py) on each
device torch sees: the CPU always, CUDA where present (tests marked ``cuda`` skip without it).

The registry-wide conformance suite (tests/test_buffer.py, test_sampling.py, test_trees.py,
test_errors.py, ...) runs the variant with its defaults (``device="auto"``, ``output="host"``):
on the CPU here, on the GPU where torch sees one. This file adds what is particular to it, on
every device: the device draws are the CPU buffers' draws bit for bit; the tree against the
O(N) oracle (random batches with duplicates and zeros, at float32 and float64, within the
documented error bound); the float64 tree samples exactly what the float64 CPU tree samples
for the same seed; the sampled frequencies (chi-square); ``output="device"`` returns tensors
on the device equal to the host output; updates from device tensors; the device's checks.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from replaybench.impl import fused_ops, registry
from replaybench.impl.device_buffer import DeviceReplayBuffer, uniform01
from replaybench.impl.trees import ReferenceSumTree
from replaybench.impl.trees.torch_tree import TorchSumTree, resolve_device

HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="torch sees no CUDA device")
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, needs_cuda])]
FIELDS = {"obs": ((3,), "float32"), "id": ((), "int64"), "done": ((), "bool"), "pix": ((2, 2), "uint8")}
UNIT = {"float32": 2.0**-24, "float64": 2.0**-53}


def rows(n, start=0):
    ids = np.arange(start, start + n, dtype=np.int64)
    return {"obs": np.stack([ids, -ids, ids * 0.5], 1).astype(np.float32), "id": ids, "done": ids % 3 == 0,
            "pix": (ids[:, None, None] * np.ones((1, 2, 2))).astype(np.uint8)}


def filled(device, capacity=300, n=450, seed=0, **kw):
    buf = registry.create("torch-kary", capacity, FIELDS, device=device, seed=seed, **kw)
    rng = np.random.default_rng(seed)
    buf.add(rows(n), priorities=rng.random(n) * 3 * (rng.random(n) < 0.9))
    return buf


@pytest.mark.parametrize("device", DEVICES)
def test_device_draws_are_the_cpu_draws_bit_for_bit(device):
    rng = np.random.default_rng(5)
    for _ in range(5):
        key = int(rng.bit_generator.random_raw() >> 1)
        got = uniform01(key, torch.arange(3000, device=device)).cpu().numpy()
        want = np.array([fused_ops.uniform01(key, c) for c in range(3000)])
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("K", [2, 3, 32])
@pytest.mark.parametrize("device", DEVICES)
def test_tree_matches_the_oracle_within_its_bound(device, K, dtype):
    """Random batches (duplicates: the last one wins; zeros) against ReferenceSumTree: leaves
    and minimum exact at the dtype, total within D * unit roundoff * total, and prefix-sum
    searches the oracle's wherever the mass is not within that bound of a boundary."""
    rng = np.random.default_rng(K)
    for capacity in (1, 7, 70, 1000):
        tree, ref = TorchSumTree(capacity, K=K, dtype=dtype, device=device), ReferenceSumTree(capacity)
        for _ in range(6):
            n = int(rng.integers(1, 2 * capacity + 2))
            idx = rng.integers(0, capacity, n)
            vals = rng.random(n) * 10.0 ** rng.integers(-3, 3, n) * (rng.random(n) < 0.8)
            assert tree.update(idx, vals) == ref.update(idx, vals)
            leaves = ref.leaves().astype(dtype)
            np.testing.assert_array_equal(tree.leaves(), leaves)
            exact = float(np.sum(leaves, dtype=np.float64))
            assert abs(tree.total() - exact) <= (tree.depth + 1) * UNIT[dtype] * exact
            positive = leaves[leaves > 0]
            assert tree.min() == (positive.min() if positive.size else np.inf)
            if exact > 0:
                us = np.sort(rng.random(500)) * exact
                got, prio = tree.find(us)
                cum = np.cumsum(leaves.astype(np.float64))
                near = np.abs(cum[None, :] - us[:, None]).min(1) <= 4 * tree.depth * UNIT[dtype] * exact
                want = np.searchsorted(cum, us, side="right")
                ok = ~near & (want < capacity)
                np.testing.assert_array_equal(got[ok], want[ok])
                np.testing.assert_array_equal(prio[ok], leaves[want[ok]])
                assert (got[got >= 0] < capacity).all() and (prio[got >= 0] > 0).all()


@pytest.mark.parametrize("stratified", [False, True])
@pytest.mark.parametrize("device", DEVICES)
def test_float64_tree_samples_what_the_float64_cpu_tree_samples(device, stratified):
    """Same seed, same masses: the same indices, weights to float32 rounding, and the rows."""
    gpu = filled(device, dtype="float64", stratified=stratified)
    cpu = registry.create("kary", 300, FIELDS, dtype="float64", seed=0, stratified=stratified)
    rng = np.random.default_rng(0)
    cpu.add(rows(450), priorities=rng.random(450) * 3 * (rng.random(450) < 0.9))
    for seed in range(3):
        a, b = gpu.sample(256, rng=np.random.default_rng(seed)), cpu.sample(256, rng=np.random.default_rng(seed))
        np.testing.assert_array_equal(a["indices"], b["indices"])
        np.testing.assert_allclose(a["weights"], b["weights"], rtol=1e-6)
        for name in FIELDS:
            np.testing.assert_array_equal(a[name], b[name])
        idx = np.arange(0, 300, 7)
        gpu.update_priorities(idx, np.linspace(0, 2, idx.size))
        cpu.update_priorities(idx, np.linspace(0, 2, idx.size))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("device", DEVICES)
def test_frequencies_match_priorities(device, dtype):
    prio = np.array([0.0, 1.0, 2.0, 3.0, 0.0, 10.0, 0.5, 4.0, 0.25, 1.5])
    buf = registry.create("torch-kary", 10, {"id": ((), "int64")}, device=device, dtype=dtype, alpha=1.0, eps=0.0,
                          output="device", K=3)
    buf.add({"id": np.arange(10)}, priorities=prio)
    rng = np.random.default_rng(7)
    counts = np.zeros(10, dtype=np.int64)
    for _ in range(40):
        out = buf.sample(1000, rng=rng)
        assert torch.equal(out["id"], out["indices"])
        counts += np.bincount(out["indices"].cpu().numpy(), minlength=10)
    assert counts[prio == 0].sum() == 0
    keep = prio > 0
    assert chisquare(counts[keep], prio[keep] / prio.sum() * counts.sum()).pvalue > 1e-3
    # the control: the same counts against the uniform distribution are rejected
    assert chisquare(counts[keep], np.full(keep.sum(), counts.sum() / keep.sum())).pvalue < 1e-6


@pytest.mark.parametrize("device", DEVICES)
def test_device_output_is_the_host_output_on_the_device(device):
    dev, host = filled(device, output="device"), filled(device, output="host")
    for seed in range(2):
        a, b = dev.sample(64, beta=0.7, rng=np.random.default_rng(seed)), host.sample(64, beta=0.7,
                                                                                       rng=np.random.default_rng(seed))
        assert a.keys() == b.keys() == {*FIELDS, "indices", "weights"}
        for k in a:
            assert isinstance(a[k], torch.Tensor) and a[k].device.type == device and isinstance(b[k], np.ndarray)
            assert a[k].dtype == torch.from_numpy(b[k]).dtype and a[k].shape == b[k].shape
            np.testing.assert_array_equal(a[k].cpu().numpy(), b[k])
    out = dev.sample_out(64)
    got = dev.sample(64, beta=0.7, rng=np.random.default_rng(9), out=out)
    fresh = host.sample(64, beta=0.7, rng=np.random.default_rng(9))
    assert got is out and all(out[k].device.type == device for k in out)
    for k in fresh:
        np.testing.assert_array_equal(out[k].cpu().numpy(), fresh[k])
    bare = dev.sample(64, rng=np.random.default_rng(9), out=dev.sample_out(64, fields=False))
    assert set(bare) == {"indices", "weights"}


@pytest.mark.parametrize("device", DEVICES)
def test_updates_from_device_tensors_equal_host_updates_and_are_checked(device):
    a, b = filled(device, output="device"), filled(device)
    idx = np.array([5, 9, 5, 200, 17])
    vals = np.array([0.5, 0.0, 4.0, 1e-3, 2.5])
    a.update_priorities(torch.from_numpy(idx).to(device), torch.from_numpy(vals).to(device).float())
    b.update_priorities(idx, vals.astype(np.float32))
    np.testing.assert_array_equal(a.tree.leaves(), b.tree.leaves())
    assert a.max_priority == b.max_priority
    before = a.tree.leaves()
    for bad, match in ((torch.tensor([0.5, float("nan")]), r"priorities\[1\] = nan is not finite"),
                       (torch.tensor([-1.0, 1.0]), r"priorities\[0\] = -1.0 is negative")):
        with pytest.raises(ValueError, match=match):
            a.update_priorities(torch.tensor([1, 2], device=device), bad.to(device))
    with pytest.raises(IndexError, match=r"indices\[1\] = 300 is out of range"):
        a.update_priorities(torch.tensor([1, 300], device=device), torch.ones(2, device=device))
    with pytest.raises(TypeError, match="indices must be integers"):
        a.update_priorities(torch.ones(2, device=device), torch.ones(2, device=device))
    np.testing.assert_array_equal(a.tree.leaves(), before)


@pytest.mark.parametrize("device", DEVICES)
def test_a_missed_draw_is_redrawn_on_the_fused_counters(device, monkeypatch):
    """A draw that rounding sends onto a zero leaf (forced here on the first descent) is redrawn
    on the counter r * n + b, as the CPU buffers do; the result is a valid sample."""
    buf = filled(device, dtype="float64")
    want = filled(device, dtype="float64").sample(8, rng=np.random.default_rng(1))
    real = buf.tree.descend
    calls = []

    def first_misses(u):
        idx, prio = real(u)
        if not calls:
            idx, prio = idx.clone(), prio.clone()
            idx[3], prio[3] = -1, 0.0
        calls.append(u.shape[0])
        return idx, prio

    monkeypatch.setattr(buf.tree, "descend", first_misses)
    got = buf.sample(8, rng=np.random.default_rng(1))
    assert calls == [8, 1]
    key = int(np.random.default_rng(1).bit_generator.random_raw() >> 1)
    u = fused_ops.uniform01(key, 8 + 3) * buf.tree.total()
    redrawn, _ = buf.tree.find(np.array([u]))
    expect = want["indices"].copy()
    expect[3] = redrawn[0]
    np.testing.assert_array_equal(got["indices"], expect)
    np.testing.assert_array_equal(got["id"], buf.storage.columns["id"][expect])


@pytest.mark.parametrize("device", DEVICES)
def test_nothing_to_sample_is_refused(device):
    buf = registry.create("torch-kary", 4, {"id": ((), "int64")}, device=device, eps=0.0)
    with pytest.raises(ValueError, match="empty buffer"):
        buf.sample(2)
    buf.add({"id": np.arange(3)}, priorities=np.zeros(3))
    with pytest.raises(ValueError, match="total priority is 0"):
        buf.sample(2, rng=np.random.default_rng(0))


@pytest.mark.parametrize("bad", ["gpu", "CUDA", "", "cuda:x", "tpu", 0, None, 1.5])
def test_a_bad_device_is_refused_by_name(bad):
    with pytest.raises(ValueError, match=r"device must be 'auto', 'cpu', 'cuda', 'cuda:<n>' or a torch.device, got "
                                         + repr(bad).replace("(", r"\(").replace(".", r"\.")):
        registry.create("torch-kary", 4, {"id": ((), "int64")}, device=bad)


def test_other_bad_arguments_are_refused_by_name():
    with pytest.raises(ValueError, match=r"output must be one of \('device', 'host'\), got 'numpy'"):
        registry.create("torch-kary", 4, {"id": ((), "int64")}, output="numpy")
    with pytest.raises(ValueError, match=r"fields\['x'\] has dtype uint32, which a device buffer cannot store"):
        registry.create("torch-kary", 4, {"x": ((), "uint32")})
    with pytest.raises(ValueError, match=r"dtype must be 'float32' or 'float64', got 'float16'"):
        registry.create("torch-kary", 4, {"id": ((), "int64")}, dtype="float16")


def test_auto_takes_cuda_where_torch_sees_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ValueError, match=r"device 'cuda' is unavailable: .*sees no CUDA device"):
        resolve_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda")


@pytest.mark.cuda
@needs_cuda
def test_on_a_gpu_the_tree_and_the_rows_live_in_device_memory():
    buf = filled("cuda", output="device")
    assert buf.device.type == "cuda" and registry.create("torch-kary", 4, FIELDS).device.type == "cuda"
    assert all(t.is_cuda for t in buf.storage.tensors.values())
    assert buf.tree.total_t.is_cuda and buf.tree.min_t.is_cuda
    out = buf.sample(256, rng=np.random.default_rng(0))
    assert all(v.is_cuda for v in out.values())
    buf.update_priorities(out["indices"], out["weights"].double())


def test_samples_are_graphed_only_into_sample_outs_on_cuda_and_the_setting_is_checked():
    with pytest.raises(ValueError, match=r"cuda_graph must be True or False, got 'yes'"):
        registry.create("torch-kary", 4, {"id": ((), "int64")}, cuda_graph="yes")
    for output in ("device", "host"):
        buf = filled("cpu", output=output)
        assert buf.resolved_params["cuda_graph"] is False and buf.sample_out(8).graph is None
    if HAS_CUDA:
        assert filled("cuda", output="device").resolved_params["cuda_graph"] is True
        assert filled("cuda", output="host").resolved_params["cuda_graph"] is False
        assert filled("cuda", output="device", cuda_graph=False).sample_out(8).graph is None


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("stratified", [False, True])
def test_a_graphed_sample_draws_what_the_eager_one_does(stratified):
    """Samples into a sample_out object, replayed as a CUDA graph from the fourth on, against
    the same calls made eagerly (cuda_graph=False) on a twin buffer: the same indices, weights
    and rows every call, while rows are added, priorities updated and beta changed between
    calls (the graph reads the tree, the rows, the key and beta as they are at each replay)."""
    graphed = filled("cuda", output="device", stratified=stratified)
    eager = filled("cuda", output="device", stratified=stratified, cuda_graph=False)
    out_g, out_e = graphed.sample_out(64), eager.sample_out(64)
    rng = np.random.default_rng(3)
    for call in range(10):
        beta = [0.4, 0.5, 1.0, 0.0][call % 4]
        got = graphed.sample(64, beta=beta, rng=np.random.default_rng(call), out=out_g)
        want = eager.sample(64, beta=beta, rng=np.random.default_rng(call), out=out_e)
        assert got is out_g and out_g.graph.captured == (call >= 3) and out_e.graph is None
        for k in want:
            torch.testing.assert_close(got[k], want[k], rtol=0, atol=0)
        idx, vals = rng.integers(0, len(graphed), 40), rng.random(40) * 5
        for buf in (graphed, eager):
            buf.update_priorities(torch.from_numpy(idx).cuda(), torch.from_numpy(vals).cuda())
            buf.add(rows(7, start=1000 + 7 * call), priorities=np.full(7, 2.0))


# ------------------------------------------------------------------------------ the gpu scenario
def test_the_gpu_tree_suite_expands_and_its_cuda_cells_are_unavailable_without_a_gpu():
    from replaybench.bench import driver, suites

    suite = suites.load("gpu-tree-quick")
    # TorchRL on the CPU is left out: its cell imports TorchRL (seconds) to see that it loads
    suite["contestants"] = [c for c in suite["contestants"] if c != {"variant": "peer:torchrl", "device": "cpu"}]
    plan = driver.plan(suite)
    cells = [(c.columns["variant"], c.columns["params"]["device"], c.columns["params"]["batch_to"]) for c in plan.cells]
    assert ("torch-kary", "cuda", "cuda") in cells and ("peer:torchrl", "cuda", "cuda") in cells
    assert ("kary-aligned", "cpu", "cuda") in cells and ("torch-kary", "cpu", "cpu") in cells
    assert all(c.columns["capacity"] == 2**20 and c.columns["batch"] == 256 for c in plan.cells)
    on_cuda = [c.columns["params"] for c in plan.cells
               if c.columns["variant"] == "torch-kary" and c.columns["params"]["device"] == "cuda"]
    assert sorted(p["cuda_graph"] for p in on_cuda) == [False, True]  # graphed and eager
    for c in plan.cells:
        if "cuda" in (c.columns["params"]["device"], c.columns["params"]["batch_to"]) and not HAS_CUDA:
            assert c.skip_status == "unavailable" and "sees no CUDA device" in c.skip
    composite = suites.load("gpu-quick")
    assert composite["suites"] == ["training-gpu-quick", "gpu-tree-quick"]


def test_the_gpu_scenario_runs_small_cells_and_names_what_it_cannot_run(tmp_path):
    """A few calls at 2**10 leaves through the driver: the CPU cells "ok" with their seconds per
    call, a CUDA cell one "unavailable" row where torch sees no GPU (else "ok")."""
    from replaybench.bench import driver, results, suites

    suite = suites.load("gpu-tree-quick")
    suite.update(capacity=1024, warmup=1, calls=3, repeats=2,
                 contestants=[{"variant": "torch-kary", "device": "cuda"}, {"variant": "torch-kary", "device": "cpu"},
                              {"variant": "kary-aligned", "device": "cpu", "batch_to": "cuda"},
                              {"variant": "kary-aligned", "device": "cpu"}])
    run = driver.run(suite, out=tmp_path, run_id="gpu", progress=False, echo=lambda *a, **k: None)
    rows = results.read_rows(run)
    by_cell = {}
    for r in rows:
        params = json.loads(r["params"]) if isinstance(r["params"], str) else r["params"]
        by_cell.setdefault((r["variant"], params["device"], params["batch_to"]), []).append(r)
    assert len(by_cell) == 4
    for (variant, device, batch_to), mine in by_cell.items():
        if "cuda" in (device, batch_to) and not HAS_CUDA:
            assert [r["status"] for r in mine] == ["unavailable"]
        else:
            assert [r["status"] for r in mine] == ["ok", "ok"] and all(r["value"] > 0 for r in mine)
            assert all(r["op"] == "sample" and r["metric"] == "seconds_per_call" and r["loops"] == 3 for r in mine)


def test_a_gpu_suite_with_a_bad_contestant_is_refused_before_running():
    from replaybench.bench import driver, suites
    from replaybench.bench.scenarios import SelectionError

    suite = suites.load("gpu-tree-quick")
    suite["contestants"] = [{"variant": "torch-kary", "device": "tpu"}]
    with pytest.raises(SelectionError, match="device and batch_to must be one of"):
        driver.plan(suite)
    suite["contestants"] = [{"variant": "peer:cpprb", "device": "cuda"}]
    with pytest.raises(SelectionError, match=r"peer:cpprb cannot keep its rows on 'cuda'"):
        driver.plan(suite)
    for bad in ({"variant": "torch-kary", "device": "cuda", "cuda_graph": "no"},
                {"variant": "kary-aligned", "device": "cpu", "cuda_graph": False}):
        suite["contestants"] = [bad]
        with pytest.raises(SelectionError, match="cuda_graph is true or false, for torch-kary only"):
            driver.plan(suite)


@pytest.mark.slow
def test_the_gpu_scenario_times_torchrl_on_each_device_it_can(tmp_path):
    """TorchRL's buffer through its peer module (``target(..., device=...)``): "ok" rows on the
    CPU, and on CUDA where torch sees a GPU ("unavailable" otherwise); "unavailable" naming the
    import error where TorchRL does not load."""
    from replaybench.bench import driver, peers, results, suites

    suite = suites.load("gpu-tree-quick")
    suite.update(capacity=1024, warmup=1, calls=3, repeats=2,
                 contestants=[{"variant": "peer:torchrl", "device": "cpu"},
                              {"variant": "peer:torchrl", "device": "cuda"}])
    run = driver.run(suite, out=tmp_path, run_id="gpu", progress=False, echo=lambda *a, **k: None)
    loads, _ = peers.availability("peer:torchrl")
    for r in results.read_rows(run):
        params = json.loads(r["params"]) if isinstance(r["params"], str) else r["params"]
        ok = loads and (params["device"] == "cpu" or HAS_CUDA)
        assert r["status"] == ("ok" if ok else "unavailable"), r


def test_the_gpu_summary_gives_one_line_per_contestant_against_torchrl_on_the_same_devices():
    """Contestants of one variant once shared a line whose median mixed a CUDA graph, eager
    launches and the CPU build; each now has its own, with TorchRL's median over its own where
    TorchRL ran on the same devices."""
    from replaybench.bench.scenarios.gpu import format_table

    def rows(variant, us, **params):
        return [{"variant": variant, "params": params, "capacity": 1024, "status": "ok", "value": u * 1e-6}
                for u in us]

    table = format_table(rows("torch-kary", [100, 110, 90], device="cuda", batch_to="cuda", cuda_graph=True)
                         + rows("torch-kary", [400, 410, 390], device="cuda", batch_to="cuda", cuda_graph=False)
                         + rows("torch-kary", [300], device="cpu", batch_to="cpu", cuda_graph=True)
                         + rows("peer:torchrl", [200, 210, 190], device="cuda", batch_to="cuda")
                         + [{"variant": "kary-aligned", "params": {"device": "cpu", "batch_to": "cuda"},
                             "capacity": 1024, "status": "unavailable", "value": None, "error": "no CUDA device"}])
    lines = {tuple(ln.split()[:4]): ln.split()[4:] for ln in table.splitlines()[3:] if ln.strip()}
    assert lines[("torch-kary", "cuda", "cuda", "graph")] == ["1024", "100.0", "90.0-110.0", "3", "2.00"]
    assert lines[("torch-kary", "cuda", "cuda", "eager")] == ["1024", "400.0", "390.0-410.0", "3", "0.50"]
    assert lines[("torch-kary", "cpu", "cpu", "-")] == ["1024", "300.0", "300.0-300.0", "1", "-"]  # no CPU TorchRL
    assert lines[("kary-aligned", "cpu", "cuda", "-")] == ["1024", "unavailable", "no", "CUDA", "device"]
