"""What a request id keeps (spec 21.2): the answer without the path of the record it issued (the record
keeps the path), and a retry gets the whole first answer back, path included; for every runtime call."""

from __future__ import annotations

import hashlib
from typing import Any

import prometheus_client
import pytest

from bench.issuance import _Context, _Registry
from countersign._proto.v1 import signer_pb2
from countersign.client.tls import TlsConfig
from countersign.records import Path
from countersign.samples import SampleMesh
from countersign.signer_state import StateReads
from signer.config import SignerConfig
from signer.daemon import SignerMetrics, SignerService
from signer.stores import open_signer_state

pytestmark = pytest.mark.offline


def service() -> tuple[SignerService, Any]:
    mesh = SampleMesh.create(["deployer-a"], seed=b"request-answers")
    config = SignerConfig(
        deployer="deployer-a", signer_key="", operator_public_key="", coordinator="", registry_cache="",
        tls=TlsConfig(insecure_loopback=True),
    )  # fmt: skip
    follower = _Registry(mesh.registry)
    state = open_signer_state("memory:")
    metrics = SignerMetrics(prometheus_client.CollectorRegistry(), follower)  # type: ignore[arg-type]
    return SignerService(config, mesh.signers["deployer-a"], state, follower, metrics), state  # type: ignore[arg-type]


def test_a_retry_gets_the_whole_answer_and_the_path_is_kept_once() -> None:
    signer, state = service()
    context: Any = _Context()
    agent = signer_pb2.AgentFields(instance="writer", system="answers", ttl_ms=3_600_000, max_children=4)
    calls = [
        ("IssueRoot", signer_pb2.IssueRootRequest(agent=agent, request_id="root-1")),
    ]
    root = signer.IssueRoot(calls[0][1], context)
    assert signer.IssueRoot(calls[0][1], context) == root
    receipt_request = signer_pb2.IssueReceiptRequest(
        parent_path=root.path, output_sha256=hashlib.sha256(b"out").digest(), request_id="receipt-1"
    )
    child_request = signer_pb2.IssueLocalChildRequest(parent_path=root.path, agent=agent, request_id="child-1")
    close_request = signer_pb2.CloseSessionRequest(parent_path=root.path, request_id="close-1")
    for method, request in (("IssueReceipt", receipt_request), ("IssueLocalChild", child_request),
                            ("CloseSession", close_request)):  # fmt: skip
        first = getattr(signer, method)(request, context)
        again = getattr(signer, method)(request, context)
        assert again == first and again.path, method  # the path comes back with the answer
        kept = state.read(StateReads(request=request.request_id)).request
        assert kept is not None and kept.record == first.record_digest, method
        assert first.path not in kept.answer and len(kept.answer) < 200, method  # kept once, with the record
        assert state.read(StateReads(issued=kept.record)).issued == first.path
    assert Path.from_bytes(root.path).leaf.digest() == root.record_digest
