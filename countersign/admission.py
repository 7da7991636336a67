"""The admission registry log: operator-signed, hash-chained statements, folded into a registry view.

Only the operator's offline key can admit a deployer or change a key's status; the coordinator that
stores and serves the log cannot forge a statement, and every verifier re-checks each statement and
the chain against the operator key it pins. A copy of the log detects a rollback (the served log is
shorter than what it already holds) and a fork (a different statement at a position it already holds).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Any, Final

from countersign.canonical import (
    SAFE_INTEGER_MAX,
    JsonValue,
    b64url_decode,
    b64url_decode_validated,
    b64url_encode,
    canonicalize_validated,
    pae,
    sha256_digest,
)
from countersign.errors import CountersignError, ErrorCode, MalformedError
from countersign.keys import PUBLIC_KEY_LENGTH, PublicKey, Signer
from countersign.records import (
    DEPLOYER_ID_PATTERN,
    DIGEST_PATTERN,
    FORMAT_VERSION,
    KEY_ID_PATTERN,
    PAYLOAD_TYPE_REGISTRY_STATEMENT,
    SIGNATURE_PATTERN,
    UnsupportedVersionError,
    parse_json,
)
from countersign.registry import KeyEntry, Registry

MAX_NOTE_LENGTH: Final = 512
STATEMENT_KEYS: Final = frozenset(
    {"v", "sequence", "prev", "issued_ms", "kind", "deployer", "key_id", "public_key", "at_ms", "note"}
)
SIGNED_STATEMENT_KEYS: Final = frozenset({"statement", "key_id", "sig"})


class StatementKind(enum.StrEnum):
    ENROL_DEPLOYER = "enrol_deployer"
    """Admit a deployer with its first key, valid from ``at_ms``."""
    ADD_KEY = "add_key"
    """Give an admitted deployer another key (rotation with overlap), valid from ``at_ms``."""
    RETIRE_KEY = "retire_key"
    """Records created at or after ``at_ms`` may no longer use the key; older ones stay valid."""
    REVOKE_KEY = "revoke_key"
    """The key is compromised: nothing it ever signed is accepted any more."""


class AdmissionError(CountersignError):
    """A statement that cannot join the log. ``code`` is one of the coordinator error codes."""

    def __init__(self, code: ErrorCode | str, message: str) -> None:
        super().__init__(message)
        self.code = ErrorCode(code)  # a name outside the closed list is a bug: ValueError


class ForkDetected(AdmissionError):
    """The served log disagrees with a statement this copy already holds."""


class RollbackDetected(AdmissionError):
    """The served log is shorter than the copy already held."""


@dataclass(frozen=True, slots=True)
class Statement:
    sequence: int
    prev: str | None
    issued_ms: int
    kind: StatementKind
    deployer: str
    key_id: str
    public_key: str | None = None
    at_ms: int | None = None
    note: str | None = None

    def to_json(self) -> dict[str, JsonValue]:
        return {
            "v": FORMAT_VERSION,
            "sequence": self.sequence,
            "prev": self.prev,
            "issued_ms": self.issued_ms,
            "kind": self.kind.value,
            "deployer": self.deployer,
            "key_id": self.key_id,
            "public_key": self.public_key,
            "at_ms": self.at_ms,
            "note": self.note,
        }

    @classmethod
    def from_json(cls, value: object) -> Statement:
        if type(value) is not dict or value.keys() != STATEMENT_KEYS:
            raise MalformedError(f"statement must have exactly the fields {sorted(STATEMENT_KEYS)}")
        if value["v"] != FORMAT_VERSION or type(value["v"]) is not int:
            raise UnsupportedVersionError(f"statement version {value['v']!r} is not supported")
        try:
            kind = StatementKind(value["kind"])
        except (ValueError, TypeError):
            raise MalformedError(f"unknown statement kind {value['kind']!r}") from None
        note = value["note"]
        if note is not None:
            if type(note) is not str or len(note) > MAX_NOTE_LENGTH:
                raise MalformedError(f"note must be text of at most {MAX_NOTE_LENGTH} characters")
            try:
                note.encode("utf-8")
            except UnicodeEncodeError:
                raise MalformedError("note must be valid Unicode (no lone surrogates)") from None
        public = value["public_key"]
        if public is not None and (type(public) is not str or len(public) != 43):
            raise MalformedError("public_key must be 32 bytes in base64url")
        return cls(
            sequence=_int(value["sequence"], "sequence"),
            prev=_pattern_or_none(value["prev"], DIGEST_PATTERN, "prev"),
            issued_ms=_int(value["issued_ms"], "issued_ms"),
            kind=kind,
            deployer=_pattern(value["deployer"], DEPLOYER_ID_PATTERN, "deployer"),
            key_id=_pattern(value["key_id"], KEY_ID_PATTERN, "key_id"),
            public_key=public,
            at_ms=None if value["at_ms"] is None else _int(value["at_ms"], "at_ms"),
            note=note,
        )

    def signing_input(self) -> bytes:
        return pae(PAYLOAD_TYPE_REGISTRY_STATEMENT, canonicalize_validated(self.to_json()))


@dataclass(frozen=True, slots=True)
class SignedStatement:
    statement: Statement
    key_id: str
    sig: str

    def to_json(self) -> dict[str, JsonValue]:
        return {"statement": self.statement.to_json(), "key_id": self.key_id, "sig": self.sig}

    def to_bytes(self) -> bytes:
        return canonicalize_validated(self.to_json())

    def digest(self) -> str:
        return sha256_digest(self.to_bytes())

    @classmethod
    def from_bytes(cls, data: bytes) -> SignedStatement:
        value: Any = parse_json(data)
        if type(value) is not dict or value.keys() != SIGNED_STATEMENT_KEYS:
            raise MalformedError(f"signed statement must have exactly the fields {sorted(SIGNED_STATEMENT_KEYS)}")
        return cls(
            Statement.from_json(value["statement"]),
            _pattern(value["key_id"], KEY_ID_PATTERN, "key_id"),
            _pattern(value["sig"], SIGNATURE_PATTERN, "sig"),
        )


def sign_statement(statement: Statement, operator: Signer) -> SignedStatement:
    return SignedStatement(statement, operator.key_id, b64url_encode(operator.sign(statement.signing_input())))


def _int(value: object, what: str) -> int:
    if type(value) is not int or not 0 <= value <= SAFE_INTEGER_MAX:
        raise MalformedError(f"{what} must be a non-negative integer")
    return value


def _pattern(value: object, pattern: Any, what: str) -> str:
    if type(value) is not str or pattern.fullmatch(value) is None:
        raise MalformedError(f"{what} is malformed")
    return value


def _pattern_or_none(value: object, pattern: Any, what: str) -> str | None:
    return None if value is None else _pattern(value, pattern, what)


@dataclass
class AdmissionLog:
    """A verified copy of the log and the registry it folds into. Pure: persistence is the caller's."""

    operator_key: PublicKey
    entries: list[SignedStatement] = field(default_factory=list)
    registry: Registry = field(default_factory=lambda: Registry({}, 0))

    @property
    def head_sequence(self) -> int:
        """Number of statements held (the next statement's ``sequence``)."""
        return len(self.entries)

    @property
    def head_digest(self) -> str | None:
        return self.entries[-1].digest() if self.entries else None

    def append(self, signed: SignedStatement) -> None:
        """Verify ``signed`` as the next statement and apply it. Raises AdmissionError."""
        self.commit(signed, self.prepare(signed))

    def prepare(self, signed: SignedStatement) -> Registry:
        """Check ``signed`` as the next statement; return the registry it would produce. Changes nothing.

        Raises AdmissionError (BAD_STATEMENT_SIGNATURE, SEQUENCE_CONFLICT, CHAIN_MISMATCH,
        INVALID_STATEMENT).
        """
        statement = signed.statement
        if signed.key_id != self.operator_key.key_id or not self.operator_key.verify(
            statement.signing_input(), b64url_decode_validated(signed.sig)
        ):
            raise AdmissionError("BAD_STATEMENT_SIGNATURE", "statement is not signed by the pinned operator key")
        if statement.sequence != self.head_sequence:
            raise AdmissionError(
                "SEQUENCE_CONFLICT", f"statement sequence {statement.sequence}, expected {self.head_sequence}"
            )
        if statement.prev != self.head_digest:
            raise AdmissionError("CHAIN_MISMATCH", "statement does not chain to the current head")
        return apply(self.registry, statement)

    def commit(self, signed: SignedStatement, registry: Registry) -> None:
        """Record a statement :meth:`prepare` accepted (after the caller stored it durably)."""
        self.registry = registry
        self.entries.append(signed)

    def extend(self, served: list[SignedStatement]) -> int:
        """Merge statements served from ``served[0].statement.sequence`` on; return how many were new.

        Statements already held must be identical (else ForkDetected); new ones must follow on.
        """
        added = 0
        for signed in served:
            sequence = signed.statement.sequence
            if sequence < self.head_sequence:
                if self.entries[sequence].digest() != signed.digest():
                    raise ForkDetected("CHAIN_MISMATCH", f"served statement {sequence} differs from the one held")
                continue
            self.append(signed)
            added += 1
        return added

    def check_head(self, head_sequence: int, head_digest: str | None) -> None:
        """Compare a served head with this copy. Raises RollbackDetected or ForkDetected."""
        if head_sequence < self.head_sequence:
            raise RollbackDetected(
                "ROLLBACK", f"served log has {head_sequence} statements, this copy already holds {self.head_sequence}"
            )
        if head_sequence == self.head_sequence and head_digest != self.head_digest:
            raise ForkDetected("CHAIN_MISMATCH", "served head differs from the head held")
        if head_sequence > self.head_sequence and head_sequence > 0 and head_digest is None:
            raise ForkDetected("CHAIN_MISMATCH", "served head has no digest")

    def next_statement(
        self,
        kind: StatementKind,
        deployer: str,
        key_id: str,
        *,
        issued_ms: int,
        public_key: str | None = None,
        at_ms: int | None = None,
        note: str | None = None,
    ) -> Statement:
        """The statement that would be appended next (for the operator to sign)."""
        return Statement(
            self.head_sequence, self.head_digest, issued_ms, kind, deployer, key_id, public_key, at_ms, note
        )


def apply(registry: Registry, statement: Statement) -> Registry:
    """Fold one statement into ``registry``. Raises AdmissionError(INVALID_STATEMENT) if it cannot apply."""
    deployers = {d: dict(keys) for d, keys in registry.deployers.items()}
    owner = next((d for d, keys in deployers.items() if statement.key_id in keys), None)
    kind = statement.kind

    def invalid(message: str) -> AdmissionError:
        return AdmissionError("INVALID_STATEMENT", f"{kind} {statement.deployer}/{statement.key_id}: {message}")

    if kind in (StatementKind.ENROL_DEPLOYER, StatementKind.ADD_KEY):
        if statement.public_key is None or statement.at_ms is None:
            raise invalid("public_key and at_ms are required")
        try:
            key = PublicKey(b64url_decode(statement.public_key, PUBLIC_KEY_LENGTH))
        except MalformedError as exc:
            raise invalid(str(exc)) from None
        if key.key_id != statement.key_id:
            raise invalid("key_id does not match public_key")
        if owner is not None:
            raise invalid(f"key already registered to {owner}")
        enrolled = statement.deployer in deployers
        if kind is StatementKind.ENROL_DEPLOYER and enrolled:
            raise invalid("deployer is already enrolled")
        if kind is StatementKind.ADD_KEY and not enrolled:
            raise invalid("deployer is not enrolled")
        deployers.setdefault(statement.deployer, {})[key.key_id] = KeyEntry(key, statement.at_ms)
    else:
        if owner != statement.deployer:
            raise invalid("not a key of this deployer")
        if statement.public_key is not None:
            raise invalid("public_key must be null")
        entry = deployers[statement.deployer][statement.key_id]
        if entry.revoked_ms is not None:
            raise invalid("key is already revoked")
        if kind is StatementKind.RETIRE_KEY:
            if statement.at_ms is None:
                raise invalid("at_ms is required")
            if entry.retired_ms is not None:
                raise invalid("key is already retired")
            entry = replace(entry, retired_ms=statement.at_ms)
        else:
            entry = replace(entry, revoked_ms=statement.issued_ms)
        deployers[statement.deployer][statement.key_id] = entry
    return Registry(deployers, registry.sequence + 1)
