"""Ed25519 keys, key identifiers and the :class:`Signer` seam.

Verification uses PyNaCl (libsodium), picked on measured speed (docs/adr/0002-pynacl-for-ed25519.md):
on this machine it verifies in about 54 µs where ``cryptography`` takes about 108 µs. libsodium's verifier is strict: it
rejects non-canonical ``S``, non-canonical or small-order public keys and small-order ``R``, so a
signature has exactly one accepted encoding.
"""

from __future__ import annotations

import hashlib
from typing import Final, Protocol, runtime_checkable

import nacl.bindings
import nacl.exceptions
import nacl.signing

KEY_ID_PREFIX: Final = "ed25519:"
PUBLIC_KEY_LENGTH: Final = 32
SIGNATURE_LENGTH: Final = 64
SEED_LENGTH: Final = 32


def key_id_for(public_key: bytes) -> str:
    """``ed25519:`` + first 32 hex digits of SHA-256 over the raw 32-byte public key."""
    if len(public_key) != PUBLIC_KEY_LENGTH:
        raise ValueError("an Ed25519 public key is 32 bytes")
    return KEY_ID_PREFIX + hashlib.sha256(public_key).hexdigest()[:32]


@runtime_checkable
class Signer(Protocol):
    """Something that signs with one Ed25519 key. Backends: in-memory, file, AWS KMS.

    ``sign`` receives the complete signing input (already domain-separated by PAE) and returns the
    64-byte signature. It raises :class:`countersign.errors.SignerError` when the backend fails.
    """

    @property
    def key_id(self) -> str: ...

    @property
    def public_key(self) -> bytes: ...

    def sign(self, message: bytes) -> bytes: ...


class Ed25519Signer:
    """An in-memory Ed25519 key. Holds the seed; never logs or reprs it."""

    __slots__ = ("_key", "_key_id", "_public_key", "_secret")

    def __init__(self, seed: bytes) -> None:
        if len(seed) != SEED_LENGTH:
            raise ValueError("an Ed25519 seed is 32 bytes")
        self._key = nacl.signing.SigningKey(seed)
        self._public_key = bytes(self._key.verify_key)
        # libsodium's secret key (seed and public key), for signing without PyNaCl's wrapper objects.
        self._secret = nacl.bindings.crypto_sign_seed_keypair(bytes(seed))[1]
        self._key_id = key_id_for(self._public_key)

    @classmethod
    def generate(cls) -> Ed25519Signer:
        return cls(bytes(nacl.signing.SigningKey.generate()))

    @property
    def key_id(self) -> str:
        return self._key_id

    @property
    def public_key(self) -> bytes:
        return self._public_key

    @property
    def seed(self) -> bytes:
        """The private seed, for writing a key file. Handle with care."""
        return bytes(self._key)

    def sign(self, message: bytes) -> bytes:
        """Ed25519 (deterministic): the same signature as PyNaCl's ``SigningKey.sign``, by the same
        libsodium call without the signed-message object it builds and slices (a node signs twice)."""
        return nacl.bindings.crypto_sign(message, self._secret)[:SIGNATURE_LENGTH]

    def __repr__(self) -> str:
        return f"Ed25519Signer(key_id={self._key_id!r})"


class PublicKey:
    """A parsed Ed25519 public key, ready to verify many signatures."""

    __slots__ = ("key_id", "raw")

    def __init__(self, raw: bytes) -> None:
        self.raw = bytes(raw)
        self.key_id = key_id_for(self.raw)

    def verify(self, message: bytes, signature: bytes) -> bool:
        """Strict Ed25519 verification. False for any invalid signature; never raises for bad input.

        Calls libsodium's ``crypto_sign_open`` directly: PyNaCl's ``VerifyKey.verify`` adds only
        wrapping around the same call, and this runs 13 times per depth-5 SIGNED-DAG path.
        """
        if len(signature) != SIGNATURE_LENGTH:
            return False
        try:
            nacl.bindings.crypto_sign_open(signature + message, self.raw)
        except nacl.exceptions.BadSignatureError:
            return False
        return True

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PublicKey) and other.raw == self.raw

    def __hash__(self) -> int:
        return hash(self.raw)

    def __repr__(self) -> str:
        return f"PublicKey({self.key_id!r})"
