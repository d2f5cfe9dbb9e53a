"""A toy scenario, the one the driver tests run end to end: how long ``sorted`` takes.

It is what a new scenario looks like: one module defining ``SCENARIO`` plus one suite JSON
(toy_sort.json, ``"scenario": "toy_sort"``) naming it. The driver does everything else: the run
folder, meta.json, the progress bar, Ctrl-C, failed and skipped rows, the table.

Variants: ``sorted`` (the measurement) and ``broken`` (raises, to show a failed cell). Sizes
above the suite's ``max_size`` are skipped with the reason. ``pause_s`` sleeps in each cell, so
that a test can interrupt a run between cells.
"""

import random
import time

from replaybench.bench.scenarios import Cell, Scenario, SelectionError

VARIANTS = ("sorted", "broken")


class ToySort(Scenario):
    name = "toy_sort"
    takes = frozenset({"variants", "capacities"})

    def cells(self, suite, selection):
        variants = selection.variants or suite["variants"]
        unknown = sorted(set(variants) - set(VARIANTS))
        if unknown:
            raise SelectionError(f"--variants: unknown {unknown}; known: {', '.join(VARIANTS)}")
        cells = []
        for variant in variants:
            for n in selection.capacities or suite["sizes"]:
                columns = {"variant": variant, "structure": "list", "policy": "none", "capacity": n,
                           "op": "sort", "metric": "seconds_per_call", "unit": "s", "items_per_call": n}
                skip = f"size {n} is above max_size {suite['max_size']}" if n > suite["max_size"] else ""
                cells.append(Cell(f"{variant} {n}", columns, (variant, n, suite["repeats"], suite["pause_s"]), skip))
        return cells

    def measure(self, cell, run):
        variant, n, repeats, pause = cell.spec
        time.sleep(pause)
        if variant == "broken":
            raise RuntimeError("injected failure in the toy scenario")
        data = [random.random() for _ in range(n)]
        rows = []
        for repeat in range(repeats):
            start = time.perf_counter()
            sorted(data)
            rows.append(cell.row("ok", value=time.perf_counter() - start, repeat=repeat))
        return rows


SCENARIO = ToySort()
