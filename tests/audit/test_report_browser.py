"""The report in a real browser: Debian's Chromium, headless, installed by tools/browser/requirements.sh.

Chromium parses the page, dumps the DOM it built and takes a screenshot, saved for people to look at
under tests/artifacts/ (git-ignored) as well as the test's own directory.
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
from pathlib import Path as FilePath

import pytest

from countersign.records import Path
from tests.audit.material import (
    HOSTILE,
    OUTPUT,
    cli,
    mesh,
    registry_log,
    sample_path,
    with_instance,
    write_evidence,
    write_log,
)
from tests.audit.test_report import Page

pytestmark = [pytest.mark.daemons, pytest.mark.browser, pytest.mark.slow]  # starts Chromium

ARTIFACTS = FilePath(__file__).parents[1] / "artifacts"
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
)  # fmt: skip


def chromium(page: FilePath, profile: FilePath, *action: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("chromium")
    assert binary, "chromium is missing: run sh tools/browser/requirements.sh (make test does)"
    return subprocess.run(
        [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--window-size=1100,1600", *action, page.as_uri()],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_chromium_renders_the_report_with_each_record_the_offender_and_hostile_text(tmp_path: FilePath) -> None:
    m = mesh()
    path = with_instance(m, sample_path(m), 2, HOSTILE)
    write_evidence(tmp_path, path, OUTPUT + b"substituted")
    write_log(tmp_path, registry_log(m))
    digests = [e.digest() for e in path.envelopes]
    impact = {
        "query": {"record": digests[1]},
        "records": [{"digest": d, "status": "NEEDS_REVALIDATION", "depends_on": [digests[1]]} for d in digests[1:]],
        "verdicts": [{"verdict_id": "v1", "request_id": "r1", "time_ms": 1, "result": "ACCEPT", "records": digests,
                      "status": "NEEDS_REVALIDATION"}],
    }  # fmt: skip
    (tmp_path / "impact.json").write_text(json.dumps(impact))
    html = tmp_path / "report.html"
    result = cli(
        "report", "--path", str(tmp_path / "path.json"), "--output", str(tmp_path / "output.bin"),
        "--registry-log", str(tmp_path / "registry-log.json"), "--operator", str(tmp_path / "operator.pub.json"),
        "--at-evidence-time", "--impact", str(tmp_path / "impact.json"), "--html", str(html),
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr  # the output was substituted

    dom = chromium(html, tmp_path / "profile", "--dump-dom").stdout
    page = Page(dom)
    boxes = page.with_class("g", "record")
    assert [b["data-index"] for b in boxes] == ["0", "1", "2", "3"]
    assert [b["data-digest"] for b in boxes] == digests
    (offending,) = page.with_class("g", "offending")
    assert offending["data-index"] == "3"  # OUTPUT_MISMATCH is the leaf's
    assert [b["data-index"] for b in page.with_class("g", "needs-revalidation")] == ["1", "2", "3"]
    assert "OUTPUT_MISMATCH" in "".join(page.text)
    assert [t for t, _ in page.elements].count("script") == 0  # the hostile markup did not become an element
    assert HOSTILE in "".join(page.text)
    assert "<title>Countersign evidence report</title>" in dom  # the hostile script never ran
    assert Path.from_bytes((tmp_path / "path.json").read_bytes()).envelopes[2].record.agent.instance == HOSTILE

    shot = tmp_path / "report.png"
    chromium(html, tmp_path / "profile", f"--screenshot={shot}")
    width, height = png_size(shot.read_bytes())
    assert (width, height) == (1100, 1600)
    assert shot.stat().st_size > 20_000  # drawn, not blank
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copyfile(shot, ARTIFACTS / "report.png")
    shutil.copyfile(html, ARTIFACTS / "report.html")
