"""Scenario 2: the coordinator's zone (zone-a) is cut off from the other zones.

What the design says (docs/spec.md, registry follower): a verifier keeps answering from its
verified, persisted registry copy while a trusted heartbeat is younger than ``staleness_ms``; past
that it rejects every path with ``REGISTRY_STALE``; when the coordinator is reachable again it
catches up on the statements it missed, without a restart, and accepts again. Verifier-0 shares
the coordinator's zone and is not affected.
"""

from __future__ import annotations

import time

import pytest

from countersign.keys import Ed25519Signer
from countersign.reasons import Reason
from tests.zones.helpers import code_of, poll, verdict
from tools.zones.evidence import Operator, signed_paths

pytestmark = [pytest.mark.netns, pytest.mark.daemons, pytest.mark.exclusive, pytest.mark.slow]

STALENESS_MS = 3_000
HEARTBEAT_MS = 250
POLL_S = 0.1
MARGIN_S = 0.6  # one poll, one verification and scheduling on a loaded machine


def test_verifiers_ride_out_a_coordinator_partition_then_catch_up(make_zones) -> None:
    zoned = make_zones(delay_ms=0.5, staleness_ms=STALENESS_MS, heartbeat_ms=HEARTBEAT_MS)
    paths = iter(signed_paths(zoned.local.deployer_keys, 200, depth=3))
    clients = [zoned.verifier_client(i) for i in range(3)]
    pids_before = dict(zoned.pids())
    sequence_before = zoned.registry_sequence("verifier-1")
    for client in clients:
        assert verdict(client, next(paths)), "a valid path is rejected before any fault"
    operator = Operator(zoned.local)
    new_key = Ed25519Signer.generate()

    zoned.net.partition("a")
    cut = time.monotonic()
    try:
        answers: dict[int, list[tuple[float, str]]] = {1: [], 2: []}
        zone_a_answers: list[str] = []
        statement_sent = False
        while time.monotonic() - cut < STALENESS_MS / 1000 + 2.0:
            for index in (1, 2):
                answers[index].append((time.monotonic() - cut, code_of(verdict(clients[index], next(paths)))))
            zone_a_answers.append(code_of(verdict(clients[0], next(paths))))
            if not statement_sent and time.monotonic() - cut > 1.0:
                # The operator (next to the coordinator) admits a new key during the partition.
                operator.add_key("deployer-c", new_key)
                statement_sent = True
            time.sleep(POLL_S)
        assert statement_sent
        for index, seen in answers.items():
            codes = [code for _, code in seen]
            assert set(codes) <= {"ACCEPT", str(Reason.REGISTRY_STALE)}, f"verifier-{index}: {codes}"
            first_stale = next((i for i, code in enumerate(codes) if code != "ACCEPT"), len(codes))
            assert first_stale < len(codes), f"verifier-{index} never went stale: {codes}"
            # Accepts first, from the persisted registry, then only REGISTRY_STALE: no flapping.
            assert all(code != "ACCEPT" for code in codes[first_stale:]), f"verifier-{index}: {codes}"
            last_accept_at = seen[first_stale - 1][0] if first_stale else 0.0
            stale_at = seen[first_stale][0]
            earliest = (STALENESS_MS - HEARTBEAT_MS) / 1000 - MARGIN_S
            assert last_accept_at >= earliest, f"verifier-{index} stopped accepting at {last_accept_at:.2f} s"
            assert stale_at <= STALENESS_MS / 1000 + MARGIN_S, f"verifier-{index} still fresh at {stale_at:.2f} s"
            # It has not seen the statement submitted during the partition.
            assert zoned.registry_sequence(f"verifier-{index}") == sequence_before
        # The coordinator's own zone is unaffected: fresh, and it has the new statement.
        assert set(zone_a_answers) == {"ACCEPT"}, zone_a_answers
        assert zoned.registry_sequence("verifier-0") == sequence_before + 1
    finally:
        zoned.net.heal()
    healed = time.monotonic()

    # Caught up without a restart: the statement is applied and paths signed by the new key accepted.
    new_key_paths = iter(signed_paths({"deployer-c": new_key}, 100, depth=1))
    for index in (1, 2):
        poll(
            lambda index=index: verdict(clients[index], next(new_key_paths)),
            timeout_s=15,
            interval_s=0.1,
            what=f"verifier-{index} to accept again after healing",
        )
        assert zoned.registry_sequence(f"verifier-{index}") == sequence_before + 1
        assert verdict(clients[index], next(paths)), f"verifier-{index} rejects the mesh's paths after healing"
    print(f"verifiers caught up {time.monotonic() - healed:.2f} s after healing")
    assert dict(zoned.pids()) == pids_before, "a daemon was restarted"
    assert all(d.alive for d in zoned.local.daemons.values())
    operator.close()
    for client in clients:
        client.close()
