"""Honest sample material: a set of deployers with keys, a registry, and paths they issue.

Used by ``countersign sample-path``, the offline demo, the test vectors, the benchmarks and the
conformance harness. Keys derive from a seed when one is given, so vectors are reproducible.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from countersign.canonical import sha256_digest
from countersign.constructions import RecordFields, issue, local_parent_cosigner
from countersign.keys import Ed25519Signer, PublicKey
from countersign.records import (
    AgentRef,
    BindingScope,
    Construction,
    Envelope,
    LifecycleEvent,
    OutputReceipt,
    Path,
    Policy,
    SessionClose,
    StreamChunk,
    StreamUnit,
)
from countersign.registry import KeyEntry, Registry

DEFAULT_TTL_MS = 3_600_000


def deployer_names(count: int) -> list[str]:
    """``deployer-a``, ``deployer-b``, ...; beyond 26, ``deployer-27`` and so on."""
    return [f"deployer-{chr(ord('a') + i)}" if i < 26 else f"deployer-{i + 1}" for i in range(count)]


def seeded_signer(seed: bytes, deployer: str, generation: int = 0) -> Ed25519Signer:
    """A deterministic key for ``deployer`` from ``seed`` (test material only)."""
    return Ed25519Signer(
        hashlib.sha256(b"countersign-sample-key\x00%b\x00%b\x00%d" % (seed, deployer.encode(), generation)).digest()
    )


@dataclass
class SampleMesh:
    """Deployers with one key each and a registry admitting them all (sample material)."""

    signers: dict[str, Ed25519Signer]
    added_ms: int = 0
    registry: Registry = field(init=False)

    def __post_init__(self) -> None:
        self.registry = Registry(
            {
                deployer: {signer.key_id: KeyEntry(PublicKey(signer.public_key), self.added_ms)}
                for deployer, signer in self.signers.items()
            }
        )

    @classmethod
    def create(cls, deployers: Sequence[str], seed: bytes | None = None) -> SampleMesh:
        signers = {d: seeded_signer(seed, d) if seed is not None else Ed25519Signer.generate() for d in deployers}
        return cls(signers)

    def issue_path(
        self,
        construction: Construction,
        deployers: Sequence[str],
        output: bytes,
        *,
        now_ms: int,
        system: str = "system-1",
        ttl_ms: int = DEFAULT_TTL_MS,
        max_children: int = 4,
        nonces: Sequence[str] | None = None,
        prefix: Sequence[Envelope] = (),
    ) -> Path:
        """Issue a path whose record ``i`` belongs to ``deployers[i]``; the leaf binds ``output``.

        With ``prefix``, continue below an existing path (a sibling branch shares the prefix).
        Every cross-deployer SIGNED-DAG edge is co-signed in process by the parent's key.
        """
        envelopes = list(prefix)
        start = len(envelopes)
        for offset, deployer in enumerate(deployers):
            index = start + offset
            is_leaf = offset == len(deployers) - 1
            fields = RecordFields(
                deployer=deployer,
                agent=AgentRef(f"agent-{index}-{deployer}", system),
                created_ms=now_ms - 1_000,
                # A child never outlives its parent: expiries shrink by one millisecond per level.
                expires_ms=now_ms + ttl_ms - index,
                max_children=max_children,
                event=LifecycleEvent.NEW if index == 0 else LifecycleEvent.BRANCH,
                policy=Policy(),
                output=(
                    OutputReceipt(sha256_digest(output), BindingScope.PER_TURN, f"session-{system}", 0, None)
                    if is_leaf
                    else None
                ),
                nonce=None if nonces is None else nonces[offset],
            )
            signer = self.signers[deployer] if construction.signed else None
            parent_signer = self.signers[envelopes[-1].record.deployer] if envelopes else None
            envelopes.append(
                issue(
                    construction,
                    fields,
                    signer,
                    envelopes,
                    parent_key_id=None if parent_signer is None else parent_signer.key_id,
                    parent_cosigner=None if parent_signer is None else local_parent_cosigner(parent_signer),
                )
            )
        return Path(tuple(envelopes))

    def issue_session(
        self,
        agent: Path,
        outputs: Sequence[bytes],
        *,
        now_ms: int,
        session: str = "session-1",
        closed: bool = False,
        stream: tuple[StreamUnit, int] | None = None,
        label: str = "",
    ) -> tuple[Envelope, ...]:
        """Receipts for ``outputs`` under ``agent``'s leaf, chained as a signer chains them (``seq``,
        ``prev``), each a stream chunk when ``stream`` = (unit, n) is given, then a close receipt when
        ``closed``. ``label`` makes the nonces reproducible (random when empty)."""
        deployer = agent.leaf.record.deployer
        signer = self.signers[deployer]
        receipts: list[Envelope] = []
        prev: str | None = None
        count = len(outputs) + (1 if closed else 0)
        for seq in range(count):
            close = seq == len(outputs)
            output = b"" if close else outputs[seq]
            chunk = None
            if stream is not None and not close:
                units = len(output) if stream[0] is StreamUnit.BYTES else stream[1]
                chunk = StreamChunk(stream[0], stream[1], max(1, min(units, stream[1])))
            scope = (
                BindingScope.PER_SESSION
                if close
                else BindingScope.PER_N_TOKENS
                if chunk is not None
                else BindingScope.PER_TURN
            )
            fields = RecordFields(
                deployer=deployer,
                agent=agent.leaf.record.agent,
                created_ms=now_ms - 1_000,
                expires_ms=agent.leaf.record.expires_ms,
                max_children=0,
                output=OutputReceipt(
                    sha256_digest(output), scope, session, seq, prev, chunk, SessionClose(seq, prev) if close else None
                ),
                nonce=sha256_digest(f"{label}:{session}:{seq}".encode())[7:39] if label else None,
            )
            receipt = issue(agent.leaf.record.construction, fields, signer, agent.envelopes)
            receipts.append(receipt)
            prev = receipt.digest()
        return tuple(receipts)


def cross_deployer_route(deployers: Sequence[str], depth: int) -> list[str]:
    """``depth`` records cycling through ``deployers``, so every edge crosses deployers."""
    return [deployers[i % len(deployers)] for i in range(depth)]
