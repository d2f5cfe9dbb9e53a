"""Conformance of every registered training engine (impl.rl.engines.ENGINES).

Each engine brings a tiny run (``Engine.smoke``); the same checks hold for every one: the
run goes through :func:`impl.rl.train` to that engine, which names itself in the result,
does every env step it was asked for and the updates the ratio allows, accounts its
processes' time by section, and leaves no process and no shared-memory segment behind.
A new engine registered in the registry is tested here with no edit. Engines that start
worker processes are slow tests here (``make test-slow``): their own test files already run
them in ``make test``, which must stay under 10 minutes.
"""

from __future__ import annotations

import math

import pytest

from replaybench.impl.rl import TrainConfig, engines, train
from replaybench.impl.rl.common.profiler import SECTIONS
from replaybench.impl.rl.common.result import total_updates

from _support import assert_exited, own_segments

FAST = {"sequential"}


def _param(name):
    return pytest.param(name, marks=() if name in FAST else pytest.mark.slow)


@pytest.mark.parametrize("name", [_param(n) for n in engines.ENGINES.names()])
def test_every_engine_keeps_the_run_contract(name):
    engine = engines.get(name)
    if engine.unavailable_reason():
        pytest.skip(engine.unavailable_reason())
    cfg = TrainConfig(**engine.smoke, seed=1, timeout_s=240)
    assert cfg.engine == name
    progress = []
    result = train(cfg, lambda *args: progress.append(args))
    assert result.engine == name  # each engine names itself in its result
    acfg = cfg.algo_config()
    if name == "paac":  # whole rollouts of n_envs x t_max steps
        per_rollout = acfg.n_envs * acfg.t_max
        assert result.env_steps == math.ceil(cfg.steps / per_rollout) * per_rollout
        assert result.updates == result.env_steps // per_rollout
    else:
        assert result.env_steps == cfg.steps
        assert result.updates == total_updates(cfg.steps, acfg.updates_per_step, acfg.learning_starts)
    assert result.wall_s > 0 and result.episodes and progress
    for role, sections in result.profiles.items():
        assert set(sections) <= set(SECTIONS) and all(v >= 0 for v in sections.values()), role
    assert_exited(result.worker_pids)
    assert own_segments() == []


@pytest.mark.parametrize("name", [_param(n) for n in engines.ENGINES.names()])
def test_every_engine_stops_at_its_threshold_leaving_nothing(name):
    """Issue 56: ``stop_at_threshold`` ends the run in every engine once the mean of the last
    ``window`` training episodes reaches the threshold (18 over 20 episodes: a random CartPole
    policy's mean is about 22, so the run reaches it within a few hundred steps of its 50,000,
    with its learners busy); the result counts the steps and updates done, never more updates
    than the ratio allows for them (plus the one the learners agree to end on), every learner
    the same, and nothing is left behind."""
    engine = engines.get(name)
    if engine.unavailable_reason():
        pytest.skip(engine.unavailable_reason())
    cfg = TrainConfig(**{**engine.smoke, "steps": 50_000, "threshold": 18.0, "window": 20,
                         "stop_at_threshold": True, "seed": 1, "timeout_s": 240})
    result = train(cfg)
    assert result.time_to_threshold_s is not None and result.steps_to_threshold is not None
    assert result.steps_to_threshold <= result.env_steps < 10_000  # stopped, long before its 50,000
    if name != "paac":  # A2C's loop updates once per rollout; the replay engines hold the ratio
        acfg = cfg.algo_config()
        assert result.updates <= total_updates(result.env_steps, acfg.updates_per_step, acfg.learning_starts) + 1
    assert len(set(result.learner_digests)) <= 1
    assert_exited(result.worker_pids)
    assert own_segments() == []


def test_every_engine_is_named_alike_in_the_registry_and_its_smoke_run():
    for name, engine in engines.ENGINES.items():
        assert engine.name == name and engine.kind in ("replay", "parallel", "own")
        assert TrainConfig(**engine.smoke).engine == name


_HUNG_RUN = """
import sys
sys.path.insert(0, sys.argv[2])
import _stepping_envs  # registers HangAt-v0
from replaybench.impl.rl import TrainConfig, WorkerFailed, engines, train


def main():
    engine = engines.get(sys.argv[1])
    timeout = {"timeout_s": float(sys.argv[4])} if sys.argv[3] == "timeout" else {}
    cfg = TrainConfig(**{**engine.smoke, "env": "_stepping_envs:HangAt-v0", "seed": 1, **timeout})
    try:
        train(cfg)
    except (TimeoutError, WorkerFailed) as err:
        print("ENDED", type(err).__name__, err, flush=True)
    except KeyboardInterrupt:
        print("INTERRUPTED", flush=True)


if __name__ == "__main__":  # the engines' forkserver children import this file as __mp_main__
    main()
"""


#: The time limit of the hung run, by engine (default 8 s). The sequential engine counts it from
#: its first env step (so the hang at the 5th step comes well within 2 s); the others start
#: worker processes within their limit.
_HANG_LIMIT_S = {"sequential": 2.0}


@pytest.mark.parametrize("how", ["timeout", "SIGINT"])
@pytest.mark.parametrize("name", [_param(n) for n in engines.ENGINES.names()])
def test_every_engine_ends_a_run_whose_env_hangs_leaving_nothing(name, how, tmp_path, request):
    """Issue 41 item 6: an environment that never returns from ``step``. At ``timeout_s``, or on
    Ctrl-C (SIGINT to the run's process once the step hangs), every engine ends the run (the
    sequential one never did at its limit), and nothing stays: no process the run started (the
    dataflow server's hung env worker, fork server and resource tracker did), no /tmp/pymp-*
    folder, no shared-memory segment. The run is a fresh interpreter whose processes all carry
    a marker in their environment, with TMPDIR in the test's folder."""
    import os
    import shutil
    import signal
    import subprocess
    import sys
    import tempfile
    import time
    import uuid
    from pathlib import Path

    engine = engines.get(name)
    if engine.unavailable_reason():
        pytest.skip(engine.unavailable_reason())
    mark = uuid.uuid4().hex
    # TMPDIR short and under /tmp: Ray puts its sockets there, and an AF_UNIX path is at most
    # 107 bytes, which pytest's tmp_path plus Ray's session folder passes.
    tmp, flag = Path(tempfile.mkdtemp(prefix="rb-hung-")), tmp_path / "hung"
    request.addfinalizer(lambda: shutil.rmtree(tmp, ignore_errors=True))
    tests_dir = str(Path(__file__).parent)  # on every worker's path (Ray's too): _stepping_envs lives there
    path = os.pathsep.join(p for p in (tests_dir, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "TMPDIR": str(tmp), "REPLAYBENCH_HUNG_RUN": mark, "HANG_FLAG": str(flag), "PYTHONPATH": path}
    script = tmp_path / "hung_run.py"
    script.write_text(_HUNG_RUN)
    limit = str(_HANG_LIMIT_S.get(name, 8.0))
    proc = subprocess.Popen([sys.executable, str(script), name, str(Path(__file__).parent), how, limit], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.default_int_handler))
    try:
        if how == "SIGINT":
            deadline = time.monotonic() + 540
            while not flag.exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            proc.send_signal(signal.SIGINT)  # to the run's process only, as the driver's latch passes it on
        stdout, stderr = proc.communicate(timeout=540)  # the run never ended: a failure, not a hung suite
    finally:
        if proc.poll() is None:
            proc.kill()
    output = stdout + stderr
    ended = "ENDED" in stdout and "limit" in stdout if how == "timeout" else "INTERRUPTED" in stdout
    assert proc.returncode == 0 and ended, output
    assert flag.exists(), output  # the run ended while the env's step hung, not before it got there

    def marked() -> list[int]:
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if f"REPLAYBENCH_HUNG_RUN={mark}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                    found.append(int(pid))
            except OSError:
                continue
        return found

    assert_exited(marked())  # the run's processes, whoever their parent is now
    assert [p.name for p in tmp.iterdir() if p.name.startswith("pymp-")] == [], output  # multiprocessing's
    from replaybench.impl.concurrent import leaked_segments

    assert [s for s in leaked_segments() if f"_{proc.pid}_" in s] == [], output
