"""A real verifier daemon on the DynamoDB emulator: VerifySession accepts a session of up to 100
receipts (one TransactWriteItems) exactly once, refuses a larger one in accept mode with
INVALID_ARGUMENT before consuming anything, and audits it (ADR 0022)."""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path as FilePath

import pytest

from countersign.errors import ServiceError
from countersign.reasons import Reason
from countersign.records import Path
from countersign.sessions import SessionEvidence
from countersign_cli.localmesh import LocalMesh
from tests.stores.conftest import dynamodb_url

pytestmark = [pytest.mark.daemons, pytest.mark.dynamodb_emulator]


def test_sessions_up_to_the_transaction_limit_are_accepted_once(dynamodb_emulator: str, tmp_path: FilePath) -> None:
    from verifier.stores.dynamodb import ensure_table

    url = dynamodb_url(dynamodb_emulator, f"cs-test-{uuid.uuid4().hex[:12]}")
    ensure_table(url)
    mesh = LocalMesh(tmp_path / "mesh", deployers=("deployer-a",), verifier_store_url=url).setup()
    try:
        mesh.start_all()
        mesh.enrol_all()
        runtime = mesh.runtime("deployer-a")
        try:
            agent = runtime.root("writer-long", "sessions", max_children=1)
            outputs = [b"turn %d" % i for i in range(101)]
            receipts = [runtime.receipt(agent, hashlib.sha256(o).digest(), session="long").leaf for o in outputs]
        finally:
            runtime.close()
        whole = SessionEvidence(agent, tuple(receipts))
        first_hundred = SessionEvidence(agent, tuple(receipts[:100]))
        with mesh.verifier_client() as verifier:
            with pytest.raises(ServiceError) as refused:
                verifier.verify_session(whole, list(outputs))
            assert refused.value.code == "INVALID_ARGUMENT" and "at most 100" in str(refused.value)
            assert verifier.verify_session(whole, list(outputs), audit=True)  # audit is not bounded by the store
            accepted = verifier.verify_session(first_hundred, list(outputs[:100]))
            assert accepted, accepted.result
            assert accepted.session is not None and accepted.session.receipts == 100
            again = verifier.verify_session(first_hundred)
            assert (again.reason, again.result.index) == (Reason.NONCE_REPLAYED, 0)
            # The 101st receipt was not consumed by anything: it is accepted alone.
            assert verifier.verify(Path((*agent.envelopes, receipts[100])), outputs[100])
    finally:
        mesh.stop_all()
