"""The A2A binding's pure parts: which bytes an artifact's receipt signs, the card's extension, the
message's delegation and a failed task's typed refusal. No sockets."""

from __future__ import annotations

import pytest
from a2a.types import AgentCapabilities, AgentCard, Artifact, Message, Part, Task, TaskState, TaskStatus
from hypothesis import given
from hypothesis import strategies as st

from countersign.errors import ErrorCode, MalformedError
from countersign.integrations.a2a import (
    DELEGATION_KEY,
    ERROR_KEY,
    EXTENSION_URI,
    RECEIPT_KEY,
    A2ARefusal,
    agent_extension,
    artifact_bytes,
    artifact_receipt,
    card_deployer,
    delegated_message,
    message_delegation,
    task_refusal,
)

pytestmark = pytest.mark.offline


@given(st.text())
def test_a_text_artifact_signs_its_text_as_utf8(text: str) -> None:
    assert artifact_bytes(Artifact(artifact_id="a", parts=[Part(text=text)])) == text.encode("utf-8")


@given(st.binary())
def test_a_raw_artifact_signs_its_bytes_as_they_are_even_after_the_wire(data: bytes) -> None:
    artifact = Artifact(artifact_id="a", parts=[Part(raw=data)])
    assert artifact_bytes(Artifact.FromString(artifact.SerializeToString())) == data


def test_any_other_shape_is_malformed() -> None:
    for parts in ([], [Part(text="a"), Part(text="b")], [Part(url="https://example.com/x")]):
        with pytest.raises(MalformedError):
            artifact_bytes(Artifact(artifact_id="a", parts=parts))
    bare = Artifact(artifact_id="a", parts=[Part(text="x")])
    with pytest.raises(MalformedError):
        artifact_receipt(bare)
    bare.metadata.update({RECEIPT_KEY: 7})
    with pytest.raises(MalformedError):
        artifact_receipt(bare)
    bare.metadata.update({RECEIPT_KEY: "x" * (64 * 1024 + 1)})
    with pytest.raises(MalformedError):
        artifact_receipt(bare)


def test_the_card_advertises_the_deployer_as_an_extension() -> None:
    extension = agent_extension("deployer-b")
    assert extension.uri == EXTENSION_URI and extension.required
    card = AgentCard(name="x", capabilities=AgentCapabilities(extensions=[extension]))
    assert card_deployer(AgentCard.FromString(card.SerializeToString())) == "deployer-b"
    assert card_deployer(AgentCard(name="x")) is None


def test_the_delegation_rides_in_the_message_metadata_as_a_string() -> None:
    message = delegated_message("hi", "cs1.abc")
    assert message_delegation(Message.FromString(message.SerializeToString())) == "cs1.abc"
    assert message_delegation(Message(message_id="m")) is None
    message.metadata.update({DELEGATION_KEY: ["cs1.abc"]})
    with pytest.raises(A2ARefusal) as caught:
        message_delegation(message)
    assert caught.value.code is ErrorCode.INVALID_ARGUMENT


def failed(error: dict[str, str] | str | None) -> Task:
    task = Task(id="t", status=TaskStatus(state=TaskState.TASK_STATE_FAILED))
    if error is not None:
        task.status.message.metadata.update({ERROR_KEY: error})
    return task


def test_a_failed_task_reads_back_as_its_typed_refusal() -> None:
    refusal = task_refusal(failed({"code": "GRANT_EXPIRED", "message": "too late"}))
    assert refusal is not None and refusal.code is ErrorCode.GRANT_EXPIRED and str(refusal) == "too late"
    # A code outside the closed list, or no Countersign error at all, is UNKNOWN, never a crash.
    assert task_refusal(failed({"code": "NO_SUCH_CODE"})).code is ErrorCode.UNKNOWN  # type: ignore[union-attr]
    assert task_refusal(failed(None)).code is ErrorCode.UNKNOWN  # type: ignore[union-attr]
    assert task_refusal(failed("GRANT_EXPIRED")).code is ErrorCode.UNKNOWN  # type: ignore[union-attr]
    assert task_refusal(Task(id="t", status=TaskStatus(state=TaskState.TASK_STATE_COMPLETED))) is None


def test_a_compact_receipt_reads_back_as_its_path_json() -> None:
    from countersign.compact import compact_path
    from countersign.records import Construction
    from countersign.samples import SampleMesh

    sample = SampleMesh.create(["deployer-a"], seed=b"a2a-offline")
    path = sample.issue_path(Construction.SIGNED_DAG, ["deployer-a"], b"out", now_ms=1_000_000)
    artifact = Artifact(artifact_id="a", parts=[Part(text="out")])
    artifact.metadata.update({RECEIPT_KEY: compact_path(path)})
    assert artifact_receipt(artifact) == path.to_bytes()
    artifact.metadata.update({RECEIPT_KEY: compact_path(path) + "A"})
    with pytest.raises(MalformedError):
        artifact_receipt(artifact)
