"""Read a stored run through the results contract (docs/results-schema.md): its rows (rows.csv,
or rows.parquet once the run has ended) checked row by row, meta.json checked, throughput derived at read time (never stored).

    python examples/read_results.py [results/<run-id>]
"""

import statistics
import sys
from pathlib import Path

REFERENCE = Path(__file__).resolve().parents[1] / "results" / "reference-micro"


def main(run_dir=REFERENCE) -> dict:
    from replaybench.bench import contract

    meta = contract.read_meta(run_dir)        # RunError naming the file if missing or too new
    rows = contract.read_rows(run_dir)        # RunError naming the file and line of a broken row
    cells: dict = {}
    for row in rows:
        if row["status"] == "ok" and row["metric"] == contract.TIMING_METRIC:
            cells.setdefault(contract.cell_key(row), []).append(
                contract.items_per_s(row["items_per_call"], row["value"]))
    medians = {key: statistics.median(values) for key, values in cells.items()}
    by_status: dict = {}
    for row in rows:
        by_status[row["status"]] = by_status.get(row["status"], 0) + 1
    print(f"run {meta['run_id']} (scenario {meta['scenario']}, complete {meta['complete']}): "
          f"{len(rows)} rows {by_status}, {len(medians)} timed cells")
    return medians


if __name__ == "__main__":
    main(*sys.argv[1:])
