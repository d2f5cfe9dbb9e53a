"""One micro benchmark (target x capacity x op) timed by pyperf: ``python -m replaybench.bench.pyperf_worker``.

The micro scenario (:mod:`bench.scenarios.micro`) starts this module once per grid item as a pyperf *manager*;
pyperf then re-runs it as fresh *worker* processes (``--worker``, one calibration worker
unless ``--loops`` is given, then ``--processes`` value workers), each of which builds the
buffer, fills it and times the op. So a filled buffer is reused for all warm-ups, values and
loops of one worker, but not across ops: pyperf runs exactly one benchmark per worker process.

Set-up happens on the first call of the time function, before its clock starts: import, look
up the variant, build and fill the buffer, make the input pools, call the op once (numba
kernels are loaded from the on-disk cache or compiled here). The manager process never builds
anything. A set-up error is written to ``--error-file`` so the scenario can record it.

Worker processes get pyperf's reduced environment (PATH, HOME, PYTHONPATH, locale) plus
whatever ``--inherit-environ`` names; the scenario passes NUMBA_* and thread-count variables on.
"""

from __future__ import annotations

import json
import sys
import traceback

import pyperf

from replaybench.bench import workloads

#: Our options, forwarded from the manager to every worker it spawns.
_FORWARDED = ("target", "capacity", "op", "batch", "mixed_adds", "transitions", "seed", "error_file", "params")


def _forward(cmd: list[str], args) -> None:
    for name in _FORWARDED:
        value = getattr(args, name)
        if value is not None:
            cmd.extend([f"--{name.replace('_', '-')}", str(value)])


def build_call(args):
    """Build the target and the op's call function (the untimed set-up) and run it once."""
    return workloads.warmed_call(args.op, args.target, capacity=args.capacity,
                                 fields=workloads.SCHEMAS[args.transitions], batch=args.batch,
                                 mixed_adds=args.mixed_adds, seed=args.seed,
                                 params=json.loads(args.params) if args.params else None)


class TimedOp:
    """pyperf's time function: ``self(loops)`` -> seconds, building the call on first use."""

    def __init__(self, args):
        self.args = args
        self.call = None

    def __call__(self, loops: int) -> float:
        if self.call is None:
            try:
                self.call = build_call(self.args)
            except BaseException:
                if self.args.error_file:
                    err = sys.exc_info()[1]
                    with open(self.args.error_file, "w") as fh:
                        fh.write(f"{type(err).__name__}: {err}\n\n{traceback.format_exc()}")
                raise
        return workloads.time_calls(self.call, loops)


def main(argv=None) -> None:
    runner = pyperf.Runner(program_args=("-m", "replaybench.bench.pyperf_worker"), add_cmdline_args=_forward)
    p = runner.argparser
    p.add_argument("--target", required=True, help="registered variant name, peer:<name> or 'harness'")
    p.add_argument("--capacity", type=int, default=0)
    p.add_argument("--op", required=True, choices=sorted(workloads.OPS))
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--mixed-adds", type=int, default=4)
    p.add_argument("--transitions", default="cartpole", choices=sorted(workloads.SCHEMAS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--error-file", help="where a worker writes its set-up error")
    p.add_argument("--params", help="JSON object of variant parameters for registry.create (K, dtype, ...)")
    args = runner.parse_args(argv)
    name = f"{args.target}/{args.capacity}/{args.op}"
    runner.bench_time_func(name, TimedOp(args), inner_loops=1)


if __name__ == "__main__":
    main()
