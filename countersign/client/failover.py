"""The client retry, deadline and failover policy, shared by every client that talks to replicas.

* Every attempt has its own deadline (``attempt_timeout_s``); the whole operation has an overall
  deadline (``deadline_s``) and an attempt budget.
* Retried: what the server or the transport marks retryable (``ServiceError.retryable``: the
  transport's ``UNAVAILABLE`` and ``DEADLINE_EXCEEDED``, ``STATE_UNAVAILABLE``, ``STATE_CONFLICT``,
  ``PARENT_UNREACHABLE``, a signer's ``REGISTRY_STALE``, ...), each retry at the next replica of the
  client's list; after a round, with capped exponential backoff and full jitter.
* Replicas are asked in the order the client names them (its own zone's first), except that one that
  could not be reached is asked last for ``replica_down_s`` (:class:`ReplicaOrder`).
* A signing call is retried under one ``request_id`` (spec 21.2): whichever replica answers a retry,
  the runtime gets the first answer back, never a second record for one output or delegation.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from countersign.errors import ErrorCode, ServiceError

T = TypeVar("T")
R = TypeVar("R")

RETRYABLE_CODES = frozenset(
    {"UNAVAILABLE", "DEADLINE_EXCEEDED", "STATE_UNAVAILABLE", "STATE_CONFLICT", "PARENT_UNREACHABLE", "REGISTRY_STALE"}
)


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 8
    attempt_timeout_s: float = 3.0
    deadline_s: float = 30.0
    backoff_base_s: float = 0.05
    backoff_max_s: float = 1.0
    # A replica that could not be reached (or whose registry copy was stale) is asked last for this
    # long, twice as long after each further failure in a row (at most a minute); otherwise replicas
    # are asked in the order the client names them (its own zone first).
    replica_down_s: float = 5.0

    def backoff(self, attempt: int) -> float:
        """Full jitter: uniform in [0, min(max, base × 2^attempt)]."""
        return random.uniform(0, min(self.backoff_max_s, self.backoff_base_s * 2**attempt))  # noqa: S311


GRPC_SCHEMES = ("dns:", "ipv4:", "ipv6:", "unix:")


def addresses_of(address: str | Sequence[str]) -> list[str]:
    """A service's replicas as a client names them: one ``host:port``, several separated by commas, or a
    list; each is one channel the client fails over between. A DNS name that resolves to several
    addresses, or a gRPC target naming several (``ipv4:10.0.1.5:7401,10.0.2.5:7401``), is one entry:
    gRPC moves between its addresses itself. Raises ValueError when none is named."""
    if isinstance(address, str) and address.strip().startswith(GRPC_SCHEMES):
        return [address.strip()]
    parts = address.split(",") if isinstance(address, str) else list(address)
    found = [part.strip() for part in parts if part.strip()]
    if not found:
        raise ValueError("name at least one address (host:port)")
    return found


def retryable(error: ServiceError) -> bool:
    """Whether a failed attempt may be made again (at another replica)."""
    return error.retryable or error.code in RETRYABLE_CODES


# Failures that say something about the replica asked (not about the request or the shared store).
REPLICA_DOWN_CODES = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "REGISTRY_STALE", "CANCELLED"})


class ReplicaOrder:
    """Which replica of a service to ask: in the order the client names them (so its own zone's
    first), except that a replica that just failed to answer is asked last until its
    ``replica_down_s`` has passed (then it is tried first again: a restarted replica is back)."""

    def __init__(self, count: int, policy: RetryPolicy) -> None:
        self._count = count
        self._policy = policy
        self._down_until = [0.0] * count
        self._strikes = [0] * count  # failures in a row
        self._lock = threading.Lock()

    def plan(self, timeout_s: float, *, whole: bool = False) -> Iterator[tuple[int, float, float]]:
        """(replica, attempt timeout, pause before it) for each attempt within ``timeout_s`` and the
        policy's attempts: every replica once, those up first, at once; then further rounds after a
        backoff. Each attempt gets at most the policy's ``attempt_timeout_s`` (so a replica that hangs
        costs that, not the call), unless ``whole`` (a stream: it gets what is left)."""
        now = time.monotonic()
        with self._lock:
            up = [i for i in range(self._count) if self._down_until[i] <= now]
        order = up + [i for i in range(self._count) if i not in up]
        deadline = now + timeout_s
        for attempt in range(max(self._policy.attempts, 1)):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            pause = self._policy.backoff(attempt) if attempt >= self._count else 0.0
            attempt_s = remaining if whole else min(remaining, self._policy.attempt_timeout_s)
            yield order[attempt % self._count], attempt_s, pause

    def answered(self, index: int) -> None:
        with self._lock:
            self._down_until[index], self._strikes[index] = 0.0, 0

    def failed(self, index: int, code: str) -> None:
        """Replica ``index`` failed with ``code``: if that says it is down, ask it last for a while."""
        if code in REPLICA_DOWN_CODES:
            with self._lock:
                self._strikes[index] += 1
                down_s = min(self._policy.replica_down_s * 2 ** (self._strikes[index] - 1), 60.0)
                self._down_until[index] = time.monotonic() + down_s


def _no_answer(service: str) -> ServiceError:
    return ServiceError(ErrorCode.DEADLINE_EXCEEDED, f"no {service} replica answered in time", retryable=True)


class _Attempts(Generic[R]):
    """What each attempt of :func:`ask_replicas` (or its asyncio twin) means for the call: one decision
    for both, so the two loops differ only in how they wait and ask."""

    def __init__(self, order: ReplicaOrder, service: str, settles: Callable[[R], bool]) -> None:
        self._order, self._service, self._settles = order, service, settles
        self._last: ServiceError | None = None
        self._unsettled: list[R] = []

    def failed(self, index: int, error: ServiceError) -> None:
        """A replica failed: re-raise a non-retryable failure; a retryable one moves on to the next."""
        if not retryable(error):
            raise error
        self._order.failed(index, error.code)
        self._last = error

    def settled(self, index: int, answer: R) -> bool:
        """True when ``answer`` settles the call; otherwise it is kept and the next replica is asked."""
        if not self._settles(answer):
            self._order.failed(index, "REGISTRY_STALE")
            self._unsettled.append(answer)
            return False
        self._order.answered(index)
        return True

    def outcome(self) -> R:
        """No replica settled the call: the last unsettled answer, else the last retryable failure."""
        if self._unsettled:
            return self._unsettled[-1]
        raise self._last or _no_answer(self._service)


def ask_replicas(
    order: ReplicaOrder,
    replicas: Sequence[T],
    ask: Callable[[T, float], R],
    timeout_s: float,
    *,
    service: str,
    whole: bool = False,
    settles: Callable[[R], bool] = lambda answer: True,
) -> R:
    """``ask`` the replicas in ``order`` until one answers: a retryable failure moves on to the next, as
    does an answer that does not ``settle`` the call (a verifier's ``REGISTRY_STALE`` verdict: that
    replica checked nothing); the last such answer is returned if no replica settles it. Raises the
    last retryable failure (or DEADLINE_EXCEEDED) when none answered, a non-retryable one at once."""
    attempts = _Attempts(order, service, settles)
    for index, attempt_s, pause in order.plan(timeout_s, whole=whole):
        if pause:
            time.sleep(pause)
        try:
            answer = ask(replicas[index], attempt_s)
        except ServiceError as error:
            attempts.failed(index, error)
            continue
        if attempts.settled(index, answer):
            return answer
    return attempts.outcome()


async def aask_replicas(
    order: ReplicaOrder,
    replicas: Sequence[T],
    ask: Callable[[T, float], Awaitable[R]],
    timeout_s: float,
    *,
    service: str,
    whole: bool = False,
    settles: Callable[[R], bool] = lambda answer: True,
) -> R:
    """:func:`ask_replicas` on an event loop."""
    attempts = _Attempts(order, service, settles)
    for index, attempt_s, pause in order.plan(timeout_s, whole=whole):
        if pause:
            await asyncio.sleep(pause)
        try:
            answer = await ask(replicas[index], attempt_s)
        except ServiceError as error:
            attempts.failed(index, error)
            continue
        if attempts.settled(index, answer):
            return answer
    return attempts.outcome()
