"""Every relative link in the README and docs/ names a file that exists, and an anchor a heading of it
makes (as GitHub makes them): a page a document points at is there to read."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.offline

REPO = Path(__file__).parents[2]
DOCUMENTS = sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md")])
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(text: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation but hyphens dropped, spaces to hyphens."""
    made = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        made.add(slug)
    return made


def relative_links(document: Path) -> list[tuple[str, str]]:
    found = []
    for target in LINK.findall(document.read_text()):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        found.append((path, anchor))
    return found


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(document: Path) -> None:
    broken = []
    for path, anchor in relative_links(document):
        target = (document.parent / path).resolve() if path else document
        if not target.exists():
            broken.append(f"{path}: no such file")
        elif anchor and target.suffix == ".md" and anchor not in anchors(target.read_text()):
            broken.append(f"{path}#{anchor}: no such heading")
    assert not broken, broken
