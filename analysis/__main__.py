"""Command line: ``replaybench plots | report | compare``.

    replaybench plots                         # every run under results/ -> analysis/figures/
    replaybench plots --runs results/A results/B --out /tmp/figs
    replaybench report                        # the figures, analysis/REPORT.md and analysis/report/<host>.md
    replaybench compare results/A results/B   # medians of two runs, with significance

Runs are folders (``results/<run-id>``) or bare run ids (looked up under ``results/``).

Exit status of ``plots`` and ``report``: a run whose rows.csv or meta.json is broken, or that
would merge with a run named before it (the same folder by another path, or a shared run id:
:func:`analysis.load.load_runs`), is left out with one warning line on stderr (naming the
folder or file, the line or field, and what is wrong) and the other runs are still drawn; the
status is 0 when at least one run loaded, no figure raised and at least one figure was written,
and 1 otherwise. ``--strict`` makes any broken run an error (status 1) as well.
"""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["main"]

RESULTS = Path("results")
FIGURES = Path("analysis/figures")
REPORT = Path("analysis/REPORT.md")


def _run_dirs(names) -> list[Path]:
    from replaybench.analysis import load

    if not names:
        return load.find_runs(RESULTS)
    out = []
    for name in names:
        path = Path(name)
        out.append(path if path.exists() or path.is_absolute() else RESULTS / name)
    return out


def _load(args):
    from replaybench.analysis import load

    dirs = _run_dirs(args.runs)
    if not dirs:
        print(f"no runs found (looked for folders with rows.csv under {RESULTS}/; "
              f"run `make bench` or name runs with --runs)", file=sys.stderr)
        return None
    res = load.load_runs(dirs)
    for problem in res.problems:  # the one place a left-out run is reported (the report lists them too)
        print(f"warning: run left out: {problem}", file=sys.stderr)
    print(f"loaded {len(res.metas)} run(s), {len(res.table)} rows"
          + (f"; {len(res.problems)} run(s) left out" if res.problems else ""))
    return res


def _status(res, outcome, strict: bool) -> int:
    if not res.metas or outcome.failed or not outcome.written:
        return 1
    return 1 if strict and res.problems else 0


def _render_hosts(res, out: Path, only) -> tuple[list, list, object]:
    """Every host's figures from its own runs (:meth:`analysis.load.Results.by_host`), each into
    ``out/<host>/``, then the claims' verdicts (:func:`analysis.findings.verdict_rows`) and their
    headline figures into ``out/<host>/claims/`` (:func:`analysis.headline.render_all`; not with
    ``only``, which asks for some figure modules); ``([(host, results, outcome)], verdicts,
    headlines or None)``. What the results no longer support is removed: a folder of ``out`` named
    like no host of these runs nor of any run stored under ``results/`` (a host or label of runs
    since removed: plotting some runs keeps the other stored hosts' figures), and the figure
    files a figure module wrote straight into ``out`` before each host had a folder."""
    import shutil

    from replaybench.analysis import findings, headline, plots, render

    parts, folders = [], {}
    for host, part in res.by_host():
        folder = out / _folder_name(host)
        print(f"host {host}: figures into {folder}/")
        folders[host] = folder
        parts.append((host, part, render.render(part, folder, only=only)))
    verdicts = findings.verdict_rows([(host, part) for host, part, _ in parts])
    headlines = None
    if not only:
        drawn = {host: folders[host] for host, part, _ in parts if part.metas}
        headlines = headline.render_all(verdicts, drawn, res.hosts())
    if not only and out.is_dir():
        names = {f.name for f in folders.values()} | _stored_host_folders()
        for stale in sorted(p for p in out.iterdir() if p.is_dir() and p.name not in names):
            if all(f.suffix in render.EXTENSIONS for f in stale.rglob("*") if f.is_file()):
                print(f"removed {stale}/: no host of these runs nor of the stored runs draws there")
                shutil.rmtree(stale)
        figures = set(plots.FIGURES.names())
        for stale in sorted(p for p in out.iterdir() if p.is_file() and p.suffix in render.EXTENSIONS
                            and p.stem in figures):
            stale.unlink()  # a figure of the first host, from before every host had a folder
    return parts, verdicts, headlines


def _stored_host_folders() -> set[str]:
    """The figure folders of the hosts of every run stored under ``results/`` (their meta.json
    alone is read; a run whose meta.json does not parse is skipped here, and reported by
    :func:`_load` when it is drawn)."""
    import json

    from replaybench.analysis import load

    out = set()
    for run in load.find_runs(RESULTS):
        try:
            out.add(_folder_name(load.host_of(json.loads((run / "meta.json").read_text()))))
        except (OSError, ValueError, TypeError, AttributeError):
            continue
    return out


def _folder_name(host: str) -> str:
    """``host`` as a folder name (host names are path-safe already; anything else becomes ``_``)."""
    import re

    return re.sub(r"[^A-Za-z0-9._-]", "_", host)


def _status_all(parts, strict: bool) -> int:
    """:func:`_status` of the first host's figures; 1 also when another host's figure failed."""
    _, res, outcome = parts[0]
    return 1 if _status(res, outcome, strict) or any(o.failed for _, _, o in parts[1:]) else 0


def cmd_plots(args) -> int:
    res = _load(args)
    if res is None:
        return 1
    parts, _, _ = _render_hosts(res, Path(args.out), args.only)
    return _status_all(parts, args.strict)


def cmd_report(args) -> int:
    from replaybench.analysis import report

    res = _load(args)
    if res is None:
        return 1
    parts, verdicts, headlines = _render_hosts(res, Path(args.figures), args.only)
    pages = report.build_pages(parts, Path(args.out), verdicts, headlines)
    folder = Path(args.out).parent / report.PAGES
    if folder.is_dir():  # the pages of hosts whose runs are gone
        for stale in sorted(folder.glob("*.md")):
            if stale not in pages:
                stale.unlink()
    for path, text in pages.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")
    return _status_all(parts, args.strict)


def cmd_compare(args) -> int:
    from replaybench.analysis import compare, load

    try:
        text = compare.compare_runs(*_run_dirs([args.run_a, args.run_b]))
    except load.RunError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(text)
    return 0


def add_commands(sub) -> None:
    """Add ``plots``, ``report`` and ``compare`` to an argparse subparsers object."""

    def common(p):
        p.add_argument("--runs", nargs="+", metavar="RUN",
                       help="run folders or run ids (default: every run under results/)")
        p.add_argument("--only", nargs="+", metavar="FIGURE", help="draw only these figures (module names)")
        p.add_argument("--strict", action="store_true", help="exit 1 when any run could not be loaded")

    p = sub.add_parser("plots", help="draw every figure (PNG, SVG and the CSV behind it)")
    common(p)
    p.add_argument("--out", default=str(FIGURES), help=f"output folder (default: {FIGURES})")
    p.set_defaults(func=cmd_plots)

    p = sub.add_parser("report", help="draw the figures and write a markdown report (REPORT.md and a page per host)")
    common(p)
    p.add_argument("--figures", default=str(FIGURES), help=f"figure folder (default: {FIGURES})")
    p.add_argument("--out", default=str(REPORT), help=f"report file (default: {REPORT})")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("compare", help="medians of two runs, marking differences within the spread")
    p.add_argument("run_a")
    p.add_argument("run_b")
    p.set_defaults(func=cmd_compare)


def main(argv=None) -> int:
    """``python -m replaybench.analysis``: the analysis commands alone (``replaybench`` has them all)."""
    from replaybench import commands

    return commands.run(argv, (add_commands,), prog="python -m replaybench.analysis")


if __name__ == "__main__":
    sys.exit(main())
