"""Retrying whole operations across replicas under the client policy (:mod:`countersign.client.failover`;
the zone scenarios measure it under partitions, loss and replica kills).

* Every attempt has its own deadline (``attempt_timeout_s``); the whole operation has an overall
  deadline (``deadline_s``) and an attempt budget.
* Retried: transport failures (``UNAVAILABLE``, ``DEADLINE_EXCEEDED``) and the typed retryable codes
  (``STATE_UNAVAILABLE``, ``PARENT_UNREACHABLE``, a signer's ``REGISTRY_STALE``), with capped
  exponential backoff and full jitter.
* Verification fails over: each retry goes to the next replica in the client's list (its own zone
  first). A ``REGISTRY_STALE`` *verdict* is not a judgement on the path (the replica checked
  nothing), so it too moves on to the next replica.
* Accept mode is retried with an idempotency key: every attempt of one call carries the same
  ``request_id``, so when an attempt consumed the leaf nonce but its answer was lost (the replica
  died, the deadline passed), the retry on another replica is answered ACCEPT again rather than
  ``NONCE_REPLAYED``. Were a retry still to answer ``NONCE_REPLAYED`` after an attempt that may have
  been delivered (say, a verifier without the key), it is reported as ``replayed_after_unknown``,
  never as an accept.
* Issuance: ``AcceptDelegation`` is retried on ``PARENT_UNREACHABLE`` with the same grant. The
  child's signer re-sends the edge it first proposed under that grant, so a co-signature whose answer
  was lost is recovered, not wasted. Should the parent still refuse with ``GRANT_USED`` (the grant was
  spent on another edge), the parent's runtime opens a new grant and the child tries again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from countersign.client.failover import RETRYABLE_CODES, RetryPolicy
from countersign.client.results import Grant
from countersign.client.signer import SignerClient
from countersign.client.verifier import VerifierClient, new_request_id
from countersign.errors import ServiceError
from countersign.policy import ConsumerPolicy
from countersign.reasons import Reason, VerificationResult
from countersign.records import Path
from countersign.verify import OutputDigest

# Failures after which the request may have reached a verifier and been acted on.
MAYBE_DELIVERED = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "STATE_UNAVAILABLE", "CANCELLED", "INTERNAL"})


@dataclass
class Attempt:
    target: str
    code: str  # "ACCEPT", a reject reason, or an error code
    elapsed_s: float
    error: bool


@dataclass
class VerifyOutcome:
    result: VerificationResult | None
    attempts: list[Attempt] = field(default_factory=list)

    @property
    def uncertain(self) -> bool:
        """Some failed attempt may have reached a verifier (and consumed the nonce)."""
        return any(a.error and a.code in MAYBE_DELIVERED for a in self.attempts)

    @property
    def accepted(self) -> bool:
        return self.result is not None and bool(self.result)

    @property
    def replayed_after_unknown(self) -> bool:
        return (
            self.result is not None
            and not self.result
            and self.result.reason is Reason.NONCE_REPLAYED
            and self.uncertain
            and len(self.attempts) > 1
        )

    @property
    def accept_count(self) -> int:
        return sum(1 for a in self.attempts if a.code == "ACCEPT")


def verify_with_failover(
    clients: Sequence[VerifierClient],
    path: Path | bytes,
    output: bytes | OutputDigest,
    policy: RetryPolicy,
    *,
    audit: bool = False,
    sleep: Callable[[float], None] = time.sleep,
    consumer_policy: ConsumerPolicy | None = None,
) -> VerifyOutcome:
    """Verify ``path`` for ``output`` through ``clients`` (in order, wrapping round) under ``policy``
    (``consumer_policy``: the caller's own, as :meth:`VerifierClient.verify` applies it). Never raises
    ServiceError: every failed attempt is in the outcome's ``attempts``."""
    outcome = VerifyOutcome(None)
    request_id = new_request_id()  # one key for every attempt of this call
    deadline = time.monotonic() + policy.deadline_s
    for attempt in range(policy.attempts):
        client = clients[attempt % len(clients)]
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        started = time.monotonic()
        try:
            result = client.verify(
                path,
                output,
                audit=audit,
                timeout_s=min(policy.attempt_timeout_s, remaining),
                request_id=request_id,
                consumer_policy=consumer_policy,
            ).result
        except ServiceError as exc:
            outcome.attempts.append(Attempt(client.address, exc.code, time.monotonic() - started, True))
            if exc.code not in RETRYABLE_CODES and exc.code not in MAYBE_DELIVERED:
                return outcome
            sleep(policy.backoff(attempt))
            continue
        code = "ACCEPT" if result else str(result.reason)
        outcome.attempts.append(Attempt(client.address, code, time.monotonic() - started, False))
        if not result and result.reason is Reason.REGISTRY_STALE:
            continue  # this replica checked nothing; ask the next one
        outcome.result = result
        return outcome
    return outcome


@dataclass
class IssueOutcome:
    path: Path | None
    attempts: list[str] = field(default_factory=list)
    grants: int = 0


def delegate_with_retry(
    parent_runtime: SignerClient,
    child_runtime: SignerClient,
    parent: Path,
    child_deployer: str,
    parent_signer: str,
    instance: str,
    policy: RetryPolicy,
    *,
    sleep: Callable[[float], None] = time.sleep,
) -> IssueOutcome:
    """Open a grant (parent side) and accept it (child side), retrying under ``policy``. Never raises
    ServiceError: the outcome holds the child path, or None and every attempt's code."""
    outcome = IssueOutcome(None)
    grant: Grant | None = None
    deadline = time.monotonic() + policy.deadline_s
    for attempt in range(policy.attempts):
        if time.monotonic() > deadline:
            break
        try:
            if grant is None:
                grant = parent_runtime.open_grant(parent, child_deployer)
                outcome.grants += 1
            outcome.path = child_runtime.accept(
                parent, grant, parent_signer, instance, timeout_s=policy.attempt_timeout_s
            )
            outcome.attempts.append("OK")
            return outcome
        except ServiceError as exc:
            outcome.attempts.append(exc.code)
            if exc.code in ("GRANT_USED", "PARENT_REFUSED") and "GRANT_USED" in f"{exc.code} {exc}":
                # Spent by a co-signature this child never received. The child's signer reports the
                # parent's refusal as PARENT_REFUSED with the parent's code in the message.
                grant = None
            elif exc.code not in RETRYABLE_CODES:
                return outcome
            sleep(policy.backoff(attempt))
    return outcome
