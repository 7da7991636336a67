"""The ``Delegation`` handoff: what a parent deployer's runtime gives the child deployer's runtime so
that the child can accept a co-signed delegation, as one compact string.

The string travels wherever agents talk: an A2A message's metadata, an MCP request's ``_meta``, an HTTP
header. It is ``cs1.`` followed by unpadded base64url of the canonical (RFC 8785) JSON object::

    {"v": 1, "parent_path": <the parent path, as path JSON>, "grant_id": "...",
     "parent_digest": "sha256:...", "parent_key_id": "ed25519:...", "parent_signer": "host:port",
     "child_deployer": "...", "expires_ms": 1767225600000}

It holds nothing secret: the parent path is evidence meant to be shown, and a grant lets only the named
child deployer's signer (authenticated by its mTLS certificate) attach one child, once, before it
expires. Parsing is strict: the prefix, the encoding (one encoding per byte string), the size bound, the
JSON (no duplicate keys, no floats, exactly these fields), the parent path (the wire format of
docs/spec.md) and the consistency of the grant with that path are all checked, and every failure is a
:class:`HandoffError` with code ``INVALID_ARGUMENT``.

Pure (the core: no gRPC, no I/O), so that a consumer or a tool reads a handoff with the core alone;
the client SDK's runtime makes and accepts them (``countersign.client.Runtime``).
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from typing import Final

from countersign.canonical import SAFE_INTEGER_MAX, JsonValue, canonicalize_validated
from countersign.errors import ErrorCode, MalformedError, ServiceError
from countersign.records import (
    DEPLOYER_ID_PATTERN,
    DIGEST_PATTERN,
    IDENTIFIER_PATTERN,
    KEY_ID_PATTERN,
    Path,
    parse_json,
)

HANDOFF_PREFIX: Final = "cs1."
HANDOFF_VERSION: Final = 1
# A depth-3 parent path is about 3 KiB of JSON, 4 KiB as a handoff; 64 KiB leaves room for deep paths
# and still fits the metadata limits of the usual carriers. Checked before anything is decoded.
MAX_HANDOFF_CHARS: Final = 64 * 1024
HANDOFF_KEYS: Final = frozenset(
    {"v", "parent_path", "grant_id", "parent_digest", "parent_key_id", "parent_signer", "child_deployer", "expires_ms"}
)
# host:port, a name or an IPv4 address or an IPv6 address in brackets; no spaces, no scheme, no path;
# or up to eight of them separated by commas (the parent signer's replicas, spec 18).
_ONE_ADDRESS = r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]{1,253}):[0-9]{1,5}"
SIGNER_ADDRESS_PATTERN: Final = re.compile(rf"{_ONE_ADDRESS}(?:,{_ONE_ADDRESS}){{0,7}}")
_BASE64URL: Final = re.compile(r"[A-Za-z0-9_-]*")


@dataclass(frozen=True)
class Grant:
    """A parent deployer's permission for one named child deployer to attach one child under one of
    its records (``SignerClient.open_grant``). The child deployer's runtime passes it, with the parent
    path and the parent signer's address, to ``SignerClient.accept``. It holds nothing secret."""

    grant_id: str
    parent_digest: str  # sha256:<hex> of the parent envelope the grant is for
    parent_key_id: str  # the key the parent's signer will co-sign the edge with
    child_deployer: str
    expires_ms: int  # after this the parent's signer refuses to co-sign under the grant


class HandoffError(ServiceError):
    """A handoff the child side refuses before any call is made: malformed (``INVALID_ARGUMENT``),
    expired (``GRANT_EXPIRED``) or addressed to another child deployer (``GRANT_WRONG_CHILD``).

    A :class:`countersign.errors.ServiceError` (a code and a message, no transport status), so one
    ``except ServiceError`` catches these and the refusals the signers send, each with its ``code``."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(code, message)


def _malformed(message: str) -> HandoffError:
    return HandoffError(ErrorCode.INVALID_ARGUMENT, f"malformed delegation handoff: {message}")


def _field(value: object, pattern: re.Pattern[str], name: str) -> str:
    if type(value) is not str or pattern.fullmatch(value) is None:
        raise _malformed(f"{name} must match {pattern.pattern}")
    return value


def _port_ok(addresses: str) -> bool:
    return all(0 < int(address.rpartition(":")[2]) <= 65_535 for address in addresses.split(","))


@dataclass(frozen=True)
class Delegation:
    """A parent deployer's delegation to one child deployer, ready to be accepted: the parent path,
    the grant its signer opened for the child, and where that signer is reached.

    Made by :meth:`countersign.client.Runtime.delegate`; sent as :meth:`to_string`; read back with
    :meth:`from_string` (the core alone) and accepted by :meth:`countersign.client.Runtime.accept` on
    the child side."""

    parent: Path
    grant: Grant
    parent_signer: str  # host:port (or several, comma-separated) where the child's signer reaches the parent's

    def __post_init__(self) -> None:
        self._check()

    @property
    def child_deployer(self) -> str:
        return self.grant.child_deployer

    @property
    def parent_deployer(self) -> str:
        return self.parent.leaf.record.deployer

    @property
    def expires_ms(self) -> int:
        return self.grant.expires_ms

    def expired(self, now_ms: int) -> bool:
        """True once the grant's expiry has passed at ``now_ms``: the parent's signer would refuse it."""
        return now_ms >= self.grant.expires_ms

    def _check(self) -> None:
        """The grant must belong to the parent path and name another deployer. Raises HandoffError."""
        grant = self.grant
        _field(grant.grant_id, IDENTIFIER_PATTERN, "grant_id")
        _field(grant.parent_digest, DIGEST_PATTERN, "parent_digest")
        _field(grant.parent_key_id, KEY_ID_PATTERN, "parent_key_id")
        _field(grant.child_deployer, DEPLOYER_ID_PATTERN, "child_deployer")
        address = _field(self.parent_signer, SIGNER_ADDRESS_PATTERN, "parent_signer")
        if not _port_ok(address):
            raise _malformed("parent_signer has no valid port")
        if type(grant.expires_ms) is not int or not 0 < grant.expires_ms <= SAFE_INTEGER_MAX:
            raise _malformed(f"expires_ms must be an integer in [1, {SAFE_INTEGER_MAX}]")
        if grant.parent_digest != self.parent.leaf.digest():
            raise _malformed("parent_digest is not the digest of the parent path's leaf")
        if grant.child_deployer == self.parent_deployer:
            raise _malformed("a delegation crosses deployers: the child deployer is the parent's own")

    def to_json(self) -> dict[str, JsonValue]:
        grant = self.grant
        return {
            "v": HANDOFF_VERSION,
            "parent_path": self.parent.to_json(),
            "grant_id": grant.grant_id,
            "parent_digest": grant.parent_digest,
            "parent_key_id": grant.parent_key_id,
            "parent_signer": self.parent_signer,
            "child_deployer": grant.child_deployer,
            "expires_ms": grant.expires_ms,
        }

    def to_string(self) -> str:
        """The compact handoff string: ``cs1.`` and base64url of the canonical JSON (no padding)."""
        data = canonicalize_validated(self.to_json())
        text = HANDOFF_PREFIX + base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")
        if len(text) > MAX_HANDOFF_CHARS:
            raise _malformed(f"the handoff would be {len(text)} characters, over {MAX_HANDOFF_CHARS}")
        return text

    def __str__(self) -> str:
        return self.to_string()

    @classmethod
    def from_string(cls, text: str) -> Delegation:
        """Parse a handoff string. Raises HandoffError (``INVALID_ARGUMENT``) for every way it can be
        bad, and nothing else. Does not look at the clock: :meth:`Runtime.accept` refuses an expired
        one."""
        if type(text) is not str:
            raise _malformed("a handoff is a string")
        if len(text) > MAX_HANDOFF_CHARS:
            raise _malformed(f"longer than {MAX_HANDOFF_CHARS} characters")
        if not text.startswith(HANDOFF_PREFIX):
            raise _malformed(f"it does not start with {HANDOFF_PREFIX!r} (an unknown handoff version)")
        body = text[len(HANDOFF_PREFIX) :]
        if _BASE64URL.fullmatch(body) is None or len(body) % 4 == 1:
            raise _malformed("the body is not unpadded base64url")
        try:
            data = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        except (binascii.Error, ValueError):
            raise _malformed("the body is not unpadded base64url") from None
        if base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii") != body:
            raise _malformed("the body is not the canonical base64url of its bytes")
        try:
            value = parse_json(data)
        except MalformedError as exc:
            raise _malformed(str(exc)) from None
        delegation = cls.from_json(value)
        if canonicalize_validated(delegation.to_json()) != data:
            raise _malformed("the JSON is not in canonical form (RFC 8785)")
        return delegation

    @classmethod
    def from_json(cls, value: object) -> Delegation:
        """The handoff from its parsed JSON object. Raises HandoffError (``INVALID_ARGUMENT``)."""
        if type(value) is not dict:
            raise _malformed("the body must be a JSON object")
        if value.keys() != HANDOFF_KEYS:
            missing, unknown = sorted(HANDOFF_KEYS - value.keys()), sorted(value.keys() - HANDOFF_KEYS)
            raise _malformed(f"missing fields {missing}, unknown fields {unknown}")
        if value["v"] != HANDOFF_VERSION or type(value["v"]) is not int:
            raise _malformed(f"version {value['v']!r} is not supported")
        try:
            parent = Path.from_json(value["parent_path"])
        except MalformedError as exc:
            raise _malformed(f"parent_path: {exc}") from None
        grant = Grant(
            grant_id=_field(value["grant_id"], IDENTIFIER_PATTERN, "grant_id"),
            parent_digest=_field(value["parent_digest"], DIGEST_PATTERN, "parent_digest"),
            parent_key_id=_field(value["parent_key_id"], KEY_ID_PATTERN, "parent_key_id"),
            child_deployer=_field(value["child_deployer"], DEPLOYER_ID_PATTERN, "child_deployer"),
            expires_ms=value["expires_ms"],  # checked with the rest in __post_init__
        )
        return cls(parent, grant, _field(value["parent_signer"], SIGNER_ADDRESS_PATTERN, "parent_signer"))
