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

import random
from collections.abc import Sequence
from dataclasses import dataclass

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


def addresses_of(address: str | Sequence[str]) -> list[str]:
    """A service's replicas as a client names them: one ``host:port``, several separated by commas, or a
    list. A DNS name that resolves to several addresses is one entry: gRPC tries its addresses itself.
    Raises ValueError when none is named."""
    parts = address.split(",") if isinstance(address, str) else list(address)
    found = [part.strip() for part in parts if part.strip()]
    if not found:
        raise ValueError("name at least one address (host:port)")
    return found
