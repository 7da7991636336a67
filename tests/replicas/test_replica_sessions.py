"""Sessions raced between verifier replicas sharing one PostgreSQL store, through the real service.

Two ``countersign verifier serve`` processes, one schema. The same session presented at once on both
is accepted exactly once, and every receipt's nonce is consumed exactly once; a session raced against
VerifyPath on one of its own receipts: exactly one of them wins, and if the single receipt won, the
session consumed nothing (all or nothing across replicas).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import pytest

from countersign.client import VerifierClient
from countersign.errors import ServiceError
from countersign.records import Construction, Path
from countersign.sessions import SessionEvidence
from tests.replicas.conftest import CHILD_DEPLOYER, PARENT_DEPLOYER, ReplicaSet, now_ms

pytestmark = [pytest.mark.daemons, pytest.mark.postgres]

REPLICAS = 2
SESSIONS = 8
RECEIPTS = 12
THREADS_PER_REPLICA = 8


def make_session(replica_set: ReplicaSet, n: int) -> tuple[SessionEvidence, list[bytes]]:
    """deployer-b's agent under deployer-a's root (one co-signed edge), and ``n`` chained receipts."""
    sample = replica_set.paths.sample
    issued = now_ms()
    trunk = sample.issue_path(Construction.SIGNED_DAG, [PARENT_DEPLOYER, CHILD_DEPLOYER, CHILD_DEPLOYER], b"",
                              now_ms=issued)  # fmt: skip
    agent = Path(trunk.envelopes[:2])
    outputs = [b"replica session output %d at %d" % (i, issued) for i in range(n)]
    receipts = sample.issue_session(agent, outputs, now_ms=issued, session=f"race-{issued}")
    return SessionEvidence(agent, receipts), outputs


def present_session(client: VerifierClient, session: SessionEvidence, outputs: list[bytes]) -> str:
    try:
        answer = client.verify_session(session, list(outputs))
    except ServiceError as exc:
        return f"ERROR:{exc.code}"
    return "ACCEPT" if answer else f"{answer.reason}@{answer.result.index}"


def present_path(client: VerifierClient, path: Path, output: bytes) -> str:
    result = client.verify(path, output).result
    return "PATH:" + ("ACCEPT" if result else str(result.reason))


def gated(jobs: list[Callable[[], str]]) -> list[str]:
    gate = threading.Event()
    with ThreadPoolExecutor(len(jobs)) as pool:
        futures = [pool.submit(lambda job=job: (gate.wait(30), job())[1]) for job in jobs]
        gate.set()
        return [f.result(timeout=120) for f in futures]


def test_the_same_session_raced_on_two_replicas_is_accepted_exactly_once(
    replicas: Callable[..., ReplicaSet],
) -> None:
    replica_set = replicas(REPLICAS)
    per_session = REPLICAS * THREADS_PER_REPLICA
    seen: list[Counter[str]] = []
    for _ in range(SESSIONS):
        session, outputs = make_session(replica_set, RECEIPTS)
        jobs = [
            partial(present_session, replica_set.clients[n % REPLICAS], session, outputs) for n in range(per_session)
        ]
        seen.append(Counter(gated(jobs)))
    expected = Counter({"ACCEPT": 1, "NONCE_REPLAYED@0": per_session - 1})
    assert all(c == expected for c in seen), seen
    # Every receipt's nonce consumed once, and the agent's one edge recorded once, per session.
    assert replica_set.store_counts() == (SESSIONS * RECEIPTS, SESSIONS)


def test_a_session_raced_against_one_of_its_receipts_is_all_or_nothing(
    replicas: Callable[..., ReplicaSet],
) -> None:
    replica_set = replicas(REPLICAS)
    winners: Counter[str] = Counter()
    consumed = 0
    for round_no in range(SESSIONS):
        session, outputs = make_session(replica_set, RECEIPTS)
        position = round_no % RECEIPTS
        single = Path((*session.agent.envelopes, session.receipts[position]))
        jobs = [
            partial(present_session, replica_set.clients[0], session, outputs),
            partial(present_path, replica_set.clients[1], single, outputs[position]),
        ]
        session_answer, path_answer = gated(jobs)
        if session_answer == "ACCEPT":
            assert path_answer == "PATH:NONCE_REPLAYED", (session_answer, path_answer)
            winners["session"] += 1
            consumed += RECEIPTS
        else:
            assert (session_answer, path_answer) == (f"NONCE_REPLAYED@{position}", "PATH:ACCEPT")
            winners["receipt"] += 1
            consumed += 1  # the session consumed none of its other receipts
            others = [i for i in range(RECEIPTS) if i != position]
            for other in others[:2]:  # and they are still accepted alone
                alone = Path((*session.agent.envelopes, session.receipts[other]))
                assert replica_set.clients[other % REPLICAS].verify(alone, outputs[other])
                consumed += 1
    assert sum(winners.values()) == SESSIONS
    assert replica_set.store_counts()[0] == consumed
