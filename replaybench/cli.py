"""The ``replaybench`` command: benchmark commands (bench/) and analysis commands (analysis/).

    replaybench list | run | summary | train      # replaybench.bench: measure
    replaybench plots | report | compare          # replaybench.analysis: read stored runs

Each package adds its own subcommands (``add_commands``); this module only joins them, so
neither package imports the other.
"""

from __future__ import annotations

import sys

from replaybench import commands

__all__ = ["main"]


def _all_groups():
    from replaybench.analysis.__main__ import add_commands as analysis_commands
    from replaybench.bench.__main__ import add_commands as bench_commands

    return bench_commands, analysis_commands


def main(argv=None, groups=None, prog: str = "replaybench") -> int:
    """Parse ``argv`` (default: ``sys.argv[1:]``) and run the chosen command; returns its exit code."""
    return commands.run(argv, groups or _all_groups(), prog)


if __name__ == "__main__":
    sys.exit(main())
