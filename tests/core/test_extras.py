"""countersign.extras names, for each extra, the modules it installs: a hint built from a missing module
names the extra that really brings it (the distribution's own metadata, read from this install)."""

from __future__ import annotations

from importlib import metadata

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from countersign.extras import DISTRIBUTION, EXTRAS, MODULES_OF_EXTRA, extra_bringing, install_command, needs_extra

pytestmark = pytest.mark.offline


def distributions_of(extra: str) -> set[str]:
    """Every distribution that installing ``countersign-mesh[extra]`` brings, its dependencies included."""
    found: set[str] = set()
    pending = [(DISTRIBUTION, {extra})]
    while pending:
        name, extras = pending.pop()
        for text in metadata.requires(name) or []:
            requirement = Requirement(text)
            wanted = requirement.marker is None or any(
                requirement.marker.evaluate({"extra": e}) for e in (extras or {""})
            )
            key = canonicalize_name(requirement.name)
            if not wanted or (key in found and not requirement.extras):
                continue
            found.add(key)
            pending.append((requirement.name, set(requirement.extras)))
    return found


def test_every_extra_names_its_modules() -> None:
    assert set(MODULES_OF_EXTRA) == set(EXTRAS)
    every = [module for modules in MODULES_OF_EXTRA.values() for module in modules]
    assert len(every) == len(set(every)), "a module named by two extras"


@pytest.mark.parametrize("extra", sorted(MODULES_OF_EXTRA))
def test_each_module_comes_with_its_extra(extra: str) -> None:
    brought = distributions_of(extra)
    owners = metadata.packages_distributions()
    for module in MODULES_OF_EXTRA[extra]:
        assert module in owners, f"{module}: installed by no distribution here (make venv installs every extra)"
        assert {canonicalize_name(d) for d in owners[module]} & brought, f"the '{extra}' extra does not bring {module}"


def test_the_core_needs_no_extra() -> None:
    assert "nacl" not in [m for modules in MODULES_OF_EXTRA.values() for m in modules]
    assert extra_bringing("nacl.signing") is None and extra_bringing("countersign.client") is None


def test_a_hint_names_the_extra_and_the_command_to_install_it() -> None:
    assert extra_bringing("botocore.exceptions") == "aws"
    assert needs_extra("aws", "botocore.exceptions") == (
        "the 'aws' extra (no module botocore): pip install 'countersign-mesh[aws]'"
    )
    assert needs_extra("export") == f"the 'export' extra: {install_command('export')}"
    with pytest.raises(KeyError):
        needs_extra("postgresql")
