"""Exports of a path for standard tools, and audit views of it (docs/spec.md section 15).

Pure functions: a parsed path (and optionally the output bytes) in, document bytes out.

* DSSE (:mod:`countersign.export.dsse`): every record and every co-signed edge as a standard DSSE
  envelope carrying the signatures it already has; nothing is re-signed.
* in-toto Statement v1 (:mod:`countersign.export.intoto`): the output as subject, its path as predicate.
* W3C PROV (:mod:`countersign.export.provenance`): PROV-JSON, PROV-N and PROV-O (Turtle), built with
  the ``prov`` package, an optional extra (``pip install 'countersign-mesh[export]'``) imported only here.

Audit views: :mod:`countersign.export.marks` (which signatures verify) and
:mod:`countersign.export.registry_log` (an exported admission log checked offline).
"""

from __future__ import annotations

from typing import Final

from countersign.export.dsse import dsse_bundle, dsse_envelopes
from countersign.export.errors import ExportError, ExtraMissing
from countersign.export.intoto import DEFAULT_SUBJECT_NAME, PREDICATE_TYPE, statement, statement_bytes
from countersign.export.provenance import PROV_FORMATS, prov_bytes, prov_document
from countersign.records import Path

FORMATS: Final = ("dsse", "in-toto", *PROV_FORMATS)


def export_path(
    path: Path, fmt: str, *, output: bytes | None = None, subject_name: str = DEFAULT_SUBJECT_NAME
) -> bytes:
    """``path`` in format ``fmt`` (one of :data:`FORMATS`).

    ``output`` (the exact output bytes) is checked against the leaf's signed hash when given; only
    the in-toto Statement names the output, so only it needs them. Raises ExportError (ExtraMissing
    when an optional library is absent), ValueError for an unknown format.
    """
    if fmt == "dsse":
        return dsse_bundle(path)
    if fmt == "in-toto":
        return statement_bytes(path, output, subject_name=subject_name)
    if fmt in PROV_FORMATS:
        return prov_bytes(path, fmt)
    raise ValueError(f"unknown export format {fmt!r}; one of {', '.join(FORMATS)}")


__all__ = [
    "DEFAULT_SUBJECT_NAME",
    "FORMATS",
    "PREDICATE_TYPE",
    "ExportError",
    "ExtraMissing",
    "dsse_bundle",
    "dsse_envelopes",
    "export_path",
    "prov_bytes",
    "prov_document",
    "statement",
    "statement_bytes",
]
