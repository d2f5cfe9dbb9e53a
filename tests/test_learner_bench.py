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
    for algo, update in (("dqn", "torch"), ("dqn", "numba"), ("td3", "torch")):
        assert by[(algo, update, "seconds_per_call")]["status"] == "ok"
        assert by[(algo, update, "flops_per_call")]["value"] > 0
        assert 0 < by[(algo, update, "floor_seconds_per_call")]["value"]
    assert by[("td3", "numba", "seconds_per_call")]["status"] == "skipped"
    text = "\n".join(out)
    assert "bound" in text and ("dispatch" in text or "arithmetic" in text)


@pytest.mark.parametrize("change, needle", [({"updates": ["jax"]}, "updates"), ({"batches": [0]}, "batches"),
                                            ({"algos": [{"algo": "a2c", "env": "CartPole-v1"}]}, "a2c")])
def test_bad_suites_are_refused_before_any_work(tmp_path, change, needle):
    with pytest.raises(SelectionError, match=needle):
        driver.run({**suites.load("learner-quick"), **change}, out=tmp_path, progress=False)
    assert not any(tmp_path.iterdir())
