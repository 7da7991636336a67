"""The PostgreSQL passwords the deployments inject (Terraform from the RDS-managed secret, see
docs/deploy.md): the coordinator's log store takes COUNTERSIGN_LOG_STORE_PASSWORD when its URL has
none, as the verifier store takes COUNTERSIGN_STORE_PASSWORD, and neither ever shows it."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from coordinator import postgres_store
from countersign.errors import ConfigError, StateUnavailable

pytestmark = pytest.mark.offline

SECRET = "s3cret-from-the-environment"


class Refused(psycopg.OperationalError):
    pass


@pytest.fixture
def connects(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any]]]:
    """Record every psycopg.connect of the coordinator store, and refuse it (no server needed)."""
    calls: list[tuple[str, dict[str, Any]]] = []

    def fake_connect(conninfo: str, **kwargs: Any) -> None:
        calls.append((conninfo, kwargs))
        raise Refused('connection to server at "db.internal" failed: password authentication failed')

    monkeypatch.setattr(postgres_store.psycopg, "connect", fake_connect)
    return calls


def test_password_comes_from_the_environment_when_the_url_has_none(
    monkeypatch: pytest.MonkeyPatch, connects: list[tuple[str, dict[str, Any]]]
) -> None:
    monkeypatch.setenv("COUNTERSIGN_LOG_STORE_PASSWORD", SECRET)
    with pytest.raises(ConfigError) as refused:
        postgres_store.PostgresLogStore("postgresql://countersign@db.internal:5432/countersign?schema=registry")
    ((conninfo, kwargs),) = connects
    assert kwargs["password"] == SECRET
    assert SECRET not in conninfo, "the password is handed to libpq, not written into the URL"
    assert "schema" not in conninfo
    assert SECRET not in str(refused.value)


def test_a_password_in_the_url_wins(
    monkeypatch: pytest.MonkeyPatch, connects: list[tuple[str, dict[str, Any]]]
) -> None:
    monkeypatch.setenv("COUNTERSIGN_LOG_STORE_PASSWORD", SECRET)
    with pytest.raises(ConfigError):
        postgres_store.PostgresLogStore("postgresql://countersign:from-url@db.internal/countersign")
    ((_, kwargs),) = connects
    assert "password" not in kwargs


def test_without_the_variable_libpq_decides(
    monkeypatch: pytest.MonkeyPatch, connects: list[tuple[str, dict[str, Any]]]
) -> None:
    monkeypatch.delenv("COUNTERSIGN_LOG_STORE_PASSWORD", raising=False)
    monkeypatch.setenv("COUNTERSIGN_STORE_PASSWORD", SECRET)  # the verifier's variable is not the coordinator's
    with pytest.raises(ConfigError):
        postgres_store.PostgresLogStore("postgresql://countersign@db.internal/countersign")
    ((_, kwargs),) = connects
    assert "password" not in kwargs  # PGPASSWORD / PGPASSFILE (.pgpass) then apply, as in docker/compose.yaml


def test_the_password_never_reaches_a_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COUNTERSIGN_LOG_STORE_PASSWORD", SECRET)

    def fake_connect(conninfo: str, **kwargs: Any) -> None:
        raise Refused(f"connection failed for {kwargs.get('user', 'countersign')}")

    monkeypatch.setattr(postgres_store.psycopg, "connect", fake_connect)
    store = object.__new__(postgres_store.PostgresLogStore)
    store.__dict__.update(
        _url="postgresql://countersign@db.internal/countersign",
        _extra={"password": SECRET},
        _timeout=1,
        _conn=None,
    )
    with pytest.raises(StateUnavailable) as failed:
        store._connection()
    assert SECRET not in str(failed.value) and SECRET not in repr(failed.value)
    assert SECRET not in repr(store.__dict__.get("_url"))


def test_a_malformed_url_is_a_configuration_error_without_its_text(
    connects: list[tuple[str, dict[str, Any]]],
) -> None:
    with pytest.raises(ConfigError) as bad:
        postgres_store.PostgresLogStore("postgresql://u:hunter2@db.internal/db?not_a_libpq_option=1")
    assert "hunter2" not in str(bad.value)
    assert connects == [], "refused before any connection attempt"
