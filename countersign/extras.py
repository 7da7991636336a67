"""The distribution's name and its extras, for the hints that tell a user what to install.

The import name is ``countersign``; the distribution is ``countersign-mesh``, because ``countersign``
on PyPI is an unrelated password generator (ADR 0034). Every "needs the X extra" message is built
here (:func:`needs_extra`), so that no hint names a package that installs something else.
"""

from __future__ import annotations

from typing import Final

DISTRIBUTION: Final = "countersign-mesh"
# The extras pyproject.toml declares, each with what it brings (tests/packaging checks both agree).
EXTRAS: Final = {
    "grpc": "the client SDK (countersign.client)",
    "server": "the daemons",
    "postgres": "the PostgreSQL stores",
    "aws": "the AWS KMS key backend and the DynamoDB store",
    "export": "the PROV exports",
    "langgraph": "countersign.integrations.langgraph",
    "mcp": "countersign.integrations.mcp",
    "a2a": "countersign.integrations.a2a",
    "openai-agents": "countersign.integrations.openai_agents",
}
# The top-level modules each extra installs (beside those of the extras it includes), so that a
# missing module names the extra to install; tests/core/test_extras.py holds each module to a
# distribution the extra requires.
MODULES_OF_EXTRA: Final = {
    "grpc": ("grpc", "grpc_status", "google", "cryptography"),
    "server": ("grpc_health", "grpc_reflection", "prometheus_client"),
    "postgres": ("psycopg", "psycopg_pool"),
    "aws": ("boto3", "botocore"),
    "export": ("prov", "rdflib"),
    "langgraph": ("langgraph",),
    "mcp": ("mcp", "mcp_types"),
    "a2a": ("a2a", "uvicorn"),
    "openai-agents": ("agents",),
}
_EXTRA_OF_MODULE: Final = {module: extra for extra, modules in MODULES_OF_EXTRA.items() for module in modules}


def install_command(extra: str | None = None) -> str:
    """``pip install 'countersign-mesh[extra]'`` (the bare distribution for None). Raises KeyError
    for an extra the distribution does not declare: a hint must never name one that installs nothing."""
    if extra is None:
        return f"pip install {DISTRIBUTION}"
    if extra not in EXTRAS:
        raise KeyError(extra)
    return f"pip install '{DISTRIBUTION}[{extra}]'"


def extra_bringing(module: str | None) -> str | None:
    """The extra that installs ``module`` (a dotted name: its top-level package counts), or None when
    no extra does (a module of the house itself, or of the core's own dependencies)."""
    return _EXTRA_OF_MODULE.get((module or "").partition(".")[0])


def needs_extra(extra: str, missing: str | None = None) -> str:
    """What to install, in the words every hint uses: "the 'aws' extra (no module boto3): pip install
    'countersign-mesh[aws]'". ``missing``: the module found missing (its top-level package is named),
    when known. Raises KeyError for an extra the distribution does not declare."""
    why = "" if missing is None else f" (no module {missing.partition('.')[0]})"
    return f"the '{extra}' extra{why}: {install_command(extra)}"
