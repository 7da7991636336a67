"""The compact path encoding (docs/spec.md, section 19.1; optional): ``cs1z.`` followed by the unpadded
base64url of the raw DEFLATE (RFC 1951) of a path's canonical path JSON.

A transport encoding only: nothing is signed over the compressed form, and a reader inflates it back to
the exact path JSON bytes and parses those as any path (so a compact path and its path JSON are the same
evidence by construction). Inflating is bounded (:data:`MAX_PATH_JSON_BYTES`, checked while inflating,
so a small string cannot expand without limit), and a reader refuses anything but one canonical
encoding: padding or base64url that does not re-encode to the same characters, a stream that is not
complete or has data after its end, and inflated bytes that are not the canonical path JSON of the path
they parse to. Every refusal is a :class:`countersign.errors.MalformedError`.
"""

from __future__ import annotations

import base64
import binascii
import re
import zlib
from typing import Final

from countersign.errors import MalformedError
from countersign.records import Path

COMPACT_PREFIX: Final = "cs1z."
MAX_PATH_JSON_BYTES: Final = 64 * 1024  # a path this binding carries; inflating stops past it
# DEFLATE never expands input by more than a few bytes per 16 KiB block: a longer string cannot hold a path.
MAX_COMPACT_CHARS: Final = len(COMPACT_PREFIX) + (MAX_PATH_JSON_BYTES + 1024) * 4 // 3
_BASE64URL: Final = re.compile(r"[A-Za-z0-9_-]*")


def compact_path(path: Path) -> str:
    """``path`` in the compact encoding (the reference compresses at level 9; any level reads back)."""
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    data = deflate.compress(path.to_bytes()) + deflate.flush()
    return COMPACT_PREFIX + base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def is_compact(text: str) -> bool:
    return text.startswith(COMPACT_PREFIX)


def path_json_from_compact(text: str) -> bytes:
    """The canonical path JSON a compact string holds. Raises MalformedError."""
    if type(text) is not str:
        raise MalformedError("a compact path is a string")
    if len(text) > MAX_COMPACT_CHARS:
        raise MalformedError(f"a compact path is at most {MAX_COMPACT_CHARS} characters")
    if not text.startswith(COMPACT_PREFIX):
        raise MalformedError(f"a compact path starts with {COMPACT_PREFIX!r}")
    body = text[len(COMPACT_PREFIX) :]
    if _BASE64URL.fullmatch(body) is None or len(body) % 4 == 1:
        raise MalformedError("the compact path's body is not unpadded base64url")
    try:
        data = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    except (binascii.Error, ValueError):
        raise MalformedError("the compact path's body is not unpadded base64url") from None
    if base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii") != body:
        raise MalformedError("the compact path's body is not the canonical base64url of its bytes")
    inflate = zlib.decompressobj(-15)
    try:
        inflated = inflate.decompress(data, MAX_PATH_JSON_BYTES + 1)
    except zlib.error:
        raise MalformedError("the compact path's body is not a DEFLATE stream") from None
    if len(inflated) > MAX_PATH_JSON_BYTES:
        raise MalformedError(f"the compact path inflates past {MAX_PATH_JSON_BYTES} bytes")
    if not inflate.eof or inflate.unused_data or inflate.unconsumed_tail:
        raise MalformedError("the compact path's DEFLATE stream is incomplete or has data after its end")
    return inflated


def path_from_compact(text: str) -> Path:
    """The path a compact string holds, parsed as path JSON and required to be canonical. Raises
    MalformedError."""
    data = path_json_from_compact(text)
    path = Path.from_bytes(data)
    if path.to_bytes() != data:
        raise MalformedError("the compact path inflates to path JSON that is not canonical")
    return path
