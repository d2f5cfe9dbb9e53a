"""How fast stored runs load: rows.parquet against the same rows as rows.csv.

    python -m replaybench.bench.load_speed                 # every run under results/
    python -m replaybench.bench.load_speed results/<id> ... --repeats 5

For each run that holds rows.parquet, its rows are written back as a rows.csv (the harness's own
formatting, :func:`bench.contract.format_cell`) in a temporary copy, and both forms are read
through the results contract (:func:`bench.contract.read_frame`: the reader ``make plots`` and
``make report`` use, with every check) ``repeats`` times each, alternating CSV and parquet so that drift on a shared
machine falls on both. It prints per run and for all runs together the median seconds of each
form with its min-max and the ratio of medians (csv / parquet), and the machine it ran on.
Nothing is stored: the figures of record are printed, with their spread.
"""

from __future__ import annotations

import argparse
import csv
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from replaybench.bench import contract, results, rowstore

__all__ = ["expand_to_csv", "time_reads", "main"]


def expand_to_csv(run_dir: Path, into: Path) -> Path:
    """A copy of ``run_dir`` (meta.json and rows) under ``into`` holding its rows as rows.csv."""
    copy = into / run_dir.name
    copy.mkdir(parents=True)
    shutil.copy2(run_dir / "meta.json", copy / "meta.json")
    rows = contract.read_rows(run_dir)
    header, _ = rowstore.read_parquet(run_dir / rowstore.PARQUET_NAME)
    with open(copy / rowstore.CSV_NAME, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(header)
        writer.writerows([contract.format_cell(row.get(c)) for c in header] for row in rows)
    return copy


def time_reads(csv_dir: Path, parquet_dir: Path, repeats: int) -> tuple[list[float], list[float]]:
    """Seconds of ``repeats`` reads of each form, alternating (csv, parquet, csv, ...)."""
    csv_s, parquet_s = [], []
    for _ in range(repeats):
        for folder, times in ((csv_dir, csv_s), (parquet_dir, parquet_s)):
            start = time.perf_counter()
            contract.read_frame(folder)
            times.append(time.perf_counter() - start)
    return csv_s, parquet_s


def _line(name: str, csv_s: list[float], parquet_s: list[float]) -> str:
    c, p = statistics.median(csv_s), statistics.median(parquet_s)
    return (f"{name:<42} csv {c:8.3f} s [{min(csv_s):.3f}-{max(csv_s):.3f}]  parquet {p:7.3f} s "
            f"[{min(parquet_s):.3f}-{max(parquet_s):.3f}]  csv/parquet {c / p:6.1f}x")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m replaybench.bench.load_speed", description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="*", help="run folders holding rows.parquet (default: every one under results/)")
    parser.add_argument("--repeats", type=int, default=3, help="reads of each form per run (default 3)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    runs = [Path(r) for r in args.runs] or sorted(p.parent for p in Path("results").glob("*/rows.parquet"))
    bad = [str(r) for r in runs if not (r / rowstore.PARQUET_NAME).exists()]
    if bad:
        parser.error(f"runs: {bad} hold no rows.parquet (replaybench compact converts a run)")
    machine = results.machine_info()
    print(f"machine: {machine.get('cpu_model')}, {machine.get('usable_cpus')} usable CPUs; {len(runs)} run(s), "
          f"{args.repeats} reads of each form, alternating; medians [min-max]")
    all_csv, all_parquet = [0.0] * args.repeats, [0.0] * args.repeats
    with tempfile.TemporaryDirectory() as tmp:
        for run in runs:
            copy = expand_to_csv(run, Path(tmp))
            csv_s, parquet_s = time_reads(copy, run, args.repeats)
            all_csv = [a + b for a, b in zip(all_csv, csv_s)]
            all_parquet = [a + b for a, b in zip(all_parquet, parquet_s)]
            print(_line(run.name, csv_s, parquet_s), flush=True)
            shutil.rmtree(copy)
    print(_line("all runs (sum per repeat)", all_csv, all_parquet))
    return 0


if __name__ == "__main__":
    sys.exit(main())
