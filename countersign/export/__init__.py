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

from collections.abc import Mapping
from functools import partial
from typing import Final, Protocol

from countersign.export.dsse import dsse_bundle, dsse_envelopes
from countersign.export.errors import ExportError, ExtraMissing
from countersign.export.intoto import DEFAULT_SUBJECT_NAME, PREDICATE_TYPE, statement, statement_bytes
from countersign.export.provenance import prov_bytes, prov_document
from countersign.plugins import Plugin, unknown
from countersign.records import Path


class Exporter(Protocol):
    """Writes ``path`` in one format: ``output`` (the output's bytes, or None) and ``subject_name``
    (the output's name) for a format that names the output."""

    def __call__(self, path: Path, output: bytes | None, subject_name: str) -> bytes: ...


def _dsse(path: Path, output: bytes | None, subject_name: str) -> bytes:
    return dsse_bundle(path)


def _in_toto(path: Path, output: bytes | None, subject_name: str) -> bytes:
    return statement_bytes(path, output, subject_name=subject_name)


def _prov(fmt: str, path: Path, output: bytes | None, subject_name: str) -> bytes:
    return prov_bytes(path, fmt)


# The export formats by name (countersign.plugins: ``countersign export --format`` reads it).
EXPORTER_FOR_FORMAT: Final[Mapping[str, Plugin[Exporter]]] = {
    "dsse": Plugin(_dsse, "dsse", "each record and co-signed edge as a DSSE envelope, spec 15.1"),
    "in-toto": Plugin(_in_toto, "in-toto", "an in-toto Statement v1 naming the output, spec 15.2"),
    "prov-json": Plugin(partial(_prov, "prov-json"), "prov-json", "W3C PROV-JSON, spec 15.3", "export"),
    "prov-n": Plugin(partial(_prov, "prov-n"), "prov-n", "W3C PROV-N, spec 15.3", "export"),
    "prov-o": Plugin(partial(_prov, "prov-o"), "prov-o", "W3C PROV-O in Turtle, spec 15.3", "export"),
}
FORMATS: Final = tuple(EXPORTER_FOR_FORMAT)


def export_path(
    path: Path, fmt: str, *, output: bytes | None = None, subject_name: str = DEFAULT_SUBJECT_NAME
) -> bytes:
    """``path`` in format ``fmt`` (one of :data:`FORMATS`).

    ``output`` (the exact output bytes) is checked against the leaf's signed hash when given; only
    the in-toto Statement names the output, so only it needs them. Raises ExportError (ExtraMissing
    when an optional library is absent), ValueError for an unknown format.
    """
    exporter = EXPORTER_FOR_FORMAT.get(fmt)
    if exporter is None:
        raise ValueError(unknown("export format", fmt, EXPORTER_FOR_FORMAT))
    return exporter.make(path, output, subject_name)


__all__ = [
    "DEFAULT_SUBJECT_NAME",
    "EXPORTER_FOR_FORMAT",
    "FORMATS",
    "PREDICATE_TYPE",
    "ExportError",
    "Exporter",
    "ExtraMissing",
    "dsse_bundle",
    "dsse_envelopes",
    "export_path",
    "prov_bytes",
    "prov_document",
    "statement",
    "statement_bytes",
]
