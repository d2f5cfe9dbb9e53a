"""TrainConfig.device: the learners of DQN, TD3 and A2C on "cpu", "cuda" or "auto"
(impl.rl.common.device), the samples that feed them (impl.rl.common.device_feed), and the rows.

On the CPU: device "cpu" computes what the learners computed before the setting existed, bit
for bit (fingerprints recorded from the code before it, on the machine named in GOLDEN_ON);
"auto" takes the CPU where torch sees no GPU; bad values are refused before any work. The
tests marked ``cuda`` skip where torch sees no GPU and run on a machine with one.
"""

import dataclasses
import hashlib
import json

import gymnasium as gym
import numpy as np
import pytest
import torch

from replaybench.impl.rl import ConfigError, TrainConfig, algorithms, train
from replaybench.impl.rl.common.device import check_device, host_arrays, on_device, resolve_device, warm_up_learner

HAS_CUDA = torch.cuda.is_available()
cuda = pytest.mark.cuda
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="torch sees no CUDA device")
no_cuda = pytest.mark.skipif(HAS_CUDA, reason="this machine has a CUDA device")


# ------------------------------------------------------------------------------------ fingerprints
def _h(*arrays) -> str:
    m = hashlib.sha1()
    for a in arrays:
        m.update(np.ascontiguousarray(a).tobytes())
    return m.hexdigest()[:16]


def replay_fingerprint(algo_name: str, env_id: str, **device) -> list[str]:
    """Four learn() calls of a seeded learner on seeded batches: each loss and priorities, then
    the digest of every network and the broadcast weights. The eager update (``update="torch"``:
    the compiled one, the CPU's default, agrees with it to rounding, not bit for bit)."""
    algo = algorithms.get(algo_name)
    env = gym.make(env_id)
    spaces = (env.observation_space, env.action_space)
    learner = algo.learner_cls(spaces, algo.config_cls.for_env(env_id, update="torch"), 3, **device)
    rng = np.random.default_rng(5)
    n, d = 32, int(np.prod(env.observation_space.shape))
    out = []
    for _ in range(4):
        if algo_name == "dqn":
            action = rng.integers(env.action_space.n, size=n).astype(np.int64)
        else:
            action = rng.uniform(-1, 1, (n, env.action_space.shape[0])).astype(np.float32)
        batch = {"obs": rng.normal(size=(n, d)).astype(np.float32), "action": action,
                 "reward": rng.normal(size=n).astype(np.float32),
                 "next_obs": rng.normal(size=(n, d)).astype(np.float32), "done": rng.random(n) < 0.1,
                 "weights": rng.random(n).astype(np.float32), "indices": np.arange(n)}
        loss, priorities = learner.learn(batch)
        out.append(_h(np.float64(loss), priorities))
    out.append(learner.digest()[:16])
    out.append(_h(learner.get_flat_weights().numpy()))
    return out


def a2c_fingerprint(frames: bool, **device) -> list[str]:
    """Two rounds of act() and update() of a seeded A2C learner (the MLP, or the conv net on
    frames) on seeded rollouts with a truncated step: actions, values, statistics, digest."""
    from replaybench.impl.rl.algorithms.a2c import A2CConfig, A2CLearner, Rollout

    if frames:
        obs_space, cfg = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), A2CConfig(n_envs=2, t_max=2)
    else:
        obs_space, cfg = gym.spaces.Box(-1, 1, (4,), np.float32), A2CConfig.for_env("CartPole-v1")
    learner = A2CLearner(obs_space, gym.spaces.Discrete(3), cfg, 7, **device)
    rng = np.random.default_rng(1)
    t, e = 3, 4

    def obs(*shape):
        return (rng.integers(0, 256, (*shape, *obs_space.shape)).astype(np.uint8) if frames
                else rng.normal(size=(*shape, *obs_space.shape)).astype(np.float32))

    out = []
    for _ in range(2):
        actions, values = learner.act(obs(e))
        out.append(_h(actions, values))
        ro = Rollout(obs=obs(t, e), actions=rng.integers(3, size=(t, e)).astype(np.int64),
                     rewards=rng.normal(size=(t, e)).astype(np.float32), terminated=rng.random((t, e)) < 0.2,
                     truncated=np.zeros((t, e), bool), next_obs=obs(e), truncated_obs={})
        ro.truncated[1, 2], ro.terminated[1, 2] = True, False
        ro.truncated_obs[(1, 2)] = obs(1)[0]
        stats = learner.update(ro)
        out.append(_h(np.array([stats[k] for k in sorted(stats)], np.float64)))
    out.append(learner.digest()[:16])
    return out


def _fingerprint(kind: str, **device) -> list[str]:
    return {"dqn": lambda: replay_fingerprint("dqn", "CartPole-v1", **device),
            "td3": lambda: replay_fingerprint("td3", "Pendulum-v1", **device),
            "a2c-mlp": lambda: a2c_fingerprint(False, **device),
            "a2c-conv": lambda: a2c_fingerprint(True, **device)}[kind]()


#: Recorded from the learners before ``device`` existed (4f39351), with the code above: the
#: bits depend on torch's kernels, so they are compared only where they were recorded.
GOLDEN_ON = ("2.13.0+cpu", "Intel(R) Xeon(R) Processor")
GOLDEN = {
    "dqn": ["c0127c7b24ca7d3c", "242646df72d3ac8c", "0afbf62ed08ddaf0", "9686002c9228355b", "7e688efde3b62448",
            "238e7667051a0a1a"],
    "td3": ["3eec1ce414cd3de8", "04e45510e893aa82", "93ae3e3ada9b2f3c", "6319213df27d2122", "a6e38729185edd21",
            "b1de741627702942"],
    "a2c-mlp": ["290ceed6363b36af", "8598f4a8d78e7b3f", "06af6ec8d109d537", "875a0bdbba1bf4bc", "89dbc2de6a5cdd5d"],
    "a2c-conv": ["8d6e3177371b7f72", "80a89ca774eaa818", "e71b6ad8c0a7f662", "997e09e5f48dd6df", "a79b4688f6a97663"],
}


def _golden_here() -> bool:
    from replaybench.impl.machine import cpu_model

    return (torch.__version__, cpu_model()) == GOLDEN_ON


@pytest.mark.parametrize("kind", sorted(GOLDEN))
def test_device_cpu_computes_what_the_learners_computed_before_it_existed(kind):
    if not _golden_here():
        pytest.skip(f"fingerprints recorded with torch {GOLDEN_ON[0]} on {GOLDEN_ON[1]!r}")
    assert _fingerprint(kind) == GOLDEN[kind]
    assert _fingerprint(kind, device="cpu") == GOLDEN[kind]


@pytest.mark.parametrize("kind", ["dqn", "a2c-mlp"])
def test_device_cpu_auto_and_the_default_agree_bit_for_bit(kind):
    """Wherever the goldens do not apply: "cpu", a torch.device and the default are one path."""
    default = _fingerprint(kind)
    assert _fingerprint(kind, device="cpu") == default
    assert _fingerprint(kind, device=torch.device("cpu")) == default
    if not HAS_CUDA:
        assert _fingerprint(kind, device=resolve_device("auto")) == default


# ------------------------------------------------------------------------------------ the setting
@pytest.mark.parametrize("value", ["gpu", "CUDA", "", None, 0, "cuda:0"])
def test_a_bad_device_is_refused_naming_the_field_before_any_work(value, monkeypatch):
    import replaybench.impl.rl.config as config_module

    def no_env(*args, **kwargs):  # the env is made after the field checks: never reached
        raise AssertionError("validate went on past a bad device")

    monkeypatch.setattr(config_module, "make_env", no_env)
    cfg = TrainConfig(steps=300, device=value)
    with pytest.raises(ConfigError, match=r"device must be one of \('cpu', 'cuda', 'auto'\)") as err:
        cfg.validate()
    assert err.value.field == "device" and err.value.value == value
    with pytest.raises(ConfigError):
        train(cfg)


@no_cuda
def test_cuda_is_refused_where_torch_sees_no_gpu():
    with pytest.raises(ConfigError, match="device 'cuda' is unavailable: .*sees no CUDA device") as err:
        TrainConfig(steps=300, device="cuda").validate()
    assert err.value.field == "device"


def test_auto_takes_the_cpu_where_torch_sees_no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    check_device("auto")
    with pytest.raises(ConfigError, match="unavailable"):
        check_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda")


@no_cuda
def test_an_auto_run_here_learns_on_the_cpu_and_its_rows_say_so():
    from replaybench.bench.scenarios import training

    cfg = TrainConfig(steps=300, device="auto", overrides=dict(hidden=(16, 16), batch_size=16, learning_starts=100,
                                                               buffer_capacity=1024))
    acfg = cfg.validate()
    params = training.run_base(cfg, acfg, {})["params"]
    assert params["device"] == "cpu" and params["device_setting"] == "auto" and params["device_name"]
    result = train(cfg)
    assert result.updates > 0
    cpu = train(dataclasses.replace(cfg, device="cpu"))
    assert result.learner_digests == cpu.learner_digests


def test_the_ray_engine_takes_only_the_cpu():
    from replaybench.impl.rl.engines.ray import driver

    cfg = TrainConfig(actors=1, learners=1, backend="ray", device="auto")
    with pytest.raises(ConfigError, match="backend 'ray' runs its learners on the CPU") as err:
        driver.check(cfg, None)
    assert err.value.field == "device"


def test_host_arrays_and_on_device_on_the_cpu_share_memory():
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    (a,) = host_arrays(t)
    assert np.shares_memory(a, t.numpy())
    x = np.ones(3, np.float32)
    assert np.shares_memory(on_device(x, torch.device("cpu")).numpy(), x)


# ------------------------------------------------------------------------------------ on a GPU
@cuda
@needs_cuda
def test_cuda_learners_start_equal_and_track_the_cpu_learners():
    """Built on the CPU from the seed, then moved: the same initial bits; after an update DQN's
    loss and priorities agree to float32 rounding (GPU kernels sum in another order). TD3's
    smoothing noise comes from the device's generator, so only its shapes are compared."""
    for name, env_id in (("dqn", "CartPole-v1"), ("td3", "Pendulum-v1")):
        algo = algorithms.get(name)
        env = gym.make(env_id)
        spaces = (env.observation_space, env.action_space)
        acfg = algo.config_cls.for_env(env_id)
        cpu, gpu = (algo.learner_cls(spaces, acfg, 3, device=d) for d in ("cpu", "cuda"))
        assert cpu.digest() == gpu.digest()
        assert all(p.is_cuda for m in gpu.modules() for p in m.parameters())
        assert not gpu.get_flat_weights().is_cuda
        rng = np.random.default_rng(0)
        n, d = 32, int(np.prod(env.observation_space.shape))
        action = (rng.integers(env.action_space.n, size=n) if name == "dqn"
                  else rng.uniform(-1, 1, (n, env.action_space.shape[0])).astype(np.float32))
        batch = {"obs": rng.normal(size=(n, d)).astype(np.float32), "action": action,
                 "reward": rng.normal(size=n).astype(np.float32),
                 "next_obs": rng.normal(size=(n, d)).astype(np.float32), "done": rng.random(n) < 0.1,
                 "weights": rng.random(n).astype(np.float32)}
        on_gpu = {k: torch.from_numpy(np.asarray(v)).cuda() for k, v in batch.items()}
        (l_cpu, p_cpu), (l_gpu, p_gpu) = cpu.learn(batch), gpu.learn(on_gpu)
        assert isinstance(p_gpu, np.ndarray) and p_gpu.dtype == np.float64 and p_gpu.shape == (n,)
        assert isinstance(l_gpu, float) and np.isfinite(l_gpu) and np.isfinite(p_gpu).all()
        if name == "dqn":
            assert l_gpu == pytest.approx(l_cpu, rel=1e-3)
            np.testing.assert_allclose(p_gpu, p_cpu, rtol=1e-3, atol=1e-4)


@cuda
@needs_cuda
def test_cuda_a2c_learner_acts_and_updates():
    from replaybench.impl.rl.algorithms.a2c import A2CConfig, A2CLearner

    for frames in (False, True):
        kind = "a2c-conv" if frames else "a2c-mlp"
        out = _fingerprint(kind, device="cuda")
        assert len(out) == 5
    learner = A2CLearner(gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Discrete(6),
                         A2CConfig(channels_last=True), 0, device="cuda")
    assert all(p.is_cuda for p in learner.net.parameters())
    actions, values = learner.act(np.zeros((3, 4, 84, 84), np.uint8))
    assert actions.shape == values.shape == (3,) and isinstance(values, np.ndarray)


@cuda
@needs_cuda
def test_host_arrays_makes_one_copy_of_float32_tensors():
    a, b = torch.arange(4.0, device="cuda"), torch.ones((2, 2), device="cuda")
    ha, hb = host_arrays(a, b)
    assert ha.tolist() == [0, 1, 2, 3] and hb.shape == (2, 2) and hb.sum() == 4
    with pytest.raises(TypeError, match="float32"):
        host_arrays(torch.arange(3, device="cuda"))


def _dqn_batches(n_batches: int, n: int = 64, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"obs": rng.normal(size=(n, 4)).astype(np.float32), "action": rng.integers(2, size=n),
             "reward": rng.normal(size=n).astype(np.float32), "next_obs": rng.normal(size=(n, 4)).astype(np.float32),
             "done": rng.random(n) < 0.1, "weights": rng.random(n).astype(np.float32)} for _ in range(n_batches)]


def test_a_bad_cuda_graph_setting_is_refused_naming_the_field():
    from replaybench.impl.rl.algorithms.dqn import DQNConfig

    with pytest.raises(ConfigError, match="cuda_graph") as err:
        DQNConfig(cuda_graph="yes").validate()
    assert err.value.field == "cuda_graph"


def test_a_graphed_step_refuses_a_bad_warmup_before_any_cuda_call():
    from replaybench.impl.cuda_graph import GraphedStep

    for bad in (0, -1, 1.5, None):
        with pytest.raises(ValueError, match="warmup"):
            GraphedStep(lambda inputs: (), warmup=bad)


@cuda
@needs_cuda
def test_a_graphed_step_replays_on_its_own_copies_of_each_call_s_inputs():
    """After the warm-up and the capture, each call's inputs (refilled in place or new) are
    copied into the graph's own inputs before the replay; a later write to the caller's buffer
    does not reach the graph; a shape the graph was not captured for is refused by name."""
    from replaybench.impl.cuda_graph import GraphedStep

    step = GraphedStep(lambda inputs: (inputs["x"] * 2 + inputs["w"],), warmup=1)
    x, w = torch.ones(8, device="cuda"), torch.zeros(8, device="cuda")
    for _ in range(2):  # warm-up, then the capture
        (y,) = step({"x": x, "w": w})
    assert step.captured and step._inputs["x"] is not x and y.tolist() == [2.0] * 8
    x.fill_(3.0)  # refilled in place, as the pinned feed's device slots are
    assert step({"x": x, "w": w})[0].tolist() == [6.0] * 8
    assert step({"x": torch.full((8,), 5.0, device="cuda"), "w": w})[0].tolist() == [10.0] * 8
    assert x.tolist() == [3.0] * 8 and step._inputs["x"].tolist() == [5.0] * 8
    with pytest.raises(ValueError, match="input 'w' is torch.float32 \\(4,\\)"):
        step({"x": x, "w": torch.zeros(4, device="cuda")})


@cuda
@needs_cuda
def test_a_graphed_dqn_learner_computes_what_the_eager_one_does():
    """Twelve updates on the same batches, eager against captured (3 eager, the capture, then
    replays): the same losses, priorities and weights to float32 rounding; the graph was
    captured and replayed; with a gradient hook set the learner goes back to eager updates."""
    from replaybench.impl.rl.algorithms.dqn import DQNConfig, DQNLearner

    env = gym.make("CartPole-v1")
    spaces = (env.observation_space, env.action_space)
    eager, graphed = (DQNLearner(spaces, DQNConfig.for_env("CartPole-v1", cuda_graph=g), 3, device="cuda")
                      for g in (False, True))
    assert eager._graphed is None and graphed._graphed is not None
    for i, batch in enumerate(_dqn_batches(12)):
        on_gpu = {k: torch.from_numpy(np.asarray(v)).cuda() for k, v in batch.items()}
        (l_e, p_e), (l_g, p_g) = eager.learn(batch), graphed.learn(on_gpu)
        assert l_g == pytest.approx(l_e, rel=1e-4), i
        np.testing.assert_allclose(p_g, p_e, rtol=1e-4, atol=1e-5, err_msg=f"update {i}")
    assert graphed._graphed.captured and graphed._graphed.calls == 12
    np.testing.assert_allclose(graphed.get_flat_weights().numpy(), eager.get_flat_weights().numpy(),
                               rtol=1e-4, atol=1e-6)
    hooked = []
    graphed.grad_hook = lambda params: hooked.append(len(list(params)))
    graphed.learn(_dqn_batches(1, seed=1)[0])
    assert hooked == [6] and graphed._graphed.calls == 12


_SMALL = dict(hidden=(16, 16), batch_size=16, learning_starts=100, buffer_capacity=1024)


@cuda
@needs_cuda
@pytest.mark.parametrize("layout", [(0, 0), (1, 1)])
def test_a_short_dqn_cartpole_run_on_cuda_completes_and_its_rows_name_the_gpu(layout):
    from replaybench.bench.scenarios import training

    actors, learners = layout
    cfg = TrainConfig(steps=600, actors=actors, learners=learners, device="cuda", overrides=_SMALL,
                      learner_prefetch=bool(actors), timeout_s=300)
    acfg = cfg.validate()
    result = train(cfg)
    assert result.updates == int((cfg.steps - acfg.learning_starts) * acfg.updates_per_step)
    rows = training.result_rows(result, training.run_base(cfg, acfg, {}))
    params = rows[0]["params"]
    assert params["device"] == "cuda" and params["device_name"] == torch.cuda.get_device_name()


@cuda
@needs_cuda
def test_a_short_a2c_run_on_cuda_completes_and_its_rows_name_the_gpu():
    from replaybench.bench.scenarios import training

    cfg = TrainConfig(algo="a2c", steps=400, device="cuda", overrides=dict(n_envs=4, n_workers=1, t_max=5),
                      timeout_s=300)
    acfg = cfg.validate()
    result = train(cfg)
    assert result.updates == 20 and result.env_steps == 400
    params = training.run_base(cfg, acfg, {})["params"]
    assert params["device"] == "cuda" and params["device_name"] == torch.cuda.get_device_name()


# ------------------------------------------------------------------------------------ the suite
def test_the_gpu_suite_expands_to_cpu_and_cuda_cells_and_the_cuda_ones_are_unavailable_without_a_gpu():
    from replaybench.bench import driver, suites

    plan = driver.plan(suites.load("training-gpu-quick"))
    cells = plan.cells
    grid = [(c.spec.algo, c.spec.env, c.spec.actors, c.spec.device) for c in cells]
    grid = [(*g, c.spec.learner_prefetch, c.spec.overrides.get("cuda_graph", True), c.spec.priority_lag)
            for g, c in zip(grid, cells)]
    assert grid == [("dqn", "CartPole-v1", 0, "cpu", False, True, 0),
                    ("dqn", "CartPole-v1", 6, "cpu", False, True, 0),
                    ("dqn", "CartPole-v1", 14, "cpu", False, True, 0),
                    ("dqn", "CartPole-v1", 0, "cuda", False, True, 0), ("dqn", "CartPole-v1", 6, "cuda", False, True, 0),
                    ("dqn", "CartPole-v1", 14, "cuda", False, True, 0),
                    ("dqn", "CartPole-v1", 14, "cuda", True, True, 0),  # the learner prefetching
                    ("dqn", "CartPole-v1", 0, "cuda", False, False, 0),
                    ("dqn", "CartPole-v1", 14, "cuda", False, False, 0),
                    ("a2c", "ALE/Pong-v5", 0, "cpu", False, True, 0), ("a2c", "ALE/Pong-v5", 0, "cuda", False, True, 0),
                    ("dqn", "CartPole-v1", 14, "cuda", False, True, 1)]  # priorities one update late
    assert len({c.label for c in cells}) == len(cells)
    for c in cells:
        params = c.columns["params"]
        assert params["device"] == c.spec.device
        if c.spec.device == "cpu" or HAS_CUDA:
            assert c.skip == "" and params["device_name"]
        else:
            assert c.skip_status == "unavailable" and "sees no CUDA device" in c.skip
            assert params["device_name"] is None


def test_a_part_of_a_training_suite_takes_only_grid_keys():
    from replaybench.bench import driver, suites
    from replaybench.bench.scenarios import SelectionError

    suite = suites.load("training-gpu-quick")
    suite["parts"][0]["colour"] = "blue"
    with pytest.raises(SelectionError, match=r"a part may set .* not \['colour'\]"):
        driver.plan(suite)


@pytest.mark.slow
def test_the_gpu_suite_runs_with_tiny_steps_its_cuda_cells_as_unavailable_rows_here(tmp_path):
    """The suite end to end through the driver at a few thousand steps (the parallel layout cut
    to 1 actor + 1 learner): every CPU cell's rows "ok" and naming the device, every CUDA cell
    one "unavailable" row where torch sees no GPU (else "ok" rows naming the GPU)."""
    from replaybench.bench import driver, results, suites

    suite = suites.load("training-gpu-quick")
    suite["parts"][0].update(steps=3000, layouts=[[0, 0], [1, 1]])
    suite["parts"][1].update(steps=3000, layouts=[[1, 1]])
    suite["parts"][2].update(steps=3000, layouts=[[0, 0], [1, 1]])
    suite["parts"][3].update(steps=320)
    suite["parts"][4].update(steps=3000, layouts=[[1, 1]])
    run_dir = driver.run(suite, out=tmp_path, run_id="gpu-quick", progress=False, echo=lambda *a, **k: None)
    rows = results.read_rows(run_dir)
    summary = [r for r in rows if r["op"] == "summary" and r["metric"] == "env_steps_per_s"]
    assert len(summary) == 10
    for r in summary:
        params = json.loads(r["params"]) if isinstance(r["params"], str) else r["params"]
        if params["device"] == "cpu" or HAS_CUDA:
            assert r["status"] == "ok", r
            assert params["device_name"]
        else:
            assert r["status"] == "unavailable" and "sees no CUDA device" in r["error"]


@pytest.mark.parametrize("algo_name,env_id", [("dqn", "CartPole-v1"), ("td3", "Pendulum-v1")])
def test_the_learners_warm_up_changes_no_bit_of_a_run(algo_name, env_id, monkeypatch):
    """The sequential engine warms its learner up (impl.rl.common.device.warm_up_learner: a
    learner of its own takes 5 updates, then is dropped) before it builds the run's learner:
    the run ends with the same weights as one without the warm-up (TD3's updates draw torch's
    generator, which the build seeds), and says how long the warm-up's updates took."""
    from replaybench.impl.rl.engines import sequential

    cfg = TrainConfig(algo=algo_name, env=env_id, actors=0, learners=0, steps=1200, seed=4,
                      overrides={"learning_starts": 600})
    calls = []

    def counted(learner_cls, *args, **kwargs):
        calls.append(learner_cls.__name__)
        return warm_up_learner(learner_cls, *args, **kwargs)

    monkeypatch.setattr(sequential, "warm_up_learner", counted)
    warmed = train(cfg)
    monkeypatch.setattr(sequential, "warm_up_learner", lambda *args, **kwargs: None)
    plain = train(cfg)
    assert len(calls) == 1 and warmed.warmup_s > 0.0 and plain.warmup_s is None
    assert warmed.updates == plain.updates > 0 and warmed.learner_digests == plain.learner_digests
