"""impl.rl.common.episode_outbox: a worker's finished episodes reach the parent a batch at a
time, every one of them, in order, on every exit path; first the outbox alone (a hand-driven
clock), then a real worker loop run in this process (the process engine's actor, the dataflow
engine's server), then real runs of both engines."""

from __future__ import annotations

import dataclasses

import pytest

from replaybench.impl.rl.common.episode_outbox import EPISODES_EVERY_S, EpisodeOutbox


class _Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class _Out:
    """A queue's ``put``, keeping the messages."""

    def __init__(self):
        self.messages = []

    def put(self, message):
        self.messages.append(message)

    def batches(self):
        return [m for m in self.messages if m[0] == EpisodeOutbox.KIND]

    def episodes(self):
        """Every episode row sent, in the order sent (as the parent records them)."""
        return [row for kind, *rest in self.messages if kind == EpisodeOutbox.KIND for row in rest[0]]


def test_episodes_within_the_interval_go_as_one_message_in_the_order_they_ended():
    out, clock = _Out(), _Clock()
    box = EpisodeOutbox(out, 0.05, clock)
    box.add(10, 0.01, 10.0)
    clock.now += 0.02
    box.add(25, 0.03, 15.0)
    box.poll()  # the oldest is 20 ms old: held
    clock.now += 0.02
    box.add(31, 0.05, 6.0)
    assert out.messages == []
    clock.now += 0.011  # the oldest is 51 ms old: the next add sends all four
    box.add(40, 0.061, 9.0)
    assert out.messages == [("episodes", [(10, 0.01, 10.0), (25, 0.03, 15.0), (31, 0.05, 6.0), (40, 0.061, 9.0)])]
    # the next batch's window starts at its first episode; poll sends it once due
    box.add(52, 0.07, 12.0)
    clock.now += 0.049
    box.poll()
    assert len(out.messages) == 1
    clock.now += 0.001
    box.poll()
    assert out.messages[1] == ("episodes", [(52, 0.07, 12.0)])
    box.poll()
    box.flush()  # nothing held: nothing sent
    assert len(out.messages) == 2


def test_a_sent_batch_is_not_changed_by_later_episodes():
    """A multiprocessing queue pickles a message later, in its feeder thread: the list sent
    must not be the one the next episodes go into."""
    out, clock = _Out(), _Clock()
    box = EpisodeOutbox(out, 0.05, clock)
    box.add(1, 0.0, 1.0)
    box.flush()
    box.add(2, 0.0, 2.0)
    assert out.messages == [("episodes", [(1, 0.0, 1.0)])]


def test_the_with_form_flushes_on_exit_and_on_an_exception():
    out, clock = _Out(), _Clock()
    with EpisodeOutbox(out, 0.05, clock) as box:
        box.add(3, 0.1, 3.0)
        box.add(7, 0.2, 4.0)
    assert out.episodes() == [(3, 0.1, 3.0), (7, 0.2, 4.0)]
    with pytest.raises(RuntimeError, match="boom"):
        with EpisodeOutbox(out, 0.05, clock) as box:
            box.add(9, 0.3, 2.0)
            raise RuntimeError("boom")
    assert out.episodes()[-1] == (9, 0.3, 2.0) and len(out.messages) == 2


def test_interval_zero_sends_each_episode_and_bad_intervals_are_refused():
    out = _Out()
    box = EpisodeOutbox(out, 0)
    box.add(1, 0.0, 1.0)
    box.add(2, 0.0, 1.0)
    assert len(out.messages) == 2
    assert EpisodeOutbox(out).interval_s == EPISODES_EVERY_S == 0.05
    for bad in (-0.01, float("inf"), float("nan"), "0.05", True):
        with pytest.raises(ValueError, match=r"interval_s must be a finite number >= 0, got "):
            EpisodeOutbox(out, bad)


# ------------------------------------------------------------------------------- a real actor loop
STEPS = 4000


#: The worker loop that sends episodes, per engine: (module, loop function, role in a fail= hook).
WORKERS = {"process": ("process", "_actor_loop", "actor"), "dataflow": ("dataflow", "_server_loop", "server")}


def _engine(backend):
    import importlib

    return importlib.import_module(f"replaybench.impl.rl.engines.{WORKERS[backend][0]}")


def _actor_cfg(backend="process", **kw):
    from replaybench.impl.rl import TrainConfig

    # learning_starts past the run: no update is ever due, so the actor never waits for a learner;
    # one env (the dataflow server's one worker steps one), so returns are the steps between ends
    overrides = dict(hidden=(16, 16), batch_size=16, learning_starts=10**7, buffer_capacity=1024)
    return TrainConfig(algo="dqn", env="CartPole-v1", buffer="kary-aligned", policy="lazy-writing", steps=STEPS,
                       seed=3, actors=1, learners=1, overrides=overrides, backend=backend, **kw)


def _holding_outbox(monkeypatch, backend="process", stop_after=None):
    """Makes the worker loop's outbox hold every episode until its exit flush (so the test sees
    what that flush sends), and with ``stop_after`` set the run's stop flag (as the parent does
    on Ctrl-C or a peer's failure) once that many episodes have ended. Returns a dict whose
    "state" the caller fills with the run's SharedState."""
    run = {"state": None}

    class Holding(EpisodeOutbox):
        def __init__(self, out):
            super().__init__(out, 3600.0)
            self.added = 0

        def add(self, env_steps, wall_s, ret):
            super().add(env_steps, wall_s, ret)
            self.added += 1
            if self.added == stop_after:
                run["state"].stop()

    monkeypatch.setattr(_engine(backend), "EpisodeOutbox", Holding)
    return run


def _run_actor(cfg, out, run=None):
    """The worker loop of ``cfg.backend`` (the process engine's actor, the dataflow engine's
    server), in this process, as worker 0 of a run whose parent has published the learner's
    initial weights and said "go" (``run["state"]``, when given, gets the run's SharedState).
    Returns (stats or the exception raised, the steps it inserted)."""
    import multiprocessing as mp

    from replaybench.impl.concurrent import SharedPrioritizedBuffer
    from replaybench.impl.rl import algorithms
    from replaybench.impl.rl.common.envs import make_env, transition_fields
    from replaybench.impl.rl.common.local_replay import buffer_kwargs
    from replaybench.impl.rl.common.seeding import RunSeeds
    from replaybench.impl.rl.common.shared_state import SharedState, SharedWeights

    loop = getattr(_engine(cfg.backend), WORKERS[cfg.backend][1])
    acfg = cfg.validate()
    algo = algorithms.get(cfg.algo)
    env = make_env(cfg.env, algo)
    fields, spaces = transition_fields(env), (env.observation_space, env.action_space)
    env.close()
    flat = algo.learner_cls(spaces, acfg, RunSeeds(cfg.seed).networks).get_flat_weights()
    ctx = mp.get_context("spawn")
    buf = SharedPrioritizedBuffer.create(acfg.buffer_capacity, fields, variant=cfg.buffer, policy=cfg.policy,
                                         seed=0, **buffer_kwargs(cfg, acfg))
    state = SharedState(ctx, 1, 1)
    try:
        weights = SharedWeights(ctx, state, flat.numel())
        weights.publish(flat)
        state.go()
        if run is not None:
            run["state"] = state
        try:
            got = loop(cfg, 0, buf, state, weights, out)
        except Exception as e:  # noqa: BLE001  (Stopped and InjectedFailure: the test looks at which)
            got = e
        return got, int(state.actor_steps[0])
    finally:
        buf.close()
        state.close()


@pytest.fixture(scope="module", params=sorted(WORKERS))
def full_run(request):
    """A worker loop's episodes over a whole run, per engine: what the parent received, in order
    (``.backend`` says which engine's loop)."""
    out = _Out()
    out.backend = request.param
    stats, steps = _run_actor(_actor_cfg(request.param), out)
    assert isinstance(stats, dict) and steps == STEPS
    return out


def _consecutive(rows):
    """CartPole pays 1 per step, so with one env each episode's return is the steps since the
    last one ended: true of ``rows`` iff none was lost, doubled or reordered."""
    ends = [0] + [steps for steps, _, _ in rows]
    return [ret for _, _, ret in rows] == [float(b - a) for a, b in zip(ends, ends[1:])]


def test_an_actor_batches_its_episodes_and_sends_the_rows_one_message_each_would(full_run, monkeypatch):
    """The same run with an outbox that sends each episode at once (one message per episode,
    as before the outbox) gives the same rows; the batched run sent fewer messages."""
    rows = full_run.episodes()
    assert len(rows) > 20 and _consecutive(rows)
    monkeypatch.setattr(_engine(full_run.backend), "EpisodeOutbox", lambda out: EpisodeOutbox(out, 0))
    one_each = _Out()
    _run_actor(_actor_cfg(full_run.backend), one_each)
    assert len(one_each.batches()) == len(one_each.episodes())
    assert [(s, r) for s, _, r in rows] == [(s, r) for s, _, r in one_each.episodes()]
    assert all(0 <= a <= b for (_, a, _), (_, b, _) in zip(rows, rows[1:]))  # wall_s: when each ended
    # batched: fewer messages than episodes, every message a non-empty batch
    batches = full_run.batches()
    assert 1 <= len(batches) < len(rows) and all(m[1] for m in batches)


def test_an_actor_that_raises_sends_every_episode_it_finished(full_run, monkeypatch):
    """An injected failure at step 1500, with every episode held until the exit: the flush on
    the way out sends each episode that ended by then, the same as the whole run's up to that
    step, in one message."""
    from replaybench.impl.rl import InjectedFailure

    _holding_outbox(monkeypatch, full_run.backend)
    out = _Out()
    role = WORKERS[full_run.backend][2]
    got, _ = _run_actor(_actor_cfg(full_run.backend, fail=f"{role}:0:1500"), out)
    assert isinstance(got, InjectedFailure)
    expected = [(s, r) for s, _, r in full_run.episodes() if s <= 1500]
    assert expected and len(out.batches()) == 1
    assert [(s, r) for s, _, r in out.episodes()] == expected


def test_an_actor_stopped_mid_run_sends_every_episode_it_finished(full_run, monkeypatch):
    """The stop flag set when the 20th episode ends, every episode held until the exit: the
    actor stops at its next insert, and the flush on the way out sends every episode that ended
    in the steps it did."""
    from replaybench.impl.rl.common.shared_state import Stopped

    run = _holding_outbox(monkeypatch, full_run.backend, stop_after=20)
    out = _Out()
    got, steps = _run_actor(_actor_cfg(full_run.backend), out, run)
    assert isinstance(got, Stopped) and 0 < steps < STEPS
    expected = [(s, r) for s, _, r in full_run.episodes() if s <= steps]
    assert len(expected) >= 20 and len(out.batches()) == 1
    assert [(s, r) for s, _, r in out.episodes()] == expected


# ------------------------------------------------------------------------------- a real run
def test_process_and_dataflow_runs_record_each_episode_in_order():
    """1 actor with one env, 1 learner, learning: the parent's log holds every episode the actor
    finished (consecutive returns are the steps between their ends) with wall_s in the run;
    likewise the dataflow engine's, whose server sends them."""
    from replaybench.impl.rl import TrainConfig, train

    cfg = TrainConfig(algo="dqn", env="CartPole-v1", buffer="kary-aligned", policy="lazy-writing", steps=1500,
                      seed=5, actors=1, learners=1, timeout_s=120,
                      overrides=dict(hidden=(16, 16), batch_size=16, learning_starts=100, buffer_capacity=2048,
                                     updates_per_step=0.25))
    result = train(cfg)
    assert result.engine == "process" and result.env_steps == 1500
    rows = result.episodes
    assert len(rows) > 10 and _consecutive(rows)
    assert all(0 <= wall <= result.wall_s for _, wall, _ in rows)  # when it ended, not when it was sent
    # the dataflow engine's server sends its episodes through the same outbox (one env worker, one env)
    flow = train(dataclasses.replace(cfg, backend="dataflow", steps=800, join_timeout_s=5))
    assert flow.engine == "dataflow" and len(flow.episodes) > 5 and _consecutive(flow.episodes)
