"""The client SDK: what an application imports to talk to Countersign's services (ADR 0012).

* :class:`SignerClient` (a deployer's runtime and its own signer), :class:`VerifierClient` (a
  consumer and a verifier replica), :class:`OperatorClient` (the operator and the coordinator), and
  their asyncio twins on ``grpc.aio`` (:class:`AsyncSignerClient`, ...), whose calls are unary;
* typed results (:class:`Grant`, :class:`VerifierVerdict`) and domain values
  (``countersign.records.Path``, bytes, str, int): no protobuf type crosses this API;
* every refusal is a :class:`ServiceError` whose ``code`` is an :class:`ErrorCode`;
* the runtime SDK (docs/quickstart-runtime.md): :class:`Runtime` and :class:`AsyncRuntime` for a
  producer (sign an output, delegate through a :class:`Delegation` handoff, accept one), and
  :func:`verify_path` for a consumer, whose :class:`PathVerdict` names the :class:`OutputEmitter`
  (and :func:`verify_session` for one agent's ordered session: :class:`SessionVerdict`);
* the retry, deadline and failover policy (:class:`RetryPolicy`, :func:`verify_with_failover`,
  :func:`delegate_with_retry`).

Example (README.md, "Client SDK", run by tests/client/test_readme_example.py)::

    from countersign.client import SignerClient, TlsConfig, VerifierClient
    tls = TlsConfig(ca="ca.pem", cert="runtime.pem", key="runtime.key")
    with SignerClient("127.0.0.1:7401", tls, "deployer-a") as signer:
        receipt = signer.receipt(signer.root("planner-1", "research"), hashlib.sha256(output).digest())
    with VerifierClient("127.0.0.1:7402", tls) as verifier:
        assert verifier.verify(receipt, output)
"""

from countersign.client.errors import ServiceError
from countersign.client.failover import RetryPolicy
from countersign.client.handoff import Delegation, HandoffError
from countersign.client.operator import AsyncOperatorClient, OperatorClient
from countersign.client.results import Grant, ImpactAnswer, SessionVerifierVerdict, VerifierVerdict
from countersign.client.retry import (
    Attempt,
    IssueOutcome,
    VerifyOutcome,
    delegate_with_retry,
    verify_with_failover,
)
from countersign.client.runtime import (
    AsyncRuntime,
    ClosedSession,
    OutputEmitter,
    PathVerdict,
    Runtime,
    SessionVerdict,
    averify_path,
    averify_session,
    load_registry,
    tls_from_env,
    verify_offline,
    verify_path,
    verify_session,
    verify_session_offline,
)
from countersign.client.signer import AsyncSignerClient, ChunkReceipt, SignerClient
from countersign.client.tls import TlsConfig
from countersign.client.verifier import AsyncVerifierClient, VerifierClient, new_request_id
from countersign.errors import ErrorCode

__all__ = [
    "AsyncOperatorClient",
    "AsyncRuntime",
    "AsyncSignerClient",
    "AsyncVerifierClient",
    "Attempt",
    "ChunkReceipt",
    "ClosedSession",
    "Delegation",
    "ErrorCode",
    "Grant",
    "HandoffError",
    "ImpactAnswer",
    "IssueOutcome",
    "OperatorClient",
    "OutputEmitter",
    "PathVerdict",
    "RetryPolicy",
    "Runtime",
    "ServiceError",
    "SessionVerdict",
    "SessionVerifierVerdict",
    "SignerClient",
    "TlsConfig",
    "VerifierClient",
    "VerifierVerdict",
    "VerifyOutcome",
    "averify_path",
    "averify_session",
    "delegate_with_retry",
    "load_registry",
    "new_request_id",
    "tls_from_env",
    "verify_offline",
    "verify_path",
    "verify_session",
    "verify_session_offline",
    "verify_with_failover",
]
