"""Generate the test vectors of docs/spec.md (deterministic: fixed seeds, nonces and times).

    python tests/vectors/generate.py [--out DIR]

Writes ``keys.json``, ``encoding.json`` (canonical bytes, digests, signing inputs and signatures of
one SIGNED-DAG path), ``valid/*.json`` (one accepted path per construction), ``invalid/*.json``
(named invalid presentations with the expected reason and index), ``policy/*.json`` (paths under a
consumer policy, with the expected attribution) and ``export/`` (the path of ``valid/signed-dag.json``
in each export format of docs/spec.md). The tests regenerate them into a temporary directory and
require the result to equal the committed files byte for byte.

Invalid vectors isolate one check each: where a check sits behind the signatures, the mutated
record is re-signed with the legitimate key (a faulty issuer), so that exactly that check fails.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path as FilePath
from typing import Any

from countersign.canonical import b64url_encode, canonicalize, pae, sha256_digest
from countersign.constructions import (
    EdgeProposal,
    RecordFields,
    cosign,
    edge_manifest,
    edge_signing_input,
    issue,
    local_parent_cosigner,
    record_signing_input,
    seal,
)
from countersign.keys import Ed25519Signer
from countersign.policy import (
    AllOf,
    AllowedBindingScopes,
    AllowedDeployers,
    AllowedKeys,
    AnyOf,
    ConsumerPolicy,
    CrossDeployerConstruction,
    MaxDepth,
    MaxEvidenceAge,
    RequireClosedSession,
)
from countersign.reasons import Reason
from countersign.records import (
    AgentRef,
    BindingScope,
    Construction,
    CoSignerRole,
    Envelope,
    NodeRecord,
    OutputReceipt,
    Path,
    Policy,
    StreamUnit,
)
from countersign.registry import Registry
from countersign.samples import SampleMesh
from countersign.sessions import SessionEvidence
from countersign.state import InMemoryState
from countersign.verify import Mode, VerifierPolicy, verify_path

SEED = b"countersign-test-vectors-v1"
NOW_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
CREATED_MS = NOW_MS - 60_000
DEPLOYERS = ("deployer-a", "deployer-b", "deployer-c")
ROUTE = ("deployer-a", "deployer-b", "deployer-b", "deployer-c")  # cross, local, cross
OUTPUT = b"The final answer, exactly these bytes.\n"


def nonce(label: str, index: int) -> str:
    return sha256_digest(f"{label}:{index}".encode())[7:39]


def mesh() -> SampleMesh:
    return SampleMesh.create(DEPLOYERS, seed=SEED)


def build_path(
    m: SampleMesh,
    construction: Construction,
    route: Sequence[str] = ROUTE,
    *,
    label: str = "main",
    output: bytes = OUTPUT,
    max_children: int = 2,
    policies: dict[int, Policy] | None = None,
    prefix: Sequence[Envelope] = (),
) -> Path:
    envelopes = list(prefix)
    for offset, deployer in enumerate(route):
        index = len(envelopes)
        leaf = offset == len(route) - 1
        fields = RecordFields(
            deployer=deployer,
            agent=AgentRef(f"{label}-agent-{index}", "vector-system"),
            created_ms=CREATED_MS,
            expires_ms=NOW_MS + 3_600_000 - 1_000 * index,
            max_children=max_children,
            policy=(policies or {}).get(index, Policy()),
            output=OutputReceipt(sha256_digest(output), BindingScope.PER_TURN, "vector-session", 0, None)
            if leaf
            else None,
            nonce=nonce(label, index),
        )
        parent = m.signers[envelopes[-1].record.deployer] if envelopes else None
        envelopes.append(
            issue(
                construction,
                fields,
                m.signers[deployer] if construction.signed else None,
                envelopes,
                parent_key_id=None if parent is None else parent.key_id,
                parent_cosigner=None if parent is None else local_parent_cosigner(parent),
            )
        )
    return Path(tuple(envelopes))


def resign(m: SampleMesh, path: Path, index: int, change: Callable[[NodeRecord], NodeRecord]) -> Path:
    """Apply ``change`` to record ``index`` and re-sign it (and its co-signatures) legitimately."""
    envelopes = list(path.envelopes)
    record = replace(change(envelopes[index].record), cosigs=())
    signer = m.signers[record.deployer]
    if record.construction.cosigns_edges and index > 0 and envelopes[index - 1].record.deployer != record.deployer:
        parent = envelopes[index - 1]
        parent_signer = m.signers[parent.record.deployer]
        proposal = EdgeProposal(parent, record, parent_signer.key_id)
        record = replace(
            record,
            cosigs=(
                cosign(proposal, parent_signer, CoSignerRole.PARENT),
                cosign(proposal, signer, CoSignerRole.CHILD),
            ),
        )
    envelopes[index] = seal(record, signer)
    return Path(tuple(envelopes))


def registry_json(registry: Registry) -> dict[str, Any]:
    return registry.to_json()  # type: ignore[return-value]


def presentation(path: Path | str | bytes, output: bytes = OUTPUT) -> dict[str, Any]:
    if isinstance(path, Path):
        body: dict[str, Any] = {"path": path.to_json()}
    elif isinstance(path, str):
        body = {"path_text": path}
    else:
        body = {"path_base64": base64.b64encode(path).decode()}
    body["output_base64"] = base64.b64encode(output).decode()
    return body


def vector(
    name: str,
    description: str,
    target: dict[str, Any],
    expected: tuple[str, str | None, int | None],
    *,
    registry: Registry,
    before: Sequence[dict[str, Any]] = (),
    mode: str = "accept",
    allow_baselines: bool = False,
    now_ms: int = NOW_MS,
) -> dict[str, Any]:
    verdict, reason, index = expected
    return {
        "name": name,
        "description": description,
        "now_ms": now_ms,
        "clock_skew_ms": 60_000,
        "mode": mode,
        "allow_baselines": allow_baselines,
        "registry": registry_json(registry),
        "before": list(before),
        "presentation": target,
        "expected": {"verdict": verdict, "reason": reason, "index": index},
    }


def encoding_vector(m: SampleMesh, path: Path) -> dict[str, Any]:
    records = []
    for index, envelope in enumerate(path.envelopes):
        record_bytes = envelope.record_bytes()
        entry: dict[str, Any] = {
            "index": index,
            "record_canonical": record_bytes.decode(),
            "signing_input_base64": base64.b64encode(
                record_signing_input(envelope.record.construction, envelope)
            ).decode(),
            "sig": envelope.sig,
            "envelope_canonical": envelope.canonical_bytes().decode(),
            "envelope_digest": envelope.digest(),
        }
        if envelope.record.cosigs:
            parent = path.envelopes[index - 1]
            manifest = edge_manifest(parent.digest(), record_bytes, envelope.record.cosigs)
            assert manifest == canonicalize(json.loads(manifest))
            entry["edge_manifest"] = manifest.decode()
            entry["edge_signing_input_base64"] = base64.b64encode(edge_signing_input(manifest)).decode()
            entry["cosigs"] = [c.to_json() for c in envelope.record.cosigs]
        records.append(entry)
    return {
        "description": "Canonical bytes, digests and signatures of the SIGNED-DAG path in valid/signed-dag.json.",
        "payload_types": {
            "node": "application/vnd.countersign.node+json;version=1",
            "edge": "application/vnd.countersign.edge+json;version=1",
        },
        "output_sha256": sha256_digest(OUTPUT),
        "records": records,
    }


def invalid_vectors(m: SampleMesh) -> list[dict[str, Any]]:
    dag = build_path(m, Construction.SIGNED_DAG)
    reg = m.registry
    v: list[dict[str, Any]] = []

    def add(name: str, description: str, target: Path | str | bytes, reason: str, index: int | None, **kw: Any) -> None:
        output = kw.pop("output", OUTPUT)
        v.append(
            vector(
                name,
                description,
                presentation(target, output),
                ("REJECT", reason, index),
                registry=kw.pop("registry", reg),
                **kw,
            )
        )

    # --- parsing ---
    text = dag.to_bytes().decode()
    add("malformed-truncated", "path.json cut in half", text[: len(text) // 2], "MALFORMED", None)
    add(
        "malformed-not-utf8",
        "invalid UTF-8 byte inside a string",
        dag.to_bytes().replace(b"main-agent-0", b"main-agent-\xff"),
        "MALFORMED",
        None,
    )
    add(
        "malformed-duplicate-key",
        "a record repeats the key 'depth'",
        text.replace('"depth":0,', '"depth":0,"depth":0,', 1),
        "MALFORMED",
        None,
    )
    add(
        "malformed-float",
        "a float where an integer belongs",
        text.replace('"depth":0,', '"depth":0.0,', 1),
        "MALFORMED",
        None,
    )
    add(
        "malformed-unknown-field",
        "an unknown field in a record",
        text.replace('"depth":0,', '"depth":0,"extra":1,', 1),
        "MALFORMED",
        0,
    )
    add(
        "malformed-bool-as-int",
        "true where an integer belongs",
        text.replace('"depth":0,', '"depth":true,', 1),
        "MALFORMED",
        0,
    )
    add(
        "malformed-uppercase-digest",
        "an upper-case hex digest",
        text.replace(dag.envelopes[1].record.parent or "", (dag.envelopes[1].record.parent or "").upper()),
        "MALFORMED",
        1,
    )
    add(
        "malformed-noncanonical-signature",
        "a signature whose last base64url character carries set padding bits",
        text.replace(dag.envelopes[0].sig or "", (dag.envelopes[0].sig or "")[:-1] + "B"),
        "MALFORMED",
        0,
    )
    add("malformed-deep-nesting", "deeply nested arrays", "[" * 3_000 + "]" * 3_000, "MALFORMED", None)
    # The nesting limit (spec 2.1): path, envelopes, envelope, record and agent are five levels, so an
    # agent instance of 27 nested arrays is 32 levels (the schema refuses it at its envelope) and one of
    # 28 is 33 (refused at index null before anything else, the schema included).
    instance = f'"instance":"{dag.envelopes[0].record.agent.instance}"'
    for levels, name, index in ((27, "malformed-nesting-at-limit", 0), (28, "malformed-nesting-over-limit", None)):
        deep = text.replace(instance, '"instance":' + "[" * levels + "0" + "]" * levels, 1)
        add(name, f"an agent instance nested {levels} arrays deep: {levels + 5} levels", deep, "MALFORMED", index)
    add("unsupported-version", "record format version 2", text.replace('"v":1}', '"v":2}', 1), "UNSUPPORTED_VERSION", 0)

    # --- policy ---
    add(
        "construction-not-allowed",
        "a NAIVE-SIG path without opting into baselines",
        build_path(m, Construction.NAIVE_SIG),
        "CONSTRUCTION_NOT_ALLOWED",
        0,
    )

    # --- keys ---
    outsider = Ed25519Signer(hashlib.sha256(b"outsider").digest())
    stranger = SampleMesh({"deployer-x": outsider})
    add(
        "unknown-deployer",
        "root issued by a deployer the registry does not admit",
        build_path(stranger, Construction.SIGNED_DAG, ["deployer-x"]),
        "UNKNOWN_DEPLOYER",
        0,
    )
    foreign = replace(dag.envelopes[0].record, key_id=outsider.key_id)
    add(
        "unknown-key",
        "root names a key_id that deployer-a does not have",
        Path((Envelope.build(foreign, dag.envelopes[0].sig), *dag.envelopes[1:])),
        "UNKNOWN_KEY",
        0,
    )
    revoked = _with_key_status(reg, "deployer-b", revoked_ms=NOW_MS - 10)
    add(
        "key-revoked",
        "deployer-b's key is revoked (nothing it signed is accepted)",
        dag,
        "KEY_REVOKED",
        1,
        registry=revoked,
    )
    retired = _with_key_status(reg, "deployer-c", retired_ms=CREATED_MS - 1)
    add(
        "key-retired-before-record",
        "deployer-c's key was retired before the leaf was created",
        dag,
        "KEY_NOT_VALID",
        3,
        registry=retired,
    )

    # --- signatures ---
    flipped = replace(dag.envelopes[2].record, agent=AgentRef("tampered", "vector-system"))
    add(
        "bad-signature",
        "a record field changed after signing",
        Path((*dag.envelopes[:2], Envelope.build(flipped, dag.envelopes[2].sig), dag.envelopes[3])),
        "BAD_SIGNATURE",
        2,
    )

    # --- validity window ---
    add(
        "expired",
        "verified when the leaf's expiry plus the skew has passed",
        dag,
        "EXPIRED",
        3,
        now_ms=NOW_MS + 3_600_000 - 3_000 + 60_000,
    )
    future = resign(
        m, build_path(m, Construction.SIGNED_DAG, ["deployer-a"]), 0, lambda r: replace(r, created_ms=NOW_MS + 61_000)
    )
    add("not-yet-valid", "created beyond the verifier's clock plus skew", future, "NOT_YET_VALID", 0)

    # --- lineage ---
    orphan_parent = resign(m, dag, 2, lambda r: replace(r, parent=sha256_digest(b"elsewhere")))
    add(
        "parent-mismatch",
        "a record references an envelope that is not its predecessor",
        orphan_parent,
        "PARENT_MISMATCH",
        2,
    )
    root_cosigned = list(dag.envelopes)
    root_cosigned[0] = seal(
        replace(dag.envelopes[0].record, cosigs=dag.envelopes[1].record.cosigs), m.signers["deployer-a"]
    )
    add(
        "root-with-cosignatures",
        "a root carrying co-signatures copied from an edge",
        _relinked(m, root_cosigned, 1),
        "MALFORMED",
        0,
    )
    root_parent = resign(m, dag, 0, lambda r: replace(r, parent=sha256_digest(b"x")))
    add(
        "root-with-parent",
        "the root references a parent",
        Path(root_parent.envelopes[:1]),
        "PARENT_MISMATCH",
        0,
        output=b"",
    )
    depth = resign(m, dag, 2, lambda r: replace(r, depth=5))
    add("depth-mismatch", "signed depth differs from the position", depth, "DEPTH_MISMATCH", 2)
    add(
        "truncated-head",
        "the root dropped: the first record still references a parent",
        Path(dag.envelopes[1:]),
        "PARENT_MISMATCH",
        0,
    )
    system = resign(m, dag, 2, lambda r: replace(r, agent=AgentRef(r.agent.instance, "another-system")))
    add("system-mismatch", "a record of another agent system", system, "SYSTEM_MISMATCH", 2)
    outlives = resign(m, dag, 1, lambda r: replace(r, expires_ms=NOW_MS + 7_200_000))
    add("expiry-exceeds-parent", "a child outlives its parent", outlives, "EXPIRY_EXCEEDS_PARENT", 1)
    allowed = build_path(m, Construction.SIGNED_DAG, policies={0: Policy(allowed_children=("deployer-c",))})
    add(
        "policy-allowed-children",
        "the root allows only deployer-c as a child, deployer-b follows",
        allowed,
        "POLICY_VIOLATION",
        1,
    )
    max_depth = build_path(m, Construction.SIGNED_DAG, policies={1: Policy(max_depth=2)})
    add(
        "policy-max-depth",
        "a max_depth of 2 set at depth 1; the leaf sits at depth 3",
        max_depth,
        "POLICY_VIOLATION",
        3,
    )

    # --- co-signatures ---
    missing = list(dag.envelopes)
    missing[1] = seal(replace(dag.envelopes[1].record, cosigs=()), m.signers["deployer-b"])
    add(
        "missing-cosignature",
        "a cross-deployer edge without co-signatures (child key alone)",
        _relinked(m, missing, 2),
        "MISSING_COSIGNATURE",
        1,
    )
    forged = list(dag.envelopes)
    parent_cosig, child_cosig = dag.envelopes[3].record.cosigs
    other_parent = dag.envelopes[1].record.cosigs[0]
    swapped = replace(dag.envelopes[3].record, cosigs=(replace(parent_cosig, sig=other_parent.sig), child_cosig))
    forged[3] = seal(swapped, m.signers["deployer-c"])
    add(
        "bad-cosignature",
        "the parent co-signature is copied from another edge",
        Path(tuple(forged)),
        "BAD_COSIGNATURE",
        3,
    )

    # --- nonces and output ---
    dup = resign(m, dag, 2, lambda r: replace(r, nonce=dag.envelopes[0].record.nonce))
    add("duplicate-nonce", "two records of the path share a nonce", dup, "DUPLICATE_NONCE", 2)
    no_output = resign(m, dag, 3, lambda r: replace(r, output=None))
    add("output-missing", "the leaf carries no output section", no_output, "OUTPUT_MISSING", 3)
    add("output-mismatch", "other bytes than the leaf signed", dag, "OUTPUT_MISMATCH", 3, output=OUTPUT + b"!")

    # --- durable state ---
    add(
        "nonce-replayed",
        "the same path presented a second time in accept mode",
        dag,
        "NONCE_REPLAYED",
        3,
        before=[presentation(dag)],
    )
    trunk = Path(dag.envelopes[:3])
    siblings = [
        build_path(m, Construction.SIGNED_DAG, ["deployer-c"], label=f"sibling-{i}", prefix=trunk.envelopes)
        for i in range(3)
    ]
    add(
        "fanout-exceeded",
        "a third child under a parent whose max_children is 2",
        siblings[2],
        "FANOUT_EXCEEDED",
        3,
        before=[presentation(s) for s in siblings[:2]],
    )
    return v


def policy_vectors(m: SampleMesh) -> list[dict[str, Any]]:
    """Verified paths under a consumer policy (spec section 16): ``consumer_policy`` is the policy
    document applied to the presentation; ``expected`` adds the clause named first in the detail
    (``null`` unless the reason is CONSUMER_POLICY_VIOLATION) and the attribution of spec 6.2."""
    dag = build_path(m, Construction.SIGNED_DAG)
    linked = build_path(m, Construction.LINKED_LIST)
    registry = Registry(m.registry.deployers, 7)  # keys resolved at registry sequence 7
    everything = AllOf(
        (
            AllowedDeployers(frozenset(DEPLOYERS)),
            AllowedKeys(frozenset(s.key_id for s in m.signers.values())),
            MaxDepth(3),
            CrossDeployerConstruction(frozenset({Construction.SIGNED_DAG})),
            MaxEvidenceAge(120_000),
            AllowedBindingScopes(frozenset({BindingScope.PER_TURN, BindingScope.PER_TOOL_CALL})),
        )
    )
    cases: list[tuple[str, str, Path, ConsumerPolicy]] = [
        ("accept-attribution", "every satisfiable clause holds: ACCEPT, naming the emitter", dag, everything),
        (
            "any-of-one-alternative",
            "one alternative of an any_of holds",
            dag,
            AnyOf((RequireClosedSession(), MaxDepth(5))),
        ),
        (
            "allowed-deployers",
            "deployer-c (the emitter) is not an allowed deployer",
            dag,
            AllowedDeployers(frozenset({"deployer-a", "deployer-b"})),
        ),
        (
            "cross-deployer-construction",
            "a LINKED-LIST path under a policy that wants SIGNED-DAG on cross-deployer edges",
            linked,
            CrossDeployerConstruction(frozenset({Construction.SIGNED_DAG})),
        ),
        ("max-depth", "the emitter sits at depth 3, the policy allows 2", dag, MaxDepth(2)),
        ("max-evidence-age", "the output receipt is 60 s old, the policy allows 30 s", dag, MaxEvidenceAge(30_000)),
        (
            "require-closed-session",
            "no session can be proven closed in version 1: the clause fails closed",
            dag,
            RequireClosedSession(),
        ),
        ("empty-all-of", "an empty all_of allows nothing", dag, AllOf(())),
        ("empty-any-of", "an empty any_of allows nothing", dag, AnyOf(())),
    ]
    vectors = []
    for name, description, path, consumer_policy in cases:
        result = verify_path(
            path,
            OUTPUT,
            registry=registry,
            state=InMemoryState(),
            mode=Mode.ACCEPT,
            now_ms=NOW_MS,
            policy=VerifierPolicy(clock_skew_ms=60_000),
            consumer_policy=consumer_policy,
        )
        body = vector(
            name,
            description,
            presentation(path),
            (result.verdict.value, result.reason and result.reason.value, result.index),
            registry=registry,
        )
        body["consumer_policy"] = consumer_policy.document()
        verdict = result.to_json()
        violated = result.reason is Reason.CONSUMER_POLICY_VIOLATION
        body["expected"]["clause"] = result.detail.split(": ", 1)[0] if violated else None
        for key in ("emitter", "edges", "registry_sequence"):
            body["expected"][key] = verdict[key]
        vectors.append(body)
    return vectors


def policy_documents_vector() -> dict[str, Any]:
    """Policy documents (spec 16.1) a parser must load, each with the document it reads back (lists
    sorted), and documents it must refuse, each with why."""
    from countersign.policy import parse_policy

    valid = [
        '{"v":1,"policy":{"all_of":[{"allowed_deployers":["deployer-b","deployer-a"]},{"max_depth":3}]}}',
        '{"v":1,"policy":{"any_of":[{"require_closed_session":true},{"max_evidence_age_ms":60000}]}}',
        '{"v":1,"policy":{"all_of":[{"any_of":[{"max_depth":1},{"max_depth":2}]},{"any_of":[{"max_depth":1}]}]}}',
        '{"v":1,"policy":{"unsafe_allow_all":true}}',
    ]
    nested = '{"max_depth":1}'
    for _ in range(9):
        nested = '{"all_of":[' + nested + "]}"
    invalid = [
        ('{"v":1,"policy":{"all_of":[{"unsafe_allow_all":true},{"unsafe_allow_all":true}]}}',
         "all_of repeats a clause"),
        ('{"v":1,"policy":{"any_of":[{"max_depth":1},{"max_depth":2},{"max_depth":1}]}}', "any_of repeats a clause"),
        ('{"v":1,"policy":{"any_of":[{"allowed_deployers":["deployer-a","deployer-b"]},'
         '{"allowed_deployers":["deployer-b","deployer-a"]}]}}',
         "any_of repeats a clause: the same set of deployers in another order"),
        ('{"v":1,"policy":{"all_of":[{"any_of":[{"max_depth":1},{"max_depth":2}]},'
         '{"any_of":[{"max_depth":2},{"max_depth":1}]}]}}',
         "all_of repeats a composition: the same clauses in another order"),
        ('{"v":1,"policy":{"allowed_deployers":["deployer-a","deployer-a"]}}', "a list of deployers repeats one"),
        ('{"v":1,"policy":{"max_depth":1,"allowed_keys":[]}}', "a clause object with two members"),
        ('{"v":1,"policy":{"maxdepth":1}}', "an unknown clause"),
        ('{"policy":{"max_depth":1}}', "v missing"),
        ('{"v":2,"policy":{"max_depth":1}}', "another v"),
        ('{"v":1,"policy":{"unsafe_allow_all":false}}', "false: a clause that would check nothing"),
        ('{"v":1,"policy":' + nested + "}", "compositions nested 9 deep"),
        ('{"v":1,"policy":{"max_depth":1.0}}', "not strict JSON: a fraction"),
    ]  # fmt: skip
    return {
        "description": "consumer policy documents (docs/spec.md 16.1): valid ones with the document each reads "
        "back as (lists sorted), and invalid ones a parser must refuse",
        "valid": [{"document": text, "reads_as": parse_policy(text).document()} for text in valid],
        "invalid": [{"document": text, "why": why} for text, why in invalid],
    }


def _relinked(m: SampleMesh, envelopes: list[Envelope], start: int) -> Path:
    """Re-sign records ``start..`` so their parent references follow a changed predecessor."""
    path = Path(tuple(envelopes))
    for index in range(start, len(envelopes)):
        parent_digest = path.envelopes[index - 1].digest()
        path = resign(m, path, index, lambda r, digest=parent_digest: replace(r, parent=digest))
    return path


def _with_key_status(registry: Registry, deployer: str, **status: int) -> Registry:
    keys = {k: replace(e, **status) for k, e in registry.deployers[deployer].items()}  # type: ignore[arg-type]
    return Registry({**registry.deployers, deployer: keys}, registry.sequence + 1)


def generate(out: FilePath) -> None:
    m = mesh()
    (out / "valid").mkdir(parents=True, exist_ok=True)
    (out / "invalid").mkdir(parents=True, exist_ok=True)
    keys = {
        d: {"seed_base64url": b64url_encode(s.seed), "public_key": b64url_encode(s.public_key), "key_id": s.key_id}
        for d, s in m.signers.items()
    }
    write(out / "keys.json", {"description": "Deterministic test keys (never use outside tests).", "keys": keys})
    for construction in Construction:
        path = build_path(m, construction)
        name = construction.value
        write(
            out / "valid" / f"{name}.json",
            vector(
                name,
                f"a valid {name} path over {' -> '.join(ROUTE)}",
                presentation(path),
                ("ACCEPT", None, None),
                registry=m.registry,
                allow_baselines=not construction.signs_lineage,
            ),
        )
    write(out / "encoding.json", encoding_vector(m, build_path(m, Construction.SIGNED_DAG)))
    for item in invalid_vectors(m):
        write(out / "invalid" / f"{item['name']}.json", item)
    (out / "policy").mkdir(parents=True, exist_ok=True)
    for item in policy_vectors(m):
        write(out / "policy" / f"{item['name']}.json", item)
    write(out / "policy-documents.json", policy_documents_vector())
    export_vectors(out / "export", build_path(m, Construction.SIGNED_DAG))
    session_vectors(m, out / "sessions")
    session_state_vectors(m, out / "sessions")
    session_nesting_vectors(m, out / "sessions")
    write(out / "handoff.json", handoff_vector(m))
    write(out / "compact-path.json", compact_vector(m))
    write(out / "mcp.json", mcp_vector())
    write(out / "openai-agents.json", openai_agents_vector())
    write(out / "rotation.json", rotation_vector())
    write(out / "checkpoint.json", checkpoint_vector())


def compact_vector(m: SampleMesh) -> dict[str, Any]:
    """valid/signed-dag.json's path in the compact encoding (spec section 19.1), and strings a reader
    must refuse, each with the reason it is refused."""
    import zlib

    from countersign.compact import compact_path

    path = build_path(m, Construction.SIGNED_DAG)
    text = compact_path(path)

    def wrap(data: bytes) -> str:
        return "cs1z." + base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    def deflate(data: bytes) -> bytes:
        raw = zlib.compressobj(9, zlib.DEFLATED, -15)
        return raw.compress(data) + raw.flush()

    body = base64.urlsafe_b64decode(text[5:] + "=" * (-len(text[5:]) % 4))
    pretty = json.dumps(path.to_json(), indent=1).encode()
    return {
        "description": "a path in the compact encoding: cs1z. then unpadded base64url of raw DEFLATE of its path JSON",
        "path_json": path.to_bytes().decode(),
        "compact": text,
        "invalid": [
            {"compact": "cs2z." + text[5:], "why": "an unknown prefix"},
            {"compact": text + "=", "why": "padding: one encoding per byte string"},
            {"compact": wrap(body[:-4]), "why": "a truncated DEFLATE stream"},
            {"compact": wrap(body + b"\x00"), "why": "data after the end of the DEFLATE stream"},
            {"compact": wrap(deflate(pretty)), "why": "inflates to path JSON that is not canonical"},
            {"compact": wrap(deflate(b" " * (64 * 1024 + 1))), "why": "inflates past 65,536 bytes"},
            {"compact": wrap(b"\xff\xff\xff"), "why": "not a DEFLATE stream"},
        ],
    }


def mcp_vector() -> dict[str, Any]:
    """MCP tool results (spec section 20) and the exact bytes their per_tool_call receipts hash."""
    from countersign.integrations.mcp import result_bytes  # the MCP SDK is not needed for JSON results

    cases: list[tuple[str, str, dict[str, Any]]] = [
        ("text", "one text block, isError absent (false)", {"content": [{"type": "text", "text": "Sunny, 22 °C"}]}),
        (
            "structured",
            "structured content beside its text; resultType and _meta are not signed",
            {
                "content": [{"type": "text", "text": '{"sum": 5}'}],
                "structuredContent": {"sum": 5, "parts": [2, 3]},
                "isError": False,
                "resultType": "complete",
                "_meta": {"example.com/trace": "abc"},
            },
        ),
        (
            "error-with-nulls",
            "a tool error; null members of content blocks are omitted, as if absent",
            {
                "content": [
                    {"type": "text", "text": "no such city", "annotations": None, "_meta": {"k": None, "j": 1}}
                ],
                "isError": True,
                "structuredContent": None,
            },
        ),
        (
            "mixed",
            "image and embedded resource blocks, member order irrelevant",
            {
                "isError": False,
                "content": [
                    {"mimeType": "image/png", "data": "iVBORw0KGgo=", "type": "image"},
                    {"type": "resource", "resource": {"uri": "file:///r.txt", "text": "r", "mimeType": "text/plain"}},
                ],
            },
        ),
    ]
    return {
        "description": "docs/spec.md section 20: the bytes a tool result's per_tool_call receipt hashes "
        "(RFC 8785 JSON of content, isError and structuredContent), and their SHA-256.",
        "vectors": [
            {
                "name": name,
                "description": description,
                "result": result,
                "signed_bytes": result_bytes(result).decode("utf-8"),
                "sha256": sha256_digest(result_bytes(result)),
            }
            for name, description, result in cases
        ],
    }


def openai_agents_vector() -> dict[str, Any]:
    """OpenAI Agents SDK outputs (spec section 22) and the exact bytes their receipts hash: tool results
    as the ``output`` of their ``function_call_output`` item, final outputs as the agent produced them."""
    from countersign.integrations.openai_agents import final_output_bytes, tool_output_bytes

    tool_results: list[tuple[str, str, Any]] = [
        ("text", "a tool that returned text: its UTF-8", "invoice A7: 42.00 \u20ac"),
        ("stringified", "a tool that returned a dict: the SDK gives the model str() of it, signed as that text",
         "{'currency': 'EUR', 'limit': 100}"),
        ("structured", "structured content items (ToolOutputText, ToolOutputImage): canonical JSON of the list",
         [{"type": "input_text", "text": "refunds within 30 days"},
          {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"}]),
    ]  # fmt: skip
    final_outputs: list[tuple[str, str, Any]] = [
        ("text", "a final output of the default output type (str): its UTF-8", "Refund of 42.00 EUR approved."),
        ("structured", "a structured final output (output_type): canonical JSON of its JSON form",
         {"invoice": "A7", "amount": 42, "approved": True}),
    ]  # fmt: skip

    def case(name: str, description: str, value: Any, signed: bytes, member: str) -> dict[str, Any]:
        return {
            "name": name, "description": description, member: value,
            "signed_bytes": signed.decode("utf-8"), "sha256": sha256_digest(signed),
        }  # fmt: skip

    return {
        "description": "docs/spec.md section 22: the bytes an OpenAI Agents SDK tool result's or final output's "
        "receipt hashes, and their SHA-256.",
        "tool_results": [case(n, d, v, tool_output_bytes(v), "output") for n, d, v in tool_results],
        "final_outputs": [case(n, d, v, final_output_bytes(v), "final_output") for n, d, v in final_outputs],
    }


def rotation_vector() -> dict[str, Any]:
    """A key rotation with continuity (spec section 7.4): a log that enrols deployer-a, adds its next
    key, records the old key's endorsement of it and retires the old key; the custody chain it folds
    to; and endorse_key statements at sequence 2 that must be refused INVALID_STATEMENT."""
    from countersign.admission import (
        PAYLOAD_TYPE_KEY_ENDORSEMENT,
        AdmissionLog,
        KeyEndorsement,
        SignedEndorsement,
        StatementKind,
        custody_chain,
        endorse_key,
        sign_statement,
    )
    from countersign.keys import PublicKey
    from countersign.records import PAYLOAD_TYPE_REGISTRY_STATEMENT
    from countersign.samples import seeded_signer

    operator = seeded_signer(SEED, "operator")
    old, new, other = (seeded_signer(SEED, "deployer-a", g) for g in (0, 1, 2))
    log = AdmissionLog(PublicKey(operator.public_key))

    def statement(kind: StatementKind, key_id: str, issued_ms: int, **fields: Any) -> Any:
        return sign_statement(log.next_statement(kind, "deployer-a", key_id, issued_ms=issued_ms, **fields), operator)

    def public(signer: Ed25519Signer) -> str:
        return b64url_encode(signer.public_key)

    log.append(statement(StatementKind.ENROL_DEPLOYER, old.key_id, NOW_MS - 4_000, public_key=public(old), at_ms=0))
    log.append(
        statement(StatementKind.ADD_KEY, new.key_id, NOW_MS - 3_000, public_key=public(new), at_ms=NOW_MS - 3_000)
    )
    endorsement = endorse_key(old, "deployer-a", PublicKey(new.public_key), NOW_MS - 2_500)

    def endorsing(signed: SignedEndorsement, key_id: str = new.key_id) -> dict[str, Any]:
        return statement(StatementKind.ENDORSE_KEY, key_id, NOW_MS - 2_000, endorsement=signed).to_json()

    body = endorsement.endorsement
    as_statement = b64url_encode(old.sign(pae(PAYLOAD_TYPE_REGISTRY_STATEMENT, canonicalize(body.to_json()))))
    other_deployer = KeyEndorsement("deployer-b", old.key_id, new.key_id, public(new), body.issued_ms)
    unadded = endorse_key(old, "deployer-a", PublicKey(other.public_key), NOW_MS - 2_500)
    invalid = [
        {"why": "signed by the new key, not the old one", "signed_statement": endorsing(endorse_key(
            new, "deployer-a", PublicKey(new.public_key), body.issued_ms
        ))},
        {"why": "the old key's signature over the same body under the registry-statement payload type"
         " (domain separation)", "signed_statement": endorsing(SignedEndorsement(body, as_statement))},
        {"why": "the endorsement names another deployer", "signed_statement": endorsing(
            SignedEndorsement(other_deployer, b64url_encode(old.sign(other_deployer.signing_input())))
        )},
        {"why": "the endorsed key was never added to the deployer",
         "signed_statement": endorsing(unadded, other.key_id)},
    ]  # fmt: skip
    log.append(statement(StatementKind.ENDORSE_KEY, new.key_id, NOW_MS - 2_000, endorsement=endorsement))
    log.append(statement(StatementKind.RETIRE_KEY, old.key_id, NOW_MS - 1_000, at_ms=NOW_MS - 1_000))
    return {
        "description": "key rotation with continuity: the old key endorses its successor (spec 7.4)",
        "payload_type": PAYLOAD_TYPE_KEY_ENDORSEMENT,
        "operator_public_key": public(operator),
        "keys": {"old": public(old), "new": public(new), "never_added": public(other)},
        "endorsement": endorsement.to_json(),
        "endorsement_signing_input_hex": body.signing_input().hex(),
        "log": [signed.to_json() for signed in log.entries],
        "custody": custody_chain(log, "deployer-a").to_json(),
        "invalid_at_sequence_2": invalid,
    }


# --- registry checkpoints (spec 7.5) -------------------------------------------------------------


def checkpoint_vector() -> dict[str, Any]:
    """A two-statement registry log, the operator's checkpoint of it, and named checks: each gives the
    signed checkpoint, how many statements of the log the follower holds, the follower's clock, and
    the outcome (``fresh``, ``stale`` or the refusal code)."""
    from countersign.admission import AdmissionLog, StatementKind, sign_statement
    from countersign.checkpoint import (
        PAYLOAD_TYPE_REGISTRY_CHECKPOINT,
        Checkpoint,
        SignedCheckpoint,
        sign_checkpoint,
    )
    from countersign.keys import PublicKey

    operator = Ed25519Signer(hashlib.sha256(b"countersign test operator").digest())
    deployer = Ed25519Signer(hashlib.sha256(b"countersign test deployer").digest())
    log = AdmissionLog(PublicKey(operator.public_key))
    enrol = log.next_statement(
        StatementKind.ENROL_DEPLOYER, "deployer-a", deployer.key_id, issued_ms=1_700_000_000_000,
        public_key=b64url_encode(deployer.public_key), at_ms=0,
    )  # fmt: skip
    log.append(sign_statement(enrol, operator))
    revoke = log.next_statement(StatementKind.REVOKE_KEY, "deployer-a", deployer.key_id, issued_ms=1_700_000_060_000)
    log.append(sign_statement(revoke, operator))
    issued = 1_700_000_060_000
    body = Checkpoint(log.head_sequence, log.head_digest, issued, issued + 60_000)
    signed = sign_checkpoint(body, operator)
    canonical = canonicalize(body.to_json())

    def case(name: str, checkpoint: SignedCheckpoint, held: int, now: int, outcome: str, why: str) -> dict[str, Any]:
        return {
            "name": name, "signed_checkpoint": checkpoint.to_json(), "held_statements": held, "now_ms": now,
            "outcome": outcome, "why": why,
        }  # fmt: skip

    first = log.entries[0].digest()
    forked = sign_checkpoint(Checkpoint(1, sha256_digest(b"another statement"), issued, issued + 60_000), operator)
    other = Ed25519Signer(hashlib.sha256(b"countersign test impostor").digest())
    # The statement signature over the same canonical bytes: another payload type, so it must not verify.
    reused = SignedCheckpoint(body, operator.key_id, b64url_encode(operator.sign(enrol.signing_input())))
    return {
        "description": "an operator-signed checkpoint of a registry log (spec 7.5) and a follower's checks",
        "operator": {"key_id": operator.key_id, "public_key": b64url_encode(operator.public_key)},
        "log": [s.to_json() for s in log.entries],
        "log_digests": [s.digest() for s in log.entries],
        "checkpoint": body.to_json(),
        "payload_type": PAYLOAD_TYPE_REGISTRY_CHECKPOINT,
        "canonical": canonical.decode(),
        "signing_input_base64": base64.b64encode(body.signing_input()).decode(),
        "signed_checkpoint": signed.to_json(),
        "signed_checkpoint_digest": signed.digest(),
        "checks": [
            case("fresh", signed, 2, issued + 1_000, "fresh", "unexpired and names the held log's head"),
            case("expired", signed, 2, issued + 60_000, "stale", "now_ms equals expires_ms: expired"),
            case(
                "older-checkpoint-of-a-prefix",
                sign_checkpoint(Checkpoint(1, first, issued, issued + 60_000), operator),
                2,
                issued + 1_000,
                "fresh",
                "the held log extends the checkpointed one",
            ),
            case("ahead-of-the-copy", signed, 1, issued + 1_000, "stale", "names a statement the copy lacks"),
            case("fork", forked, 2, issued + 1_000, "CHAIN_MISMATCH", "the head is not on the held log's chain"),
            case(
                "impostor",
                sign_checkpoint(body, other),
                2,
                issued + 1_000,
                "BAD_STATEMENT_SIGNATURE",
                "not signed by the pinned operator key",
            ),
            case(
                "statement-signature",
                reused,
                2,
                issued + 1_000,
                "BAD_STATEMENT_SIGNATURE",
                "a signature under the statement payload type never verifies as a checkpoint",
            ),
        ],
    }


def handoff_vector(m: SampleMesh) -> dict[str, Any]:
    """A Delegation handoff (spec section 18) for a grant under the root of valid/signed-dag.json's path,
    and strings a child must refuse, each with the reason it is refused."""
    from countersign.canonical import canonicalize_validated
    from countersign.client.results import Grant
    from countersign.handoff import Delegation

    root = Path(build_path(m, Construction.SIGNED_DAG).envelopes[:1])
    grant = Grant(
        grant_id="vector-grant-0", parent_digest=root.leaf.digest(), parent_key_id=root.leaf.key_id,
        child_deployer="deployer-b", expires_ms=NOW_MS + 60_000,
    )  # fmt: skip
    text = Delegation(root, grant, "signer-a.example:7401").to_string()
    decoded = json.loads(base64.urlsafe_b64decode(text[4:] + "=" * (-len(text[4:]) % 4)))
    replicas = "signer-a-1.example:7401,signer-a-2.example:7401,[fd00::3]:7401"  # spec 18, 21.3
    replicated = Delegation(root, grant, replicas).to_string()

    def with_signer(parent_signer: str) -> str:
        body = canonicalize_validated({**decoded, "parent_signer": parent_signer})
        return "cs1." + base64.urlsafe_b64encode(body).rstrip(b"=").decode()

    return {
        "description": "a Delegation handoff: cs1. then unpadded base64url of the canonical JSON object",
        "handoff": text,
        "decoded": decoded,
        "replicated": {
            "description": "the same grant, its parent_signer naming three replicas of the parent's signer",
            "handoff": replicated,
            "parent_signer": replicas,
        },
        "invalid": [
            {"handoff": "cs2." + text[4:], "why": "an unknown version prefix"},
            {"handoff": text + "=", "why": "padding: one encoding per byte string"},
            {"handoff": text[:-8], "why": "truncated"},
            {"handoff": "cs1." + base64.urlsafe_b64encode(b'{"v":1}').rstrip(b"=").decode(), "why": "members missing"},
            {"handoff": with_signer(",".join(f"s{i}.example:7401" for i in range(9))), "why": "nine parent signers"},
            {"handoff": with_signer("a.example:7401,,b.example:7401"), "why": "an empty parent signer"},
            {"handoff": with_signer("a.example:7401, b.example:7401"), "why": "a space in the parent signers"},
            {"handoff": with_signer("a.example:7401,b.example"), "why": "a parent signer without a port"},
            {"handoff": with_signer("a.example:7401,b.example:0"), "why": "a parent signer with port 0"},
        ],
    }


EXPORT_FILES = {
    "dsse": "signed-dag.dsse.jsonl",
    "in-toto": "signed-dag.intoto.json",
    "prov-json": "signed-dag.prov.json",
    "prov-n": "signed-dag.provn",
    "prov-o": "signed-dag.prov.ttl",
}


def export_vectors(out: FilePath, path: Path) -> None:
    """One file per export format, exactly as ``countersign export`` writes it (needs the export extra)."""
    from countersign.export import export_path

    out.mkdir(parents=True, exist_ok=True)
    for fmt, name in EXPORT_FILES.items():
        (out / name).write_bytes(export_path(path, fmt, output=OUTPUT, subject_name="output.bin"))


# --- sessions (docs/spec.md section 17) ---------------------------------------------------------

TURNS = (b"First turn.\n", b"Second turn.\n", b"Third turn.\n")
STREAM = (b"The s", b"tream", b" ends", b".")  # four-byte chunks; the last one short
SESSION_ISSUED_MS = CREATED_MS + 1_000  # what SampleMesh.issue_session is told; records created at CREATED_MS


def session_vector(
    name: str,
    description: str,
    agent: Path,
    receipts: Sequence[Envelope],
    outputs: Sequence[bytes | None],
    expected: tuple[str, str | None, int | None],
    *,
    registry: Registry,
    require_closed: bool = False,
) -> dict[str, Any]:
    """A session presentation: the agent path, the receipts in the order presented, and the bytes of
    each output (null: not presented)."""
    verdict, reason, index = expected
    return {
        "name": name,
        "description": description,
        "now_ms": NOW_MS,
        "clock_skew_ms": 60_000,
        "require_closed": require_closed,
        "registry": registry_json(registry),
        "session": SessionEvidence(agent, tuple(receipts)).to_json(),
        "outputs_base64": [None if o is None else base64.b64encode(o).decode() for o in outputs],
        "expected": {"verdict": verdict, "reason": reason, "index": index},
    }


def session_vectors(m: SampleMesh, out: FilePath) -> None:
    """Valid sessions, one named invalid session per session reason, and sessions under a consumer
    policy (``policy``: the policy document the check applies)."""
    (out / "valid").mkdir(parents=True, exist_ok=True)
    (out / "invalid").mkdir(parents=True, exist_ok=True)
    agent = Path(build_path(m, Construction.SIGNED_DAG).envelopes[:3])  # deployer-b's agent, no output
    other_agent = Path(
        build_path(m, Construction.SIGNED_DAG, ["deployer-b"], label="other", prefix=agent.envelopes[:2]).envelopes
    )
    other_agent = resign(m, other_agent, 2, lambda r: replace(r, output=None, max_children=2))

    def receipts(on: Path, outputs: Sequence[bytes], session: str = "chat-1", **kw: Any) -> tuple[Envelope, ...]:
        return m.issue_session(on, outputs, now_ms=SESSION_ISSUED_MS, session=session, label=session, **kw)

    closed = receipts(agent, TURNS, closed=True)
    stream = receipts(agent, STREAM, "stream-1", closed=True, stream=(StreamUnit.BYTES, 4))
    turns: list[bytes | None] = list(TURNS)
    chunks: list[bytes | None] = list(STREAM)
    valid = [
        ("turns-open", "three turns of an open session, outputs presented", closed[:3], turns, False),
        ("turns-closed", "three turns and the close receipt, closed session required", closed, [*turns, None], True),
        ("stream-closed", "a byte stream in chunks of 4, closed", stream, [*chunks, None], True),
        ("stream-partial", "the first two chunks of the stream: verifiable up to the last signed chunk",
         stream[:2], chunks[:2], False),
    ]  # fmt: skip
    for name, description, items, outputs, need_closed in valid:
        body = session_vector(
            name, description, agent, items, outputs, ("ACCEPT", None, None),
            registry=m.registry, require_closed=need_closed,
        )  # fmt: skip
        write(out / "valid" / f"{name}.json", body)

    other_session = receipts(agent, TURNS, "chat-2")
    fork = receipts(agent, (TURNS[0], b"Another second turn.\n"), "chat-1-fork")
    fork_second = resign(m, Path((*agent.envelopes, fork[1])), 3, lambda r: _renamed(r, "chat-1", fork[0].digest()))
    spliced_agent = receipts(other_agent, TURNS, "chat-1")
    close = closed[3]
    after_close = resign(m, Path((*agent.envelopes, closed[2])), 3, lambda r: _after(r, close.digest()))
    invalid = [
        ("session-agent-mismatch", "receipt 1 was issued under another agent record (cross-agent splice)",
         [closed[0], spliced_agent[1], closed[2]], "SESSION_AGENT_MISMATCH", 1, False),
        ("session-mismatch", "receipt 1 belongs to another session of the agent (cross-session splice)",
         [closed[0], other_session[1], closed[2]], "SESSION_MISMATCH", 1, False),
        ("session-duplicate", "receipt 1 presented twice", [closed[0], closed[1], closed[1], closed[2]],
         "SESSION_DUPLICATE", 1, False),
        ("session-reordered", "receipts 1 and 2 swapped", [closed[0], closed[2], closed[1]], "SESSION_REORDERED", 1,
         False),
        ("session-gap", "receipt 1 dropped", [closed[0], closed[2]], "SESSION_GAP", 1, False),
        ("session-chain-broken", "a second receipt for position 1, chaining to another receipt 0 (a fork)",
         [closed[0], fork_second.leaf], "SESSION_CHAIN_BROKEN", 1, False),
        ("session-truncated", "the closed session shown without its close receipt", closed[:3], "SESSION_TRUNCATED",
         None, True),
        ("session-after-close", "a receipt after the close receipt (re-signed by a faulty issuer)",
         [*closed, after_close.leaf], "SESSION_AFTER_CLOSE", 4, False),
    ]  # fmt: skip
    for name, description, items, reason, index, need_closed in invalid:
        outputs: list[bytes | None] = [None] * len(items)
        body = session_vector(
            name, description, agent, items, outputs, ("REJECT", reason, index),
            registry=m.registry, require_closed=need_closed,
        )  # fmt: skip
        write(out / "invalid" / f"{name}.json", body)
    substituted = [STREAM[0], b"TREAM", STREAM[2], STREAM[3], None]
    write(
        out / "invalid" / "session-output-mismatch.json",
        session_vector(
            "session-output-mismatch",
            "chunk 1 of the stream replaced by other bytes",
            agent,
            stream,
            substituted,
            ("REJECT", "SESSION_OUTPUT_MISMATCH", 1),
            registry=m.registry,
            require_closed=True,
        ),
    )

    # Step C for sessions (spec 16.3): a consumer policy applied to each receipt's path, in order.
    (out / "policy").mkdir(parents=True, exist_ok=True)
    closed_only = {"v": 1, "policy": {"require_closed_session": True}}
    not_b = {"v": 1, "policy": {"allowed_deployers": ["deployer-a", "deployer-c"]}}
    with_policy = [
        ("require-closed-session-closed", "a closed session proves itself closed: require_closed_session allows it",
         closed, [*turns, None], closed_only, ("ACCEPT", None, None)),
        ("require-closed-session-open", "an open session does not: refused at its first receipt",
         closed[:3], turns, closed_only, ("REJECT", "CONSUMER_POLICY_VIOLATION", 0)),
        ("allowed-deployers", "the agent's deployer is not allowed: refused at the first receipt",
         closed, [*turns, None], not_b, ("REJECT", "CONSUMER_POLICY_VIOLATION", 0)),
    ]  # fmt: skip
    for name, description, items, outputs, document, expected in with_policy:
        body = session_vector(name, description, agent, items, outputs, expected, registry=m.registry)
        write(out / "policy" / f"{name}.json", {**body, "policy": document})


def session_state_vectors(m: SampleMesh, out: FilePath) -> None:
    """Sessions whose check (17.3) holds and whose state step (17.4) refuses them, against a fresh,
    empty state (``mode``; ``before``: sessions to verify first, each accepted)."""
    (out / "state").mkdir(parents=True, exist_ok=True)
    agent = Path(build_path(m, Construction.SIGNED_DAG).envelopes[:3])
    turns = m.issue_session(agent, TURNS, now_ms=SESSION_ISSUED_MS, session="chat-1", label="chat-1")
    repeated = resign(m, Path((*agent.envelopes, turns[2])), 3, lambda r: replace(r, nonce=turns[1].record.nonce))
    # deployer-b's first record allows no child, yet its agent record is one (a faulty issuer, re-signed)
    no_children = resign(m, agent, 1, lambda r: replace(r, max_children=0))
    crowded = _relinked(m, list(no_children.envelopes), 2)
    crowded_turns = m.issue_session(crowded, TURNS[:2], now_ms=SESSION_ISSUED_MS, session="chat-1", label="crowded")
    cases = [
        ("nonce-repeated", "receipt 2 repeats receipt 1's nonce (re-signed by a faulty issuer)", agent,
         [turns[0], turns[1], repeated.leaf], "accept", [], ("REJECT", "NONCE_REPLAYED", 2)),
        ("nonce-repeated-audit", "the same in audit mode, which consumes nothing and so refuses no nonce", agent,
         [turns[0], turns[1], repeated.leaf], "audit", [], ("ACCEPT", None, None)),
        ("fanout-exceeded", "the agent path's record 1 allows no child but has one: refused at receipt 0", crowded,
         list(crowded_turns), "audit", [], ("REJECT", "FANOUT_EXCEEDED", 0)),
        ("replayed", "the open session presented again after it was accepted", agent, list(turns), "accept",
         [list(turns)], ("REJECT", "NONCE_REPLAYED", 0)),
    ]  # fmt: skip
    for name, description, on, items, mode, before, expected in cases:
        body = session_vector(name, description, on, items, TURNS[: len(items)], expected, registry=m.registry)
        body["mode"] = mode
        body["before"] = [SessionEvidence(on, tuple(b)).to_json() for b in before]
        write(out / "state" / f"{name}.json", body)


def session_nesting_vectors(m: SampleMesh, out: FilePath) -> None:
    """The nesting limit (2.1) inside session evidence: session, receipts, envelope, record and agent
    are five levels, so a receipt's agent instance of 27 nested arrays is 32 levels (the schema refuses
    it at that receipt) and one of 28 is 33 (refused at index null, before anything else)."""
    (out / "malformed").mkdir(parents=True, exist_ok=True)
    agent = Path(build_path(m, Construction.SIGNED_DAG).envelopes[:3])
    turns = m.issue_session(agent, TURNS, now_ms=SESSION_ISSUED_MS, session="chat-1", label="chat-1")
    for levels, name, index in ((27, "receipt-nested-at-limit", 1), (28, "receipt-nested-over-limit", None)):
        body = session_vector(
            name, f"receipt 1's agent instance nested {levels} arrays deep: {levels + 5} levels", agent, turns,
            [None] * len(turns), ("REJECT", "MALFORMED", index), registry=m.registry,
        )  # fmt: skip
        deep: Any = 0
        for _ in range(levels):
            deep = [deep]
        body["session"]["receipts"][1]["record"]["agent"]["instance"] = deep
        write(out / "malformed" / f"{name}.json", body)


def _renamed(record: NodeRecord, session: str, prev: str) -> NodeRecord:
    assert record.output is not None
    return replace(record, output=replace(record.output, session=session, prev=prev))


def _after(record: NodeRecord, close_digest: str) -> NodeRecord:
    assert record.output is not None
    return replace(record, nonce=nonce("after-close", 0), output=replace(record.output, seq=4, prev=close_digest))


def write(location: FilePath, body: dict[str, Any]) -> None:
    location.write_text(json.dumps(body, indent=2, sort_keys=True) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(FilePath(__file__).parent))
    args = parser.parse_args(argv)
    generate(FilePath(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
