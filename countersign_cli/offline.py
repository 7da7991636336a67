"""Offline commands: keygen, sample-path, sample-session, verify, verify-session, inspect, conformance."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path as FilePath
from typing import TYPE_CHECKING, Any

from countersign._clock import now_ms
from countersign.errors import MalformedError, ServiceError, VerificationError
from countersign.plugins import described
from countersign.policy import ConsumerPolicy
from countersign.records import MAX_INPUT_BYTES, MAX_PATH_LENGTH, Construction, Path
from countersign.samples import SampleMesh, cross_deployer_route, deployer_names
from countersign.verify import DEFAULT_POLICY, MAX_CLOCK_SKEW_MS, Mode, VerifierPolicy, malformed_result, verify_path
from countersign_cli.common import (
    EXIT_OK,
    EXIT_REJECTED,
    MAX_OUTPUT_BYTES,
    Commands,
    UsageError,
    add_registry_arguments,
    add_time_and_log_arguments,
    client_tls,
    iso,
    new_key_file,
    read_bytes,
    read_policy,
    read_registry,
    registry_from_args,
    render_tree,
    verification_time,
    verifier_refused,
    write_file,
)
from countersign_cli.progress import Progress, table
from verifier.stores import STORE_FOR_SCHEME, StoreConfigError, open_store

CLOCK_SKEW_HELP = (
    f"milliseconds the signers' clocks may be off when checking records' times (default {DEFAULT_POLICY.clock_skew_ms})"
)

if TYPE_CHECKING:
    from countersign.sessions import SessionEvidence

MAX_SAMPLE_OUTPUTS = 10_000


def register(commands: Commands) -> None:
    keygen = commands.add_parser("keygen", help="create an Ed25519 key file (mode 0600) and print its key_id")
    keygen.add_argument("--out", required=True, help="key file to create (refuses to overwrite)")
    keygen.set_defaults(handler=cmd_keygen)

    sample = commands.add_parser("sample-path", help="write a valid sample path, its output, registry and keys")
    sample.add_argument(
        "--construction", required=True, choices=[c.value for c in Construction],
        help="how records commit to their parents (SIGNED-DAG, MERKLE, LINKED-LIST; the rest are baselines)",
    )  # fmt: skip
    sample.add_argument("--depth", type=int, required=True, help=f"records in the path (1..{MAX_PATH_LENGTH})")
    sample.add_argument("--out", required=True, help="directory to write into (created if missing)")
    sample.add_argument("--deployers", type=int, default=3, help="deployers to cycle through (default 3)")
    sample.add_argument("--seed", help="derive keys from this seed (reproducible test material)")
    sample.set_defaults(handler=cmd_sample_path)

    verify = commands.add_parser("verify", help="verify a path for an output; print one JSON verdict")
    verify.add_argument("--path", required=True, help="path.json")
    verify.add_argument("--output", required=True, help="the exact output bytes")
    verify.add_argument("--registry", help="registry.json (required unless --verifier is given)")
    verify.add_argument("--verifier", help="host:port of a verifier service: verify remotely instead")
    verify.add_argument("--ca", default="", help="with --verifier: CA certificate (mTLS)")
    verify.add_argument("--cert", default="", help="with --verifier: client certificate (mTLS)")
    verify.add_argument("--tls-key", default="", help="with --verifier: client private key (mTLS)")
    verify.add_argument("--insecure-loopback", action="store_true", help="with --verifier: plaintext, loopback only")
    verify.add_argument("--audit", action="store_true", help="check without consuming the leaf nonce")
    verify.add_argument(
        "--state",
        default="memory:",
        help=f"the verifier state that remembers consumed nonces (default memory:): {described(STORE_FOR_SCHEME)}",
    )
    verify.add_argument("--now-ms", type=int, help="verify as of this time (ms since the epoch)")
    add_time_and_log_arguments(verify)
    verify.add_argument(
        "--clock-skew-ms", type=int, default=DEFAULT_POLICY.clock_skew_ms,
        help=CLOCK_SKEW_HELP,
    )  # fmt: skip
    verify.add_argument(
        "--policy",
        help="consumer policy file (docs/spec.md section 16) applied after verification; with --verifier it is "
        "applied here, and a path it refuses is only audited (consumes nothing)",
    )
    verify.add_argument(
        "--unsafe-allow-baselines",
        action="store_true",
        help="also accept NO-CHAIN, HASH-ONLY and NAIVE-SIG paths (comparison only; they prove little)",
    )
    verify.set_defaults(handler=cmd_verify)

    sample_session = commands.add_parser(
        "sample-session", help="write a valid session: its agent path, receipts, outputs and registry"
    )
    sample_session.add_argument(
        "--outputs", type=int, required=True, help=f"outputs in the session (1..{MAX_SAMPLE_OUTPUTS})"
    )
    sample_session.add_argument("--closed", action="store_true", help="end the session with its close receipt")
    sample_session.add_argument("--out", required=True, help="directory to write into (created if missing)")
    sample_session.add_argument("--seed", help="derive keys from this seed (reproducible test material)")
    sample_session.set_defaults(handler=cmd_sample_session)

    verify_session_parser = commands.add_parser(
        "verify-session", help="verify a session's receipts, in order, for its outputs; print one JSON verdict"
    )
    verify_session_parser.add_argument("--path", required=True, help="the path to the emitting agent (agent.json)")
    verify_session_parser.add_argument(
        "--receipts", required=True, help="a directory of receipt envelopes (*.json, in name order) or one JSON array"
    )
    verify_session_parser.add_argument(
        "--outputs",
        help="directory of outputs: <receipt file stem>.bin (or <position>.bin, 6 digits); absent: not checked",
    )
    verify_session_parser.add_argument("--registry", help="registry.json (required unless --verifier is given)")
    verify_session_parser.add_argument(
        "--verifier", help="host:port of a verifier service: verify remotely (VerifySession)"
    )
    verify_session_parser.add_argument("--ca", default="", help="with --verifier: CA certificate (mTLS)")
    verify_session_parser.add_argument("--cert", default="", help="with --verifier: client certificate (mTLS)")
    verify_session_parser.add_argument("--tls-key", default="", help="with --verifier: client private key (mTLS)")
    verify_session_parser.add_argument(
        "--insecure-loopback", action="store_true", help="with --verifier: plaintext, loopback only"
    )
    verify_session_parser.add_argument("--closed", action="store_true", help="require the session's close receipt")
    verify_session_parser.add_argument(
        "--audit",
        action="store_true",
        help="consume nothing (with --verifier; offline nothing durable is consumed either way, and --audit "
        "only skips the check that no two receipts share a nonce, as a verifier's audit mode does)",
    )
    verify_session_parser.add_argument("--now-ms", type=int, help="verify as of this time (ms since the epoch)")
    verify_session_parser.add_argument(
        "--clock-skew-ms", type=int, default=DEFAULT_POLICY.clock_skew_ms, help=CLOCK_SKEW_HELP
    )
    verify_session_parser.add_argument(
        "--policy",
        help="consumer policy file (docs/spec.md section 16) applied to each receipt's path; with --verifier it "
        "is applied here, and a session it refuses is only audited (consumes nothing)",
    )
    verify_session_parser.set_defaults(handler=cmd_verify_session)

    inspect = commands.add_parser("inspect", help="print a readable tree of a path (checks nothing unless --verify)")
    inspect.add_argument("path", help="path.json")
    inspect.add_argument(
        "--verify", action="store_true", help="check each signature against the registry, then print the verdict"
    )
    inspect.add_argument("--output", help="with --verify: the exact output bytes, so the verdict covers them")
    add_registry_arguments(inspect)
    inspect.set_defaults(handler=cmd_inspect)

    conformance = commands.add_parser("conformance", help="run the mutation matrix and check the expected pattern")
    conformance.add_argument(
        "--trials", type=int, default=1000, help="random mutations per cell of the matrix (default 1000)"
    )
    conformance.add_argument(
        "--seed",
        type=int,
        default=2026,
        help="seed of the mutations and keys: one seed, one run (default 2026)",
    )
    conformance.add_argument("--session-trials", type=int, default=1000, help="trials per session-attack cell")
    conformance.add_argument("--json", action="store_true", help="print the matrix as JSON")
    conformance.set_defaults(handler=cmd_conformance)


# --- commands -----------------------------------------------------------------------------------


def cmd_keygen(args: argparse.Namespace) -> int:
    print(new_key_file(args.out).key_id)
    return EXIT_OK


def cmd_sample_path(args: argparse.Namespace) -> int:
    from signer.backends.file import key_file_json

    if not 1 <= args.depth <= MAX_PATH_LENGTH:
        raise UsageError(f"--depth must be between 1 and {MAX_PATH_LENGTH}")
    if not 1 <= args.deployers <= 64:
        raise UsageError("--deployers must be between 1 and 64")
    construction = Construction(args.construction)
    names = deployer_names(args.deployers)
    mesh = SampleMesh.create(names, seed=None if args.seed is None else args.seed.encode())
    output = b"sample output of the leaf agent\n"
    path = mesh.issue_path(construction, cross_deployer_route(names, args.depth), output, now_ms=now_ms())
    out = FilePath(args.out)
    try:
        (out / "keys").mkdir(parents=True, exist_ok=True)
        write_file(out / "path.json", path.to_bytes())
        write_file(out / "output.bin", output)
        write_file(out / "registry.json", json.dumps(mesh.registry.to_json(), indent=2).encode() + b"\n")
        for deployer, signer in mesh.signers.items():
            body = json.dumps(key_file_json(signer), indent=2).encode() + b"\n"
            write_file(out / "keys" / f"{deployer}.jwk", body, 0o600)
    except OSError as exc:
        raise UsageError(f"cannot write into {out}: {exc.strerror}") from None
    print(json.dumps({"construction": construction.value, "records": len(path), "out": str(out)}))
    return EXIT_OK


def cmd_sample_session(args: argparse.Namespace) -> int:
    if not 1 <= args.outputs <= MAX_SAMPLE_OUTPUTS:
        raise UsageError(f"--outputs must be between 1 and {MAX_SAMPLE_OUTPUTS}")
    names = deployer_names(2)
    mesh = SampleMesh.create(names, seed=None if args.seed is None else args.seed.encode())
    issued = now_ms()
    trunk = mesh.issue_path(Construction.SIGNED_DAG, [names[0], names[1], names[1]], b"", now_ms=issued)
    agent = Path(trunk.envelopes[:2])  # deployer-b's agent under deployer-a's root
    outputs = [b"sample output %d of the session\n" % i for i in range(args.outputs)]
    receipts = mesh.issue_session(agent, outputs, now_ms=issued, session="sample-session", closed=args.closed)
    out = FilePath(args.out)
    try:
        (out / "receipts").mkdir(parents=True, exist_ok=True)
        (out / "outputs").mkdir(parents=True, exist_ok=True)
        write_file(out / "agent.json", agent.to_bytes())
        for index, receipt in enumerate(receipts):
            write_file(out / "receipts" / f"{index:06d}.json", receipt.canonical_bytes())
            if index < len(outputs):
                write_file(out / "outputs" / f"{index:06d}.bin", outputs[index])
        write_file(out / "registry.json", json.dumps(mesh.registry.to_json(), indent=2).encode() + b"\n")
    except OSError as exc:
        raise UsageError(f"cannot write into {out}: {exc.strerror}") from None
    print(json.dumps({"outputs": len(outputs), "receipts": len(receipts), "closed": args.closed, "out": str(out)}))
    return EXIT_OK


def _receipt_files(location: str) -> tuple[bytes | list[bytes], list[str] | None]:
    """The receipts' bytes, as :func:`countersign.sessions.session_from_parts` reads them, and each
    one's output name: a directory's *.json in name order (each one envelope), or one file's JSON array
    (names by position, known once it is parsed: None)."""
    from countersign.sessions import MAX_SESSION_INPUT_BYTES, MAX_SESSION_RECEIPTS

    where = FilePath(location)
    if where.is_dir():
        files = sorted(where.glob("*.json"))
        if not 1 <= len(files) <= MAX_SESSION_RECEIPTS:
            raise UsageError(f"{location} must hold 1 to {MAX_SESSION_RECEIPTS} receipt files (*.json)")
        return [read_bytes(str(f), "receipt", MAX_INPUT_BYTES) for f in files], [f.stem for f in files]
    return read_bytes(location, "receipts", MAX_SESSION_INPUT_BYTES), None


def cmd_verify_session(args: argparse.Namespace) -> int:
    from countersign.sessions import session_from_parts, verify_session_evidence
    from countersign.state import InMemoryState

    if not 0 <= args.clock_skew_ms <= MAX_CLOCK_SKEW_MS:
        raise UsageError(f"--clock-skew-ms must be between 0 and {MAX_CLOCK_SKEW_MS}")
    if args.verifier and (args.registry or args.now_ms is not None):
        raise UsageError("--registry and --now-ms verify offline, not with --verifier")
    if not args.verifier and not args.registry:
        raise UsageError("verify-session needs --registry (offline) or --verifier HOST:PORT")
    registry = None if args.verifier else read_registry(args.registry)
    consumer_policy = None if args.policy is None else read_policy(args.policy)
    agent_bytes = read_bytes(args.path, "path", MAX_INPUT_BYTES, oversize_is_usage_error=False)
    receipts, names = _receipt_files(args.receipts)
    folder = None
    if args.outputs:
        folder = FilePath(args.outputs)
        if not folder.is_dir():
            raise UsageError(f"--outputs {args.outputs} is not a directory")
    try:
        session = session_from_parts(agent_bytes, receipts)
    except MalformedError as exc:
        result = malformed_result(exc)  # remotely too: evidence that does not parse is not sent
    else:
        outputs: list[bytes | None] = [None] * len(session.receipts)
        for index, name in enumerate(names or (f"{i:06d}" for i in range(len(session.receipts)))):
            location = None if folder is None else folder / f"{name}.bin"
            if location is not None and location.exists():
                outputs[index] = read_bytes(str(location), "output", MAX_OUTPUT_BYTES)
        if registry is None:
            return verify_session_remotely(args, session, outputs, consumer_policy)
        # Offline, the state step (spec 17.4) runs against a fresh, empty state, as verify's memory:
        # store does for one path: a nonce two receipts share, or a delegation beyond max_children in
        # the agent path, is refused here as a verifier refuses it.
        result = verify_session_evidence(
            session, outputs, registry=registry, state=InMemoryState(),
            mode=Mode.AUDIT if args.audit else Mode.ACCEPT,
            now_ms=args.now_ms if args.now_ms is not None else now_ms(), require_closed=args.closed,
            policy=VerifierPolicy(clock_skew_ms=args.clock_skew_ms), consumer_policy=consumer_policy,
        )  # fmt: skip
    print(json.dumps(result.to_json()))
    return EXIT_OK if result else EXIT_REJECTED


def verify_session_remotely(
    args: argparse.Namespace,
    session: SessionEvidence,
    outputs: list[bytes | None],
    consumer_policy: ConsumerPolicy | None,
) -> int:
    """Ask a verifier service (VerifySession), ``consumer_policy`` applied here (spec 16.4); print the
    same verdict object as offline."""
    from countersign.client import VerifierClient

    client = VerifierClient(args.verifier, client_tls(args, args.verifier), lanes=0)
    presented = None if all(o is None for o in outputs) else outputs
    try:
        result = client.verify_session(
            session, presented, audit=args.audit, require_closed=args.closed, consumer_policy=consumer_policy
        ).result
    except ServiceError as exc:
        raise verifier_refused(args, exc) from None
    finally:
        client.close()
    print(json.dumps(result.to_json()))
    return EXIT_OK if result else EXIT_REJECTED


def cmd_verify(args: argparse.Namespace) -> int:
    path_bytes = read_bytes(args.path, "path", MAX_INPUT_BYTES, oversize_is_usage_error=False)
    output = read_bytes(args.output, "output", MAX_OUTPUT_BYTES)
    if not 0 <= args.clock_skew_ms <= MAX_CLOCK_SKEW_MS:
        raise UsageError(f"--clock-skew-ms must be between 0 and {MAX_CLOCK_SKEW_MS}")
    if args.verifier:
        if args.registry_log or args.at_evidence_time:
            raise UsageError("--registry-log and --at-evidence-time verify offline, not with --verifier")
        return verify_remotely(args, path_bytes, output, None if args.policy is None else read_policy(args.policy))
    registry = registry_from_args(args)
    consumer_policy = None if args.policy is None else read_policy(args.policy)
    policy = (
        VerifierPolicy.unsafe_allow_baselines(args.clock_skew_ms)
        if args.unsafe_allow_baselines
        else VerifierPolicy(clock_skew_ms=args.clock_skew_ms)
    )
    accept_mode = not (args.audit or args.at_evidence_time)
    if accept_mode and args.state == "memory:":
        # Accept mode consumes the leaf nonce, but a memory: store forgets it when the command ends.
        print(
            "countersign verify: note: accept mode with --state memory: keeps nothing, so the same path is "
            "accepted again next time; use --state sqlite:///state.db to remember consumed nonces, or --audit",
            file=sys.stderr,
        )
    try:
        state = open_store(args.state)
    except StoreConfigError as exc:
        raise UsageError(str(exc)) from None
    except VerificationError as exc:
        raise UsageError(f"state store unavailable: {exc}") from None
    try:
        try:
            path = Path.from_bytes(path_bytes)
        except MalformedError as exc:
            result = malformed_result(exc)
        else:
            result = verify_path(
                path,
                output,
                registry=registry,
                state=state,
                mode=Mode.AUDIT if args.audit or args.at_evidence_time else Mode.ACCEPT,
                now_ms=verification_time(args, path),
                policy=policy,
                consumer_policy=consumer_policy,
            )
    except VerificationError as exc:
        raise UsageError(f"verification could not run (retry): {exc}") from None
    finally:
        state.close()
    print(json.dumps(result.to_json()))
    return EXIT_OK if result else EXIT_REJECTED


def verify_remotely(
    args: argparse.Namespace, path_bytes: bytes, output: bytes, consumer_policy: ConsumerPolicy | None
) -> int:
    """Ask a verifier service, ``consumer_policy`` applied here (spec 16.4); print the same verdict
    object as offline verification."""
    from countersign.client import VerifierClient

    client = VerifierClient(args.verifier, client_tls(args, args.verifier))
    try:
        result = client.verify(path_bytes, output, audit=args.audit, consumer_policy=consumer_policy).result
    except ServiceError as exc:
        raise verifier_refused(args, exc) from None
    finally:
        client.close()
    print(json.dumps(result.to_json()))
    return EXIT_OK if result else EXIT_REJECTED


def cmd_inspect(args: argparse.Namespace) -> int:
    data = read_bytes(args.path, "path", MAX_INPUT_BYTES)
    try:
        path = Path.from_bytes(data)
    except MalformedError as exc:
        raise UsageError(f"{args.path} is not a valid path: {exc}") from None
    if args.verify:
        return inspect_verified(args, path)
    refuse_verify_options(args)
    print(render_tree(path))
    print("\nnothing above was checked: no signature, link, key or time (inspect --verify, or verify, checks them)")
    return EXIT_OK


def refuse_verify_options(args: argparse.Namespace) -> None:
    """Plain ``inspect`` checks nothing, so an option that only a check uses is a mistake, not a no-op."""
    given = [name for name in ("output", "registry", "registry_log", "operator", "now_ms") if getattr(args, name)]
    if given or args.at_evidence_time:
        names = ", ".join("--" + n.replace("_", "-") for n in given) or "--at-evidence-time"
        raise UsageError(f"{names} only make sense with --verify")


def inspect_verified(args: argparse.Namespace, path: Path) -> int:
    """The tree, one mark per signature, then the verdict (audit mode: nothing is consumed)."""
    from countersign.export.marks import SignatureRole, signature_marks
    from countersign.state import InMemoryState
    from countersign.verify import verify_structure

    registry = registry_from_args(args)
    at = verification_time(args, path)
    print(render_tree(path))
    print("\nsignatures, each checked on its own against the registry (keys resolved at the record's creation):")
    for mark in signature_marks(path, registry):
        what = "signature" if mark.role is SignatureRole.PRIMARY else f"{mark.role} co-signature"
        status = "verified" if mark.verified else "NOT verified"
        line = f"  [{mark.index}] {status:<12} {what} by {mark.deployer} ({mark.key_id})"
        print(line if mark.verified else f"{line}: {mark.problem}: {mark.detail}")
    if args.output:
        output = read_bytes(args.output, "output", MAX_OUTPUT_BYTES)
        result = verify_path(path, output, registry=registry, state=InMemoryState(), mode=Mode.AUDIT, now_ms=at)
        scope = "the path for the output"
    else:
        result = verify_structure(path, registry=registry, now_ms=at)
        scope = "the path (output not checked: give --output)"
    verdict = "ACCEPT" if result else f"REJECT {result.reason} at record {result.index}: {result.detail}"
    print(f"\nverdict on {scope}, as of {iso(at)}, audit mode: {verdict}")
    return EXIT_OK if result else EXIT_REJECTED


def cmd_conformance(args: argparse.Namespace) -> int:
    from countersign.conformance import (
        CONSTRUCTION_ORDER,
        SESSION_CONSTRUCTIONS,
        Attack,
        SessionAttack,
        run_matrix,
        run_session_matrix,
    )

    if args.trials < 1 or args.session_trials < 1:
        raise UsageError("--trials and --session-trials must be at least 1")

    total = len(Attack) * len(CONSTRUCTION_ORDER) + len(SessionAttack) * len(SESSION_CONSTRUCTIONS)
    progress = Progress("conformance", total)
    started = time.perf_counter()
    cells = run_matrix(args.trials, seed=args.seed, progress=progress.step)
    elapsed = time.perf_counter() - started
    started = time.perf_counter()
    session_cells = run_session_matrix(args.session_trials, seed=args.seed, progress=progress.step)
    session_elapsed = time.perf_counter() - started
    progress.done()
    mismatches = [c for c in cells if not c.matches] + [c for c in session_cells if not c.matches]
    if args.json:
        report: dict[str, Any] = {
            "trials": args.trials,
            "seed": args.seed,
            "pattern_matches": not mismatches,
            "cells": [
                {
                    "attack": c.attack.name,
                    "construction": c.construction.value,
                    "accepted": c.accepted,
                    "trials": c.trials,
                    "wilson95_upper": round(c.wilson_upper, 6),
                    "expected": "accept" if c.expected_accepted else "reject",
                    "matches": c.matches,
                    "reject_reasons": c.reasons,
                }
                for c in cells
            ],
            "session_trials": args.session_trials,
            "session_cells": [
                {
                    "attack": c.attack.name,
                    "construction": c.construction.value,
                    "accepted": c.accepted,
                    "trials": c.trials,
                    "wilson95_upper": round(c.wilson_upper, 6),
                    "expected": "accept" if c.expected_accepted else "reject",
                    "matches": c.matches,
                    "reject_reasons": c.reasons,
                }
                for c in session_cells
            ],
        }
        print(json.dumps(report, indent=2))
    else:

        def shown(cell: Any) -> str:
            verdict = "A" if cell.expected_accepted else "R"
            mark = "" if cell.matches else "!"
            return f"{verdict} {cell.accepted}/{cell.trials} ≤{100 * cell.wilson_upper:.2f}%{mark}"

        by_key = {(c.attack, c.construction): c for c in cells}
        rows = [[a.value, *(shown(by_key[(a, c)]) for c in CONSTRUCTION_ORDER)] for a in Attack]
        header = ["attack (accepted/trials, Wilson 95% upper)", *(c.value for c in CONSTRUCTION_ORDER)]
        print("\n".join(table(header, rows)))
        sessions = {(c.attack, c.construction): c for c in session_cells}
        print()
        rows = [[a.value, *(shown(sessions[(a, c)]) for c in SESSION_CONSTRUCTIONS)] for a in SessionAttack]
        print("\n".join(table(["session attack (closed required)", *(c.value for c in SESSION_CONSTRUCTIONS)], rows)))
        print(
            f"\n{len(session_cells)} session cells × {args.session_trials} trials in {session_elapsed:.1f} s "
            "(docs/spec.md section 17)."
        )
        print(
            f"\nA/R: expected accept/reject. {len(cells)} cells × {args.trials} trials in {elapsed:.1f} s; "
            + (
                "pattern matches docs/conformance.md."
                if not mismatches
                else f"{len(mismatches)} cells DIFFER (marked !)."
            )
        )
    return EXIT_OK if not mismatches else EXIT_REJECTED
