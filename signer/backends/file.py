"""Local key files: an Ed25519 private key as a JSON Web Key (RFC 8037), readable by its owner only."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from countersign.canonical import b64url_decode, b64url_encode
from countersign.errors import MalformedError, SignerError
from countersign.keys import PUBLIC_KEY_LENGTH, SEED_LENGTH, Ed25519Signer

KEY_FILE_MODE = 0o600


def key_file_json(signer: Ed25519Signer) -> dict[str, str]:
    return {
        "kty": "OKP",
        "crv": "Ed25519",
        "kid": signer.key_id,
        "x": b64url_encode(signer.public_key),
        "d": b64url_encode(signer.seed),
    }


def write_key_file(path: str | os.PathLike[str], signer: Ed25519Signer) -> None:
    """Create ``path`` with mode 0600 and write the key. Refuses to overwrite an existing file."""
    data = json.dumps(key_file_json(signer), indent=2).encode() + b"\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, KEY_FILE_MODE)
    try:
        os.fchmod(fd, KEY_FILE_MODE)  # the umask cannot widen it, but be explicit
        os.write(fd, data)
    finally:
        os.close(fd)


class FileSigner:
    """Signs with a key loaded from a 0600 key file."""

    def __init__(self, key: Ed25519Signer, path: str) -> None:
        self._key = key
        self.path = path

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> FileSigner:
        """Load a key file. Raises SignerError if it is missing, malformed or readable by others."""
        location = Path(path)
        try:
            info = location.stat()
        except OSError as exc:
            raise SignerError(f"cannot read key file {location}: {exc.strerror}") from None
        if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise SignerError(
                f"key file {location} is accessible by group or others (mode {info.st_mode & 0o777:o}); chmod 600 it"
            )
        try:
            body = json.loads(location.read_bytes())
            if not isinstance(body, dict) or body.get("kty") != "OKP" or body.get("crv") != "Ed25519":
                raise MalformedError("not an Ed25519 JWK")
            key = Ed25519Signer(b64url_decode(str(body["d"]), SEED_LENGTH))
            if b64url_decode(str(body["x"]), PUBLIC_KEY_LENGTH) != key.public_key:
                raise MalformedError("public key does not match the private key")
        except (OSError, ValueError, KeyError) as exc:
            raise SignerError(f"key file {location} is not a valid Ed25519 key: {exc}") from None
        return cls(key, str(location))

    @property
    def key_id(self) -> str:
        return self._key.key_id

    @property
    def public_key(self) -> bytes:
        return self._key.public_key

    def sign(self, message: bytes) -> bytes:
        return self._key.sign(message)

    def __repr__(self) -> str:
        return f"FileSigner(key_id={self.key_id!r}, path={self.path!r})"
