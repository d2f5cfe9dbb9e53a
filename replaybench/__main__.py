"""``python -m replaybench``: the same command line as the ``replaybench`` console script."""

from replaybench.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
