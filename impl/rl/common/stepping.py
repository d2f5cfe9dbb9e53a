"""Batched environment stepping over worker processes through shared memory (PAAC's runners).

:class:`SharedVectorEnv` holds ``n_envs`` copies of one environment, split over ``n_workers``
processes, and steps them in lock step: the master writes every action into a shared array,
wakes the workers, each steps its own slice in place, and the master reads the observations,
rewards and episode flags back from shared arrays, ready for one batched forward pass::

    master                                          worker w (envs lo_w .. hi_w)
      actions[part] = policy(obs[part])               loop:
      write 1 byte to each worker's command pipe ──►    read 1 byte (the part to step)
                                                        step its envs of that part in place
      wait for 1 byte from each worker          ◄──     write 1 byte to its done pipe
      read obs / rewards / flags of the part

No per-step pickling: each step costs one 1-byte pipe write and read per worker in each
direction (a few microseconds, and a sleeping process wakes as soon as its byte arrives, with
no polling). The data stays in one shared block (:func:`multiprocessing.RawArray`: anonymous
memory whose /dev/shm file is unlinked at creation, so nothing is left there however the
processes end). The system calls on the pipes order the memory accesses: a worker reads the
actions after the master wrote them, the master reads the results after the worker wrote them.

Halves (``halves=True``): the environments form two parts, 0 = the first ``n_envs // 2`` and
1 = the rest, and every worker owns a slice of each. ``step_async(a0, part=0)`` starts the
workers on part 0 and returns at once, so the master can run the forward pass of part 1 while
part 0 steps (PAAC's synchronous loop leaves the cores idle during inference and the master
idle during stepping; alternating halves overlaps the two)::

    venv.step_async(policy(obs0), part=0)
    obs1, *_ = venv.step_wait(part=1); venv.step_async(policy(obs1), part=1)
    obs0, *_ = venv.step_wait(part=0); ...

Episodes: an environment whose episode ended (terminated or truncated) is reset at once by its
worker; ``obs`` holds the first observation of the new episode and :attr:`final_obs` the last
one of the finished episode. Returns and lengths of finished episodes are kept in shared
memory and listed by :meth:`pop_episodes`.

Seeds: environment ``i`` is seeded with ``seed + i`` at the first :meth:`reset` and never again,
so the transitions equal those of a plain loop over ``make_env(env_id)`` copies reset with the
same seeds and reset without a seed when an episode ends, bit for bit, for any ``n_workers``.

Exit paths: a worker that raises reports its traceback on its done pipe and exits; a worker
that dies closes its pipes (the master also watches its process sentinel); either way the next
:meth:`step_wait` closes everything and raises :class:`~impl.rl.config.WorkerFailed` naming the
worker. A worker that dies between steps is found by the next command sent to it (its pipe is
broken): the same WorkerFailed, every other worker stopped. :meth:`close` (idempotent; also on
``__exit__``, garbage collection and interpreter exit) closes the command pipes, so the workers
read end-of-file and exit; stragglers are terminated, then killed (after JOIN_TIMEOUT_S; after
a timeout, when a worker may be stuck in a step that never returns, at once). A master that
dies closes the same pipes, so its workers exit too.
Workers ignore SIGINT: Ctrl-C interrupts the master, which then closes them.
"""

from __future__ import annotations

import ctypes
import math
import os
import pickle
import select
import signal
import struct
import time
import traceback
import weakref
from collections import deque

import gymnasium as gym
import numpy as np
from replaybench.impl.rl.common.envs import make_env
from replaybench.impl.rl.common.errors import ConfigError, WorkerFailed

__all__ = ["SharedVectorEnv"]

START_METHODS = ("spawn", "forkserver")
JOIN_TIMEOUT_S = 5.0  # close(): how long workers get to exit before they are terminated
_HUNG_JOIN_S = 0.5  # the same after a timeout: a worker stuck in a step never reads its pipe

# Commands (one byte): 0 and 1 step that part, _ALL steps every env, the resets reset every env.
_ALL, _RESET_SEEDED, _RESET = 2, 3, 4
# Replies: _OK after each command; _FAILED + 4-byte length + traceback once, then the worker exits.
_OK, _FAILED = b".", b"!"
_ALIGN = 64  # each shared array starts on its own cache line


def _split(lo: int, hi: int, parts: int) -> list[tuple[int, int]]:
    """``range(lo, hi)`` cut into ``parts`` contiguous ranges whose sizes differ by at most one."""
    n = hi - lo
    bounds = [lo + (n * k) // parts for k in range(parts + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


def _layout(n_envs: int, obs_shape: tuple, obs_dtype, act_shape: tuple, act_dtype) -> dict:
    """``{name: (offset, shape, dtype)}`` of the shared arrays and the block's size in bytes."""
    fields = {
        "obs": ((n_envs, *obs_shape), obs_dtype),
        "final_obs": ((n_envs, *obs_shape), obs_dtype),
        "actions": ((n_envs, *act_shape), act_dtype),
        "rewards": ((n_envs,), np.float64),
        "terminated": ((n_envs,), np.bool_),
        "truncated": ((n_envs,), np.bool_),
        "ep_return": ((n_envs,), np.float64),      # running return of the current episode
        "ep_length": ((n_envs,), np.int64),
        "final_return": ((n_envs,), np.float64),   # of the episode that ended at the last step
        "final_length": ((n_envs,), np.int64),
    }
    layout, offset = {}, 0
    for name, (shape, dtype) in fields.items():
        layout[name] = (offset, shape, np.dtype(dtype))
        offset += -(-int(np.prod(shape)) * np.dtype(dtype).itemsize // _ALIGN) * _ALIGN
    return {"arrays": layout, "nbytes": max(offset, _ALIGN)}


def _views(block, layout: dict) -> dict:
    """Numpy arrays over ``block`` (a RawArray or bytearray) as ``layout`` places them."""
    base = np.frombuffer(block, dtype=np.uint8)
    return {name: base[off : off + int(np.prod(shape)) * dtype.itemsize].view(dtype).reshape(shape)
            for name, (off, shape, dtype) in layout["arrays"].items()}


# ----------------------------------------------------------------------------- stepping (both sides)
def _reset_range(envs: dict, lo: int, hi: int, a: dict, seed: int | None) -> None:
    for i in range(lo, hi):
        obs, _ = envs[i].reset(seed=None if seed is None else seed + i)
        a["obs"][i] = obs
    a["ep_return"][lo:hi] = 0.0
    a["ep_length"][lo:hi] = 0


def _step_range(envs: dict, lo: int, hi: int, a: dict, discrete: bool) -> None:
    """Step envs ``lo .. hi-1`` with ``a["actions"]``; reset the ones whose episode ended.

    Per env only the step, the observation's copy and three list appends; the scalar fields
    are written with one numpy call each (numpy's per-element indexing costs about as much
    as a CartPole step)."""
    actions = a["actions"][lo:hi].tolist() if discrete else a["actions"][lo:hi].copy()
    obs_out, final_obs = a["obs"], a["final_obs"]
    rewards, terminated, truncated = [], [], []
    for k in range(hi - lo):
        env = envs[lo + k]
        obs, reward, term, trunc, _ = env.step(actions[k])
        if term or trunc:
            final_obs[lo + k] = obs
            obs, _ = env.reset()
        obs_out[lo + k] = obs
        rewards.append(reward)
        terminated.append(term)
        truncated.append(trunc)
    sl = slice(lo, hi)
    a["rewards"][sl] = rewards
    a["terminated"][sl] = terminated
    a["truncated"][sl] = truncated
    a["ep_return"][sl] += a["rewards"][sl]
    a["ep_length"][sl] += 1
    ended = np.flatnonzero(a["terminated"][sl] | a["truncated"][sl]) + lo
    if ended.size:
        a["final_return"][ended] = a["ep_return"][ended]
        a["final_length"][ended] = a["ep_length"][ended]
        a["ep_return"][ended] = 0.0
        a["ep_length"][ended] = 0


def _worker(rank: int, env_id: str, atari, seed: int, ranges: list, discrete: bool, block, layout: dict,
            cmd_conn, done_conn, busy) -> None:
    """Worker process: make its envs, say ready, then serve commands until end-of-file."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the master's to handle; it closes us
    cmd_fd, done_fd = cmd_conn.fileno(), done_conn.fileno()
    envs: dict = {}
    try:
        for lo, hi in ranges:  # one range per part
            for i in range(lo, hi):
                envs[i] = make_env(env_id, atari=atari)
        a = _views(block, layout)
        os.write(done_fd, _OK)  # ready
        while True:
            command = os.read(cmd_fd, 1)
            if not command:  # the master closed the pipe, or died
                break
            t0 = time.perf_counter()
            c = command[0]
            if c in (_RESET_SEEDED, _RESET):
                for lo, hi in ranges:
                    _reset_range(envs, lo, hi, a, seed if c == _RESET_SEEDED else None)
            else:
                for lo, hi in ranges if c == _ALL else ranges[c : c + 1]:
                    _step_range(envs, lo, hi, a, discrete)
            busy[rank] += time.perf_counter() - t0
            os.write(done_fd, _OK)
    except BrokenPipeError:  # the master is gone
        pass
    except BaseException:
        text = f"stepping worker {rank} (pid {os.getpid()}):\n{traceback.format_exc()}".encode(errors="replace")
        try:
            os.write(done_fd, _FAILED + struct.pack("<I", len(text)) + text)
        except OSError:
            pass
    finally:
        for env in envs.values():
            try:
                env.close()
            except Exception:  # closing must not hide the report above
                pass


def _shutdown(procs: list, cmd_conns: list, done_conns: list, envs: dict, join_s: list) -> None:
    """Close the command pipes (workers read end-of-file and exit), join ``join_s[0]`` seconds,
    terminate, kill."""
    for conn in cmd_conns:
        conn.close()
    deadline = time.monotonic() + join_s[0]
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for signal_name in ("terminate", "kill"):
        alive = [p for p in procs if p.is_alive()]
        for p in alive:
            getattr(p, signal_name)()
        for p in alive:
            p.join(2.0)
    for conn in done_conns:
        conn.close()
    for env in envs.values():
        env.close()


# ----------------------------------------------------------------------------------------- master
class SharedVectorEnv:
    """``n_envs`` copies of ``env_id`` over ``n_workers`` processes, stepped in lock step
    through shared memory (see the module docstring for the protocol and the exit paths).

    Parameters
    ----------
    env_id : str
        Made with :func:`impl.rl.common.envs.make_env` (Atari preprocessing, non-Box observations
        flattened). Its actions must be Discrete (stored int64) or Box (stored float32).
    n_envs : int
        Environments, >= 1 (>= 2 with ``halves``).
    n_workers : int
        Worker processes, 0 .. n_envs; worker w steps a contiguous slice of each part. 0 steps
        every environment in this process (no processes; the same results).
    seed : int
        Environment ``i`` is reset with ``seed + i`` at the first :meth:`reset`.
    atari : AtariOptions or None
        Preprocessing choices of Atari ids (:mod:`impl.rl.common.atari`; None: the defaults).
    halves : bool
        Two parts that can be stepped independently (``part=0/1``); otherwise one.
    start_method : {"spawn", "forkserver"}
        How workers start. "fork" is refused: a forked worker would inherit the master's ends
        of the other workers' pipes and miss the end-of-file that tells it the master is gone.
    timeout_s : float
        Longest wait for the workers to start and for one command; past it the run fails
        (WorkerFailed).
    deadline : float or None
        A ``time.monotonic()`` value bounding the whole run across calls (the caller's run
        timeout): every wait for the workers ends there, and every :meth:`reset` and
        :meth:`step_async` checks it first, so in-process stepping stops within one env step
        of it; past it everything is closed and TimeoutError raised. None: no bound but
        ``timeout_s`` per wait. (An in-process env that never returns from one step cannot
        be interrupted; with workers, the wait ends at the deadline whatever they do.)

    Raises ConfigError naming the argument (``n_envs``, ``n_workers``, ``seed``, ``halves``,
    ``start_method``, ``timeout_s``, ``deadline``, ``env``) before any process starts, and
    WorkerFailed when a worker fails to make its environments (everything closed by then).

    Attributes
    ----------
    num_envs, n_workers : int
    single_observation_space, single_action_space : gym.Space
    obs_shape : tuple; obs_dtype : numpy dtype (uint8 for uint8 frames, else float32)
    worker_pids : list[int]

    Cost per :meth:`step`: the environment steps (in parallel over workers), one 1-byte pipe
    write and read per worker each way, and O(n_envs) numpy work in the master; a worker's
    step loop writes each result straight into shared memory. Thread-safety: one master thread.
    """

    def __init__(self, env_id: str, n_envs: int, n_workers: int, *, seed: int, halves: bool = False,
                 start_method: str = "spawn", timeout_s: float = 120.0, deadline: float | None = None, atari=None):
        self._closed = True  # until everything below exists (close() is safe meanwhile)
        for name, value, low in (("n_envs", n_envs, 1), ("n_workers", n_workers, 0), ("seed", seed, 0)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low:
                raise ConfigError(name, value, f"{name} must be an integer >= {low}, got {value!r}")
        if n_workers > n_envs:
            raise ConfigError("n_workers", n_workers, f"n_workers ({n_workers}) must be <= n_envs ({n_envs}): "
                                                      "a worker without environments would idle")
        if not isinstance(halves, bool):
            raise ConfigError("halves", halves, f"halves must be true or false, got {halves!r}")
        if halves and n_envs < 2:
            raise ConfigError("halves", halves, f"halves={halves!r} needs n_envs >= 2, got n_envs={n_envs}")
        if start_method not in START_METHODS:
            raise ConfigError("start_method", start_method,
                              f"start_method must be one of {START_METHODS}, got {start_method!r}")
        if (not isinstance(timeout_s, (int, float)) or isinstance(timeout_s, bool) or not math.isfinite(timeout_s)
                or timeout_s <= 0):
            raise ConfigError("timeout_s", timeout_s, f"timeout_s must be a finite number > 0, got {timeout_s!r}")
        if deadline is not None and (not isinstance(deadline, (int, float)) or isinstance(deadline, bool)
                                     or not math.isfinite(deadline)):
            raise ConfigError("deadline", deadline, f"deadline must be None or a time.monotonic() value, "
                                                    f"got {deadline!r}")
        probe = make_env(env_id, atari=atari)  # ConfigError("env") for an id that cannot be made
        try:
            obs_space, act_space = probe.observation_space, probe.action_space
        finally:
            probe.close()
        if isinstance(act_space, gym.spaces.Discrete):
            act_shape, act_dtype = (), np.int64
        elif isinstance(act_space, gym.spaces.Box):
            act_shape, act_dtype = tuple(act_space.shape), np.float32
        else:
            raise ConfigError("env", env_id, f"env {env_id!r} has actions {act_space}: need Discrete or Box")

        self.env_id = env_id
        self.atari = atari
        self.num_envs = int(n_envs)
        self.n_workers = int(n_workers)
        self.seed = int(seed)
        self.halves = halves
        self.timeout_s = float(timeout_s)
        self.deadline = None if deadline is None else float(deadline)
        self.single_observation_space = obs_space
        self.single_action_space = act_space
        self.obs_shape = tuple(obs_space.shape)
        self.obs_dtype = np.dtype(np.uint8 if obs_space.dtype == np.uint8 else np.float32)
        self._discrete = isinstance(act_space, gym.spaces.Discrete)
        self._parts = _split(0, self.num_envs, 2) if halves else [(0, self.num_envs)]
        layout = _layout(self.num_envs, self.obs_shape, self.obs_dtype, act_shape, act_dtype)
        self._episodes: list[tuple[int, float, int]] = []
        self._in_flight: set = set()         # parts (or _ALL) started and not yet waited for
        self._was_reset = False
        self._pending: dict = {}             # part -> workers that have not answered it yet
        self._queued: list[deque] = []       # per worker: the commands it has not answered, in order
        self._procs, self._cmd, self._done, self._envs = [], [], [], {}
        # how long close() waits for the workers to exit by themselves; after a timeout (a worker
        # that does not answer may never read its pipe) they are terminated at once
        self._join_s = [JOIN_TIMEOUT_S]

        if self.n_workers == 0:
            self._block = bytearray(layout["nbytes"])
            self._busy = np.zeros(0)
            self._envs = {i: make_env(env_id, atari=atari) for i in range(self.num_envs)}
            self._worker_parts = []
        else:
            self._start_workers(start_method, layout)
        self._a = _views(self._block, layout)
        self._closed = False
        self._finalizer = weakref.finalize(self, _shutdown, self._procs, self._cmd, self._done, self._envs,
                                           self._join_s)
        if self.n_workers:
            self._await(_RESET, startup=True)

    def _start_workers(self, start_method: str, layout: dict) -> None:
        import multiprocessing as mp

        ctx = mp.get_context(start_method)
        if start_method == "forkserver":
            ctx.set_forkserver_preload([__name__])  # imported once by the server, not per worker
        self._block = ctx.RawArray(ctypes.c_uint8, layout["nbytes"])
        busy = ctx.RawArray(ctypes.c_double, self.n_workers)
        self._busy = np.frombuffer(busy, dtype=np.float64)
        # worker w's range in each part
        self._worker_parts = [[_split(lo, hi, self.n_workers)[w] for lo, hi in self._parts]
                              for w in range(self.n_workers)]
        try:
            for w in range(self.n_workers):
                cmd_r, cmd_w = ctx.Pipe(duplex=False)
                done_r, done_w = ctx.Pipe(duplex=False)
                p = ctx.Process(target=_worker, name=f"stepping-{w}", daemon=True,
                                args=(w, self.env_id, self.atari, self.seed, self._worker_parts[w], self._discrete, self._block,
                                      layout, cmd_r, done_w, busy))
                self._cmd.append(cmd_w)
                self._done.append(done_r)
                p.start()
                self._procs.append(p)
                # The worker holds its own copies now; with ours closed, end-of-file means "peer gone".
                cmd_r.close()
                done_w.close()
        except BaseException:
            _shutdown(self._procs, self._cmd, self._done, {}, self._join_s)
            raise
        self._fd_worker = {conn.fileno(): w for w, conn in enumerate(self._done)}
        self._sentinel_worker = {p.sentinel: w for w, p in enumerate(self._procs)}
        self._poller = select.poll()
        for fd in (*self._fd_worker, *self._sentinel_worker):
            self._poller.register(fd, select.POLLIN)
        self._queued = [deque([_RESET]) for _ in range(self.n_workers)]  # the "ready" byte answers this
        self._pending = {_RESET: set(range(self.n_workers))}

    # ---------------------------------------------------------------------------------- protocol
    def _workers_of(self, part: int) -> set:
        """Workers that own at least one env of ``part`` (_ALL: every worker)."""
        if part in (_ALL, _RESET):
            return set(range(self.n_workers))
        return {w for w, ranges in enumerate(self._worker_parts) if ranges[part][1] > ranges[part][0]}

    def _send(self, command: int, part: int) -> None:
        """Send ``command`` to the workers of ``part``. A worker that died since its last answer
        (its end of the pipe is closed: BrokenPipeError) closes everything and raises
        WorkerFailed naming it, as a death during a step does."""
        workers = self._workers_of(part)
        self._pending[part] = set(workers)
        byte = bytes((command,))
        for w in workers:
            self._queued[w].append(part)
            try:
                os.write(self._cmd[w].fileno(), byte)
            except BrokenPipeError:
                self._died(w, "between steps")

    def _fail(self, worker: int | str, detail: str) -> None:
        pids = self.worker_pids
        self.close()
        raise WorkerFailed(f"stepping-{worker}" if isinstance(worker, int) else worker, detail, pids)

    def _read_reply(self, w: int) -> None:
        """Read one reply of worker ``w`` (its done pipe is readable): book an answer, or close
        everything and raise WorkerFailed on a report or on end-of-file (the worker died)."""
        fd = self._done[w].fileno()
        try:
            reply = os.read(fd, 1)
        except OSError:
            reply = b""
        if reply == _OK:
            self._pending[self._queued[w].popleft()].discard(w)
            return
        if reply == _FAILED:
            header = self._read_exactly(fd, 4)
            text = self._read_exactly(fd, struct.unpack("<I", header)[0]) if len(header) == 4 else b""
            self._fail(w, text.decode(errors="replace") or f"stepping-{w} raised (its report was cut short)")
        self._died(w, "without reporting")

    def _died(self, w: int, when: str) -> None:
        """Worker ``w`` is gone without a report: close everything, raise WorkerFailed naming it."""
        p = self._procs[w]
        p.join(1.0)
        self._fail(w, f"process stepping-{w} (pid {p.pid}) exited with code {p.exitcode} {when}")

    @staticmethod
    def _read_exactly(fd: int, n: int) -> bytes:
        chunks, got = [], 0
        while got < n:
            chunk = os.read(fd, n - got)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def _check_deadline(self, doing: str) -> None:
        """Close everything and raise TimeoutError when the run's :attr:`deadline` has passed."""
        if self.deadline is not None and time.monotonic() >= self.deadline:
            self._join_s[0] = _HUNG_JOIN_S
            self.close()
            raise TimeoutError(f"the run's time limit passed {doing}")

    def _await(self, part: int, startup: bool = False) -> None:
        """Block until every worker of ``part`` answered, at most ``timeout_s`` (WorkerFailed)
        and not past the run's :attr:`deadline` (TimeoutError); replies to other parts in
        flight are booked as they come (each worker answers its commands in order)."""
        deadline = time.monotonic() + self.timeout_s
        if self.deadline is not None:
            deadline = min(deadline, self.deadline)
        while self._pending[part]:
            events = self._poller.poll(max(0, int((deadline - time.monotonic()) * 1000)) + 1)
            if not events and time.monotonic() >= deadline:
                self._check_deadline(f"while waiting for stepping workers {sorted(self._pending[part])} to "
                                     f"{'start' if startup else 'answer'}")
                self._join_s[0] = _HUNG_JOIN_S
                self._fail(min(self._pending[part]), f"workers {sorted(self._pending[part])} did not "
                                                     f"{'start' if startup else 'answer'} within "
                                                     f"timeout_s={self.timeout_s} s")
            exited = []
            for fd, _ in events:
                if fd in self._fd_worker:
                    self._read_reply(self._fd_worker[fd])
                else:
                    exited.append(self._sentinel_worker[fd])
            for w in exited:  # a worker only exits on its own when it failed or died:
                while True:   # book what it answered, then its report or the end-of-file raises
                    self._read_reply(w)

    # ------------------------------------------------------------------------------------ API
    def part_slice(self, part: int | None = None) -> slice:
        """The envs of ``part`` (0 or 1 with ``halves``; None: all)."""
        if part is None:
            return slice(0, self.num_envs)
        if part not in range(len(self._parts)):
            raise ValueError(f"part must be None{' or 0, 1' if self.halves else ' (halves=False)'}, got {part!r}")
        return slice(*self._parts[part])

    def reset(self) -> np.ndarray:
        """Start a new episode in every env (the first call seeds env ``i`` with ``seed + i``);
        returns the observations ``(n_envs, *obs_shape)``, a read-only view valid until the
        next step. Not while a step is in flight."""
        self._check_open()
        if self._in_flight:
            raise RuntimeError(f"reset() while parts {sorted(self._in_flight)} are in flight: step_wait first")
        command = _RESET if self._was_reset else _RESET_SEEDED
        self._check_deadline("before a reset")
        if self.n_workers == 0:
            _reset_range(self._envs, 0, self.num_envs, self._a, None if self._was_reset else self.seed)
        else:
            self._send(command, _RESET)
            self._await(_RESET)
        self._was_reset = True
        self._episodes.clear()
        return self._readonly(self._a["obs"])

    def step(self, actions) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Step every env: ``step_async(actions)`` then ``step_wait()``."""
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions, part: int | None = None) -> None:
        """Write ``actions`` (one per env of ``part``: shape ``(len(part), *action_shape)``) and
        start the workers on that part; returns at once. A part already in flight (or, for
        part None, any part) raises RuntimeError; a wrong shape or dtype ValueError."""
        self._check_open()
        sl = self.part_slice(part)
        key = _ALL if part is None else part
        if not self._was_reset:
            raise RuntimeError("step before reset(): call reset() first")
        if key in self._in_flight or (self._in_flight and (key == _ALL or _ALL in self._in_flight)):
            raise RuntimeError(f"part {part} overlaps a step in flight: step_wait first")
        actions = np.asarray(actions)
        target = self._a["actions"][sl]
        if actions.shape != target.shape:
            raise ValueError(f"actions must have shape {target.shape} for part {part}, got {actions.shape}")
        try:
            np.copyto(target, actions, casting="same_kind")
        except TypeError:
            raise ValueError(f"actions must be {'integers' if self._discrete else 'floats'}, got {actions.dtype}") from None
        self._check_deadline("before a step")  # each step of a rollout: in-process stepping stops here
        self._in_flight.add(key)
        if self.n_workers == 0:
            _step_range(self._envs, sl.start, sl.stop, self._a, self._discrete)
        else:
            self._send(key, key)

    def step_wait(self, part: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Wait for the step of ``part`` started by :meth:`step_async`; returns read-only views
        ``(obs, rewards, terminated, truncated)`` of that part (float64 rewards), valid until
        that part's next step. Raises WorkerFailed (all closed) when a worker failed."""
        self._check_open()
        sl = self.part_slice(part)
        key = _ALL if part is None else part
        if key not in self._in_flight:
            raise RuntimeError(f"step_wait(part={part}) without step_async(part={part})")
        if self.n_workers:
            self._await(key)
        self._in_flight.discard(key)
        a = self._a
        ended = np.flatnonzero(a["terminated"][sl] | a["truncated"][sl]) + sl.start
        for i in ended.tolist():
            self._episodes.append((i, float(a["final_return"][i]), int(a["final_length"][i])))
        return (self._readonly(a["obs"][sl]), self._readonly(a["rewards"][sl]),
                self._readonly(a["terminated"][sl]), self._readonly(a["truncated"][sl]))

    def env_state(self) -> bytes | None:
        """The environments' whole state for a checkpoint (:mod:`impl.rl.common.checkpoint`):
        with ``n_workers=0`` the pickled envs (ALE emulators cloned) and the shared arrays
        (observations, running returns); None with worker processes (their envs stay there).
        Not while a step is in flight."""
        if self.n_workers or self._in_flight or not self._was_reset:
            return None
        from replaybench.impl.rl.common.checkpoint import pickle_envs

        return pickle.dumps((pickle_envs(self._envs), bytes(self._block)))

    def restore_env_state(self, state: bytes) -> np.ndarray:
        """Put back what :meth:`env_state` returned (``n_workers=0`` only; the envs it made are
        closed); returns the observations to act on, as :meth:`reset` does."""
        from replaybench.impl.rl.common.checkpoint import unpickle_envs

        if self.n_workers:
            raise RuntimeError("restore_env_state needs n_workers=0: worker processes keep their own envs")
        envs_blob, block = pickle.loads(state)
        for env in self._envs.values():
            env.close()
        self._envs = unpickle_envs(envs_blob)
        self._finalizer.detach()  # the new envs must be the ones closed at the end
        self._finalizer = weakref.finalize(self, _shutdown, self._procs, self._cmd, self._done, self._envs,
                                           self._join_s)
        self._block[:] = block
        self._was_reset = True
        self._episodes.clear()
        return self._readonly(self._a["obs"])

    @property
    def final_obs(self) -> np.ndarray:
        """``(n_envs, *obs_shape)``: the last observation of the episode that ended at env ``i``'s
        latest step (valid where that step's terminated | truncated). Read-only view."""
        return self._readonly(self._a["final_obs"])

    def pop_episodes(self) -> list[tuple[int, float, int]]:
        """``(env_index, return, length)`` of each episode finished since the last call, in the
        order the master saw them end (by step, then env index)."""
        episodes, self._episodes = self._episodes, []
        return episodes

    @property
    def worker_busy_s(self) -> np.ndarray:
        """Seconds each worker spent stepping and resetting its envs (a copy; for profiles:
        the rest of the master's wait is synchronisation and load imbalance)."""
        return self._busy.copy()

    @property
    def envs_per_worker(self) -> list[int]:
        """How many envs each worker steps ([n_envs] in process)."""
        if self.n_workers == 0:
            return [self.num_envs]
        return [sum(hi - lo for lo, hi in ranges) for ranges in self._worker_parts]

    @property
    def worker_pids(self) -> list[int]:
        return [p.pid for p in self._procs if p.pid is not None]

    @staticmethod
    def _readonly(arr: np.ndarray) -> np.ndarray:
        view = arr.view()
        view.flags.writeable = False
        return view

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("SharedVectorEnv is closed")

    def close(self, join_s: float | None = None) -> None:
        """Stop the workers (end-of-file on their command pipes; terminate, then kill, after
        ``join_s``, default JOIN_TIMEOUT_S) and close the environments. Idempotent."""
        if self._closed:
            return
        if join_s is not None:
            self._join_s[0] = min(self._join_s[0], join_s)
        self._closed = True
        self._finalizer()

    def __enter__(self) -> "SharedVectorEnv":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
