"""Checking an exported admission log offline, and the registry it folded into at a given time.

The log (``registry-log.json``: ``countersign registry export`` or ``demo --export``) is checked
statement by statement against the operator key the auditor pins, never a key the log names
itself: every signature, every sequence number, the hash chain, and that each statement applies.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final

from countersign.admission import AdmissionError, AdmissionLog, SignedStatement, apply
from countersign.canonical import b64url_decode
from countersign.errors import MalformedError
from countersign.keys import PUBLIC_KEY_LENGTH, PublicKey
from countersign.records import parse_json
from countersign.registry import Registry

LOG_KEYS: Final = frozenset({"statements"})
LOG_OPTIONAL_KEYS: Final = frozenset({"operator_public_key"})
OPERATOR_KEYS: Final = frozenset({"key_id", "public_key"})
MAX_LOG_BYTES: Final = 64 << 20
"""A log file may outgrow the 1 MiB bound of a path: about 600 bytes a statement."""


class LogRefused(AdmissionError):
    """The log does not verify; ``position`` is the first statement that fails (None: the file)."""

    def __init__(self, code: str, message: str, position: int | None) -> None:
        super().__init__(code, message)
        self.position = position


@dataclass(frozen=True, slots=True)
class LogAudit:
    """A verified log: its length and head, the registry now, and the registry as of ``at_ms``."""

    statements: int
    head_digest: str | None
    registry: Registry
    at_ms: int | None
    registry_at: Registry

    def to_json(self) -> dict[str, Any]:
        return {
            "verified": True,
            "statements": self.statements,
            "head_digest": self.head_digest,
            "at_ms": self.at_ms,
            "sequence_at": self.registry_at.sequence,
            "registry": self.registry_at.to_json(),
        }


def operator_key(data: bytes) -> PublicKey:
    """The operator public key file (``{"key_id", "public_key"}``, as ``operator init`` prints it).

    Raises MalformedError when it is not one, or its key_id does not match its key.
    """
    value = parse_json(data)
    if type(value) is not dict or value.keys() != OPERATOR_KEYS:
        raise MalformedError(f"an operator key file has exactly the fields {sorted(OPERATOR_KEYS)}")
    public = value["public_key"]
    if type(public) is not str:
        raise MalformedError("public_key must be base64url text")
    key = PublicKey(b64url_decode(public, PUBLIC_KEY_LENGTH))
    if value["key_id"] != key.key_id:
        raise MalformedError(f"key_id {value['key_id']!r} does not match the public key ({key.key_id})")
    return key


def parse_log(data: bytes) -> list[SignedStatement]:
    """The signed statements of a ``registry-log.json``, in file order. Raises LogRefused (MALFORMED file)."""
    try:
        value = parse_json(data, MAX_LOG_BYTES)
    except MalformedError as exc:
        raise LogRefused("INVALID_ARGUMENT", f"not a registry log: {exc}", None) from None
    if type(value) is not dict or not LOG_KEYS <= value.keys() <= LOG_KEYS | LOG_OPTIONAL_KEYS:
        raise LogRefused("INVALID_ARGUMENT", "a registry log is an object with a 'statements' list", None)
    items = value["statements"]
    if type(items) is not list:
        raise LogRefused("INVALID_ARGUMENT", "'statements' must be a list", None)
    statements = []
    for position, item in enumerate(items):
        try:
            # Through the strict parser of the wire format, as a statement arrives from the coordinator.
            statements.append(SignedStatement.from_bytes(json.dumps(item).encode()))
        except MalformedError as exc:
            raise LogRefused("INVALID_ARGUMENT", f"statement {position}: {exc}", position) from None
    return statements


def audit_log(statements: list[SignedStatement], operator: PublicKey, at_ms: int | None = None) -> LogAudit:
    """Verify the whole log against ``operator``; fold the registry as of ``at_ms`` (None: the head).

    "As of ``at_ms``" is the log up to, not including, the first statement issued after ``at_ms``:
    a prefix, so the result is a registry some verifier really held. Raises LogRefused naming the
    first statement that fails and its code (BAD_STATEMENT_SIGNATURE, SEQUENCE_CONFLICT,
    CHAIN_MISMATCH, INVALID_STATEMENT).
    """
    log = AdmissionLog(operator)
    registry_at: Registry | None = None
    for position, signed in enumerate(statements):
        try:
            log.append(signed)
        except AdmissionError as exc:
            raise LogRefused(exc.code, f"statement {position}: {exc}", position) from None
        if registry_at is None and at_ms is not None and signed.statement.issued_ms > at_ms:
            registry_at = _fold(log.entries[:position])
    return LogAudit(
        statements=log.head_sequence,
        head_digest=log.head_digest,
        registry=log.registry,
        at_ms=at_ms,
        registry_at=log.registry if registry_at is None else registry_at,
    )


def _fold(statements: list[SignedStatement]) -> Registry:
    registry = Registry({}, 0)
    for signed in statements:
        registry = apply(registry, signed.statement)
    return registry
