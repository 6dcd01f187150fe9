"""docs/comparison.md stays true about aiogroupq: every cell of aiogroupq's
column links to the page of this site that describes the feature, every link
to this site resolves to a page and one of its headings, and no row says a
feature is "planned"."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGE = DOCS / "comparison.md"

#: a link to a page of this site: ``](groups.md#groups)``, ``](testing.md)``
_LOCAL_LINK = re.compile(r"\]\(([\w./-]+\.(?:md|rst))(?:#([^)\s]+))?\)")
#: what GitHub-style slugs drop (MyST's ``github_slugify``)
_NOT_SLUG = re.compile(r"[^\w\u4e00-\u9fff\- ]")
#: MyST gives anchors to headings down to this level (``myst_heading_anchors``)
_ANCHOR_DEPTH = 4


def _slug(title: str) -> str:
    """A heading's anchor as MyST computes it: the heading's text (link
    targets and code marks left out), lowercased, spaces to ``-``, anything
    but word characters and ``-`` dropped."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title).replace("`", "")
    return _NOT_SLUG.sub("", text.lower().replace(" ", "-"))


def anchors(page: Path) -> set[str]:
    """The anchors of a Markdown page: its headings' slugs (made unique as
    MyST does, with ``-1``, ``-2``...) and its explicit ``(name)=`` targets;
    lines inside fenced code blocks are not headings."""
    found: set[str] = set()
    fenced = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        if fenced:
            continue
        if target := re.fullmatch(r"\(([\w-]+)\)=", line.strip()):
            found.add(target[1])
        heading = re.match(r"(#{1,6}) +(.*?) *#* *$", line)
        if heading and len(heading[1]) <= _ANCHOR_DEPTH:
            slug = unique = _slug(heading[2])
            n = 0
            while unique in found:
                n += 1
                unique = f"{slug}-{n}"
            found.add(unique)
    return found


def resolves(link: str, anchor: str | None) -> bool:
    """Whether ``link#anchor`` names a page of the docs and a heading of it."""
    page = (DOCS / link).resolve()
    if not page.is_file() or DOCS not in page.parents:
        return False
    return anchor is None or (page.suffix == ".md" and anchor in anchors(page))


def _cells(row: str) -> list[str]:
    # Split on the table's pipes, not on escaped ones (\|) inside a cell.
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", row.strip())[1:-1]]


def tables() -> list[tuple[list[str], list[list[str]]]]:
    """Each table of the page: its header and its rows, as lists of cells."""
    found = []
    lines = PAGE.read_text(encoding="utf-8").splitlines()
    for at, line in enumerate(lines):
        if (
            line.startswith("|")
            and at + 1 < len(lines)
            and re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", lines[at + 1].strip())
        ):
            rows = []
            for row in lines[at + 2 :]:
                if not row.startswith("|"):
                    break
                rows.append(_cells(row))
            found.append((_cells(line), rows))
    return found


def _aiogroupq_rows() -> list[tuple[str, str]]:
    """(feature, aiogroupq's cell) of every row of every table."""
    rows = []
    for header, body in tables():
        assert header[1].startswith("aiogroupq"), header
        rows += [(row[0], row[1]) for row in body]
    return rows


def test_the_page_compares_in_tables_with_an_aiogroupq_column() -> None:
    found = tables()
    assert len(found) == 2, [header for header, _ in found]
    for header, body in found:
        assert header[1].startswith("aiogroupq"), header
        assert len(body) >= 10, header
        for row in body:
            assert len(row) == len(header), row


@pytest.mark.parametrize(
    ("feature", "cell"), _aiogroupq_rows(), ids=lambda value: value[:40]
)
def test_each_aiogroupq_cell_links_to_the_page_that_describes_it(
    feature: str, cell: str
) -> None:
    links = _LOCAL_LINK.findall(cell)
    assert links, f"row {feature!r}: aiogroupq's cell names no page of the docs"
    for link, anchor in links:
        assert resolves(link, anchor or None), (
            f"row {feature!r}: {link}#{anchor} is not a heading of the docs"
        )


def test_every_link_to_this_site_resolves() -> None:
    text = PAGE.read_text(encoding="utf-8")
    links = _LOCAL_LINK.findall(text)
    assert len(links) > 20
    broken = [f"{page}#{a}" for page, a in links if not resolves(page, a or None)]
    assert not broken


def test_no_feature_is_planned() -> None:
    """The page describes what the library does now."""
    text = PAGE.read_text(encoding="utf-8").lower()
    for word in ("planned", "not yet", "coming soon", "roadmap"):
        assert word not in text, word


def test_the_checks_catch_a_wrong_link() -> None:
    assert resolves("groups.md", "group-controls")
    assert resolves("queueing.md", "task-metadata-current_task")  # code in a title
    assert resolves("testing.md", None)
    assert not resolves("groups.md", "per-group-rate-limits")
    assert not resolves("nowhere.md", None)
    assert not resolves("../README.md", None)
    # A "# comment" in a code block is not a heading.
    assert not resolves("getting-started.md", "producepy")
    assert _slug("Failures, retries and `Retry`") == "failures-retries-and-retry"
    assert _slug("[Leases](x.md) and heartbeats") == "leases-and-heartbeats"
