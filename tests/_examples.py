"""Load the scripts of examples/ as modules, for the tests that run them (not a test module).

The examples are scripts, not a package: each is loaded from its file under a module name the
caller chooses (a variant or policy example records that name as its origin when it registers).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load_example(name: str, module_name: str | None = None) -> ModuleType:
    """Execute ``examples/<name>.py`` as a fresh module called ``module_name`` (default
    ``examples.<name>``) and return it; importing runs the file's top level, not ``main``."""
    path = EXAMPLES / f"{name}.py"
    if not path.is_file():
        raise FileNotFoundError(f"no example {name!r}: {path} does not exist")
    spec = importlib.util.spec_from_file_location(module_name or f"examples.{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
