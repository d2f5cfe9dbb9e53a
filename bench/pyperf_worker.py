"""One micro benchmark (target x capacity x op) timed by pyperf: a manager's and its workers' code (or
``python -m replaybench.bench.pyperf_worker``).

The micro scenario (:mod:`bench.scenarios.micro`) runs this module once per grid item as a pyperf *manager*
(:func:`bench.manager_server.run_manager`);
pyperf then runs fresh *worker* processes (one calibration worker unless ``--loops`` is given,
then ``--processes`` value workers), each of which builds the buffer, fills it and times the
op. So a filled buffer is reused for all warm-ups, values and loops of one worker, but not
across ops: pyperf runs exactly one benchmark per worker process.

**Which process forks, and the rule that makes it safe.** Managers and workers are forked, not
started as new interpreters, so that numpy, numba's cached kernels and a peer's library
(TorchRL and Tianshou import torch: 3-6 s each time) are loaded once, not once per worker. A
forked child has one thread and a copy of every library's state, so a thread pool used before
the fork (GNU OpenMP's team under torch, pyarrow's, numba's threading layer) waits in the child
for threads that do not exist: the rule is that **a process that forks has started no thread
pool**. The scenario's own process cannot keep it (it measures GIL shares on full-size torch
buffers, compacts rows with pyarrow, runs other suites first), so it never forks: a manager
server, started once as a new interpreter (:mod:`bench.manager_server`), forks each manager
after :func:`preload`, and checks that the preload started no thread. Preload imports what the
target needs and runs the op once on a small buffer; a library whose ops start a pool (torch)
is only imported there (``FORK_AFTER_USE = False`` in its peer module, or in a registered
variant's module, whose ``preload()`` then imports what it needs: impl/variants/torch_kary.py).
The manager runs only the same preload before pyperf forks its workers, so it keeps the rule
too; the server's imports and kernels are inherited, so the first item of a target pays the
preload once per run and the later ones inherit it.

Each worker is a new process with its own buffer, built, filled and warmed up in it; it runs
pyperf's own worker code (``Runner`` in ``--worker`` mode) on the arguments pyperf gives it,
writes to pyperf's pipe, and exits (both manager and workers are forked as multiprocessing
Processes, see :data:`_FORK`). Only the spawning is ours (:class:`ForkingRunner`); calibration,
the values and the JSON are pyperf's. (So pyperf's ``--python`` option, another interpreter for
the workers, has no effect here: the workers are this interpreter.) Workers mark their progress
in ``--progress-file`` (:class:`TimedOp`), so a cell that deadlocks is stopped in seconds
(:mod:`bench.stall_watch`), not at its timeout.

Set-up happens on the first call of the time function, before its clock starts: look up the
variant, build and fill the buffer, make the input pools, call the op once. A set-up error is
written to ``--error-file`` so the scenario can record it.

Worker processes get pyperf's reduced environment (PATH, HOME, PYTHONPATH, locale) plus
whatever ``--inherit-environ`` names; the scenario passes NUMBA_* and thread-count variables on.
(Variables read at import time, such as NUMBA_*, are read once by the manager server, which
inherits the caller's environment.)
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

__all__ = ["build_call", "preload", "TimedOp", "ForkingRunner", "main", "fork_manager", "manager_options"]

#: Our options, forwarded from the manager to every worker it spawns.
_FORWARDED = ("target", "capacity", "op", "batch", "mixed_adds", "transitions", "seed", "error_file", "params",
              "threads", "resolved_file", "progress_file")
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
    """pyperf's time function: ``self(loops)`` -> seconds, building the call on first use. With
    ``--progress-file``, a byte is appended to that file after the set-up and after every call
    (the caller's :class:`bench.stall_watch.StallWatch` reads its size), outside the timing."""

    def __init__(self, args):
        self.args = args
        self.call = None
        self.progress = None

    def _mark(self) -> None:
        if self.args.progress_file:
            if self.progress is None:
                self.progress = os.open(self.args.progress_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.write(self.progress, b".")

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
            self._mark()
        if isinstance(self.call, list):
            seconds = workloads.time_threads(self.call, loops)
        else:
            seconds = workloads.time_calls(self.call, loops)
        self._mark()
        return seconds


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
    p.add_argument("--progress-file", help="a file the workers append a byte to after set-up and each timed call "
                                           "(bench/stall_watch.py)")
    args = runner.parse_args(argv)
    if not args.worker:
        preload(args)
    name = f"{args.target}/{args.capacity}/{args.op}"
    runner.bench_time_func(name, TimedOp(args), inner_loops=1)


def fork_manager(argv: list[str], stderr_path: str):
    """Start :func:`main` on ``argv`` (a manager's options) in a :data:`_FORK` child of this
    process, in a session of its own (its pid is its session id), stdout dropped and stderr
    into ``stderr_path``; the started Process. Called only by the manager server
    (:mod:`bench.manager_server`), whose rule makes the fork safe."""
    sys.stdout.flush()
    sys.stderr.flush()
    # Ctrl-C stays pending across the fork: a child interrupted before it has its own session
    # would unwind through the caller's stack as a second copy of it.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        child = _FORK.Process(target=_manager_child, args=(argv, mask, stderr_path), name="pyperf-manager")
        child.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    return child


def manager_options(argv: list[str]) -> argparse.Namespace:
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
