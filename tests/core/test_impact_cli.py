"""``countersign impact`` as a user runs it, on a verifier store file: JSON and text reports,
--since, --mark, and one-line usage errors (exit 2, no traceback)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from countersign.state import CoSigner, RecordUse, VerdictEntry
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


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "countersign_cli", "impact", *args], capture_output=True, text=True, timeout=120
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
    assert result.returncode == 2 and "state store unavailable" in result.stderr
