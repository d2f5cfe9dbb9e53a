"""The ``replaybench`` command: benchmark commands (bench/) and analysis commands (analysis/).

    replaybench list | run | summary | train      # replaybench.bench: measure
    replaybench plots | report | compare          # replaybench.analysis: read stored runs

Each package adds its own subcommands (``add_commands``); this module only joins them, so
neither package imports the other.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["main"]


def _all_groups():
    from replaybench.analysis.__main__ import add_commands as analysis_commands
    from replaybench.bench.__main__ import add_commands as bench_commands

    return bench_commands, analysis_commands


def main(argv=None, groups=None, prog: str = "replaybench") -> int:
    """Parse ``argv`` (default: ``sys.argv[1:]``) and run the chosen command; returns its exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog=prog, description="replaybench: prioritized-replay benchmarks")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in groups or _all_groups():
        add(sub)
    args = parser.parse_args(argv)
    args.argv = argv
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
