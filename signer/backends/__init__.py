"""Key backends behind the :class:`countersign.keys.Signer` seam, chosen by URI scheme.

``file:/path/key.jwk`` (or a bare path) loads a local key file (mode 0600); ``awskms:<key id or ARN>``
signs in AWS KMS (needs the ``aws`` extra). Each backend's module is imported only when its scheme is
used, so this package imports without the extras.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final

from countersign.errors import SignerError
from countersign.keys import Signer
from countersign.plugins import Plugin, open_plugin


def _file_signer(location: str) -> Signer:
    from signer.backends.file import FileSigner

    return FileSigner.load(location)


def _awskms_signer(location: str) -> Signer:
    from signer.backends.awskms import AwsKmsSigner

    return AwsKmsSigner.from_uri(location)


# The key backends by URI scheme (countersign.plugins: the command line's help and hints read it).
SIGNER_FOR_URI_SCHEME: Final[Mapping[str, Plugin[Callable[[str], Signer]]]] = {
    "file": Plugin(_file_signer, "file:/path/key.jwk", "a key file of mode 0600; a bare path too"),
    "awskms": Plugin(_awskms_signer, "awskms:KEY_ID_OR_ARN[?region=R]", "a key held in AWS KMS (docs/kms.md)", "aws"),
}


def load_signer(uri: str) -> Signer:
    """The signer a key URI names. Raises SignerError for an unknown scheme, a missing extra or an
    unusable key."""
    scheme, sep, rest = uri.partition(":")
    if not sep or len(scheme) < 2 or "/" in scheme:  # a bare path (or a Windows drive letter)
        return _file_signer(uri)
    return open_plugin(SIGNER_FOR_URI_SCHEME, scheme, rest, kind="key URI scheme", error=SignerError)
