"""Operator-signed checkpoints of the admission log: the freshness a coordinator cannot fake.

The registry log's statements are operator-signed, so a coordinator cannot forge one; but it can
withhold one (a revocation) and keep sending unsigned heartbeats. A checkpoint closes that gap, as
TUF's timestamp role does for a repository: the operator signs "the log is ``sequence`` statements
long and ends at ``head``, and this holds until ``expires_ms``". A follower counts its copy as fresh
only while it holds an unexpired checkpoint its copy extends, so a coordinator that freezes, withholds
or drops anything is bounded by the checkpoint's expiry (docs/adr/0025-operator-checkpoints.md).

Pure: the caller supplies the clock and stores the bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from countersign.admission import AdmissionLog
from countersign.canonical import (
    SAFE_INTEGER_MAX,
    JsonValue,
    b64url_decode_validated,
    b64url_encode,
    canonicalize_validated,
    pae,
    sha256_digest,
)
from countersign.errors import CountersignError, ErrorCode, MalformedError
from countersign.keys import PublicKey, Signer
from countersign.records import (
    DIGEST_PATTERN,
    FORMAT_VERSION,
    KEY_ID_PATTERN,
    SIGNATURE_PATTERN,
    UnsupportedVersionError,
    parse_json,
)

# Its own payload type: a checkpoint signature can never be replayed as a statement or a record.
PAYLOAD_TYPE_REGISTRY_CHECKPOINT: Final = "application/vnd.countersign.registry-checkpoint+json;version=1"
CHECKPOINT_KEYS: Final = frozenset({"v", "sequence", "head", "issued_ms", "expires_ms"})
SIGNED_CHECKPOINT_KEYS: Final = frozenset({"checkpoint", "key_id", "sig"})
MAX_CHECKPOINT_BYTES: Final = 4_096  # a signed checkpoint is about 400 bytes
# An operator that signs checkpoints valid for a day has turned the freeze bound into a day.
MAX_CHECKPOINT_LIFETIME_MS: Final = 24 * 3_600_000


class CheckpointError(CountersignError):
    """A checkpoint that cannot be accepted. ``code`` is an ErrorCode name."""

    def __init__(self, code: ErrorCode | str, message: str) -> None:
        super().__init__(message)
        self.code = ErrorCode(code)


@dataclass(frozen=True, slots=True)
class Checkpoint:
    sequence: int
    """Statements in the log (the next statement's ``sequence``)."""
    head: str | None
    """Digest of the last signed statement; null for the empty log."""
    issued_ms: int
    expires_ms: int

    def to_json(self) -> dict[str, JsonValue]:
        return {
            "v": FORMAT_VERSION,
            "sequence": self.sequence,
            "head": self.head,
            "issued_ms": self.issued_ms,
            "expires_ms": self.expires_ms,
        }

    @classmethod
    def from_json(cls, value: object) -> Checkpoint:
        if type(value) is not dict or value.keys() != CHECKPOINT_KEYS:
            raise MalformedError(f"checkpoint must have exactly the fields {sorted(CHECKPOINT_KEYS)}")
        if value["v"] != FORMAT_VERSION or type(value["v"]) is not int:
            raise UnsupportedVersionError(f"checkpoint version {value['v']!r} is not supported")
        sequence = _int(value["sequence"], "sequence")
        head = value["head"]
        if head is not None and (type(head) is not str or DIGEST_PATTERN.fullmatch(head) is None):
            raise MalformedError("head is malformed")
        if (sequence == 0) != (head is None):
            raise MalformedError("head is null exactly when sequence is 0")
        issued, expires = _int(value["issued_ms"], "issued_ms"), _int(value["expires_ms"], "expires_ms")
        if not issued < expires <= issued + MAX_CHECKPOINT_LIFETIME_MS:
            raise MalformedError(f"expires_ms must be after issued_ms, by at most {MAX_CHECKPOINT_LIFETIME_MS} ms")
        return cls(sequence, head, issued, expires)

    def signing_input(self) -> bytes:
        return pae(PAYLOAD_TYPE_REGISTRY_CHECKPOINT, canonicalize_validated(self.to_json()))


@dataclass(frozen=True, slots=True)
class SignedCheckpoint:
    checkpoint: Checkpoint
    key_id: str
    sig: str

    def to_json(self) -> dict[str, JsonValue]:
        return {"checkpoint": self.checkpoint.to_json(), "key_id": self.key_id, "sig": self.sig}

    def to_bytes(self) -> bytes:
        return canonicalize_validated(self.to_json())

    def digest(self) -> str:
        return sha256_digest(self.to_bytes())

    @classmethod
    def from_bytes(cls, data: bytes) -> SignedCheckpoint:
        value: Any = parse_json(data, MAX_CHECKPOINT_BYTES)
        if type(value) is not dict or value.keys() != SIGNED_CHECKPOINT_KEYS:
            raise MalformedError(f"signed checkpoint must have exactly the fields {sorted(SIGNED_CHECKPOINT_KEYS)}")
        key_id, sig = value["key_id"], value["sig"]
        if type(key_id) is not str or KEY_ID_PATTERN.fullmatch(key_id) is None:
            raise MalformedError("key_id is malformed")
        if type(sig) is not str or SIGNATURE_PATTERN.fullmatch(sig) is None:
            raise MalformedError("sig is malformed")
        return cls(Checkpoint.from_json(value["checkpoint"]), key_id, sig)

    def verify(self, operator_key: PublicKey) -> None:
        """Raises CheckpointError(BAD_STATEMENT_SIGNATURE) unless the pinned operator key signed it."""
        if self.key_id != operator_key.key_id or not operator_key.verify(
            self.checkpoint.signing_input(), b64url_decode_validated(self.sig)
        ):
            raise CheckpointError("BAD_STATEMENT_SIGNATURE", "checkpoint is not signed by the pinned operator key")


def sign_checkpoint(checkpoint: Checkpoint, operator: Signer) -> SignedCheckpoint:
    return SignedCheckpoint(checkpoint, operator.key_id, b64url_encode(operator.sign(checkpoint.signing_input())))


def checkpoint_of(log: AdmissionLog, *, issued_ms: int, lifetime_ms: int) -> Checkpoint:
    """The checkpoint of ``log`` as it stands (for the operator to sign)."""
    return Checkpoint(log.head_sequence, log.head_digest, issued_ms, issued_ms + lifetime_ms)


def covers(log: AdmissionLog, checkpoint: Checkpoint) -> bool:
    """True if ``log`` is the checkpointed log or extends it (the checkpoint's head is on its chain).

    A copy that holds more than the checkpoint names is fine: every extra statement is
    operator-signed, so it can only be newer knowledge. A copy that holds less, or a different
    statement at the checkpoint's head, is not covered."""
    if checkpoint.sequence > log.head_sequence:
        return False
    if checkpoint.sequence == 0:
        return checkpoint.head is None
    return log.entries[checkpoint.sequence - 1].digest() == checkpoint.head


def check_served(
    log: AdmissionLog, signed: SignedCheckpoint, held: SignedCheckpoint | None, *, exact: bool = False
) -> None:
    """Check a served ``signed`` checkpoint before a follower (or the coordinator) takes it in place of
    ``held``. ``exact``: the checkpoint must name the whole of ``log`` (the coordinator's rule; a
    follower's copy may run ahead of it). Raises CheckpointError."""
    signed.verify(log.operator_key)
    checkpoint = signed.checkpoint
    if exact and (checkpoint.sequence, checkpoint.head) != (log.head_sequence, log.head_digest):
        raise CheckpointError(
            "SEQUENCE_CONFLICT",
            f"checkpoint names sequence {checkpoint.sequence}, the log holds {log.head_sequence} statements",
        )
    if not covers(log, checkpoint):
        raise CheckpointError("CHAIN_MISMATCH", "checkpoint does not name a head of this log")
    if held is not None and is_older(checkpoint, held.checkpoint):
        raise CheckpointError("ROLLBACK", "checkpoint is older than the one already held")


def is_older(candidate: Checkpoint, held: Checkpoint) -> bool:
    """A checkpoint that names a shorter log, or was issued earlier, than the one held replaces nothing."""
    return candidate.sequence < held.sequence or candidate.issued_ms < held.issued_ms


def fresh(log: AdmissionLog, held: SignedCheckpoint | None, now_ms: int) -> bool:
    """The copy is fresh: it holds a checkpoint that has not expired and that the copy covers.

    The signature was checked when ``held`` was taken in (:func:`check_served`)."""
    return held is not None and now_ms < held.checkpoint.expires_ms and covers(log, held.checkpoint)


def _int(value: object, what: str) -> int:
    if type(value) is not int or not 0 <= value <= SAFE_INTEGER_MAX:
        raise MalformedError(f"{what} must be a non-negative integer")
    return value
