"""Key backends behind the :class:`countersign.keys.Signer` seam, chosen by URI scheme.

``file:/path/key.jwk`` (or a bare path) loads a local key file (mode 0600); ``awskms:<key id or ARN>``
signs in AWS KMS (needs the ``aws`` extra; imported only when asked for).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from countersign.errors import SignerError
from countersign.keys import Signer


def _file_signer(location: str) -> Signer:
    from signer.backends.file import FileSigner

    return FileSigner.load(location)


SIGNER_FOR_URI_SCHEME: dict[str, Callable[[str], Signer]] = {"file": _file_signer}
# Backends with optional dependencies register themselves when their module is imported.
_LAZY_SCHEMES = {"awskms": "signer.backends.awskms"}


def register_scheme(scheme: str, factory: Callable[[str], Signer]) -> None:
    SIGNER_FOR_URI_SCHEME[scheme] = factory


def load_signer(uri: str) -> Signer:
    """The signer a key URI names. Raises SignerError for an unknown scheme or an unusable key."""
    scheme, sep, rest = uri.partition(":")
    if not sep or len(scheme) < 2 or "/" in scheme:  # a bare path (or a Windows drive letter)
        return _file_signer(uri)
    if scheme in _LAZY_SCHEMES and scheme not in SIGNER_FOR_URI_SCHEME:
        importlib.import_module(_LAZY_SCHEMES[scheme])
    factory = SIGNER_FOR_URI_SCHEME.get(scheme)
    if factory is None:
        raise SignerError(f"unknown key URI scheme {scheme!r}; known: {sorted(SIGNER_FOR_URI_SCHEME)}")
    return factory(rest)
