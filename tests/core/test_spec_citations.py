"""The proto files cite docs/spec.md by section number; each citation names the section that says
what the comment is about (issue 29: the consumer policy comment cited section 15, Exports)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.offline

ROOT = Path(__file__).resolve().parents[2]
PROTOS = sorted((ROOT / "proto" / "countersign" / "v1").glob("*.proto"))
CITATION = re.compile(r"(?:docs/spec\.md|spec),?\s+(?:sections?\s+)?(\d+(?:\.\d+)*)")

# What a comment is about (a phrase in it) and the heading of the section that says it. A citation in
# a comment that none of these phrases matches fails the test: add the phrase and its section here.
TOPICS = {
    "consumer policy": "16 Consumer policy",
    "Session evidence JSON": "17.1 Session evidence",
    "One agent's ordered session": "17.7 The verifier service: `VerifySession`",
    "The verdict object": "6.2 Result",
    "What a verified path proves": "6.2 Result",
    "closed reason enum": "8 Reason codes",
    "signed checkpoint": "7.5 Registry checkpoints (operator-signed freshness)",
    "idempotency key": "21.2 Idempotent signing calls (`request_id`)",
}


def spec_headings() -> dict[str, str]:
    """Section number -> its numbered heading, e.g. "16.3" -> "16.3 Step C — evaluation"."""
    headings = {}
    for line in (ROOT / "docs" / "spec.md").read_text().splitlines():
        found = re.match(r"#{2,3} (\d+(?:\.\d+)*)\.? (.+)", line)
        if found:
            headings[found.group(1)] = f"{found.group(1)} {found.group(2)}"
    return headings


def comments(proto: Path) -> list[str]:
    """Each comment of ``proto``: a run of ``//`` lines (or one trailing comment), joined."""
    blocks: list[str] = []
    run: list[str] = []
    for line in proto.read_text().splitlines():
        code, _, comment = line.partition("//")
        if comment and not code.strip():
            run.append(comment.strip())
            continue
        if run:
            blocks.append(" ".join(run))
            run = []
        if comment:
            blocks.append(comment.strip())
    if run:
        blocks.append(" ".join(run))
    return blocks


def citations() -> list[tuple[str, str, str]]:
    return [
        (proto.name, block, number)
        for proto in PROTOS
        for block in comments(proto)
        for number in CITATION.findall(block)
    ]


def test_the_proto_files_cite_the_spec() -> None:
    assert len(citations()) >= 7


@pytest.mark.parametrize(("proto", "comment", "number"), citations(), ids=lambda v: str(v)[:48])
def test_each_citation_names_the_section_of_its_topic(proto: str, comment: str, number: str) -> None:
    headings = spec_headings()
    assert number in headings, f"{proto} cites section {number}, which docs/spec.md does not have"
    topics = [heading for phrase, heading in TOPICS.items() if phrase in comment]
    assert topics, f"{proto}: no topic of TOPICS in {comment!r}: add its phrase and section"
    cited = {headings[number], *(headings[p] for p in _parents(number) if p in headings)}
    assert cited & set(topics), f"{proto} cites {headings[number]!r} for {comment!r}; expected {topics}"


def _parents(number: str) -> list[str]:
    parts = number.split(".")
    return [".".join(parts[:n]) for n in range(1, len(parts))]
