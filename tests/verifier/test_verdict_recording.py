"""The verifier service records every verdict before answering it, in process (no sockets): what an
entry holds, that a failed log write is STATE_UNAVAILABLE and never an answer, the race with a
revocation, the revocation sweep, and who may ask for an impact."""

from __future__ import annotations

import inspect
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import grpc
import prometheus_client
import pytest
from google.rpc import error_details_pb2, status_pb2

from countersign._daemon.edge import Aborted
from countersign._proto.v1 import verifier_pb2
from countersign.errors import StateUnavailable
from countersign.impact import path_dependencies
from countersign.records import Construction, Path
from countersign.registry import Registry
from countersign.samples import SampleMesh
from countersign.state import DependencyKind, InMemoryState, VerdictEntry
from countersign.verify import DEFAULT_POLICY
from verifier.daemon import VerifierMetrics, VerifierService
from verifier.verdict_log import Revalidator, VerdictLogMetrics, VerdictRecorder

pytestmark = pytest.mark.offline

DEPLOYERS = ("deployer-a", "deployer-b")
MESH = SampleMesh.create(DEPLOYERS, seed=b"recording")
OUTPUT = b"the output\n"


class Follower:
    """The registry follower as the service sees it: a view, fresh; ``views`` are handed out in turn."""

    staleness_ms = 30_000

    def __init__(self, *views: Registry) -> None:
        self.views = list(views)

    def view(self) -> tuple[Registry, bool]:
        return (self.views.pop(0) if len(self.views) > 1 else self.views[0]), True

    def register_gauges(self, registry: prometheus_client.CollectorRegistry) -> None:
        return None


class Context:
    """A plaintext caller (no certificate); remembers the status a call was ended with."""

    def __init__(self) -> None:
        self.status: Any = None

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    def abort_with_status(self, status: Any) -> None:
        self.status = status
        raise Exception("aborted")  # as gRPC does: a bare exception unwinds the handler


def error_code(status: Any) -> str:
    (details,) = [v for k, v in status.trailing_metadata if k == "grpc-status-details-bin"]
    info = error_details_pb2.ErrorInfo()
    status_pb2.Status.FromString(details).details[0].Unpack(info)
    return str(info.reason)


class FailingLog(InMemoryState):
    def record_verdicts(self, entries: Sequence[VerdictEntry]) -> None:
        raise StateUnavailable("the verdict log is down")


def registry(sequence: int, *, revoke: str = "") -> Registry:
    deployers = {
        deployer: {k: replace(e, revoked_ms=1) if k == revoke else e for k, e in keys.items()}
        for deployer, keys in MESH.registry.deployers.items()
    }
    return Registry(deployers, sequence)


def service(
    store: InMemoryState, follower: Follower, *, recording: bool = True, require_identity: bool = True
) -> tuple[VerifierService, prometheus_client.CollectorRegistry, Revalidator]:
    """The service as VerifierDaemon wires it, over ``store``; with the metrics it exports."""
    metrics_registry = prometheus_client.CollectorRegistry()
    metrics = VerifierMetrics(metrics_registry, follower)  # type: ignore[arg-type]
    log_metrics = VerdictLogMetrics(metrics_registry, store)
    recorder = VerdictRecorder(
        store, log_metrics, metrics.errors, lambda: follower.view()[0], enabled=recording, retention_ms=60_000
    )
    made = VerifierService(
        state=store, follower=follower, policy=DEFAULT_POLICY, metrics=metrics,  # type: ignore[arg-type]
        verdicts=recorder, verdict_log_metrics=log_metrics, require_identity=require_identity,
    )  # fmt: skip
    return made, metrics_registry, Revalidator(store, log_metrics, lambda: follower.view()[0])


def fresh_path() -> Path:
    return MESH.issue_path(Construction.SIGNED_DAG, list(DEPLOYERS), OUTPUT, now_ms=time.time_ns() // 1_000_000)


def request(path: Path | bytes, *, audit: bool = False, request_id: str = "") -> verifier_pb2.VerifyPathRequest:
    mode = verifier_pb2.VerifyPathRequest.AUDIT if audit else verifier_pb2.VerifyPathRequest.ACCEPT
    data = path if isinstance(path, bytes) else path.to_bytes()
    return verifier_pb2.VerifyPathRequest(path=data, output=OUTPUT, mode=mode, request_id=request_id)


def logged(store: InMemoryState, keys: Sequence[str]) -> list[VerdictEntry]:
    return store.accepts_relying_on(DependencyKind.KEY, keys)


def sample(metrics_registry: prometheus_client.CollectorRegistry, name: str, **labels: str) -> float:
    value = metrics_registry.get_sample_value(name, labels)
    return 0.0 if value is None else float(value)


def test_each_verdict_is_logged_with_what_it_relied_on() -> None:
    store = InMemoryState()
    verifier, _, _ = service(store, Follower(registry(3)))
    path = fresh_path()
    answer = verifier.VerifyPath(request(path, request_id="req-1"), Context())
    assert answer.verdict.verdict == answer.verdict.ACCEPT
    audited = verifier.VerifyPath(request(fresh_path(), audit=True), Context())
    assert audited.verdict.verdict == audited.verdict.ACCEPT
    rejected = verifier.VerifyPath(request(b"{not a path"), Context())
    assert rejected.verdict.reason == "MALFORMED"
    assert store.verdict_count() == 3  # the rejected one too, with no records

    # The log orders by time, then verdict id: two verdicts in one millisecond come in either order.
    entries = logged(store, [MESH.signers["deployer-a"].key_id])
    assert len(entries) == 2
    (first,) = [entry for entry in entries if entry.request_id == "req-1"]
    (second,) = [entry for entry in entries if entry is not first]
    assert first.records == path_dependencies(path)
    assert (first.mode, first.request_id, first.client, first.registry_sequence) == ("accept", "req-1", "", 3)
    assert (first.verdict, first.reason, first.construction) == ("ACCEPT", "", "signed-dag")
    assert first.retain_until_ms == first.time_ms + 60_000
    assert second.mode == "audit"


def test_a_verdict_that_cannot_be_logged_is_not_answered() -> None:
    store = FailingLog()
    verifier, metrics, _ = service(store, Follower(registry(3)))
    context = Context()
    with pytest.raises(Aborted):
        verifier.VerifyPath(request(fresh_path()), context)
    assert context.status.code == grpc.StatusCode.UNAVAILABLE
    assert error_code(context.status) == "STATE_UNAVAILABLE"
    assert sample(metrics, "countersign_verifier_errors_total", code="STATE_UNAVAILABLE") == 1
    assert sample(metrics, "countersign_verifications_total", verdict="ACCEPT", reason="", mode="accept") == 0
    # With the log switched off (verdict_log = false) the same store answers.
    quiet, _, _ = service(store, Follower(registry(3)), recording=False)
    assert quiet.VerifyPath(request(fresh_path()), Context()).verdict.verdict == 1


def test_a_verdict_reached_just_before_a_revocation_marks_itself() -> None:
    b_key = MESH.signers["deployer-b"].key_id
    store = InMemoryState()
    # The verification sees sequence 3; by the time the verdict is logged, 4 has revoked b's key.
    follower = Follower(registry(3), registry(4, revoke=b_key))
    verifier, metrics, _ = service(store, follower)
    assert verifier.VerifyPath(request(fresh_path()), Context()).verdict.verdict == 1
    (entry,) = logged(store, [b_key])
    assert entry.needs_revalidation and entry.revalidation_cause.startswith(f"revoke_key deployer-b {b_key}")
    assert sample(metrics, "countersign_verdicts_needing_revalidation_total", trigger="revoke_key") == 1


def test_the_sweep_marks_what_each_newly_distrusted_key_reached_once() -> None:
    a_key, b_key = MESH.signers["deployer-a"].key_id, MESH.signers["deployer-b"].key_id
    store = InMemoryState()
    follower = Follower(registry(3))
    verifier, metrics, revalidator = service(store, follower)
    for _ in range(3):
        assert verifier.VerifyPath(request(fresh_path()), Context()).verdict.verdict == 1
    a_only = MESH.issue_path(Construction.SIGNED_DAG, ["deployer-a"], OUTPUT, now_ms=time.time_ns() // 1_000_000)
    assert verifier.VerifyPath(request(a_only), Context()).verdict.verdict == 1
    assert revalidator.sweep() == 0  # nothing distrusted yet
    follower.views = [registry(4, revoke=b_key)]
    assert revalidator.sweep() == 3
    assert revalidator.sweep() == 0  # already swept
    # A second verifier starting on the same store sweeps everything distrusted, and counts nothing new.
    _, _, starting = service(store, follower)
    assert starting.sweep() == 0
    assert sample(metrics, "countersign_verdicts_needing_revalidation_total", trigger="revoke_key") == 3
    entries = logged(store, [a_key])
    assert len(entries) == 4 and sum(e.needs_revalidation for e in entries) == 3
    assert all(e.needs_revalidation == e.depends_on(DependencyKind.KEY, b_key) for e in entries)


def test_impact_is_refused_to_a_caller_without_an_operator_or_client_certificate() -> None:
    store = InMemoryState()
    guarded, _, _ = service(store, Follower(registry(3)))
    context = Context()
    with pytest.raises(Aborted):
        guarded.Impact(verifier_pb2.ImpactRequest(deployer="deployer-a"), context)
    assert (context.status.code, error_code(context.status)) == (grpc.StatusCode.PERMISSION_DENIED, "NOT_AUTHORISED")
    plaintext, _, _ = service(store, Follower(registry(3)), require_identity=False)  # insecure_loopback
    assert plaintext.VerifyPath(request(fresh_path()), Context()).verdict.verdict == 1
    answer = plaintext.Impact(verifier_pb2.ImpactRequest(deployer="deployer-a", mark=True), Context())
    assert answer.newly_marked == 1 and [v.marked_in_log for v in answer.verdicts] == [True]
    (entry,) = logged(store, [MESH.signers["deployer-a"].key_id])
    assert entry.revalidation_cause == "impact query deployer deployer-a by plaintext"


def test_the_service_takes_each_of_its_parts_by_name() -> None:
    """Thirteen parts, several of one type (three optional metrics and logs, two lane counts): a
    positional call could swap two unnoticed, so each is given by name."""
    parameters = list(inspect.signature(VerifierService.__init__).parameters.values())[1:]
    assert len(parameters) >= 13
    assert all(parameter.kind is inspect.Parameter.KEYWORD_ONLY for parameter in parameters)
