"""``countersign demo``: the local mesh, end to end (``make demo``); ``--offline`` runs it in one process.

The mesh demo starts a coordinator, three deployers' signers and a verifier as real processes on
loopback with mTLS, enrols the deployers through operator-signed statements, runs a Planner
(deployer-a) -> Researcher (deployer-b) -> Writer (deployer-c) delegation with output receipts,
verifies the final output through the verifier service, and then shows the attacks and limits.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path as FilePath
from typing import TYPE_CHECKING

from countersign._clock import now_ms
from countersign.canonical import b64url_encode, sha256_digest
from countersign.constructions import (
    EdgeProposal,
    RecordFields,
    cosign,
    draft_record,
    issue,
    local_parent_cosigner,
    seal,
)
from countersign.keys import Signer
from countersign.reasons import Reason, VerificationResult
from countersign.records import AgentRef, BindingScope, Construction, CoSignerRole, Envelope, OutputReceipt, Path
from countersign.samples import SampleMesh
from countersign.verify import Mode, verify_path
from countersign_cli.common import EXIT_OK, EXIT_REJECTED, Commands, UsageError, render_tree

if TYPE_CHECKING:
    from countersign.client import SignerClient, VerifierClient
    from countersign_cli.localmesh import LocalMesh

DEPLOYERS = ("deployer-a", "deployer-b", "deployer-c")
ROLES = ("planner", "researcher", "writer")
OUTPUTS = (
    b"plan: research the question, then write it up\n",
    b"findings: three independent sources agree\n",
    b"Final report: the three sources agree on the answer.\n",
)


def register(commands: Commands) -> None:
    demo = commands.add_parser("demo", help="run the local mesh demonstration (make demo)")
    demo.add_argument("--offline", action="store_true", help="in one process, without daemons")
    demo.add_argument(
        "--export", help="leave the final path, output, registry export, operator key and verifier store here"
    )
    demo.add_argument("--workdir", help="keep the mesh's keys, configs, state and logs here (default: temporary)")
    demo.add_argument("--plaintext", action="store_true", help="mTLS off (loopback only)")
    demo.add_argument(
        "--keep-running", action="store_true",
        help="leave the mesh up afterwards, with a path to verify remotely, until Ctrl-C or SIGTERM (make mesh)",
    )  # fmt: skip
    demo.set_defaults(handler=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    if args.offline:
        return run_offline_demo()
    return run_mesh_demo(
        export=None if args.export is None else FilePath(args.export).absolute(),
        workdir=None if args.workdir is None else FilePath(args.workdir).absolute(),  # daemons run elsewhere
        tls=not args.plaintext,
        keep_running=args.keep_running,
    )


class Report:
    def __init__(self) -> None:
        self.failed: list[str] = []

    def outcome(
        self, label: str, result: VerificationResult, expected: Reason | None, note: str = "", where: str = "record"
    ) -> None:
        ok = (expected is None and bool(result)) or (expected is not None and result.reason is expected)
        at = "at the end" if result.index is None else f"at {where} {result.index}"
        verdict = "ACCEPT" if result else f"REJECT {result.reason} {at}"
        print(f"  {'ok ' if ok else 'BAD'} {label:<62} {verdict}{note}", flush=True)
        if not ok:
            self.failed.append(label)


# --- the graft with a stolen child key ---------------------------------------------------------


def graft_with_stolen_key(
    honest: Path, stolen: Signer, child_deployer: str, output: bytes, now: int, parent_key_id: str
) -> Path:
    """Hang a record of the adversary's own under the honest root, signed with a stolen child key.

    The root's deployer never agreed, so there is no parent co-signature; under SIGNED-DAG the best
    the adversary can do is reuse the parent's co-signature from the honest edge (it covers another
    edge manifest). LINKED-LIST asks for nothing more than the child's own signature.
    """
    root = honest.envelopes[0]
    construction = root.record.construction
    fields = RecordFields(
        deployer=child_deployer,
        agent=AgentRef("rogue-researcher", root.record.agent.system),
        created_ms=now,
        expires_ms=min(now + 500_000, root.record.expires_ms),
        max_children=0,
        output=OutputReceipt(sha256_digest(output), BindingScope.PER_TURN, "rogue-session", 0, None),
    )
    draft = draft_record(construction, fields, stolen.key_id, [root])
    if construction.cosigns_edges:
        proposal = EdgeProposal(root, draft, parent_key_id)
        reused = next(e.record.cosigs[0] for e in honest.envelopes[1:] if e.record.cosigs)
        draft = replace(draft, cosigs=(reused, cosign(proposal, stolen, CoSignerRole.CHILD)))
    return Path((root, seal(draft, stolen)))


# --- the mesh demo -----------------------------------------------------------------------------


def run_mesh_demo(*, export: FilePath | None, workdir: FilePath | None, tls: bool, keep_running: bool = False) -> int:
    from countersign.admission import StatementKind
    from countersign.keys import Ed25519Signer
    from countersign_cli.localmesh import LocalMesh, MeshError

    temporary = workdir is None
    root_dir = FilePath(tempfile.mkdtemp(prefix="countersign-demo-")) if workdir is None else workdir
    # deployer-c's signer runs as two replicas over one state: one is killed mid-session (writer_session).
    mesh = LocalMesh(
        root_dir / "mesh", deployers=DEPLOYERS, tls=tls, staleness_ms=30_000, heartbeat_ms=250,
        signer_replicas={"deployer-c": 2},
    )  # fmt: skip
    report = Report()
    print(f"Countersign demo: a local mesh on loopback ({'mTLS' if tls else 'plaintext'}), work dir {root_dir}\n")
    try:
        started = time.perf_counter()
        mesh.setup().start_all()
        for name, daemon in mesh.daemons.items():
            print(f"  started {name:<13} pid {daemon.process.pid if daemon.process else '-':<7} {daemon.address}")
        mesh.enrol_all()
        elapsed = time.perf_counter() - started
        print(f"  operator enrolled {', '.join(DEPLOYERS)} (registry sequence 3) in {elapsed:.1f} s\n")

        runtimes = {d: mesh.runtime(d) for d in DEPLOYERS}
        address = {d: mesh.signer_addresses(d) for d in DEPLOYERS}
        system = f"demo-{int(time.time())}"
        print("Delegation: Planner (deployer-a) -> Researcher (deployer-b) -> Writer (deployer-c)")
        planner = runtimes["deployer-a"].root("planner-1", system, max_children=4)
        planner_receipt = runtimes["deployer-a"].receipt(
            planner, hashlib.sha256(OUTPUTS[0]).digest(), session="planner"
        )
        grant_b = runtimes["deployer-a"].open_grant(planner, "deployer-b")
        researcher = runtimes["deployer-b"].accept(planner, grant_b, address["deployer-a"], "researcher-1")
        runtimes["deployer-b"].receipt(researcher, hashlib.sha256(OUTPUTS[1]).digest(), session="researcher")
        grant_c = runtimes["deployer-b"].open_grant(researcher, "deployer-c")
        writer = runtimes["deployer-c"].accept(researcher, grant_c, address["deployer-b"], "writer-1")
        final = runtimes["deployer-c"].receipt(writer, hashlib.sha256(OUTPUTS[2]).digest(), session="writer")
        print(f"  planner receipt, 2 co-signed cross-deployer edges, writer receipt: {len(final)} records\n")
        print(render_tree(final))
        print()

        verifier = mesh.verifier_client()
        data = final.to_bytes()
        print("Verification through the verifier service:")
        report.outcome("final output of the Writer", verifier.verify(data, OUTPUTS[2]).result, None)
        report.outcome("replay of the same path", verifier.verify(data, OUTPUTS[2]).result, Reason.NONCE_REPLAYED)
        report.outcome(
            "substituted output bytes",
            verifier.verify(data, b"Final report: they disagree.\n").result,
            Reason.OUTPUT_MISMATCH,
        )
        report.outcome(
            "planner's receipt (a sibling branch; audit mode)",
            verifier.verify(planner_receipt.to_bytes(), OUTPUTS[0], audit=True).result,
            None,
        )

        stolen = mesh.deployer_keys["deployer-b"]
        rogue = b"rogue findings the planner never asked for\n"
        now = now_ms()
        graft = graft_with_stolen_key(final, stolen, "deployer-b", rogue, now, mesh.deployer_keys["deployer-a"].key_id)
        report.outcome(
            "graft under the Planner with deployer-b's stolen key", verifier.verify(graft.to_bytes(), rogue).result,
            Reason.BAD_COSIGNATURE,
        )  # fmt: skip
        linked = linked_list_root(mesh.deployer_keys["deployer-a"], system, now)
        graft_ll = graft_with_stolen_key(
            linked, stolen, "deployer-b", rogue, now, mesh.deployer_keys["deployer-a"].key_id
        )
        report.outcome(
            "same graft under LINKED-LIST", verifier.verify(graft_ll.to_bytes(), rogue).result, None,
            note="  <- known limit: the child signs alone",
        )  # fmt: skip

        writer_session(verifier, runtimes["deployer-c"], writer, report, mesh)

        print("\nRevocation without restart:")
        operator = mesh.operator_client()
        extra = Ed25519Signer.generate()
        operator.submit(
            StatementKind.ENROL_DEPLOYER,
            "deployer-d",
            extra.key_id,
            public_key=b64url_encode(extra.public_key),
            at_ms=0,
        )
        mesh.wait_for_registry(4)
        d_path = single_root(extra, "deployer-d", system, now_ms())
        report.outcome("a path signed by deployer-d (audit)", wait_for(verifier, d_path, None), None)
        revoked_at = time.perf_counter()
        operator.submit(StatementKind.REVOKE_KEY, "deployer-d", extra.key_id, note="demo: key reported stolen")
        result = wait_for(verifier, d_path, Reason.KEY_REVOKED)
        delay_ms = (time.perf_counter() - revoked_at) * 1000
        report.outcome("the same path after the operator revoked the key", result, Reason.KEY_REVOKED,
                       note=f"  (visible after {delay_ms:.0f} ms)")  # fmt: skip
        operator.close()

        if export is not None:
            export_evidence(mesh, export, final, OUTPUTS[2])
        if keep_running and not report.failed:
            from countersign_cli.keep_running import hold

            hold(mesh, runtimes["deployer-a"], root_dir)
        verifier.close()
        for client in runtimes.values():
            client.close()
    except MeshError as exc:
        raise UsageError(f"the mesh did not start: {exc}") from None
    finally:
        codes = mesh.stop_all()
        print(f"\nshut down: {', '.join(f'{n} exit {c}' for n, c in codes.items())}")
        if temporary:
            shutil.rmtree(root_dir, ignore_errors=True)
    unclean = [name for name, code in codes.items() if code not in (0, None)]
    if unclean:
        report.failed += [f"{name} did not exit cleanly" for name in unclean]
    print("all outcomes as expected" if not report.failed else f"NOT as expected: {', '.join(report.failed)}")
    return EXIT_OK if not report.failed else EXIT_REJECTED


TURNS = (
    b"Draft: the three sources agree on the answer.\n",
    b"Revision: the sources agree, with one caveat.\n",
    b"Final: the sources agree; the caveat is noted.\n",
)


def writer_session(
    verifier: VerifierClient, writer_runtime: SignerClient, writer: Path, report: Report, mesh: LocalMesh
) -> None:
    """The Writer's three-turn session, signed through deployer-c's signer and closed, verified as a
    whole by the verifier service (``VerifySession``, accept mode: every receipt consumed at once); then
    the same session shown again, reordered, with a turn dropped, and truncated, each rejected.

    deployer-c's signer runs as two replicas: the one answering is SIGKILLed after the second turn, the
    runtime's next calls are answered by the other (its SDK retries under the same request id), and the
    session is still one; the killed replica is then restarted on the same state."""
    from countersign.sessions import SessionEvidence

    print("\nSession: the Writer's three turns, signed by deployer-c's signer (two replicas), then closed")
    turns = [writer_runtime.receipt(writer, hashlib.sha256(t).digest(), session="writer-chat").leaf for t in TURNS[:2]]
    first, other = mesh.signer_names("deployer-c")
    process = mesh.daemons[first].process
    pid = process.pid if process is not None else "-"
    mesh.kill(first)
    print(f"  turns 1-2 signed; SIGKILLed {first} (pid {pid}) mid-session")
    turns.append(writer_runtime.receipt(writer, hashlib.sha256(TURNS[2]).digest(), session="writer-chat").leaf)
    close = writer_runtime.close_session(writer, session="writer-chat").leaf
    seqs = [t.record.output.seq for t in (*turns, close) if t.record.output is not None]
    print(f"  turn 3 and the close receipt signed by {other}: seq {seqs[2]} and {seqs[3]}, chained to turn 2")
    mesh.start(first)
    print(f"  {first} restarted on the same state\n")

    def check(receipts: list[Envelope], outputs: list[bytes | None], closed: bool = True) -> VerificationResult:
        evidence = SessionEvidence(writer, tuple(receipts))
        return verifier.verify_session(evidence, outputs, require_closed=closed).result

    t0, t1, t2 = TURNS
    report.outcome(
        "the closed session, three turns (consumer requires closed)",
        check([*turns, close], [t0, t1, t2, None]), None, where="receipt",
    )  # fmt: skip
    report.outcome(
        "the same session shown again", check([*turns, close], [t0, t1, t2, None]), Reason.NONCE_REPLAYED,
        where="receipt",
    )  # fmt: skip
    report.outcome(
        "the same session reordered (turns 1, 0, 2)",
        check([turns[1], turns[0], turns[2], close], [t1, t0, t2, None]), Reason.SESSION_REORDERED, where="receipt",
    )  # fmt: skip
    report.outcome(
        "the same session with turn 1 dropped",
        check([turns[0], turns[2], close], [t0, t2, None]), Reason.SESSION_GAP, where="receipt",
    )  # fmt: skip
    report.outcome(
        "the same session truncated (close receipt removed)",
        check(turns, [t0, t1, t2]), Reason.SESSION_TRUNCATED, where="receipt",
    )  # fmt: skip


def wait_for(
    verifier: VerifierClient, path: Path, reason: Reason | None, timeout_s: float = 10.0
) -> VerificationResult:
    """Audit ``path`` until the verdict has ``reason`` (None: accepted) or the time is up."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = verifier.verify(path.to_bytes(), b"deployer-d output\n", audit=True).result
        if result.reason is reason or time.monotonic() > deadline:
            return result
        time.sleep(0.005)


def single_root(key: Signer, deployer: str, system: str, now: int) -> Path:
    fields = RecordFields(
        deployer=deployer,
        agent=AgentRef("mobile-agent-1", system),
        created_ms=now,
        expires_ms=now + 600_000,
        output=OutputReceipt(sha256_digest(b"deployer-d output\n"), BindingScope.PER_SESSION, "d-session", 0, None),
    )
    return Path((issue(Construction.SIGNED_DAG, fields, key),))


def linked_list_root(key: Signer, system: str, now: int) -> Path:
    fields = RecordFields(
        deployer="deployer-a", agent=AgentRef("planner-ll", system), created_ms=now, expires_ms=now + 600_000
    )
    return Path((issue(Construction.LINKED_LIST, fields, key),))


def export_evidence(mesh: object, out: FilePath, path: Path, output: bytes) -> None:
    from countersign.admission import AdmissionLog, SignedStatement
    from countersign.client.operator import coordinator_log
    from countersign.keys import PublicKey
    from countersign_cli.localmesh import LocalMesh

    assert isinstance(mesh, LocalMesh)
    out.mkdir(parents=True, exist_ok=True)
    operator_key = PublicKey(mesh.operator.public_key)
    log = AdmissionLog(operator_key)
    log.extend(
        [
            SignedStatement.from_bytes(s)
            for s in coordinator_log(mesh.daemons["coordinator"].address, mesh.tls_for("client"))
        ]
    )
    (out / "path.json").write_bytes(path.to_bytes())
    (out / "output.bin").write_bytes(output)
    (out / "registry.json").write_text(json.dumps(log.registry.to_json(), indent=2) + "\n")
    (out / "registry-log.json").write_text(
        json.dumps({"statements": [s.to_json() for s in log.entries]}, indent=2) + "\n"
    )
    (out / "operator.pub.json").write_text(
        json.dumps({"key_id": operator_key.key_id, "public_key": b64url_encode(operator_key.raw)}) + "\n"
    )
    state = mesh.workdir / "state" / "verifier-0.db"
    if state.exists():  # the verifier's store, verdict log included, for `countersign impact`
        import sqlite3

        source, copy = sqlite3.connect(state), sqlite3.connect(out / "verifier-state.db")
        try:
            source.backup(copy)  # a consistent copy of a database the verifier is still writing
        finally:
            copy.close()
            source.close()
    print(
        f"\nexported to {out}: path.json output.bin registry.json registry-log.json operator.pub.json"
        + (" verifier-state.db" if state.exists() else "")
    )
    print(f"  check offline: countersign verify --path {out}/path.json --output {out}/output.bin "
          f"--registry {out}/registry.json --audit")  # fmt: skip
    if state.exists():
        print(
            f"  what relied on a key: countersign impact --key KEY_ID --state sqlite:///{out.resolve()}/verifier-state.db"
        )


# --- the offline demo --------------------------------------------------------------------------


def delegate(mesh: SampleMesh, construction: Construction, now: int, system: str) -> Path:
    """Planner (A) -> Researcher (B) -> Writer (C), each record carrying its output receipt."""
    envelopes: list[Envelope] = []
    for index, (deployer, role, output) in enumerate(zip(DEPLOYERS, ROLES, OUTPUTS, strict=True)):
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


def run_offline_demo() -> int:
    from verifier.stores.sqlite import SqliteState

    now = now_ms()
    mesh = SampleMesh.create(DEPLOYERS)
    path = delegate(mesh, Construction.SIGNED_DAG, now, "demo-system")
    final = OUTPUTS[-1]
    print("Countersign offline demo: Planner (deployer-a) -> Researcher (deployer-b) -> Writer (deployer-c)\n")
    print(render_tree(path))
    print()
    report = Report()
    with tempfile.TemporaryDirectory(prefix="countersign-demo-") as workdir:
        state = SqliteState(FilePath(workdir) / "verifier-state.db")
        try:

            def check(p: Path, output: bytes, mode: Mode = Mode.ACCEPT) -> VerificationResult:
                return verify_path(p, output, registry=mesh.registry, state=state, mode=mode, now_ms=now)

            report.outcome("final output verified (SIGNED-DAG, 7 signatures)", check(path, final), None)
            report.outcome("replay of the same path", check(path, final), Reason.NONCE_REPLAYED)
            report.outcome("audit of the consumed path (consumes nothing)", check(path, final, Mode.AUDIT), None)
            report.outcome(
                "substituted output bytes", check(path, b"Final report: they disagree.\n"), Reason.OUTPUT_MISMATCH
            )
            rogue = b"rogue output the planner never asked for\n"
            stolen = mesh.signers["deployer-b"]
            parent_key = mesh.signers["deployer-a"].key_id
            graft = graft_with_stolen_key(path, stolen, "deployer-b", rogue, now, parent_key)
            report.outcome(
                "graft under the Planner with deployer-b's stolen key", check(graft, rogue), Reason.BAD_COSIGNATURE
            )
            linked = delegate(mesh, Construction.LINKED_LIST, now, "demo-linked")
            graft_ll = graft_with_stolen_key(linked, stolen, "deployer-b", rogue, now, parent_key)
            report.outcome("same graft under LINKED-LIST", check(graft_ll, rogue), None, note="  <- known limit")
        finally:
            state.close()
    print("\nall outcomes as expected" if not report.failed else f"\nNOT as expected: {', '.join(report.failed)}")
    return EXIT_OK if not report.failed else EXIT_REJECTED
