"""The README's three framework examples ("Inside Stable-Baselines3, Tianshou and TorchRL"), run
as written, each where its framework is installed (the SB3 one trains 1000 steps: slow;
tests/test_adapters_sb3.py trains PrioritizedDQN in the default run)."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def examples() -> dict[str, str]:
    section = README.read_text().split("## Inside Stable-Baselines3, Tianshou and TorchRL")[1].split("\n## ")[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    return {re.search(r"replaybench\.adapters\.(\w+)", b).group(1): b for b in blocks}


def test_the_section_has_one_example_per_framework():
    assert sorted(examples()) == ["sb3", "tianshou", "torchrl"]


@pytest.mark.parametrize("adapter", [pytest.param("sb3", marks=pytest.mark.slow), "tianshou", "torchrl"])
def test_readme_example_runs_as_written(adapter, tmp_path, monkeypatch):
    pytest.importorskip({"sb3": "stable_baselines3"}.get(adapter, adapter))
    import torch

    monkeypatch.chdir(tmp_path)  # the SB3 example writes replay.pkl
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        namespace: dict = {}
        exec(compile(examples()[adapter], "README.md", "exec"), namespace)
    finally:
        torch.set_num_threads(threads)
    if adapter == "sb3":
        assert (tmp_path / "replay.pkl").stat().st_size > 0 and namespace["model"].replay_buffer.size() == 1_000
    elif adapter == "tianshou":
        assert len(namespace["buf"]) == 100 and namespace["batch"].weight.shape == (32,)
        assert namespace["vbuf"].buffer_num == 4 and namespace["vbuf"].maxsize == 2**16
    else:
        assert len(namespace["rb"]) == 100 and namespace["sample"]["priority_weight"].shape == (32,)
