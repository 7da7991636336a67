"""The distribution's name and its extras, for the hints that tell a user what to install.

The import name is ``countersign``; the distribution is ``countersign-mesh``, because ``countersign``
on PyPI is an unrelated password generator (ADR 0034). Every "needs the X extra" message is built
here, so that no hint names a package that installs something else.
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


def install_command(extra: str | None = None) -> str:
    """``pip install 'countersign-mesh[extra]'`` (the bare distribution for None). Raises KeyError
    for an extra the distribution does not declare: a hint must never name one that installs nothing."""
    if extra is None:
        return f"pip install {DISTRIBUTION}"
    if extra not in EXTRAS:
        raise KeyError(extra)
    return f"pip install '{DISTRIBUTION}[{extra}]'"
