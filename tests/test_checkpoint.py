"""Checkpoint and resume of PAAC runs (impl.rl.common.checkpoint, TrainConfig.checkpoint /
checkpoint_every / resume): a stopped run goes on as if it had not stopped."""

from __future__ import annotations

import pytest
from replaybench.impl.rl import ConfigError, TrainConfig, train

SMALL = {"n_envs": 4, "n_workers": 0, "t_max": 5, "hidden": [16, 16]}  # 20 env steps per update


def run(steps, **kwargs):
    overrides = {**SMALL, **kwargs.pop("overrides", {})}
    return train(TrainConfig(algo="a2c", env="CartPole-v1", steps=steps, seed=3, overrides=overrides, **kwargs))


def test_a_resumed_run_ends_bit_for_bit_where_the_uninterrupted_one_does(tmp_path):
    whole = run(240)
    path = str(tmp_path / "run.ckpt")
    first = run(120, checkpoint=path)
    assert first.env_steps == 120 and (tmp_path / "run.ckpt").exists() and not (tmp_path / "run.ckpt.tmp").exists()
    rest = run(240, resume=path)
    assert rest.env_steps == 240 and rest.updates == whole.updates == 12
    assert rest.learner_digests == whole.learner_digests
    assert [(s, r) for s, _, r in rest.episodes] == [(s, r) for s, _, r in whole.episodes]
    assert len(whole.episodes) > len(first.episodes) > 0  # episodes before and after the stop
    assert rest.wall_s >= first.wall_s  # the wall clock goes on from the checkpoint's


def test_an_interrupted_run_resumes_from_its_last_periodic_checkpoint(tmp_path):
    whole = run(240)
    path = str(tmp_path / "run.ckpt")

    def interrupt(steps, updates, recent, *_):
        if steps >= 180:
            raise KeyboardInterrupt

    cfg = TrainConfig(algo="a2c", env="CartPole-v1", steps=240, seed=3, overrides=SMALL, checkpoint=path,
                      checkpoint_every=60)
    import replaybench.impl.rl.engines.paac as paac

    old, paac.PROGRESS_EVERY_S = paac.PROGRESS_EVERY_S, 0.0  # report after every rollout
    try:
        with pytest.raises(KeyboardInterrupt):
            train(cfg, progress=interrupt)
    finally:
        paac.PROGRESS_EVERY_S = old
    from replaybench.impl.rl.common import checkpoint

    assert checkpoint.load(path)["steps"] == 120  # every 60 steps; stopped at 180 before its own
    assert run(240, resume=path).learner_digests == whole.learner_digests


@pytest.mark.slow  # starts worker processes twice
def test_a_resume_with_worker_processes_goes_on_in_law(tmp_path):
    path = str(tmp_path / "run.ckpt")
    first = run(200, checkpoint=path, overrides={"n_workers": 1})
    rest = run(400, resume=path, overrides={"n_workers": 1}, start_method="spawn")
    # the learner's state carried over (counters, episodes so far); the envs start new episodes
    assert rest.env_steps == 400 and rest.updates == 20
    assert rest.episodes[: len(first.episodes)] == first.episodes


def test_bad_checkpoint_settings_are_refused_before_anything_runs(tmp_path):
    path = str(tmp_path / "run.ckpt")
    for kwargs, field in (({"checkpoint_every": 100}, "checkpoint_every"), ({"checkpoint_every": -1}, "checkpoint_every"),
                          ({"resume": str(tmp_path / "none.ckpt")}, "resume"), ({"checkpoint": ""}, "checkpoint")):
        with pytest.raises(ConfigError) as err:
            run(100, **kwargs)
        assert err.value.field == field
    assert not (tmp_path / "run.ckpt").exists()
    with pytest.raises(ConfigError) as err:
        train(TrainConfig(algo="dqn", env="CartPole-v1", steps=100, checkpoint=path))
    assert err.value.field == "checkpoint"
    run(100, checkpoint=path)
    with pytest.raises(ConfigError, match="t_max") as err:  # a checkpoint of another run
        run(200, resume=path, overrides={"t_max": 4})
    assert err.value.field == "resume"


def _train_cli(tmp_path, *args):
    """``replaybench train --algo a2c ...`` into tmp_path/out: (exit status, stderr)."""
    import contextlib
    import io

    from replaybench.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as info:
        main(["train", "--algo", "a2c", "--steps", "100", "--set", "n_envs=4", "--set", "n_workers=0",
              "--out", str(tmp_path / "out"), "--no-progress", *args])
    return info.value.code, err.getvalue()


@pytest.mark.parametrize("where", ["a directory", "under a missing folder", "under a file"])
def test_a_checkpoint_path_that_cannot_be_written_is_refused_before_the_run(tmp_path, where):
    """Issue 41 item 1: found out up front (exit 2), not when the first checkpoint is written
    (which lost the run's rows and left <path>.tmp)."""
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("x")
    path = {"a directory": tmp_path / "dir", "under a missing folder": tmp_path / "missing" / "run.ckpt",
            "under a file": tmp_path / "file" / "run.ckpt"}[where]
    code, err = _train_cli(tmp_path, "--checkpoint", str(path))
    assert code == 2 and "argument --checkpoint: " in err and repr(str(path)) in err, err
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []  # no run folder
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir", "file"] and list((tmp_path / "dir").iterdir()) == []


def test_a_failed_checkpoint_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    from replaybench.impl.rl.common import checkpoint

    path = tmp_path / "run.ckpt"
    checkpoint.save(path, {"steps": 1})

    def full_disk(obj, f):
        open(f, "wb").write(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint.torch, "save", full_disk)
    with pytest.raises(OSError):
        checkpoint.save(path, {"steps": 2})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.ckpt"]
    monkeypatch.undo()
    assert checkpoint.torch.load(path, weights_only=False) == {"steps": 1}  # the previous one, whole


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A checkpoint of ``run(120)`` (seed 3) and that run's result."""
    path = tmp_path_factory.mktemp("saved") / "run.ckpt"
    return str(path), run(120, checkpoint=str(path))


def test_a_resume_file_that_is_no_checkpoint_of_this_run_is_refused_before_anything(tmp_path, saved):
    """Issue 41 item 2: an empty, corrupt, cut or foreign file, or another seed's checkpoint,
    exits 2 naming the file and what is wrong (it exited 1 after creating a failed run folder,
    a foreign file with a bare KeyError: 'run')."""
    import os

    import torch

    path, _ = saved
    whole = open(path, "rb").read()
    files = {"empty": b"", "corrupt": os.urandom(512), "cut": whole[: len(whole) // 2]}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    torch.save({"model": torch.zeros(3), "optimizer": {}}, tmp_path / "foreign")
    torch.save(torch.zeros(3), tmp_path / "tensor")
    cases = [("empty", [], "is empty"), ("corrupt", [], "cannot be read"), ("cut", [], "cannot be read"),
             ("foreign", [], "not a replaybench PAAC checkpoint: it holds a dict with keys ['model', 'optimizer']"),
             ("tensor", [], "not a replaybench PAAC checkpoint: it holds a torch.Tensor"),
             (path, ["--seed", "4"], "seed: checkpoint 3, this run 4")]
    for name, extra, why in cases:
        file = name if name == path else str(tmp_path / name)
        code, err = _train_cli(tmp_path, "--set", "t_max=5", "--set", "hidden=16,16", "--steps", "240",
                               "--seed", "3", *extra, "--resume", file)
        assert code == 2 and "argument --resume: " in err and repr(file) in err and why in err, (name, err)
        assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == [], name  # no run folder


def test_a_resume_with_other_settings_names_the_fields_that_differ(saved):
    """Issue 41 item 3: each field that differs with both values, not both whole configs."""
    path, _ = saved
    with pytest.raises(ConfigError) as err:
        run(240, resume=path, overrides={"t_max": 4, "lr": 0.5})
    message = str(err.value)
    assert err.value.field == "resume" and path in message and "2 setting(s) differ" in message, message
    assert "a2c.t_max: checkpoint 5, this run 4" in message and "a2c.lr: checkpoint " in message, message
    assert "gamma" not in message and "entropy" not in message, message  # fields that agree are not listed


def test_a_resumed_run_rates_and_bound_count_the_resumed_part_once(saved):
    """Issue 41 item 4: the rates and the bound are of the part the resumed call ran (its
    steps over its time, its profile); the counts are of the whole run."""
    from replaybench.bench.bound import run_bound
    from replaybench.bench.scenarios.training import result_rows

    path, first = saved
    with pytest.raises(ConfigError) as err:  # nothing left to run: refused, not a run of 0 steps
        run(100, resume=path)
    assert err.value.field == "steps" and "120" in str(err.value) and path in str(err.value)
    rest = run(240, resume=path)
    assert (rest.env_steps, rest.resumed_steps, rest.part_steps) == (240, 120, 120)
    assert (rest.updates, rest.resumed_updates, rest.part_updates) == (12, 6, 6)
    assert 0 < rest.resumed_wall_s <= first.wall_s and 0 < rest.part_wall_s < rest.wall_s  # saved before the end
    assert rest.env_steps_per_s == pytest.approx(120 / rest.part_wall_s)
    assert rest.updates_per_s == pytest.approx(6 / rest.part_wall_s)
    busy = sum(v for k, v in rest.profiles["paac"].items() if k != "wait")
    assert busy <= rest.part_wall_s * 1.01  # the profile is of the resumed part's time
    rows = {r["metric"]: r for r in result_rows(rest, {"params": {}}) if r["op"] == "summary"}
    bound = run_bound(rest.profiles, rest.processes, 120, 6, rest.part_wall_s)
    assert rows["bound_fraction"]["value"] == pytest.approx(bound.fraction)
    assert rows["bound_fraction"]["value"] == pytest.approx(busy / rest.part_wall_s)  # its profile's busy share
