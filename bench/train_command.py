"""The ``train`` command: one training run of the actor/learner loop into ``results/<run-id>/``.

    replaybench train --algo dqn --env CartPole-v1 --buffer kary-aligned --policy lazy-writing \\
        --actors 2 --learners 1 --steps 50000 --seed 0

One run with a progress bar (env steps/s, updates/s, mean return of the last 20 episodes);
``--actors 0``, ``--learners 0`` or ``--sequential`` runs the sequential baseline;
``--backend ray [--ray-address ADDR]`` runs the actors as Ray actors on any node of a Ray
cluster (:mod:`impl.rl.engines.ray.driver`; a local Ray without an address); ``--backend dataflow``
runs the actor side as a static dataflow (:mod:`impl.rl.engines.dataflow`: one server process
with one batched forward for all ``--actors`` x ``--envs-per-actor`` environments, stepped
in lock step by ``--actors`` env worker processes; same learners, buffer and rate limit).
``--algo a2c`` runs PAAC instead (:mod:`impl.rl.engines.paac`: one learner, ``--envs`` environments
over ``--workers`` stepping processes, an A2C update every ``--t-max`` steps; the replay
and backend options do not apply)::

    replaybench train --algo a2c --env CartPole-v1 --envs 32 --workers 2 --t-max 5 --steps 200000

The run goes through the driver as a one-cell run of the training scenario
(:mod:`bench.scenarios.training`, which documents the rows); suites of runs are
``replaybench run --suite training``.
"""

from __future__ import annotations

import argparse
import sys

from replaybench.bench import arguments, results
from replaybench.bench.scenarios.training import run_configs

__all__ = ["add_parser", "cmd_train"]


# ------------------------------------------------------------------------------------------ command
def add_parser(sub) -> argparse.ArgumentParser:
    """Add the ``train`` subcommand to ``replaybench``'s subparsers."""
    p = sub.add_parser("train", help="one training run (actor/learner loop) into results/<run_id>/")
    p.add_argument("--algo", default="dqn", help="dqn (discrete), td3 (continuous) or a2c (PAAC, discrete)")
    p.add_argument("--env", help="gymnasium id (default: CartPole-v1 for dqn, Pendulum-v1 for td3)")
    p.add_argument("--buffer", default="kary-aligned", help="registered variant (replaybench list)")
    p.add_argument("--policy", default="lazy-writing",
                   help="concurrency policy of the shared buffer: global-lock, pal-locks, lazy-writing, deferred, "
                        "optimistic (impl/concurrent/policies/)")
    p.add_argument("--param", type=arguments.key_value, action="append", metavar="KEY=VALUE",
                   help="buffer variant parameter, repeatable (K=8, dtype=float64)")
    p.add_argument("--set", type=arguments.key_value, action="append", metavar="KEY=VALUE", dest="overrides",
                   help="algorithm config field, repeatable (lr=5e-4, hidden=64,64, updates_per_step=0.25)")
    p.add_argument("--actors", type=int, default=2, help="actor processes (default 2; 0 = sequential)")
    p.add_argument("--learners", type=int, default=1, help="learner processes (default 1; 0 = sequential)")
    p.add_argument("--sequential", action="store_true", help="the one-process baseline (same as --actors 0)")
    p.add_argument("--steps", type=int, default=50_000, help="env steps over all actors")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--envs-per-actor", type=int,
                   help="environments each actor steps with one batched forward (default 1)")
    p.add_argument("--insert-batch", type=int, help="transitions per buffer add (default 8)")
    p.add_argument("--weight-sync-every", type=int, help="learner updates between weight broadcasts (default 10)")
    p.add_argument("--envs", type=int, help="a2c: environments stepped in lock step, n_e (preset: A2CConfig)")
    p.add_argument("--workers", type=int, help="a2c: stepping processes, n_w (capped at the cores; 0: in process)")
    p.add_argument("--t-max", type=int, help="a2c: steps per environment between updates")
    p.add_argument("--timeout", type=float, help="fail the run after this many seconds")
    p.add_argument("--device", help="where the learners compute: cpu (default), cuda, or auto (a GPU when torch "
                                    "sees one); actors always act on the CPU")
    p.add_argument("--checkpoint", help="a2c: save the run's checkpoint to this file (every --checkpoint-every env "
                                        "steps and at the end)")
    p.add_argument("--checkpoint-every", type=int, help="a2c: env steps between checkpoints (default: only at the end)")
    p.add_argument("--resume", help="a2c: continue the run saved in this checkpoint file up to --steps in all")
    p.add_argument("--backend", default="process", choices=("process", "ray", "dataflow"),
                   help="engine of the parallel loop: processes on this machine; dataflow: one server infers for "
                        "all actors x envs-per-actor envs, stepped in lock step by --actors env processes; or Ray "
                        "actors on any node of a "
                        "Ray cluster (needs the 'ray' extra)")
    p.add_argument("--ray-address", help="Ray backend: address of a running Ray cluster (default: a local Ray "
                                         "started for the run)")
    arguments.add_output_options(p, "default: <UTC time>-train")
    p.set_defaults(func=cmd_train, parser=p)
    return p


#: TrainConfig (and a2c config) fields set by the option of the same name (``--insert-batch``) ...
_OPTION_FIELDS = ("algo", "env", "buffer", "policy", "actors", "learners", "steps", "seed", "insert_batch",
                  "weight_sync_every", "envs_per_actor", "t_max", "backend", "ray_address", "checkpoint",
                  "checkpoint_every", "resume", "device")
#: ... and those whose option is named otherwise.
_RENAMED = {"buffer_params": "--param", "timeout_s": "--timeout", "n_envs": "--envs", "n_workers": "--workers"}


def _validated_config(args):
    """The TrainConfig ``args`` ask for, checked by :meth:`TrainConfig.validate` in this
    process before anything starts; a bad value exits 2 naming the option and the value."""
    from replaybench.impl.rl import ConfigError, TrainConfig, algorithms

    sequential = args.sequential or args.actors == 0 or args.learners == 0
    extra = {k: v for k, v in (("insert_batch", args.insert_batch), ("weight_sync_every", args.weight_sync_every),
                               ("timeout_s", args.timeout), ("ray_address", args.ray_address),
                               ("envs_per_actor", args.envs_per_actor), ("checkpoint", args.checkpoint),
                               ("checkpoint_every", args.checkpoint_every), ("resume", args.resume),
                               ("device", args.device)) if v is not None}
    paac = {k: v for k, v in (("n_envs", args.envs), ("n_workers", args.workers), ("t_max", args.t_max))
            if v is not None}
    try:
        if paac and args.algo != "a2c":
            raise ConfigError("algo", args.algo, f"--envs, --workers and --t-max are a2c's, not {args.algo}'s")
        own_loop = algorithms.get(args.algo).engine is not None  # a2c: runs on its own engine (paac)
        env = args.env or algorithms.get(args.algo).default_env
        cfg = TrainConfig(algo=args.algo, env=env, buffer=args.buffer, policy=args.policy,
                          buffer_params=dict(args.param or []), actors=0 if sequential or own_loop else args.actors,
                          learners=0 if sequential or own_loop else args.learners, steps=args.steps, seed=args.seed,
                          overrides={**dict(args.overrides or []), **paac}, backend=args.backend, **extra)
        cfg.validate()  # every field, then the engine's own checks (PAAC: the network's fit to the env)
    except ConfigError as err:
        arguments.config_error(args.parser, err, _OPTION_FIELDS, _RENAMED)
    return cfg


def cmd_train(args) -> int:
    cfg = _validated_config(args)
    command = [sys.executable, "-m", "replaybench.bench", *args.argv]
    try:
        run_dir = run_configs([cfg], out=args.out, run_id=args.run_id, machine=args.machine,
                              progress=not args.no_progress, command=command)
    except KeyboardInterrupt:
        return 130
    except results.ResultsWriteError as err:  # a full disk: what was written stays, marked incomplete
        print(f"error: {err}", file=sys.stderr)
        return 1
    rows = results.read_rows(run_dir)
    return 1 if any(r["status"] == "failed" for r in rows) else 0
