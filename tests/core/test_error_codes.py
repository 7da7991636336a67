"""One closed list of error codes: ``ErrorCode``, the table in docs/api.md and the comment in
common.proto name the same codes, and every code the source raises is a member."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from countersign.admission import AdmissionError
from countersign.errors import ErrorCode, ServiceError

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
        "IntegrationRefusal",
        "A2ARefusal",
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


# --- the status of a code: chosen once, at the servicer edge, from one table --------------------------

ERROR_MAKERS = {"ServiceError", "HandoffError", "IntegrationRefusal", "A2ARefusal", "EvidenceMissing"}


def test_the_edge_table_gives_every_code_one_status_and_the_api_table_agrees() -> None:
    from countersign._daemon.edge import STATUS_OF_CODE

    assert set(STATUS_OF_CODE) == set(ErrorCode)
    text = (REPO / "docs" / "api.md").read_text()
    section = text[text.index("## Errors") :]
    rows = dict(re.findall(r"^\| `([A-Z_]+)` \| ([^|]+) \|", section[: section.index("\n## ", 1)], re.M))
    documented = {code: cell.split()[0] for code, cell in rows.items() if cell.split()[0] not in ("(not", "any")}
    assert documented == {code: STATUS_OF_CODE[ErrorCode(code)].name for code in documented}
    assert len(documented) >= len(ErrorCode) - 3  # ROLLBACK, NOT_SERVED (never sent), UNKNOWN (any)


def test_an_error_is_a_code_and_a_message_wherever_it_is_raised() -> None:
    """No product module builds an error with a gRPC status: ServiceError and its subclasses take a
    code, a message and keywords; a module that imports grpc does not use it to make one (the edge
    picks the status; a client's ReceivedError records the one it received)."""
    built_with_status = []
    for top in ("countersign", "countersign_cli", "signer", "verifier", "coordinator"):
        for path in (REPO / top).rglob("*.py"):
            if "_proto" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.Call):
                    continue
                name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
                if name not in ERROR_MAKERS:
                    continue
                arguments = [*node.args, *(k.value for k in node.keywords)]
                mentions = {n.id for a in arguments for n in ast.walk(a) if isinstance(n, ast.Name)}
                if len(node.args) > 2 or "grpc" in mentions:
                    built_with_status.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert built_with_status == []


def test_the_handoff_parser_and_the_error_import_no_grpc() -> None:
    for module in ("countersign/handoff.py", "countersign/errors.py", "countersign/consumer.py"):
        tree = ast.parse((REPO / module).read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not any(name.split(".")[0] == "grpc" for name in imported), module


@pytest.mark.parametrize(
    ("code", "retryable"),
    [(ErrorCode.GRANT_WRONG_CHILD, False), (ErrorCode.REGISTRY_STALE, True), (ErrorCode.UNAVAILABLE, True)],
)
def test_retryable_defaults_to_the_codes_and_can_be_said(code: ErrorCode, retryable: bool) -> None:
    assert ServiceError(code, "m").retryable is retryable
    assert ServiceError(code, "m", retryable=not retryable).retryable is not retryable
