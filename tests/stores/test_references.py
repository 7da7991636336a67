"""The two references and the one that keeps both (countersign/state.py): :class:`InMemoryState` answers
every replay call as :class:`InMemoryReplayState` and every verdict-log call as
:class:`InMemoryVerdictLog`, whatever the interleaving, and its one ``collect_expired`` is the replay
part's then the log's within the same limit (what a backend keeping both does in one pass)."""

from __future__ import annotations

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from countersign.state import (
    ChildEdge,
    DependencyKind,
    InMemoryReplayState,
    InMemoryState,
    InMemoryVerdictLog,
    LeafNonce,
    RecordUse,
)
from tests.stores.test_verdict_log import entry

pytestmark = pytest.mark.offline

T0 = 1_000_000
RECORDS = [RecordUse(f"sha256:{n:064x}", f"deployer-{n % 2}", f"ed25519:{n:032x}", T0) for n in range(4)]


def test_both_in_one_answer_as_each_reference_alone() -> None:
    class Machine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.both = InMemoryState()
            self.replay = InMemoryReplayState()
            self.log = InMemoryVerdictLog()
            self.n = 0

        @rule(parent=st.sampled_from("pq"), child=st.sampled_from("abc"), nonce=st.sampled_from("xyz"),
              retain=st.integers(T0, T0 + 3_000), consume=st.booleans())  # fmt: skip
        def admit(self, parent: str, child: str, nonce: str, retain: int, consume: bool) -> None:
            edges, leaf = [ChildEdge(parent, child, 2, retain, 1)], LeafNonce(nonce, retain, 1)
            expected = self.replay.admit(edges, leaf, consume=consume, now_ms=T0)
            assert self.both.admit(edges, leaf, consume=consume, now_ms=T0) == expected

        @rule(path=st.lists(st.sampled_from(RECORDS), max_size=3), retain=st.integers(T0, T0 + 3_000))
        def record(self, path: list[RecordUse], retain: int) -> None:
            self.n += 1
            logged = [entry(self.n, tuple(path), retain=retain)]
            self.both.record_verdicts(logged)
            self.log.record_verdicts(logged)

        @rule(now=st.integers(T0, T0 + 4_000), limit=st.integers(0, 5))
        def collect(self, now: int, limit: int) -> None:
            replayed = self.replay.collect_expired(now, limit)
            logged = self.log.collect_expired(now, limit - replayed)
            assert self.both.collect_expired(now, limit) == replayed + logged

        @rule(max_rows=st.integers(0, 4), limit=st.integers(1, 4))
        def trim(self, max_rows: int, limit: int) -> None:
            assert self.both.trim_verdict_log(max_rows, limit) == self.log.trim_verdict_log(max_rows, limit)

        @invariant()
        def same(self) -> None:
            assert self.both.entry_count() == self.replay.entry_count()
            assert self.both.verdict_usage() == self.log.verdict_usage()
            for record in RECORDS:
                found = self.both.accepts_relying_on(DependencyKind.RECORD, [record.digest])
                assert found == self.log.accepts_relying_on(DependencyKind.RECORD, [record.digest])

    run_state_machine_as_test(Machine)
