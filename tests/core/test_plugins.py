"""One registry per kind of plug-in (countersign.plugins, ADR 0038): the command line's choices and help
come from the registries, a plug-in added to one shows up there with nothing else changed, and a
missing extra is one hint naming it, built by countersign.extras."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest

from coordinator.log_stores import LOG_STORE_FOR_SCHEME, open_log_store
from countersign.errors import ConfigError, SignerError
from countersign.export import EXPORTER_FOR_FORMAT, FORMATS, ExtraMissing, export_path
from countersign.extras import MODULES_OF_EXTRA, install_command, needs_extra
from countersign.plugins import Plugin, described, open_plugin
from countersign.records import Construction
from countersign.samples import SampleMesh
from countersign_cli.main import build_parser
from countersign_cli.settings_help import plugin_meanings
from signer.backends import SIGNER_FOR_URI_SCHEME, load_signer
from signer.stores import STATE_FOR_SCHEME, open_signer_state
from verifier.stores import STORE_FOR_SCHEME, StoreConfigError, open_store

pytestmark = pytest.mark.offline

# Each kind: its registry, how it is opened, the error it raises, and a URL of each scheme with an extra.
KINDS: dict[str, tuple[Mapping[str, Plugin[Any]], Callable[[str], Any], type[Exception]]] = {
    "verifier store": (STORE_FOR_SCHEME, open_store, StoreConfigError),
    "signer state": (STATE_FOR_SCHEME, open_signer_state, ConfigError),
    "registry log": (LOG_STORE_FOR_SCHEME, open_log_store, ConfigError),
    "key backend": (SIGNER_FOR_URI_SCHEME, load_signer, SignerError),
}
URL_OF_SCHEME = {
    "postgresql": "postgresql://nobody@127.0.0.1:1/none?schema=x",
    "postgres": "postgres://nobody@127.0.0.1:1/none?schema=x",
    "dynamodb": "dynamodb://table?region=eu-west-1",
    "awskms": "awskms:alias/countersign/none?region=eu-west-1",
}


def _subparser(*names: str) -> argparse.ArgumentParser:
    parser = build_parser()
    for name in names:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[name]
    return parser


def _help_of(parser: argparse.ArgumentParser, flag: str) -> argparse.Action:
    return next(a for a in parser._actions if flag in a.option_strings)


def test_the_export_formats_are_the_registrys_and_the_command_lines_choices() -> None:
    assert tuple(EXPORTER_FOR_FORMAT) == FORMATS
    choice = _help_of(_subparser("export"), "--format")
    assert tuple(choice.choices or ()) == FORMATS
    for plugin in EXPORTER_FOR_FORMAT.values():
        assert plugin.described() in (choice.help or "")


@pytest.mark.parametrize(
    ("command", "flag", "registry"),
    [
        (("verify",), "--state", STORE_FOR_SCHEME),
        (("impact",), "--state", STORE_FOR_SCHEME),
        (("public-key",), "--key", SIGNER_FOR_URI_SCHEME),
        (("key", "endorse"), "--signer-key", SIGNER_FOR_URI_SCHEME),
    ],
)
def test_a_flag_naming_a_plugin_lists_its_registry(
    command: tuple[str, ...], flag: str, registry: Mapping[str, Plugin[Any]]
) -> None:
    text = _help_of(_subparser(*command), flag).help or ""
    for plugin in registry.values():
        assert plugin.described() in text, f"{' '.join(command)} {flag} does not list {plugin.usage}"


@pytest.mark.parametrize(
    ("setting", "registry"),
    [
        ("store_url", STORE_FOR_SCHEME),
        ("state_url", STATE_FOR_SCHEME),
        ("log_store", LOG_STORE_FOR_SCHEME),
        ("signer_key", SIGNER_FOR_URI_SCHEME),
    ],
)
def test_a_setting_naming_a_plugin_lists_its_registry(setting: str, registry: Mapping[str, Plugin[Any]]) -> None:
    meaning = plugin_meanings()[setting]
    for plugin in registry.values():
        assert plugin.described() in meaning
    for extra in {p.extra for p in registry.values()} - {None}:
        assert f"the '{extra}' extra" in meaning


def test_a_plugin_added_to_a_registry_reaches_the_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """One registry line is all the command line needs: the new scheme is in the help, the extra too,
    and the URL opens through it."""
    opened: list[str] = []

    def make(url: str) -> Any:
        opened.append(url)
        return "a store"

    plugin = Plugin(make, "redis://host/0", "an example store", "aws")
    monkeypatch.setitem(STORE_FOR_SCHEME, "redis", plugin)  # type: ignore[index]
    assert "redis://host/0 (an example store; the 'aws' extra)" in (
        _help_of(_subparser("verify"), "--state").help or ""
    )
    assert open_store("redis://host/0") == "a store" and opened == ["redis://host/0"]
    monkeypatch.setitem(EXPORTER_FOR_FORMAT, "dot", Plugin(lambda p, o, s: b"digraph{}", "dot", "Graphviz"))  # type: ignore[index]
    assert "dot" in (_help_of(_subparser("export"), "--format").choices or ())


def test_names_that_share_a_plugin_are_described_once() -> None:
    assert STORE_FOR_SCHEME["postgres"] is STORE_FOR_SCHEME["postgresql"]
    assert described(STORE_FOR_SCHEME).count("postgresql://") == 1


def test_a_plugin_naming_an_extra_that_does_not_exist_is_refused() -> None:
    with pytest.raises(ValueError, match="no extra"):
        Plugin(lambda url: url, "x://", "x", "postgresql")


@pytest.mark.parametrize("kind", KINDS)
def test_an_unknown_scheme_lists_the_known_ones(kind: str) -> None:
    registry, open_url, error = KINDS[kind]
    with pytest.raises(error, match="unknown") as raised:
        open_url("nosuchscheme://x")
    assert all(name in str(raised.value) for name in registry)


@pytest.fixture
def without_extra(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], None]]:
    """Makes an extra's modules unimportable and forgets the house's own backend modules, so that a
    plug-in's ``make`` imports its module afresh and meets the missing package. Afterwards every module
    is as before: those imported meanwhile are forgotten, the others restored."""
    before = set(sys.modules)

    def block(extra: str) -> None:
        for name in MODULES_OF_EXTRA[extra]:
            for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
                monkeypatch.delitem(sys.modules, loaded)
            monkeypatch.setitem(sys.modules, name, None)  # type: ignore[arg-type]
        registries = {"verifier.stores", "signer.stores", "signer.backends", "coordinator.log_stores"}
        for loaded in list(sys.modules):
            backend = loaded.startswith(("verifier.stores.", "signer.stores.", "signer.backends.", "coordinator."))
            if (backend or loaded.startswith("countersign._daemon.")) and loaded not in registries:
                monkeypatch.delitem(sys.modules, loaded)

    yield block
    for loaded in set(sys.modules) - before:
        del sys.modules[loaded]


def _plugins_with_an_extra() -> list[tuple[str, str]]:
    return [(kind, name) for kind, (registry, _, _) in KINDS.items() for name, p in registry.items() if p.extra]


@pytest.mark.parametrize(("kind", "scheme"), _plugins_with_an_extra())
def test_a_missing_extra_is_one_hint_naming_it(without_extra: Callable[[str], None], kind: str, scheme: str) -> None:
    registry, open_url, error = KINDS[kind]
    extra = registry[scheme].extra
    assert extra is not None
    without_extra(extra)
    with pytest.raises(error) as raised:
        open_url(URL_OF_SCHEME[scheme])
    message = str(raised.value)
    missing = next(m for m in MODULES_OF_EXTRA[extra] if f"(no module {m}" in message)
    assert needs_extra(extra, missing) in message, message


def test_a_missing_export_extra_is_the_same_hint(without_extra: Callable[[str], None]) -> None:
    without_extra("export")
    mesh = SampleMesh.create(["d-a", "d-b"])
    path = mesh.issue_path(Construction.SIGNED_DAG, ["d-a", "d-b"], b"x", now_ms=1_780_000_000_000)
    assert export_path(path, "dsse") and export_path(path, "in-toto")
    with pytest.raises(ExtraMissing) as raised:
        export_path(path, "prov-o")
    assert needs_extra("export", "prov") in str(raised.value)


def test_a_missing_module_of_the_house_itself_is_a_bug_not_a_hint() -> None:
    def broken(url: str) -> Any:
        raise ModuleNotFoundError("no module named 'verifier.stores.nothing'", name="verifier.stores.nothing")

    def needs_psycopg(url: str) -> Any:
        raise ModuleNotFoundError("no module named 'psycopg'", name="psycopg")

    table = {"broken": Plugin(broken, "broken:", "a bug"), "pg": Plugin(needs_psycopg, "pg:", "x", "postgres")}
    with pytest.raises(ModuleNotFoundError):
        open_plugin(table, "broken", "broken:", kind="store URL scheme", error=ValueError)
    with pytest.raises(ValueError, match="needs the 'postgres' extra") as raised:
        open_plugin(table, "pg", "pg:", kind="store URL scheme", error=ValueError)
    assert str(raised.value).endswith(install_command("postgres"))
