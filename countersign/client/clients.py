"""Clients of the three services, shared by the command line, the demo, the tests and the benchmarks."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from countersign._proto.v1 import (
    coordinator_pb2,
    coordinator_pb2_grpc,
    signer_pb2,
    signer_pb2_grpc,
    verifier_pb2,
    verifier_pb2_grpc,
)
from countersign.admission import AdmissionLog, SignedStatement, StatementKind, sign_statement
from countersign.client.lanes import Lanes, unary
from countersign.client.runtime_calls import RUNTIME_CALLS, RUNTIME_METHODS, runtime_answer
from countersign.client.tls import TlsConfig, coordinator_dns, open_channel, signer_dns, verifier_dns
from countersign.keys import PublicKey, Signer
from countersign.reasons import Reason, Verdict, VerificationResult
from countersign.records import Path


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def coordinator_log(address: str, tls: TlsConfig) -> list[bytes]:
    """Every statement the coordinator serves, unverified (the caller verifies)."""
    channel = open_channel(address, tls, coordinator_dns())
    try:
        get_log = unary(coordinator_pb2_grpc.CoordinatorStub(channel).GetLog)
        statements: list[bytes] = []
        while True:
            response = get_log(coordinator_pb2.GetLogRequest(from_sequence=len(statements)), 10)
            statements += list(response.statements)
            if not response.statements or len(statements) >= response.head_sequence:
                return statements
    finally:
        channel.close()


def submit_statement(address: str, tls: TlsConfig, signed: SignedStatement) -> None:
    """Submit a statement the operator signed elsewhere. Raises ServiceError if refused."""
    channel = open_channel(address, tls, coordinator_dns())
    try:
        unary(coordinator_pb2_grpc.CoordinatorStub(channel).Submit)(
            coordinator_pb2.SubmitRequest(statement=signed.to_bytes()), 10
        )
    finally:
        channel.close()


class OperatorClient:
    """The operator's side: fetch and verify the log, sign the next statement offline-style, submit it."""

    def __init__(self, address: str, tls: TlsConfig, operator: Signer) -> None:
        self._channel = open_channel(address, tls, coordinator_dns())
        self._stub = coordinator_pb2_grpc.CoordinatorStub(self._channel)
        self._operator = operator

    def log(self) -> AdmissionLog:
        """The whole served log, verified against the operator's own key."""
        copy = AdmissionLog(PublicKey(self._operator.public_key))
        start = 0
        while True:
            response = self._stub.GetLog(coordinator_pb2.GetLogRequest(from_sequence=start), timeout=10)
            copy.extend([SignedStatement.from_bytes(s) for s in response.statements])
            copy.check_head(response.head_sequence, response.head_digest or None)
            if copy.head_sequence >= response.head_sequence:
                return copy
            start = copy.head_sequence

    def prepare(
        self,
        kind: StatementKind,
        deployer: str,
        key_id: str,
        *,
        public_key: str | None = None,
        at_ms: int | None = None,
        note: str | None = None,
    ) -> SignedStatement:
        """Sign the statement that would extend the served log now (not yet submitted)."""
        statement = self.log().next_statement(
            kind, deployer, key_id, issued_ms=now_ms(), public_key=public_key, at_ms=at_ms, note=note
        )
        return sign_statement(statement, self._operator)

    def submit(
        self,
        kind: StatementKind,
        deployer: str,
        key_id: str,
        *,
        public_key: str | None = None,
        at_ms: int | None = None,
        note: str | None = None,
    ) -> SignedStatement:
        """Sign the next statement and submit it. Raises ServiceError if the coordinator refuses."""
        signed = self.prepare(kind, deployer, key_id, public_key=public_key, at_ms=at_ms, note=note)
        unary(self._stub.Submit)(coordinator_pb2.SubmitRequest(statement=signed.to_bytes()), 10)
        return signed

    def close(self) -> None:
        self._channel.close()


@dataclass
class VerifierClient:
    """A consumer of the verifier service: over up to ``lanes`` verification lanes (``VerifyPaths``
    streams, ADR 0008), or with ``lanes=0`` one unary ``VerifyPath`` call per path."""

    address: str
    tls: TlsConfig
    lanes: int = 4
    lane_idle_s: float = 1.0

    def __post_init__(self) -> None:
        self._channel = open_channel(self.address, self.tls, verifier_dns())
        self._stub = verifier_pb2_grpc.VerifierStub(self._channel)
        self._unary = unary(self._stub.VerifyPath)
        self._lanes: Lanes[verifier_pb2.VerifyPathRequest, verifier_pb2.VerifyPathResponse] | None = (
            Lanes(self._stub.VerifyPaths, self.lanes, self.lane_idle_s, self._unary) if self.lanes > 0 else None
        )

    def verify(
        self, path: bytes, output: bytes, *, audit: bool = False, timeout_s: float = 10.0, request_id: str = ""
    ) -> tuple[VerificationResult, int]:
        """The verdict and the registry sequence it was reached at. Raises ServiceError on failure.

        ``request_id``: an idempotency key for retrying an accept-mode request (proto docs)."""
        mode = verifier_pb2.VerifyPathRequest.AUDIT if audit else verifier_pb2.VerifyPathRequest.ACCEPT
        request = verifier_pb2.VerifyPathRequest(path=path, output=output, mode=mode, request_id=request_id)
        ask = self._lanes.ask if self._lanes is not None else self._unary
        response: verifier_pb2.VerifyPathResponse = ask(request, timeout_s)
        verdict = response.verdict
        if verdict.verdict == verdict.ACCEPT:
            return VerificationResult.accept(), response.registry_sequence
        return (
            VerificationResult(
                Verdict.REJECT, Reason(verdict.reason), None if verdict.index < 0 else verdict.index, verdict.detail
            ),
            response.registry_sequence,
        )

    def close(self) -> None:
        if self._lanes is not None:
            self._lanes.close()
        self._channel.close()


@dataclass
class SignerClient:
    """A deployer's runtime talking to its own signer: over up to ``lanes`` runtime lanes
    (``RuntimeCalls`` streams, ADR 0008), or with ``lanes=0`` one unary call per request."""

    address: str
    tls: TlsConfig
    deployer: str
    lanes: int = 4
    lane_idle_s: float = 1.0

    def __post_init__(self) -> None:
        self._channel = open_channel(self.address, self.tls, signer_dns(self.deployer))
        self.stub = signer_pb2_grpc.SignerStub(self._channel)
        self._lanes: Lanes[signer_pb2.RuntimeCall, signer_pb2.RuntimeAnswer] | None = (
            Lanes(self.stub.RuntimeCalls, self.lanes, self.lane_idle_s, self._unary_call) if self.lanes > 0 else None
        )

    def _call(self, method: str, request: Any, timeout_s: float = 10.0) -> Any:
        call = signer_pb2.RuntimeCall(**{RUNTIME_CALLS[method]: request})
        answer = self._lanes.ask(call, timeout_s) if self._lanes is not None else self._unary_call(call, timeout_s)
        return answer.grant if method == "OpenGrant" else answer.issued

    def _unary_call(self, call: signer_pb2.RuntimeCall, timeout_s: float) -> signer_pb2.RuntimeAnswer:
        kind = call.WhichOneof("call")
        assert kind is not None  # built by _call from RUNTIME_CALLS
        method = RUNTIME_METHODS[kind]
        return runtime_answer(method, unary(getattr(self.stub, method))(getattr(call, kind), timeout_s))

    def root(self, instance: str, system: str, *, ttl_ms: int = 3_600_000, max_children: int = 8) -> Path:
        agent = signer_pb2.AgentFields(instance=instance, system=system, ttl_ms=ttl_ms, max_children=max_children)
        response = self._call("IssueRoot", signer_pb2.IssueRootRequest(agent=agent))
        return Path.from_bytes(response.path)

    def receipt(
        self, parent: Path, output_sha256: bytes, *, session: str = "", binding_scope: str = "per_turn"
    ) -> Path:
        request = signer_pb2.IssueReceiptRequest(
            parent_path=parent.to_bytes(), output_sha256=output_sha256, binding_scope=binding_scope, session=session
        )
        return Path.from_bytes(self._call("IssueReceipt", request).path)

    def local_child(self, parent: Path, instance: str, *, ttl_ms: int = 3_600_000, max_children: int = 8) -> Path:
        agent = signer_pb2.AgentFields(instance=instance, ttl_ms=ttl_ms, max_children=max_children)
        request = signer_pb2.IssueLocalChildRequest(parent_path=parent.to_bytes(), agent=agent)
        return Path.from_bytes(self._call("IssueLocalChild", request).path)

    def open_grant(self, parent: Path, child_deployer: str, *, ttl_ms: int = 60_000) -> signer_pb2.OpenGrantResponse:
        request = signer_pb2.OpenGrantRequest(
            parent_path=parent.to_bytes(), child_deployer=child_deployer, ttl_ms=ttl_ms
        )
        grant: signer_pb2.OpenGrantResponse = self._call("OpenGrant", request)
        return grant

    def accept(
        self,
        parent: Path,
        grant: signer_pb2.OpenGrantResponse,
        parent_signer: str,
        instance: str,
        *,
        ttl_ms: int = 3_600_000,
        max_children: int = 8,
        timeout_s: float = 10.0,
    ) -> Path:
        agent = signer_pb2.AgentFields(instance=instance, ttl_ms=ttl_ms, max_children=max_children)
        request = signer_pb2.AcceptDelegationRequest(
            parent_path=parent.to_bytes(),
            grant_id=grant.grant_id,
            parent_key_id=grant.parent_key_id,
            parent_signer=parent_signer,
            agent=agent,
        )
        return Path.from_bytes(self._call("AcceptDelegation", request, timeout_s).path)

    def close(self) -> None:
        if self._lanes is not None:
            self._lanes.close()
        self._channel.close()
