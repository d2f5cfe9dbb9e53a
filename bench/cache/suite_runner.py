"""Runs the cache suite like any other suite: ``replaybench run --suite cache``.

bench/suites/cache.json names ``bench.cache.suite_runner:run_suite`` as its runner, so
:func:`bench.runner.run_suites` (and ``make bench`` through default.json) hands it here with
the keyword arguments of :func:`bench.runner.run`. Rows go to ``results/<run-id>/rows.csv``
as :func:`bench.cache.run` emits them (so an interrupted run keeps what finished), meta.json
records which methods were available and the cache sizes used, and the table is printed.
"""

from __future__ import annotations

from pathlib import Path

from replaybench.bench import results

__all__ = ["run_suite"]


def run_suite(suite: dict, *, variants=None, out="results", run_id=None, machine=None, progress=True,
              command=None, echo=print, **_micro_only) -> Path:
    """Measure ``suite`` (cache.json's shape) into ``<out>/<run_id>/``; returns the folder.

    Keyword arguments that only mean something to the pyperf runner (capacities, ops, params,
    settings) are ignored: the cache suite declares its own grid per method.
    """
    from replaybench.bench import cache

    writer, emit, emitted = results.open_run(suite, out=out, run_id=run_id, machine=machine, command=command)
    try:
        info = cache.run(suite, variants, emit, progress)
    except KeyboardInterrupt:
        writer.finish(False, interrupted=True)
        echo(f"interrupted: kept {len(emitted)} rows in {writer.dir}")
        raise
    writer.meta["cache_miss_method"] = info.get("methods")
    writer.meta["caches"] = info.get("caches")
    writer.finish(True, interrupted=False)
    echo(cache.format_table(emitted))
    echo(f"\nResults: {writer.dir}")
    return writer.dir
