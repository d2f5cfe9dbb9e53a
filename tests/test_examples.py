"""Every script of examples/ runs, at the tiny sizes its ``main()`` defaults to, and does what
the docs that show it say. The variant, policy, scenario and figure examples are run by the
tests of their extension point (test_registry, test_concurrency, test_driver, test_analysis),
which also run the conformance, stress and driver checks on them; the engines that start
processes are slow tests (seconds of process start-up each)."""

from __future__ import annotations

import ast
import statistics
from pathlib import Path

import numpy as np
import pytest

from _examples import EXAMPLES, load_example

#: Where each example is run: this module's tests, or another module's.
RUN_ELSEWHERE = {"variant_line_per_group": "test_registry.py", "policy_chunked_updates": "test_concurrency.py",
                 "sleep_scenario": "test_driver.py", "figure_sample_cost": "test_analysis.py"}
RUN_HERE = {"quickstart", "sample_into", "shared_buffer", "sb3_prioritized_dqn", "tianshou_buffer", "torchrl_sampler",
            "read_results", "train_sequential", "train_process", "train_dataflow", "train_ray", "train_paac",
            "gossip_two_learners"}


def test_every_example_is_a_script_with_main_and_is_run_by_a_test():
    scripts = {p.stem for p in EXAMPLES.glob("*.py")}
    assert scripts == RUN_HERE | set(RUN_ELSEWHERE), "an example without a test, or a test without its example"
    tests = Path(__file__).parent
    for name, where in RUN_ELSEWHERE.items():
        assert f'load_example("{name}"' in (tests / where).read_text(), f"{where} does not run examples/{name}.py"
    for name in scripts:
        tree = ast.parse((EXAMPLES / f"{name}.py").read_text())
        assert ast.get_docstring(tree), f"examples/{name}.py has no docstring"
        assert any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body), f"{name}: no main()"
        guard = [n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)]
        assert guard, f"examples/{name}.py calls main() without an `if __name__ == '__main__'` guard"


def test_quickstart():
    out = load_example("quickstart").main()
    assert out["obs"].shape == (256, 4) and out["indices"].dtype == np.int64
    assert out["weights"].max() == pytest.approx(1.0) and np.all(out["weights"] > 0)


def test_sample_into_reuses_its_arrays_and_a_refused_call_changes_nothing(capsys):
    assert load_example("sample_into").main(steps=5) == 5
    assert "refused: priorities[0] = nan" in capsys.readouterr().out


def test_shared_buffer_two_threads():
    import os

    from replaybench.impl.concurrent import leaked_segments

    applied = load_example("shared_buffer").main(rounds=5)
    assert len(applied) == 5 and all(0 <= a <= 64 for a in applied) and sum(applied) > 0
    assert not leaked_segments(os.getpid())  # the owner's close unlinked the segment


@pytest.mark.parametrize("name, framework", [pytest.param("sb3_prioritized_dqn", "stable_baselines3",
                                                          marks=pytest.mark.slow),
                                             ("tianshou_buffer", "tianshou"), ("torchrl_sampler", "torchrl")])
def test_framework_examples(name, framework, tmp_path, monkeypatch):
    pytest.importorskip(framework)
    import torch

    monkeypatch.chdir(tmp_path)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        got = load_example(name).main()
    finally:
        torch.set_num_threads(threads)
    if name == "sb3_prioritized_dqn":
        assert (tmp_path / "replay.pkl").stat().st_size > 0 and got.replay_buffer.size() == 300
    elif name == "tianshou_buffer":
        buf, batch, vbuf = got
        assert len(buf) == 100 and batch.weight.shape == (32,) and vbuf.buffer_num == 4
    else:
        rb, sample = got
        assert len(rb) == 100 and sample["priority_weight"].shape == (32,)


def test_read_results_medians_match_the_rows():
    from replaybench.bench import contract

    example = load_example("read_results")
    medians = example.main()
    rows = [r for r in contract.read_rows(example.REFERENCE)
            if r["status"] == "ok" and r["metric"] == "seconds_per_call" and r["variant"] == "kary-aligned"
            and r["op"] == "sample" and r["capacity"] == 2**20]
    expected = statistics.median(r["items_per_call"] / r["value"] for r in rows)
    assert rows and medians[contract.cell_key(rows[0])] == pytest.approx(expected, rel=1e-12)


def test_train_sequential():
    result = load_example("train_sequential").main(steps=300)
    assert result.engine == "sequential" and result.env_steps == 300 and result.updates == 100  # 0.5 x (300 - 100)


def test_train_paac():
    result = load_example("train_paac").main(steps=100)
    assert result.engine == "paac" and result.env_steps == 100 and result.updates == 5  # rollouts of 4 envs x 5


@pytest.mark.slow
@pytest.mark.parametrize("name, engine", [("train_process", "process"), ("train_dataflow", "dataflow"),
                                          ("train_ray", "ray")])
def test_train_engines(name, engine):
    if name == "train_ray":
        pytest.importorskip("ray")
    result = load_example(name).main(steps=300)
    assert result.engine == engine and result.env_steps == 300 and result.updates == 100


@pytest.mark.slow
def test_gossip_two_learners(tmp_path):
    from replaybench.bench import results

    assert load_example("gossip_two_learners").main(steps=1000, out=str(tmp_path)) == 0
    rows = results.read_rows(tmp_path / "gossip")
    assert {r["scenario"] for r in rows} == {"gossip"} and any(r["op"] == "learner" for r in rows)
