"""The client SDK: what an application imports to talk to Countersign's services (ADR 0012).

Needs the ``grpc`` extra (``pip install 'countersign-mesh[grpc]'``); importing it without gRPC raises
ModuleNotFoundError naming that extra. Offline verification needs only the core
(:mod:`countersign.consumer`).

* a consumer checks evidence with one object, :class:`Consumer` (online through a verifier service,
  or offline against a registry; ADR 0034), whose every check answers with the one verdict shape,
  :class:`EvidenceVerdict` (truthy on accept; :attr:`EvidenceVerdict.emitter` names who emitted the
  output);
* a producer signs with the runtime SDK (docs/quickstart-runtime.md): :class:`Runtime` and
  :class:`AsyncRuntime` (sign an output, delegate through a :class:`Delegation` handoff, accept one);
* :class:`SignerClient`, :class:`VerifierClient`, :class:`OperatorClient` and their asyncio twins on
  ``grpc.aio`` (:class:`AsyncSignerClient`, ...) for the calls the two above do not wrap, with typed
  results (:class:`Grant`, :class:`ImpactAnswer`) and domain values: no protobuf type crosses this API;
* every refusal is a :class:`ServiceError` whose ``code`` is an :class:`ErrorCode`;
* the retry, deadline and failover policy (:class:`RetryPolicy`, :func:`verify_with_failover`,
  :func:`delegate_with_retry`).

Example (README.md, "Client SDK", run by tests/client/test_readme_example.py)::

    from countersign.client import Consumer, Runtime
    with Runtime.from_env() as runtime:
        receipt = runtime.receipt(runtime.root("planner-1", "research"), output)
    with Consumer.from_env() as consumer:
        assert consumer.path(receipt, output)
"""

from countersign.extras import needs_extra

try:  # the SDK's own dependencies: without them, say which extra brings them
    import cryptography  # noqa: F401
    import google.protobuf
    import google.rpc  # noqa: F401
    import grpc  # noqa: F401
    import grpc_status  # noqa: F401
except ModuleNotFoundError as missing:
    raise ModuleNotFoundError(
        f"countersign.client needs {needs_extra('grpc', missing.name)}",
        name=missing.name,
    ) from None

from countersign.client.consumer import Consumer, load_registry
from countersign.client.failover import RetryPolicy
from countersign.client.operator import AsyncOperatorClient, OperatorClient
from countersign.client.results import Grant, ImpactAnswer
from countersign.client.retry import (
    Attempt,
    IssueOutcome,
    VerifyOutcome,
    delegate_with_retry,
    verify_with_failover,
)
from countersign.client.runtime import AsyncRuntime, ClosedSession, Runtime
from countersign.client.signer import AsyncSignerClient, ChunkReceipt, SignerClient
from countersign.client.tls import TlsConfig, tls_from_env
from countersign.client.verifier import AsyncVerifierClient, VerifierClient, new_request_id
from countersign.consumer import EvidenceVerdict, OutputEmitter
from countersign.errors import ErrorCode, ServiceError
from countersign.handoff import Delegation, HandoffError

__all__ = [
    "AsyncOperatorClient",
    "AsyncRuntime",
    "AsyncSignerClient",
    "AsyncVerifierClient",
    "Attempt",
    "ChunkReceipt",
    "ClosedSession",
    "Consumer",
    "Delegation",
    "ErrorCode",
    "EvidenceVerdict",
    "Grant",
    "HandoffError",
    "ImpactAnswer",
    "IssueOutcome",
    "OperatorClient",
    "OutputEmitter",
    "RetryPolicy",
    "Runtime",
    "ServiceError",
    "SignerClient",
    "TlsConfig",
    "VerifierClient",
    "VerifyOutcome",
    "delegate_with_retry",
    "load_registry",
    "new_request_id",
    "tls_from_env",
    "verify_with_failover",
]
