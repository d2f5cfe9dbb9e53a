"""The benchmark harness end to end: list, a quick run, failures, unavailable peers, Ctrl-C.

The runs use the 'quick' suite (capacity 2**10, one worker process per item, fixed loops),
so each takes seconds once numba's kernels are in the on-disk cache. The module fixture runs
the quick suite on every variant, but only the ops :data:`COVER_OPS` and the peers
:data:`COVER_PEERS` (a pyperf manager process per item, and a torch import per torch-based peer's
worker, are most of the cost); every variant x op's and peer's workload is built and timed in
process by ``test_every_variant_runs_every_quick_op`` and ``test_every_peer_runs_its_quick_ops``;
the whole quick suite (what `make
bench-quick` runs, every variant x op through pyperf) is the slow test
``test_whole_quick_suite_measures_every_variant_and_op``.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from replaybench.bench import derive, driver, results, rowstore, suites, summary, workloads
from replaybench.bench.scenarios import Selection
from replaybench.impl import registry

ROOT = Path(__file__).resolve().parent.parent
QUICK_OPS = ["insert_one", "insert_batch", "sample", "update", "mixed"]
#: The ops the default run's quick fixture measures on every variant: 'mixed' calls add, sample and
#: update; 'sample' is the summary's headline op. (binary's other ops go through pyperf in
#: test_bench_params, test_driver and the failure and interrupt tests below.)
COVER_OPS = ["sample", "mixed"]
PEERS = ["peer:cpprb", "peer:tianshou", "peer:torchrl"]
#: The peer the default run's quick fixture measures through pyperf: the torch-based peers cost a
#: fresh torch import per worker; all peers are built and timed in process below.
COVER_PEERS = ["peer:cpprb"]


def bench_cmd(*args, env=None, timeout=180):
    return subprocess.run([sys.executable, "-m", "replaybench.bench", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def only_run_dir(out: Path) -> Path:
    dirs = [p for p in out.iterdir() if p.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]


def run_quick(out: Path, ops: list[str], peers: list[str]):
    """`replaybench run` of the quick suite limited to ``ops`` and ``peers`` (the peers keep the
    suite's peer_ops): (the finished process, its run folder)."""
    suite = suites.load("micro-quick")
    args = ["--suite", "micro-quick"]
    if ops != suite["ops"] or peers != PEERS:
        path = out.parent / f"{out.name}-quick.json"  # the quick suite as a file, with fewer ops or peers
        path.write_text(json.dumps({**suite, "ops": ops, "peers": [p.removeprefix("peer:") for p in peers]}))
        args = ["--suite", str(path)]
    # a hang guard, not a speed check: the whole grid takes a minute on 2 idle cores, many on busy ones
    proc = bench_cmd("run", *args, "--out", str(out), "--no-progress", timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc, only_run_dir(out)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    return run_quick(tmp_path_factory.mktemp("results"), COVER_OPS, COVER_PEERS)


def test_list_shows_every_registered_variant_and_the_peer():
    proc = bench_cmd("list")
    assert proc.returncode == 0, proc.stderr
    names = [line.split()[0] for line in proc.stdout.splitlines()[2:] if line.strip()]
    assert set(registry.names()) <= set(names)
    assert {"peer:cpprb", "peer:tianshou", "peer:torchrl"} <= set(names)
    assert "K=16" in proc.stdout  # parameters are shown


def test_quick_run_writes_tidy_rows(quick_run):
    """The quick run's rows validate against the schema, one measured row per value of every
    variant x op."""
    check_quick_rows(quick_run[1], COVER_OPS, COVER_PEERS)


@pytest.mark.slow  # ~80 s: 34 pyperf managers; the default run covers each variant and op (see the docstring)
def test_whole_quick_suite_measures_every_variant_and_op(tmp_path):
    """`make bench-quick`: every variant x op and every peer measured, rows and meta complete."""
    _, run_dir = run_quick(tmp_path / "results", QUICK_OPS, PEERS)
    check_quick_rows(run_dir, QUICK_OPS, PEERS)
    check_quick_meta(run_dir, QUICK_OPS, PEERS)


@pytest.mark.parametrize("op", QUICK_OPS)
@pytest.mark.parametrize("variant", registry.names())
def test_every_variant_runs_every_quick_op(variant, op):
    """Each variant x op of the quick suite, in process: the worker's untimed set-up (build,
    fill, input pools, one call) and its timed loop, on the suite's own workload settings."""
    suite = suites.load("micro-quick")
    call = workloads.warmed_call(op, variant, capacity=suite["capacities"][0], fields=derive.SCHEMAS[suite["transitions"]],
                                 batch=suite["batch"], mixed_adds=suite["mixed_adds"], seed=suite["seed"])
    assert 0 < workloads.time_calls(call, 4) < 10


@pytest.mark.parametrize("peer", PEERS)
def test_every_peer_runs_its_quick_ops(peer):
    """Each peer on the quick suite's peer_ops, in process (as test_every_variant_runs_every_quick_op)."""
    from replaybench.bench import peers

    suite = suites.load("micro-quick")
    try:
        peers.load(peer).version()
    except ImportError as err:
        pytest.skip(f"{peer} is not installed: {err}")
    for op in suite["peer_ops"]:
        call = workloads.warmed_call(op, peer, capacity=suite["capacities"][0], fields=derive.SCHEMAS[suite["transitions"]],
                                     batch=suite["batch"], mixed_adds=suite["mixed_adds"], seed=suite["seed"])
        assert 0 < workloads.time_calls(call, 4) < 10


def check_quick_rows(run_dir: Path, ops: list[str], peers: list[str]) -> None:
    """The rows of a quick run of ``ops`` and ``peers`` (every variant) validate against the schema."""
    assert not (run_dir / "rows.csv").exists()  # compacted when the run ended
    header, columns = rowstore.read_parquet(run_dir / "rows.parquet")
    assert header == results.COLUMNS
    raw = [dict(zip(header, values)) for values in zip(*columns.values())]
    rows = results.read_rows(run_dir)
    assert len(rows) == len(raw) > 0
    assert all(isinstance(json.loads(r["params"]), dict) for r in raw)
    assert {r["variant"] for r in rows} == {"harness", *registry.names(), *peers}
    meta = results.read_meta(run_dir)
    unavailable = {v for v, info in meta["variants"].items() if not info["available"]}
    assert unavailable <= set(peers)  # only an optional peer may be missing, and then it says why
    settings = suites.load("micro-quick")["pyperf"]
    per_item = settings["processes"] * settings["values"]
    suite = suites.load("micro-quick")
    for variant in [*registry.names(), *peers]:
        for op in suite["peer_ops"] if variant in peers else ops:
            mine = [r for r in rows if r["variant"] == variant and r["op"] == op]
            if variant in unavailable:
                assert [r["status"] for r in mine] == ["unavailable"] and mine[0]["error"]
                continue
            assert len(mine) == per_item, (variant, op)
            assert {r["status"] for r in mine} == {"ok"}, (variant, op, mine[0].get("error"))
            assert sorted(r["repeat"] for r in mine) == list(range(per_item))
    for r in rows:
        assert r["schema_version"] == results.SCHEMA_VERSION
        assert r["run_id"] == run_dir.name
        assert r["status"] in results.STATUSES
        assert r["scenario"] == "micro" and r["policy"] == "none"
        assert r["metric"] == "seconds_per_call" and r["unit"] == "s"
        assert isinstance(r["dirty"], bool) or r["dirty"] is None
        if r["status"] != "ok":
            assert r["value"] is None and r["error"]
            continue
        assert r["threads"] == 1
        assert isinstance(r["value"], float) and 0 < r["value"] < 1
        assert r["loops"] == settings["loops"]
        if r["variant"] != "harness":
            assert r["capacity"] == 1024
            assert r["dtype"] in ("float32", "float64") or r["variant"] == "uniform"  # uniform has no tree
            assert r["items_per_call"] == {"insert_one": 1, "mixed": 1}.get(r["op"], 256)
    assert {r["K"] for r in rows if r["variant"] == "kary-aligned"} == {16}
    assert {r["op"] for r in rows if r["variant"] == "harness"} == {"empty"}


def test_quick_run_meta_and_raw_pyperf(quick_run):
    check_quick_meta(quick_run[1], COVER_OPS, COVER_PEERS)


def check_quick_meta(run_dir: Path, ops: list[str], peers: list[str]) -> None:
    """meta.json and the raw pyperf files of a quick run of ``ops`` and ``peers``."""
    import pyperf

    meta = results.read_meta(run_dir)
    assert meta["complete"] is True and meta["interrupted"] is False
    assert meta["run_id"] == run_dir.name and meta["schema_version"] == results.SCHEMA_VERSION
    for key in ("start_time", "end_time", "command", "git_sha", "dirty", "suite", "pyperf_settings"):
        assert key in meta, key
    suite_arg = meta["command"][meta["command"].index("--suite") + 1]  # the name, or the path of the test's copy
    assert suite_arg.endswith(("micro-quick", "-quick.json")) and meta["suite"]["name"] == "micro-quick"
    assert meta["machine"]["cpu_model"] and meta["machine"]["logical_cpus"] >= 1
    assert isinstance(meta["machine"]["caches"], list)
    for lib in ("numpy", "numba", "pyperf", "cpprb", "python"):
        assert lib in meta["libraries"]
    n_items = 1 + len(registry.names()) * len(ops) + len(peers) * len(suites.load("micro-quick")["peer_ops"])
    assert meta["items_total"] == meta["items_done"] == n_items
    assert 0 < meta["timing_overhead_s_per_call"] < 1e-5
    raw = sorted((run_dir / "pyperf").glob("*.json"))
    assert len(raw) == n_items - meta["items_by_status"]["unavailable"]
    bench = pyperf.Benchmark.load(str(run_dir / "pyperf" / "binary__1024__sample.json"))
    assert len(bench.get_values()) == 3


def test_run_prints_summary_and_summary_command_reprints_it(quick_run):
    proc, run_dir = quick_run
    assert "sample: M/s" in proc.stdout and "x binary" in proc.stdout and "Timing-loop overhead" in proc.stdout
    assert "x best peer" in proc.stdout
    again = bench_cmd("summary", str(run_dir))
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() in proc.stdout


FAILING_PLUGIN = '''
from replaybench.impl import registry

def failing_buffer(capacity, fields, **params):
    raise RuntimeError("injected failure for the bench tests")

registry.register("failing", failing_buffer, structure="failing", description="always raises")
'''


@pytest.mark.slow  # 10-16 s: `make test-slow` (keeps `make test` within its 10 minutes)
def test_failing_variant_is_recorded_and_the_rest_goes_on(tmp_path):
    # A plug-in variant discovered through the registry's entry-point group, from PYTHONPATH.
    plugin = tmp_path / "plugin"
    plugin.mkdir()
    (plugin / "rb_failing_variant.py").write_text(FAILING_PLUGIN)
    dist = plugin / "rb_failing_variant-0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: rb-failing-variant\nVersion: 0.0\n")
    (dist / "entry_points.txt").write_text(f"[{registry.ENTRY_POINT_GROUP}]\nfailing = rb_failing_variant\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin), str(ROOT)])}

    listed = bench_cmd("list", env=env)
    assert "failing" in listed.stdout

    out = tmp_path / "results"
    proc = bench_cmd("run", "--suite", "micro-quick", "--variants", "failing,binary", "--ops", "sample,update",
                     "--out", str(out), "--no-progress", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = only_run_dir(out)
    rows = results.read_rows(run_dir)
    failed = [r for r in rows if r["variant"] == "failing"]
    assert [(r["op"], r["status"]) for r in failed] == [("sample", "failed"), ("update", "failed")]
    assert all("RuntimeError: injected failure" in r["error"] for r in failed)
    assert all(r["value"] is None for r in failed)
    ok = [r for r in rows if r["variant"] == "binary"]
    assert {r["op"] for r in ok} == {"sample", "update"} and {r["status"] for r in ok} == {"ok"}
    meta = results.read_meta(run_dir)
    assert meta["complete"] is True and meta["items_by_status"]["failed"] == 2
    assert "Not measured" in proc.stdout and "injected failure" in proc.stdout


def test_unavailable_peer_is_recorded_not_dropped(tmp_path, monkeypatch):
    from replaybench.bench.peers import cpprb_peer

    def broken():
        raise ImportError("No module named 'cpprb' (simulated)")

    monkeypatch.setattr(cpprb_peer, "version", broken)
    suite = suites.load("micro-quick")
    run_dir = driver.run(suite, Selection(variants=["peer:cpprb"]), out=tmp_path, progress=False, echo=lambda *a: None)
    rows = results.read_rows(run_dir)
    peer_rows = [r for r in rows if r["variant"] == "peer:cpprb"]
    assert len(peer_rows) == len(suite.get("peer_ops", suite["ops"]))
    assert {r["status"] for r in peer_rows} == {"unavailable"}
    assert all("simulated" in r["error"] for r in peer_rows)
    meta = results.read_meta(run_dir)
    assert meta["variants"]["peer:cpprb"]["available"] is False
    assert "unavailable" in summary.format_run(run_dir)


def test_unknown_variant_is_an_error_before_anything_runs(tmp_path):
    proc = bench_cmd("run", "--suite", "micro-quick", "--variants", "no-such-variant", "--out", str(tmp_path))
    assert proc.returncode == 2
    assert "no-such-variant" in proc.stderr
    assert not any(tmp_path.iterdir())


def sigint_as_default():
    """Popen preexec_fn: a shell that runs `make test` in the background starts it with SIGINT
    ignored, and Python keeps an ignored SIGINT ignored; the child must see Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupt_run(cmd: list, out: Path, ready, env=None) -> tuple[int, str]:
    """Start the run ``cmd`` (writing under ``out``), wait (60 s at most) until ``ready(rows)``
    holds for the rows on disk, then send SIGINT to its process group as Ctrl-C in a terminal
    does; returns (exit status, output). The group is killed if it outlives the test."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, preexec_fn=sigint_as_default)
    try:
        deadline = time.monotonic() + 60
        while True:
            csvs = list(out.glob("*/rows.csv"))
            if csvs and ready(results.read_rows(csvs[0].parent)):
                break
            if proc.poll() is not None or time.monotonic() > deadline:  # nothing left to interrupt at
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                pytest.fail(f"the run never reached the rows to interrupt at:\n{proc.communicate()[0]}")
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        output, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, output


def test_find_workload_is_the_trees_find_of_uniform_draws_and_skips_treeless_buffers():
    """op find: one call is the tree's find of ``batch`` uniform draws in [0, total) from the
    workload's generator (draws timed, no weights); the uniform buffer and the peers have no
    tree to find in, so the scenario skips them with the reason instead of failing."""
    import dataclasses

    import numpy as np

    from replaybench.bench.scenarios import micro

    fields = derive.SCHEMAS["cartpole"]
    rng = np.random.default_rng(3)
    real = workloads.variant_target("kary-prefix", 1024, fields, np.random.default_rng(1), batch=16)
    workloads.fill(real, 1024, fields, rng)
    assert real.find == real.buffer.tree.find
    seen = []
    target = dataclasses.replace(real, find=lambda us: seen.append(us) or real.find(us))
    call = workloads.make_call("find", target, capacity=1024, fields=fields, batch=16, mixed_adds=1,
                               rng=np.random.default_rng(7))
    call(0)
    total = target.buffer.tree.total()
    assert np.array_equal(seen[0], np.random.default_rng(7).random(16) * total)
    with pytest.raises(ValueError, match="op 'find' needs a buffer with a sum tree"):
        workloads.make_call("find", workloads.variant_target("uniform", 64, fields, rng, batch=8), capacity=64,
                            fields=fields, batch=8, mixed_adds=1, rng=rng)
    infos = {v.name: v for v in micro.resolve_variants({"variants": "all", "peers": []}, None)}
    assert micro.op_skip_reason(infos["uniform"], "find") == "uniform has no sum tree to find in"
    assert micro.op_skip_reason(infos["kary-prefix"], "find") == ""
    assert micro.op_skip_reason(infos["uniform"], "sample") == ""


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the swallowed one, on purpose
def test_interrupt_latch_defers_inside_its_block_and_keeps_a_swallowed_interrupt():
    """A SIGINT sent inside ``deferred`` lands after it: the block's writes all happen. A SIGINT
    whose KeyboardInterrupt a finalizer swallowed (Python prints "Exception ignored in" and goes
    on; CI lost a run's Ctrl-C so) is still raised by ``check``. Python's default handler is put
    in place first: a library an earlier test imported may have left its own (the latch is then
    not installed, by design), which made a test like this fail in a fresh clone's full run."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _deferred_interrupt_lands_after_the_block()
        _swallowed_interrupt_is_kept()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert signal.getsignal(signal.SIGINT) is previous


def _deferred_interrupt_lands_after_the_block():
    done = []
    with pytest.raises(KeyboardInterrupt):
        with driver.interrupt_latch() as latch:
            with latch.deferred():
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.01)  # the handler has run by now: a plain handler would have raised here
                done.append("rest of the block")
    assert done == ["rest of the block"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with driver.interrupt_latch() as latch:
        with latch.deferred():  # no signal: nothing raised
            done.append("quiet")
        latch.check()
    assert done[-1] == "quiet"


def _swallowed_interrupt_is_kept():
    import weakref

    class Owner:
        pass

    def on_collect(ref):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)  # the KeyboardInterrupt is raised in here, where Python drops it

    with driver.interrupt_latch() as latch:
        owner = Owner()
        ref = weakref.ref(owner, on_collect)
        del owner  # runs on_collect: its KeyboardInterrupt is printed and dropped, not raised here
        assert ref() is None and latch.seen
        with pytest.raises(KeyboardInterrupt):
            latch.check()


def test_the_latch_is_not_installed_over_a_callers_handler():
    """Under a handler of the caller's own, the latch leaves it in place and never trips."""
    mine = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: mine.append(signum))
    try:
        with driver.interrupt_latch() as latch:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)
            latch.check()
        assert mine == [signal.SIGINT] and not latch.seen
    finally:
        signal.signal(signal.SIGINT, previous)


def test_interrupted_run_keeps_finished_items(tmp_path):
    cmd = [sys.executable, "-m", "replaybench.bench", "run", "--suite", "micro-quick", "--variants", "binary",
           "--out", str(tmp_path), "--no-progress"]
    code, output = interrupt_run(cmd, tmp_path, lambda rows: len({r["op"] for r in rows}) >= 2)  # two items on disk
    assert code == 130, output
    run_dir = only_run_dir(tmp_path)
    meta = results.read_meta(run_dir)
    assert meta["complete"] is False and meta["interrupted"] is True
    rows = results.read_rows(run_dir)
    assert len({r["op"] for r in rows}) >= 2 and {r["status"] for r in rows} == {"ok"}
    assert meta["items_done"] < meta["items_total"]


def test_writer_is_atomic_and_summary_computes_ratios(tmp_path):
    writer = results.RunWriter(tmp_path, "r1", {"scenario": "micro"})
    base = {"schema_version": 1, "run_id": "r1", "scenario": "micro", "op": "sample", "capacity": 1024,
            "metric": "seconds_per_call", "unit": "s", "items_per_call": 256, "status": "ok"}
    writer.append([{**base, "variant": "binary", "value": 1e-4, "repeat": i} for i in range(3)])
    writer.append([{**base, "variant": "fast", "value": 5e-5, "repeat": 0}])
    with pytest.raises(KeyError):
        writer.append([{**base, "variant": "x", "no_such_column": 1}])
    with pytest.raises(ValueError):
        writer.append([{**base, "variant": "x", "status": "weird"}])
    assert not list(tmp_path.glob("r1/.*tmp"))  # no temp files left behind
    assert results.read_meta(tmp_path / "r1")["complete"] is False
    writer.finish(True)
    assert results.read_meta(tmp_path / "r1")["complete"] is True
    stats = derive.summarize(results.read_rows(tmp_path / "r1"))
    assert stats[("sample", 1024, "binary")]["median"] == pytest.approx(256 / 1e-4)
    text = summary.format_run(tmp_path / "r1")
    fast_line = next(line for line in text.splitlines() if " fast " in line)
    assert fast_line.split()[-1] == "2.00"  # twice binary's throughput (no peer: no peer columns)


def test_a_copy_without_git_names_the_commit_its_copier_stated(tmp_path, monkeypatch):
    """Outside a git tree (the device machine's copy of the checkout) the sha and dirty flag
    come from REPLAYBENCH_GIT_SHA / REPLAYBENCH_GIT_DIRTY; unset, both are None; inside a git
    tree the variables are ignored."""
    from replaybench.bench import results

    monkeypatch.delenv("REPLAYBENCH_GIT_SHA", raising=False)
    monkeypatch.delenv("REPLAYBENCH_GIT_DIRTY", raising=False)
    assert results.git_state(tmp_path) == {"sha": None, "dirty": None}
    monkeypatch.setenv("REPLAYBENCH_GIT_SHA", "abc123")
    monkeypatch.setenv("REPLAYBENCH_GIT_DIRTY", "0")
    assert results.git_state(tmp_path) == {"sha": "abc123", "dirty": False}
    monkeypatch.setenv("REPLAYBENCH_GIT_DIRTY", "1")
    assert results.git_state(tmp_path) == {"sha": "abc123", "dirty": True}
    monkeypatch.setenv("REPLAYBENCH_GIT_DIRTY", "maybe")
    assert results.git_state(tmp_path) == {"sha": "abc123", "dirty": None}
    assert results.git_state()["sha"] != "abc123"  # this checkout is a git tree
