"""The findings page (analysis.findings, analysis.claims): every claim of the registry gets a row,
a claim without runs says "no data" and names the suite, a claim whose runs got no verdict
fails the build, and no table or figure pools two hosts (a host is its CPU and caches, not the
``--machine`` label)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from replaybench.analysis import claims, findings, load, render, report
from replaybench.analysis.__main__ import main

from test_analysis import MACHINE, _row, learning_rows, micro_rows, write_run

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "results"
BIG = {**MACHINE, "cpu_model": "Other CPU", "logical_cpus": 16, "usable_cpus": 16}


def _parts(runs):
    return load.load_runs(runs).by_host()


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory):
    """Micro runs on two hosts that share one ``--machine`` label, and a third run on the first
    host under another label."""
    root = tmp_path_factory.mktemp("results")
    rng = np.random.default_rng(5)
    a = write_run(root, "20300101T000000Z-micro", "micro", "micro", micro_rows(rng), extra={"machine_label": "vm"})
    b = write_run(root, "20300102T000000Z-micro", "micro", "micro", micro_rows(rng), scale=10.0,
                  extra={"machine_label": "vm", "machine": BIG})
    c = write_run(root, "20300103T000000Z-micro", "micro", "micro", micro_rows(rng), extra={"machine_label": "box"})
    return root, [a, b, c]


def test_a_host_is_its_cpu_and_caches_not_its_label(two_hosts):
    _, (a, b, c) = two_hosts
    res = load.load_runs([a, b, c])
    hosts = res.hosts()
    assert hosts[a.name] == hosts[c.name] == "synthetic-2cpu-32k-1m-16m"  # labels vm and box: one host
    assert hosts[b.name] == "other-16cpu-32k-1m-16m"  # label vm, another host
    assert [(h, sorted(p.metas)) for h, p in res.by_host()] == [
        ("synthetic-2cpu-32k-1m-16m", sorted([a.name, c.name])), ("other-16cpu-32k-1m-16m", [b.name])]


def test_a_claim_added_to_the_registry_gets_its_row(two_hosts):
    _, runs = two_hosts
    registry = claims.CLAIMS.copy()
    seen = []

    def rule(res):
        seen.append(sorted(res.metas))
        return claims.Verdict(claims.REPRODUCES, ours="42.5x", spread="6 values", runs=tuple(sorted(res.metas)))

    registry.register("test-claim", claims.Claim(name="test-claim", paper="TEST", claim="a claim made up here",
                                                  number="40x", metric="m", suites=("mic*",), cells="c", rule=rule))
    parts = _parts(runs)
    rows = [r for r in findings.verdict_rows(parts, registry) if r["claim"].name == "test-claim"]
    assert [r["host"] for r in rows] == [h for h, _ in parts]  # one row per host, never pooled
    assert seen == [sorted(p.metas) for _, p in parts]  # the rule saw one host's runs at a time
    text = "\n".join(findings.section(parts, registry))
    assert "(`test-claim`)" in text and "42.5x" in text and "**reproduces**" in text
    assert "test-claim" not in claims.CLAIMS  # the copy, not the project's registry


def test_a_claim_whose_runs_are_removed_says_no_data_and_names_its_suite():
    with_lf = findings.verdict_rows(_parts([RESULTS / "reference-lf"]))
    without = findings.verdict_rows(_parts([RESULTS / "reference-micro-threads"]))
    lf = {r["claim"].name: r for r in with_lf}["lf-gym"]
    assert lf["verdict"].verdict != claims.NO_DATA and lf["verdict"].runs == ("reference-lf",)
    gone = {r["claim"].name: r for r in without}["lf-gym"]
    assert gone["host"] == "-" and gone["verdict"].verdict == claims.NO_DATA
    assert "suite `lf`" in gone["verdict"].why
    row = next(line for line in findings.claims_table(without) if "(`lf-gym`)" in line)
    assert "| **no data** |" in row and "no stored run of suite `lf`" in row


def test_a_claim_whose_suite_has_runs_but_no_verdict_fails(two_hosts):
    _, runs = two_hosts
    registry = claims.CLAIMS.copy()
    registry.register("silent", claims.Claim(name="silent", paper="TEST", claim="c", number="1x", metric="m",
                                             suites=("micro",), cells="c", rule=lambda res: None))
    with pytest.raises(findings.MissingVerdict, match="silent"):
        findings.verdict_rows(_parts(runs), registry)
    registry = claims.CLAIMS.copy()  # suites named but no rule at all
    registry.register("ruleless", claims.Claim(name="ruleless", paper="TEST", claim="c", number="1x", metric="m",
                                               suites=("micro",), cells="c"))
    with pytest.raises(findings.MissingVerdict, match="ruleless"):
        findings.verdict_rows(_parts(runs), registry)


def test_every_registered_claim_answers_the_stored_runs_of_its_suites():
    """The project's own claims on a few small stored runs: every claim with an answering run
    gets a verdict of the five kinds, and a ``no data`` row always says why."""
    runs = [RESULTS / r for r in ("reference-micro", "reference-micro-sweep-k", "reference-lf", "reference-gossip-targets",
                                  "reference-frameworks-torchrl", "reference-training-pong-zoo")]
    parts = _parts(runs)
    rows = findings.verdict_rows(parts)
    assert {r["claim"].name for r in rows} == set(claims.CLAIMS.names())
    for r in rows:
        assert r["verdict"].verdict in claims.VERDICTS
        assert r["verdict"].verdict != claims.NO_DATA or r["verdict"].why
    by = {(r["claim"].name, r["host"]): r["verdict"] for r in rows}
    assert by[("pal-kary-vs-baselines", "epyc-2cpu-32k-1m-32m")].runs == ("reference-micro",)
    assert by[("gala-straggler", "epyc-2cpu-48k-1m-32m")].verdict == claims.REPRODUCES


def test_ratio_verdicts():
    assert claims.ratio_verdict(4.0, 4.0) == claims.ratio_verdict(3.7, 4.0) == claims.REPRODUCES  # within 10%
    assert claims.ratio_verdict(200.0, 4.0) == claims.REPRODUCES
    assert claims.ratio_verdict(2.0, 4.0) == claims.PARTLY
    assert claims.ratio_verdict(0.9, 4.0) == claims.ratio_verdict(1.0, 4.0) == claims.CONTRADICTS
    with pytest.raises(ValueError):
        claims.Verdict("maybe")


def test_a_report_section_that_pools_two_hosts_fails(two_hosts, tmp_path):
    _, runs = two_hosts
    res = load.load_runs(runs)
    outcome = render.render(res, tmp_path / "figs", echo=lambda *_: None, only={"capacity"})
    with pytest.raises(findings.PooledHosts, match="other-16cpu"):
        report.build(res, outcome, tmp_path / "REPORT.md")
    with pytest.raises(findings.PooledHosts):
        findings.verdict_rows([("both", res)])


def test_the_report_draws_each_host_from_its_own_runs(two_hosts, tmp_path):
    """`replaybench report` on runs of two hosts under one label: each figure's CSV (the headline
    figures' included) and each host page hold one host's runs; the runs table names the host; the
    front page holds the findings and links each page. A figure folder of a label from before
    (figures/vm/) and a figure left in the folder's root are removed."""
    _, (a, b, c) = two_hosts
    figures, target = tmp_path / "figures", tmp_path / "REPORT.md"
    (figures / "vm").mkdir(parents=True)
    (figures / "vm" / "capacity.png").write_bytes(b"stale")  # a label's folder from before: removed
    (figures / "capacity.png").write_bytes(b"stale")  # the first host's figure from before host folders
    assert main(["report", "--runs", str(a), str(b), str(c), "--figures", str(figures), "--out", str(target)]) == 0
    assert not (figures / "vm").exists() and not (figures / "capacity.png").exists()
    home = pd.read_csv(figures / "synthetic-2cpu-32k-1m-16m" / "capacity.csv")
    other = pd.read_csv(figures / "other-16cpu-32k-1m-16m" / "capacity.csv")
    assert set(home["run_id"]) <= {a.name, c.name} and set(other["run_id"]) == {b.name}
    hosts = load.load_runs([a, b, c]).hosts()
    csvs = sorted(figures.rglob("*.csv"))
    assert any(p.parent.name == "claims" for p in csvs)  # the headline figures are checked too
    for csv in csvs:
        ids = {r for cell in pd.read_csv(csv).get("run_id", pd.Series(dtype=str)).dropna() for r in str(cell).split(", ")}
        assert len({hosts[r] for r in ids}) <= 1, csv
    text = target.read_text()
    assert "## Findings" in text and "](report/synthetic-2cpu-32k-1m-16m.md)" in text
    assert "](report/other-16cpu-32k-1m-16m.md)" in text and len(text.splitlines()) < 200
    for host, mine in (("synthetic-2cpu-32k-1m-16m", {a.name, c.name}), ("other-16cpu-32k-1m-16m", {b.name})):
        page = (tmp_path / "report" / f"{host}.md").read_text()
        assert all(r in page for r in mine) and not any(r in page for r in {a.name, b.name, c.name} - mine), host
        assert all(f"| `{r}` | `{host}` |" in page for r in mine)
        for link in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", page):  # figures resolve from the page, of this host
            assert (tmp_path / "report" / link).resolve().is_file() and f"/{host}/" in link, link


def test_plotting_some_runs_keeps_the_other_stored_hosts_figures(two_hosts, tmp_path, monkeypatch):
    """`replaybench plots --runs A` redraws A's host; the figures of another host with runs in
    the store stay, and only a folder no stored run's host draws in (a label's, from before)
    is removed."""
    from replaybench.analysis import __main__ as cli

    root, (a, _, _) = two_hosts
    monkeypatch.setattr(cli, "RESULTS", root)
    figures = tmp_path / "figures"
    kept = figures / "other-16cpu-32k-1m-16m" / "capacity.png"  # the host of run b, not drawn now
    kept.parent.mkdir(parents=True)
    kept.write_bytes(b"the other host's figure")
    (figures / "vm").mkdir()
    (figures / "vm" / "capacity.png").write_bytes(b"stale")
    assert main(["plots", "--runs", str(a), "--out", str(figures)]) == 0
    assert kept.read_bytes() == b"the other host's figure"
    assert not (figures / "vm").exists()
    assert (figures / "synthetic-2cpu-32k-1m-16m" / "capacity.png").is_file()


def test_a_run_without_git_state_is_superseded_by_a_later_run_of_its_host(tmp_path):
    rng = np.random.default_rng(2)
    old = write_run(tmp_path, "20300101T000000Z-old", "micro-copied", "micro", micro_rows(rng),
                    extra={"git_sha": None, "dirty": None})
    new = write_run(tmp_path, "20300102T000000Z-new", "micro", "micro", micro_rows(rng), scale=2.0)
    res = load.load_runs([old, new])
    gone = findings.superseded(res)
    assert list(gone) == [old.name] and new.name in gone[old.name] and "not a shipped suite" in gone[old.name]
    diff = findings.differing_cells(res)
    assert not diff.empty and (diff["ratio"] > 1.9).all()  # every cell twice as slow in the new run
    lines = "\n".join(findings.host_lines(res.by_host(), []))
    assert f"`{old.name}` is superseded" in lines and "differ by more than 25%" in lines


def _learner_rows(update_us: dict, group_us: float, allreduce_us: float) -> list[dict]:
    """A learner run's rows for DQN CartPole at batch 64: one learner per update in
    ``update_us`` (3 blocks each, with its FLOPs and floor), and a 2-learner group on the
    compiled update with its all-reduce row."""
    rows = []

    def row(update, learners, metric, value, repeat=0):
        return {"scenario": "learner", "backend": update, "algo": "dqn", "env": "CartPole-v1", "batch": 64,
                "threads": 1, "op": "learn", "learners": learners, "metric": metric,
                "unit": "flop" if metric == "flops_per_call" else "s", "items_per_call": 64 * learners,
                "params": {"device": "cpu"}, "status": "ok", "value": value, "repeat": repeat, "loops": 50}

    for update, us in update_us.items():
        rows += [row(update, 1, "seconds_per_call", us * f * 1e-6, i) for i, f in enumerate((0.98, 1.0, 1.05))]
        rows += [row(update, 1, "flops_per_call", 1.1e7), row(update, 1, "floor_seconds_per_call", 120e-6)]
    rows += [row("numba", 2, "seconds_per_call", group_us * 1e-6, i) for i in range(3)]
    rows.append(row("numba", 2, "allreduce_seconds_per_call", allreduce_us * 1e-6))
    return rows


def test_which_design_reads_the_newest_learner_run_at_its_target_batch(tmp_path):
    """The learner rows of "which design when": the fastest update at the run's target batch,
    with its time over its floor and over the eager update, and the learner group's samples
    learned per second over one learner's, all from the host's newest learner run."""
    targets = {"dqn_update": {"batch": 64, "env": "CartPole-v1"}, "learners": {"batch": 64, "learners": 2}}
    old = write_run(tmp_path, "20300101T000000Z-learner", "learner", "learner",
                    _learner_rows({"torch": 900.0, "numba": 300.0}, 500.0, 90.0),
                    extra={"targets": targets, "start_time": "2030-01-01T00:00:00+00:00"})
    new = write_run(tmp_path, "20300102T000000Z-learner", "learner", "learner",
                    _learner_rows({"torch": 900.0, "numba": 150.0}, 200.0, 25.0),
                    extra={"targets": targets, "start_time": "2030-01-02T00:00:00+00:00"})
    rows = findings.design_rows(_parts([old, new]))
    mine = {r[0]: r for r in rows if r[0].startswith(("a learner's", "learners averaging"))}
    update = mine["a learner's update, one core"]
    assert update[2] == "`numba` update (dqn, CartPole-v1, batch 64)"
    assert update[3] == "150 us an update, 1.2x its arithmetic floor"
    assert update[4] == "6.00x torch's eager update"
    assert update[5] == f"`{new.name}`"
    group = mine["learners averaging gradients"]
    assert group[2] == "2 learners x 64 rows, `numba` (dqn, CartPole-v1)"
    assert group[3] == "640,000 samples learned/s"  # 128 rows / 200 us
    assert group[4] == "1.50x one learner; all-reduce 25 us"  # 640,000 over 64 / 150 us
    assert group[5] == f"`{new.name}`"
    without = findings.design_rows(_parts([]))
    assert ["a learner's update, one core", "-", "**no data**", "-", "-", "run `learner`"] in without


def _peer_rows(config: str, buffer: str, times: tuple, budget: float = 50.0) -> list[dict]:
    """A peer trainer's learning rows on CartPole (``None``: a seed censored at ``budget``)."""
    rows = []
    for seed, t in enumerate(times):
        base = dict(variant="kary-aligned", algo="dqn", env="CartPole-v1", seed=seed, backend=config.split("+")[0],
                    actors=0, learners=0, batch=64, op="learning",
                    params={"config": config, "threshold": 475.0, "hyper": {"buffer": buffer}})
        rows.append(_row("", "learning", **base, metric="censored_at_s" if t is None else "time_to_threshold_s",
                         value=budget if t is None else t, unit="s"))
    return rows


def test_convergence_over_the_peers_trainers_reads_our_fastest_configuration(tmp_path):
    """pal-convergence-peers: per task, each peer's own trainer over our fastest configuration
    of the same run (1+1 here, median 4 s: faster than the sequential loop's 5 s); a peer
    censored in every seed gives a lower bound at its budget; a peer run with our buffer is
    not a baseline; the verdict reads the median of the ratios."""
    rows = (learning_rows() + _peer_rows("tianshou", "own", (None, None, None))
            + _peer_rows("tianshou+kary-aligned", "kary-aligned", (1.0, 1.0, 1.0)))
    run = write_run(tmp_path, "20300101T000000Z-learning", "learning", "learning", rows)
    (_, res), = _parts([run])
    verdict = claims.CLAIMS.get("pal-convergence-peers").rule(res)
    assert {p.label: round(p.value, 3) for p in verdict.points} == {"sb3, CartPole-v1": 8.75,  # 35 s / 4 s
                                                                     "≥ tianshou, CartPole-v1": 12.5}  # 50 s / 4 s
    assert verdict.verdict == claims.REPRODUCES and verdict.ours.startswith("10.6x shorter")
    assert ">=12.5x" in verdict.ours and "kary-aligned" not in verdict.ours
    alone = write_run(tmp_path, "20300102T000000Z-learning", "learning", "learning", _peer_rows("sb3", "own", (1.0,)))
    (_, peer_only), = _parts([alone])
    assert claims.CLAIMS.get("pal-convergence-peers").rule(peer_only).verdict == claims.NO_DATA  # nothing of ours


def test_pal_frameworks_says_each_trainers_time_to_threshold_with_our_buffer(tmp_path):
    """The learning-adapters line beside pal-frameworks: each peer's trainer with our buffer
    against the same trainer with its own, same run (a trainer that never reached the threshold
    says so), and the run it read is among the verdict's runs."""
    rows = (_peer_rows("sb3", "own", (1.0, 1.0, 2.0)) + _peer_rows("sb3+kary-aligned", "kary-aligned", (2.0, 3.0, 3.0))
            + _peer_rows("tianshou", "own", (None, None, None)) + _peer_rows("tianshou+kary-aligned", "kary-aligned",
                                                                          (None, None, None)))
    run = write_run(tmp_path, "20300101T000000Z-learning-adapters", "learning-adapters", "learning", rows)
    (_, res), = _parts([run])
    verdict = claims.CLAIMS.get("pal-frameworks").rule(res)
    assert verdict.verdict == claims.NO_DATA and verdict.runs == (run.name,)  # no frameworks run: no ratio
    assert f"sb3 on CartPole-v1: 3 s (3/3) with ours, 1 s (3/3) with its own (`{run.name}`)" in verdict.why
    assert "tianshou on CartPole-v1: not reached (0/3) with ours, not reached (0/3) with its own" in verdict.why


def test_two_learning_runs_of_one_cell_are_two_rows_of_the_convergence_figure(tmp_path):
    """Two runs measuring 1+1 on CartPole give pal-convergence two points: each names its run,
    so the headline figure draws two rows, not two markers on one row."""
    runs = [write_run(tmp_path, f"2030010{i}T000000Z-learning", "learning", "learning", learning_rows())
            for i in (1, 2)]
    (_, res), = _parts(runs)
    labels = [p.label for p in claims.CLAIMS.get("pal-convergence").rule(res).points]
    assert len(labels) == len(set(labels)) == 2
    assert all(f"({run.name})" in label for run, label in zip(runs, labels))
