"""The lists the documents keep are the code's: the spec's reason table (section 8) is the closed
``Reason`` enum, and every list of export formats (the README's command line, docs/audit.md, the
spec's section 15) is the export registry's. docs/api.md's error table is held in test_error_codes.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from countersign.export import EXPORTER_FOR_FORMAT
from countersign.reasons import Reason

pytestmark = pytest.mark.offline

REPO = Path(__file__).parents[2]
SPEC = (REPO / "docs" / "spec.md").read_text()
NUMBER_WORDS = {3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight"}


def section(text: str, heading: str) -> str:
    """From the heading ``## {heading}`` to the next heading of its level."""
    start = text.index(f"\n## {heading}")
    end = text.find("\n## ", start + 1)
    return text[start : None if end < 0 else end]


def reason_table(text: str) -> list[str]:
    return re.findall(r"^\| `([A-Z_]+)` \|", section(text, "8. Reason codes"), re.M)


def test_the_spec_reason_table_lists_exactly_the_enum() -> None:
    listed = reason_table(SPEC)
    assert len(listed) == len(set(listed)), "a reason is listed twice"
    assert set(listed) == {reason.value for reason in Reason}


def test_a_reason_missing_from_the_table_is_caught() -> None:
    dropped = SPEC.replace("| `SESSION_GAP` |", "| SESSION_GAP |")
    assert set(reason_table(dropped)) != {reason.value for reason in Reason}


def command_line_formats(text: str) -> list[list[str]]:
    """Each ``--format a|b|c`` of a command-line synopsis."""
    return [found.split("|") for found in re.findall(r"countersign export --format ([a-z|-]+\|[a-z|-]+)", text)]


def test_the_readme_command_line_lists_every_export_format() -> None:
    synopses = command_line_formats((REPO / "README.md").read_text())
    assert synopses, "the README's command line names no export formats"
    assert all(listed == list(EXPORTER_FOR_FORMAT) for listed in synopses)


def test_the_audit_guide_shows_every_export_format_once() -> None:
    shown = re.findall(r"^countersign export --format ([a-z-]+)\s", (REPO / "docs" / "audit.md").read_text(), re.M)
    assert sorted(shown) == sorted(EXPORTER_FOR_FORMAT)


def test_the_spec_specifies_every_export_format() -> None:
    exports = section(SPEC, "15. Exports")
    headed = re.findall(r"^### 15\.\d+ [^\n]*", exports, re.M)
    named = [name for heading in headed for name in re.findall(r"`([a-z-]+)`", heading)]
    assert sorted(named) == sorted(EXPORTER_FOR_FORMAT)
    count = len(EXPORTER_FOR_FORMAT)
    assert f"in {NUMBER_WORDS.get(count, count)} formats" in exports


def test_a_format_missing_from_a_list_is_caught() -> None:
    assert command_line_formats("countersign export --format dsse|in-toto --path P") != [list(EXPORTER_FOR_FORMAT)]


def test_the_spec_contents_name_every_section_and_its_header_no_commit() -> None:
    headings = re.findall(r"^## (\d+)\. (.+)$", SPEC, re.M)
    contents = SPEC[SPEC.index("\nContents:") :].split("\n\n", 1)[0]
    listed = [" ".join(item.split()) for item in contents.removeprefix("\nContents:").split("·")]
    assert [item.split()[0] for item in listed] == [number for number, _ in headings]
    for item, (number, title) in zip(listed, headings, strict=True):
        assert f"{number} {title}".startswith(item), f"contents say {item!r}, section {number} is {title!r}"
    header = SPEC[: SPEC.index("\n## 1.")]
    stale = re.compile(r"\bcommit [`\d]|\b[0-9a-f]{7,40}\b")  # "at commit `6107d79`", "commit 2 of 335"
    assert not stale.search(header), "the header names a commit, which goes stale"
    assert stale.search("written from the reference code at commit `6107d79`")
