"""Markdown helpers for analysis/REPORT.md, shared by :mod:`analysis.report` and the figure
modules' ``report_section`` functions: a table, two number formats and heading anchors. Pure functions of
their arguments; the output is deterministic, so unchanged results give an unchanged report."""

from __future__ import annotations

import re

import pandas as pd

__all__ = ["table", "num", "human_bytes", "anchor"]


def table(header: list[str], body: list[list]) -> list[str]:
    """A markdown table; numbers right-aligned."""
    right = [all(_numeric(row[i]) for row in body) if body else False for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---:" if r else "---" for r in right) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in body]
    return lines


def _numeric(text) -> bool:
    try:
        float(str(text).replace("x", "").split("-")[0] or "nan")
        return True
    except ValueError:
        return str(text) == "-"


def num(x, digits=3) -> str:
    """Three significant figures; thousands and up as whole numbers with separators."""
    if x is None or pd.isna(x):
        return "-"
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.{digits}g}"


def human_bytes(nbytes) -> str:
    """A byte count in the largest binary unit it reaches (``32768`` -> ``"32 KiB"``)."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= size:
            return f"{nbytes / size:g} {unit}"
    return f"{nbytes} B"


def anchor(heading: str) -> str:
    """The anchor a code-hosting site (GitHub) gives a heading: lower case, every character but
    letters, digits, spaces, ``-`` and ``_`` dropped, spaces to ``-`` (``"## `a-b`: C (D)"`` ->
    ``"a-b-c-d"``). Two headings alike on one page get the same anchor here: pages keep theirs apart."""
    text = re.sub(r"[^\w\- ]", "", heading.lstrip("#").strip().lower())
    return text.replace(" ", "-")
