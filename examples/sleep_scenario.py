"""A benchmark scenario in one module (docs/extending.md): how long ``time.sleep(s)`` really
sleeps. examples/sleep.json is a suite naming it; the driver does the rest (run folder,
meta.json, progress bar, Ctrl-C, failed and skipped rows, the closing table):

    PYTHONPATH=examples replaybench run --suite examples/sleep.json
    python examples/sleep_scenario.py            # the same, into a temporary folder
"""

import time

from replaybench.bench.scenarios import Cell, Scenario


class Sleep(Scenario):
    name = "sleep"
    suite_keys = frozenset({"seconds"})

    def cells(self, suite, selection):
        return [Cell(f"{s} s", {"variant": "time.sleep", "structure": "none", "op": "sleep",
                                "metric": "seconds", "unit": "s", "params": {"asked_s": s}}, spec=s)
                for s in suite["seconds"]]

    def measure(self, cell, run):
        rows = []
        for repeat in range(3):
            start = time.perf_counter()
            time.sleep(cell.spec)
            rows.append(cell.row("ok", value=time.perf_counter() - start, repeat=repeat))
        return rows


SCENARIO = Sleep()


def main(out: str | None = None) -> list:
    """Run examples/sleep.json into ``out`` (default: a temporary folder); returns its rows."""
    import sys
    import tempfile
    from pathlib import Path

    from replaybench.bench import driver, results, suites

    here = Path(__file__).resolve().parent
    if str(here) not in sys.path:  # the suite names this module by its import path
        sys.path.insert(0, str(here))
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = driver.run(suites.load(str(here / "sleep.json")), out=out or tmp, run_id="sleep", progress=False)
        return results.read_rows(run_dir)


if __name__ == "__main__":
    main()
