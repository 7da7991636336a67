"""The verdict log as relational rows, shared by the SQLite and PostgreSQL backends.

``verdicts`` holds one row per verdict; ``verdict_signatures`` one row per signature its records
carry: role ``signer`` for the record's issuer, ``parent`` / ``child`` for an edge's co-signers. Each
signature row repeats the record's digest and creation time and the verdict's time, so a lookup by
key id, record digest or deployer since a time reads one index range.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from countersign.state import CoSigner, DependencyKind, RecordUse, VerdictEntry

VERDICT_COLUMNS = (
    "verdict_id, time_ms, mode, client, request_id, registry_sequence, verdict, reason, construction,"
    " retain_until_ms, needs_revalidation, revalidation_cause"
)
SIGNATURE_COLUMNS = "verdict_id, position, role, record_digest, deployer, key_id, created_ms, time_ms"
LOOKUP_COLUMN = {
    DependencyKind.KEY: "key_id",
    DependencyKind.RECORD: "record_digest",
    DependencyKind.DEPLOYER: "deployer",
}
_ROLE_ORDER = {"parent": 0, "child": 1}


def signature_rows(entry: VerdictEntry) -> list[tuple[str, int, str, str, str, str, int, int]]:
    """The ``verdict_signatures`` rows of ``entry``, in ``SIGNATURE_COLUMNS`` order."""
    return [
        (entry.verdict_id, position, role, record.digest, deployer, key_id, record.created_ms, entry.time_ms)
        for position, record in enumerate(entry.records)
        for role, deployer, key_id in record.signatures()
    ]


def verdict_row(entry: VerdictEntry) -> tuple[Any, ...]:
    """The ``verdicts`` row of a newly recorded ``entry``, in ``VERDICT_COLUMNS`` order (unmarked)."""
    return (
        entry.verdict_id, entry.time_ms, entry.mode, entry.client, entry.request_id, entry.registry_sequence,
        entry.verdict, entry.reason, entry.construction, entry.retain_until_ms, False, "",
    )  # fmt: skip


def entries_from_rows(verdicts: Iterable[Sequence[Any]], signatures: Iterable[Sequence[Any]]) -> list[VerdictEntry]:
    """Entries from ``verdicts`` rows (``VERDICT_COLUMNS``) and the signature rows of those verdicts
    (``SIGNATURE_COLUMNS`` without ``time_ms``, any order), oldest first."""
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


def chunks(values: Sequence[str], size: int) -> Iterable[Sequence[str]]:
    for start in range(0, len(values), size):
        yield values[start : start + size]
