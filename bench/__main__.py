"""Command line: ``replaybench list | run | summary | compare | train``.

    replaybench list                              # registered variants and peers, with parameters
    replaybench run --suite default               # what `make bench` runs (micro, and later more)
    replaybench run --suite micro                 # the micro grid (about 10 minutes on 2 cores)
    replaybench run --suite sweep-k --param K=4,16 --capacities 2**16
    replaybench run --suite quick --variants binary,kary-aligned --out /tmp/r
    replaybench summary results/<run_id>          # reprint a stored run's summary
    replaybench compare results/<a> results/<b>   # run-to-run spread of the medians
    replaybench train --algo dqn --env CartPole-v1 --buffer kary-aligned --actors 2 --learners 1 --steps 50000
"""

from __future__ import annotations

import argparse
import sys


def _capacity(text: str) -> int:
    """``65536`` or ``2**16``."""
    try:
        if "**" in text:
            base, exp = text.split("**")
            value = int(base) ** int(exp)
        else:
            value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"capacity must be an integer or 2**N, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"capacity must be positive, got {text!r}")
    return value


def _value(text: str):
    """A grid value from the command line: int (also 2**N), float, true/false, else the string."""
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return _capacity(text) if "**" in text else int(text)
    except (ValueError, argparse.ArgumentTypeError):
        pass
    try:
        return float(text)
    except ValueError:
        return text


def _param(text: str) -> tuple[str, list]:
    """``K=2,4,8`` -> ``("K", [2, 4, 8])``."""
    key, sep, values = text.partition("=")
    key = key.strip()
    parsed = [_value(v.strip()) for v in values.split(",") if v.strip()]
    if not sep or not key or not parsed:
        raise argparse.ArgumentTypeError(f"--param takes key=v1,v2,..., got {text!r}")
    return key, parsed


def _csv(convert=str):
    def parse(text: str) -> list:
        return [convert(part.strip()) for part in text.split(",") if part.strip()]
    return parse


def _fmt_params(params: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items()) or "-"


def cmd_list(args) -> int:
    from replaybench.bench import peers
    from replaybench.bench.summary import format_table
    from replaybench.impl import registry

    body = []
    for name in registry.names():
        v = registry.get(name)
        extra = {k: val for k, val in v.accepted().items() if k not in v.params}
        body.append([name, v.structure, _fmt_params(v.params), _fmt_params(extra), v.description])
    for peer in peers.PEERS:
        name = peers.PREFIX + peer
        mod = peers.load(name)
        ok, detail = peers.availability(name)
        state = f"{peer} {detail}" if ok else f"UNAVAILABLE: {detail}"
        structural = {k: v for k, v in mod.PARAMS.items() if k not in registry.BUFFER_PARAMS}
        buffer = {k: v for k, v in mod.PARAMS.items() if k in registry.BUFFER_PARAMS}
        body.append([name, mod.STRUCTURE, _fmt_params(structural), _fmt_params(buffer), f"{mod.DESCRIPTION} [{state}]"])
    print("\n".join(format_table(["variant", "structure", "params", "buffer params", "description"], body, set())))
    for value, err in registry.failures().items():
        print(f"plug-in {value} failed to load: {err}")
    return 0


def cmd_run(args) -> int:
    from replaybench.bench import runner, suites

    try:
        suite = suites.load(args.suite)
    except ValueError as err:
        args.parser.error(str(err))
    overrides = {k: getattr(args, k) for k in ("processes", "values", "warmups", "loops", "min_time")
                 if getattr(args, k) is not None}
    command = [sys.executable, "-m", "replaybench.bench", *args.argv]
    params = dict(args.param or [])
    try:
        runner.run_suites(suite, variants=args.variants, capacities=args.capacities, ops=args.ops, out=args.out,
                          run_id=args.run_id, machine=args.machine, settings=overrides,
                          progress=not args.no_progress, command=command, params=params)
    except runner.SelectionError as err:  # unknown variant, peer or op: nothing was timed
        args.parser.error(str(err))
    except KeyboardInterrupt:
        return 130
    return 0


def cmd_summary(args) -> int:
    from replaybench.bench import contract, summary

    try:
        text = summary.format_run(args.run_dir)
    except contract.RunError as err:  # names the file and line; a broken run is not a crash
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(text)
    return 0


def add_commands(sub) -> None:
    """Add ``list``, ``run``, ``summary`` and ``train`` to an argparse subparsers object."""
    p = sub.add_parser("list", help="registered variants and peers with their parameters")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("run", help="run a suite and write results/<run_id>/")
    p.add_argument("--suite", default="default",
                   help="suite name in bench/suites/ (default, micro, quick, sweep-capacity, sweep-k, sweep-batch) "
                        "or a .json path")
    p.add_argument("--variants", type=_csv(), help="comma-separated variant names (peer:cpprb for the peer); "
                                                   "default: the suite's")
    p.add_argument("--capacities", type=_csv(_capacity), help="comma-separated, e.g. 2**16,2**20")
    p.add_argument("--ops", type=_csv(), help="comma-separated subset of the suite's ops")
    p.add_argument("--param", type=_param, action="append", metavar="KEY=V1,V2",
                   help="a parameter grid, repeatable: variant parameters (K=2,4,8 dtype=float32,float64) go to "
                        "registry.create, workload ones (batch, mixed_adds, transitions) change the calls; "
                        "replaces the suite's grid for that key; combinations a variant cannot take are "
                        "recorded as skipped")
    p.add_argument("--out", default="results", help="folder that receives <run_id>/ (default: results)")
    p.add_argument("--run-id", help="default: <UTC time>-<suite>")
    p.add_argument("--machine", help="machine label for the rows (default: host name)")
    for flag, kind in (("--processes", int), ("--values", int), ("--warmups", int), ("--loops", int),
                       ("--min-time", float)):
        p.add_argument(flag, type=kind, help="override the suite's pyperf setting")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_run, parser=p)

    p = sub.add_parser("summary", help="print the summary of a stored run")
    p.add_argument("run_dir")
    p.set_defaults(func=cmd_summary)

    from replaybench.bench import train  # the training loop's command (bench/train.py); imports torch only when run

    train.add_parser(sub)


def main(argv=None) -> int:
    """``python -m replaybench.bench``: the benchmark commands alone (``replaybench`` has them all)."""
    from replaybench.cli import main as cli_main

    return cli_main(argv, groups=(add_commands,), prog="python -m replaybench.bench")


if __name__ == "__main__":
    sys.exit(main())
