"""The benchmark commands of ``replaybench``: ``list | run | summary | compact | train | gossip`` (the analysis
commands ``plots | report | compare`` are analysis/__main__.py's; replaybench/cli.py joins both).

    replaybench list                              # registered variants and peers, with parameters
    replaybench run --suite default               # what `make bench` runs (micro, and later more)
    replaybench run --suite micro                 # the micro grid (about 10 minutes on 2 cores)
    replaybench run --suite micro-sweep-k --param K=4,16 --capacities 2**16
    replaybench run --suite micro-quick --variants binary,kary-aligned --out /tmp/r
    replaybench summary results/<run_id>          # reprint a stored run's summary
    replaybench compact results/<run_id> ...      # rows.csv -> rows.parquet, checked equal first
    replaybench limits                            # this machine's memory latency, gather floor, line transfer
    replaybench plan --run results/<id> --cores 8,16   # scaling model of a concurrency run
    replaybench train --algo dqn --env CartPole-v1 --buffer kary-aligned --actors 2 --learners 1 --steps 50000
    replaybench gossip --nodes 4 --learners-per-node 1 --topology exponential --staleness 1 --steps 200000
"""

from __future__ import annotations

import sys

from replaybench.bench import arguments


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
    from replaybench.bench import driver, results, suites
    from replaybench.bench.scenarios import Selection, SelectionError

    try:
        suite = suites.load(args.suite)
    except ValueError as err:
        args.parser.error(str(err))
    settings = {k: getattr(args, k) for k in ("processes", "values", "warmups", "loops", "min_time")
                if getattr(args, k) is not None}
    selection = Selection(variants=args.variants, capacities=args.capacities, ops=args.ops,
                          params=dict(args.param or []), settings=settings)
    command = [sys.executable, "-m", "replaybench.bench", *args.argv]
    try:
        driver.run_suites(suite, selection, out=args.out, run_id=args.run_id, machine=args.machine,
                          progress=not args.no_progress, command=command)
    except SelectionError as err:  # a value or name the suite cannot take: nothing was created or measured
        args.parser.error(str(err))
    except KeyboardInterrupt:
        return 130
    except results.ResultsWriteError as err:  # a full disk: what was written stays, marked incomplete
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


def cmd_summary(args) -> int:
    from replaybench.bench import contract, driver

    try:
        text = driver.summarize_run(args.run_dir)
    except contract.RunError as err:  # names the file and line; a broken run is not a crash
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(text)
    return 0


def cmd_compact(args) -> int:
    """Compact each run folder named (rows.csv -> rows.parquet); every folder is checked to be a
    run folder before any is converted. One that cannot be converted (still being written, a
    damaged rows.parquet beside its CSV, a full disk ...) is reported on stderr by its path and
    left as it was, and the others are still converted (exit 1); one already compact (also by
    another compaction running at the same time) is said to be."""
    from pathlib import Path

    from replaybench.bench import compaction, contract, rowstore

    def size(path: Path) -> int:  # 0 for a file gone meanwhile (compacted by another process)
        try:
            return path.stat().st_size
        except FileNotFoundError:
            return 0

    folders = [Path(d) for d in args.run_dirs]
    for folder in folders:
        if not folder.is_dir() or not contract.has_rows(folder):
            print(f"error: run_dirs: {str(folder)!r} is not a run folder (no rows.csv or rows.parquet in it)",
                  file=sys.stderr)
            return 2
    failed = 0
    for folder in folders:
        csv_bytes = size(folder / rowstore.CSV_NAME)
        try:
            path = compaction.compact(folder)
        except ImportError as err:  # the only error whose message does not name the run
            print(f"error: {folder}: {err}", file=sys.stderr)
            failed += 1
            continue
        except (contract.RunError, compaction.CompactError, OSError) as err:
            print(f"error: {err}", file=sys.stderr)
            failed += 1
            continue
        if not csv_bytes:
            print(f"{folder}: {path.name}, already compact")
        else:
            print(f"{folder}: {path.name}, {csv_bytes / 2**20:.2f} MiB -> {size(path) / 2**20:.2f} MiB")
    return 1 if failed else 0


def cmd_limits(args) -> int:
    from replaybench.bench import floors, limits, line_transfer

    print(limits.format_limits(limits.probe(loads=args.loads, repeats=args.repeats)))
    print()
    lines = line_transfer.probe(repeats=args.repeats)
    print("A cache line from one core to another (bench/line_transfer.py): "
          + (f"{lines['ns']:.0f} ns (median of {lines['repeats']} rounds {lines['ns_median']:.0f} ns)" if lines
             else "not measured (fewer than two usable cores)"))
    print()
    print(floors.format_floors(floors.op_floors(repeats=args.repeats)))
    return 0


def add_commands(sub) -> None:
    """Add ``list``, ``run``, ``summary``, ``compact``, ``limits``, ``plan``, ``train`` and ``gossip`` to an argparse
    subparsers object."""
    p = sub.add_parser("list", help="registered variants and peers with their parameters")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("run", help="run a suite and write results/<run_id>/")
    p.add_argument("--suite", default="default",
                   help="suite name in bench/suites/ (default, micro, micro-quick, micro-sweep-*, cache, concurrency, "
                        "training, ...) or a .json path")
    p.add_argument("--variants", type=arguments.csv(), help="comma-separated variant names (peer:cpprb for the peer); "
                                                   "default: the suite's")
    p.add_argument("--capacities", type=arguments.csv(arguments.capacity), help="comma-separated, e.g. 2**16,2**20")
    p.add_argument("--ops", type=arguments.csv(), help="comma-separated subset of the suite's ops")
    p.add_argument("--param", type=arguments.grid_param, action="append", metavar="KEY=V1,V2",
                   help="a parameter grid, repeatable: variant parameters (K=2,4,8 dtype=float32,float64) go to "
                        "registry.create, workload ones (batch, mixed_adds, transitions) change the calls; "
                        "replaces the suite's grid for that key; values are checked against the type of "
                        "the variants' defaults before anything runs; combinations a variant cannot take "
                        "are recorded as skipped")
    arguments.add_output_options(
        p, "the run folder's name: letters, digits, '.', '_', '-' (default: <UTC time>-<suite>)")
    for flag, kind in (("--processes", arguments.positive_int), ("--values", arguments.positive_int),
                       ("--warmups", arguments.non_negative_int), ("--loops", arguments.non_negative_int),
                       ("--min-time", arguments.positive_float)):
        p.add_argument(flag, type=kind, help="override the suite's pyperf setting (micro suites only)")
    p.set_defaults(func=cmd_run, parser=p)

    p = sub.add_parser("summary", help="print the summary of a stored run")
    p.add_argument("run_dir")
    p.set_defaults(func=cmd_summary)

    p = sub.add_parser("compact", help="convert stored runs' rows.csv to rows.parquet (checked equal first)")
    p.add_argument("run_dirs", nargs="+", metavar="RUN", help="run folders")
    p.set_defaults(func=cmd_compact)

    p = sub.add_parser("limits", help="measure this machine's dependent-load latency, random-gather floor, "
                       "core-to-core line transfer and each op's floor")
    p.add_argument("--loads", type=arguments.positive_int, default=100_000, help="loads per timed pass")
    p.add_argument("--repeats", type=arguments.positive_int, default=3, help="timed passes per size (min kept)")
    p.set_defaults(func=cmd_limits)

    from replaybench.bench import plan_command as plan  # the scaling model's command

    plan.add_parser(sub)

    from replaybench.bench import train_command as train  # imports torch only when a run starts

    train.add_parser(sub)

    from replaybench.bench.scenarios import gossip  # gossip learners' command; imports torch only when run

    gossip.add_parser(sub)


def main(argv=None) -> int:
    """``python -m replaybench.bench``: the benchmark commands alone (``replaybench`` has them all)."""
    from replaybench import commands

    return commands.run(argv, (add_commands,), prog="python -m replaybench.bench")


if __name__ == "__main__":
    sys.exit(main())
