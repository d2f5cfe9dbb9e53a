"""``python -m replaybench.bench.cache [--variants ...] [--capacities ...] [--methods ...]``: run the cache
suite (or a part of it) and print a table of misses per call; nothing is written to results/.

A development tool: ``replaybench run --suite cache`` measures the same through the driver and
writes a run (:mod:`bench.scenarios.cache`)."""

from __future__ import annotations

import argparse
import json
import sys

from replaybench.bench import arguments

from . import format_table, load_suite, run


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m replaybench.bench.cache", description=__doc__.splitlines()[0])
    p.add_argument("--suite", default="cache", help="suite name in bench/suites or a JSON path")
    p.add_argument("--variants", nargs="+", help="registered variant names (default: the suite's)")
    p.add_argument("--capacities", nargs="+", type=arguments.capacity, help="capacities for every method (2**20, 2^20 or 65536)")
    p.add_argument("--methods", nargs="+", choices=["model", "cachegrind", "perf"])
    p.add_argument("--streams", nargs="+", choices=["tree", "tree+data"], help="cachegrind streams")
    p.add_argument("--cg-variants", nargs="+", help="variants cachegrind runs (default: the suite's)")
    p.add_argument("--calls", type=int, help="cachegrind counted calls M (default: sized automatically)")
    p.add_argument("--json", help="also write the rows to this JSON file")
    p.add_argument("--no-progress", action="store_true")
    a = p.parse_args(argv)
    suite = load_suite(a.suite)
    methods = suite["methods"]
    if a.methods:
        methods = {k: v for k, v in methods.items() if k in a.methods}
    if a.capacities:
        methods = {k: {**v, "capacities": a.capacities} for k, v in methods.items()}
    if "cachegrind" in methods:
        cg = methods["cachegrind"]
        if a.streams:
            cg["streams"] = a.streams
        if a.calls:
            cg["calls"] = a.calls
        if a.cg_variants:
            cg["variants"] = a.cg_variants
        elif a.variants:
            cg["variants"] = a.variants
    suite = {**suite, "methods": methods}
    rows = []
    run(suite, a.variants, rows.extend, progress=not a.no_progress)
    print(format_table(rows))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(rows, fh, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
