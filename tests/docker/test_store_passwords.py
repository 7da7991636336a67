"""The PostgreSQL passwords the deployments inject (Terraform from the RDS-managed secret, see
docs/deploy.md): each daemon store takes its own variable when its URL has none (the coordinator's log
store COUNTERSIGN_LOG_STORE_PASSWORD, the signer's state COUNTERSIGN_SIGNER_STATE_PASSWORD, the verifier's
COUNTERSIGN_STORE_PASSWORD), a password in the URL wins, and none is ever shown."""

from __future__ import annotations

import pytest

from coordinator import postgres_store
from countersign._daemon.postgres import parse_postgres_url
from countersign.errors import ConfigError
from signer.stores import postgres as signer_postgres

SECRET = "s3cret-from-the-environment"
STORES = [
    pytest.param(postgres_store.PASSWORD_ENV, id="coordinator"),
    pytest.param(signer_postgres.PASSWORD_ENV, id="signer"),
]


def parsed(url: str, variable: str) -> str:
    return parse_postgres_url(url, default_schema="s", password_env=variable, application="test").conninfo


@pytest.mark.offline
@pytest.mark.parametrize("variable", STORES)
def test_password_comes_from_the_stores_own_variable_when_the_url_has_none(
    monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    monkeypatch.setenv(variable, SECRET)
    conninfo = parsed("postgresql://countersign@db.internal:5432/countersign?schema=registry", variable)
    assert f"password={SECRET}" in conninfo
    assert "schema" not in conninfo  # the store's own parameters never reach libpq


@pytest.mark.offline
@pytest.mark.parametrize("variable", STORES)
def test_a_password_in_the_url_wins(monkeypatch: pytest.MonkeyPatch, variable: str) -> None:
    monkeypatch.setenv(variable, SECRET)
    conninfo = parsed("postgresql://countersign:from-url@db.internal/countersign", variable)
    assert "password=from-url" in conninfo and SECRET not in conninfo


@pytest.mark.offline
def test_another_stores_variable_is_not_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(postgres_store.PASSWORD_ENV, raising=False)
    monkeypatch.setenv("COUNTERSIGN_STORE_PASSWORD", SECRET)  # the verifier's variable is not the coordinator's
    conninfo = parsed("postgresql://countersign@db.internal/countersign", postgres_store.PASSWORD_ENV)
    assert "password" not in conninfo  # PGPASSWORD / PGPASSFILE (.pgpass) then apply, as in docker/compose.yaml


@pytest.mark.daemons  # libpq dials a closed loopback port
@pytest.mark.parametrize("store", [postgres_store.PostgresLogStore, signer_postgres.PostgresState])
def test_an_unreachable_server_is_an_error_without_the_password(monkeypatch: pytest.MonkeyPatch, store: type) -> None:
    monkeypatch.setenv(postgres_store.PASSWORD_ENV, SECRET)
    monkeypatch.setenv(signer_postgres.PASSWORD_ENV, SECRET)
    with pytest.raises(Exception) as failed:
        store("postgresql://countersign@127.0.0.1:9/countersign?connect_timeout=1")
    assert SECRET not in str(failed.value) and SECRET not in repr(failed.value)


@pytest.mark.offline
def test_a_malformed_url_is_a_configuration_error_without_its_text() -> None:
    with pytest.raises(ConfigError) as bad:
        parsed("postgresql://u:hunter2@db.internal/db?not_a_libpq_option=1", postgres_store.PASSWORD_ENV)
    assert "hunter2" not in str(bad.value)
