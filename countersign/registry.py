"""The verifier's view of the admission registry: deployers, their keys, and each key's status.

Pure data. The command line reads it from a file; the verifier service folds it from the
operator-signed statement log it receives from the coordinator.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from countersign.canonical import SAFE_INTEGER_MAX, JsonValue, b64url_decode, b64url_encode
from countersign.errors import MalformedError
from countersign.keys import PUBLIC_KEY_LENGTH, PublicKey
from countersign.reasons import Reason
from countersign.records import DEPLOYER_ID_PATTERN, FORMAT_VERSION, KEY_ID_PATTERN, UnsupportedVersionError

REGISTRY_KEYS: Final = frozenset({"v", "sequence", "deployers"})
DEPLOYER_KEYS: Final = frozenset({"keys"})
KEY_KEYS: Final = frozenset({"key_id", "public_key", "added_ms", "retired_ms", "revoked_ms"})


@dataclass(frozen=True, slots=True)
class KeyEntry:
    """One registered key. Valid for records created in ``[added_ms, retired_ms)`` unless revoked."""

    public_key: PublicKey
    added_ms: int
    retired_ms: int | None = None
    revoked_ms: int | None = None

    @property
    def key_id(self) -> str:
        return self.public_key.key_id

    def to_json(self) -> dict[str, JsonValue]:
        return {
            "key_id": self.key_id,
            "public_key": b64url_encode(self.public_key.raw),
            "added_ms": self.added_ms,
            "retired_ms": self.retired_ms,
            "revoked_ms": self.revoked_ms,
        }


@dataclass(frozen=True, slots=True)
class KeyProblem:
    """Why a signing key cannot be used for a record."""

    reason: Reason
    detail: str


@dataclass(frozen=True, slots=True)
class Registry:
    """Admitted deployers and their keys, at registry log position ``sequence``."""

    deployers: Mapping[str, Mapping[str, KeyEntry]]
    sequence: int = 0

    def resolve(self, deployer: str, key_id: str, at_ms: int) -> PublicKey | KeyProblem:
        """The public key ``deployer`` may use under ``key_id`` for a record created at ``at_ms``,
        or why it may not."""
        keys = self.deployers.get(deployer)
        if keys is None:
            return KeyProblem(Reason.UNKNOWN_DEPLOYER, f"deployer {deployer!r} is not admitted")
        entry = keys.get(key_id)
        if entry is None:
            return KeyProblem(Reason.UNKNOWN_KEY, f"{key_id} is not a key of {deployer!r}")
        if entry.revoked_ms is not None:
            return KeyProblem(Reason.KEY_REVOKED, f"{key_id} was revoked")
        if at_ms < entry.added_ms or (entry.retired_ms is not None and at_ms >= entry.retired_ms):
            return KeyProblem(Reason.KEY_NOT_VALID, f"{key_id} was not valid at {at_ms}")
        return entry.public_key

    @classmethod
    def from_json(cls, value: object) -> Registry:
        """Parse the registry file format (docs/spec.md). Raises MalformedError."""
        if type(value) is not dict or value.keys() != REGISTRY_KEYS:
            raise MalformedError(f"registry must be an object with fields {sorted(REGISTRY_KEYS)}")
        if type(value["v"]) is not int:
            raise MalformedError("registry.v must be an integer")
        if value["v"] != FORMAT_VERSION:
            raise UnsupportedVersionError(f"registry version {value['v']!r} is not supported")
        sequence = _int(value["sequence"], "registry.sequence")
        deployers_value = value["deployers"]
        if type(deployers_value) is not dict:
            raise MalformedError("registry.deployers must be an object")
        deployers: dict[str, dict[str, KeyEntry]] = {}
        owners: dict[str, str] = {}
        for deployer, body in deployers_value.items():
            if DEPLOYER_ID_PATTERN.fullmatch(deployer) is None:
                raise MalformedError(f"invalid deployer id {deployer!r}")
            if type(body) is not dict or body.keys() != DEPLOYER_KEYS or type(body["keys"]) is not list:
                raise MalformedError(f"registry.deployers.{deployer} must be {{'keys': [...]}}")
            keys: dict[str, KeyEntry] = {}
            for item in body["keys"]:
                entry = _parse_key(item, deployer)
                if entry.key_id in owners:
                    # One key serving two deployers could co-sign both ends of an edge between them.
                    raise MalformedError(f"key {entry.key_id} is registered to {owners[entry.key_id]} and {deployer}")
                owners[entry.key_id] = deployer
                keys[entry.key_id] = entry
            deployers[deployer] = keys
        return cls(deployers, sequence)

    def to_json(self) -> dict[str, JsonValue]:
        return {
            "v": FORMAT_VERSION,
            "sequence": self.sequence,
            "deployers": {
                deployer: {"keys": [entry.to_json() for entry in keys.values()]}
                for deployer, keys in sorted(self.deployers.items())
            },
        }


def _int(value: object, what: str) -> int:
    if type(value) is not int or not 0 <= value <= SAFE_INTEGER_MAX:
        raise MalformedError(f"{what} must be a non-negative integer")
    return value


def _optional_int(value: object, what: str) -> int | None:
    return None if value is None else _int(value, what)


def _parse_key(item: object, deployer: str) -> KeyEntry:
    if type(item) is not dict or item.keys() != KEY_KEYS:
        raise MalformedError(f"{deployer}: each key must have fields {sorted(KEY_KEYS)}")
    key_id = item["key_id"]
    public = item["public_key"]
    if type(key_id) is not str or KEY_ID_PATTERN.fullmatch(key_id) is None or type(public) is not str:
        raise MalformedError(f"{deployer}: malformed key_id or public_key")
    public_key = PublicKey(b64url_decode(public, PUBLIC_KEY_LENGTH))
    if public_key.key_id != key_id:
        raise MalformedError(f"{deployer}: key_id {key_id} does not match its public key")
    entry = KeyEntry(
        public_key,
        _int(item["added_ms"], "added_ms"),
        _optional_int(item["retired_ms"], "retired_ms"),
        _optional_int(item["revoked_ms"], "revoked_ms"),
    )
    if entry.retired_ms is not None and entry.retired_ms < entry.added_ms:
        raise MalformedError(f"{deployer}: key {key_id} is retired before it was added")
    return entry
