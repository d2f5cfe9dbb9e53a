"""The best-split search of ``replaybench plan`` (issue 55, item 11; bench.derive.best_split).

``replaybench plan --run RUN --cores 4096`` did not finish: the search tried every split of
every worker count, O(cores^2) model evaluations. The search now uses the model's shape (per
worker count, the predicted rate rises, then is flat or falls, as actors replace learners) and
must give the very answers of the exhaustive search, ties included: checked here against that
search on the stored concurrency runs, on random costs and on exact ties, for small core
counts; a large core count is run, its evaluations counted, not timed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from replaybench.bench import contract, derive

ROOT = Path(__file__).resolve().parent.parent


def exhaustive(cores: int, costs: derive.Costs, max_workers: int | None = None) -> derive.Prediction:
    """The search as it was: every split of every worker count, the first best kept (a later
    split replaces it only when better by more than one part in 10^9: ties go to fewer workers
    and, among as many, to fewer actors)."""
    limit = cores if max_workers is None else max_workers
    best = None
    for n in range(2, limit + 1):
        for a in range(1, n):
            p = derive.predict(costs, a, n - a, cores)
            if best is None or p.sample_per_s > best.sample_per_s * (1 + 1e-9):
                best = p
    return best


def _stored_costs() -> list[tuple[str, derive.Costs]]:
    """The model's inputs of every configuration of every stored concurrency run."""
    out = []
    for meta in sorted((ROOT / "results").glob("*/meta.json")):
        run = meta.parent
        try:
            rows = contract.read_rows(run)
        except (contract.RunError, OSError, ValueError):
            continue
        machine = (contract.read_meta(run).get("machine") or {}).get("usable_cpus")
        configs = sorted({(r["variant"], r["policy"], r["mode"], r["transitions"]) for r in rows
                          if r.get("scenario") == "concurrency" and r.get("status") == "ok"})
        for variant, policy, mode, transitions in configs:
            try:
                costs = derive.costs_from_rows(rows, policy=policy, mode=mode, transitions=transitions,
                                               variant=variant, cores=int(machine) if machine else None)
            except ValueError:  # a run made before the per-call metrics
                continue
            out.append((f"{run.name}:{policy}/{mode}/{transitions}/{variant}", costs))
    return out


STORED = _stored_costs()


def test_the_stored_runs_give_costs_to_search():
    assert len(STORED) >= 10, [name for name, _ in STORED]


@pytest.mark.parametrize("name,costs", STORED, ids=[name for name, _ in STORED])
def test_the_search_equals_the_exhaustive_one_on_the_stored_runs(name, costs):
    for cores in (*range(2, 18), 24, 31, 48, 64):
        assert derive.best_split(cores, costs) == exhaustive(cores, costs), cores
    for cores, max_workers in ((2, 9), (5, 12), (8, 24), (16, 40)):  # more workers than cores
        assert derive.best_split(cores, costs, max_workers) == exhaustive(cores, costs, max_workers)


def _random_costs(rng) -> derive.Costs:
    """Costs over several orders of magnitude, so that each of the four bounds binds somewhere."""
    def log(lo, hi):
        return float(10 ** rng.uniform(lo, hi))

    insert_s, iteration_s = log(-6, -3), log(-6, -3)
    return derive.Costs(insert_s=insert_s, iteration_s=iteration_s,
                        insert_hold_s=insert_s * float(rng.choice([0.0, rng.uniform(0, 0.5)])),
                        iteration_hold_s=iteration_s * float(rng.choice([0.0, rng.uniform(0, 0.5)])),
                        serial_fraction=float(rng.choice([0.0, rng.uniform(0, 1), 1.0])),
                        write_batch=int(rng.choice([1, 32, 64])), sample_batch=int(rng.choice([1, 64, 256])),
                        samples_per_insert=float(rng.choice([0.5, 1.0, 8.0, log(-1, 2)])),
                        insert_serial_fraction=rng.choice([None, float(rng.uniform(0, 1))]))


def test_the_search_equals_the_exhaustive_one_on_random_costs():
    rng = np.random.default_rng(55)
    bounds = set()
    for _ in range(60):
        costs = _random_costs(rng)
        for cores in (2, 3, 4, 7, 12, 23):
            best = derive.best_split(cores, costs)
            assert best == exhaustive(cores, costs), (costs, cores)
            bounds.add(best.bound)
        assert derive.best_split(6, costs, 20) == exhaustive(6, costs, 20), costs
    assert bounds == set(derive.MODEL_BOUNDS)  # every regime of the model was searched


@pytest.mark.parametrize("spi,serial", [(1.0, 0.0), (1.0, 0.3), (2.0, 0.0), (0.5, 0.0)])
def test_exact_ties_go_where_the_exhaustive_search_puts_them(spi, serial):
    """One actor's inserts feed exactly so many learners' samples: the rate at the crossing is
    the same for two splits (and flat across the serial cap), the first one found is kept."""
    costs = derive.Costs(insert_s=64e-6, iteration_s=64e-6, insert_hold_s=0.0, iteration_hold_s=0.0,
                         serial_fraction=serial, write_batch=64, sample_batch=64, samples_per_insert=spi)
    for cores in range(2, 26):
        assert derive.best_split(cores, costs) == exhaustive(cores, costs), cores


def test_the_search_does_not_grow_with_the_square_of_the_cores(monkeypatch):
    """At 2,048 cores the exhaustive search made about 2 million model evaluations; the search
    makes a few per worker count."""
    calls = [0]
    real = derive.predict

    def counted(*args, **kw):
        calls[0] += 1
        return real(*args, **kw)

    monkeypatch.setattr(derive, "predict", counted)
    _, costs = STORED[0]
    best = derive.best_split(2048, costs)
    assert best.actors + best.learners <= 2048
    assert calls[0] <= 12 * 2048, calls[0]


def test_plan_at_4096_cores_finishes():
    """The command of the issue (a hang fails on the subprocess's timeout, not on a measured time)."""
    run = ROOT / "results" / "reference-concurrency-cores"
    proc = subprocess.run([sys.executable, "-m", "replaybench.bench", "plan", "--run", str(run), "--cores", "4,4096"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "best split" in proc.stdout
    assert any(line.split()[:1] == ["4096"] for line in proc.stdout.splitlines())


def test_a_core_count_past_the_bound_is_refused_naming_it():
    from replaybench.bench.plan_command import MAX_CORES

    run = ROOT / "results" / "reference-concurrency-cores"
    proc = subprocess.run([sys.executable, "-m", "replaybench.bench", "plan", "--run", str(run), "--cores",
                           f"4,{MAX_CORES + 1}"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--cores" in proc.stderr and f"[{MAX_CORES + 1}]" in proc.stderr, proc.stderr
    assert proc.stdout == ""
