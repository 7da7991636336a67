"""The runtime's calls as they travel on a ``RuntimeCalls`` lane: one unary method per oneof field of
``RuntimeCall``. Shared by the client that sends them and the signer that answers them."""

from __future__ import annotations

from typing import Any

from countersign._proto.v1 import signer_pb2

# The oneof field of RuntimeCall that carries each runtime method's request, and back.
RUNTIME_CALLS = {
    "IssueRoot": "issue_root",
    "IssueLocalChild": "issue_local_child",
    "IssueReceipt": "issue_receipt",
    "OpenGrant": "open_grant",
    "AcceptDelegation": "accept_delegation",
    "CloseSession": "close_session",
}
RUNTIME_METHODS = {field: method for method, field in RUNTIME_CALLS.items()}


def runtime_answer(method: str, response: Any) -> signer_pb2.RuntimeAnswer:
    """The RuntimeAnswer that carries ``method``'s unary response."""
    if method == "OpenGrant":
        return signer_pb2.RuntimeAnswer(grant=response)
    return signer_pb2.RuntimeAnswer(issued=response)
