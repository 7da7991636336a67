"""Evidence for the audit tests: sample paths, an operator-signed registry log, receipts, hostile text."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path as FilePath

from countersign.admission import AdmissionLog, SignedStatement, StatementKind, sign_statement
from countersign.canonical import b64url_encode, sha256_digest
from countersign.constructions import RecordFields, issue
from countersign.keys import Ed25519Signer, PublicKey
from countersign.records import AgentRef, BindingScope, Construction, OutputReceipt, Path
from countersign.samples import SampleMesh

DEPLOYERS = ("deployer-a", "deployer-b", "deployer-c")
OUTPUT = b"the audited output, exactly these bytes\n"
CREATED_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
HOSTILE = "<script>document.title='pwned'</script>&amp;<b>x</b>"
"""A valid agent.instance (printable ASCII, no space, quote or backslash) that is also markup."""


def mesh() -> SampleMesh:
    return SampleMesh.create(DEPLOYERS, seed=b"audit-tests")


def sample_path(m: SampleMesh, construction: Construction = Construction.SIGNED_DAG, depth: int = 4) -> Path:
    route = [DEPLOYERS[i % len(DEPLOYERS)] for i in range(depth)]
    return m.issue_path(construction, route, OUTPUT, now_ms=CREATED_MS + 1_000, ttl_ms=600_000)


def operator() -> Ed25519Signer:
    return Ed25519Signer(hashlib.sha256(b"audit-tests operator").digest())


def registry_log(
    m: SampleMesh, *, revoke: str | None = None, enrol_at_ms: int = 0, issued_ms: int = CREATED_MS - 10_000
) -> list[SignedStatement]:
    """Enrol every deployer of ``m`` (keys valid from ``enrol_at_ms``), then revoke ``revoke``'s key."""
    op = operator()
    log = AdmissionLog(PublicKey(op.public_key))
    for offset, (deployer, signer) in enumerate(m.signers.items()):
        statement = log.next_statement(
            StatementKind.ENROL_DEPLOYER, deployer, signer.key_id, issued_ms=issued_ms + offset,
            public_key=b64url_encode(signer.public_key), at_ms=enrol_at_ms,
        )  # fmt: skip
        log.append(sign_statement(statement, op))
    if revoke is not None:
        statement = log.next_statement(
            StatementKind.REVOKE_KEY, revoke, m.signers[revoke].key_id, issued_ms=CREATED_MS + 86_400_000,
            note="key reported stolen",
        )  # fmt: skip
        log.append(sign_statement(statement, op))
    return log.entries


def write_log(directory: FilePath, statements: Sequence[SignedStatement]) -> tuple[FilePath, FilePath]:
    """``registry-log.json`` and ``operator.pub.json`` as ``demo --export`` writes them."""
    op = operator()
    log_file = directory / "registry-log.json"
    log_file.write_text(json.dumps({"statements": [s.to_json() for s in statements]}, indent=2) + "\n")
    key_file = directory / "operator.pub.json"
    key_file.write_text(json.dumps({"key_id": op.key_id, "public_key": b64url_encode(op.public_key)}) + "\n")
    return log_file, key_file


def write_evidence(directory: FilePath, path: Path, output: bytes = OUTPUT) -> tuple[FilePath, FilePath]:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "path.json").write_bytes(path.to_bytes())
    (directory / "output.bin").write_bytes(output)
    return directory / "path.json", directory / "output.bin"


def with_instance(m: SampleMesh, path: Path, index: int, instance: str) -> Path:
    """``path`` with record ``index`` (and everything below it) reissued for another agent instance."""
    from tests.vectors.generate import resign  # the vector generator's legitimate re-signing

    changed = resign(m, path, index, lambda r: replace(r, agent=AgentRef(instance, r.agent.system)))
    for below in range(index + 1, len(path)):
        digest = changed.envelopes[below - 1].digest()
        changed = resign(m, changed, below, lambda r, d=digest: replace(r, parent=d))
    return changed


def receipts(m: SampleMesh, parent: Path, outputs: Sequence[bytes], session: str = "writer") -> list[Path]:
    """Same-deployer output receipts under ``parent``'s leaf, chained by seq and prev as a signer does."""
    deployer = parent.leaf.record.deployer
    paths: list[Path] = []
    prev: str | None = None
    for seq, output in enumerate(outputs):
        fields = RecordFields(
            deployer=deployer,
            agent=parent.leaf.record.agent,
            created_ms=CREATED_MS + 2_000 + seq,
            expires_ms=parent.leaf.record.expires_ms - 1,
            output=OutputReceipt(sha256_digest(output), BindingScope.PER_TURN, session, seq, prev),
        )
        envelope = issue(Construction.SIGNED_DAG, fields, m.signers[deployer], parent.envelopes)
        paths.append(Path((*parent.envelopes, envelope)))
        prev = envelope.digest()
    return paths


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "countersign_cli", *args], capture_output=True, text=True, timeout=300, env=env
    )
    assert "Traceback" not in result.stderr, result.stderr
    return result
