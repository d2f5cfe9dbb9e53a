"""Per-op regression check of every registered variant with pytest-benchmark (``make bench-pytest``).

Not part of ``make test`` (pytest's ``testpaths`` is ``tests/``). One benchmark per
(variant, op) at capacity :data:`CAPACITY`, on the same workloads as the micro suite
(:mod:`bench.workloads`): the buffer is built and filled, the input pools made and the op
called once before timing, so a benchmark times only the op (plus one Python call of the
timing loop, ~0.1 us). Results are grouped by op, so pytest-benchmark's table puts the variants
side by side::

    make bench-pytest                                   # run and print the table
    make bench-pytest ARGS=--benchmark-autosave         # store in .benchmarks/ (numbered)
    make bench-pytest ARGS=--benchmark-compare          # compare with the latest stored run
    make bench-pytest ARGS="--benchmark-compare=0001 --benchmark-compare-fail=median:10%"

This is a quick regression check on one machine, not the reference numbers: those come
from ``make bench`` (pyperf, fresh processes, several repetitions).
"""

import itertools

import pytest

from replaybench.bench import contract, derive, workloads
from replaybench.impl import registry

CAPACITY = 2**16
BATCH = 256
OPS = ["insert_one", "insert_batch", "sample", "update", "mixed"]
FIELDS = derive.SCHEMAS["cartpole"]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("variant", registry.names())
def test_op(benchmark, variant, op):
    call = workloads.warmed_call(op, variant, capacity=CAPACITY, fields=FIELDS, batch=BATCH, seed=0)
    counter = itertools.count(1)
    benchmark.group = f"{op} (capacity {CAPACITY}, batch {BATCH if op != 'insert_one' else 1})"
    benchmark.extra_info.update(variant=variant, op=op, capacity=CAPACITY,
                                items_per_call=contract.OPS[op].items_per_call(BATCH))
    benchmark(lambda: call(next(counter)))
