"""Shared test configuration. Tiers are markers (declared in pyproject.toml); fixtures live beside their tests.

Every test carries a tier marker, usually the file's ``pytestmark``: ``offline`` (pure: no sockets, no
processes, no files outside tmp_path) or what it needs (``daemons``, ``postgres``, ``dynamodb_emulator``,
``netns``, ``containers``). A test without one fails, and so does a test marked offline together with another
tier. Offline tests run under :data:`tests.offline_guard.GUARD`: opening a socket or starting a process
while one is set up or runs fails it.
"""

from __future__ import annotations

import os
from collections.abc import Generator

import pytest
from hypothesis import HealthCheck, settings

from tests.offline_guard import GUARD

settings.register_profile(
    "ci",
    max_examples=int(os.environ.get("COUNTERSIGN_HYPOTHESIS_EXAMPLES", "200")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("ci")

# "containers": the container tier (tests/docker), run last by `make containers` with its own engine.
TIER_MARKERS = ("offline", "daemons", "postgres", "dynamodb_emulator", "netns", "containers")


def tiers_of(item: pytest.Item) -> set[str]:
    return {mark.name for mark in item.iter_markers() if mark.name in TIER_MARKERS}


def _is_offline(item: pytest.Item) -> bool:
    return tiers_of(item) == {"offline"}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    tiers = tiers_of(item)
    if not tiers:
        pytest.fail(f"no tier marker: give the file a pytestmark with one of {', '.join(TIER_MARKERS)}", False)
    if "offline" in tiers and len(tiers) > 1:
        others = ", ".join(sorted(tiers - {"offline"}))
        pytest.fail(f"marked offline and {others}: an offline test needs none of the other tiers", False)
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    return (yield from _guarded(item))


# Teardown stays unwatched: a module or session fixture that a test of another tier set up is torn down
# with whichever test happens to run last, and that may be an offline one.
def _guarded(item: pytest.Item) -> Generator[None, None, None]:
    if not _is_offline(item):
        return (yield)
    try:
        with GUARD.watching():
            return (yield)
    finally:
        refused = GUARD.take()
        if refused:
            pytest.fail("offline test reached outside the process:\n  " + "\n  ".join(refused), False)
