"""One mark per signature of a path: does it verify under the registry? An audit view, not a verdict.

``countersign inspect --verify`` and ``countersign report`` show these beside each record. The
verdict stays :func:`countersign.verify.verify_path`'s: a path whose every signature verifies can still
be rejected (a broken link, an expiry, a replay), and only the verdict names the first failure.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from countersign.canonical import b64url_decode_validated
from countersign.constructions import edge_manifest, edge_signing_input, record_signing_input
from countersign.records import Path
from countersign.registry import KeyProblem, Registry


class SignatureRole(enum.StrEnum):
    PRIMARY = "primary"
    """The issuing deployer's signature over the record (its signed view)."""
    PARENT = "parent"
    """The parent deployer's co-signature over the edge manifest τ."""
    CHILD = "child"
    """The child deployer's co-signature over τ."""


@dataclass(frozen=True, slots=True)
class SignatureMark:
    """Whether one signature verifies; ``problem`` says why not (a reason name, or ``UNSIGNED``)."""

    index: int
    role: SignatureRole
    deployer: str
    key_id: str
    verified: bool
    problem: str | None = None
    detail: str = ""

    def to_json(self) -> dict[str, str | int | bool | None]:
        return {
            "index": self.index,
            "role": self.role.value,
            "deployer": self.deployer,
            "key_id": self.key_id,
            "verified": self.verified,
            "problem": self.problem,
            "detail": self.detail,
        }


def signature_marks(path: Path, registry: Registry) -> list[SignatureMark]:
    """Check every primary signature and co-signature of ``path`` on its own, in path order.

    A key is resolved as verification resolves it (section 7.2: at the record's ``created_ms``;
    co-signatures at the child's), so a revoked key marks everything it signed as not verified.
    """
    marks: list[SignatureMark] = []
    for index, envelope in enumerate(path.envelopes):
        record = envelope.record
        if envelope.sig is None:
            marks.append(
                SignatureMark(index, SignatureRole.PRIMARY, record.deployer, record.key_id, False, "UNSIGNED",
                              f"{record.construction} records are not signed")
            )  # fmt: skip
        else:
            message = record_signing_input(record.construction, envelope)
            marks.append(
                _mark(registry, index, SignatureRole.PRIMARY, record.deployer, record.key_id, record.created_ms,
                      message, envelope.sig)
            )  # fmt: skip
        if not record.cosigs:
            continue
        if index == 0:
            for cosig in record.cosigs:
                role = SignatureRole(cosig.role.value)
                marks.append(
                    SignatureMark(index, role, cosig.deployer, cosig.key_id, False, "MALFORMED",
                                  "a root has no edge to co-sign")
                )  # fmt: skip
            continue
        parent_digest = path.envelopes[index - 1].digest()
        message = edge_signing_input(edge_manifest(parent_digest, envelope.record_bytes(), record.cosigs))
        for cosig in record.cosigs:
            marks.append(
                _mark(registry, index, SignatureRole(cosig.role.value), cosig.deployer, cosig.key_id,
                      record.created_ms, message, cosig.sig)
            )  # fmt: skip
    return marks


def _mark(
    registry: Registry,
    index: int,
    role: SignatureRole,
    deployer: str,
    key_id: str,
    at_ms: int,
    message: bytes,
    sig: str,
) -> SignatureMark:
    key = registry.resolve(deployer, key_id, at_ms)
    if isinstance(key, KeyProblem):
        return SignatureMark(index, role, deployer, key_id, False, key.reason.value, key.detail)
    if not key.verify(message, b64url_decode_validated(sig)):
        reason = "BAD_SIGNATURE" if role is SignatureRole.PRIMARY else "BAD_COSIGNATURE"
        return SignatureMark(index, role, deployer, key_id, False, reason, "the signature does not verify")
    return SignatureMark(index, role, deployer, key_id, True)
