"""replaybench benchmarks: suites declared as data, timed with pyperf, written to results/.

``replaybench list | run | summary``; see bench/__main__.py. The pieces: suites/ (the
grids), workloads (what one timed call does), pyperf_worker (one benchmark in fresh
processes), peers/ (other libraries on the same workloads), runner (the grid loop), results
(rows.csv + meta.json, written atomically) and summary (the table printed after a run).
"""
