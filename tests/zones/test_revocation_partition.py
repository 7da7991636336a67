"""Scenario 3: a key is revoked while one verifier's zone (zone-c) is cut off from the coordinator.

What the design says, and this test asserts exactly:

* the connected verifiers (zone-a, zone-b) reject paths signed by the revoked key (``KEY_REVOKED``)
  within the propagation bound (1 s here);
* the partitioned verifier cannot know of the revocation. While its last trusted heartbeat is
  younger than ``staleness_ms`` it still ACCEPTs such paths from its persisted registry — the
  bounded exposure window the staleness bound buys — and from then on it answers ``REGISTRY_STALE``;
  it never accepts after the staleness bound;
* after healing it applies the revocation without a restart, and from then on no verifier accepts
  any path signed by the revoked key.
"""

from __future__ import annotations

import time

import pytest

from countersign.keys import Ed25519Signer
from countersign.reasons import Reason
from tests.zones.helpers import code_of, poll, verdict
from tools.zones.evidence import Operator, signed_paths

pytestmark = [pytest.mark.netns, pytest.mark.daemons, pytest.mark.exclusive, pytest.mark.slow]

STALENESS_MS = 4_000
HEARTBEAT_MS = 250
PROPAGATION_BOUND_S = 1.0
MARGIN_S = 0.6
REVOKED = str(Reason.KEY_REVOKED)
STALE = str(Reason.REGISTRY_STALE)


def test_revocation_reaches_a_partitioned_verifier_after_healing(make_zones) -> None:
    zoned = make_zones(delay_ms=0.5, staleness_ms=STALENESS_MS, heartbeat_ms=HEARTBEAT_MS)
    clients = [zoned.verifier_client(i) for i in range(3)]
    operator = Operator(zoned.local)
    key = Ed25519Signer.generate()
    operator.add_key("deployer-c", key)
    sequence = operator.sequence
    zoned.local.wait_for_registry(sequence)
    paths = iter(signed_paths({"deployer-c": key}, 400, depth=1))
    for client in clients:
        assert verdict(client, next(paths)), "a path signed by the newly added key is not accepted"
    pids_before = dict(zoned.pids())

    zoned.net.partition("c")
    cut = time.monotonic()
    try:
        revoke = operator.revoke_statement("deployer-c", key)
        _, accepted = operator.submit(revoke)
        revoked_at = accepted - cut
        # Connected verifiers: KEY_REVOKED within the bound, and never an accept again.
        probe = next(paths)
        for index in (0, 1):
            poll(
                lambda index=index: code_of(verdict(clients[index], probe, audit=True)) == REVOKED,
                timeout_s=PROPAGATION_BOUND_S,
                interval_s=0.01,
                what=f"verifier-{index} to reject the revoked key",
            )
        # The partitioned verifier, path after path in accept mode, until past the staleness bound.
        seen: list[tuple[float, str]] = []
        connected: list[str] = []
        while time.monotonic() - cut < STALENESS_MS / 1000 + 1.5:
            seen.append((time.monotonic() - cut, code_of(verdict(clients[2], next(paths)))))
            connected += [code_of(verdict(clients[i], next(paths))) for i in (0, 1)]
            time.sleep(0.1)
        assert zoned.registry_sequence("verifier-2") == sequence, "the partitioned verifier saw the revocation"
    finally:
        zoned.net.heal()

    assert set(connected) == {REVOKED}, connected
    codes = [code for _, code in seen]
    assert set(codes) <= {"ACCEPT", STALE}, codes
    accepts = [at for at, code in seen if code == "ACCEPT"]
    # The window exists: the partitioned verifier accepted the revoked key after the revocation ...
    assert accepts and accepts[-1] > revoked_at, f"no accept after the revocation at {revoked_at:.2f} s: {seen}"
    # ... and is bounded by the staleness bound: afterwards only REGISTRY_STALE.
    assert accepts[-1] <= STALENESS_MS / 1000 + MARGIN_S, f"accepted at {accepts[-1]:.2f} s: {seen}"
    first_stale = codes.index(STALE) if STALE in codes else len(codes)
    assert first_stale < len(codes), f"never went stale: {seen}"
    assert "ACCEPT" not in codes[first_stale:], seen
    print(
        f"exposure window: revoked at +{revoked_at:.2f} s, last accept by the partitioned verifier at "
        f"+{accepts[-1]:.2f} s, REGISTRY_STALE from +{seen[first_stale][0]:.2f} s"
    )

    # Healed: the revocation arrives, with no restart.
    probe = next(paths)
    poll(
        lambda: code_of(verdict(clients[2], probe, audit=True)) == REVOKED,
        timeout_s=15,
        interval_s=0.1,
        what="the partitioned verifier to apply the revocation after healing",
    )
    assert zoned.registry_sequence("verifier-2") == sequence + 1
    # From now on no verifier accepts any path signed by the revoked key.
    for client in clients:
        for _ in range(10):
            assert code_of(verdict(client, next(paths))) == REVOKED
    assert dict(zoned.pids()) == pids_before, "a daemon was restarted"
    operator.close()
    for client in clients:
        client.close()
