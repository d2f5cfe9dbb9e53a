"""The variant registry: built-ins, registering a tree in-process, and plug-ins discovered
through the ``replaybench.variants`` entry-point group (in a subprocess, so discovery runs
from scratch and nothing leaks into this interpreter)."""

from __future__ import annotations

import json
import os
import pkgutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from replaybench import impl
import replaybench.impl.variants  # noqa: F401  (loads impl.variants)
from replaybench.impl import registry
from replaybench.impl.buffers import PrioritizedReplayBuffer
from replaybench.impl.trees import ReferenceSumTree

from _examples import load_example

BUILTINS = ["binary", "binary-blocked", "kary", "kary-aligned", "uniform"]
FIELDS = {"id": ((), "int64")}
REPO = Path(impl.__file__).resolve().parent.parent


def test_names_lists_builtin_variants():
    names = registry.names()
    assert set(BUILTINS) <= set(names)
    assert names == sorted(names)
    assert len(names) == len(set(names))
    assert registry.failures() == {}


@pytest.mark.parametrize("name", registry.names())
def test_every_variant_is_described_and_buildable(name):
    variant = registry.get(name)
    assert variant.name == name
    assert variant.structure and variant.description
    buf = registry.create(name, capacity=5, fields=FIELDS)
    buf.add({"id": np.arange(3)})
    assert len(buf) == 3 and buf.capacity == 5
    assert buf.sample(2, rng=np.random.default_rng(0))["indices"].shape == (2,)


def test_every_file_in_variants_registers_something():
    """Adding a variant is one file in impl/variants/: each module there must have registered
    at least one variant under its own module name."""
    origins = {registry.get(n).origin for n in registry.names()}
    modules = [f"replaybench.impl.variants.{m.name}" for m in pkgutil.iter_modules(impl.variants.__path__)]
    assert modules
    for module in modules:
        assert module in origins, f"{module} registered no variant"


@pytest.fixture
def scratch_registry(monkeypatch):
    """Variants registered inside a test disappear after it."""
    registry.names()  # discover first so the copy holds every built-in
    monkeypatch.setattr(registry, "_variants", registry._variants.copy())
    return registry


class SpyTree(ReferenceSumTree):
    """The oracle, counting calls: proves the buffer runs on the registered tree."""

    def __init__(self, capacity, dtype="float64", tag="default"):
        super().__init__(capacity, dtype=dtype)
        self.tag = tag
        self.calls = {"update": 0, "find": 0}

    def update(self, *args, **kwargs):
        self.calls["update"] += 1
        return super().update(*args, **kwargs)

    def find(self, us):
        self.calls["find"] += 1
        return super().find(us)


def test_register_tree_with_custom_sum_tree(scratch_registry):
    variant = scratch_registry.register_tree("test-spy", SpyTree, structure="spy", params={"tag": "x"},
                                             description="counting oracle")
    assert variant.origin == __name__
    assert "test-spy" in scratch_registry.names()
    buf = scratch_registry.create("test-spy", capacity=6, fields=FIELDS, alpha=1.0, eps=0.0)
    assert isinstance(buf, PrioritizedReplayBuffer)
    assert isinstance(buf.tree, SpyTree) and buf.tree.tag == "x"
    buf.add({"id": np.arange(6)}, priorities=[0.0, 1.0, 0.0, 2.0, 0.0, 1.0])
    assert buf.tree.calls["update"] >= 1
    out = buf.sample(400, rng=np.random.default_rng(0))
    assert buf.tree.calls["find"] >= 1
    assert set(out["indices"].tolist()) == {1, 3, 5}
    buf.update_priorities([1], [5.0])
    assert buf.tree.get([1])[0] == 5.0
    # Structure parameters override their defaults; unknown ones are refused, naming the
    # parameters the variant takes.
    assert scratch_registry.create("test-spy", capacity=2, fields=FIELDS, tag="y").tree.tag == "y"
    with pytest.raises(TypeError, match=r"does not take parameter\(s\) \['K'\].*'tag'"):
        scratch_registry.create("test-spy", capacity=2, fields=FIELDS, K=4)


def test_register_refuses_a_name_taken_by_another_module(scratch_registry):
    with pytest.raises(ValueError, match=r"variant name 'binary' is already registered by replaybench\.impl\.variants\.binary"):
        scratch_registry.register_tree("binary", SpyTree, structure="spy")
    assert registry.get("binary").origin == "replaybench.impl.variants.binary"
    # The same module registering again replaces its own entry (re-import).
    scratch_registry.register_tree("test-spy", SpyTree, structure="spy", description="one")
    scratch_registry.register_tree("test-spy", SpyTree, structure="spy", description="two")
    assert scratch_registry.get("test-spy").description == "two"


@pytest.mark.parametrize("bad", ["", " spaced", "has space", None, 3])
def test_register_validates_names(scratch_registry, bad):
    with pytest.raises(ValueError, match=r"variant name must be a non-empty string without spaces"):
        scratch_registry.register_tree(bad, SpyTree, structure="spy")


def test_register_plain_factory(scratch_registry):
    def factory(capacity, fields, *, seed=None):
        return registry.create("uniform", capacity=capacity, fields=fields, seed=seed)

    scratch_registry.register("test-factory", factory, structure="uniform")
    buf = scratch_registry.create("test-factory", capacity=3, fields=FIELDS, seed=1)
    assert buf.capacity == 3


# --------------------------------------------------------------------------------------------
# Entry-point plug-ins (subprocess)
# --------------------------------------------------------------------------------------------


def _fake_distribution(root: Path, dist: str, entry_points: dict[str, str], modules: dict[str, str]):
    info = root / f"{dist}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    lines = [f"[{registry.ENTRY_POINT_GROUP}]"] + [f"{k} = {v}" for k, v in entry_points.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    for module, source in modules.items():
        (root / f"{module}.py").write_text(textwrap.dedent(source))


GOOD_PLUGIN = """
    from replaybench.impl import registry
    from replaybench.impl.trees import ReferenceSumTree

    class PlugTree(ReferenceSumTree):
        pass

    registry.register_tree("myplug-reference", PlugTree, structure="reference",
                           description="the oracle, as a plug-in")
"""

PROBE = """
import json, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    from replaybench.impl import registry
    names = registry.names()
    failures = registry.failures()
result = {"names": names, "failures": failures, "warnings": [str(w.message) for w in caught]}
if "myplug-reference" in names:
    import numpy as np
    buf = registry.create("myplug-reference", capacity=4, fields={"x": ((), "float32")})
    buf.add({"x": np.arange(4, dtype=np.float32)})
    result["tree"] = type(buf.tree).__name__
    result["origin"] = registry.get("myplug-reference").origin
    result["sampled"] = sorted(set(buf.sample(200, rng=np.random.default_rng(0))["indices"].tolist()))
print(json.dumps(result))
"""


def _probe(plugin_dir: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(plugin_dir), str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=plugin_dir, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_entry_point_plugin_is_discovered(tmp_path):
    _fake_distribution(tmp_path, "myplug", {"myplug": "myplug_variants"}, {"myplug_variants": GOOD_PLUGIN})
    result = _probe(tmp_path)
    assert "myplug-reference" in result["names"]
    assert set(BUILTINS) <= set(result["names"])
    assert result["failures"] == {}
    assert result["tree"] == "PlugTree"
    assert result["origin"] == "myplug_variants"
    assert result["sampled"] == [0, 1, 2, 3]


def test_without_plugins_nothing_extra_appears(tmp_path):
    result = _probe(tmp_path)
    assert "myplug-reference" not in result["names"]
    assert set(result["names"]) == set(registry.names())


def test_broken_plugins_are_reported_without_hiding_others(tmp_path):
    _fake_distribution(tmp_path, "myplug", {"myplug": "myplug_variants"}, {"myplug_variants": GOOD_PLUGIN})
    _fake_distribution(
        tmp_path, "brokenplug",
        {"raises": "broken_raises", "missing": "no_such_module_xyz", "clash": "broken_clash"},
        {
            "broken_raises": "raise RuntimeError('boom at import')\n",
            "broken_clash": """
                from replaybench.impl import registry
                from replaybench.impl.trees import ReferenceSumTree
                registry.register_tree("binary", ReferenceSumTree, structure="binary")
            """,
        },
    )
    result = _probe(tmp_path)
    names, failures = result["names"], result["failures"]
    assert "myplug-reference" in names and set(BUILTINS) <= set(names)
    assert failures.keys() == {"broken_raises", "no_such_module_xyz", "broken_clash"}
    assert failures["broken_raises"] == "RuntimeError: boom at import"
    assert "ModuleNotFoundError" in failures["no_such_module_xyz"]
    assert "already registered by replaybench.impl.variants.binary" in failures["broken_clash"]
    assert any("raises = broken_raises failed to load" in w for w in result["warnings"])
    assert result["tree"] == "PlugTree"  # the good plug-in still works


def test_plugin_variant_gets_the_conformance_suite(tmp_path):
    """End to end: with a plug-in installed, the suite collects tests for it in every file
    (the tree-level ones too, since its tree class is new) and they pass. One pytest run
    selects one or more of the plug-in's tests from each file, so each file must have some."""
    plugin_dir = tmp_path / "plugins"
    plugin_dir.mkdir()
    _fake_distribution(plugin_dir, "myplug", {"myplug": "myplug_variants"}, {"myplug_variants": GOOD_PLUGIN})
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(plugin_dir), str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    selected = {
        "tests/test_trees.py": "parity",
        "tests/test_sampling.py": "frequencies_match or weights",
        "tests/test_buffer.py": "wraparound",
        "tests/test_errors.py": "tree_update_rejects_bad_input",
        "tests/test_drift.py": "falling_total",
    }
    keyword = "myplug and (" + " or ".join(selected.values()) + ")"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA", "-k", keyword,
                           *selected], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    passed = [line.split(" ", 1)[1] for line in proc.stdout.splitlines() if line.startswith("PASSED ")]
    assert passed and all("myplug-reference" in test for test in passed), passed
    for f in selected:
        assert any(test.startswith(f) for test in passed), f"{f} has no passing test for the plug-in variant"
    assert any("test_parity_with_reference[machine-cache-variant-myplug-reference" in test for test in passed)
    assert "failed" not in proc.stdout


def test_one_file_variant_example_works(scratch_registry):
    """examples/variant_line_per_group.py (docs/extending.md), loaded as a module of
    impl/variants/ would be: it registers, behaves like a tree, and its main() runs."""
    example = load_example("variant_line_per_group", "replaybench.impl.variants.example_line_per_group")
    (name,) = [n for n in scratch_registry.names()
               if registry.get(n).origin == "replaybench.impl.variants.example_line_per_group"]
    buf = scratch_registry.create(name, capacity=1000, fields=FIELDS, alpha=1.0, eps=0.0)
    priorities = np.random.default_rng(1).random(1000)
    buf.add({"id": np.arange(1000)}, priorities=priorities)
    assert np.isclose(buf.tree.total(), priorities.sum(), rtol=1e-5)
    ref = ReferenceSumTree(1000)
    ref.update(np.arange(1000), buf.tree.leaves())
    us = np.random.default_rng(2).random(500) * ref.total()
    assert (buf.tree.find(us)[0] == ref.find(us)[0]).mean() > 0.99
    assert example.main(capacity=500) == pytest.approx(np.random.default_rng(0).random(500).sum(), rel=1e-5)
