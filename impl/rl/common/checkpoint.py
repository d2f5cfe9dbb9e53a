"""Checkpoints of a PAAC run: what a stopped run needs to go on as if it had not stopped.

A checkpoint is one file written at a rollout boundary (after an update, every episode of the
finished rollouts logged), atomically: written to ``<path>.tmp`` and renamed, so a run killed
while writing leaves the previous checkpoint whole. It holds (:func:`save`, a ``torch.save``
dict):

- ``run``: the fields of the run that must agree to resume it (algo, env, seed, the algorithm
  config); :func:`check_compatible` refuses a checkpoint of another run, naming every field
  that differs;
- ``steps``, ``wall_s``: env steps and wall seconds of the run so far;
- ``episodes``: the episode log's ``(env_steps, wall_s, return)`` rows;
- ``learner``: :meth:`A2CLearner.state_dict` (network, optimizer, step counters, the action
  sampler's numpy generator, torch's generator);
- ``envs``: the environments' state (:func:`pickle_envs`), or None where the stepping backend
  cannot hand it over (worker processes, ALE's vector env): a resumed run then starts fresh
  episodes, seeded from ``seed + steps`` so they differ from the first ones, and continues in
  law but not bit for bit.

Bit for bit: with in-process stepping (``n_workers=0``) the environments are pickled with
their random generators; an ALE environment's emulator is not in its pickle, so its
``clone_state(include_rng=True)`` goes with it and is restored. A resumed run then makes the
same transitions, actions and updates as the run that never stopped (tested on CartPole).
Cost: one pickle of the envs and one ``torch.save`` of the network and optimizer per checkpoint.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import torch
from replaybench.impl.rl.common.errors import ConfigError

__all__ = ["KEYS", "save", "check_target", "load", "check_compatible", "read_resume", "pickle_envs", "unpickle_envs"]


def check_target(path: str | os.PathLike) -> None:
    """ConfigError (field "checkpoint") naming ``path`` when :func:`save` could not write there:
    a directory, a folder on its path that does not exist or is not a folder, a folder this
    process may not write in, or a directory where its temporary file ``<path>.tmp`` goes.
    Called before a run starts, so a bad path costs no run. Cost: a few ``stat`` calls."""
    path = Path(path)
    where = f"checkpoint {str(path)!r}"
    if path.is_dir():
        raise ConfigError("checkpoint", str(path), f"{where} is a directory; give the path of a file")
    folder = path.parent
    if not folder.exists():
        raise ConfigError("checkpoint", str(path), f"{where}: its folder {str(folder)!r} does not exist")
    if not folder.is_dir():
        raise ConfigError("checkpoint", str(path), f"{where}: {str(folder)!r} on its path is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError("checkpoint", str(path), f"{where}: cannot write in its folder {str(folder)!r}")
    tmp = path.with_name(path.name + ".tmp")
    if tmp.is_dir():
        raise ConfigError("checkpoint", str(path), f"{where}: its temporary file {str(tmp)!r} is a directory")


def save(path: str | os.PathLike, state: dict) -> None:
    """Write ``state`` to ``path`` atomically (a temporary file renamed over it). A save that
    raises (a full disk) removes its temporary file; the previous checkpoint stays whole."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


#: The keys of every checkpoint (:func:`save`'s dict, module docstring); a file without them
#: is not one of this project's checkpoints.
KEYS = ("run", "steps", "wall_s", "episodes", "learner", "envs")


def load(path: str | os.PathLike) -> dict:
    """The checkpoint at ``path``. ConfigError (field "resume"), naming the file and what is
    wrong, when it is empty, cannot be read, is not a file ``torch.save`` wrote (cut short,
    corrupt), or is not a checkpoint of this project (another program's ``torch.save``: not a
    dict with :data:`KEYS`, or ``steps``/``wall_s``/``episodes``/``run`` of the wrong type).
    Cost: one ``torch.load`` of the file."""
    where = f"resume: checkpoint {str(path)!r}"
    try:
        if os.path.getsize(path) == 0:
            raise ConfigError("resume", str(path), f"{where} is empty (0 bytes)")
        # weights_only=False: the checkpoint holds numpy generator states and pickled envs; load
        # only checkpoints this project wrote (a pickle runs code). map_location: a run on a GPU
        # saved device tensors; they load into host memory and the learner moves them to its device.
        ckpt = torch.load(path, weights_only=False, map_location="cpu")
    except ConfigError:
        raise
    except Exception as err:  # unpickling a foreign or cut file raises nearly anything
        raise ConfigError("resume", str(path), f"{where} cannot be read: {type(err).__name__}: {err} (not a "
                                               "checkpoint file, or one cut short)") from None
    if not isinstance(ckpt, dict) or not set(KEYS) <= set(ckpt):
        what = (f"a dict with keys {sorted(map(str, ckpt))}" if isinstance(ckpt, dict)
                else f"a {type(ckpt).__module__}.{type(ckpt).__qualname__}")
        raise ConfigError("resume", str(path), f"{where} is not a replaybench PAAC checkpoint: it holds {what}, "
                                               f"a checkpoint is a dict with keys {', '.join(KEYS)}")
    for key, kind in (("run", dict), ("steps", int), ("wall_s", (int, float)), ("episodes", list)):
        value = ckpt[key]
        if not isinstance(value, kind) or isinstance(value, bool) or (kind is not dict and kind is not list
                                                                      and value < 0):
            raise ConfigError("resume", str(path), f"{where} is not a replaybench PAAC checkpoint: its {key!r} "
                                                   f"is {value!r}")
    return ckpt


def _flat(run: dict, prefix: str = "") -> dict:
    """``{"a2c": {"lr": 1}}`` as ``{"a2c.lr": 1}``."""
    out = {}
    for key, value in run.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def check_compatible(ckpt: dict, run: dict, path) -> None:
    """ConfigError (field "resume") naming every field where ``ckpt``'s run and ``run`` differ,
    each with both values (``a2c.t_max: checkpoint 5, this run 4``); fields nested in the run
    (the algorithm config) are named with a dot."""
    saved, now = _flat(ckpt["run"]), _flat(run)
    absent = "(absent)"
    differ = [key for key in sorted(set(saved) | set(now)) if saved.get(key, absent) != now.get(key, absent)]
    if differ:
        listed = "; ".join(f"{key}: checkpoint {saved.get(key, absent)!r}, this run {now.get(key, absent)!r}"
                           for key in differ)
        raise ConfigError("resume", str(path), f"resume: checkpoint {str(path)!r} is of another run: {len(differ)} "
                                               f"setting(s) differ: {listed}")


def read_resume(path: str | os.PathLike, run: dict, steps: int) -> dict:
    """The checkpoint at ``path`` (:func:`load`) if a run ``run`` of ``steps`` env steps in all
    can resume it (:func:`check_compatible`); ConfigError (field "steps") when ``steps`` does
    not go past the checkpoint's steps (nothing would be left to run). Cost: :func:`load`'s."""
    ckpt = load(path)
    check_compatible(ckpt, run, path)
    if steps <= ckpt["steps"]:
        raise ConfigError("steps", steps, f"steps {steps} must exceed the {ckpt['steps']} env steps of checkpoint "
                                          f"{str(path)!r}: a resumed run goes on up to steps in all")
    return ckpt


def pickle_envs(envs: dict) -> bytes:
    """``{index: env}`` with each ALE emulator's full state (``clone_state(include_rng=True)``)."""
    emulators = {i: env.unwrapped.clone_state(include_rng=True) for i, env in envs.items()
                 if hasattr(env.unwrapped, "clone_state")}
    return pickle.dumps((envs, emulators))


def unpickle_envs(blob: bytes) -> dict:
    """The environments of :func:`pickle_envs`, emulators restored."""
    envs, emulators = pickle.loads(blob)
    for i, state in emulators.items():
        envs[i].unwrapped.restore_state(state)
    return envs
