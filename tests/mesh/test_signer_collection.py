"""A real signer daemon collects its expired state periodically (ADR 0026): a run of short-lived
agents leaves the store at what the long-lived ones need, the collector's metrics say what it did,
and a restart after collection neither reuses a seq nor reopens a closed session."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from countersign_cli.localmesh import LocalMesh
from tests.mesh.helpers import _query, issued_digests, poll, scrape, service_error, sha256

pytestmark = pytest.mark.daemons

SHORT_TTL_MS = 3_000  # long enough to issue a root's child and receipt on a loaded machine
SKEW_MS = 300  # the collector's margin past expiry


def seq_of(path: object) -> int:
    output = path.leaf.record.output  # type: ignore[attr-defined]
    assert output is not None
    return int(output.seq)


def test_expired_state_is_collected_and_a_restart_keeps_sessions(make_mesh: Callable[..., LocalMesh]) -> None:
    mesh = make_mesh(deployers=("deployer-a",), signer_options={"collect_interval_ms": 200, "clock_skew_ms": SKEW_MS})
    a = mesh.runtime("deployer-a")
    long_root = a.root("long-lived", "collection", ttl_ms=3_600_000)
    assert seq_of(a.receipt(long_root, sha256(b"one"), session="closed-chat")) == 0
    assert seq_of(a.receipt(long_root, sha256(b"two"), session="closed-chat")) == 1
    close = a.close_session(long_root, session="closed-chat")
    assert seq_of(a.receipt(long_root, sha256(b"three"), session="open-chat")) == 0
    kept = issued_digests(mesh, "deployer-a")

    short_roots = []
    for n in range(40):
        root = a.root(f"short-{n}", "collection", ttl_ms=SHORT_TTL_MS, max_children=2)
        a.local_child(root, f"short-child-{n}", ttl_ms=SHORT_TTL_MS)
        a.receipt(root, sha256(b"short"), session="s")
        short_roots.append(root)
    # (Whether all 120 were held at once depends on the machine's speed; the collected counter below
    # says each of them was stored and then collected.)

    # After expiry plus the margin, the collector brings the store back to the long-lived rows.
    poll(lambda: issued_digests(mesh, "deployer-a") == kept or None, timeout_s=30, what="collection")
    assert _query(mesh, "deployer-a", "SELECT COUNT(*) FROM agent_sessions")[0][0] == 2
    assert _query(mesh, "deployer-a", "SELECT COUNT(*) FROM children")[0][0] == 0
    assert _query(mesh, "deployer-a", "SELECT COUNT(*) FROM child_counts")[0][0] == 0
    samples = scrape(mesh, "deployer-a")
    collected = {s[0]["table"]: s[1] for s in samples["countersign_signer_state_collected_total"]}
    assert collected["issued"] == 120
    assert collected["agent_sessions"] == 40
    assert collected["children"] == 40

    def row_gauges() -> dict[str, float] | None:
        rows = {s[0]["table"]: s[1] for s in scrape(mesh, "deployer-a")["countersign_signer_state_rows"]}
        return rows if rows["issued"] == len(kept) else None

    rows = poll(row_gauges, what="row gauge")
    assert rows["agent_sessions"] == 2
    a.close()

    mesh.stop("deployer-a")
    mesh.start("deployer-a")
    a = mesh.runtime("deployer-a")
    try:
        # The closed session stays closed; closing again answers the same close receipt.
        refused = service_error(lambda: a.receipt(long_root, sha256(b"again"), session="closed-chat"))
        assert refused.code == "SESSION_CLOSED"
        assert a.close_session(long_root, session="closed-chat").to_bytes() == close.to_bytes()
        # The open session continues at the next seq.
        assert seq_of(a.receipt(long_root, sha256(b"four"), session="open-chat")) == 1
        # A collected agent is unknown: its session cannot start over at seq 0.
        gone = service_error(lambda: a.receipt(short_roots[0], sha256(b"late"), session="s"))
        assert gone.code == "PARENT_UNKNOWN"
    finally:
        a.close()
