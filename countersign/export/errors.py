"""Why a path cannot be exported in a format."""

from __future__ import annotations

from countersign.errors import CountersignError


class ExportError(CountersignError):
    """The path cannot be mapped to the requested format (e.g. an unsigned baseline as DSSE)."""


class ExtraMissing(ExportError):
    """An optional library the format needs is not installed; the message names the extra."""
