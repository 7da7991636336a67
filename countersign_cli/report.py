"""``countersign report``: one self-contained HTML page of a path for people (docs/audit.md).

The page draws the delegation path as inline SVG (one box per record: deployer, agent instance,
depth, edge kind, co-signers, whether each signature verifies), states the verdict with the offending
record highlighted, lists session receipts in order and colours what an impact file says needs
revalidation. No network, no script, no external file: a Content-Security-Policy forbids all three.

Everything shown comes from evidence, which may be hostile: every string goes through
:func:`html.escape` exactly once, at the point it is written into the page. A path that does not
parse is still drawn from whatever JSON it holds, so the page shows what was rejected.
"""

from __future__ import annotations

import argparse
import html
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path as FilePath
from typing import Any, Final

from countersign._clock import now_ms
from countersign.constructions import parent_link
from countersign.errors import MalformedError
from countersign.export.marks import SignatureMark, SignatureRole, signature_marks
from countersign.reasons import VerificationResult
from countersign.records import MAX_INPUT_BYTES, Envelope, Path, parse_json
from countersign.registry import Registry
from countersign_cli.common import (
    EXIT_OK,
    EXIT_REJECTED,
    MAX_OUTPUT_BYTES,
    Commands,
    UsageError,
    add_registry_arguments,
    iso,
    optional_registry,
    read_bytes,
    verification_time,
)

NEEDS_REVALIDATION: Final = "NEEDS_REVALIDATION"
MAX_SESSION_FILES: Final = 4096
MAX_IMPACT_BYTES: Final = 64 << 20

BOX_WIDTH: Final = 820
LINE_HEIGHT: Final = 18
GAP: Final = 46
MARGIN: Final = 20
MAX_SHOWN: Final = 72
"""Characters of one value drawn inside a box; the full value is in the box's tooltip and the table."""


def register(commands: Commands) -> None:
    report = commands.add_parser("report", help="write one self-contained HTML page of a path (SVG, no network)")
    report.add_argument("--path", required=True, help="path.json")
    report.add_argument("--output", help="the exact output bytes, so the verdict covers them")
    report.add_argument(
        "--session",
        help="a session's receipts, listed in order of seq: a directory of receipt envelopes (as sample-session "
        "writes them and verify-session reads them, each under a record of --path) or of receipt paths (as a "
        "signer returns them); sample-session's output directory names its receipts/",
    )
    report.add_argument("--impact", help="an impact JSON file (countersign impact): colours what needs revalidation")
    report.add_argument("--html", required=True, help="the page to write")
    add_registry_arguments(report)
    report.set_defaults(handler=cmd_report)


# --- the model of the page ----------------------------------------------------------------------


@dataclass
class RecordView:
    """One record as drawn: strings only, so a record that failed to parse draws the same way."""

    index: int
    digest: str
    deployer: str
    instance: str
    system: str
    depth: str
    construction: str
    key_id: str
    event: str
    created_ms: str
    expires_ms: str
    edge: str
    cosigners: list[str] = field(default_factory=list)
    output: str = ""
    marks: list[SignatureMark] = field(default_factory=list)


@dataclass
class ReceiptView:
    file: str
    session: str
    seq: int | None
    prev: str
    sha256: str
    digest: str
    deployer: str
    instance: str
    chain: str
    verdict: str


@dataclass
class ImpactView:
    query: str
    records: dict[str, str]
    depends_on: dict[str, list[str]]
    verdicts: list[dict[str, str]]


@dataclass
class ReportModel:
    title: str
    summary: list[tuple[str, str]]
    records: list[RecordView]
    verdict: VerificationResult | None
    verdict_scope: str
    receipts: list[ReceiptView] | None = None
    impact: ImpactView | None = None


def _text(value: object) -> str:
    """Any JSON value from evidence as display text (a malformed path may hold anything)."""
    if isinstance(value, str):
        return value
    if value is None:
        return "—"
    return repr(value) if not isinstance(value, dict | list) else "(object)"


def _edge(parent: dict[str, Any] | None, record: dict[str, Any]) -> tuple[str, list[str]]:
    cosigs = record.get("cosigs")
    cosigners = []
    if isinstance(cosigs, list):
        for cosig in cosigs:
            if isinstance(cosig, dict):
                cosigners.append(
                    f"{_text(cosig.get('role'))} {_text(cosig.get('deployer'))} ({_text(cosig.get('key_id'))})"
                )
    if parent is None:
        return "root", cosigners
    if parent.get("deployer") == record.get("deployer"):
        return "same-deployer edge (local signature only)", cosigners
    return ("cross-deployer edge, co-signed" if cosigners else "cross-deployer edge, not co-signed"), cosigners


def record_views(value: object, digests: Sequence[str] = ()) -> list[RecordView]:
    """Records drawn from a path's JSON, valid or not. ``digests`` are envelope digests when it parsed."""
    envelopes = value.get("envelopes") if isinstance(value, dict) else None
    if not isinstance(envelopes, list):
        return []
    views = []
    parent: dict[str, Any] | None = None
    for index, envelope in enumerate(envelopes[:256]):
        record = envelope.get("record") if isinstance(envelope, dict) else None
        if not isinstance(record, dict):
            record = {}
        agent_value = record.get("agent")
        agent: dict[str, Any] = agent_value if isinstance(agent_value, dict) else {}
        output = record.get("output")
        edge, cosigners = _edge(parent, record)
        views.append(
            RecordView(
                index=index,
                digest=digests[index] if index < len(digests) else "",
                deployer=_text(record.get("deployer")),
                instance=_text(agent.get("instance")),
                system=_text(agent.get("system")),
                depth=_text(record.get("depth")),
                construction=_text(record.get("construction")),
                key_id=_text(record.get("key_id")),
                event=_text(record.get("event")),
                created_ms=_text(record.get("created_ms")),
                expires_ms=_text(record.get("expires_ms")),
                edge=edge,
                cosigners=cosigners,
                output=(
                    f"output {_text(output.get('sha256'))} · session {_text(output.get('session'))} · "
                    f"seq {_text(output.get('seq'))}"
                    if isinstance(output, dict)
                    else ""
                ),
            )
        )
        parent = record
    return views


def session_receipts(
    directory: FilePath, registry: Registry | None, now_ms: int, path: Path | None = None
) -> list[ReceiptView]:
    """Every receipt file in ``directory``, ordered by session then ``seq``, each link checked.

    A file holds a receipt envelope (as ``sample-session`` writes it and ``verify-session`` reads it)
    whose path is the prefix of ``path`` it was issued under followed by it, or a whole receipt path
    (as a signer returns it). Sample-session's output directory stands for its ``receipts/``. A
    receipt chains when its ``prev`` names the previous receipt's record (its envelope digest) and its
    ``seq`` follows on. Raises UsageError when the directory cannot be read.
    """
    from countersign.verify import verify_structure

    if (directory / "receipts").is_dir() and (directory / "agent.json").is_file():
        directory = directory / "receipts"  # the layout sample-session writes
    try:
        files = sorted(p for p in directory.iterdir() if p.is_file())
    except OSError as exc:
        raise UsageError(f"cannot read the session directory {directory}: {exc.strerror}") from None
    if len(files) > MAX_SESSION_FILES:
        raise UsageError(f"{directory} holds more than {MAX_SESSION_FILES} files")
    prefixes = _prefixes_by_link(path)
    receipts: list[ReceiptView] = []
    for file in files:
        try:
            with open(file, "rb") as handle:
                data = handle.read(MAX_INPUT_BYTES + 1)
        except OSError as exc:
            receipts.append(_unreadable(file.name, f"cannot read it: {exc.strerror}"))
            continue
        found = _receipt_path(data, prefixes)
        if isinstance(found, str):
            receipts.append(_unreadable(file.name, found))
            continue
        leaf = found.leaf.record
        if leaf.output is None:
            receipts.append(ReceiptView(file.name, "", None, "", "", "", leaf.deployer, leaf.agent.instance, "",
                                        "the leaf carries no output receipt"))  # fmt: skip
            continue
        if registry is None:
            verdict = "not verified (no registry given)"
        else:
            result = verify_structure(found, registry=registry, now_ms=now_ms)
            verdict = "ACCEPT (output bytes not checked)" if result else f"REJECT {result.reason} {_where(result)}"
        out = leaf.output
        receipts.append(
            ReceiptView(file.name, out.session, out.seq, out.prev or "—", out.sha256, found.leaf.digest(),
                        leaf.deployer, leaf.agent.instance, "", verdict)
        )  # fmt: skip
    receipts.sort(key=lambda r: (r.seq is None, r.session, -1 if r.seq is None else r.seq, r.file))
    previous: ReceiptView | None = None
    for receipt in receipts:
        if receipt.seq is None:
            continue
        if receipt.seq == 0:
            receipt.chain = "first of the session"
        elif previous is None or previous.session != receipt.session:
            receipt.chain = f"earlier receipts of the session are missing (seq {receipt.seq})"
        elif previous.seq == receipt.seq:
            receipt.chain = f"seq {receipt.seq} appears twice"
        elif receipt.prev != previous.digest or receipt.seq != (previous.seq or 0) + 1:
            receipt.chain = f"does not follow seq {previous.seq}: a receipt is missing or out of place"
        else:
            receipt.chain = f"follows seq {previous.seq}"
        previous = receipt
    return receipts


def _unreadable(name: str, why: str) -> ReceiptView:
    return ReceiptView(name, "", None, "", "", "", "", "", "", why)


def _prefixes_by_link(path: Path | None) -> dict[str | None, tuple[Envelope, ...]]:
    """Each prefix of ``path`` by the parent link a record issued under its last record carries
    (the longest prefix wins: a record's link names one prefix only, unless digests collide)."""
    if path is None:
        return {}
    construction = path.envelopes[0].record.construction
    return {parent_link(construction, path.envelopes[:n]): path.envelopes[:n] for n in range(1, len(path) + 1)}


def _receipt_path(data: bytes, prefixes: dict[str | None, tuple[Envelope, ...]]) -> Path | str:
    """The receipt path a file holds (a whole path, or an envelope joined to the prefix of --path it
    names as its parent), or why there is none."""
    try:
        return Path.from_bytes(data)
    except MalformedError as exc:
        as_path = exc
    try:
        value = parse_json(data)
    except MalformedError:
        return f"not a valid path or receipt envelope: {as_path}"
    if not (isinstance(value, dict) and "record" in value):
        return f"not a valid path or receipt envelope: {as_path}"
    try:
        envelope = Envelope.from_json(value)
    except MalformedError as exc:
        return f"not a valid receipt envelope: {exc}"
    prefix = prefixes.get(envelope.record.parent)
    if prefix is None:
        return "a receipt envelope issued under no record of --path (give --path the agent path it was issued under)"
    try:
        return Path((*prefix, envelope))
    except MalformedError as exc:
        return f"not a valid receipt path: {exc}"


def impact_view(data: bytes, source: str) -> ImpactView:
    """The impact file's records and verdicts (shape of ``countersign impact``). Raises UsageError."""
    try:
        value = parse_json(data, MAX_IMPACT_BYTES)
    except MalformedError as exc:
        raise UsageError(f"{source} is not JSON: {exc}") from None
    if not isinstance(value, dict) or not all(isinstance(value.get(k), list) for k in ("records", "verdicts")):
        raise UsageError(f"{source}: an impact file is an object with 'records' and 'verdicts' lists")
    records: dict[str, str] = {}
    depends: dict[str, list[str]] = {}
    for item in value["records"]:
        if not isinstance(item, dict) or not isinstance(item.get("digest"), str):
            raise UsageError(f"{source}: each record needs a 'digest'")
        records[item["digest"]] = _text(item.get("status"))
        deps = item.get("depends_on", [])
        depends[item["digest"]] = [_text(d) for d in deps] if isinstance(deps, list) else []
    verdicts = []
    for item in value["verdicts"]:
        if not isinstance(item, dict):
            raise UsageError(f"{source}: each verdict must be an object")
        used = item.get("records", [])
        verdicts.append(
            {
                "verdict_id": _text(item.get("verdict_id")),
                "request_id": _text(item.get("request_id")),
                "time_ms": _text(item.get("time_ms")),
                "result": _text(item.get("result")),
                "status": _text(item.get("status")),
                "records": " ".join(_text(d) for d in used) if isinstance(used, list) else "",
            }
        )
    query = value.get("query")
    shown = ", ".join(f"{k}={_text(v)}" for k, v in query.items()) if isinstance(query, dict) else _text(query)
    return ImpactView(shown, records, depends, verdicts)


# --- rendering ------------------------------------------------------------------------------------


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def _short(value: str) -> str:
    return value if len(value) <= MAX_SHOWN else value[: MAX_SHOWN - 1] + "…"


def _mark_text(mark: SignatureMark) -> str:
    what = "signature" if mark.role is SignatureRole.PRIMARY else f"{mark.role} co-signature"
    if mark.verified:
        return f"✓ {what} by {mark.deployer} verified"
    return f"✗ {what} by {mark.deployer} NOT verified: {mark.problem}"


def _box_lines(view: RecordView) -> list[tuple[str, str]]:
    """(css class, text) per line of a record's box; texts unescaped."""
    lines = [
        ("head", f"[{view.index}] {_short(view.deployer)} · {_short(view.instance)}"),
        ("", f"depth {view.depth} · {view.construction} · {view.event} · key {view.key_id}"),
        ("", view.edge),
    ]
    lines.extend(("", "  co-signer: " + _short(c)) for c in view.cosigners)
    if view.output:
        lines.append(("", _short(view.output)))
    lines.extend(("ok" if m.verified else "bad", _short(_mark_text(m))) for m in view.marks)
    return lines


def render_svg(model: ReportModel) -> str:
    offending = None if model.verdict is None or model.verdict else model.verdict.index
    impact = model.impact.records if model.impact else {}
    parts: list[str] = []
    y = MARGIN
    for view in model.records:
        lines = _box_lines(view)
        height = 16 + LINE_HEIGHT * len(lines)
        classes = ["record"]
        if view.index == offending:
            classes.append("offending")
        if impact.get(view.digest) == NEEDS_REVALIDATION:
            classes.append("needs-revalidation")
        if view.index > 0:
            top = y - GAP
            parts.append(
                f'<g class="edge"><line x1="{MARGIN + 40}" y1="{top}" x2="{MARGIN + 40}" y2="{y - 4}" '
                f'marker-end="url(#arrow)"/><text x="{MARGIN + 52}" y="{top + GAP // 2 + 5}">'
                f"{esc(_short(view.edge))}</text></g>"
            )
        tip = f"record {view.index}: {view.deployer} / {view.instance}\n{view.digest}"
        parts.append(
            f'<g class="{" ".join(classes)}" id="record-{view.index}" data-index="{view.index}" '
            f'data-digest="{esc(view.digest)}"><title>{esc(tip)}</title>'
            f'<rect x="{MARGIN}" y="{y}" width="{BOX_WIDTH}" height="{height}" rx="8"/>'
        )
        for number, (css, text) in enumerate(lines):
            attribute = f' class="{css}"' if css else ""
            parts.append(f'<text x="{MARGIN + 12}" y="{y + 22 + LINE_HEIGHT * number}"{attribute}>{esc(text)}</text>')
        if view.index == offending and model.verdict is not None:
            parts.append(
                f'<text class="flag" x="{MARGIN + BOX_WIDTH - 12}" y="{y + 22}" text-anchor="end">'
                f"✗ {esc(model.verdict.reason)} here</text>"
            )
        parts.append("</g>")
        y += height + GAP
    total = max(y - GAP + MARGIN, 2 * MARGIN)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="dag" width="{BOX_WIDTH + 2 * MARGIN}" height="{total}" '
        f'viewBox="0 0 {BOX_WIDTH + 2 * MARGIN} {total}" role="img" aria-label="the delegation path, root first">'
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
        'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z"/></marker></defs>' + "".join(parts) + "</svg>"
    )


def _table(headers: Iterable[str], rows: Iterable[tuple[str, Iterable[object]]]) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join(
        f'<tr class="{esc(css)}">' + "".join(f"<td>{esc(c)}</td>" for c in cells) + "</tr>" for css, cells in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _verdict_html(model: ReportModel) -> str:
    verdict = model.verdict
    if verdict is None:
        return (
            '<section class="verdict unverified" id="verdict"><h2>Verdict</h2><p><strong>Not verified</strong>: '
            "no registry was given (--registry, or --registry-log with --operator). The drawing below shows "
            "what the path claims; nothing in it was checked.</p></section>"
        )
    flagged = revalidation_note(model)
    note = "" if flagged is None else f'<p class="revalidation">⚠ {esc(flagged)}</p>'
    if verdict:
        css = "verdict accept" + ("" if flagged is None else " needs-revalidation")
        return (
            f'<section class="{css}" id="verdict"><h2>Verdict</h2><p><strong>ACCEPT</strong> — '
            f"{esc(model.verdict_scope)}</p>{note}</section>"
        )
    return (
        f'<section class="verdict reject" id="verdict"><h2>Verdict</h2><p><strong>REJECT '
        f'<span class="reason">{esc(verdict.reason)}</span></strong> {esc(_where(verdict))} — '
        f'{esc(model.verdict_scope)}</p><p class="detail">{esc(verdict.detail)}</p>{note}</section>'
    )


def _where(verdict: VerificationResult) -> str:
    return "(the path as a whole)" if verdict.index is None else f"at record {verdict.index}"


def flagged_records(model: ReportModel) -> list[int]:
    """The records of the path that the impact file says need revalidation."""
    impact = model.impact.records if model.impact else {}
    return [view.index for view in model.records if impact.get(view.digest) == NEEDS_REVALIDATION]


def revalidation_note(model: ReportModel) -> str | None:
    """What the verdict must not hide: records of this path that need revalidation (an accept no
    longer stands alone), or None."""
    flagged = flagged_records(model)
    if not flagged:
        return None
    query = model.impact.query if model.impact else ""
    shown = ", ".join(map(str, flagged))
    return (
        f"{len(flagged)} record(s) of this path need revalidation ({shown}; impact of {query}): "
        "the verdict was reached with what the impact query names, re-verify before relying on it"
    )


STYLE: Final = """
body { font: 14px/1.4 "DejaVu Sans", sans-serif; margin: 24px; color: #1d232b; background: #fafbfc; }
h1 { font-size: 22px; margin: 0 0 8px; } h2 { font-size: 17px; margin: 22px 0 8px; }
dl.summary { display: grid; grid-template-columns: max-content 1fr; gap: 2px 14px; margin: 0; }
dl.summary dt { color: #5a6572; } dl.summary dd { margin: 0; font-family: "DejaVu Sans Mono", monospace; }
.verdict { border-radius: 8px; padding: 4px 16px; border: 2px solid; }
.verdict.accept { background: #e8f6ec; border-color: #2f8a4a; }
.verdict.accept.needs-revalidation { background: #fff4d6; border-color: #c98a00; }
.verdict .revalidation { font-weight: bold; color: #7a5200; }
.verdict.reject { background: #fdecec; border-color: #c0362c; }
.verdict.unverified { background: #f1f2f4; border-color: #8a94a0; }
svg.dag { display: block; font: 12.5px "DejaVu Sans Mono", monospace; }
svg.dag .record rect { fill: #ffffff; stroke: #5a6572; stroke-width: 1.5; }
svg.dag .record.needs-revalidation rect { fill: #fff4d6; stroke: #c98a00; stroke-width: 2.5; }
svg.dag .record.offending rect { fill: #fdecec; stroke: #c0362c; stroke-width: 3.5; }
svg.dag text.head { font-weight: bold; } svg.dag text.ok { fill: #2f7a44; } svg.dag text.bad { fill: #b0281f; }
svg.dag text.flag { fill: #b0281f; font-weight: bold; }
svg.dag .edge line { stroke: #5a6572; stroke-width: 1.5; } svg.dag .edge text { fill: #5a6572; }
svg.dag marker path { fill: #5a6572; }
table { border-collapse: collapse; margin: 6px 0 12px; font-size: 12.5px; }
th, td { border: 1px solid #d5dae0; padding: 3px 8px; text-align: left; vertical-align: top; overflow-wrap: anywhere; }
th { background: #eef1f4; white-space: nowrap; }
tr.needs-revalidation td { background: #fff4d6; } tr.offending td { background: #fdecec; }
tr.chain-break td { background: #fdecec; }
.legend span { display: inline-block; padding: 0 8px; margin-right: 8px; border-radius: 4px; border: 1px solid; }
.legend .l-off { background: #fdecec; border-color: #c0362c; }
.legend .l-imp { background: #fff4d6; border-color: #c98a00; }
footer { margin-top: 28px; color: #5a6572; font-size: 12px; }
"""


def _records_html(model: ReportModel) -> str:
    offending = None if model.verdict is None or model.verdict else model.verdict.index
    impact = model.impact.records if model.impact else {}
    rows = []
    for view in model.records:
        css = ["record-row"]
        if view.index == offending:
            css.append("offending")
        if impact.get(view.digest) == NEEDS_REVALIDATION:
            css.append("needs-revalidation")
        cells = (
            view.index,
            view.deployer,
            view.instance,
            view.depth,
            view.edge,
            ", ".join(view.cosigners) or "—",
            "; ".join(_mark_text(m) for m in view.marks) or "not checked",
            view.digest or "—",
            impact.get(view.digest, "—"),
        )
        rows.append((" ".join(css), cells))
    headers = ("#", "deployer", "agent instance", "depth", "edge", "co-signers", "signatures", "digest", "impact")
    return "<h2>Records</h2>" + _table(headers, rows)


def _session_html(receipts: list[ReceiptView]) -> str:
    rows = []
    for r in receipts:
        broken = r.chain and not r.chain.startswith(("follows", "first"))
        cells = (
            "—" if r.seq is None else r.seq,
            r.session or "—",
            r.file,
            r.deployer or "—",
            r.instance or "—",
            r.sha256 or "—",
            r.prev or "—",
            r.chain or "—",
            r.verdict,
        )
        rows.append(("receipt chain-break" if broken else "receipt", cells))
    headers = ("seq", "session", "file", "deployer", "agent instance", "output", "prev", "chain", "verdict")
    empty = "" if receipts else "<p>The directory holds no receipt files.</p>"
    return f'<section id="session"><h2>Session receipts, in order</h2>{empty}{_table(headers, rows)}</section>'


def _impact_html(impact: ImpactView, on_path: set[str]) -> str:
    records = [
        (
            "impact-record needs-revalidation" if status == NEEDS_REVALIDATION else "impact-record",
            (digest, status, " ".join(impact.depends_on.get(digest, [])) or "—", "yes" if digest in on_path else "no"),
        )
        for digest, status in impact.records.items()
    ]
    verdicts = [
        (
            "impact-verdict needs-revalidation" if v["status"] == NEEDS_REVALIDATION else "impact-verdict",
            (v["verdict_id"], v["request_id"], v["time_ms"], v["result"], v["status"], v["records"]),
        )
        for v in impact.verdicts
    ]
    flagged_records = sum(1 for s in impact.records.values() if s == NEEDS_REVALIDATION)
    flagged_verdicts = sum(1 for v in impact.verdicts if v["status"] == NEEDS_REVALIDATION)
    return (
        f'<section id="impact"><h2>Revocation impact</h2><p>Query: <code>{esc(impact.query)}</code>. '
        f"{flagged_records} records and {flagged_verdicts} verdicts need revalidation; nothing was deleted.</p>"
        + _table(("record digest", "status", "depends on", "on this path"), records)
        + _table(("verdict", "request", "time_ms", "result", "status", "records relied on"), verdicts)
        + "</section>"
    )


def render_report(model: ReportModel) -> str:
    """The whole page. Every string from evidence is escaped here; nothing is fetched or run."""
    summary = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in model.summary)
    sections = [
        f"<h1>{esc(model.title)}</h1>",
        f'<dl class="summary">{summary}</dl>',
        _verdict_html(model),
        "<h2>Delegation path</h2>",
        '<p class="legend">Root first; each arrow is a delegation edge. <span class="l-off">offending record</span>'
        '<span class="l-imp">needs revalidation</span></p>',
        render_svg(model),
        _records_html(model),
    ]
    if model.receipts is not None:
        sections.append(_session_html(model.receipts))
    if model.impact is not None:
        sections.append(_impact_html(model.impact, {v.digest for v in model.records}))
    sections.append(
        "<footer>Made by <code>countersign report</code>. The page itself checks nothing: the verdict and the "
        "signature marks are what the command computed when it wrote the page.</footer>"
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">"
        f"<title>{esc(model.title)}</title><style>{STYLE}</style></head><body>"
        + "\n".join(sections)
        + "</body></html>\n"
    )


# --- the command ----------------------------------------------------------------------------------


def build_model(args: argparse.Namespace) -> ReportModel:
    """Read the inputs, verify when a registry is given, and assemble the page's model."""
    from countersign.state import InMemoryState
    from countersign.verify import Mode, malformed_result, verify_path, verify_structure

    data = read_bytes(args.path, "path", MAX_INPUT_BYTES, oversize_is_usage_error=False)
    output = None if args.output is None else read_bytes(args.output, "output", MAX_OUTPUT_BYTES)
    registry = optional_registry(args)
    verdict: VerificationResult | None = None
    path: Path | None = None
    try:
        path = Path.from_bytes(data)
        records = record_views(path.to_json(), [e.digest() for e in path.envelopes])
    except MalformedError as exc:
        verdict = malformed_result(exc)  # a verdict that needs no registry
        try:
            raw: object = parse_json(data)
        except MalformedError:
            raw = None
        records = record_views(raw)
    at = verification_time(args, path) if path is not None else (now_ms() if args.now_ms is None else args.now_ms)
    scope = f"checked as of {iso(at)} in audit mode (nothing consumed)"
    if path is not None and registry is not None:
        for view, mark in ((records[m.index], m) for m in signature_marks(path, registry)):
            view.marks.append(mark)
        if output is not None:
            verdict = verify_path(path, output, registry=registry, state=InMemoryState(), mode=Mode.AUDIT, now_ms=at)
            scope = "the path for the output bytes, " + scope
        else:
            verdict = verify_structure(path, registry=registry, now_ms=at)
            scope = "the path; the output bytes were not given, so not checked; " + scope
    elif verdict is not None:
        scope = "the file is not a valid path (drawn from what it holds)"
    summary = [("path file", args.path)]
    if path is not None:
        root = path.envelopes[0].record
        summary += [
            ("construction", root.construction.value),
            ("records", str(len(path))),
            ("agent system", root.agent.system),
            ("deployers", ", ".join(dict.fromkeys(e.record.deployer for e in path.envelopes))),
        ]
        if path.leaf.record.output is not None:
            summary.append(("leaf output", path.leaf.record.output.sha256))
    if registry is not None:
        summary.append(("registry sequence", str(registry.sequence)))
    model = ReportModel("Countersign evidence report", summary, records, verdict, scope)
    if args.session:
        model.receipts = session_receipts(FilePath(args.session), registry, at, path)
    if args.impact:
        model.impact = impact_view(read_bytes(args.impact, "impact file", MAX_IMPACT_BYTES), args.impact)
    return model


def cmd_report(args: argparse.Namespace) -> int:
    model = build_model(args)
    page = render_report(model).encode("utf-8")
    try:
        FilePath(args.html).write_bytes(page)
    except OSError as exc:
        raise UsageError(f"cannot write {args.html}: {exc.strerror}") from None
    flagged = flagged_records(model)
    needs = f"; {len(flagged)} record(s) of the path need revalidation" if flagged else ""
    print(f"wrote {args.html}: {len(model.records)} records, verdict {_verdict_word(model.verdict)}{needs}")
    return EXIT_OK if model.verdict is None or model.verdict else EXIT_REJECTED


def _verdict_word(verdict: VerificationResult | None) -> str:
    if verdict is None:
        return "not verified (no registry)"
    return "ACCEPT" if verdict else f"REJECT {verdict.reason} {_where(verdict)}"
