"""The verifier's side of the verdict log: recording each verdict, marking what a revocation reached,
and answering ``Impact``. The rules (what a verdict relied on, the dependency graph, which keys a
new registry distrusts) live in ``countersign.impact``; this module stores and translates.

A verdict is answered only once it is logged: if the log cannot be written the call fails with
``STATE_UNAVAILABLE`` (retryable), in either mode and for either verdict (ADR 0015).
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Callable

import grpc
import prometheus_client

from countersign._clock import now_ms
from countersign._daemon.group_commit import GroupCommit
from countersign._daemon.tls import peer_identity
from countersign._proto.v1 import verifier_pb2
from countersign.errors import CountersignError, MalformedError, ServiceError, StateUnavailable
from countersign.impact import ImpactReport, collect_impact, distrusted_by, impact_query, key_changes, path_dependencies
from countersign.reasons import VerificationResult
from countersign.records import Path
from countersign.registry import Registry
from countersign.state import DependencyKind, VerdictEntry, VerifierStore

log = logging.getLogger("countersign.verifier")

IMPACT_LOOKUP_LIMIT = 10_000  # verdicts per Impact answer: keeps it well under the message size limit
# Who asks Impact about what (issue 29): the whole log, and marking it, is an auditor's or the
# operator's; a consumer (a client certificate) sees its own verdicts only and marks nothing.
WHOLE_LOG_ROLES = frozenset({"operator", "auditor"})
OWN_VERDICTS_ROLES = frozenset({"client"})
_QUERY_FIELDS = {
    "key_id": DependencyKind.KEY,
    "record_digest": DependencyKind.RECORD,
    "deployer": DependencyKind.DEPLOYER,
}


class VerdictLogMetrics:
    def __init__(self, registry: prometheus_client.CollectorRegistry, store: VerifierStore) -> None:
        self.marked = prometheus_client.Counter(
            "countersign_verdicts_needing_revalidation",
            "Logged verdicts this verifier flagged NEEDS_REVALIDATION, by what flagged them",
            ["trigger"],
            registry=registry,
        )
        rows = prometheus_client.Gauge("countersign_verdict_log_rows", "Verdicts held in the log", registry=registry)
        size = prometheus_client.Gauge(
            "countersign_verdict_log_bytes", "Bytes the verdict log counts against verdict_log_max_bytes",
            registry=registry,
        )  # fmt: skip
        self._store = store
        rows.set_function(self._rows)
        size.set_function(self._bytes)

    def _rows(self) -> float:
        try:
            return float(self._store.verdict_count())
        except CountersignError:
            return float("nan")

    def _bytes(self) -> float:
        try:
            return float(sum(usage.bytes for usage in self._store.verdict_usage().values()))
        except CountersignError:
            return float("nan")


class VerdictRecorder:
    """Writes one log entry per verdict, before the verdict is answered."""

    def __init__(
        self,
        store: VerifierStore,
        metrics: VerdictLogMetrics,
        errors: prometheus_client.Counter,
        registry_now: Callable[[], Registry],
        *,
        enabled: bool,
        retention_ms: int,
    ) -> None:
        self._store = store
        self._metrics = metrics
        self._errors = errors
        self._registry_now = registry_now
        self.enabled = enabled
        self._retention_ms = retention_ms
        # Concurrent verdicts share one transaction and one flush (ADR 0032): under load each verdict
        # costs a fraction of a commit instead of a commit of its own.
        self._commits: GroupCommit[VerdictEntry] = GroupCommit(store.record_verdicts)

    def record(
        self,
        path: Path | None,
        result: VerificationResult,
        mode: str,
        registry: Registry,
        context: grpc.ServicerContext,
        request_key: str,
    ) -> None:
        """Log the verdict on ``path`` (None: it did not parse) reached at ``registry``. Raises
        StateUnavailable when the log cannot be written: the caller must not answer the verdict."""
        if not self.enabled:
            return
        identity = peer_identity(context)
        time_ms = now_ms()
        entry = VerdictEntry(
            verdict_id=secrets.token_hex(16),
            time_ms=time_ms,
            mode=mode,
            client="" if identity is None else identity.uri,
            request_id=request_key,
            registry_sequence=registry.sequence,
            verdict=result.verdict.value,
            reason="" if result.reason is None else result.reason.value,
            construction="" if path is None else path.envelopes[0].record.construction.value,
            records=() if path is None else path_dependencies(path),
            retain_until_ms=time_ms + self._retention_ms,
        )
        try:
            self._commits.submit(entry)
            if entry.accepted:
                self._catch_up(entry, registry, time_ms)
        except StateUnavailable:
            self._errors.labels("STATE_UNAVAILABLE").inc()
            raise

    def _catch_up(self, entry: VerdictEntry, reached_at: Registry, time_ms: int) -> None:
        """A revocation applied while this verdict was being reached: the sweep that marks what the
        revocation reached may already have read the log, so this verdict marks itself."""
        current = self._registry_now()
        if current.sequence == reached_at.sequence:
            return
        change = distrusted_by(entry, current)
        if change is not None:
            marked = self._store.mark_needs_revalidation([entry], change.cause(current.sequence), time_ms)
            self._metrics.marked.labels(change.kind.value).inc(marked)


class Revalidator:
    """Marks the logged verdicts every newly distrusted key reached, on a thread of its own (the
    registry stream is never held up by a sweep of the log). At start it sweeps every key the
    registry distrusts, since a revocation may have arrived while no verifier was running; marking
    is idempotent, and the metric counts only verdicts not flagged before."""

    def __init__(self, store: VerifierStore, metrics: VerdictLogMetrics, registry_now: Callable[[], Registry]) -> None:
        self._store = store
        self._metrics = metrics
        self._registry_now = registry_now
        self._changed = threading.Event()
        self._stop = threading.Event()
        self._swept: Registry | None = None
        self._thread: threading.Thread | None = None

    def registry_changed(self, registry: Registry) -> None:
        """The follower's ``on_change``: called on its thread after a statement is applied."""
        self._changed.set()

    def start(self) -> None:
        self._changed.set()
        self._thread = threading.Thread(target=self._run, name="verdict-revalidation", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._changed.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        backoff = 0.1
        while not self._stop.is_set():
            self._changed.wait()
            if self._stop.is_set():
                return
            self._changed.clear()
            try:
                self.sweep()
                backoff = 0.1
            except StateUnavailable as exc:
                log.warning("marking verdicts for revalidation failed; retrying", extra={"error": str(exc)})
                self._changed.set()
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)

    def sweep(self) -> int:
        """Mark what every key distrusted since the last sweep reached; return how many were new."""
        registry = self._registry_now()
        total = 0
        for change in key_changes(self._swept, registry):
            report = collect_impact(self._store, change.query)
            cause = change.cause(registry.sequence)
            marked = self._store.mark_needs_revalidation([v.entry for v in report.verdicts], cause, now_ms())
            self._metrics.marked.labels(change.kind.value).inc(marked)
            total += marked
            if marked or report.truncated:
                log.info(
                    "verdicts marked for revalidation",
                    extra={"cause": cause, "marked": marked, "affected": len(report.verdicts),
                           "records": len(report.records), "truncated": report.truncated},
                )  # fmt: skip
        self._swept = registry
        return total


def answer_impact(
    request: verifier_pb2.ImpactRequest,
    context: grpc.ServicerContext,
    store: VerifierStore,
    metrics: VerdictLogMetrics,
    *,
    require_identity: bool,
) -> verifier_pb2.ImpactResponse:
    """The ``Impact`` RPC. An operator or auditor certificate queries and marks the whole log; a client
    certificate queries the verdicts it was answered itself (the graph, and so the records reported,
    built from those alone) and may not mark; any other is refused (``NOT_AUTHORISED``). Plaintext on
    loopback has no identity and is treated as the whole log's reader (a development mesh)."""
    identity = peer_identity(context)
    whole_log = not require_identity and identity is None
    if identity is not None and identity.role in WHOLE_LOG_ROLES:
        whole_log = True
    elif not whole_log and (identity is None or identity.role not in OWN_VERDICTS_ROLES):
        raise ServiceError("NOT_AUTHORISED", "Impact is for auditor, operator and client certificates")
    if request.mark and not whole_log:
        raise ServiceError("NOT_AUTHORISED", "marking the verdict log is for auditor and operator certificates")
    field = request.WhichOneof("query")
    if field is None:
        raise ServiceError("INVALID_ARGUMENT", "give key_id, record_digest or deployer")
    try:
        query = impact_query(_QUERY_FIELDS[field], getattr(request, field), request.since_ms)
    except MalformedError as exc:
        raise ServiceError("INVALID_ARGUMENT", str(exc)) from None
    own = None if whole_log or identity is None else identity.uri
    report = collect_impact(store, query, limit=IMPACT_LOOKUP_LIMIT, client=own)
    newly = 0
    if request.mark:
        who = "plaintext" if identity is None else identity.uri
        cause = f"impact query {query.kind.value} {query.value} by {who}"
        newly = store.mark_needs_revalidation([v.entry for v in report.verdicts], cause, now_ms())
        metrics.marked.labels("impact").inc(newly)
    return impact_response(report, newly, marked=request.mark)


def impact_response(report: ImpactReport, newly_marked: int, *, marked: bool) -> verifier_pb2.ImpactResponse:
    status = verifier_pb2.NEEDS_REVALIDATION
    return verifier_pb2.ImpactResponse(
        records=[
            verifier_pb2.ImpactRecord(
                digest=r.digest, status=status, depends_on=r.depends_on, seed=r.seed, deployer=r.deployer,
                key_id=r.key_id,
            )
            for r in report.records
        ],
        verdicts=[
            verifier_pb2.ImpactVerdict(
                verdict_id=v.verdict_id, request_id=v.request_id, time_ms=v.time_ms, result=v.result,
                records=v.records, status=status, mode=v.mode, client=v.client,
                registry_sequence=v.registry_sequence, path=v.path, marked_in_log=v.marked_in_log or marked,
                cause=v.cause,
            )
            for v in (affected.logged() for affected in report.verdicts)
        ],
        truncated=report.truncated,
        newly_marked=newly_marked,
    )  # fmt: skip
