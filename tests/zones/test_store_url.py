"""The store URL the harness builds for the ``fast-commit`` profile reaches libpq intact.

Regression test for a bug found by the harness: ``verifier/stores/postgres.py`` re-encoded the libpq
parameters it passes through with ``urlencode``'s default (space -> ``+``), which libpq does not
decode, so ``options=-c%20synchronous_commit%3Doff`` reached the server as ``-c+synchronous_commit=off``
and every connection failed.
"""

from __future__ import annotations

import uuid
from urllib.parse import quote, urlencode

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from tools.zones.mesh import DEFAULT_POSTGRES_URL
from verifier.stores.postgres import PostgresState, parse_url

OPTIONS = "-c synchronous_commit=off"


@pytest.mark.offline
@pytest.mark.parametrize("encode", [quote, None], ids=["percent-encoded space", "plus for space"])
def test_a_space_in_a_passed_through_parameter_survives(encode) -> None:
    query = urlencode({"options": OPTIONS, "schema": "s1"}, **({"quote_via": encode} if encode else {}))
    conninfo, schema, _ = parse_url(f"postgresql://postgres@127.0.0.1:5432/test?{query}")
    assert conninfo_to_dict(conninfo)["options"] == OPTIONS
    assert schema == "s1"


@pytest.mark.postgres
def test_the_server_receives_the_options() -> None:
    schema = f"cs_test_{uuid.uuid4().hex[:12]}"
    url = f"{DEFAULT_POSTGRES_URL}?{urlencode({'options': OPTIONS, 'schema': schema}, quote_via=quote)}"
    try:
        state = PostgresState(url)
    except Exception as exc:  # the server must be there: fail, do not skip
        pytest.fail(f"PostgreSQL at {DEFAULT_POSTGRES_URL} is needed: {exc}")
    try:
        with state._connection("test") as conn:
            assert conn.execute("SHOW synchronous_commit").fetchone() == ("off",)
    finally:
        state.close()
        with psycopg.connect(DEFAULT_POSTGRES_URL, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
