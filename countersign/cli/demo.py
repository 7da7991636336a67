"""``countersign demo --offline``: the protocol in one process, no daemons.

A Planner at deployer A delegates to a Researcher at deployer B, who delegates to a Writer at
deployer C. The path is SIGNED-DAG: each cross-deployer edge is co-signed by both deployers. Then the
adversary tries a replay, a substituted output and a graft with a stolen child key.
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import replace
from pathlib import Path as FilePath

from countersign.canonical import sha256_digest
from countersign.cli.main import EXIT_OK, EXIT_REJECTED
from countersign.cli.offline import now_ms, render_tree
from countersign.constructions import (
    EdgeProposal,
    RecordFields,
    cosign,
    draft_record,
    issue,
    local_parent_cosigner,
    seal,
)
from countersign.reasons import VerificationResult
from countersign.records import AgentRef, BindingScope, Construction, CoSignerRole, Envelope, OutputReceipt, Path
from countersign.samples import SampleMesh
from countersign.verify import Mode, verify_path

DEPLOYERS = ("deployer-a", "deployer-b", "deployer-c")
ROLES = ("planner", "researcher", "writer")


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = commands.add_parser("demo", help="run the demonstration")
    demo.add_argument("--offline", action="store_true", help="in one process, without daemons")
    demo.set_defaults(handler=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    return run_offline_demo()


def _line(label: str, result: VerificationResult, expect_accept: bool) -> tuple[str, bool]:
    verdict = result.verdict.value if result else f"{result.verdict.value} {result.reason} at [{result.index}]"
    ok = bool(result) == expect_accept
    return f"  {'ok ' if ok else 'BAD'} {label:<58} {verdict}", ok


def delegate(mesh: SampleMesh, construction: Construction, outputs: list[bytes], now: int, system: str) -> Path:
    """Planner (A) -> Researcher (B) -> Writer (C), each emitting an output receipt."""
    envelopes: list[Envelope] = []
    for index, (deployer, role, output) in enumerate(zip(DEPLOYERS, ROLES, outputs, strict=True)):
        fields = RecordFields(
            deployer=deployer,
            agent=AgentRef(f"{role}-1", system),
            created_ms=now,
            expires_ms=now + 600_000 - index,
            max_children=2,
            output=OutputReceipt(sha256_digest(output), BindingScope.PER_TURN, f"{system}-{role}", 0, None),
        )
        parent = mesh.signers[envelopes[-1].record.deployer] if envelopes else None
        envelopes.append(
            issue(
                construction,
                fields,
                mesh.signers[deployer],
                envelopes,
                parent_key_id=None if parent is None else parent.key_id,
                parent_cosigner=None if parent is None else local_parent_cosigner(parent),
            )
        )
    return Path(tuple(envelopes))


def graft_with_stolen_key(mesh: SampleMesh, honest: Path, construction: Construction, output: bytes, now: int) -> Path:
    """The adversary holds deployer B's key and hangs a record of its own under the Planner's root.

    Deployer A never agreed, so there is no parent co-signature; the best the adversary can do under
    SIGNED-DAG is to reuse A's co-signature from the honest A->B edge (it covers another manifest).
    """
    root = honest.envelopes[0]
    stolen = mesh.signers["deployer-b"]
    fields = RecordFields(
        deployer="deployer-b",
        agent=AgentRef("rogue-researcher", root.record.agent.system),
        created_ms=now,
        expires_ms=now + 500_000,
        output=OutputReceipt(sha256_digest(output), BindingScope.PER_TURN, "rogue-session", 0, None),
    )
    draft = draft_record(construction, fields, stolen.key_id, [root])
    if construction.cosigns_edges:
        proposal = EdgeProposal(root, draft, mesh.signers["deployer-a"].key_id)
        reused_parent_cosig = honest.envelopes[1].record.cosigs[0]
        draft = replace(draft, cosigs=(reused_parent_cosig, cosign(proposal, stolen, CoSignerRole.CHILD)))
    return Path((root, seal(draft, stolen)))


def run_offline_demo() -> int:
    from verifier.stores.sqlite import SqliteState

    now = now_ms()
    mesh = SampleMesh.create(DEPLOYERS)
    outputs = [
        b"plan: research the question, then write it up\n",
        b"findings: three sources agree\n",
        b"Final report: the three sources agree on the answer.\n",
    ]
    path = delegate(mesh, Construction.SIGNED_DAG, outputs, now, "demo-system")
    final = outputs[-1]
    print("Countersign offline demo: Planner (deployer-a) -> Researcher (deployer-b) -> Writer (deployer-c)\n")
    print(render_tree(path))
    print()
    lines: list[tuple[str, bool]] = []
    with tempfile.TemporaryDirectory(prefix="countersign-demo-") as workdir:
        state = SqliteState(FilePath(workdir) / "verifier-state.db")
        try:

            def check(p: Path, output: bytes, mode: Mode = Mode.ACCEPT) -> VerificationResult:
                return verify_path(p, output, registry=mesh.registry, state=state, mode=mode, now_ms=now)

            lines.append(_line("final output verified (SIGNED-DAG, 7 signatures)", check(path, final), True))
            lines.append(_line("replay of the same path", check(path, final), False))
            lines.append(
                _line("audit of the consumed path (audit mode consumes nothing)", check(path, final, Mode.AUDIT), True)
            )
            substituted = b"Final report: the sources disagree.\n"
            lines.append(_line("substituted output bytes", check(path, substituted), False))
            rogue = b"rogue output the planner never asked for\n"
            graft = graft_with_stolen_key(mesh, path, Construction.SIGNED_DAG, rogue, now)
            lines.append(_line("graft under the Planner with deployer-b's stolen key", check(graft, rogue), False))
            linked = delegate(mesh, Construction.LINKED_LIST, outputs, now, "demo-linked")
            graft_ll = graft_with_stolen_key(mesh, linked, Construction.LINKED_LIST, rogue, now)
            lines.append(
                _line("same graft under LINKED-LIST (known limit: child signs alone)", check(graft_ll, rogue), True)
            )
        finally:
            state.close()
    for text, _ in lines:
        print(text)
    failed = [text for text, ok in lines if not ok]
    print("\nall outcomes as expected" if not failed else f"\n{len(failed)} outcomes NOT as expected")
    return EXIT_OK if not failed else EXIT_REJECTED
