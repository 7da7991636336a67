"""Issuing records under the six lineage constructions, and the bytes each signature covers.

Pure: signers are injected, times and nonces are arguments. The signer daemon wraps these functions
with grants, persistence and the remote co-signing call; the conformance harness uses them to build
honest material and attack it.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

from countersign.canonical import b64url_decode_validated, b64url_encode, canonicalize_validated, pae
from countersign.keys import PublicKey, Signer
from countersign.merkle import MerkleAccumulator
from countersign.records import (
    EDGE_DOMAIN,
    PAYLOAD_TYPE_EDGE,
    PAYLOAD_TYPE_NODE,
    AgentRef,
    Construction,
    CoSignature,
    CoSignerRole,
    Envelope,
    LifecycleEvent,
    NodeRecord,
    OutputReceipt,
    Policy,
    new_envelope,
    new_record,
)

NAIVE_SIG_UNSIGNED_FIELDS = frozenset({"parent", "depth"})
UNSIGNED_KEY_ID = "ed25519:" + "0" * 32
"""The unsigned baselines still fill the mandatory key_id field; nothing checks it."""


def new_nonce() -> str:
    """128 random bits, lowercase hex."""
    return secrets.token_hex(16)


def record_signing_input(construction: Construction, envelope: Envelope) -> bytes:
    """The bytes the primary signature of ``envelope`` covers under ``construction``: PAE over the
    record's signed view.

    The signed view is the whole record (its canonical bytes), except under NAIVE-SIG, which signs
    the record without its lineage fields (``parent``, ``depth``): "a node signs only its own identity".
    """
    if construction is Construction.NAIVE_SIG:
        view = {k: v for k, v in envelope.record_json.items() if k not in NAIVE_SIG_UNSIGNED_FIELDS}
        return pae(PAYLOAD_TYPE_NODE, canonicalize_validated(view))
    return node_signing_input(envelope.record_bytes())


def node_signing_input(record_bytes: bytes) -> bytes:
    """``pae(PAYLOAD_TYPE_NODE, record_bytes)`` with its prefix encoded once: what a signature over a
    whole record covers (every construction but NAIVE-SIG), made once per record a verifier checks."""
    return _NODE_PAE_PREFIX + b"%d %b" % (len(record_bytes), record_bytes)


_NODE_PAE_PREFIX: Final = pae(PAYLOAD_TYPE_NODE, b"")[: -len(b"0 ")]


def parent_link(construction: Construction, prefix: Sequence[Envelope]) -> str | None:
    """What a new record at position ``len(prefix)`` must carry in ``parent``."""
    if not prefix or construction is Construction.NO_CHAIN:
        return None
    if construction is Construction.MERKLE:
        tree = MerkleAccumulator()
        for envelope in prefix:
            tree.append(envelope.canonical_bytes())
        return tree.root()
    return prefix[-1].digest()


# --- edge manifests (SIGNED-DAG) ----------------------------------------------------------------


_COSIGS_KEY = b'"cosigs":['
_EMPTY_COSIGS = b'"cosigs":[]'
_MANIFEST_MIDDLE = b',"construction":"' + Construction.SIGNED_DAG.value.encode() + b'","cosigners":['
_MANIFEST_TAIL = b'],"domain":"' + EDGE_DOMAIN.encode() + b'","parent_digest":"'


def edge_manifest(parent_digest: str, child_record_bytes: bytes, cosigners: Sequence[CoSignature]) -> bytes:
    """τ: canonical bytes of ``{domain, construction, parent_digest, child, cosigners}``.

    ``child`` is the child record with its co-signature list emptied (the signatures being made
    cannot be inside what they sign); ``cosigners`` name who signs (role, deployer, key_id), their
    ``sig`` ignored. Composed from the child's canonical bytes instead of re-encoding the record: the
    co-signature list holds no ``]`` (its strings are patterned identifiers and base64url), so the
    list ends at the first ``]`` after its key, and every field before ``cosigs`` is an identifier
    that cannot contain ``"``. A property test proves the result equal to RFC 8785 over the object.
    """
    start = child_record_bytes.index(_COSIGS_KEY)
    end = child_record_bytes.index(b"]", start) + 1
    # One text, encoded once: the identifiers and the role are ASCII (ADR 0029's template, for τ); the
    # role's _value_ directly, as Enum.__format__ costs more than the rest of the entry.
    signers = ",".join(
        [f'{{"deployer":"{c.deployer}","key_id":"{c.key_id}","role":"{c.role._value_}"}}' for c in cosigners]
    ).encode()
    # One join copies the child's bytes once; a chain of + copies them at every step.
    return b"".join(
        (
            b'{"child":', child_record_bytes[:start], _EMPTY_COSIGS, child_record_bytes[end:], _MANIFEST_MIDDLE,
            signers, _MANIFEST_TAIL, parent_digest.encode(), b'"}',
        )
    )  # fmt: skip


def edge_signing_input(manifest: bytes) -> bytes:
    return pae(PAYLOAD_TYPE_EDGE, manifest)


@dataclass(frozen=True)
class EdgeProposal:
    """A cross-deployer child record awaiting co-signatures: what the child asks its parent to sign.

    τ is computed once per proposal (both co-signatures and their checks use it).
    """

    parent: Envelope
    child: NodeRecord
    parent_key_id: str

    def cosigners(self) -> tuple[CoSignature, CoSignature]:
        """The co-signer set named in τ (signatures left blank)."""
        return (
            CoSignature(CoSignerRole.PARENT, self.parent.record.deployer, self.parent_key_id, ""),
            CoSignature(CoSignerRole.CHILD, self.child.deployer, self.child.key_id, ""),
        )

    @functools.cached_property
    def child_bytes(self) -> bytes:
        """Canonical bytes of the child record (co-signatures empty): what travels to the parent."""
        return Envelope.build(self.child, None).record_bytes()

    @functools.cached_property
    def _manifest(self) -> bytes:
        return edge_manifest(self.parent.digest(), self.child_bytes, self.cosigners())

    def manifest(self) -> bytes:
        return self._manifest

    @functools.cached_property
    def _signing_input(self) -> bytes:
        return edge_signing_input(self._manifest)

    def signing_input(self) -> bytes:
        return self._signing_input


def cosign(proposal: EdgeProposal, signer: Signer, role: CoSignerRole) -> CoSignature:
    """Sign τ of ``proposal`` as the parent or the child deployer."""
    deployer = proposal.parent.record.deployer if role is CoSignerRole.PARENT else proposal.child.deployer
    sig = signer.sign(proposal.signing_input())
    return CoSignature(role, deployer, signer.key_id, b64url_encode(sig))


def verify_cosignature(proposal: EdgeProposal, cosignature: CoSignature, key: PublicKey) -> bool:
    """True when ``cosignature`` verifies over τ of ``proposal`` under ``key``."""
    return key.verify(proposal.signing_input(), b64url_decode_validated(cosignature.sig))


# --- sealing and issuing ------------------------------------------------------------------------


def seal(record: NodeRecord, signer: Signer | None) -> Envelope:
    """Produce the envelope: the primary signature over the record (none for unsigned baselines)."""
    construction = record.construction
    if not construction.signed:
        return Envelope.build(record, None)
    if signer is None or signer.key_id != record.key_id:
        raise ValueError("sealing needs the signer whose key_id the record names")
    if construction is Construction.NAIVE_SIG:
        envelope = Envelope.build(record, None)
        return envelope.with_sig(b64url_encode(signer.sign(record_signing_input(construction, envelope))))
    # The record's canonical bytes once: signed (PAE), and kept by the envelope for its digest.
    record_bytes = record.canonical_bytes()
    sig = b64url_encode(signer.sign(pae(PAYLOAD_TYPE_NODE, record_bytes)))
    return new_envelope(record, record.key_id, sig, record_bytes)


@dataclass(frozen=True, slots=True)
class RecordFields:
    """What the issuing runtime decides about a new record; everything else is derived."""

    deployer: str
    agent: AgentRef
    created_ms: int
    expires_ms: int
    max_children: int = 4
    event: LifecycleEvent = LifecycleEvent.NEW
    policy: Policy = field(default_factory=Policy)
    output: OutputReceipt | None = None
    nonce: str | None = None


def draft_record(
    construction: Construction, fields: RecordFields, key_id: str, prefix: Sequence[Envelope]
) -> NodeRecord:
    """The unsigned record for position ``len(prefix)`` under ``prefix`` (empty for a root)."""
    return new_record(
        construction, fields.deployer, key_id, fields.agent, fields.created_ms, fields.expires_ms,
        parent_link(construction, prefix), len(prefix), fields.nonce or new_nonce(), fields.max_children,
        fields.event, fields.policy, fields.output, (),
    )  # fmt: skip


ParentCosigner = Callable[[EdgeProposal, CoSignature], CoSignature]
"""Asks the parent deployer to co-sign: receives the proposal and the child's co-signature."""


def issue(
    construction: Construction,
    fields: RecordFields,
    signer: Signer | None,
    prefix: Sequence[Envelope] = (),
    *,
    parent_key_id: str | None = None,
    parent_cosigner: ParentCosigner | None = None,
) -> Envelope:
    """Issue the record at position ``len(prefix)``.

    Under SIGNED-DAG, a cross-deployer edge is co-signed: the child signs τ, ``parent_cosigner``
    returns the parent's co-signature (it may refuse by raising), then the child seals the record with
    both co-signatures inside. Raises ValueError when a cross-deployer SIGNED-DAG edge lacks a
    co-signer.
    """
    key_id = signer.key_id if signer is not None else UNSIGNED_KEY_ID
    record = draft_record(construction, fields, key_id, prefix)
    if construction.cosigns_edges and prefix and prefix[-1].record.deployer != fields.deployer:
        if signer is None or parent_cosigner is None or parent_key_id is None:
            raise ValueError("a cross-deployer SIGNED-DAG edge needs the child signer and a parent co-signer")
        proposal = EdgeProposal(prefix[-1], record, parent_key_id)
        child_cosig = cosign(proposal, signer, CoSignerRole.CHILD)
        parent_cosig = parent_cosigner(proposal, child_cosig)
        record = new_record(
            record.construction, record.deployer, record.key_id, record.agent, record.created_ms, record.expires_ms,
            record.parent, record.depth, record.nonce, record.max_children, record.event, record.policy,
            record.output, (parent_cosig, child_cosig),
        )  # fmt: skip
    return seal(record, signer)


def local_parent_cosigner(parent_signer: Signer) -> ParentCosigner:
    """A co-signer for in-process use (tests, conformance): the parent signs whatever it is asked."""

    def cosign_as_parent(proposal: EdgeProposal, child_cosig: CoSignature) -> CoSignature:
        return cosign(proposal, parent_signer, CoSignerRole.PARENT)

    return cosign_as_parent
