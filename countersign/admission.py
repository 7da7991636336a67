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
    ENDORSE_KEY = "endorse_key"
    """Record that an older key of the deployer endorsed its new key ``key_id`` (the statement's
    ``endorsement``, signed by the old key): the chain of custody across a rotation (ADR 0026)."""


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
    endorsement: SignedEndorsement | None = None  # endorse_key only (and then required)

    def to_json(self) -> dict[str, JsonValue]:
        body = self._members()
        if self.kind is StatementKind.ENDORSE_KEY:
            body["endorsement"] = None if self.endorsement is None else self.endorsement.to_json()
        return body

    def _members(self) -> dict[str, JsonValue]:
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
        endorses = type(value) is dict and value.get("kind") == StatementKind.ENDORSE_KEY.value
        expected = STATEMENT_KEYS | {"endorsement"} if endorses else STATEMENT_KEYS
        if type(value) is not dict or value.keys() != expected:
            raise MalformedError(f"statement must have exactly the fields {sorted(expected)}")
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
            endorsement=SignedEndorsement.from_json(value["endorsement"]) if endorses else None,
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
        endorsement: SignedEndorsement | None = None,
    ) -> Statement:
        """The statement that would be appended next (for the operator to sign)."""
        return Statement(
            self.head_sequence,
            self.head_digest,
            issued_ms,
            kind,
            deployer,
            key_id,
            public_key,
            at_ms,
            note,
            endorsement,
        )


def apply(registry: Registry, statement: Statement) -> Registry:
    """Fold one statement into ``registry``. Raises AdmissionError(INVALID_STATEMENT) if it cannot apply."""
    if statement.kind is StatementKind.ENDORSE_KEY:
        return _apply_endorsement(registry, statement)
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


# --- key endorsements: the chain of custody across rotations (ADR 0026) ----------------------------

PAYLOAD_TYPE_KEY_ENDORSEMENT: Final = "application/vnd.countersign.key-endorsement+json;version=1"
"""What an old key signs to endorse its successor: its own payload type, so an endorsement is never
a valid node record, edge manifest or registry statement signature, nor any of those an endorsement."""
ENDORSEMENT_KEYS: Final = frozenset({"v", "deployer", "old_key_id", "new_key_id", "new_public_key", "issued_ms"})
SIGNED_ENDORSEMENT_KEYS: Final = frozenset({"endorsement", "sig"})


@dataclass(frozen=True, slots=True)
class KeyEndorsement:
    """``old_key_id`` of ``deployer`` vouches, at ``issued_ms``, that ``new_public_key`` is the
    deployer's next key. Signed by the old key (whoever holds it: the signer daemon, its KMS)."""

    deployer: str
    old_key_id: str
    new_key_id: str
    new_public_key: str
    issued_ms: int

    def to_json(self) -> dict[str, JsonValue]:
        return {
            "v": FORMAT_VERSION, "deployer": self.deployer, "old_key_id": self.old_key_id,
            "new_key_id": self.new_key_id, "new_public_key": self.new_public_key, "issued_ms": self.issued_ms,
        }  # fmt: skip

    @classmethod
    def from_json(cls, value: object) -> KeyEndorsement:
        if type(value) is not dict or value.keys() != ENDORSEMENT_KEYS:
            raise MalformedError(f"endorsement must have exactly the fields {sorted(ENDORSEMENT_KEYS)}")
        if value["v"] != FORMAT_VERSION or type(value["v"]) is not int:
            raise UnsupportedVersionError(f"endorsement version {value['v']!r} is not supported")
        public = value["new_public_key"]
        if type(public) is not str or len(public) != 43:
            raise MalformedError("new_public_key must be 32 bytes in base64url")
        return cls(
            deployer=_pattern(value["deployer"], DEPLOYER_ID_PATTERN, "deployer"),
            old_key_id=_pattern(value["old_key_id"], KEY_ID_PATTERN, "old_key_id"),
            new_key_id=_pattern(value["new_key_id"], KEY_ID_PATTERN, "new_key_id"),
            new_public_key=public,
            issued_ms=_int(value["issued_ms"], "issued_ms"),
        )

    def signing_input(self) -> bytes:
        return pae(PAYLOAD_TYPE_KEY_ENDORSEMENT, canonicalize_validated(self.to_json()))


@dataclass(frozen=True, slots=True)
class SignedEndorsement:
    endorsement: KeyEndorsement
    sig: str  # by the old key, over ``endorsement.signing_input()``

    def to_json(self) -> dict[str, JsonValue]:
        return {"endorsement": self.endorsement.to_json(), "sig": self.sig}

    def to_bytes(self) -> bytes:
        return canonicalize_validated(self.to_json())

    @classmethod
    def from_json(cls, value: object) -> SignedEndorsement:
        if type(value) is not dict or value.keys() != SIGNED_ENDORSEMENT_KEYS:
            raise MalformedError(f"signed endorsement must have exactly the fields {sorted(SIGNED_ENDORSEMENT_KEYS)}")
        return cls(KeyEndorsement.from_json(value["endorsement"]), _pattern(value["sig"], SIGNATURE_PATTERN, "sig"))

    @classmethod
    def from_bytes(cls, data: bytes) -> SignedEndorsement:
        return cls.from_json(parse_json(data))

    def holds(self, old_key: PublicKey) -> bool:
        """Whether ``old_key`` signed this endorsement (and is the key it names)."""
        return old_key.key_id == self.endorsement.old_key_id and old_key.verify(
            self.endorsement.signing_input(), b64url_decode_validated(self.sig)
        )


def endorse_key(old: Signer, deployer: str, new_public_key: PublicKey, issued_ms: int) -> SignedEndorsement:
    """The old key's endorsement of ``new_public_key`` as ``deployer``'s next key."""
    endorsement = KeyEndorsement(
        deployer, old.key_id, new_public_key.key_id, b64url_encode(new_public_key.raw), issued_ms
    )
    return SignedEndorsement(endorsement, b64url_encode(old.sign(endorsement.signing_input())))


def _apply_endorsement(registry: Registry, statement: Statement) -> Registry:
    """An ``endorse_key`` statement applies when its endorsement is the deployer's own: the new key
    (``key_id``) was added to the deployer with exactly the public key endorsed, and the old key is
    another key of the same deployer, not revoked, valid when it endorsed (``added_ms <= issued_ms``,
    before any retirement), whose signature holds. The view itself does not change (the log keeps
    the endorsement; :func:`custody_chain` reads it); only its sequence advances."""

    def invalid(message: str) -> AdmissionError:
        return AdmissionError("INVALID_STATEMENT", f"endorse_key {statement.deployer}/{statement.key_id}: {message}")

    signed = statement.endorsement
    if signed is None:
        raise invalid("endorsement is required")
    if statement.public_key is not None or statement.at_ms is not None:
        raise invalid("public_key and at_ms must be null")
    endorsement = signed.endorsement
    if endorsement.deployer != statement.deployer or endorsement.new_key_id != statement.key_id:
        raise invalid("the endorsement names another deployer or key")
    keys = registry.deployers.get(statement.deployer, {})
    new, old = keys.get(endorsement.new_key_id), keys.get(endorsement.old_key_id)
    if new is None:
        raise invalid("the new key is not a key of this deployer (add_key it first)")
    if b64url_encode(new.public_key.raw) != endorsement.new_public_key:
        raise invalid("the endorsed public key is not the registered one")
    if old is None or endorsement.old_key_id == endorsement.new_key_id:
        raise invalid("the endorsing key is not another key of this deployer")
    if old.revoked_ms is not None:
        raise invalid("the endorsing key is revoked")
    if endorsement.issued_ms < old.added_ms or (old.retired_ms is not None and endorsement.issued_ms >= old.retired_ms):
        raise invalid("the endorsing key was not valid when it endorsed")
    if not signed.holds(old.public_key):
        raise invalid("the endorsement is not signed by the endorsing key")
    return Registry(registry.deployers, registry.sequence + 1)


@dataclass(frozen=True, slots=True)
class CustodyLink:
    """One key of a deployer, in the order the log added it, and how its custody is shown."""

    key_id: str
    added_ms: int
    added_at: int  # sequence of the statement that added it
    endorsed_by: str | None  # the older key whose endorsement the log holds (None: the first key, or a break)
    endorsed_at: int | None  # sequence of that endorse_key statement
    retired_ms: int | None
    revoked_ms: int | None
    continuous: bool  # endorsed (transitively) back to the enrolment key by keys that were never revoked

    def to_json(self) -> dict[str, JsonValue]:
        return {
            "key_id": self.key_id, "added_ms": self.added_ms, "added_at": self.added_at,
            "endorsed_by": self.endorsed_by, "endorsed_at": self.endorsed_at, "retired_ms": self.retired_ms,
            "revoked_ms": self.revoked_ms, "continuous": self.continuous,
        }  # fmt: skip


@dataclass(frozen=True, slots=True)
class CustodyChain:
    deployer: str
    links: tuple[CustodyLink, ...]

    @property
    def unbroken(self) -> bool:
        """Every key of the deployer is endorsed back to its enrolment key."""
        return bool(self.links) and all(link.continuous for link in self.links)

    def to_json(self) -> dict[str, JsonValue]:
        return {"deployer": self.deployer, "unbroken": self.unbroken, "keys": [link.to_json() for link in self.links]}


def custody_chain(log: AdmissionLog, deployer: str) -> CustodyChain:
    """The chain of custody of ``deployer``'s keys in a verified log: each key in the order it was
    added, with the older key that endorsed it. A key is ``continuous`` if it is the enrolment key,
    or was endorsed by a continuous key; a revoked key is never continuous (whoever held it may have
    endorsed anything), and neither is what only it endorsed. Pure: reads ``log.entries``."""
    added: dict[str, tuple[int, int]] = {}
    endorsed: dict[str, tuple[str, int]] = {}
    for signed in log.entries:
        statement = signed.statement
        if statement.deployer != deployer:
            continue
        if statement.kind in (StatementKind.ENROL_DEPLOYER, StatementKind.ADD_KEY) and statement.at_ms is not None:
            added[statement.key_id] = (statement.at_ms, statement.sequence)
        elif statement.kind is StatementKind.ENDORSE_KEY and statement.endorsement is not None:
            endorsed.setdefault(statement.key_id, (statement.endorsement.endorsement.old_key_id, statement.sequence))
    entries = log.registry.deployers.get(deployer, {})
    continuous: dict[str, bool] = {}
    links: list[CustodyLink] = []
    for key_id, (added_ms, sequence) in sorted(added.items(), key=lambda item: item[1][1]):
        entry = entries.get(key_id)
        revoked = entry.revoked_ms if entry is not None else None
        by, at = endorsed.get(key_id, (None, None))
        origin = not links  # the enrolment key
        continuous[key_id] = revoked is None and (origin or (by is not None and continuous.get(by, False)))
        links.append(
            CustodyLink(
                key_id,
                added_ms,
                sequence,
                by,
                at,
                entry.retired_ms if entry is not None else None,
                revoked,
                continuous[key_id],
            )
        )
    return CustodyChain(deployer, tuple(links))
