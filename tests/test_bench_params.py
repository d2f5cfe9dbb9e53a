"""Parameter grids, skipped combinations, peers and Ctrl-C in the micro scenario.

Runs use the micro-quick suite narrowed to one or two ops, so each takes a few seconds.
"""

import json
import os
import sys

import pytest

from replaybench.bench import contract, derive, driver, peers, results, rowstore, suites, summary
from replaybench.bench.arguments import grid_param
from replaybench.bench.scenarios import Selection, SelectionError, micro
from replaybench.impl import registry

from test_bench import ROOT, bench_cmd, interrupt_run, only_run_dir  # noqa: F401 - shared helpers


def quiet(*_):
    pass


def test_param_parsing():
    assert grid_param("K=2,4,8") == ("K", [2, 4, 8])
    assert grid_param("dtype=float32,float64") == ("dtype", ["float32", "float64"])
    assert grid_param("batch=2**5, 64") == ("batch", [32, 64])
    assert grid_param("stratified=true") == ("stratified", [True])
    assert grid_param("eps=1e-6") == ("eps", [1e-6])
    assert micro.param_grid({"K": [2, 4], "batch": [32]}) == [{"K": 2, "batch": 32}, {"K": 4, "batch": 32}]
    assert micro.param_grid({}) == [{}]


ECHO_PLUGIN = '''
from replaybench.impl import registry

def echo_buffer(capacity, fields, **params):
    raise RuntimeError(f"echo got {sorted(params.items())}")

registry.register("echo", echo_buffer, structure="echo", params={"K": 2}, description="raises with its params")
'''


def plugin_env(tmp_path, source, module, name):
    plugin = tmp_path / "plugin"
    plugin.mkdir()
    (plugin / f"{module}.py").write_text(source)
    dist = plugin / f"{module}-0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module.replace('_', '-')}\nVersion: 0.0\n")
    (dist / "entry_points.txt").write_text(f"[{registry.ENTRY_POINT_GROUP}]\n{name} = {module}\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin), str(ROOT)])}


def test_param_reaches_the_worker_and_the_rows(tmp_path):
    """--param K=... goes to registry.create in the pyperf worker and into the K/params columns."""
    env = plugin_env(tmp_path, ECHO_PLUGIN, "rb_echo_variant", "echo")
    out = tmp_path / "results"
    proc = bench_cmd("run", "--suite", "micro-quick", "--variants", "echo,kary-aligned", "--ops", "sample",
                     "--param", "K=4,8", "--out", str(out), "--no-progress", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = only_run_dir(out)
    rows = [r for r in results.read_rows(run_dir) if r["variant"] != "harness"]
    echo = {r["K"]: r for r in rows if r["variant"] == "echo"}
    assert set(echo) == {4, 8}
    for k, r in echo.items():  # the worker's registry.create saw exactly the grid value
        assert r["status"] == "failed" and f"('K', {k})" in r["error"], r["error"]
    ok = [r for r in rows if r["variant"] == "kary-aligned"]
    assert {r["status"] for r in ok} == {"ok"} and {r["K"] for r in ok} == {4, 8}
    assert {json.loads(r["params"])["K"] for r in ok} == {4, 8}
    for r in ok:  # what "auto" chose in the worker, as this process's buffer chooses it
        p = json.loads(r["params"])
        chose = registry.create("kary-aligned", r["capacity"], derive.SCHEMAS[r["transitions"]],
                                K=p["K"]).resolved_params
        assert (p["resolved_storage"], p["resolved_prefetch"]) == (chose["storage"], chose["prefetch"])
    assert (run_dir / "pyperf" / "kary-aligned__1024__sample__K-8.json").exists()
    meta = results.read_meta(run_dir)
    assert meta["selection"]["params"] == {"K": [4, 8]}
    assert "K=8" in proc.stdout  # the summary shows the grid parameter


def test_combinations_a_variant_cannot_take_are_skipped_with_the_reason(tmp_path):
    suite = suites.load("micro-quick")
    run_dir = driver.run(suite, Selection(variants=["binary", "kary-aligned", "kary", "peer:cpprb"], ops=["update"],
                                          params={"K": [2, 3]}), out=tmp_path, progress=False, echo=quiet)
    rows = results.read_rows(run_dir)
    by = {(r["variant"], r["K"]): r for r in rows if r["variant"] != "harness"}
    assert len(by) == 8
    assert by[("binary", 2)]["status"] == by[("binary", 3)]["status"] == "skipped"
    assert "does not take" in by[("binary", 2)]["error"] and "'K'" in by[("binary", 2)]["error"]
    assert by[("kary-aligned", 3)]["status"] == "skipped" and "power of 2" in by[("kary-aligned", 3)]["error"]
    assert by[("kary-aligned", 2)]["status"] == "ok"
    assert by[("kary", 2)]["status"] == by[("kary", 3)]["status"] == "ok"  # the unaligned layout takes any K
    if by[("peer:cpprb", 2)]["status"] != "unavailable":
        assert by[("peer:cpprb", 2)]["status"] == "ok"  # K=2 is cpprb's own fan-out
        assert by[("peer:cpprb", 3)]["status"] == "skipped" and "fixed K=2" in by[("peer:cpprb", 3)]["error"]
    for r in rows:
        if r["status"] == "skipped":
            assert r["value"] is None and r["error"]
    meta = results.read_meta(run_dir)
    assert meta["complete"] is True and meta["items_by_status"]["skipped"] >= 3
    assert not list((run_dir / "pyperf").glob("binary__*"))  # skipped cells never ran
    text = summary.format_run(run_dir)
    assert "skipped" in text and "power of 2" in text


def test_suite_params_grid_as_data_and_workload_params(tmp_path):
    suite = {**suites.load("micro-quick"), "name": "grid", "params": {"batch": [32, 64]}}
    path = tmp_path / "grid.json"
    path.write_text(json.dumps(suite))
    loaded = suites.load(str(path))
    run_dir = driver.run(loaded, Selection(variants=["binary"], ops=["sample", "insert_one"]), out=tmp_path / "r",
                         progress=False, echo=quiet)
    rows = [r for r in results.read_rows(run_dir) if r["variant"] == "binary"]
    sample = {r["batch"]: r for r in rows if r["op"] == "sample"}
    assert set(sample) == {32, 64} and all(r["status"] == "ok" for r in sample.values())
    assert {r["items_per_call"] for r in rows if r["op"] == "sample"} == {32, 64}
    text = summary.format_run(run_dir)
    assert "batch=32" in text and "batch=64" in text
    bad = {**suite, "params": {"K": []}}
    path.write_text(json.dumps(bad))
    with pytest.raises(SelectionError, match="params"):  # refused when the suite is expanded
        driver.plan(suites.load(str(path)))


def test_sweep_suites_and_default_are_declared():
    for name in ("micro-sweep-capacity", "micro-sweep-k", "micro-sweep-batch"):
        s = suites.load(name)
        assert s["scenario"] == "micro"
    assert suites.load("micro-sweep-capacity")["capacities"] == [2**k for k in range(10, 25, 2)]
    assert suites.load("micro-sweep-k")["params"]["K"][0] == 2 and suites.load("micro-sweep-k")["params"]["K"][-1] == 64
    assert suites.load("micro-sweep-batch")["params"]["batch"] == [32, 64, 128, 256, 512, 1024]
    default = suites.load("default")
    assert "micro" in default["suites"]  # what `make bench` runs


def test_composite_suite_runs_each_sub_suite_and_outside_scenarios(tmp_path, monkeypatch):
    """Sub-suites run in order, each under <run_id>-<name>, the scenario named by each suite
    (a module of bench/scenarios or any importable module)."""
    calls = []

    def fake_execute(plan, **kwargs):
        calls.append((plan.suite["name"], plan.scenario.name, kwargs.get("run_id")))
        return tmp_path / plan.suite["name"]

    monkeypatch.setattr(driver, "execute", fake_execute)
    (tmp_path / "rb_custom_scenario.py").write_text(
        "from replaybench.bench.scenarios import Cell, Scenario\n\n"
        "class Custom(Scenario):\n    name = 'custom'\n\n"
        "    def cells(self, suite, selection):\n        return [Cell('one', {'op': 'x'})]\n\n"
        "SCENARIO = Custom()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    hook = tmp_path / "hooked.json"
    hook.write_text(json.dumps({"name": "hooked", "scenario": "rb_custom_scenario"}))
    composite = {"name": "both", "suites": ["micro-quick", str(hook)]}
    out = driver.run_suites(composite, run_id="r", echo=quiet)
    assert calls == [("micro-quick", "micro", "r-micro-quick"), ("hooked", "custom", "r-hooked")]
    assert out == [tmp_path / "micro-quick", tmp_path / "hooked"]
    hook.write_text(json.dumps({"name": "old", "runner": "rb_custom_scenario:run"}))
    with pytest.raises(ValueError, match="runner"):  # the pre-driver hook is refused, not silently ignored
        suites.load(str(hook))


def test_bogus_peer_is_recorded_unavailable(tmp_path, monkeypatch):
    scratch = peers.PEERS.copy()  # the registration ends with the test
    scratch.register("bogus", "replaybench.bench.peers.no_such_adapter_module", origin="test")
    monkeypatch.setattr(peers, "PEERS", scratch)
    suite = {**suites.load("micro-quick"), "peers": ["bogus"]}
    run_dir = driver.run(suite, Selection(variants=["peer:bogus", "binary"], ops=["sample"]), out=tmp_path,
                         progress=False, echo=quiet)
    rows = {r["variant"]: r for r in results.read_rows(run_dir)}
    assert rows["peer:bogus"]["status"] == "unavailable"
    assert "no_such_adapter_module" in rows["peer:bogus"]["error"]
    assert rows["binary"]["status"] == "ok"  # the others go on
    assert "unavailable" in summary.format_run(run_dir)
    meta = results.read_meta(run_dir)
    assert meta["variants"]["peer:bogus"]["available"] is False


def test_peer_capacity_limit_is_a_skip(tmp_path, monkeypatch):
    from replaybench.bench.peers import tianshou_peer

    monkeypatch.setattr(tianshou_peer, "version", lambda: "0.0 (simulated)")  # available without running it
    cells = micro.SCENARIO.cells(suites.load("micro-quick"), Selection(variants=["peer:tianshou"],
                                                                  capacities=[2**16, 2**20], ops=["sample"]))
    assert [bool(c.skip) for c in cells[1:]] == [False, True]
    assert cells[2].skip == tianshou_peer.MAX_CAPACITY_REASON and "walks every index" in cells[2].skip


def test_summary_best_peer_ratio(tmp_path):
    writer = results.RunWriter(tmp_path, "r1", {"scenario": "micro"})
    base = {"schema_version": 1, "run_id": "r1", "scenario": "micro", "op": "sample", "capacity": 1024,
            "batch": 256, "transitions": "cartpole", "metric": "seconds_per_call", "unit": "s",
            "items_per_call": 256, "status": "ok"}
    for variant, seconds in (("binary", 1e-4), ("peer:slow", 4e-4), ("peer:fast", 2e-4), ("mine", 5e-5)):
        writer.append([{**base, "variant": variant, "value": seconds, "repeat": 0}])
    writer.append([{**base, "capacity": 2048, "variant": "mine", "value": 1e-4, "repeat": 0}])
    writer.finish(True)
    text = summary.format_run(tmp_path / "r1")
    assert "x best peer" in text
    line = next(ln for ln in text.splitlines() if " mine " in ln and ln.strip().startswith("1024"))
    cells = line.split()
    assert cells[-3:] == ["2.00", "4.00", "fast"]  # x binary, x best peer, which peer
    other = next(ln for ln in text.splitlines() if " mine " in ln and ln.strip().startswith("2048"))
    assert other.split()[-2:] == ["-", "-"]  # no peer measured at that capacity
    cells = [{**c["row"], "median": c["median"]}
             for c in derive.summarize_cells(results.read_rows(tmp_path / "r1")).values()]
    assert {r["best_peer"] for r in contract.reference_ratios(cells)} == {"peer:fast", None}  # None: at 2048


@pytest.mark.slow  # 9 s; make test keeps the two-item interrupt (test_bench) and the toy one (test_driver)
def test_sigint_after_first_item_leaves_readable_incomplete_run(tmp_path):
    cmd = [sys.executable, "-m", "replaybench.bench", "run", "--suite", "micro-quick", "--out", str(tmp_path), "--no-progress"]
    code, output = interrupt_run(cmd, tmp_path, bool)  # the first item (timing-loop overhead) is on disk
    assert code == 130, output
    run_dir = only_run_dir(tmp_path)
    header, columns = rowstore.read_parquet(run_dir / "rows.parquet")  # an interrupted run is compacted too
    assert header == results.COLUMNS
    raw = [dict(zip(header, values)) for values in zip(*columns.values())]
    assert raw and raw[0]["op"] == "empty"
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["complete"] is False and meta["interrupted"] is True
    assert 1 <= meta["items_done"] < meta["items_total"]
    assert not list(run_dir.glob(".*tmp"))


def test_headline_joins_micro_and_cache_rows(tmp_path):
    """make bench's closing table: throughput medians from micro rows, misses from cache rows."""
    def write(run_id, rows):
        w = results.RunWriter(tmp_path, run_id, {})
        w.append([{"schema_version": 1, "run_id": run_id, "status": "ok", "capacity": 2**20, **r} for r in rows])
        return w.dir

    micro = write("m", [
        {"scenario": "micro", "variant": v, "op": "sample", "metric": "seconds_per_call", "value": sec,
         "items_per_call": 256} for v, sec in (("binary", 256e-6), ("kary-aligned", 128e-6), ("peer:cpprb", 512e-6))])
    cache = write("c", [
        {"scenario": "cache", "variant": "kary-aligned", "op": "sample", "metric": "misses_per_op", "method": "model",
         "stream": "tree", "level": level, "value": value, "items_per_call": 256}
        for level, value in (("L1d", 512.0), ("LL", 128.0))])
    threads = write("t", [
        {"scenario": "micro", "variant": "kary-aligned", "op": "sample", "metric": "seconds_per_call", "value": sec,
         "threads": t, "items_per_call": 256 * t} for t, sec in ((1, 64e-6), (2, 80e-6))])
    text = summary.format_headline([micro, cache, threads, tmp_path / "missing"])
    line = next(ln for ln in text.splitlines() if ln.startswith("kary-aligned"))
    cells = line.split()
    assert cells[1] == "2.00"          # 256 / 128e-6 = 2 M/s: the threads run's one-thread rows are not merged in
    assert cells[5:7] == ["2.00", "0.50"]  # misses per transition: 512/256, 128/256
    assert cells[-3:] == ["2.00", "4.00", "1.60"]  # x binary (1 M/s), x best peer (0.5 M/s), 2 threads x 1
    assert summary.format_headline([tmp_path / "missing"]) == ""


def test_threads_workload_runs_each_thread_on_its_own_buffer(tmp_path):
    """threads=2: the worker times two threads at once, a call counts both threads' items, and the
    summary gives 2 threads over 1 of the same cell."""
    suite = {**suites.load("micro-quick"), "name": "thr", "params": {"threads": [1, 2, 3]}}
    path = tmp_path / "thr.json"
    path.write_text(json.dumps(suite))
    run_dir = driver.run(suites.load(str(path)), Selection(variants=["kary-prefix"], ops=["sample"]),
                         out=tmp_path / "r", progress=False, echo=quiet)
    rows = [r for r in results.read_rows(run_dir) if r["variant"] == "kary-prefix"]
    by = {r["threads"]: r for r in rows}
    assert set(by) == {1, 2, 3} and {r["status"] for r in rows} == {"ok"}
    assert by[2]["items_per_call"] == 2 * by[1]["items_per_call"]
    assert "threads" not in json.loads(by[2]["params"] or "{}")  # a column of its own
    text = summary.format_run(run_dir)
    assert "threads=2" in text and "x 1 thread" in text
    shares = results.read_meta(run_dir)["gil_share"]  # measured for the threaded sample cell's variant
    assert [(g["variant"], g["capacity"]) for g in shares] == [("kary-prefix", 1024)]
    assert 0.0 <= shares[0]["gil_share"] <= 1.0 and shares[0]["gil_pair"]["ratio"] > 0
    (three,) = shares[0]["gil_threads"]  # the handovers among 3 threads, measured beside the 3-thread cell
    assert three["threads"] == 3 and 0 < three["ratio_min"] <= three["ratio"] <= three["ratio_max"]
    lines = [ln.split() for ln in text.splitlines() if ln.startswith("sample") and " kary-prefix " in ln]
    assert [ln[3] for ln in lines] == ["2", "3"] and float(lines[0][4]) > 0
    assert lines[0][8] == f"{shares[0]['gil_pair']['ratio']:.2f}" and lines[1][8] == f"{three['ratio']:.2f}"


def test_bad_threads_is_refused_before_anything_runs(tmp_path):
    suite = {**suites.load("micro-quick"), "name": "thr", "threads": 0}
    path = tmp_path / "thr.json"
    path.write_text(json.dumps(suite))
    with pytest.raises(SelectionError, match="threads=0"):
        driver.plan(suites.load(str(path)))
    with pytest.raises(SelectionError, match="threads"):
        driver.plan(suites.load("micro-quick"), Selection(params={"threads": [1, "x"]}))


def test_thread_scaling_table_pairs_each_cell_with_its_one_thread_cell():
    base = {"scenario": "micro", "op": "sample", "capacity": 1024, "batch": 256, "transitions": "cartpole",
            "metric": "seconds_per_call", "unit": "s", "status": "ok", "variant": "v"}
    rows = [{**base, "threads": 1, "items_per_call": 256, "value": 1e-4},
            {**base, "threads": 1, "items_per_call": 256, "value": 2e-4},
            {**base, "threads": 2, "items_per_call": 512, "value": 1e-4},
            {**base, "threads": 2, "items_per_call": 512, "value": 1e-4},
            {**base, "variant": "w", "threads": 2, "items_per_call": 512, "value": 1e-4}]  # no 1-thread cell
    lines = summary.format_threads(derive.summarize_cells(rows))
    body = [ln.split() for ln in lines[3:]]
    assert body == [["sample", "1024", "v", "2", f"{5.12e6 / 1.92e6:.2f}", "2.00-4.00", "-", "-", "-", "-"]]
    assert derive.summarize(rows)[("sample", 1024, "v")]["n"] == 2  # one thread's rows only
    shares = [{"variant": "v", "capacity": 1024, "gil_share": 0.25}]
    memory = {"sizes": [{"bytes": 2**10, "latency_ns": 5.0, "gather_ns": 2.0, "gather_ns_2threads": 1.25},
                        {"bytes": 2**30, "latency_ns": 5.0, "gather_ns": 2.0, "gather_ns_2threads": 1.25}]}
    line = summary.format_threads(derive.summarize_cells(rows), shares, memory)[3].split()
    assert line[-4:] == ["0.25", f"{2 / 1.25:.2f}", "-", "1.60"]  # Amdahl with the GIL-held quarter serial; 2 / 1.25
    shares[0]["gil_pair"] = {"ratio": 1.07, "ratio_min": 0.9, "ratio_max": 1.2}  # measured here: the handover's cost
    line = summary.format_threads(derive.summarize_cells(rows), shares, memory)[3].split()
    assert line[-4:] == ["0.25", f"{2 / 1.25:.2f}", "1.07", "1.60"]
