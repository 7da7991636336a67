"""The operator's side of the coordinator: fetch and verify the admission log, sign the next
registry statement, submit it; and two helpers for statements signed elsewhere."""

from __future__ import annotations

import time
from types import TracebackType

import grpc

from countersign._proto.v1 import coordinator_pb2, coordinator_pb2_grpc
from countersign.admission import AdmissionLog, SignedEndorsement, SignedStatement, StatementKind, sign_statement
from countersign.client.errors import from_rpc_error
from countersign.client.lanes import unary
from countersign.client.tls import TlsConfig, coordinator_dns, open_aio_channel, open_channel
from countersign.keys import PublicKey, Signer


def now_ms() -> int:
    """Wall-clock milliseconds since the epoch (what statements and records carry)."""
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


def _extend(copy: AdmissionLog, response: coordinator_pb2.GetLogResponse) -> bool:
    """Add one served page to ``copy`` (verified against the pinned operator key); True once the
    served head is reached. Raises AdmissionError if the served log forks or rolls back."""
    copy.extend([SignedStatement.from_bytes(s) for s in response.statements])
    copy.check_head(response.head_sequence, response.head_digest or None)
    return copy.head_sequence >= response.head_sequence


class OperatorClient:
    """The operator's side: fetch and verify the log, sign the next statement, submit it.

    Raises :class:`countersign.client.ServiceError` when the coordinator refuses or cannot be
    reached, and ``countersign.admission.AdmissionError`` when the served log does not verify."""

    def __init__(self, address: str, tls: TlsConfig, operator: Signer) -> None:
        self.address = address
        self._channel = open_channel(address, tls, coordinator_dns())
        self._stub = coordinator_pb2_grpc.CoordinatorStub(self._channel)
        self._get_log = unary(self._stub.GetLog)
        self._submit = unary(self._stub.Submit)
        self._operator = operator

    def log(self) -> AdmissionLog:
        """The whole served log, verified against the operator's own key."""
        copy = AdmissionLog(PublicKey(self._operator.public_key))
        while True:
            response = self._get_log(coordinator_pb2.GetLogRequest(from_sequence=copy.head_sequence), 10)
            if _extend(copy, response):
                return copy

    def prepare(
        self,
        kind: StatementKind,
        deployer: str,
        key_id: str,
        *,
        public_key: str | None = None,
        at_ms: int | None = None,
        note: str | None = None,
        endorsement: SignedEndorsement | None = None,
    ) -> SignedStatement:
        """Sign the statement that would extend the served log now (not yet submitted)."""
        statement = self.log().next_statement(
            kind,
            deployer,
            key_id,
            issued_ms=now_ms(),
            public_key=public_key,
            at_ms=at_ms,
            note=note,
            endorsement=endorsement,
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
        endorsement: SignedEndorsement | None = None,
    ) -> SignedStatement:
        """Sign the next statement and submit it. Raises ServiceError if the coordinator refuses."""
        signed = self.prepare(
            kind, deployer, key_id, public_key=public_key, at_ms=at_ms, note=note, endorsement=endorsement
        )
        self._submit(coordinator_pb2.SubmitRequest(statement=signed.to_bytes()), 10)
        return signed

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> OperatorClient:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()


class AsyncOperatorClient:
    """:class:`OperatorClient` on ``grpc.aio``: the same methods as coroutines, the same results and
    errors, one unary call each. Create it inside the running event loop; close it with
    ``await close()`` or ``async with``."""

    def __init__(self, address: str, tls: TlsConfig, operator: Signer) -> None:
        self.address = address
        self._channel = open_aio_channel(address, tls, coordinator_dns())
        self._stub = coordinator_pb2_grpc.CoordinatorStub(self._channel)
        self._operator = operator

    async def log(self) -> AdmissionLog:
        """See :meth:`OperatorClient.log`."""
        copy = AdmissionLog(PublicKey(self._operator.public_key))
        while True:
            try:
                response = await self._stub.GetLog(
                    coordinator_pb2.GetLogRequest(from_sequence=copy.head_sequence), timeout=10
                )
            except grpc.RpcError as exc:
                raise from_rpc_error(exc) from None
            if _extend(copy, response):
                return copy

    async def prepare(
        self,
        kind: StatementKind,
        deployer: str,
        key_id: str,
        *,
        public_key: str | None = None,
        at_ms: int | None = None,
        note: str | None = None,
        endorsement: SignedEndorsement | None = None,
    ) -> SignedStatement:
        """See :meth:`OperatorClient.prepare`."""
        statement = (await self.log()).next_statement(
            kind, deployer, key_id, issued_ms=now_ms(), public_key=public_key, at_ms=at_ms, note=note,
            endorsement=endorsement,
        )  # fmt: skip
        return sign_statement(statement, self._operator)

    async def submit(
        self,
        kind: StatementKind,
        deployer: str,
        key_id: str,
        *,
        public_key: str | None = None,
        at_ms: int | None = None,
        note: str | None = None,
        endorsement: SignedEndorsement | None = None,
    ) -> SignedStatement:
        """See :meth:`OperatorClient.submit`."""
        signed = await self.prepare(
            kind, deployer, key_id, public_key=public_key, at_ms=at_ms, note=note, endorsement=endorsement
        )
        try:
            await self._stub.Submit(coordinator_pb2.SubmitRequest(statement=signed.to_bytes()), timeout=10)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        return signed

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncOperatorClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        await self.close()
