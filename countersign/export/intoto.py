"""The output as the subject of an in-toto Statement v1 whose predicate is its path (docs/spec.md 15.2).

The Statement is not signed: the evidence inside it is. A consumer verifies ``predicate.path`` for
the subject's bytes (``countersign verify``) before it relies on anything the Statement says.
"""

from __future__ import annotations

import hashlib
from typing import Final

from countersign.canonical import DIGEST_PREFIX, JsonValue, canonicalize
from countersign.export.errors import ExportError
from countersign.records import Path

STATEMENT_TYPE: Final = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE: Final = "urn:countersign:predicate:path:v1"
DEFAULT_SUBJECT_NAME: Final = "output"


def emitter(path: Path) -> dict[str, JsonValue]:
    """Who emitted the output, as the leaf record claims it (a claim until the path is verified)."""
    leaf = path.leaf.record
    output = leaf.output
    assert output is not None
    return {
        "deployer": leaf.deployer,
        "key_id": leaf.key_id,
        "agent": leaf.agent.to_json(),
        "session": output.session,
        "seq": output.seq,
        "binding_scope": output.binding_scope.value,
    }


def statement(
    path: Path, output: bytes | None = None, *, subject_name: str = DEFAULT_SUBJECT_NAME
) -> dict[str, JsonValue]:
    """The Statement for the leaf's output. With ``output``, its SHA-256 must equal the signed hash.

    Raises ExportError when the leaf has no output section or the bytes differ from it.
    """
    leaf = path.leaf.record
    if leaf.output is None:
        raise ExportError("the leaf record has no output section: there is no subject to attest")
    signed_hex = leaf.output.sha256.removeprefix(DIGEST_PREFIX)
    if output is not None and hashlib.sha256(output).hexdigest() != signed_hex:
        raise ExportError("SHA-256 of the output bytes differs from the leaf's signed output hash")
    if not subject_name:
        raise ExportError("the subject needs a name")
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": subject_name, "digest": {"sha256": signed_hex}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {"emitter": emitter(path), "path": path.to_json()},
    }


def statement_bytes(path: Path, output: bytes | None = None, *, subject_name: str = DEFAULT_SUBJECT_NAME) -> bytes:
    """RFC 8785 bytes of :func:`statement` and a newline (reproducible, ready to be signed by anyone)."""
    return canonicalize(statement(path, output, subject_name=subject_name)) + b"\n"
