"""The first hour: every subcommand says what it does, every flag what it means, and ``serve --help``
lists the daemon's settings (issue 21)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from countersign.admission import StatementKind
from countersign_cli.main import build_parser
from countersign_cli.services import STATEMENT_WORDS, config_class
from countersign_cli.settings_help import meanings, settings

pytestmark = pytest.mark.offline

DAEMONS = ("coordinator", "signer", "verifier")


def _commands(
    parser: argparse.ArgumentParser, name: str = "countersign"
) -> Iterator[tuple[str, argparse.ArgumentParser, str | None]]:
    """Every parser of the tree: its command line, the parser and the line its parent lists it with."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            listed = {choice.dest: choice.help for choice in action._choices_actions}
            for sub_name, sub in action.choices.items():
                yield f"{name} {sub_name}", sub, listed.get(sub_name)
                yield from _commands(sub, f"{name} {sub_name}")


def test_every_subcommand_has_a_description_and_every_flag_a_help_text() -> None:
    missing = []
    commands = list(_commands(build_parser()))
    assert len(commands) > 30  # the walk reaches the nested actions (operator enrol, pki issue, ...)
    for name, parser, listed in commands:
        if not listed:
            missing.append(f"{name}: not described in its parent's list")
        if not parser.description:
            missing.append(f"{name}: no description in its own --help")
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction | argparse._VersionAction | argparse._SubParsersAction):
                continue
            if not action.help or action.help is argparse.SUPPRESS:
                missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}: no help")
    assert not missing, "\n".join(missing)


def _subparser(*names: str) -> argparse.ArgumentParser:
    parser = build_parser()
    for name in names:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[name]
    return parser


NAMED_FLAGS = [
    ("conformance", "--trials"),
    ("conformance", "--seed"),
    ("verify", "--clock-skew-ms"),
    ("verify-session", "--clock-skew-ms"),
]


@pytest.mark.parametrize(("command", "flag"), NAMED_FLAGS)
def test_the_flags_the_issue_named_say_what_they_do(command: str, flag: str) -> None:
    action = next(a for a in _subparser(command)._actions if flag in a.option_strings)
    assert action.help and len(action.help.split()) >= 5, action.help


@pytest.mark.parametrize("daemon", DAEMONS)
def test_serve_help_lists_every_setting_with_its_meaning_and_default(
    daemon: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = settings(config_class(daemon))
    meaning = meanings()
    assert {name for name, _, _ in rows} <= set(meaning), "a setting without a meaning in settings_help"
    with pytest.raises(SystemExit):
        build_parser().parse_args([daemon, "serve", "--help"])
    text = capsys.readouterr().out
    for name, _env, default in rows:
        line = next((line for line in text.splitlines() if line.split()[:1] == [name]), None)
        assert line is not None, f"{daemon} serve --help does not list {name}"
        assert meaning[name] in line and f"(default: {default})" in line, line


def test_a_table_setting_is_listed_with_its_environment_variable() -> None:
    rows = {name: env for name, env, _ in settings(config_class("verifier"))}
    assert rows["limits.receive_budget_bytes"] == "COUNTERSIGN_LIMITS_RECEIVE_BUDGET_BYTES"
    assert rows["store_url"] == "COUNTERSIGN_STORE_URL"


@pytest.mark.parametrize(
    ("action", "kind"),
    [("enrol", StatementKind.ENROL_DEPLOYER), ("add-key", StatementKind.ADD_KEY),
     ("retire-key", StatementKind.RETIRE_KEY), ("revoke-key", StatementKind.REVOKE_KEY)],
)  # fmt: skip
def test_operator_statement_help_names_what_the_statement_does(action: str, kind: StatementKind) -> None:
    operator = _subparser("operator")
    actions = next(a for a in operator._actions if isinstance(a, argparse._SubParsersAction))
    listed = {choice.dest: choice.help for choice in actions._choices_actions}
    assert listed[action] is not None and listed[action].startswith(STATEMENT_WORDS[kind]), listed[action]
    assert kind.value in listed[action]  # the wire name too, as the statement file and the log show it
