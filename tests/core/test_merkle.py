"""The MERKLE construction's tree hash: the incremental accumulator equals the recursive definition,
which in turn reproduces RFC 6962's Merkle Tree Hash."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from countersign.merkle import MerkleAccumulator, merkle_root

pytestmark = pytest.mark.offline

# The eight leaves of the Certificate Transparency reference tests (RFC 6962 section 2.1 shape).
CT_LEAVES = [bytes.fromhex(h) for h in ("", "00", "10", "2021", "3031", "40414243", "5051525354555657",
                                         "606162636465666768696a6b6c6d6e6f")]  # fmt: skip
CT_ROOT_OF_8 = "sha256:5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328"


def test_reproduces_the_certificate_transparency_root() -> None:
    assert merkle_root(CT_LEAVES) == CT_ROOT_OF_8


@given(st.lists(st.binary(max_size=40), min_size=1, max_size=70))
def test_accumulator_equals_the_recursive_definition_for_every_prefix(leaves: list[bytes]) -> None:
    tree = MerkleAccumulator()
    for count, leaf in enumerate(leaves, start=1):
        tree.append(leaf)
        assert tree.root() == merkle_root(leaves[:count])


def test_a_leaf_cannot_pass_for_an_interior_node() -> None:
    """Second-preimage guard: two leaves differ from one leaf holding their hashes' concatenation."""
    import hashlib

    a, b = b"left", b"right"
    forged = hashlib.sha256(b"\x00" + a).digest() + hashlib.sha256(b"\x00" + b).digest()
    assert merkle_root([a, b]) != merkle_root([forged])


def test_empty_tree_has_no_root() -> None:
    with pytest.raises(ValueError, match="empty"):
        MerkleAccumulator().root()
    with pytest.raises(ValueError, match="empty"):
        merkle_root([])
