"""Merkle tree hash of a lineage prefix (RFC 6962 section 2.1 shape), for the MERKLE construction.

Leaves are the canonical envelope bytes of the prefix records; leaf and interior hashes carry the
0x00 / 0x01 prefixes so a leaf can never pass for an interior node.
"""

from __future__ import annotations

import hashlib

from countersign.canonical import DIGEST_PREFIX


def _leaf(data: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + data).digest()


def _node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


class MerkleAccumulator:
    """Appends leaves one at a time and gives the tree hash of everything appended so far.

    Keeps the compact range (perfect subtrees, largest first); folding it right to left equals the
    recursive RFC 6962 definition for any number of leaves.
    """

    __slots__ = ("_subtrees",)

    def __init__(self) -> None:
        self._subtrees: list[tuple[int, bytes]] = []

    def append(self, data: bytes) -> None:
        size, digest = 1, _leaf(data)
        while self._subtrees and self._subtrees[-1][0] == size:
            left_size, left = self._subtrees.pop()
            size, digest = left_size + size, _node(left, digest)
        self._subtrees.append((size, digest))

    def snapshot(self) -> tuple[tuple[int, bytes], ...]:
        """The compact range, to resume from later (:meth:`resumed`)."""
        return tuple(self._subtrees)

    @classmethod
    def resumed(cls, subtrees: tuple[tuple[int, bytes], ...]) -> MerkleAccumulator:
        accumulator = cls()
        accumulator._subtrees = list(subtrees)
        return accumulator

    def root(self) -> str:
        """``sha256:<hex>`` of the tree hash. Raises ValueError when empty (a root has no parent)."""
        if not self._subtrees:
            raise ValueError("empty Merkle tree")
        digest = self._subtrees[-1][1]
        for _, left in reversed(self._subtrees[:-1]):
            digest = _node(left, digest)
        return DIGEST_PREFIX + digest.hex()


def merkle_root(leaves: list[bytes]) -> str:
    """Tree hash of ``leaves`` by the recursive definition (the reference the accumulator is tested on)."""
    if not leaves:
        raise ValueError("empty Merkle tree")
    return DIGEST_PREFIX + _tree_hash(leaves).hex()


def _tree_hash(leaves: list[bytes]) -> bytes:
    if len(leaves) == 1:
        return _leaf(leaves[0])
    split = 1 << ((len(leaves) - 1).bit_length() - 1)
    return _node(_tree_hash(leaves[:split]), _tree_hash(leaves[split:]))
