"""The learners' gradient all-reduce: shared memory (ours) against torch.distributed's gloo.

``python -m replaybench.bench.allreduce_latency [--learners 2] [--size 17410] [--calls 2000]
[--rounds 3]`` starts ``learners`` processes per round and method; each averages a float32
vector of ``size`` elements (17,410: the DQN CartPole preset's Q-network, 4-128-128-2) ``calls``
times back to back, after 50 untimed calls, and reports its seconds per call. Methods:

==========  ==================================================================================
shm         :class:`impl.rl.common.allreduce.SharedAllreduce` (what the process engine uses)
gloo        ``torch.distributed.all_reduce`` (sum, then divide) over gloo on 127.0.0.1 (what the
            process engine used before, and what the Ray engine uses)
==========  ==================================================================================

Printed: per method, the median over rounds of the slowest learner's mean microseconds per call.
The methods alternate round by round (google-benchmark's interleaving against drift). Nothing is
written to results/: this backs the choice documented in docs/engines/process.md and in
:mod:`impl.rl.common.allreduce`. Timings on a machine with fewer free cores than learners
measure the scheduler as much as the all-reduce: say so beside any figure taken there.
"""

from __future__ import annotations

import argparse
import statistics
import time

__all__ = ["main", "measure"]

_WARMUP = 50


def _shm_worker(group, rank: int, size: int, calls: int, out) -> None:
    import numpy as np

    group.bind(rank)
    vec = np.ones(size, np.float32)
    for _ in range(_WARMUP):
        group.mean(vec)
    group.barrier()
    t0 = time.perf_counter()
    for _ in range(calls):
        group.mean(vec)
    out.put((rank, (time.perf_counter() - t0) / calls))


def _gloo_worker(port: int, world: int, rank: int, size: int, calls: int, out) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        vec = torch.ones(size)
        for _ in range(_WARMUP):
            dist.all_reduce(vec)
            vec /= world
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(calls):
            dist.all_reduce(vec)
            vec /= world
        out.put((rank, (time.perf_counter() - t0) / calls))
    finally:
        dist.destroy_process_group()


def measure(method: str, learners: int, size: int, calls: int) -> float:
    """Seconds per all-reduce of the slowest of ``learners`` processes (one round)."""
    import multiprocessing as mp

    from replaybench.impl.rl.common.allreduce import SharedAllreduce
    from replaybench.impl.rl.common.processes import free_port

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    if method == "shm":
        group = SharedAllreduce(ctx, learners, size, timeout_s=120)
        procs = [ctx.Process(target=_shm_worker, args=(group, r, size, calls, out)) for r in range(learners)]
    elif method == "gloo":
        port = free_port()
        procs = [ctx.Process(target=_gloo_worker, args=(port, learners, r, size, calls, out)) for r in range(learners)]
    else:
        raise ValueError(f"method must be 'shm' or 'gloo', got {method!r}")
    for p in procs:
        p.start()
    try:
        per_call = dict(out.get(timeout=300) for _ in procs)
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
                p.join()
    return max(per_call.values())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m replaybench.bench.allreduce_latency", description=__doc__.split("\n")[0])
    parser.add_argument("--learners", type=int, default=2)
    parser.add_argument("--size", type=int, default=17410)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    for name in ("learners", "size", "calls", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    times: dict[str, list[float]] = {"shm": [], "gloo": []}
    for _ in range(args.rounds):
        for method in times:
            times[method].append(measure(method, args.learners, args.size, args.calls))
    print(f"{args.learners} learners, {args.size} float32, {args.calls} calls x {args.rounds} rounds "
          "(us per call, slowest learner, median over rounds):")
    for method, values in times.items():
        print(f"  {method:5s} {statistics.median(values) * 1e6:9.1f}   rounds: "
              + ", ".join(f"{v * 1e6:.1f}" for v in values))
    print(f"  gloo / shm: {statistics.median(times['gloo']) / statistics.median(times['shm']):.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
