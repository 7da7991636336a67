"""``countersign report``: the page's structure, its escaping of hostile evidence, sessions and impact.

Read with the standard library's HTML parser here; tests/audit/test_report_browser.py opens the same
kind of page in a real browser."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path as FilePath

import pytest

from countersign.constructions import seal
from countersign.records import Path
from tests.audit.material import (
    HOSTILE,
    OUTPUT,
    cli,
    mesh,
    receipts,
    registry_log,
    sample_path,
    with_instance,
    write_evidence,
    write_log,
)

pytestmark = pytest.mark.daemons  # runs the command line as a child process


class Page(HTMLParser):
    """Every element with its attributes, and all text, as a browser's parser would see them."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.text: list[str] = []
        self.rows: list[tuple[str, list[str]]] = []  # (class of the tr, text of each td)
        self._cell: list[str] | None = None
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = {k: v or "" for k, v in attrs}
        self.elements.append((tag, attributes))
        if tag == "tr":
            self.rows.append((attributes.get("class", ""), []))
        elif tag == "td":
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self._cell is not None:
            self.rows[-1][1].append("".join(self._cell))
            self._cell = None

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)

    def with_class(self, tag: str, css: str) -> list[dict[str, str]]:
        return [a for t, a in self.elements if t == tag and css in a.get("class", "").split()]


def report(directory: FilePath, *extra: str, registry: bool = True) -> tuple[int, str, Page]:
    page = directory / "report.html"
    args = ["report", "--path", str(directory / "path.json"), "--html", str(page), *extra]
    if registry:
        args += ["--registry-log", str(directory / "registry-log.json"), "--operator",
                 str(directory / "operator.pub.json"), "--at-evidence-time"]  # fmt: skip
    result = cli(*args)
    assert result.returncode in (0, 1), result.stderr
    text = page.read_text()
    return result.returncode, text, Page(text)


@pytest.fixture
def hostile(tmp_path: FilePath) -> FilePath:
    m = mesh()
    write_evidence(tmp_path, with_instance(m, sample_path(m), 2, HOSTILE))
    write_log(tmp_path, registry_log(m))
    return tmp_path


def test_one_box_per_record_and_hostile_text_stays_text(hostile: FilePath) -> None:
    code, text, page = report(hostile, "--output", str(hostile / "output.bin"))
    assert code == 0
    boxes = page.with_class("g", "record")
    assert [b["data-index"] for b in boxes] == ["0", "1", "2", "3"]
    assert not page.with_class("g", "offending")
    assert [t for t, _ in page.elements].count("script") == 0
    assert "<script" not in text  # escaped where it was written, not merely blocked
    assert HOSTILE in "".join(page.text)  # ...and shown to the reader as the characters it is
    assert "&lt;script&gt;document.title=&#x27;pwned&#x27;&lt;/script&gt;" in text
    verdict = page.with_class("section", "verdict")
    assert verdict and "accept" in verdict[0]["class"].split()


def test_the_page_fetches_nothing_and_runs_nothing(hostile: FilePath) -> None:
    _, text, page = report(hostile)
    (policy,) = [a for t, a in page.elements if t == "meta" and a.get("http-equiv") == "Content-Security-Policy"]
    assert policy["content"].startswith("default-src 'none'")
    for tag, attributes in page.elements:
        assert not {"src", "href"} & attributes.keys(), (tag, attributes)
        assert not any(name.startswith("on") for name in attributes), (tag, attributes)
    assert tag != "link"
    assert "@import" not in text


def test_the_offending_record_is_highlighted(tmp_path: FilePath) -> None:
    m = mesh()
    path = sample_path(m)
    parent_cosig, child_cosig = path.envelopes[2].record.cosigs
    borrowed = path.envelopes[1].record.cosigs[0]
    forged = seal(replace(path.envelopes[2].record, cosigs=(replace(parent_cosig, sig=borrowed.sig), child_cosig)),
                  m.signers["deployer-c"])  # fmt: skip
    write_evidence(tmp_path, Path((*path.envelopes[:2], forged)), b"")
    write_log(tmp_path, registry_log(m))
    code, _, page = report(tmp_path)
    assert code == 1
    (offending,) = page.with_class("g", "offending")
    assert offending["data-index"] == "2"
    assert "BAD_COSIGNATURE" in "".join(page.text)
    assert page.with_class("tr", "offending")


def test_a_malformed_path_is_still_drawn_and_escaped(tmp_path: FilePath) -> None:
    m = mesh()
    value = sample_path(m).to_json()
    value["envelopes"][1]["record"]["deployer"] = "<script>alert(1)</script>"  # type: ignore[index]
    write_evidence(tmp_path, sample_path(m))
    (tmp_path / "path.json").write_text(json.dumps(value))
    code, text, page = report(tmp_path, registry=False)
    assert code == 1
    assert len(page.with_class("g", "record")) == 4
    (offending,) = page.with_class("g", "offending")
    assert offending["data-index"] == "1"
    assert "MALFORMED" in "".join(page.text)
    assert "<script" not in text
    assert "<script>alert(1)</script>" in "".join(page.text)


def test_without_a_registry_the_page_says_nothing_was_verified(hostile: FilePath) -> None:
    code, _, page = report(hostile, registry=False)
    assert code == 0
    (verdict,) = page.with_class("section", "verdict")
    assert "unverified" in verdict["class"].split()
    assert "Not verified" in "".join(page.text)


def test_impact_colours_records_and_verdicts_needing_revalidation(hostile: FilePath) -> None:
    path = Path.from_bytes((hostile / "path.json").read_bytes())
    digests = [e.digest() for e in path.envelopes]
    impact = {
        "query": {"key": path.envelopes[1].key_id},
        "records": [
            {"digest": digests[1], "status": "NEEDS_REVALIDATION", "depends_on": []},
            {"digest": digests[2], "status": "NEEDS_REVALIDATION", "depends_on": [digests[1]]},
            {"digest": "sha256:" + "1" * 64, "status": "NEEDS_REVALIDATION", "depends_on": [digests[1]]},
        ],
        "verdicts": [
            {"verdict_id": "v-<1>", "request_id": "r1", "time_ms": 5, "result": "ACCEPT",
             "records": digests, "status": "NEEDS_REVALIDATION"},
            {"verdict_id": "v-2", "request_id": "r2", "time_ms": 6, "result": "ACCEPT",
             "records": digests[:1], "status": "UNAFFECTED"},
        ],
    }  # fmt: skip
    (hostile / "impact.json").write_text(json.dumps(impact))
    _, text, page = report(hostile, "--impact", str(hostile / "impact.json"))
    flagged = [b["data-index"] for b in page.with_class("g", "needs-revalidation")]
    assert flagged == ["1", "2"]
    assert len(page.with_class("tr", "impact-verdict")) == 2
    (row,) = [r for r in page.with_class("tr", "impact-verdict") if "needs-revalidation" in r["class"].split()]
    assert row
    assert "v-&lt;1&gt;" in text
    for bad, message in (('{"records": [{"status": 1}], "verdicts": []}', "digest"),
                         ((hostile / "path.json").read_text(), "'records' and 'verdicts' lists")):  # fmt: skip
        (hostile / "impact.json").write_text(bad)
        result = cli("report", "--path", str(hostile / "path.json"), "--impact", str(hostile / "impact.json"),
                     "--html", str(hostile / "x.html"))  # fmt: skip
        assert result.returncode == 2
        assert message in result.stderr


def test_session_receipts_are_listed_in_order_of_seq(tmp_path: FilePath) -> None:
    m = mesh()
    trunk = sample_path(m, depth=3)
    chain = receipts(m, trunk, [b"turn %d\n" % i for i in range(5)])
    write_evidence(tmp_path, chain[-1], b"turn 4\n")
    write_log(tmp_path, registry_log(m))
    session = tmp_path / "session"
    session.mkdir()
    names = [f"receipt-{random.Random(7).random():.6f}-{i}.json" for i in range(5)]
    random.Random(1).shuffle(names)  # file names say nothing about the order
    for name, receipt in zip(names, chain, strict=True):
        if receipt is not chain[3]:  # one receipt of the session is missing
            (session / name).write_bytes(receipt.to_bytes())
    (session / "notes.txt").write_text("not a path <b>")
    _, text, page = report(tmp_path, "--session", str(session), "--output", str(tmp_path / "output.bin"))
    rows = [cells for css, cells in page.rows if "receipt" in css.split()]
    assert [cells[0] for cells in rows] == ["0", "1", "2", "4", "—"]  # by seq; the unreadable file last
    assert [cells[7] for cells in rows[:4]] == [
        "first of the session",
        "follows seq 0",
        "follows seq 1",
        "does not follow seq 2: a receipt is missing or out of place",
    ]
    assert len(page.with_class("tr", "chain-break")) == 1
    assert rows[4][2] == "notes.txt"
    assert rows[4][8].startswith("not a valid path")
    assert all(cells[8] == "ACCEPT (output bytes not checked)" for cells in rows[:4])
    assert 'id="session"' in text


def test_report_on_output_mismatch_marks_the_leaf(hostile: FilePath) -> None:
    (hostile / "other.bin").write_bytes(OUTPUT + b"x")
    code, _, page = report(hostile, "--output", str(hostile / "other.bin"))
    assert code == 1
    (offending,) = page.with_class("g", "offending")
    assert offending["data-index"] == "3"


@pytest.mark.parametrize("given", ["receipts", "out"], ids=["receipts-dir", "sample-session-dir"])
def test_the_receipt_files_sample_session_writes_are_the_session(tmp_path: FilePath, given: str) -> None:
    """Issue 29: report --session rejected the receipt files that sample-session writes and
    verify-session reads (envelopes, each under the agent path given as --path)."""
    out = tmp_path / "session"
    made = cli("sample-session", "--outputs", "3", "--closed", "--out", str(out), "--seed", "report")
    assert made.returncode == 0, made.stderr
    verified = cli("verify-session", "--path", str(out / "agent.json"), "--receipts", str(out / "receipts"),
                   "--registry", str(out / "registry.json"), "--closed")  # fmt: skip
    assert json.loads(verified.stdout)["verdict"] == "ACCEPT", verified.stdout
    page_file = tmp_path / "report.html"
    session = out / "receipts" if given == "receipts" else out
    result = cli("report", "--path", str(out / "agent.json"), "--registry", str(out / "registry.json"),
                 "--session", str(session), "--html", str(page_file))  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [cells for css, cells in Page(page_file.read_text()).rows if "receipt" in css.split()]
    assert [cells[0] for cells in rows] == ["0", "1", "2", "3"]
    assert [cells[2] for cells in rows] == ["000000.json", "000001.json", "000002.json", "000003.json"]
    assert [cells[7] for cells in rows] == ["first of the session", "follows seq 0", "follows seq 1", "follows seq 2"]
    assert all(cells[8] == "ACCEPT (output bytes not checked)" for cells in rows), rows


def test_a_receipt_envelope_under_no_record_of_the_path_says_so(tmp_path: FilePath) -> None:
    out = tmp_path / "session"
    assert cli("sample-session", "--outputs", "1", "--out", str(out)).returncode == 0
    other = tmp_path / "other"
    assert cli("sample-session", "--outputs", "1", "--out", str(other)).returncode == 0
    page_file = tmp_path / "report.html"
    result = cli("report", "--path", str(other / "agent.json"), "--session", str(out / "receipts"),
                 "--html", str(page_file))  # fmt: skip
    assert result.returncode == 0, result.stderr
    (row,) = [cells for css, cells in Page(page_file.read_text()).rows if "receipt" in css.split()]
    assert row[8].startswith("a receipt envelope issued under no record of --path")


def test_a_path_that_does_not_parse_is_rejected_as_a_whole_not_at_none(tmp_path: FilePath) -> None:
    """Issue 29: report printed "at None" for a malformed path."""
    write_evidence(tmp_path, sample_path(mesh()))
    (tmp_path / "path.json").write_text((tmp_path / "path.json").read_text()[:-20])
    page_file = tmp_path / "report.html"
    result = cli("report", "--path", str(tmp_path / "path.json"), "--html", str(page_file))
    assert result.returncode == 1
    assert "None" not in result.stdout
    assert result.stdout.strip().endswith("verdict REJECT MALFORMED (the path as a whole)"), result.stdout
    assert "(the path as a whole)" in "".join(Page(page_file.read_text()).text)


def test_an_accept_whose_records_need_revalidation_is_not_shown_green(hostile: FilePath) -> None:
    """Issue 29: the verdict box stayed green while records below it needed revalidation."""
    path = Path.from_bytes((hostile / "path.json").read_bytes())
    digests = [e.digest() for e in path.envelopes]
    impact = {
        "query": {"key": path.envelopes[1].key_id},
        "records": [{"digest": d, "status": "NEEDS_REVALIDATION", "depends_on": []} for d in digests[1:]],
        "verdicts": [],
    }
    (hostile / "impact.json").write_text(json.dumps(impact))
    page_file = hostile / "impact.html"
    result = cli("report", "--path", str(hostile / "path.json"), "--output", str(hostile / "output.bin"),
                 "--registry-log", str(hostile / "registry-log.json"), "--operator", str(hostile / "operator.pub.json"),
                 "--at-evidence-time", "--impact", str(hostile / "impact.json"), "--html", str(page_file))  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "verdict ACCEPT; 3 record(s) of the path need revalidation" in result.stdout
    page = Page(page_file.read_text())
    (verdict,) = page.with_class("section", "verdict")
    assert verdict["class"].split() == ["verdict", "accept", "needs-revalidation"]
    assert "3 record(s) of this path need revalidation (1, 2, 3" in "".join(page.text)
    # without an impact file, or with one that flags nothing on this path, the accept stands alone
    (hostile / "impact.json").write_text(json.dumps({**impact, "records": []}))
    code, _, page = report(hostile, "--impact", str(hostile / "impact.json"))
    (verdict,) = page.with_class("section", "verdict")
    assert (code, verdict["class"].split()) == (0, ["verdict", "accept"])
