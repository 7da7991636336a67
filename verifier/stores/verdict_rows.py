"""The verdict log as relational rows, shared by the SQLite and PostgreSQL backends (issue 29).

What repeats is stored once per client identity:

* ``verdict_log``: one row per verdict, naming its path by digest (``path_digest``, 32 bytes; NULL
  when the input did not parse) and carrying the bytes it counts for (``countersign.state.verdict_bytes``);
* ``verdict_paths``: one row per (client, path digest): the construction, the records as compact
  JSON (``countersign.state.path_json``) and the bytes the path counts for;
* ``verdict_path_uses``: one row per (kind, value, client, path digest): the path's index entries
  (every key, record and deployer it relies on), so "verdicts relying on K since T" is one index
  range to the paths and one to their verdicts, and a consumer's own lookup is a narrower range.

A verdict on a path its client logged before adds one ``verdict_log`` row and nothing else.

Schema versions before this (SQLite 4-5, PostgreSQL 3-6) kept ``verdicts`` and one
``verdict_signatures`` row per signature per verdict; :func:`legacy_entries` reads them back for the
migration that moves them over.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from countersign.state import (
    CoSigner,
    RecordUse,
    VerdictEntry,
    bounded_cause,
    path_bytes,
    path_digest,
    path_json,
    path_uses,
    records_from_json,
    verdict_bytes,
)

VERDICT_COLUMNS = (
    "verdict_id, time_ms, mode, client, request_id, registry_sequence, verdict, reason, path_digest,"
    " retain_until_ms, needs_revalidation, revalidation_cause, bytes"
)
VERDICT_FIELDS = 13
PATH_COLUMNS = "client, path_digest, construction, records, bytes"
USE_COLUMNS = "kind, value, client, path_digest"
_KIND_CODE = {"key": "k", "record": "r", "deployer": "d"}


def kind_code(kind: str) -> str:
    """The one-letter kind a ``verdict_path_uses`` row carries (``key`` k, ``record`` r, ``deployer`` d)."""
    return _KIND_CODE[kind]


def verdict_row(entry: VerdictEntry) -> tuple[Any, ...]:
    """The ``verdict_log`` row of a newly recorded ``entry``, in ``VERDICT_COLUMNS`` order (unmarked)."""
    return (
        entry.verdict_id, entry.time_ms, entry.mode, entry.client, entry.request_id, entry.registry_sequence,
        entry.verdict, entry.reason, path_digest(entry.construction, entry.records), entry.retain_until_ms,
        False, "", verdict_bytes(entry),
    )  # fmt: skip


def marked_row(entry: VerdictEntry) -> tuple[Any, ...]:
    """:func:`verdict_row` keeping ``entry``'s mark (a verdict moved over by a migration)."""
    row = verdict_row(entry)
    return (*row[:10], entry.needs_revalidation, bounded_cause(entry.revalidation_cause), row[12])


def path_row(entry: VerdictEntry) -> tuple[str, bytes, str, str, int] | None:
    """The ``verdict_paths`` row of ``entry``'s path (``PATH_COLUMNS``), None when it has none."""
    digest = path_digest(entry.construction, entry.records)
    if digest is None:
        return None
    return (
        entry.client,
        digest,
        entry.construction,
        path_json(entry.records),
        path_bytes(entry.construction, entry.records),
    )


def use_rows(client: str, digest: bytes, records: Sequence[RecordUse]) -> list[tuple[str, str, str, bytes]]:
    """The ``verdict_path_uses`` rows of one stored path (``USE_COLUMNS``)."""
    return [(kind_code(kind.value), value, client, digest) for kind, value in path_uses(records)]


def entry_from_row(row: Sequence[Any], construction: str | None, records: tuple[RecordUse, ...]) -> VerdictEntry:
    """An entry from a ``verdict_log`` row (``VERDICT_COLUMNS`` order) and its path's construction
    and records (None and () for a verdict on no path)."""
    return VerdictEntry(
        verdict_id=str(row[0]),
        time_ms=int(row[1]),
        mode=str(row[2]),
        client=str(row[3]),
        request_id=str(row[4]),
        registry_sequence=int(row[5]),
        verdict=str(row[6]),
        reason=str(row[7]),
        construction=construction or "",
        records=records,
        retain_until_ms=int(row[9]),
        needs_revalidation=bool(row[10]),
        revalidation_cause=str(row[11]),
    )


class PathReader:
    """Records JSON read once per path while entries are built from a lookup's rows."""

    def __init__(self) -> None:
        self._read: dict[str, tuple[RecordUse, ...]] = {}

    def __call__(self, text: str | None) -> tuple[RecordUse, ...]:
        if text is None:
            return ()
        found = self._read.get(text)
        if found is None:
            found = self._read[text] = records_from_json(text)
        return found


def chunks(values: Sequence[Any], size: int) -> Iterable[Sequence[Any]]:
    for start in range(0, len(values), size):
        yield values[start : start + size]


# --- the schema before issue 29, read once by the migration ---------------------------------------

LEGACY_VERDICT_COLUMNS = (
    "verdict_id, time_ms, mode, client, request_id, registry_sequence, verdict, reason, construction,"
    " retain_until_ms, needs_revalidation, revalidation_cause"
)
LEGACY_SIGNATURE_COLUMNS = "verdict_id, position, role, record_digest, deployer, key_id, created_ms"
_ROLE_ORDER = {"parent": 0, "child": 1}


def legacy_entries(verdicts: Iterable[Sequence[Any]], signatures: Iterable[Sequence[Any]]) -> list[VerdictEntry]:
    """Entries from the old ``verdicts`` rows (``LEGACY_VERDICT_COLUMNS``) and the old signature rows
    of those verdicts (``LEGACY_SIGNATURE_COLUMNS``, any order), oldest first."""
    issuers: dict[tuple[str, int], RecordUse] = {}
    cosigners: dict[tuple[str, int], list[CoSigner]] = {}
    for verdict_id, position, role, digest, deployer, key_id, created_ms in signatures:
        place = (str(verdict_id), int(position))
        if role == "signer":
            issuers[place] = RecordUse(str(digest), str(deployer), str(key_id), int(created_ms))
        else:
            cosigners.setdefault(place, []).append(CoSigner(str(role), str(deployer), str(key_id)))
    records: dict[str, list[RecordUse]] = {}
    for place in sorted(issuers):
        issuer = issuers[place]
        signed = tuple(sorted(cosigners.get(place, []), key=lambda c: _ROLE_ORDER.get(c.role, 2)))
        records.setdefault(place[0], []).append(
            RecordUse(issuer.digest, issuer.deployer, issuer.key_id, issuer.created_ms, signed)
        )
    entries = [
        VerdictEntry(
            verdict_id=str(row[0]),
            time_ms=int(row[1]),
            mode=str(row[2]),
            client=str(row[3]),
            request_id=str(row[4]),
            registry_sequence=int(row[5]),
            verdict=str(row[6]),
            reason=str(row[7]),
            construction=str(row[8]),
            records=tuple(records.get(str(row[0]), ())),
            retain_until_ms=int(row[9]),
            needs_revalidation=bool(row[10]),
            revalidation_cause=str(row[11]),
        )
        for row in verdicts
    ]
    return sorted(entries, key=lambda e: (e.time_ms, e.verdict_id))
