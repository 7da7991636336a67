"""A signer whose registry copy is stale refuses every signing call, receipts and local children
included (it used to refuse only roots, grants and delegations), and issues nothing."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import grpc
import pytest

from countersign.errors import ServiceError
from countersign_cli.localmesh import LocalMesh
from tests.mesh.helpers import issued_digests, poll

pytestmark = [pytest.mark.daemons, pytest.mark.slow]

STALENESS_MS = 1_500


def test_a_stale_signer_refuses_every_signing_call(make_mesh: Callable[..., LocalMesh]) -> None:
    mesh = make_mesh(staleness_ms=STALENESS_MS, heartbeat_ms=200)
    runtime = mesh.runtime("deployer-a")
    root = runtime.root("planner", "stale")
    output = hashlib.sha256(b"an answer").digest()
    runtime.receipt(root, output, session="s-1")  # fresh: signs
    assert mesh.stop("coordinator") == 0

    def refusal(call: Callable[[], object]) -> ServiceError | None:
        try:
            call()
        except ServiceError as exc:
            return exc
        return None

    poll(lambda: refusal(lambda: runtime.root("late", "stale")), timeout_s=STALENESS_MS / 1000 + 5, what="stale")
    before = issued_digests(mesh, "deployer-a")
    calls: dict[str, Callable[[], object]] = {
        "IssueRoot": lambda: runtime.root("late", "stale"),
        "IssueLocalChild": lambda: runtime.local_child(root, "helper"),
        "IssueReceipt": lambda: runtime.receipt(root, output, session="s-1"),
        "OpenGrant": lambda: runtime.open_grant(root, "deployer-b"),
    }
    for method, call in calls.items():
        error = refusal(call)
        assert error is not None, f"{method} signed on a stale registry"
        assert (error.code, error.status, error.retryable) == ("REGISTRY_STALE", grpc.StatusCode.UNAVAILABLE, True)
    assert issued_digests(mesh, "deployer-a") == before
    runtime.close()
