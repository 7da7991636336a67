"""The Delegation handoff vector (tests/vectors/handoff.json, docs/spec.md section 18): the reference
reads it, writes the same string back, and refuses each invalid string as INVALID_ARGUMENT."""

from __future__ import annotations

import base64
import json
from pathlib import Path as FilePath

import pytest

from countersign.errors import ErrorCode
from countersign.handoff import Delegation, HandoffError

pytestmark = pytest.mark.offline

VECTOR = json.loads((FilePath(__file__).parents[1] / "vectors" / "handoff.json").read_text())


def test_the_vector_reads_back_and_writes_the_same_string() -> None:
    delegation = Delegation.from_string(VECTOR["handoff"])
    assert delegation.to_string() == VECTOR["handoff"]
    decoded = VECTOR["decoded"]
    assert (delegation.grant.grant_id, delegation.child_deployer) == (decoded["grant_id"], decoded["child_deployer"])
    assert delegation.parent.leaf.digest() == decoded["parent_digest"]
    body = VECTOR["handoff"].removeprefix("cs1.")
    assert "=" not in body
    assert json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))) == decoded


def test_a_parent_signer_may_name_its_replicas() -> None:
    replicated = VECTOR["replicated"]
    delegation = Delegation.from_string(replicated["handoff"])
    assert delegation.parent_signer == replicated["parent_signer"]
    assert delegation.to_string() == replicated["handoff"]
    assert delegation.grant == Delegation.from_string(VECTOR["handoff"]).grant


@pytest.mark.parametrize("case", VECTOR["invalid"], ids=lambda c: c["why"])
def test_each_invalid_handoff_is_refused(case: dict[str, str]) -> None:
    with pytest.raises(HandoffError) as raised:
        Delegation.from_string(case["handoff"])
    assert raised.value.code is ErrorCode.INVALID_ARGUMENT
