"""replaybench benchmarks: suites declared as data, timed with pyperf, written to results/.

``replaybench list | run | summary | train``; see bench/__main__.py. The pieces: suites/ (the
grids, as JSON), scenarios/ (what a suite measures: micro, cache, concurrency, training; one
module each), driver (the one run lifecycle every scenario goes through), arguments (the
command-line values), workloads (what one timed call does), pyperf_worker (one benchmark in
fresh processes), peers/ (other libraries on the same workloads), results (rows.csv, appended
to batch by batch, + meta.json, written atomically) and summary (the table printed after a
micro run).
"""
