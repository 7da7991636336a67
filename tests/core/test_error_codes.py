"""One closed list of error codes: ``ErrorCode``, the table in docs/api.md and the comment in
common.proto name the same codes, and every code the source raises is a member."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from countersign.admission import AdmissionError
from countersign.client.errors import ServiceError
from countersign.errors import ErrorCode

pytestmark = pytest.mark.offline

REPO = Path(__file__).parents[2]
CODE = re.compile(r"\b[A-Z][A-Z_]{3,}[A-Z]\b")
EVERY = {code.value for code in ErrorCode}


def test_the_api_table_lists_exactly_the_enum() -> None:
    text = (REPO / "docs" / "api.md").read_text()
    section = text[text.index("## Errors") :]
    section = section[: section.index("\n## ", 1)]
    listed = re.findall(r"^\| `([A-Z_]+)` \|", section, re.M)
    assert len(listed) == len(set(listed)), "a code is listed twice"
    assert set(listed) == EVERY


def test_common_proto_lists_exactly_the_enum() -> None:
    text = (REPO / "proto" / "countersign" / "v1" / "common.proto").read_text()
    comment = text[text.index("// The list is closed") :]
    listed = set(CODE.findall(comment)) - {"ErrorCode"}
    assert listed == EVERY


def _raised_codes() -> list[tuple[str, int, str]]:
    """Every string literal given as the first argument of ServiceError, AdmissionError (and its
    subclasses) or a signer refusal helper in the product's source."""
    makers = {
        "ServiceError",
        "AdmissionError",
        "ForkDetected",
        "RollbackDetected",
        "CheckpointError",
        "_refuse",
        "Refusal",
    }
    found = []
    for top in ("countersign", "countersign_cli", "signer", "verifier", "coordinator"):
        for path in (REPO / top).rglob("*.py"):
            if "_proto" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.Call) or not node.args:
                    continue
                name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
                first = node.args[0]
                if name in makers and isinstance(first, ast.Constant) and isinstance(first.value, str):
                    found.append((str(path.relative_to(REPO)), node.lineno, first.value))
    return found


def test_every_code_raised_in_the_source_is_a_member() -> None:
    raised = _raised_codes()
    assert raised, "the scan found no raise sites: it is looking in the wrong place"
    outside = [site for site in raised if site[2] not in EVERY]
    assert not outside, f"codes outside ErrorCode: {outside}"


@pytest.mark.parametrize("make", [lambda c: ServiceError(c, "m"), lambda c: AdmissionError(c, "m")])
def test_a_name_outside_the_list_cannot_be_raised(make: object) -> None:
    with pytest.raises(ValueError, match="NOT_A_CODE"):
        make("NOT_A_CODE")  # type: ignore[operator]


def test_a_client_maps_an_unknown_reason_into_the_list() -> None:
    assert ErrorCode.of("SOMETHING_NEW") is ErrorCode.UNKNOWN
    assert ErrorCode.of("GRANT_USED") is ErrorCode.GRANT_USED
