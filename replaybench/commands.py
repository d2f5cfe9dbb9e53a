"""One argument parser over groups of subcommands: what ``replaybench`` and each package's
``python -m`` entry share. It imports no command group, so each group's module can use it
without importing the others (replaybench/cli.py joins them)."""

from __future__ import annotations

import argparse
import sys

__all__ = ["run"]


def run(argv, groups, prog: str) -> int:
    """Parse ``argv`` (None: ``sys.argv[1:]``) with the subcommands that each of ``groups``
    (callables taking the subparsers object) adds, and run the chosen command; returns its
    exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog=prog, description="replaybench: prioritized-replay benchmarks")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in groups:
        add(sub)
    args = parser.parse_args(argv)
    args.argv = argv
    return args.func(args)
