"""Hypothesis strategies for protocol objects: valid paths built by honest issuers."""

from __future__ import annotations

from hypothesis import strategies as st

from countersign.canonical import sha256_digest
from countersign.constructions import RecordFields, issue, local_parent_cosigner
from countersign.records import (
    MAX_PATH_LENGTH,
    AgentRef,
    BindingScope,
    Construction,
    Envelope,
    LifecycleEvent,
    OutputReceipt,
    Path,
    Policy,
)
from countersign.samples import SampleMesh

DEPLOYERS = ("deployer-a", "deployer-b", "deployer-c")
MESH = SampleMesh.create(DEPLOYERS, seed=b"hypothesis")
NOW_MS = 1_780_000_000_000
IDENTIFIER_ALPHABET = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) not in '"\\')

identifiers = st.text(alphabet=IDENTIFIER_ALPHABET, min_size=1, max_size=24)


@st.composite
def outputs(draw: st.DrawFn) -> bytes:
    return draw(st.binary(min_size=0, max_size=256))


@st.composite
def valid_paths(
    draw: st.DrawFn,
    constructions: st.SearchStrategy[Construction] = st.sampled_from(list(Construction)),
    max_length: int = 6,
) -> tuple[Path, bytes]:
    """A valid path (with its output) issued by honest deployers of ``MESH``."""
    construction = draw(constructions)
    length = draw(st.integers(1, min(max_length, MAX_PATH_LENGTH)))
    route = draw(st.lists(st.sampled_from(DEPLOYERS), min_size=length, max_size=length))
    output = draw(outputs())
    system = draw(identifiers)
    envelopes: list[Envelope] = []
    expires = NOW_MS + draw(st.integers(60_000, 10**9))
    for index, deployer in enumerate(route):
        leaf = index == length - 1
        expires -= draw(st.integers(0, 1_000))
        seq = draw(st.integers(0, 2**20))
        policy = Policy(
            allowed_children=draw(st.none() | st.just(DEPLOYERS)),
            max_depth=draw(st.none() | st.integers(length, 63)),
        )
        fields = RecordFields(
            deployer=deployer,
            agent=AgentRef(draw(identifiers), system),
            created_ms=NOW_MS - draw(st.integers(0, 10**6)),
            expires_ms=expires,
            max_children=draw(st.integers(1, 65_535)),
            event=draw(st.sampled_from(list(LifecycleEvent))),
            policy=policy,
            output=OutputReceipt(
                sha256_digest(output) if leaf else sha256_digest(draw(outputs())),
                draw(st.sampled_from(list(BindingScope))),
                draw(identifiers),
                seq,
                None if seq == 0 else sha256_digest(b"previous %d" % seq),
            )
            if leaf or draw(st.booleans())
            else None,
        )
        parent = MESH.signers[envelopes[-1].record.deployer] if envelopes else None
        envelopes.append(
            issue(
                construction,
                fields,
                MESH.signers[deployer] if construction.signed else None,
                envelopes,
                parent_key_id=None if parent is None else parent.key_id,
                parent_cosigner=None if parent is None else local_parent_cosigner(parent),
            )
        )
    return Path(tuple(envelopes)), output
