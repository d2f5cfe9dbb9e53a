"""The learner micro-benchmark (bench/scenarios/learner.py): its smoke grid and its refusals."""

import pytest

from replaybench.bench import contract, driver, suites
from replaybench.bench.scenarios import SelectionError


def test_learner_quick_measures_each_update_beside_its_floor(tmp_path):
    out = []
    suite = {**suites.load("learner-quick"), "calls": 20, "repeats": 2, "warmup": 5}
    rows = contract.read_rows(driver.run(suite, out=tmp_path, progress=False, echo=out.append))
    by = {(r["algo"], r["backend"], r["metric"]): r for r in rows if r["learners"] == 1}
    group = [r for r in rows if r["learners"] == 2 and r["status"] == "ok"]
    assert {r["metric"] for r in group} == {"seconds_per_call", "allreduce_seconds_per_call"}
    assert all(r["items_per_call"] == 2 * r["batch"] for r in group if r["metric"] == "seconds_per_call")
    for algo, update in (("dqn", "torch"), ("dqn", "numba"), ("td3", "torch"), ("td3", "numba")):
        assert by[(algo, update, "seconds_per_call")]["status"] == "ok"
        assert by[(algo, update, "flops_per_call")]["value"] > 0
        assert 0 < by[(algo, update, "floor_seconds_per_call")]["value"]
    text = "\n".join(out)
    assert "bound" in text and ("dispatch" in text or "arithmetic" in text)


@pytest.mark.parametrize("change, needle", [({"updates": ["jax"]}, "updates"), ({"batches": [0]}, "batches"),
                                            ({"algos": [{"algo": "a2c", "env": "CartPole-v1"}]}, "a2c")])
def test_bad_suites_are_refused_before_any_work(tmp_path, change, needle):
    with pytest.raises(SelectionError, match=needle):
        driver.run({**suites.load("learner-quick"), **change}, out=tmp_path, progress=False)
    assert not any(tmp_path.iterdir())


def _report(rank, group, out):
    out.put({"rank": rank})


def _exit_silently(rank, group, out):
    import os

    os._exit(9)


def _wait_at_the_allreduce(rank, group, out):
    group.bind(rank)
    group.barrier()  # its peer never comes
    out.put({"rank": rank})


def _hang(rank, group, out):
    import time

    time.sleep(120)


@pytest.mark.parametrize("second, needle", [
    (_exit_silently, r"learner-1 \(pid \d+\) exited with code 9 without reporting"),
    (_hang, "learner-1 did not report within 2 s; learner-0 waited .* for learner-1")])
def test_a_learner_group_member_that_dies_or_hangs_is_named(second, needle):
    """Issue 57: the learner scenario's group cells name a member that exits without its report
    (at once, not at the limit) or that has not reported by the limit, with who waits for it at
    the all-reduce."""
    import multiprocessing as mp
    import time

    from replaybench.bench.scenarios.learner import collect_group
    from replaybench.impl.rl.common.allreduce import SharedAllreduce

    ctx = mp.get_context("fork")
    group = SharedAllreduce(ctx, 2, 4, timeout_s=60)
    out = ctx.Queue()
    first = _wait_at_the_allreduce if second is _hang else _report
    procs = [ctx.Process(target=f, args=(r, group, out)) for r, f in enumerate((first, second))]
    for p in procs:
        p.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(RuntimeError, match=needle):
            collect_group(procs, out, group, limit_s=2.0)
        assert time.monotonic() - t0 < 30
    finally:
        for p in procs:
            p.kill()
            p.join()


def test_a_learner_group_reports_in_rank_order():
    import multiprocessing as mp

    from replaybench.bench.scenarios.learner import collect_group
    from replaybench.impl.rl.common.allreduce import SharedAllreduce

    ctx = mp.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_report, args=(r, None, out)) for r in (0, 1, 2)]
    for p in procs:
        p.start()
    try:
        assert [r["rank"] for r in collect_group(procs, out, SharedAllreduce(ctx, 3, 4), limit_s=30.0)] == [0, 1, 2]
    finally:
        for p in procs:
            p.join()


def test_an_algorithm_without_a_compiled_update_gets_a_skipped_numba_row(monkeypatch):
    """The "numba" cells of an algorithm whose config has no ``update`` field are skipped rows
    naming the reason (DQN and TD3 both have one; a plain config stands in for such an algorithm)."""
    from dataclasses import dataclass, replace

    from replaybench.bench.scenarios import Selection
    from replaybench.bench.scenarios.learner import SCENARIO
    from replaybench.impl.rl import algorithms
    from replaybench.impl.rl.algorithms.base import AlgoConfig

    @dataclass
    class PlainConfig(AlgoConfig):
        pass

    td3 = algorithms.get("td3")
    monkeypatch.setattr(algorithms, "get", lambda name: replace(td3, name=name, config_cls=PlainConfig))
    cells = SCENARIO.cells({**suites.load("learner-quick"), "algos": [{"algo": "plain", "env": "Pendulum-v1"}],
                            "learners": [1]}, Selection())
    skips = {c.columns["backend"]: c.skip for c in cells}
    assert skips["torch"] == "" and "plain has no compiled update" in skips["numba"]
