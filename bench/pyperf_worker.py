"""One micro benchmark (target x capacity x op) timed by pyperf: :func:`run_manager` (or ``python -m
replaybench.bench.pyperf_worker``).

The micro scenario (:mod:`bench.scenarios.micro`) runs this module once per grid item as a pyperf *manager*,
forked from the scenario's own process by :func:`run_manager` (so the interpreter start, the imports
and, after the first item of a target, its kernels are paid once per run, not once per item);
pyperf then runs fresh *worker* processes (one calibration worker unless ``--loops`` is given,
then ``--processes`` value workers), each of which builds the buffer, fills it and times the
op. So a filled buffer is reused for all warm-ups, values and loops of one worker, but not
across ops: pyperf runs exactly one benchmark per worker process.

Workers are forked from the manager, not started as new interpreters. Before it manages, the
manager imports what the target needs and runs the op once on a small buffer (:func:`preload`),
so numpy, numba's cached kernels and a peer's library (TorchRL and Tianshou import torch: 3-6 s
each time) are loaded once per item instead of once per worker. A library that does not survive
a fork once used (torch's thread pools) is only imported there (``FORK_AFTER_USE`` in its peer
module, or in a registered variant's module, whose ``preload()`` then imports what it needs:
impl/variants/torch_kary.py). Each worker is still a new
process with its own buffer, built, filled and warmed up in it; it runs pyperf's own worker
code (``Runner`` in ``--worker`` mode) on the arguments pyperf gives it, writes to pyperf's
pipe, and exits (both manager and workers are forked as multiprocessing Processes, see
:data:`_FORK`). Only the spawning is ours (:class:`ForkingRunner`); calibration, the values and
the JSON are pyperf's. (So pyperf's ``--python`` option, another interpreter for the workers, has
no effect here: the workers are this interpreter.)

Set-up happens on the first call of the time function, before its clock starts: look up the
variant, build and fill the buffer, make the input pools, call the op once. A set-up error is
written to ``--error-file`` so the scenario can record it.

Worker processes get pyperf's reduced environment (PATH, HOME, PYTHONPATH, locale) plus
whatever ``--inherit-environ`` names; the scenario passes NUMBA_* and thread-count variables on.
(Variables read at import time, such as NUMBA_*, are read once by the manager.)
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import sys
import time
import traceback

import pyperf

from replaybench.bench import contract, derive, workloads

__all__ = ["build_call", "preload", "TimedOp", "ForkingRunner", "main", "run_manager"]

#: Our options, forwarded from the manager to every worker it spawns.
_FORWARDED = ("target", "capacity", "op", "batch", "mixed_adds", "transitions", "seed", "error_file", "params",
              "threads", "resolved_file")
#: Capacity of the manager's warm-up buffer: large enough for a batch, small enough to fill at once.
_PRELOAD_CAPACITY = 1024


def _forward(cmd: list[str], args) -> None:
    for name in _FORWARDED:
        value = getattr(args, name)
        if value is not None:
            cmd.extend([f"--{name.replace('_', '-')}", str(value)])


def build_call(args, capacity: int | None = None, threads: int = 1):
    """Build the target and the op's call function (the untimed set-up) and run it once; with
    ``threads`` > 1, a list of that many, each on its own buffer (seeds ``seed``, ``seed + 1`` ...)."""
    calls = [workloads.warmed_call(args.op, args.target, capacity=args.capacity if capacity is None else capacity,
                                   fields=derive.SCHEMAS[args.transitions], batch=args.batch,
                                   mixed_adds=args.mixed_adds, seed=args.seed + t,
                                   params=json.loads(args.params) if args.params else None)
             for t in range(threads)]
    return calls if threads > 1 else calls[0]


def preload(args) -> None:
    """In the manager: import the target's libraries and load (or compile) its kernels by
    running the op once on a small buffer, which is then dropped; a peer that must not fork
    after use (:func:`bench.peers.fork_after_use`: torch) is only imported, and so is a variant
    whose module sets ``FORK_AFTER_USE = False`` (its ``preload()`` imports). Best effort: a
    target that fails here fails again in the worker, which records the error (``--error-file``)."""
    import importlib

    from replaybench.bench import peers
    from replaybench.impl import registry

    if args.op == "empty":
        return
    try:
        if peers.is_peer(args.target):
            module = None
        else:  # a registered variant's module may say the same as a peer's (impl/variants/torch_kary.py)
            module = importlib.import_module(registry.get(args.target).origin)
        if peers.is_peer(args.target) and not peers.fork_after_use(args.target):
            peers.load(args.target).version()
        elif module is not None and not getattr(module, "FORK_AFTER_USE", True):
            getattr(module, "preload", lambda: None)()
        else:
            build_call(args, capacity=min(args.capacity, _PRELOAD_CAPACITY))
    except Exception:  # the worker reports it, with the real capacity
        pass


class TimedOp:
    """pyperf's time function: ``self(loops)`` -> seconds, building the call on first use."""

    def __init__(self, args):
        self.args = args
        self.call = None

    def __call__(self, loops: int) -> float:
        if self.call is None:
            try:
                self.call = build_call(self.args, threads=self.args.threads)
            except BaseException:
                if self.args.error_file:
                    err = sys.exc_info()[1]
                    with open(self.args.error_file, "w") as fh:
                        fh.write(f"{type(err).__name__}: {err}\n\n{traceback.format_exc()}")
                raise
            if self.args.resolved_file:
                first = self.call[0] if isinstance(self.call, list) else self.call
                with open(self.args.resolved_file, "w") as fh:
                    json.dump(getattr(first, "resolved_params", {}), fh, sort_keys=True)
        if isinstance(self.call, list):
            return workloads.time_threads(self.call, loops)
        return workloads.time_calls(self.call, loops)


def _forking_manager():
    """pyperf's Manager with its one spawning method replaced by a fork (pyperf's module is
    private API, so pyproject.toml pins pyperf exactly: 2.11.0's ``Manager.spawn_worker`` and pipe helpers)."""
    from pyperf._bench import _load_suite_from_pipe
    from pyperf._manager import Manager
    from pyperf._utils import create_environ, create_pipe

    class ForkingManager(Manager):
        def spawn_worker(self, calibrate_loops, calibrate_warmups):
            env = dict(create_environ(self.args.inherit_environ, self.args.locale, self.args.copy_env))
            rpipe, wpipe = create_pipe()
            with rpipe:
                with wpipe:
                    cmd = self.worker_cmd(calibrate_loops, calibrate_warmups, wpipe.to_subprocess())
                    argv = cmd[1 + len(self.runner._program_args):]  # what the worker would parse
                    sys.stdout.flush()
                    sys.stderr.flush()
                    child = _FORK.Process(target=_worker_child, args=(rpipe.fd, env, argv), name="pyperf-worker")
                    child.start()
                try:
                    text = rpipe.read_text(timeout=self.args.timeout)
                except BaseException:
                    child.kill()
                    child.join()
                    raise
            child.join()
            if child.exitcode:
                raise RuntimeError(f"pyperf worker (forked, pid {child.pid}) failed with exit code {child.exitcode}")
            return _load_suite_from_pipe(text)

    return ForkingManager


#: How the manager and its workers are started: forked (they inherit the preloaded imports and
#: kernels), as multiprocessing Processes of the "fork" context rather than bare ``os.fork``
#: children. A Process child leaves through multiprocessing's own exit path: its exit code is
#: 0, a SystemExit's code or 1 after printing the traceback, stdout and stderr are flushed, it
#: never unwinds into its parent's stack, and it runs the finalizers of the multiprocessing
#: objects it made. That last part is why: peers make multiprocessing locks in every worker
#: (TorchRL's buffers do), each registered with the resource tracker that the forked children
#: share with the caller; a bare ``os.fork`` child left by ``os._exit`` without unregistering
#: them, so they piled up in the caller's tracker, which reported every one as leaked when the
#: run ended. Exiting through the finalizers unregisters them, with public API only (Python
#: offers no public way to give a forked child a tracker of its own: ``resource_tracker`` is
#: undocumented, its functions act on one module-level instance, and ``ensure_running`` keeps
#: an inherited live one; the documented start methods that start one, spawn, or forkserver,
#: whose children share the forkserver's, would not inherit the preloaded process either).
#: A resource a killed worker leaves behind is still the caller's tracker's to clean up.
_FORK = multiprocessing.get_context("fork")


def _worker_child(read_fd: int, env: dict, argv: list[str]) -> None:
    """In the forked worker (a :data:`_FORK` Process): pyperf's worker on ``argv``, in pyperf's
    reduced environment."""
    os.close(read_fd)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.environ.clear()
    os.environ.update(env)
    main(argv, runner_cls=pyperf.Runner)


def _manager_child(argv: list[str], mask, stderr_path: str) -> None:
    """In the forked manager (a :data:`_FORK` Process): a session of its own, Ctrl-C back to its
    default and unblocked (``mask``: the caller's signal mask before it blocked SIGINT), stdout
    dropped and stderr into ``stderr_path``, then :func:`main` on ``argv``."""
    os.setsid()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    devnull = os.open(os.devnull, os.O_WRONLY)
    err = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(devnull, 1)
    os.dup2(err, 2)
    main(argv)


class ForkingRunner(pyperf.Runner):
    """A pyperf Runner whose manager forks its workers from this (preloaded) process."""

    def _manager(self):
        bench = _forking_manager()(self).create_bench()
        if not self.args.quiet:
            print()
        self._display_result(bench)
        return bench


def main(argv=None, runner_cls=ForkingRunner) -> None:
    runner = runner_cls(program_args=("-m", "replaybench.bench.pyperf_worker"), add_cmdline_args=_forward)
    p = runner.argparser
    p.add_argument("--target", required=True, help="registered variant name, peer:<name> or 'harness'")
    p.add_argument("--capacity", type=int, default=0)
    p.add_argument("--op", required=True, choices=sorted(contract.OPS))
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--mixed-adds", type=int, default=4)
    p.add_argument("--transitions", default="cartpole", choices=sorted(derive.SCHEMAS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--error-file", help="where a worker writes its set-up error")
    p.add_argument("--resolved-file", help="where a worker writes its buffer's resolved_params (JSON)")
    p.add_argument("--params", help="JSON object of variant parameters for registry.create (K, dtype, ...)")
    p.add_argument("--threads", type=int, default=1, help="threads running the op at once, each on its own buffer")
    args = runner.parse_args(argv)
    if not args.worker:
        preload(args)
    name = f"{args.target}/{args.capacity}/{args.op}"
    runner.bench_time_func(name, TimedOp(args), inner_loops=1)


def run_manager(argv: list[str], timeout_s: float, stderr_path: str) -> int | None:
    """Run :func:`main` on ``argv`` (a manager's options) in a child forked from this process, in
    a session of its own; return its exit code, or None after killing its whole process group
    (the manager and its workers) once ``timeout_s`` has passed. Its stdout is dropped and its
    stderr written to ``stderr_path``. Any exception here (Ctrl-C) also kills the group first.

    Before forking, this process preloads the target (:func:`preload`), so the child starts
    with the target's libraries imported and its kernels loaded: the first item of a target
    pays that once and the later ones inherit it.
    """
    preload(_manager_options(argv))
    sys.stdout.flush()
    sys.stderr.flush()
    # Ctrl-C stays pending across the fork: a child interrupted before it has its own session
    # would unwind through the caller's stack as a second copy of it.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    child = _FORK.Process(target=_manager_child, args=(argv, mask, stderr_path), name="pyperf-manager")
    try:
        child.start()
    except BaseException:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        raise
    deadline = time.monotonic() + timeout_s
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a pending Ctrl-C lands here: the child is killed
        while child.exitcode is None:
            if time.monotonic() > deadline:
                _kill_session(child)
                return None
            child.join(0.01)
        return child.exitcode
    except BaseException:
        _kill_session(child)
        raise


def _kill_session(child) -> None:
    """Kill the manager Process ``child`` and its workers (its session), or only it if it has
    none yet, and reap it."""
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        child.kill()
    child.join()


def _manager_options(argv: list[str]) -> argparse.Namespace:
    """Our options (not pyperf's) out of a manager's ``argv``, for :func:`preload`."""
    p = argparse.ArgumentParser(add_help=False)
    for name in _FORWARDED:
        p.add_argument(f"--{name.replace('_', '-')}", dest=name)
    args, _ = p.parse_known_args(argv)
    args.capacity = int(args.capacity or 0)
    for name in ("batch", "mixed_adds", "seed"):
        setattr(args, name, int(getattr(args, name)))
    args.threads = int(args.threads or 1)
    return args


if __name__ == "__main__":
    main()
