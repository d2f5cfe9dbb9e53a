"""The adapters' overhead with pytest-benchmark (``make bench-pytest``): one benchmark per
(framework, kind) of :mod:`bench.adapters_overhead` (``adapter``, ``bare``, ``own``, the parts
it splits the share with, and the ``add-`` twins), grouped by framework and operation so the
table puts them side by side.

For the adapter's share and its ratio to the framework's own buffer measured in one
interleaved run, use ``python -m replaybench.bench.adapters_overhead``; this entry is the
per-commit regression check. A framework that is not installed is skipped.
"""

import pytest

from replaybench.bench import adapters_overhead

ADDS = ["add-adapter", "add-bare", "add-own"]
KINDS = {"sb3": ["adapter", "bare", "own", *ADDS], "tianshou": ["adapter", "bare", "own", "gather", *ADDS],
         "torchrl": ["adapter", "bare", "own", "sampler", "own-sampler", *ADDS]}


@pytest.fixture(scope="module")
def framework_calls():
    """Set-ups by framework, made once per module (each fills a buffer: seconds)."""
    made = {}

    def get(framework):
        if framework not in made:
            import torch

            from replaybench.adapters import availability

            ok, why = availability(framework)[framework]
            if not ok:
                pytest.skip(why)
            torch.set_num_threads(1)  # as the overhead benchmark and the frameworks suite run torch
            made[framework] = adapters_overhead.calls(framework)
        return made[framework]
    return get


@pytest.mark.parametrize("framework,kind", [(f, k) for f, kinds in KINDS.items() for k in kinds])
def test_adapter_overhead(benchmark, framework_calls, framework, kind):
    call = framework_calls(framework)[kind]
    what = "add of one step" if kind.startswith("add-") else f"sample + update of {adapters_overhead.BATCH}"
    benchmark.group = f"{framework}: {what} (capacity {adapters_overhead.CAPACITY})"
    benchmark.extra_info.update(framework=framework, kind=kind)
    benchmark(call)
