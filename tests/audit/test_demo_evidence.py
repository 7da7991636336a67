"""Every audit command on the evidence the mesh demo exports (``countersign demo --export DIR``)."""

from __future__ import annotations

import base64
import json
from pathlib import Path as FilePath

import pytest
from securesystemslib.dsse import Envelope as DsseEnvelope
from securesystemslib.signer import SSlibKey

from countersign.records import Path
from countersign.registry import Registry
from tests.audit.material import cli
from tests.audit.test_exports import read_statement
from tests.audit.test_report import Page

pytestmark = [pytest.mark.daemons, pytest.mark.slow]

YEAR_MS = 365 * 86_400_000


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> FilePath:
    root = tmp_path_factory.mktemp("demo")
    result = cli("demo", "--export", str(root / "export"), "--workdir", str(root / "work"), "--plaintext")
    assert result.returncode == 0, result.stdout + result.stderr
    return root / "export"


def log_args(export: FilePath) -> list[str]:
    return ["--registry-log", str(export / "registry-log.json"), "--operator", str(export / "operator.pub.json")]


def test_registry_log_of_the_demo_verifies_against_its_operator_key(export: FilePath) -> None:
    result = cli("registry", "verify", "--log", str(export / "registry-log.json"),
                 "--operator", str(export / "operator.pub.json"))  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["statements"] == 5  # three deployers, deployer-d enrolled, then revoked
    (key,) = report["registry"]["deployers"]["deployer-d"]["keys"]
    assert key["revoked_ms"] is not None
    assert report["registry"] == json.loads((export / "registry.json").read_text())


def test_the_demo_path_verifies_at_evidence_time_long_after_it_expired(export: FilePath) -> None:
    path = Path.from_bytes((export / "path.json").read_bytes())
    later = str(path.leaf.record.expires_ms + YEAR_MS)
    base = ["verify", "--path", str(export / "path.json"), "--output", str(export / "output.bin"), *log_args(export)]
    expired = cli(*base, "--now-ms", later)
    assert expired.returncode == 1
    assert json.loads(expired.stdout)["reason"] == "EXPIRED"
    audited = cli(*base, "--at-evidence-time")
    assert audited.returncode == 0, audited.stdout + audited.stderr
    assert json.loads(audited.stdout)["verdict"] == "ACCEPT"


def test_every_export_of_the_demo_path_reads_back(export: FilePath) -> None:
    registry = Registry.from_json(json.loads((export / "registry.json").read_text()))
    keys = {
        key_id: SSlibKey(key_id, "ed25519", "ed25519", {"public": entry.public_key.raw.hex()})
        for entries in registry.deployers.values()
        for key_id, entry in entries.items()
    }
    outputs = {}
    for fmt in ("dsse", "in-toto", "prov-json", "prov-n", "prov-o"):
        out = export / f"export.{fmt}"
        result = cli("export", "--format", fmt, "--path", str(export / "path.json"),
                     "--output", str(export / "output.bin"), "--out", str(out))  # fmt: skip
        assert result.returncode == 0, result.stderr
        outputs[fmt] = out.read_bytes()
    lines = outputs["dsse"].splitlines()
    assert len(lines) == 4 + 2  # four records, two co-signed cross-deployer edges
    for line in lines:
        envelope = DsseEnvelope.from_dict(json.loads(line))
        signers = [keys[keyid] for keyid in envelope.signatures]
        assert len(envelope.verify(signers, len(signers))) == len(signers)
    statement = read_statement(outputs["in-toto"])
    assert statement.pb.subject[0].name == "output.bin"
    leaf = Path.from_bytes((export / "path.json").read_bytes()).leaf.record
    assert leaf.output is not None
    assert "sha256:" + statement.pb.subject[0].digest["sha256"] == leaf.output.sha256
    assert b"actedOnBehalfOf" in outputs["prov-n"]
    assert b"prov:qualifiedDelegation" in outputs["prov-o"]
    assert b"prov:actedOnBehalfOf" in outputs["prov-o"]  # the unqualified form too (issue 29)
    assert json.loads(outputs["prov-json"])["actedOnBehalfOf"]
    assert base64.b64decode(json.loads(lines[0])["payload"]).startswith(b'{"agent":')


def test_inspect_verify_and_the_report_on_the_demo_evidence(export: FilePath) -> None:
    inspected = cli("inspect", str(export / "path.json"), "--verify", *log_args(export), "--at-evidence-time",
                    "--output", str(export / "output.bin"))  # fmt: skip
    assert inspected.returncode == 0, inspected.stdout + inspected.stderr
    marks = [line for line in inspected.stdout.splitlines() if line.startswith("  [")]
    assert len(marks) == 4 + 2 * 2
    assert all(" verified " in line for line in marks)
    session = export / "session"
    session.mkdir(exist_ok=True)
    (session / "final.json").write_bytes((export / "path.json").read_bytes())
    page_file = export / "report.html"
    result = cli(
        "report", "--path", str(export / "path.json"), "--output", str(export / "output.bin"), *log_args(export),
        "--at-evidence-time", "--session", str(session), "--html", str(page_file),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    page = Page(page_file.read_text())
    assert len(page.with_class("g", "record")) == 4
    assert not page.with_class("g", "offending")
    assert len(page.with_class("tr", "receipt")) == 1


def test_impact_on_the_demo_verifier_store_lists_what_relied_on_a_key(export: FilePath) -> None:
    """The exported verifier store holds the demo's verdict log: deployer-d's revoked key reached the
    paths audited before the revocation, and the Writer's key the final path, each to revalidate."""
    registry = json.loads((export / "registry.json").read_text())["deployers"]
    state = f"sqlite:///{export / 'verifier-state.db'}"
    (d_key,) = registry["deployer-d"]["keys"]
    revoked = cli("impact", "--key", d_key["key_id"], "--state", state, "--json")
    assert revoked.returncode == 0, revoked.stdout + revoked.stderr
    report = json.loads(revoked.stdout)
    assert report["verdicts"], "the paths audited before the revocation relied on deployer-d's key"
    assert {v["status"] for v in report["verdicts"]} == {"NEEDS_REVALIDATION"}
    assert {v["result"] for v in report["verdicts"]} == {"ACCEPT"}

    final = Path.from_bytes((export / "path.json").read_bytes())
    writer_key = final.leaf.key_id
    writer = json.loads(cli("impact", "--key", writer_key, "--state", state, "--json").stdout)
    leaf = final.leaf.digest()
    assert any(leaf in verdict["records"] for verdict in writer["verdicts"])
    impact_file = export / "impact.json"
    impact_file.write_text(json.dumps(writer))
    page_file = export / "impact.html"
    result = cli(
        "report", "--path", str(export / "path.json"), "--output", str(export / "output.bin"), *log_args(export),
        "--at-evidence-time", "--impact", str(impact_file), "--html", str(page_file),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    flagged = {g["data-index"] for g in Page(page_file.read_text()).with_class("g", "needs-revalidation")}
    assert str(len(final) - 1) in flagged  # the Writer's receipt, signed by the key asked about
