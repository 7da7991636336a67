"""Records and edge manifests as standard DSSE envelopes, without re-signing (docs/spec.md section 15.1).

A primary signature is Ed25519 over ``PAE(PAYLOAD_TYPE_NODE, JCS(signed view))`` and a co-signature
over ``PAE(PAYLOAD_TYPE_EDGE, τ)``: exactly DSSE's signing input. So each signed record is a DSSE
envelope whose payload is its signed view, and each co-signed edge one whose payload is τ carrying
both co-signatures. Only the encodings change (DSSE writes payload and signature in standard base64).
"""

from __future__ import annotations

import base64
from typing import Final

from countersign.canonical import JsonValue, b64url_decode_validated, canonicalize_validated
from countersign.constructions import NAIVE_SIG_UNSIGNED_FIELDS, edge_manifest
from countersign.export.errors import ExportError
from countersign.records import PAYLOAD_TYPE_EDGE, PAYLOAD_TYPE_NODE, Construction, Envelope, Path

DSSE_MEDIA_TYPE: Final = "application/vnd.dsse.envelope.v1+json"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _signature(key_id: str, sig: str) -> dict[str, JsonValue]:
    return {"keyid": key_id, "sig": _b64(b64url_decode_validated(sig))}


def signed_view(envelope: Envelope) -> bytes:
    """The bytes the primary signature covers after PAE: the record, or under NAIVE-SIG its view."""
    if envelope.record.construction is Construction.NAIVE_SIG:
        view = {k: v for k, v in envelope.record_json.items() if k not in NAIVE_SIG_UNSIGNED_FIELDS}
        return canonicalize_validated(view)
    return envelope.record_bytes()


def record_envelope(envelope: Envelope) -> dict[str, JsonValue]:
    """The DSSE envelope of one signed record. Raises ExportError for the unsigned baselines."""
    if envelope.sig is None:
        raise ExportError(f"{envelope.record.construction} records carry no signature: nothing to export as DSSE")
    return {
        "payload": _b64(signed_view(envelope)),
        "payloadType": PAYLOAD_TYPE_NODE,
        "signatures": [_signature(envelope.key_id, envelope.sig)],
    }


def edge_envelope(parent: Envelope, child: Envelope) -> dict[str, JsonValue]:
    """The DSSE envelope of a co-signed edge: payload τ, the parent's then the child's co-signature.

    Raises ExportError when ``child`` carries no co-signatures.
    """
    cosigs = child.record.cosigs
    if not cosigs:
        raise ExportError(f"record at depth {child.record.depth} carries no co-signatures")
    manifest = edge_manifest(parent.digest(), child.record_bytes(), cosigs)
    return {
        "payload": _b64(manifest),
        "payloadType": PAYLOAD_TYPE_EDGE,
        "signatures": [_signature(c.key_id, c.sig) for c in cosigs],
    }


def dsse_envelopes(path: Path) -> list[dict[str, JsonValue]]:
    """Every envelope of ``path`` in issuance order: for each record, its edge (if co-signed), then it.

    Raises ExportError for a path of an unsigned baseline.
    """
    envelopes: list[dict[str, JsonValue]] = []
    for index, envelope in enumerate(path.envelopes):
        if index > 0 and envelope.record.cosigs:
            envelopes.append(edge_envelope(path.envelopes[index - 1], envelope))
        envelopes.append(record_envelope(envelope))
    return envelopes


def dsse_bundle(path: Path) -> bytes:
    """JSON Lines, one canonical DSSE envelope per line (the in-toto bundle layout)."""
    return b"".join(canonicalize_validated(e) + b"\n" for e in dsse_envelopes(path))
