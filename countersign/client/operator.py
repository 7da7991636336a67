"""The operator's side of the coordinator: fetch and verify the admission log, sign the next
registry statement, submit it with a fresh checkpoint and confirm both are served back; sign and
submit checkpoints on their own (:class:`CheckpointLoop`); and two helpers for statements signed
elsewhere."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType

import grpc

from countersign._clock import now_ms
from countersign._proto.v1 import coordinator_pb2, coordinator_pb2_grpc
from countersign.admission import (
    AdmissionError,
    AdmissionLog,
    SignedEndorsement,
    SignedStatement,
    Statement,
    StatementKind,
    sign_statement,
)
from countersign.checkpoint import (
    CheckpointError,
    SignedCheckpoint,
    check_served,
    checkpoint_of,
    is_older,
    sign_checkpoint,
)
from countersign.client.errors import ServiceError, from_rpc_error
from countersign.client.failover import addresses_of
from countersign.client.lanes import unary
from countersign.client.tls import TlsConfig, coordinator_dns, open_aio_channel, open_channel
from countersign.errors import CountersignError
from countersign.keys import PublicKey, Signer
from countersign.records import DIGEST_PATTERN

log = logging.getLogger("countersign.operator")
DEFAULT_CHECKPOINT_LIFETIME_MS = 60_000


class KnownHead:
    """Every statement this operator signed or submitted, by its position in the log: what the
    operator's side keeps (spec 7.5). A checkpoint is signed only for a served log that holds each of
    them at its position, so a coordinator that withholds one (say a revocation signed offline and
    submitted from another machine) gets no checkpoint of the log without it and every follower goes
    stale within the checkpoint lifetime. A statement is recorded before it leaves the command that
    signs or submits it, and a second statement at a position already recorded is refused unless it
    names the one it replaces, so the operator's statements stay one chain.

    In memory, or in a small JSON file shared by the operator's commands and its checkpoint loop,
    read afresh on every use (``{"sequence", "head"}``: the newest; ``"statements"``: every
    ``[position, digest]``; a file of an earlier release holds only the newest). Writers hold an
    exclusive lock on ``<file>.lock``. Unusable files raise ServiceError ``INVALID_ARGUMENT``."""

    def __init__(self, path: str | Path | None = None) -> None:
        self._path = Path(path) if path else None
        self._lock = threading.Lock()
        self._held: dict[int, str] = {}

    @property
    def path(self) -> Path | None:
        return self._path

    def statements(self) -> dict[int, str]:
        """Position -> digest of every statement recorded."""
        with self._lock:
            return dict(self._load())

    def get(self) -> tuple[int, str] | None:
        """``(sequence, digest)`` of the newest: the log must hold ``sequence`` statements, the last
        with ``digest`` (and every other recorded one: :meth:`missing_from`)."""
        held = self.statements()
        if not held:
            return None
        newest = max(held)
        return newest + 1, held[newest]

    def _load(self) -> dict[int, str]:
        if self._path is None or not self._path.exists():
            return self._held
        try:
            body = json.loads(self._path.read_text())
            if "statements" in body:
                held = {int(position): str(digest) for position, digest in body["statements"]}
            else:  # an earlier release's file: the newest head only
                held = {int(body["sequence"]) - 1: str(body["head"])}
            if any(position < 0 or not DIGEST_PATTERN.fullmatch(d) for position, d in held.items()):
                raise ValueError("a position is negative or a digest malformed")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            message = f"operator head file {self._path} is unusable: {exc}"
            raise ServiceError("INVALID_ARGUMENT", message) from None
        self._held = held
        return held

    def _store(self, held: dict[int, str]) -> None:
        self._held = held
        if self._path is None:
            return
        newest = max(held) if held else -1
        body = {
            "sequence": newest + 1,
            "head": held.get(newest),
            "statements": [[position, held[position]] for position in sorted(held)],
        }
        temporary = self._path.with_name(self._path.name + ".tmp")
        try:
            temporary.write_text(json.dumps(body) + "\n")
            os.replace(temporary, self._path)
        except OSError as exc:
            message = f"cannot record the signed statement in {self._path}: {exc}"
            raise ServiceError("INVALID_ARGUMENT", message) from None

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        """This process's lock, and across processes an flock on ``<file>.lock``."""
        with self._lock:
            if self._path is None:
                yield
                return
            try:
                handle = open(self._path.with_name(self._path.name + ".lock"), "a")  # noqa: SIM115
            except OSError as exc:
                message = f"cannot lock the operator head file {self._path}: {exc}"
                raise ServiceError("INVALID_ARGUMENT", message) from None
            with handle:
                fcntl.flock(handle, fcntl.LOCK_EX)
                yield

    def record(self, signed: SignedStatement, *, replaces: str | None = None) -> None:
        """Remember ``signed`` (before it leaves the caller). Raises ServiceError ``SEQUENCE_CONFLICT``
        when a different statement is recorded at its position (unless it is ``replaces``, which is
        then forgotten, wherever it was), ``CHAIN_MISMATCH`` when the statement recorded just below
        it is not the one it chains onto."""
        position, digest = signed.statement.sequence, signed.digest()
        with self._exclusive():
            held = dict(self._load())
            if replaces is not None:
                held = {p: d for p, d in held.items() if d != replaces}
            there = held.get(position)
            if there == digest:
                return
            if there is not None:
                raise ServiceError(
                    "SEQUENCE_CONFLICT",
                    f"this operator already signed statement {position} ({there}): a second statement there"
                    " would leave one of them unserved for good; submit that one, or name it as the one"
                    " this replaces",
                )
            below = held.get(position - 1)
            if below is not None and signed.statement.prev != below:
                raise ServiceError(
                    "CHAIN_MISMATCH",
                    f"statement {position} does not chain onto statement {position - 1} ({below}) that this"
                    " operator signed",
                )
            held[position] = digest
            self._store(held)

    def missing_from(
        self, copy: AdmissionLog, *, below: int | None = None, ignoring: str | None = None
    ) -> list[tuple[int, str]]:
        """The recorded statements ``copy`` does not hold at their positions (only those below
        position ``below``, if given; ``ignoring`` one digest), in order."""
        return [
            (position, digest)
            for position, digest in sorted(self.statements().items())
            if digest != ignoring
            and (below is None or position < below)
            and (position >= copy.head_sequence or copy.entries[position].digest() != digest)
        ]


def not_served(message: str) -> ServiceError:
    return ServiceError("NOT_SERVED", message)


def check_reaches(copy: AdmissionLog, known: KnownHead | None, *, ignoring: str | None = None) -> None:
    """Raise NOT_SERVED unless the served (verified) log holds every statement the operator signed."""
    missing = [] if known is None else known.missing_from(copy, ignoring=ignoring)
    if missing:
        position, digest = missing[0]
        held = "does not hold it" if position >= copy.head_sequence else "holds another statement there"
        raise not_served(
            f"the coordinator serves {copy.head_sequence} statements but the operator signed statement {position}"
            f" ({digest}) and the served log {held}: it is withholding or has lost it, or it was never"
            " submitted; no checkpoint signed"
        )


def check_chains_onto(copy: AdmissionLog, known: KnownHead, position: int, *, replaces: str | None = None) -> None:
    """Raise unless a statement signed at ``position`` onto ``copy`` keeps every statement the operator
    signed: ``copy`` holds each recorded one below ``position`` (else NOT_SERVED) and nothing but
    ``replaces`` is recorded at ``position`` (else SEQUENCE_CONFLICT)."""
    missing = known.missing_from(copy, below=position)
    if missing:
        at, digest = missing[0]
        raise not_served(
            f"the log this statement would chain onto lacks statement {at} ({digest}) that this operator"
            " signed: submit it and chain onto a log that holds it"
        )
    there = known.statements().get(position)
    if there is not None and there != replaces:
        raise ServiceError(
            "SEQUENCE_CONFLICT",
            f"this operator already signed statement {position} ({there}): submit it, or name it as the one"
            " this statement replaces",
        )


def confirm_served(
    copy: AdmissionLog,
    served: bytes,
    signed: SignedStatement | None,
    checkpoint: SignedCheckpoint | None,
) -> None:
    """Raise NOT_SERVED unless the served log holds ``signed`` at its sequence and the served checkpoint
    is ``checkpoint`` or a newer valid one naming this log."""
    if signed is not None:
        sequence = signed.statement.sequence
        if copy.head_sequence <= sequence or copy.entries[sequence].digest() != signed.digest():
            raise not_served(f"the coordinator accepted statement {sequence} but does not serve it back")
    if checkpoint is None:
        return
    if not served:
        raise not_served("the coordinator accepted a checkpoint but serves none")
    try:
        back = SignedCheckpoint.from_bytes(served)
        check_served(copy, back, None)
    except (CheckpointError, ValueError) as exc:
        raise not_served(f"the coordinator serves a checkpoint that does not verify: {exc}") from None
    if back.to_bytes() != checkpoint.to_bytes() and is_older(back.checkpoint, checkpoint.checkpoint):
        raise not_served(
            f"the coordinator serves an older checkpoint (sequence {back.checkpoint.sequence}, issued"
            f" {back.checkpoint.issued_ms}) than the one it accepted (sequence {checkpoint.checkpoint.sequence})"
        )


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


def submit_statement(address: str, tls: TlsConfig, signed: SignedStatement, *, known_head: KnownHead) -> None:
    """Submit a statement the operator signed elsewhere and confirm it is served back. Raises
    ServiceError if refused (NOT_SERVED if accepted but not served back).

    ``signed`` is recorded in ``known_head`` before it is sent (refused there, with nothing sent, if
    it conflicts with a statement recorded at its position): the checkpoint loop sharing that record
    then vouches for no served log without it, so a coordinator that answers OK, or an error, and
    withholds it leaves every follower stale within the checkpoint lifetime. It carries no checkpoint
    (the key is elsewhere): followers stay fresh on the previous checkpoint, which the new log
    extends, until the operator's checkpoint loop names the new head."""
    known_head.record(signed)
    channel = open_channel(address, tls, coordinator_dns())
    try:
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        unary(stub.Submit)(coordinator_pb2.SubmitRequest(statement=signed.to_bytes()), 10)
        response = unary(stub.GetLog)(coordinator_pb2.GetLogRequest(from_sequence=signed.statement.sequence), 10)
        served = [SignedStatement.from_bytes(s) for s in response.statements[:1]]
        if not served or served[0].digest() != signed.digest():
            raise not_served(f"the coordinator accepted statement {signed.statement.sequence} but does not serve it")
    finally:
        channel.close()


def _extend(copy: AdmissionLog, response: coordinator_pb2.GetLogResponse) -> bool:
    """Add one served page to ``copy`` (verified against the pinned operator key); True once the
    served head is reached. Raises AdmissionError if the served log forks or rolls back."""
    copy.extend([SignedStatement.from_bytes(s) for s in response.statements])
    copy.check_head(response.head_sequence, response.head_digest or None)
    return copy.head_sequence >= response.head_sequence


def _after(copy: AdmissionLog, signed: SignedStatement) -> AdmissionLog:
    """``copy`` with ``signed`` appended (a new object: ``copy`` is unchanged). A statement that cannot
    apply is refused here with the code the coordinator would refuse it with."""
    after = AdmissionLog(copy.operator_key, list(copy.entries), copy.registry)
    try:
        after.append(signed)
    except AdmissionError as exc:
        raise ServiceError(exc.code, str(exc)) from None
    return after


# A connected submit signs against the log as served; if the log or its checkpoint moves before the
# statement lands (another statement, or the operator's own checkpoint loop signing a newer checkpoint
# in between), the coordinator refuses with SEQUENCE_CONFLICT and stores nothing. The statement names
# no sequence of its own choosing, so it is signed again against the log as it now stands.
SUBMIT_ATTEMPTS = 3


def _sign_submission(
    copy: AdmissionLog, statement: Statement, operator: Signer, lifetime_ms: int
) -> tuple[SignedStatement, AdmissionLog, SignedCheckpoint]:
    """``statement`` signed, the log it makes of ``copy``, and that log's checkpoint (issued when the
    statement is), signed."""
    signed = sign_statement(statement, operator)
    after = _after(copy, signed)  # refuses here a statement the coordinator would refuse
    checkpoint = sign_checkpoint(checkpoint_of(after, issued_ms=statement.issued_ms, lifetime_ms=lifetime_ms), operator)
    return signed, after, checkpoint


class OperatorClient:
    """The operator's side: fetch and verify the log, sign the next statement, submit it with the
    checkpoint of the log it makes, and confirm the coordinator serves both back; or sign and
    submit a checkpoint of the log as served.

    ``checkpoint_lifetime_ms`` is how long each checkpoint keeps followers fresh (the bound on a
    withholding coordinator); ``known_head`` is shared with the operator's other clients and loop.

    Raises :class:`countersign.client.ServiceError` when the coordinator refuses or cannot be
    reached (``NOT_SERVED`` when it accepted but does not serve back), and
    ``countersign.admission.AdmissionError`` when the served log does not verify."""

    def __init__(
        self,
        address: str,
        tls: TlsConfig,
        operator: Signer,
        *,
        checkpoint_lifetime_ms: int = DEFAULT_CHECKPOINT_LIFETIME_MS,
        known_head: KnownHead | None = None,
    ) -> None:
        self.address = address
        self._channel = open_channel(address, tls, coordinator_dns())
        self._stub = coordinator_pb2_grpc.CoordinatorStub(self._channel)
        self._get_log = unary(self._stub.GetLog)
        self._submit = unary(self._stub.Submit)
        self._submit_checkpoint = unary(self._stub.SubmitCheckpoint)
        self._operator = operator
        self.checkpoint_lifetime_ms = checkpoint_lifetime_ms
        self.known_head = known_head if known_head is not None else KnownHead()

    def log(self) -> AdmissionLog:
        """The whole served log, verified against the operator's own key."""
        return self._served()[0]

    def _served(self) -> tuple[AdmissionLog, bytes]:
        """The verified served log and the checkpoint served with its last page."""
        copy = AdmissionLog(PublicKey(self._operator.public_key))
        while True:
            response = self._get_log(coordinator_pb2.GetLogRequest(from_sequence=copy.head_sequence), 10)
            if _extend(copy, response):
                return copy, response.checkpoint

    def checkpoint(self) -> SignedCheckpoint:
        """Sign a checkpoint of the log as served, submit it, confirm it is served back.

        Raises NOT_SERVED (and signs nothing) if the served log does not reach what this operator
        submitted."""
        copy, _ = self._served()
        check_reaches(copy, self.known_head)
        checkpoint = sign_checkpoint(
            checkpoint_of(copy, issued_ms=now_ms(), lifetime_ms=self.checkpoint_lifetime_ms), self._operator
        )
        self._submit_checkpoint(coordinator_pb2.SubmitCheckpointRequest(checkpoint=checkpoint.to_bytes()), 10)
        back, served = self._served()
        confirm_served(back, served, None, checkpoint)
        return checkpoint

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
        """Sign the statement that would extend the served log now (not yet submitted; recorded in
        :attr:`known_head` as signed, so no checkpoint is signed for a log without it)."""
        copy = self.log()
        check_reaches(copy, self.known_head)
        statement = copy.next_statement(
            kind,
            deployer,
            key_id,
            issued_ms=now_ms(),
            public_key=public_key,
            at_ms=at_ms,
            note=note,
            endorsement=endorsement,
        )
        signed = sign_statement(statement, self._operator)
        self.known_head.record(signed)
        return signed

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
        """Sign the next statement and the checkpoint of the log it makes, submit both, and confirm
        the coordinator serves both back. Raises ServiceError if the coordinator refuses, NOT_SERVED
        if it accepted but does not serve them back (a withholding coordinator)."""
        previous: str | None = None  # this call's own earlier attempt, refused: replaced by the next
        for attempt in range(1, SUBMIT_ATTEMPTS + 1):
            copy = self.log()
            check_reaches(copy, self.known_head, ignoring=previous)
            statement = copy.next_statement(
                kind, deployer, key_id, issued_ms=now_ms(), public_key=public_key, at_ms=at_ms, note=note,
                endorsement=endorsement,
            )  # fmt: skip
            signed, _, checkpoint = _sign_submission(copy, statement, self._operator, self.checkpoint_lifetime_ms)
            request = coordinator_pb2.SubmitRequest(statement=signed.to_bytes(), checkpoint=checkpoint.to_bytes())
            try:
                self.known_head.record(signed, replaces=previous)  # before it leaves: see KnownHead
                previous = signed.digest()
                self._submit(request, 10)
                break
            except ServiceError as exc:
                if exc.code != "SEQUENCE_CONFLICT" or attempt == SUBMIT_ATTEMPTS:
                    raise
        back, served = self._served()
        confirm_served(back, served, signed, checkpoint)
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

    def __init__(
        self,
        address: str,
        tls: TlsConfig,
        operator: Signer,
        *,
        checkpoint_lifetime_ms: int = DEFAULT_CHECKPOINT_LIFETIME_MS,
        known_head: KnownHead | None = None,
    ) -> None:
        self.address = address
        self._channel = open_aio_channel(address, tls, coordinator_dns())
        self._stub = coordinator_pb2_grpc.CoordinatorStub(self._channel)
        self._operator = operator
        self.checkpoint_lifetime_ms = checkpoint_lifetime_ms
        self.known_head = known_head if known_head is not None else KnownHead()

    async def log(self) -> AdmissionLog:
        """See :meth:`OperatorClient.log`."""
        return (await self._served())[0]

    async def _served(self) -> tuple[AdmissionLog, bytes]:
        copy = AdmissionLog(PublicKey(self._operator.public_key))
        while True:
            try:
                response = await self._stub.GetLog(
                    coordinator_pb2.GetLogRequest(from_sequence=copy.head_sequence), timeout=10
                )
            except grpc.RpcError as exc:
                raise from_rpc_error(exc) from None
            if _extend(copy, response):
                return copy, response.checkpoint

    async def checkpoint(self) -> SignedCheckpoint:
        """See :meth:`OperatorClient.checkpoint`."""
        copy, _ = await self._served()
        check_reaches(copy, self.known_head)
        checkpoint = sign_checkpoint(
            checkpoint_of(copy, issued_ms=now_ms(), lifetime_ms=self.checkpoint_lifetime_ms), self._operator
        )
        try:
            await self._stub.SubmitCheckpoint(
                coordinator_pb2.SubmitCheckpointRequest(checkpoint=checkpoint.to_bytes()), timeout=10
            )
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        back, served = await self._served()
        confirm_served(back, served, None, checkpoint)
        return checkpoint

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
        copy = await self.log()
        check_reaches(copy, self.known_head)
        statement = copy.next_statement(
            kind, deployer, key_id, issued_ms=now_ms(), public_key=public_key, at_ms=at_ms, note=note,
            endorsement=endorsement,
        )  # fmt: skip
        signed = sign_statement(statement, self._operator)
        self.known_head.record(signed)
        return signed

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
        previous: str | None = None  # this call's own earlier attempt, refused: replaced by the next
        for attempt in range(1, SUBMIT_ATTEMPTS + 1):
            copy = await self.log()
            check_reaches(copy, self.known_head, ignoring=previous)
            statement = copy.next_statement(
                kind, deployer, key_id, issued_ms=now_ms(), public_key=public_key, at_ms=at_ms, note=note,
                endorsement=endorsement,
            )  # fmt: skip
            signed, _, checkpoint = _sign_submission(copy, statement, self._operator, self.checkpoint_lifetime_ms)
            request = coordinator_pb2.SubmitRequest(statement=signed.to_bytes(), checkpoint=checkpoint.to_bytes())
            try:
                self.known_head.record(signed, replaces=previous)  # before it leaves: see KnownHead
                previous = signed.digest()
                await self._stub.Submit(request, timeout=10)
                break
            except grpc.RpcError as exc:
                error = from_rpc_error(exc)
                if error.code != "SEQUENCE_CONFLICT" or attempt == SUBMIT_ATTEMPTS:
                    raise error from None
            except ServiceError as exc:
                if exc.code != "SEQUENCE_CONFLICT" or attempt == SUBMIT_ATTEMPTS:
                    raise
        back, served = await self._served()
        confirm_served(back, served, signed, checkpoint)
        return signed

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncOperatorClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        await self.close()


class CheckpointLoop:
    """Sign and submit a checkpoint every ``every_ms`` (a third of the lifetime is a good choice: two
    failed rounds still leave followers fresh). Runs in a daemon thread; an error is logged and
    reported to ``on_error`` and the next round tries again. ``address`` is read each round, so a
    coordinator that restarts on another port is followed; it may name several coordinator replicas
    (separated by commas): each round submits at the first that takes the checkpoint."""

    def __init__(
        self,
        address: Callable[[], str],
        tls: TlsConfig,
        operator: Signer,
        *,
        every_ms: int,
        checkpoint_lifetime_ms: int = DEFAULT_CHECKPOINT_LIFETIME_MS,
        known_head: KnownHead | None = None,
        on_checkpoint: Callable[[SignedCheckpoint], None] | None = None,
        on_error: Callable[[Exception], None] | None = None,
    ) -> None:
        if not 0 < every_ms < checkpoint_lifetime_ms:
            raise ValueError("every_ms must be positive and shorter than the checkpoint lifetime")
        self._address, self._tls, self._operator = address, tls, operator
        self.every_ms, self.checkpoint_lifetime_ms = every_ms, checkpoint_lifetime_ms
        self.known_head = known_head if known_head is not None else KnownHead()
        self._on_checkpoint, self._on_error = on_checkpoint, on_error
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def once(self) -> SignedCheckpoint:
        """One checkpoint, at the first coordinator (of the replicas ``address`` names, separated by
        commas) that takes it and serves it back; raises the last one's error when none did."""
        failure: CountersignError | None = None
        for address in addresses_of(self._address()):
            client = OperatorClient(
                address, self._tls, self._operator,
                checkpoint_lifetime_ms=self.checkpoint_lifetime_ms, known_head=self.known_head,
            )  # fmt: skip
            try:
                return client.checkpoint()
            except CountersignError as exc:  # unreachable, refusing or withholding: the next replica may not be
                failure = exc
                log.warning("checkpoint not submitted at this coordinator", extra={"coordinator": address,
                            "error": str(exc), "code": getattr(exc, "code", "")})  # fmt: skip
            finally:
                client.close()
        assert failure is not None  # addresses_of names at least one
        raise failure

    def run(self) -> None:
        """Loop until :meth:`stop` (in the calling thread)."""
        while not self._stop.is_set():
            try:
                checkpoint = self.once()
            except Exception as exc:  # any failure: report it, try again next round
                log.warning("checkpoint not submitted", extra={"error": str(exc), "code": getattr(exc, "code", "")})
                if self._on_error is not None:
                    self._on_error(exc)
            else:
                if self._on_checkpoint is not None:
                    self._on_checkpoint(checkpoint)
            self._stop.wait(self.every_ms / 1000)

    def start(self) -> CheckpointLoop:
        self._thread = threading.Thread(target=self.run, name="operator-checkpoints", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)
