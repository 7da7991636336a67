"""The verified-prefix cache (ADR 0028) never changes a verdict: with and without it, every verdict,
reason, index and attribution are the same, over valid paths, their siblings, mutated paths, other
times and a revocation between presentations; and it stays bounded."""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from countersign.errors import MalformedError
from countersign.prefix_cache import PrefixCache
from countersign.reasons import Reason
from countersign.records import Construction, Path
from countersign.registry import Registry
from countersign.samples import SampleMesh, cross_deployer_route
from countersign.state import InMemoryState
from countersign.verify import Mode, VerifierPolicy, verify_path, verify_path_bytes
from tests.core.strategies import DEPLOYERS, MESH, NOW_MS, valid_paths

pytestmark = pytest.mark.offline

POLICY = VerifierPolicy.unsafe_allow_baselines()


def revoked(registry: Registry, deployer: str, at_ms: int) -> Registry:
    keys = {key_id: replace(entry, revoked_ms=at_ms) for key_id, entry in registry.deployers[deployer].items()}
    return Registry({**registry.deployers, deployer: keys}, registry.sequence + 1)


def mutate(path: Path, draw: st.DrawFn) -> Path | None:
    """One change an attacker (or a broken issuer) could make to a presented path; None if the
    change does not parse (the cache is never reached for those)."""
    body = copy.deepcopy(path.to_json())
    envelopes = body["envelopes"]
    assert isinstance(envelopes, list)
    index = draw(st.integers(0, len(envelopes) - 1))
    envelope = envelopes[index]
    record = envelope["record"]
    kind = draw(
        st.sampled_from(
            ["sig", "expires", "created", "nonce", "depth", "deployer", "drop", "swap", "cosig", "max_depth"]
        )
    )
    if kind == "sig" and envelope["sig"] is not None:
        sig = envelope["sig"]
        envelope["sig"] = ("B" if sig[0] == "A" else "A") + sig[1:]
    elif kind == "expires":
        record["expires_ms"] += draw(st.integers(-(10**9), 10**9))
    elif kind == "created":
        record["created_ms"] += draw(st.integers(-(10**7), 10**7))
    elif kind == "nonce" and len(envelopes) > 1:
        record["nonce"] = envelopes[(index + 1) % len(envelopes)]["record"]["nonce"]
    elif kind == "depth":
        record["depth"] = draw(st.integers(0, 63))
    elif kind == "deployer":
        record["deployer"] = draw(st.sampled_from(DEPLOYERS))
    elif kind == "drop" and len(envelopes) > 1:
        del envelopes[index]
    elif kind == "swap" and len(envelopes) > 1:
        other = draw(st.integers(0, len(envelopes) - 1))
        envelopes[index], envelopes[other] = envelopes[other], envelopes[index]
    elif kind == "cosig" and record["cosigs"]:
        cosig = record["cosigs"][draw(st.integers(0, 1))]
        cosig["sig"] = ("B" if cosig["sig"][0] == "A" else "A") + cosig["sig"][1:]
    elif kind == "max_depth":
        record["policy"]["max_depth"] = draw(st.integers(0, 8))
    try:
        return Path.from_json(body)
    except MalformedError:
        return None


@st.composite
def narrow_paths(draw: st.DrawFn) -> tuple[Path, bytes]:
    """A path whose records allow one or two children each, so siblings run into the fan-out limit."""
    output = draw(st.binary(max_size=16))
    route = draw(st.lists(st.sampled_from(DEPLOYERS), min_size=1, max_size=5))
    construction = draw(st.sampled_from(list(Construction)))
    return MESH.issue_path(construction, route, output, now_ms=NOW_MS, max_children=draw(st.integers(1, 2))), output


Presentation = tuple[Path, bytes, Registry, int, Mode]


@st.composite
def presentations(draw: st.DrawFn) -> list[Presentation]:
    """A sequence of presentations to one verifier, each audited or accepted: a path, siblings under
    its prefixes, mutations of either, at other times, some after one of the deployers' keys was
    revoked."""
    path, output = draw(valid_paths() | narrow_paths())
    registry = MESH.registry
    sequence: list[Presentation] = []
    known: list[tuple[Path, bytes]] = [(path, output)]
    for _ in range(draw(st.integers(2, 8))):
        base, base_output = draw(st.sampled_from(known))
        action = draw(st.sampled_from(["again", "sibling", "mutate", "revoke", "later"]))
        now = NOW_MS
        presented: tuple[Path, bytes] = (base, base_output)
        if action == "sibling":
            cut = draw(st.integers(1, len(base)))
            leaf_output = draw(st.binary(max_size=16))
            sibling = MESH.issue_path(
                base.envelopes[0].record.construction,
                draw(st.lists(st.sampled_from(DEPLOYERS), min_size=1, max_size=2)),
                leaf_output,
                now_ms=NOW_MS,
                system=base.envelopes[0].record.agent.system,
                ttl_ms=draw(st.integers(1_000, 10**9)),
                max_children=draw(st.integers(1, 4)),
                prefix=base.envelopes[:cut],
            )
            presented = (sibling, leaf_output)
            known.append(presented)
        elif action == "mutate":
            mutated = mutate(base, draw)
            if mutated is not None:
                presented = (mutated, base_output)
        elif action == "revoke":
            registry = revoked(registry, draw(st.sampled_from(DEPLOYERS)), NOW_MS - 1)
        elif action == "later":
            now = NOW_MS + draw(st.sampled_from([-(10**7), 10**6, 10**8, 10**10]))
        sequence.append((*presented, registry, now, draw(st.sampled_from([Mode.AUDIT, Mode.ACCEPT]))))
    return sequence


def outcome(result: object) -> tuple[object, ...]:
    return (result.verdict, result.reason, result.index, result.attribution)  # type: ignore[attr-defined]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(presentations(), st.integers(1, 8))
def test_the_cache_changes_no_verdict_reason_or_index(sequence: list[Presentation], max_entries: int) -> None:
    cache = PrefixCache(max_entries)
    cached_state, plain_state = InMemoryState(), InMemoryState()  # replay and fan-out kept apart per side
    for path, output, registry, now, mode in sequence:
        with_cache = verify_path_bytes(
            path.to_bytes(), output, registry=registry, state=cached_state, mode=mode, now_ms=now, policy=POLICY,
            prefix_cache=cache,
        )  # fmt: skip
        without = verify_path(path, output, registry=registry, state=plain_state, mode=mode, now_ms=now, policy=POLICY)
        assert outcome(with_cache) == outcome(without)
        assert len(cache) <= max_entries


def test_a_sibling_and_a_repeat_are_served_from_the_cache_and_a_revocation_is_not() -> None:
    mesh = SampleMesh.create(DEPLOYERS, seed=b"prefix-cache")
    route = cross_deployer_route(DEPLOYERS, 5)
    path = mesh.issue_path(Construction.SIGNED_DAG, route, b"o", now_ms=NOW_MS)
    sibling = mesh.issue_path(Construction.SIGNED_DAG, [route[4]], b"s", now_ms=NOW_MS, prefix=path.envelopes[:4])
    cache, state = PrefixCache(), InMemoryState()

    def verify(p: Path, output: bytes, registry: Registry) -> object:
        return verify_path(
            p, output, registry=registry, state=state, mode=Mode.AUDIT, now_ms=NOW_MS, prefix_cache=cache
        )

    assert verify(path, b"o", mesh.registry)
    assert (cache.hits, len(cache)) == (0, 2)  # the path and its depth-4 prefix
    assert verify(sibling, b"s", mesh.registry)
    assert cache.hits == 1
    assert verify(path, b"o", mesh.registry)
    assert cache.hits == 2
    # Revoking the key of the deployer that issued record 1 empties the cache: the cached prefix is
    # walked again and refused at record 1, as without a cache.
    after = revoked(mesh.registry, route[1], NOW_MS - 1)
    result = verify(sibling, b"s", after)
    assert (result.reason, result.index) == (Reason.KEY_REVOKED, 1)  # type: ignore[attr-defined]
    assert cache.hits == 2 and len(cache) == 0
    # The old registry object does not bring the old entries back either.
    assert verify(path, b"o", mesh.registry) and cache.hits == 2


def test_an_expired_cached_prefix_is_walked_again_for_the_same_reason_and_index() -> None:
    mesh = SampleMesh.create(DEPLOYERS, seed=b"prefix-cache")
    path = mesh.issue_path(Construction.LINKED_LIST, list(DEPLOYERS), b"o", now_ms=NOW_MS, ttl_ms=10_000)
    cache = PrefixCache()
    late = NOW_MS + 10_000 + POLICY.clock_skew_ms
    for now, expected in ((NOW_MS, (None, None)), (late, (Reason.EXPIRED, 0))):
        result = verify_path(
            path, b"o", registry=mesh.registry, state=InMemoryState(), mode=Mode.AUDIT, now_ms=now, prefix_cache=cache
        )
        assert (result.reason, result.index) == expected


def test_the_cache_is_bounded_and_least_recently_used_goes_first() -> None:
    mesh = SampleMesh.create(DEPLOYERS, seed=b"prefix-cache")
    cache = PrefixCache(max_entries=3)
    paths = [mesh.issue_path(Construction.SIGNED_DAG, list(DEPLOYERS), b"o", now_ms=NOW_MS) for _ in range(4)]
    for path in paths:
        verify_path(path, b"o", registry=mesh.registry, state=InMemoryState(), mode=Mode.AUDIT, now_ms=NOW_MS,
                    prefix_cache=cache)  # fmt: skip
        assert len(cache) <= 3
    hits = cache.hits
    verify_path(paths[-1], b"o", registry=mesh.registry, state=InMemoryState(), mode=Mode.AUDIT, now_ms=NOW_MS,
                prefix_cache=cache)  # fmt: skip
    assert cache.hits == hits + 1  # the newest survived
    verify_path(paths[0], b"o", registry=mesh.registry, state=InMemoryState(), mode=Mode.AUDIT, now_ms=NOW_MS,
                prefix_cache=cache)  # fmt: skip
    assert cache.hits == hits + 1  # the oldest was evicted
    with pytest.raises(ValueError):
        PrefixCache(0)


def test_a_stream_of_new_outputs_keeps_no_receipt_and_few_envelopes() -> None:
    """Issue 29: every receipt was remembered as a known envelope, four per cached prefix, so a
    verifier under a stream of new outputs (one agent path, a new receipt each time) grew to 1.5 times
    its idle size before the bound. Receipts are seen once; the agent path's envelopes are kept."""
    from bench.soak import new_receipts
    from countersign.canonical import b64url_encode
    from countersign.keys import Ed25519Signer

    keys = {d: Ed25519Signer.generate() for d in DEPLOYERS}
    registry = Registry.from_json({
        "v": 1, "sequence": 1,
        "deployers": {d: {"keys": [{"key_id": k.key_id, "public_key": b64url_encode(k.public_key), "added_ms": 0,
                                    "retired_ms": None, "revoked_ms": None}]} for d, k in keys.items()},
    })  # fmt: skip
    cache = PrefixCache(max_entries=64)
    output = b"benchmark output of the leaf agent\n"
    for data in new_receipts(keys, 400):
        path = Path.from_bytes(data, cache.known_envelope)
        result = verify_path(
            path, output, registry=registry, state=InMemoryState(), mode=Mode.AUDIT, now_ms=path.leaf.record.created_ms,
            prefix_cache=cache,
        )  # fmt: skip
        assert result, result
    held = list(cache._envelopes.values())
    assert 0 < len(held) <= 32
    assert all(envelope.record.output is None for envelope in held)
    assert cache.hits >= 399  # every path after the first resumed from the agent path


def parse_outcome(data: bytes, cache: PrefixCache | None) -> object:
    try:
        path = Path.from_bytes(data, None if cache is None else cache.known_envelope)
    except MalformedError as exc:
        return ("malformed", type(exc), str(exc), exc.index)
    return [(e, e.record_json, e.record_bytes(), e.digest()) for e in path.envelopes]


@st.composite
def presented_bytes(draw: st.DrawFn) -> tuple[Path, bytes]:
    """A path's bytes as an attacker might send them after the verifier cached the path: canonical or
    not (whitespace, key order), one JSON-level change, or one byte changed."""
    path, _ = draw(valid_paths())
    body = path.to_json()
    kind = draw(st.sampled_from(["canonical", "spaced", "mutated", "byte", "duplicate-key", "boolean"]))
    if kind == "canonical":
        return path, path.to_bytes()
    if kind == "spaced":
        return path, json.dumps(body, indent=draw(st.sampled_from([None, 1])), sort_keys=draw(st.booleans())).encode()
    if kind == "mutated":
        mutated = mutate(path, draw)
        return path, (path if mutated is None else mutated).to_bytes()
    data = bytearray(path.to_bytes())
    if kind == "byte":
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        return path, bytes(data)
    if kind == "boolean":  # true == 1 and false == 0 in Python: a record's 1 or 0 written as a boolean
        return path, bytes(data).replace(*draw(st.sampled_from(BOOLEANS_FOR_INTEGERS)), 1)
    # A duplicate key inside a record: the JSON parser must still refuse it.
    return path, bytes(data).replace(b'"depth":', b'"depth":0,"depth":', 1)


BOOLEANS_FOR_INTEGERS = [(b'"v":1}', b'"v":true}'), (b'"depth":0,', b'"depth":false,'), (b'"seq":0,', b'"seq":false,')]


@settings(max_examples=300, deadline=None)
@given(presented_bytes())
def test_parsing_with_known_envelopes_gives_the_same_path_or_the_same_error(case: tuple[Path, bytes]) -> None:
    path, data = case
    cache = PrefixCache()
    cache.remember_envelopes(path.envelopes)
    assert parse_outcome(data, cache) == parse_outcome(data, None)
    # The same from a buffer that is not bytes (a memoryview's ``in`` looks for one element).
    assert parse_outcome(memoryview(data), cache) == parse_outcome(data, None)  # type: ignore[arg-type]
