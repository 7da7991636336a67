"""A signer refusal becomes its gRPC status through one table (``STATUS_OF_CODE``, at the servicer
edge): every code the signer's rules and servicer refuse with is in it, each status is the one
docs/api.md documents, and whether it may be retried is the code's (``RETRYABLE_BY_DEFAULT``)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import grpc
import pytest

from countersign._daemon.edge import STATUS_OF_CODE, refusal_error
from countersign.cosigning import Refusal
from countersign.errors import RETRYABLE_BY_DEFAULT, ErrorCode

pytestmark = pytest.mark.offline

REPO = Path(__file__).parents[2]


def _codes_named(path: Path) -> set[ErrorCode]:
    """Every ``ErrorCode.X`` the module names outside a comparison (what it may refuse with)."""
    tree = ast.parse(path.read_text())
    compared = {
        id(side) for node in ast.walk(tree) if isinstance(node, ast.Compare) for side in (node.left, *node.comparators)
    }
    return {
        ErrorCode[node.attr]
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "ErrorCode"
        and id(node) not in compared
    }


def _documented() -> dict[str, str]:
    """docs/api.md's "Errors" table: code -> status column."""
    text = (REPO / "docs" / "api.md").read_text()
    section = text[text.index("## Errors") :]
    section = section[: section.index("\n## ", 1)]
    return dict(re.findall(r"^\| `([A-Z_]+)` \| ([^|]+) \|", section, re.M))


def test_every_code_the_signer_refuses_with_has_a_status() -> None:
    named = _codes_named(REPO / "countersign" / "cosigning.py") | _codes_named(REPO / "signer" / "daemon.py")
    assert ErrorCode.GRANT_USED in named and ErrorCode.REGISTRY_STALE in named  # the scan sees both modules
    assert named - STATUS_OF_CODE.keys() == set()


def test_each_status_is_the_documented_one() -> None:
    documented = _documented()
    for code, status in STATUS_OF_CODE.items():
        if code.value in documented and not documented[code.value].startswith(("(not sent)", "any")):
            column = documented[code.value]
            assert column.split()[0] == status.name, (code, column)
            assert ("(retryable" in column) == (code in RETRYABLE_BY_DEFAULT), (code, column)
    # Nothing the signer refuses with may go undocumented.
    assert {code for code in STATUS_OF_CODE if code.value not in documented} == set()


@pytest.mark.parametrize(
    ("code", "status", "retryable"),
    [
        (ErrorCode.NOT_AUTHORISED, grpc.StatusCode.PERMISSION_DENIED, False),
        (ErrorCode.REGISTRY_STALE, grpc.StatusCode.UNAVAILABLE, True),
        (ErrorCode.PARENT_UNREACHABLE, grpc.StatusCode.UNAVAILABLE, True),
        (ErrorCode.CANCELLED, grpc.StatusCode.CANCELLED, False),
        (ErrorCode.INVALID_ARGUMENT, grpc.StatusCode.INVALID_ARGUMENT, False),
        (ErrorCode.GRANT_USED, grpc.StatusCode.FAILED_PRECONDITION, False),
        (ErrorCode.PARENT_REFUSED, grpc.StatusCode.FAILED_PRECONDITION, False),
    ],
)
def test_a_refusal_becomes_a_typed_error_with_its_status(
    code: ErrorCode, status: grpc.StatusCode, retryable: bool
) -> None:
    error = refusal_error(Refusal(code, "why"), details={"parent_code": "GRANT_USED"})
    assert (error.code, str(error), STATUS_OF_CODE[error.code], error.retryable) == (code, "why", status, retryable)
    assert error.details == {"parent_code": "GRANT_USED"}
    assert not hasattr(error, "status")  # an error is a code and a message; the edge picks the status


def test_every_code_has_a_status_in_the_one_table() -> None:
    assert set(STATUS_OF_CODE) == set(ErrorCode)
