"""``countersign impact`` as a user runs it, on a verifier store file: JSON and text reports,
--since, --mark, and one-line usage errors (exit 2, no traceback)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from countersign.state import CoSigner, RecordUse, VerdictEntry
from verifier.stores import open_store
from verifier.stores.sqlite import SqliteState

pytestmark = pytest.mark.daemons  # runs the command line as a child process

T0 = 1_780_000_000_000  # 2026-05-28T20:26:40Z
A_KEY, B_KEY = "ed25519:" + "a" * 32, "ed25519:" + "b" * 32
ROOT = RecordUse("sha256:" + "1" * 64, "deployer-a", A_KEY, T0)
CHILD = RecordUse(
    "sha256:" + "2" * 64,
    "deployer-b",
    B_KEY,
    T0,
    (CoSigner("parent", "deployer-a", A_KEY), CoSigner("child", "deployer-b", B_KEY)),
)


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "countersign_cli", "impact", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )
    assert "Traceback" not in result.stderr, result.stderr
    return result


@pytest.fixture
def state(tmp_path: Path) -> str:
    store = SqliteState(tmp_path / "verifier.db")
    for n, (records, verdict) in enumerate([((ROOT, CHILD), "ACCEPT"), ((ROOT,), "ACCEPT"), ((ROOT, CHILD), "REJECT")]):
        store.record_verdict(
            VerdictEntry(
                f"v-{n}",
                T0 + n * 60_000,
                "accept",
                "spiffe://countersign.local/client/demo",
                f"req-{n}",
                4,
                verdict,
                "" if verdict == "ACCEPT" else "NONCE_REPLAYED",
                "signed-dag",
                records,
                T0 + 10**9,
            )
        )
    store.close()
    return f"sqlite:///{tmp_path / 'verifier.db'}"


def test_json_report_lists_what_relied_on_the_key(state: str) -> None:
    result = cli("--key", B_KEY, "--state", state, "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["query"] == {"kind": "key", "value": B_KEY, "since_ms": 0}
    assert [r["digest"] for r in report["records"]] == [CHILD.digest]
    assert [(v["verdict_id"], v["request_id"], v["records"]) for v in report["verdicts"]] == [
        ("v-0", "req-0", [CHILD.digest])
    ]
    wide = json.loads(cli("--deployer", "deployer-a", "--state", state, "--json").stdout)
    assert [v["verdict_id"] for v in wide["verdicts"]] == ["v-0", "v-1"]
    since = json.loads(
        cli("--record", ROOT.digest, "--since", "2026-05-28T20:27:00Z", "--state", state, "--json").stdout
    )
    assert [v["verdict_id"] for v in since["verdicts"]] == ["v-1"]
    assert since["query"]["since_ms"] == T0 + 20_000


def test_mark_flags_them_in_the_log_and_text_says_so(state: str) -> None:
    assert all(
        not v["marked_in_log"] for v in json.loads(cli("--key", A_KEY, "--state", state, "--json").stdout)["verdicts"]
    )
    marked = cli("--key", A_KEY, "--state", state, "--mark")
    assert marked.returncode == 0
    assert marked.stdout.startswith(f"impact of key {A_KEY}: 2 record(s) and 2 verdict(s) NEEDS_REVALIDATION")
    assert "flagged: impact query key" in marked.stdout
    after = json.loads(cli("--key", A_KEY, "--state", state, "--json").stdout)
    assert [v["marked_in_log"] for v in after["verdicts"]] == [True, True]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--key", "not-a-key"], "is not a key id"),
        (["--record", "sha256:12"], "is not a record digest"),
        (["--deployer", "Bad Name"], "is not a deployer id"),
        (["--key", A_KEY, "--since", "yesterday"], "--since must be ms since the epoch"),
        (["--key", A_KEY, "--since", "2026-05-28T20:27:00"], "needs a time zone"),
    ],
)
def test_bad_input_is_one_clear_line(state: str, args: list[str], message: str) -> None:
    result = cli(*args, "--state", state)
    assert result.returncode == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_an_unusable_store_is_a_usage_error(tmp_path: Path) -> None:
    result = cli("--key", A_KEY, "--state", "nosuch://x")
    assert result.returncode == 2 and "unknown store URL scheme" in result.stderr
    result = cli("--key", A_KEY, "--state", f"sqlite:///{tmp_path / 'missing-dir' / 'x.db'}")
    assert result.returncode == 2 and "no verifier store at" in result.stderr


def test_a_store_that_does_not_exist_is_refused_not_created(tmp_path: Path) -> None:
    """Issue 29: `impact --state sqlite:///missing.db` created the file and reported "0 affected", exit 0."""
    missing = tmp_path / "missing.db"
    result = cli("--key", A_KEY, "--state", f"sqlite:///{missing}")
    assert result.returncode == 2, result.stdout
    assert f"no verifier store at {missing}" in result.stderr and len(result.stderr.splitlines()) == 1
    assert not missing.exists()
    relative = cli("--key", A_KEY, "--state", "sqlite:///missing.db", cwd=tmp_path)  # relative to the cwd
    assert relative.returncode == 2 and f"no verifier store at {missing}" in relative.stderr
    assert not missing.exists()
    memory = cli("--key", A_KEY, "--state", "memory:")
    assert memory.returncode == 2 and "memory: is empty in every new process" in memory.stderr


def test_a_file_that_is_not_a_verifier_store_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    result = cli("--key", A_KEY, "--state", f"sqlite:///{empty}")
    assert result.returncode == 2 and "is not a verifier store" in result.stderr, result.stderr
    assert empty.read_bytes() == b""  # nothing was written into it
    text = tmp_path / "notes.db"
    text.write_text("not a database at all, just some text that SQLite will not read as a header" * 10)
    result = cli("--key", A_KEY, "--state", f"sqlite:///{text}")
    assert result.returncode == 2 and "is not a verifier store" in result.stderr, result.stderr


@pytest.mark.postgres
def test_a_postgres_schema_without_a_store_is_refused_not_created() -> None:
    import psycopg

    from tests.stores.conftest import postgres_base_url, with_params

    schema = f"cs_test_{uuid.uuid4().hex[:12]}"
    url = with_params(postgres_base_url(), schema=schema, connect_timeout=2)
    try:
        result = cli("--key", A_KEY, "--state", url)
        assert result.returncode == 2 and f"no verifier store in PostgreSQL schema {schema}" in result.stderr
        with psycopg.connect(postgres_base_url(), autocommit=True) as conn:
            row = conn.execute("SELECT count(*) FROM information_schema.schemata WHERE schema_name = %s", (schema,))
            assert row.fetchone() == (0,), "the read created the schema"
        open_store(url).close()  # a verifier's store: now it reads, empty
        result = cli("--key", A_KEY, "--state", url, "--json")
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["verdicts"] == []
    finally:
        with psycopg.connect(postgres_base_url(), autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
