"""A floor that holds (issue 25 item 5): each op's floor is the cost of its own access pattern,
run by bench.floors, and no measured op in a stored run beats it by more than the noise margin
(bench.derive.FLOOR_NOISE)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from replaybench.bench import contract, derive, floors, summary

RESULTS = Path(__file__).resolve().parent.parent / "results"
REFERENCE_MICRO = RESULTS / "reference-micro"


def _floors(**per_capacity):
    sizes = [{"capacity": 2**int(k[1:]), **v} for k, v in per_capacity.items()]
    return {"batch": 256, "K": 16, "row_bytes": 45, "leaf_bytes": 4, "sizes": sizes}


def _row(variant, capacity, op, seconds, structure=None, batch=256, transitions="cartpole"):
    return {"scenario": "micro", "variant": variant, "structure": structure or variant, "capacity": capacity,
            "batch": batch, "threads": 1, "transitions": transitions, "op": op, "metric": contract.TIMING_METRIC,
            "value": seconds, "items_per_call": batch, "status": contract.MEASURED}


# ---------------------------------------------------------------------------- the arithmetic
def test_op_floor_interpolates_log_log_and_never_extrapolates():
    f = _floors(p10={"sample_ns": 10.0}, p20={"sample_ns": 1000.0})
    assert derive.op_floor_ns(f, "sample_ns", 2**10) == 10.0
    assert derive.op_floor_ns(f, "sample_ns", 2**20) == 1000.0
    assert derive.op_floor_ns(f, "sample_ns", 2**15) == pytest.approx(100.0)  # halfway in log-log
    assert derive.op_floor_ns(f, "sample_ns", 2**9) is None
    assert derive.op_floor_ns(f, "sample_ns", 2**21) is None
    assert derive.op_floor_ns(_floors(p12={"sample_ns": 3.0}), "sample_ns", 2**12) == 3.0


def test_floor_rows_fraction_beats_and_no_floor():
    f = _floors(p16={"sample_ns": 20.0, "rows_ns": 10.0, "descent_ns": 8.0, "update_ns": 16.0})
    per_call = 256e-9  # seconds per call of 256 items: 1 ns per item
    rows = [_row("kary", 2**16, "sample", 40 * per_call), _row("kary", 2**16, "sample", 50 * per_call),
            _row("kary", 2**16, "update", 12 * per_call),  # 16 / 12 = 1.33: beats by more than 25 %
            _row("kary", 2**16, "sample_indices", 9 * per_call),  # 8 / 9: within
            _row("uniform", 2**16, "sample", 20 * per_call), _row("uniform", 2**16, "update", 1 * per_call),
            _row("kary", 2**16, "insert_batch", 1 * per_call)]
    out = {(b["op"], b["variant"]): b for b in derive.floor_rows(derive.summarize(rows), rows, {"op_floors": f})}
    assert set(out) == {("sample", "kary"), ("update", "kary"), ("sample_indices", "kary"), ("sample", "uniform")}
    s = out["sample", "kary"]
    ns = 2 / (1 / 40 + 1 / 50)  # the median of two rates is their mean
    assert s["ns_per_item"] == pytest.approx(ns) and s["best_ns"] == pytest.approx(40.0)
    assert s["floor_ns"] == 20.0 and s["of_floor"] == pytest.approx(20 / ns) and not s["beats"]
    assert out["update", "kary"]["beats"] and out["update", "kary"]["of_floor"] == pytest.approx(16 / 12)
    assert not out["sample_indices", "kary"]["beats"]
    assert out["sample", "uniform"]["floor_ns"] == 10.0 and out["sample", "uniform"]["of_floor"] == pytest.approx(0.5)
    # the margin: 25 % faster than the floor is noise, more is not
    edge = [_row("kary", 2**16, "sample", 20 / (1 + derive.FLOOR_NOISE) * 1.001 * per_call)]
    assert not derive.floor_rows(derive.summarize(edge), edge, {"op_floors": f})[0]["beats"]
    # no floor measured: no probe, another batch, another row size, a capacity not probed
    for rows_, limits in ((rows, {}), ([_row("kary", 2**16, "sample", per_call, batch=32)], {"op_floors": f}),
                          ([_row("kary", 2**16, "sample", per_call, transitions="atari")], {"op_floors": f}),
                          ([_row("kary", 2**20, "sample", per_call)], {"op_floors": f})):
        got = derive.floor_rows(derive.summarize(rows_), rows_, limits)
        assert got and all(b["floor_ns"] is None and b["of_floor"] is None and not b["beats"] for b in got)


# ------------------------------------------------------------------------------- the probe
def test_tree_groups():
    assert floors.tree_groups(2**20, 16) == [1, 16, 256, 4096, 65536]
    assert floors.tree_groups(1000, 16) == [1, 4, 63]
    assert floors.tree_groups(2, 2) == [1]


def test_op_floors_probe_on_a_tiny_size():
    f = floors.op_floors([2**10, 2**12], draws=512, repeats=1)
    assert [s["capacity"] for s in f["sizes"]] == [2**10, 2**12] and f["draws"] == 512
    assert (f["batch"], f["K"], f["row_bytes"]) == (256, 16, 45)
    for s in f["sizes"]:
        assert s["levels"] == len(floors.tree_groups(s["capacity"], 16))
        assert all(math.isfinite(s[k]) and s[k] > 0 for k in floors.FLOOR_KEYS)
        assert s["sample_ns"] == min(s["sample_fused_ns"], s["descent_ns"] + s["rows_ns"])
    assert "descent" in floors.format_floors(f)
    # the result is one the contract accepts in meta.json
    assert contract._meta_type_error({"memory_limits": {"sizes": [], "op_floors": f}}) is None


@pytest.mark.parametrize("kwargs, name", [({"capacities": [1]}, "capacities"), ({"capacities": []}, "capacities"),
                                          ({"batch": 0}, "batch"), ({"k": 1}, "k"), ({"leaf_bytes": 8}, "leaf_bytes"),
                                          ({"draws": True}, "draws"), ({"capacities": [2**26]}, "GiB")])
def test_op_floors_rejects_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        floors.op_floors(**{"capacities": [2**10], **kwargs})


# ------------------------------------------------------------------ stored runs hold their floors
def _micro_runs():
    for meta_path in sorted(RESULTS.glob("*/meta.json")):
        meta = json.loads(meta_path.read_text())
        if meta.get("scenario") == "micro" and meta.get("memory_limits"):
            yield meta_path.parent, meta


def test_no_stored_run_beats_its_floor():
    checked = []
    for run_dir, meta in _micro_runs():
        rows = contract.read_rows(run_dir)
        stats = derive.summarize(rows)
        limits = meta["memory_limits"]
        got = derive.floor_rows(stats, rows, limits)
        beaten = [b for b in got if b["beats"]]
        assert not beaten, f"{run_dir.name}: ops beat their floor by more than {derive.FLOOR_NOISE:.0%}: {beaten}"
        if not limits.get("op_floors"):
            assert all(b["floor_ns"] is None for b in got)  # no floor measured, none invented
            # what these runs did measure still holds: one random line per item (the gather floor)
            for b in derive.bound_rows(stats, rows, limits):
                assert b["ns_per_item"] * (1 + derive.FLOOR_NOISE) >= b["gather_ns"], (run_dir.name, b)
        checked.append(run_dir.name)
    assert "reference-micro" in checked


def test_summary_says_no_floor_measured_for_a_run_without_one():
    rows, meta = contract.read_rows(REFERENCE_MICRO), contract.read_meta(REFERENCE_MICRO)
    limits = {k: v for k, v in meta["memory_limits"].items() if k != "op_floors"}  # as a run before the probe
    text = summary.format_rows(rows, {**meta, "memory_limits": limits})
    assert "no floor measured" in text
    f = _floors(p16={"sample_ns": 5.0, "rows_ns": 4.0, "descent_ns": 2.0, "update_ns": 3.0})
    text = summary.format_rows(rows, {**meta, "memory_limits": {**limits, "op_floors": f}})
    lines = [line.split() for line in text.splitlines() if line.split()[:3] == ["2^16", "update", "kary-aligned"]]
    assert lines and lines[-1][4] == "3.0" and lines[-1][5] == f"{3.0 / float(lines[-1][3]):.3f}"
    at_20 = [line.split() for line in text.splitlines() if line.split()[:3] == ["2^20", "sample", "kary"]]
    assert at_20 and at_20[-1][4:] == ["no", "floor", "measured", "-"]  # the fake probe measured 2^16 only


@pytest.mark.slow
def test_reference_micro_holds_the_floor_measured_here():
    """The stored reference run predates the probe: run it here (same kind of machine) at the
    run's capacities and check the run's ops against it."""
    meta = contract.read_meta(REFERENCE_MICRO)
    if meta["machine"].get("cpu_model") not in Path("/proc/cpuinfo").read_text():
        pytest.skip("not the machine kind the reference run was measured on")
    rows = contract.read_rows(REFERENCE_MICRO)
    f = floors.op_floors(sorted({r["capacity"] for r in rows if r.get("capacity")}))
    got = derive.floor_rows(derive.summarize(rows), rows, {"op_floors": f})
    assert got and all(b["floor_ns"] is not None for b in got)
    assert not [b for b in got if b["beats"]]
