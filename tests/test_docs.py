"""The documentation's mechanics: README.md and docs/**/*.md link only to files (and headings)
that exist, every code block that quotes an example is an exact excerpt of that file, and the
README stays a front door (docs/ holds the rest)."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _prose(text: str) -> str:
    """``text`` without its fenced code blocks (a shell line may contain brackets)."""
    return FENCE.sub("", text)


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces to '-'."""
    out = set()
    for heading in re.findall(r"^#{1,6} (.+)$", _prose(page.read_text()), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        out.add(slug)
    return out


def relative_links(page: Path) -> list[str]:
    links = [a or b for a, b in LINK.findall(_prose(page.read_text()))]
    return [link for link in links if not re.match(r"[a-z]+:", link)]


def test_the_pages_exist():
    names = {_name(p) for p in PAGES}
    expected = {"README.md", "docs/using.md", "docs/frameworks.md", "docs/concurrency.md", "docs/extending.md",
                "docs/benchmarks.md", "docs/cache-misses.md", "docs/gossip.md", "docs/results-schema.md",
                *(f"docs/engines/{e}.md" for e in ("sequential", "process", "ray", "dataflow", "paac"))}
    assert expected <= names, expected - names


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_relative_link_points_to_an_existing_file_and_heading(page):
    links = relative_links(page)
    assert page.name != "README.md" or len(links) > 10  # the parser finds the README's links
    broken = []
    for link in links:
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            broken.append(f"{link}: no such file {target}")
        elif anchor and target.suffix == ".md" and anchor not in anchors(target):
            broken.append(f"{link}: {_name(target)} has no heading with anchor #{anchor}")
        elif not str(target).startswith(str(ROOT)):
            broken.append(f"{link}: outside the repository")
    assert not broken, "\n".join(broken)


def quoted_blocks(page: Path):
    """(language, example file, excerpt) of each python block that names its example on the
    first line (``# examples/NAME.py``), and (json, None, text) of each json block."""
    for language, body in FENCE.findall(page.read_text()):
        first, _, rest = body.partition("\n")
        if language == "python":
            match = re.fullmatch(r"# (examples/\w+\.py)", first.strip())
            yield language, match and match.group(1), rest
        elif language == "json":
            yield language, None, body


def _is_excerpt(excerpt: str, source: str) -> bool:
    """Whether ``excerpt`` (dedented) equals a run of whole lines of ``source``, dedented alike."""
    want = textwrap.dedent(excerpt).rstrip("\n").split("\n")
    lines = source.split("\n")
    for start in range(len(lines) - len(want) + 1):
        if textwrap.dedent("\n".join(lines[start:start + len(want)])).split("\n") == want:
            return True
    return False


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_code_block_is_an_excerpt_of_an_example(page):
    """Python in the docs is never written only there: each block names the example it is cut
    from, and must match it line for line, so the tests that run the examples test the docs."""
    for language, example, excerpt in quoted_blocks(page):
        if language == "python":
            assert example, f"{_name(page)}: a python block that does not start with '# examples/NAME.py':\n{excerpt}"
            assert (ROOT / example).is_file(), f"{_name(page)}: {example} does not exist"
            assert _is_excerpt(excerpt, (ROOT / example).read_text()), \
                f"{_name(page)}: this block is not an excerpt of {example}:\n{excerpt}"
        else:
            data = json.loads(excerpt)
            assert any(json.loads(p.read_text()) == data for p in (ROOT / "examples").glob("*.json")), \
                f"{_name(page)}: a json block that is no file of examples/:\n{excerpt}"


def test_the_readme_is_a_front_door():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    for command in ("make bench", "make plots", "make test"):
        assert command in text
    for page in ("docs/using.md", "docs/concurrency.md", "docs/extending.md", "analysis/REPORT.md"):
        assert f"]({page}" in text, page


def test_the_link_checks_catch_a_broken_link_and_a_drifted_excerpt(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[ok](page.md#title) [gone](nowhere.md) [bad anchor](page.md#nope)\n\n"
                    "```python\n# examples/quickstart.py\n    buf = create('binary')\n```\n")
    assert relative_links(page) == ["page.md#title", "nowhere.md", "page.md#nope"]
    assert anchors(page) == {"title"}
    ((_, example, excerpt),) = quoted_blocks(page)
    assert example == "examples/quickstart.py" and not _is_excerpt(excerpt, (ROOT / example).read_text())
