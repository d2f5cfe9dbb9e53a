"""The micro workloads: what one timed call does, with every input made before timing starts.

A workload runs against a :class:`Target`, the bound entry points of one buffer (a registered
variant or a peer library), looked up once so that the timed loop does no name lookup or
dispatch. One timed *call* is:

==============  =====================================================  ==============
op              one call                                               items per call
==============  =====================================================  ==============
empty           a pool lookup only: the timing loop's own cost          1 call
insert_one      ``add`` of one transition                               1 transition
insert_batch    ``add`` of ``batch`` transitions                        ``batch``
sample          ``sample(batch)``: indices, field data and IS weights   ``batch``
                (registered variants: into reused ``out=`` arrays)
sample_indices  ``sample`` of indices and IS weights only (no fields;   ``batch``
                registered variants only)
find            the tree's ``find`` of ``batch`` uniform draws in       ``batch``
                ``[0, total)``: the descent and the leaf read, draws
                included (prioritized variants only: no weights)
update          ``update_priorities`` of ``batch`` random stored slots  ``batch``
mixed           a DQN-like step: add ``mixed_adds``, sample ``batch``,  1 iteration
                update the sampled indices with new priorities
==============  =====================================================  ==============

Inputs (transition batches, random indices and priorities) come from pools generated in the
set-up and cycled through with ``pool[i & mask]``, so input RNG is not timed; the generator
handed to ``sample`` is, because drawing the sampling positions is part of sampling. The
update pool holds up to 2**20 indices, so at large capacities the tree paths it touches do not
all stay cached across calls. Before timing, the buffer is filled to capacity in chunks of
2**16 transitions and every slot gets a random priority (uniform in [0, 1)), so sampling
descends varied paths; insert ops then overwrite the ring, which stays full.

How each op is counted and shown (items per call, units) is the results contract's
(:data:`bench.contract.OPS`); the transition schemas a suite names are
:data:`bench.derive.SCHEMAS`.

:func:`time_calls` times a call in a loop; :func:`time_threads` times several calls, each in its
own thread on its own buffer, released together (the ``threads`` workload parameter).
"""

from __future__ import annotations

import functools
import threading
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from replaybench.bench.contract import OPS
from replaybench.bench.derive import SCHEMAS
from replaybench.impl.storage import random_batch

__all__ = ["Target", "random_batch", "variant_target", "fill", "make_call", "warmed_call", "time_calls", "time_threads",
           "gil_share"]

FILL_CHUNK = 2**16


@dataclass(frozen=True)
class Target:
    """Bound entry points of one buffer.

    ``add(batch)`` takes a dict of arrays with a leading batch axis; ``sample(n)`` returns a
    dict holding the sampled slots under ``index_key``; ``update(indices, priorities)`` sets
    raw priorities; ``fill_add(batch, priorities)`` adds with given priorities (set-up only);
    ``sample_indices(n)``, where the buffer has it, samples indices and weights without fields;
    ``find(us)``, where it has a sum tree, finds the leaves of the prefix sums ``us``.
    Adapters may wrap a timed call in at most one thin Python function.
    """

    buffer: object
    add: Callable
    sample: Callable
    update: Callable
    index_key: str
    fill_add: Callable
    sample_indices: Callable | None = None
    find: Callable | None = None


def variant_target(name: str, capacity: int, fields: dict, rng: np.random.Generator, batch: int | None = None,
                   **params) -> Target:
    """A registered variant, its defaults overridden by ``params``; ``sample`` draws from ``rng``.

    With ``batch``, ``sample(batch)`` and ``sample_indices(batch)`` write into output arrays
    made once here (``out=buffer.sample_out(batch)``: the steady state of a training loop);
    without, ``sample`` returns fresh arrays."""
    from replaybench.impl import registry

    buf = registry.create(name, capacity, fields, **params)
    sample, sample_indices = functools.partial(buf.sample, rng=rng), None
    if batch is not None:
        sample, sample_indices = _sample_into(buf, rng, buf.sample_out(batch)), _sample_into(
            buf, rng, buf.sample_out(batch, fields=False))
    tree = getattr(buf, "tree", None)
    return Target(buf, buf.add, sample, buf.update_priorities, "indices", buf.add, sample_indices,
                  None if tree is None else tree.find)


def _sample_into(buf, rng: np.random.Generator, out) -> Callable:
    """``sample(n)``: ``buf.sample(n, rng=rng, out=out)``. The one thin function a target may
    add: a ``functools.partial`` with keywords copies them into a new dict on every call, a
    cost of the harness that the timed op would include."""
    draw = buf.sample

    def sample(n):
        return draw(n, rng=rng, out=out)

    return sample


def fill(target: Target, capacity: int, fields: dict, rng: np.random.Generator) -> None:
    """Fill the buffer to ``capacity``, each slot with a random priority (not timed)."""
    chunk = min(capacity, FILL_CHUNK)
    data = random_batch(fields, chunk, rng)
    for start in range(0, capacity, chunk):
        n = min(chunk, capacity - start)
        target.fill_add(data if n == chunk else {k: v[:n] for k, v in data.items()}, rng.random(n))


def _pool_size(wanted: int) -> int:
    """Largest power of two <= wanted, at least 1 (so ``i & (size - 1)`` cycles the pool)."""
    return 1 << max(0, int(wanted).bit_length() - 1)


def make_call(op: str, target: Target | None, *, capacity: int, fields: dict, batch: int, mixed_adds: int,
              rng: np.random.Generator) -> Callable[[int], object]:
    """The function one timed call runs, ``call(i)`` for the i-th call; inputs made here."""
    if op == "empty":
        pool = [None] * 16

        def call(i):
            pool[i & 15]

        return call
    if target is None:
        raise ValueError(f"op {op!r} needs a buffer")
    add, sample, update, key = target.add, target.sample, target.update, target.index_key
    if op == "insert_one":
        ones = [random_batch(fields, 1, rng) for _ in range(1024)]

        def call(i):
            add(ones[i & 1023])

    elif op == "insert_batch":
        batches = [random_batch(fields, batch, rng) for _ in range(16)]

        def call(i):
            add(batches[i & 15])

    elif op == "sample":

        def call(i):
            sample(batch)

    elif op == "sample_indices":
        if target.sample_indices is None:
            raise ValueError("op 'sample_indices' needs a buffer that samples without fields (a registered variant)")
        sample_indices = target.sample_indices

        def call(i):
            sample_indices(batch)

    elif op == "find":
        if target.find is None:
            raise ValueError("op 'find' needs a buffer with a sum tree (a prioritized registered variant)")
        # the total of the filled buffer, read once: no micro op changes a priority between finds
        find, draw, total = target.find, rng.random, target.buffer.tree.total()

        def call(i):
            find(draw(batch) * total)

    elif op == "update":
        rows = _pool_size(min(4096, max(64, 4 * capacity // batch)))
        idx = rng.integers(0, capacity, (rows, batch), dtype=np.int64)
        prio = rng.random((rows, batch))
        idx_rows, prio_rows = list(idx), list(prio)
        mask = rows - 1

        def call(i):
            j = i & mask
            update(idx_rows[j], prio_rows[j])

    elif op == "mixed":
        adds = [random_batch(fields, mixed_adds, rng) for _ in range(16)]
        prio_rows = list(rng.random((64, batch)))

        def call(i):
            add(adds[i & 15])
            out = sample(batch)
            update(out[key], prio_rows[i & 63])

    else:
        raise ValueError(f"unknown op {op!r}; known: {', '.join(OPS)}")
    return call


def warmed_call(op: str, target_name: str | None, *, capacity: int, fields: dict, batch: int, mixed_adds: int = 4,
                seed: int = 0, params: dict | None = None) -> Callable[[int], object]:
    """The whole untimed set-up of one op, ending in a warm-up: ``call(i)`` ready to be timed.

    Builds ``target_name`` (a registered variant, or ``peer:<name>``; None for the ``empty``
    op) with ``params``, fills it (:func:`fill`), makes the input pools (:func:`make_call`) and
    calls the op once, so that first-touch page faults and numba's dispatch (or compilation,
    when its on-disk cache is cold) happen before any timing. Three generators spawned from
    ``seed`` feed the fill, the inputs and ``sample``, so a cell's inputs do not depend on the op.
    ``call.resolved_params`` holds the buffer's ``resolved_params`` (its ``"auto"`` settings as
    chosen: :mod:`impl.working_set`), ``{}`` for a target without them (a peer, ``empty``).
    """
    fill_rng, input_rng, sample_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3))
    target = None
    if op != "empty":
        if target_name.startswith("peer:"):
            from replaybench.bench import peers

            target = peers.load(target_name).target(capacity, fields, sample_rng)
        else:
            target = variant_target(target_name, capacity, fields, sample_rng, batch=batch, **(params or {}))
        fill(target, capacity, fields, fill_rng)
    call = make_call(op, target, capacity=capacity, fields=fields, batch=batch, mixed_adds=mixed_adds, rng=input_rng)
    call(0)
    call.resolved_params = dict(getattr(getattr(target, "buffer", None), "resolved_params", None) or {})
    return call


def time_calls(call: Callable[[int], object], loops: int) -> float:
    """Seconds for ``call(0) ... call(loops - 1)``: the timed region, nothing else."""
    calls = range(loops)
    t0 = time.perf_counter()
    for i in calls:
        call(i)
    return time.perf_counter() - t0


def time_threads(calls: list[Callable[[int], object]], loops: int) -> float:
    """Seconds for each of ``calls`` to run ``call(0) ... call(loops - 1)``, each in its own
    thread, all released at once: from the release to the last thread's end (starting the
    threads is not timed). An exception in a thread is raised here after all have ended."""
    release = threading.Barrier(len(calls) + 1)
    errors: list[BaseException] = []

    def run(call):
        release.wait()
        try:
            for i in range(loops):
                call(i)
        except BaseException as err:  # re-raised in the timing thread, which pyperf reports
            errors.append(err)

    threads = [threading.Thread(target=run, args=(call,), daemon=True) for call in calls]
    for t in threads:
        t.start()
    release.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return elapsed


def gil_share(name: str, capacity: int, *, batch: int = 256, transitions: str = "cartpole", calls: int = 2000,
              repeats: int = 5, seed: int = 0, **params) -> dict:
    """The share of a registered variant's ``sample(batch, out=...)`` call that holds the GIL.

    Method: the median seconds of a whole call from Python (``call_s``: argument checks, the
    key draw, numba's dispatch and the compiled kernel) and of the compiled kernel alone, run
    ``calls`` times from a compiled loop with the same arguments (``kernel_s``: no Python and
    no dispatch, so none of it needs the GIL). ``gil_share = 1 - kernel_s / call_s`` is what a
    second thread cannot overlap, so ``1 / gil_share`` bounds the speed-up of threads sampling
    in parallel. Set-up as :func:`warmed_call` (filled buffer, random priorities); timings are
    as noisy as the machine, so compare shares measured in one run.
    """
    from numba import njit

    from replaybench.impl import fused_ops as fused

    @njit(nogil=True)
    def kernel_loop(n, tree_args, size, stratified, beta, arena, table, block, block_table, index, weight, scratch):
        for c in range(n):
            fused.sample(*tree_args, size, c, stratified, beta, arena, table, block, block_table, index, weight,
                         scratch)

    fields = SCHEMAS[transitions]
    fill_rng, sample_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    target = variant_target(name, capacity, fields, sample_rng, batch=batch, **params)
    fill(target, capacity, fields, fill_rng)
    buf = target.buffer
    out = buf.sample_out(batch)
    tree_args = buf.tree.kernel_args if hasattr(buf, "tree") else buf._TREE_ARGS
    args = (tree_args, len(buf), buf.stratified, buf.beta if hasattr(buf, "beta") else 0.0, buf.storage.arena,
            out.src_table, out.block, out.block_table, out.index, out.weight, out.scratch)
    kernel_loop(1, *args)  # compile
    sample = target.sample
    call_s, kernel_s = [], []
    for _ in range(repeats):
        call_s.append(time_calls(lambda i: sample(batch), calls) / calls)
        t0 = time.perf_counter()
        kernel_loop(calls, *args)
        kernel_s.append((time.perf_counter() - t0) / calls)
    call, kernel = float(np.median(call_s)), float(np.median(kernel_s))
    return {"variant": name, "capacity": capacity, "batch": batch, "params": params, "call_s": call,
            "kernel_s": kernel, "gil_share": max(0.0, 1.0 - kernel / call)}


@functools.cache
def _nogil_spin():
    """A compiled ``spin(seconds, clock)``: busy until ``seconds`` have passed on the monotonic
    clock, the GIL released (:func:`gil_pair_ratio`'s stand-in for a kernel)."""
    from numba import njit

    from replaybench.impl.concurrent.atomics import monotonic

    @njit(nogil=True)
    def spin(seconds, clock):
        end = monotonic(clock) + seconds
        while monotonic(clock) < end:
            pass

    return spin


def gil_pair_ratio(held_s: float, free_s: float, *, calls: int = 2, steps: int = 2000, repeats: int = 5,
                   threads: int = 2) -> dict:
    """What ``threads`` threads (two by default) get over one on this machine when each step
    holds the GIL for ``held_s`` and runs compiled code without it for ``free_s``, in ``calls``
    alternations (a learner step: Python, then the sample kernel, Python, then the update
    kernel), with nothing else shared: the GIL's bound as this machine and interpreter deliver it.

    The bound ``2 / (1 + share)`` from a measured GIL share (:func:`gil_share`,
    :func:`bench.concurrency_workers.shared_gil_share`) counts only the GIL-held time. Handing
    the GIL over costs more: a thread that wants it back while the other holds it sleeps on a
    condition variable until the holder releases it and the OS wakes it (on a VM, an idle
    virtual CPU is woken through the hypervisor). This measures that, with busy
    waits standing in for the Python and the kernel (a Python loop on ``time.perf_counter``
    holding the GIL; :func:`_nogil_spin` without it). ``ratio = threads * one / together``
    (wall seconds of ``steps`` steps in one thread, and in each of ``threads`` threads started
    together, to the last one's end); median and range over ``repeats``. Returns ``{"held_s",
    "free_s", "calls", "steps", "threads", "ratio", "ratio_min", "ratio_max"}``. Costs about
    ``(1 + threads) * repeats * steps * (held_s + free_s)`` CPU seconds. Raises ValueError for
    a negative time, a non-positive count or fewer than two threads.
    """
    for name, value in (("held_s", held_s), ("free_s", free_s)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
            raise ValueError(f"{name} must be seconds in [0, 1), got {value!r}")
    for name, value in (("calls", calls), ("steps", steps), ("repeats", repeats)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 2:
        raise ValueError(f"threads must be an integer >= 2, got {threads!r}")
    spin, clock = _nogil_spin(), np.zeros(2, np.int64)
    spin(0.0, clock)  # compiles before anything is timed
    held, free = held_s / calls, free_s / calls
    start = threading.Barrier(threads)
    failures: list[BaseException] = []

    def run(times: list, together: bool) -> None:
        try:
            mine = np.zeros(2, np.int64)
            now = time.perf_counter
            if together:
                start.wait()
            t0 = now()
            for _ in range(steps):
                for _ in range(calls):
                    end = now() + held
                    while now() < end:
                        pass
                    spin(free, mine)
            times.append((t0, now()))
        except BaseException as err:  # raised by the caller, never lost in the second thread
            failures.append(err)
            start.abort()

    ratios = []
    for _ in range(repeats):
        alone: list = []
        run(alone, False)
        if failures:
            raise failures[0]
        together: list = []
        others = [threading.Thread(target=run, args=(together, True)) for _ in range(threads - 1)]
        for t in others:
            t.start()
        run(together, True)
        for t in others:
            t.join()
        if failures:
            raise failures[0]
        one = alone[0][1] - alone[0][0]
        wall = max(end for _, end in together) - min(begin for begin, _ in together)
        ratios.append(threads * one / wall)
    return {"held_s": held_s, "free_s": free_s, "calls": calls, "steps": steps, "threads": threads,
            "ratio": float(np.median(ratios)), "ratio_min": float(min(ratios)), "ratio_max": float(max(ratios))}
