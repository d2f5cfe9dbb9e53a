"""analysis reads results through the results contract and nothing else: importing it, every
figure module and the report loads no bench scenario, no impl and no numba, and no import
anywhere in analysis (inside functions too) reaches one."""

from __future__ import annotations

import json
import subprocess
import sys

from test_import_graph import _imports, _modules

#: What analysis must never load: the measuring side of the house.
FORBIDDEN = ("replaybench.impl", "replaybench.bench.scenarios", "numba")

_PROBE = """
import json, sys
import replaybench.analysis, replaybench.analysis.load, replaybench.analysis.report
import replaybench.analysis.render, replaybench.analysis.compare, replaybench.analysis.references
from replaybench.analysis.plots import modules
names = [m.__name__ for m in modules()]
print(json.dumps({"figures": names, "loaded": sorted(sys.modules)}))
"""


def _forbidden(names) -> list[str]:
    return sorted(n for n in names if any(n == f or n.startswith(f + ".") for f in FORBIDDEN))


def test_importing_analysis_loads_no_scenario_impl_or_numba():
    # a fresh interpreter: this test process has imported impl and numba long ago
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True)
    probe = json.loads(out.stdout.splitlines()[-1])
    assert len(probe["figures"]) >= 15  # every figure module was imported
    assert _forbidden(probe["loaded"]) == []


def test_no_import_in_analysis_reaches_a_scenario_or_impl():
    """Imports inside functions run only when a figure is drawn: follow them all, statically."""
    known = _modules()
    edges = {m: _imports(m, p, known) for m, p in known.items()}
    seen, todo = set(), [m for m in known if m.startswith("replaybench.analysis")]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(edges.get(module, ()))
    assert _forbidden(seen) == []
