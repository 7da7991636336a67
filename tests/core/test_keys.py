"""Keys: identifiers, strict Ed25519 verification, key files."""

from __future__ import annotations

import hashlib
import os
import stat

import pytest
from hypothesis import given
from hypothesis import strategies as st

from countersign.errors import SignerError
from countersign.keys import Ed25519Signer, PublicKey, Signer, key_id_for
from signer.backends import load_signer
from signer.backends.file import FileSigner, write_key_file

pytestmark = pytest.mark.offline

L = 2**252 + 27742317777372353535851937790883648493  # the order of the Ed25519 base point


def test_key_id_is_derived_from_the_public_key() -> None:
    signer = Ed25519Signer(bytes(32))
    assert signer.key_id == "ed25519:" + hashlib.sha256(signer.public_key).hexdigest()[:32]
    assert key_id_for(signer.public_key) == signer.key_id
    assert isinstance(signer, Signer)


@given(st.binary(min_size=0, max_size=2048))
def test_signatures_verify_and_any_other_message_does_not(message: bytes) -> None:
    signer = Ed25519Signer(hashlib.sha256(b"k").digest())
    key = PublicKey(signer.public_key)
    signature = signer.sign(message)
    assert key.verify(message, signature)
    assert not key.verify(message + b"\x00", signature)


@given(st.integers(0, 63), st.integers(1, 255))
def test_any_flipped_signature_byte_is_rejected(position: int, mask: int) -> None:
    signer = Ed25519Signer(hashlib.sha256(b"k").digest())
    signature = bytearray(signer.sign(b"message"))
    signature[position] ^= mask
    assert not PublicKey(signer.public_key).verify(b"message", bytes(signature))


def test_non_canonical_s_is_rejected() -> None:
    """Strict verification: S + L verifies under lax (cofactor-less, unreduced) rules, not here."""
    signer = Ed25519Signer(hashlib.sha256(b"k").digest())
    signature = signer.sign(b"message")
    s = int.from_bytes(signature[32:], "little") + L
    assert s < 2**256
    malleated = signature[:32] + s.to_bytes(32, "little")
    assert not PublicKey(signer.public_key).verify(b"message", malleated)


def test_small_order_public_key_is_rejected() -> None:
    identity = (1).to_bytes(32, "little")  # the neutral element: every "signature" would verify under it
    signature = bytes(32) + bytes(32)  # R = encoding of zero point (small order), S = 0
    assert not PublicKey(identity).verify(b"anything", identity + bytes(32))
    assert not PublicKey(identity).verify(b"anything", signature)


def test_wrong_length_signature_is_rejected_without_raising() -> None:
    signer = Ed25519Signer(hashlib.sha256(b"k").digest())
    assert not PublicKey(signer.public_key).verify(b"m", signer.sign(b"m")[:63])


def test_key_file_is_created_0600_and_loads(tmp_path) -> None:
    signer = Ed25519Signer.generate()
    location = tmp_path / "deployer.jwk"
    write_key_file(location, signer)
    assert stat.S_IMODE(location.stat().st_mode) == 0o600
    loaded = load_signer(f"file:{location}")
    assert loaded.key_id == signer.key_id
    assert PublicKey(loaded.public_key).verify(b"x", loaded.sign(b"x"))
    assert signer.seed.hex() not in repr(loaded)


def test_key_file_is_never_overwritten(tmp_path) -> None:
    location = tmp_path / "deployer.jwk"
    write_key_file(location, Ed25519Signer.generate())
    with pytest.raises(FileExistsError):
        write_key_file(location, Ed25519Signer.generate())


def test_key_file_readable_by_others_is_refused(tmp_path) -> None:
    location = tmp_path / "deployer.jwk"
    write_key_file(location, Ed25519Signer.generate())
    os.chmod(location, 0o644)
    with pytest.raises(SignerError, match="chmod 600"):
        FileSigner.load(location)


@pytest.mark.parametrize("body", [b"", b"{}", b"not json", b'{"kty":"OKP","crv":"Ed25519","d":"AAAA","x":"AAAA"}'])
def test_malformed_key_file_is_a_signer_error(tmp_path, body: bytes) -> None:
    location = tmp_path / "bad.jwk"
    location.write_bytes(body)
    os.chmod(location, 0o600)
    with pytest.raises(SignerError):
        FileSigner.load(location)


def test_key_file_whose_public_half_does_not_match_is_refused(tmp_path) -> None:
    import json

    from signer.backends.file import key_file_json

    body = key_file_json(Ed25519Signer.generate())
    body["x"] = key_file_json(Ed25519Signer.generate())["x"]
    location = tmp_path / "mixed.jwk"
    location.write_text(json.dumps(body))
    os.chmod(location, 0o600)
    with pytest.raises(SignerError, match="does not match"):
        FileSigner.load(location)


def test_unknown_key_uri_scheme_is_refused() -> None:
    with pytest.raises(SignerError, match="unknown key URI scheme"):
        load_signer("vault:secret/key")


@given(st.binary(min_size=32, max_size=32), st.binary(min_size=0, max_size=4096))
def test_signing_gives_exactly_pynacls_signature(seed: bytes, message: bytes) -> None:
    """Ed25519Signer.sign calls libsodium directly; Ed25519 is deterministic, so the signature must be
    PyNaCl's ``SigningKey.sign`` byte for byte."""
    import nacl.signing

    assert Ed25519Signer(seed).sign(message) == nacl.signing.SigningKey(seed).sign(message).signature
