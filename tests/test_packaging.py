"""The installed distribution holds one top-level package, ``replaybench`` (issue: one installable name).

Builds the wheel the way ``pip install .`` does (no dependencies, no index) and reads its file list:
``impl``, ``bench`` and ``analysis`` must appear only under ``replaybench/``, the suites JSON must be
packaged, and the console script must be declared.
"""

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_installs_one_top_level_name(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                           "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (wheel,) = tmp_path.glob("replaybench-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert top == {"replaybench"}
    for sub in ("impl/registry.py", "impl/variants/binary.py", "bench/__main__.py", "bench/suites/micro-quick.json",
                "analysis/plots/capacity.py", "cli.py"):
        assert f"replaybench/{sub}" in names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "replaybench = replaybench.cli:main" in text


def test_user_code_imports_the_registry_from_the_package():
    import replaybench
    from replaybench.impl import registry

    assert replaybench.create is registry.create and replaybench.names() == registry.names()
    buf = replaybench.create("binary", capacity=8, fields={"x": ((), "float32")})
    assert buf.capacity == 8
