"""The signer's per-parent child counts (the fan-out limit's input) match the children it recorded."""

from __future__ import annotations

import sqlite3
import tempfile
from collections import defaultdict
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from signer.store import SignerStore, Transaction

pytestmark = pytest.mark.offline

PARENTS = ["sha256:p0", "sha256:p1", "sha256:p2"]
NONCES = [f"n{i}" for i in range(6)]


@settings(max_examples=60, deadline=None)
@given(
    batches=st.lists(
        st.lists(st.tuples(st.sampled_from(PARENTS), st.sampled_from(NONCES)), max_size=6), min_size=1, max_size=4
    ),
    fail_batch=st.integers(min_value=-1, max_value=3),
)
def test_child_count_is_the_number_of_distinct_children(batches: list[list[tuple[str, str]]], fail_batch: int) -> None:
    """Any sequence of adds (repeats included), some rolled back, some across a restart: each parent's
    count is the number of distinct children committed under it."""
    committed: dict[str, set[str]] = defaultdict(set)
    with tempfile.TemporaryDirectory() as directory:
        url = f"sqlite:///{directory}/signer.db"
        for index, batch in enumerate(batches):
            store = SignerStore(url)  # reopened for every batch: the count is durable, not a cache

            def add_all(tx: Transaction, batch: list[tuple[str, str]] = batch, index: int = index) -> None:
                for parent, nonce in batch:
                    tx.add_child(parent, nonce)
                if index == fail_batch:
                    raise RuntimeError("rolled back")

            try:
                store.transaction(add_all)
                for parent, nonce in batch:
                    committed[parent].add(nonce)
            except RuntimeError:
                pass
            counts = {parent: store.transaction(lambda tx, p=parent: tx.child_count(p)) for parent in PARENTS}
            store.close()
            assert counts == {parent: len(committed[parent]) for parent in PARENTS}


def test_a_file_from_before_the_counts_gets_its_children_counted(tmp_path: Path) -> None:
    """A signer state file written before ``child_counts`` existed: opening it counts the children
    already there, so an upgrade does not hand a parent its whole ``max_children`` again."""
    path = tmp_path / "old.db"
    SignerStore(f"sqlite:///{path}").close()
    db = sqlite3.connect(path)
    db.execute("DROP TRIGGER children_counted")
    db.execute("DROP TABLE child_counts")
    db.executemany(
        "INSERT INTO children (parent, child_nonce) VALUES (?, ?)",
        [("sha256:p0", "a"), ("sha256:p0", "b"), ("sha256:p1", "a")],
    )
    db.commit()
    db.close()

    store = SignerStore(f"sqlite:///{path}")
    try:
        assert store.transaction(lambda tx: tx.child_count("sha256:p0")) == 2
        assert store.transaction(lambda tx: tx.child_count("sha256:p1")) == 1
        assert store.transaction(lambda tx: tx.child_count("sha256:p2")) == 0
        store.transaction(lambda tx: tx.add_child("sha256:p0", "c"))
        assert store.transaction(lambda tx: tx.child_count("sha256:p0")) == 3
    finally:
        store.close()
    reopened = SignerStore(f"sqlite:///{path}")  # counted once, not again on every open
    try:
        assert reopened.transaction(lambda tx: tx.child_count("sha256:p0")) == 3
    finally:
        reopened.close()
