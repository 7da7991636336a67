"""The client retry, deadline and failover policy, shared by every client that talks to replicas.

* Every attempt has its own deadline (``attempt_timeout_s``); the whole operation has an overall
  deadline (``deadline_s``) and an attempt budget.
* Retried: what the server or the transport marks retryable (``ServiceError.retryable``: the
  transport's ``UNAVAILABLE`` and ``DEADLINE_EXCEEDED``, ``STATE_UNAVAILABLE``, ``STATE_CONFLICT``,
  ``PARENT_UNREACHABLE``, a signer's ``REGISTRY_STALE``, ...), with capped exponential backoff and full
  jitter, each retry at the next replica of the client's list (it wraps round).
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
from typing import TypeVar

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


class ReplicaOrder:
    """Which replica of a service to ask next: the one that answered last, then the others in turn."""

    def __init__(self, count: int, policy: RetryPolicy) -> None:
        self._count = count
        self._policy = policy
        self._preferred = 0
        self._lock = threading.Lock()

    def plan(self, timeout_s: float, *, whole: bool = False) -> Iterator[tuple[int, float, float]]:
        """(replica, attempt timeout, pause before it) for each attempt within ``timeout_s`` and the
        policy's attempts: a replica not yet asked in this call is asked at once, a second round after
        a backoff. Each attempt gets at most the policy's ``attempt_timeout_s`` (so a replica that hangs
        costs that, not the call), unless ``whole`` (a stream: it gets what is left)."""
        with self._lock:
            start = self._preferred
        deadline = time.monotonic() + timeout_s
        for attempt in range(max(self._policy.attempts, 1)):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            pause = self._policy.backoff(attempt) if attempt >= self._count else 0.0
            attempt_s = remaining if whole else min(remaining, self._policy.attempt_timeout_s)
            yield (start + attempt) % self._count, attempt_s, pause

    def answered(self, index: int) -> None:
        with self._lock:
            self._preferred = index


def _no_answer(service: str) -> ServiceError:
    return ServiceError(ErrorCode.DEADLINE_EXCEEDED, f"no {service} replica answered in time", retryable=True)


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
    last: ServiceError | None = None
    unsettled: list[R] = []
    for index, attempt_s, pause in order.plan(timeout_s, whole=whole):
        if pause:
            time.sleep(pause)
        try:
            answer = ask(replicas[index], attempt_s)
        except ServiceError as error:
            if not retryable(error):
                raise
            last = error
            continue
        if not settles(answer):
            unsettled.append(answer)
            continue
        order.answered(index)
        return answer
    if unsettled:
        return unsettled[-1]
    raise last or _no_answer(service)


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
    last: ServiceError | None = None
    unsettled: list[R] = []
    for index, attempt_s, pause in order.plan(timeout_s, whole=whole):
        if pause:
            await asyncio.sleep(pause)
        try:
            answer = await ask(replicas[index], attempt_s)
        except ServiceError as error:
            if not retryable(error):
                raise
            last = error
            continue
        if not settles(answer):
            unsettled.append(answer)
            continue
        order.answered(index)
        return answer
    if unsettled:
        return unsettled[-1]
    raise last or _no_answer(service)
