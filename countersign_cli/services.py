"""Commands that run or talk to the daemons: serve, pki, public-key, operator, key, registry export and
custody."""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from countersign._clock import now_ms
from countersign.admission import AdmissionLog, SignedStatement, StatementKind, sign_statement
from countersign.canonical import b64url_encode, canonicalize
from countersign.errors import ConfigError, CountersignError, SignerError
from countersign.keys import PublicKey, Signer
from countersign.plugins import described
from countersign_cli.common import (
    EXIT_OK,
    EXIT_REJECTED,
    Commands,
    UsageError,
    add_client_arguments,
    client_tls,
    load_key,
    missing_extra,
    new_key_file,
)
from countersign_cli.settings_help import epilog
from signer.backends import SIGNER_FOR_URI_SCHEME

# gRPC, TLS and the daemon plumbing are imported by the commands that use them, so that `countersign
# --help` and the offline commands run on the core alone (`pip install countersign-mesh`, no extras).
if TYPE_CHECKING:
    from countersign._daemon.tls import PeerIdentity
    from countersign.checkpoint import SignedCheckpoint
    from countersign.client.operator import KnownHead


# What each admission statement does, in the operator's words (the statement kind is the wire name).
STATEMENT_WORDS = {
    StatementKind.ENROL_DEPLOYER: "admit a new deployer with its first signing key",
    StatementKind.ADD_KEY: "add a signing key to a deployer (the first step of a rotation)",
    StatementKind.RETIRE_KEY: "retire a deployer's key from a time on; what it signed before stays valid",
    StatementKind.REVOKE_KEY: "revoke a compromised key: nothing it ever signed is trusted any more",
}


def register(commands: Commands) -> None:
    for daemon in ("coordinator", "signer", "verifier"):
        group = commands.add_parser(daemon, help=f"the {daemon} daemon")
        actions = group.add_subparsers(dest="action", required=True, metavar="ACTION")
        serve = actions.add_parser(
            "serve", help=f"run the {daemon} (config file plus COUNTERSIGN_* environment)",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )  # fmt: skip
        serve.add_argument("--config", help="TOML configuration file")
        serve.set_defaults(handler=cmd_serve, daemon=daemon)
        _list_settings_in_help(serve, daemon)

    pki = commands.add_parser("pki", help="a development PKI for mTLS between the daemons")
    pki_actions = pki.add_subparsers(dest="action", required=True, metavar="ACTION")
    init = pki_actions.add_parser("init", help="create a development CA (ca.pem, ca.key)")
    init.add_argument("--out", required=True, help="directory to create the CA in (refuses to overwrite one)")
    init.set_defaults(handler=cmd_pki_init)
    issue = pki_actions.add_parser("issue", help="issue a certificate for one daemon or client")
    issue.add_argument("--ca", required=True, help="directory holding ca.pem and ca.key")
    issue.add_argument("--out", required=True, help="directory to write NAME.pem and NAME.key into")
    issue.add_argument("--name", required=True, help="file stem of the certificate and key")
    issue.add_argument(
        "--role",
        required=True,
        choices=["signer", "runtime", "coordinator", "verifier", "client", "auditor", "operator"],
        help="what the certificate may do: the daemons check the role in its URI before each method (client: a"
        " consumer, which sees only its own verdicts in a verifier's log; auditor: reads and marks the whole log)",
    )
    issue.add_argument("--deployer", help="deployer id (signer and runtime roles)")
    issue.add_argument("--ip", action="append", default=[], help="extra IP address SAN (repeatable)")
    issue.set_defaults(handler=cmd_pki_issue)

    schemes = " or ".join(f"{scheme}:" for scheme in SIGNER_FOR_URI_SCHEME)
    public = commands.add_parser("public-key", help=f"print a signing key's key_id and public key ({schemes})")
    public.add_argument("--key", required=True, help=f"the key: {described(SIGNER_FOR_URI_SCHEME)}")
    public.set_defaults(handler=cmd_public_key)

    operator = commands.add_parser("operator", help="the operator's admission statements (signed offline)")
    op_actions = operator.add_subparsers(dest="action", required=True, metavar="ACTION")
    op_init = op_actions.add_parser("init", help="create the operator key (0600) and print its public key")
    op_init.add_argument("--out", required=True, help="operator key file to create (refuses to overwrite)")
    op_init.set_defaults(handler=cmd_operator_init)
    for action, kind in (
        ("enrol", StatementKind.ENROL_DEPLOYER),
        ("add-key", StatementKind.ADD_KEY),
        ("retire-key", StatementKind.RETIRE_KEY),
        ("revoke-key", StatementKind.REVOKE_KEY),
    ):
        sub = op_actions.add_parser(action, help=f"{STATEMENT_WORDS[kind]} (statement kind {kind.value})")
        sub.add_argument("--key", required=True, help="the operator key file")
        sub.add_argument("--deployer", required=True, help="the deployer the statement is about")
        if kind in (StatementKind.ENROL_DEPLOYER, StatementKind.ADD_KEY):
            sub.add_argument(
                "--public-key", required=True, metavar="B64URL",
                help="the deployer key's public key; write --public-key=KEY, since a key may begin with '-'",
            )  # fmt: skip
        else:
            sub.add_argument("--key-id", required=True, help="the deployer's key (ed25519:...; see public-key)")
        if kind is not StatementKind.REVOKE_KEY:
            sub.add_argument(
                "--at-ms", type=int, help="valid from (enrol, add-key; default now) or retired at (retire-key)"
            )
        sub.add_argument("--note", help="free text recorded in the statement")
        sub.add_argument("--out", help="offline: write the signed statement here instead of submitting it")
        sub.add_argument("--log", help="offline: the current registry-log.json (registry export) to chain onto")
        sub.add_argument(
            "--first", action="store_true",
            help="offline: this is the registry's first statement (no log exists yet; instead of --log)",
        )  # fmt: skip
        sub.add_argument(
            "--lifetime-ms", type=int, default=60_000, help="lifetime of the checkpoint sent with it (default 60000)"
        )
        sub.add_argument("--head-file", default="", help=HEAD_FILE_HELP)
        sub.add_argument(
            "--replaces", metavar="DIGEST", default=None,
            help="offline: the statement this operator signed at the same position and will never submit"
            " (it is forgotten from the head file; without this a second statement there is refused)",
        )  # fmt: skip
        add_client_arguments(sub, "--coordinator", required=False)
        sub.set_defaults(handler=cmd_operator_statement, kind=kind)
    checkpoint = op_actions.add_parser(
        "checkpoint",
        help="sign and submit a checkpoint of the served log (once, or every --every-ms); followers are stale "
        "without an unexpired one",
    )
    checkpoint.add_argument("--key", required=True, help="the operator key file")
    checkpoint.add_argument(
        "--lifetime-ms", type=int, default=60_000,
        help="how long each checkpoint keeps followers fresh: the bound on a coordinator that withholds a "
        "statement (default 60000)",
    )  # fmt: skip
    checkpoint.add_argument(
        "--every-ms", type=int, default=0,
        help="keep running and submit one this often (a third of --lifetime-ms is a good choice); 0: once",
    )  # fmt: skip
    checkpoint.add_argument("--head-file", default="", help=HEAD_FILE_HELP)
    add_client_arguments(checkpoint, "--coordinator")
    checkpoint.set_defaults(handler=cmd_operator_checkpoint)
    endorse = op_actions.add_parser(
        "endorse-key", help="record an old key's endorsement of the deployer's new key (key endorse --out)"
    )
    endorse.add_argument("--key", required=True, help="the operator key file")
    endorse.add_argument("--endorsement", required=True, help="the signed endorsement file (key endorse)")
    endorse.add_argument("--note", help="free text recorded in the statement")
    endorse.add_argument(
        "--lifetime-ms", type=int, default=60_000, help="lifetime of the checkpoint sent with it (default 60000)"
    )
    endorse.add_argument("--head-file", default="", help=HEAD_FILE_HELP)
    add_client_arguments(endorse, "--coordinator")
    endorse.set_defaults(handler=cmd_operator_endorse)

    key = commands.add_parser("key", help="a deployer's signing key")
    key_actions = key.add_subparsers(dest="action", required=True, metavar="ACTION")
    key_endorse = key_actions.add_parser(
        "endorse", help="sign, with the deployer's current key, an endorsement of its next key (rotation)"
    )
    key_endorse.add_argument("--signer-key", required=True, help=f"the CURRENT key: {described(SIGNER_FOR_URI_SCHEME)}")
    key_endorse.add_argument("--deployer", required=True, help="the deployer whose old key endorses its new one")
    key_endorse.add_argument(
        "--new-public-key", required=True, metavar="B64URL",
        help="the next key's public key; write --new-public-key=KEY, since a key may begin with '-'",
    )  # fmt: skip
    key_endorse.add_argument("--out", required=True, help="where to write the signed endorsement (JSON)")
    key_endorse.set_defaults(handler=cmd_key_endorse)

    submit = op_actions.add_parser("submit", help="submit a statement signed offline (operator <action> --out)")
    submit.add_argument("--statement", required=True, help="the signed statement file")
    submit.add_argument(
        "--head-file", required=True,
        help="the head file of the operator's checkpoint loop: the statement is recorded there before it is sent,"
        " so the loop vouches for no log without it",
    )  # fmt: skip
    add_client_arguments(submit, "--coordinator")
    submit.set_defaults(handler=cmd_operator_submit)


def register_registry_actions(actions: Commands) -> None:
    """``registry export`` and ``registry custody`` (main puts them beside ``registry verify``)."""
    export = actions.add_parser("export", help="fetch, verify and write the log and the folded registry.json")
    export.add_argument(
        "--operator-public-key", required=True, metavar="B64URL",
        help="the pinned operator key; write --operator-public-key=KEY, since a key may begin with '-'",
    )  # fmt: skip
    export.add_argument("--out", required=True, help="directory for registry-log.json and registry.json")
    add_client_arguments(export, "--coordinator")
    export.set_defaults(handler=cmd_registry_export)
    custody = actions.add_parser(
        "custody", help="print a deployer's chain of custody across key rotations (exit 1 if broken)"
    )
    custody.add_argument(
        "--operator-public-key", required=True, metavar="B64URL",
        help="the pinned operator key; write --operator-public-key=KEY, since a key may begin with '-'",
    )  # fmt: skip
    custody.add_argument("--deployer", required=True, help="the deployer whose chain of keys to print")
    add_client_arguments(custody, "--coordinator")
    custody.set_defaults(handler=cmd_registry_custody)


HEAD_FILE_HELP = (
    "where the operator records every statement it signs or submits, shared by the statement commands and "
    "the checkpoint loop, which vouches for no log without them (default: beside a file key, <key>.head.json; "
    "required with a KMS key)"
)


def config_class(daemon: str) -> type[Any]:
    """The configuration dataclass of ``daemon`` (imports the daemon, so only when asked for)."""
    if daemon == "coordinator":
        from coordinator.daemon import CoordinatorConfig

        return CoordinatorConfig
    if daemon == "signer":
        from signer.config import SignerConfig

        return SignerConfig
    from verifier.daemon import VerifierConfig

    return VerifierConfig


def _list_settings_in_help(parser: argparse.ArgumentParser, daemon: str) -> None:
    """``serve --help`` ends with the daemon's settings, read from its configuration when the help is
    shown: building the parser must not import the daemons (``countersign --help`` runs on the core)."""
    plain = parser.format_help

    def with_settings() -> str:
        try:
            settings = config_class(daemon)
        except ModuleNotFoundError as exc:  # the daemon's own imports: the help still shows, and says so
            needs = missing_extra(exc, daemon)
            if needs is None:
                raise
            parser.epilog = f"The {daemon} and the list of its settings need {needs}"
        else:
            parser.epilog = epilog(settings)
        return plain()

    parser.format_help = with_settings  # type: ignore[method-assign]


# --- serve -------------------------------------------------------------------------------------


def cmd_serve(args: argparse.Namespace) -> int:
    from countersign._daemon.config import load_config
    from countersign._daemon.memory import limit_malloc_arenas
    from countersign._daemon.server import run_daemon, worker_count

    limit_malloc_arenas()  # before the daemon starts any thread of its own (countersign._daemon.memory)

    daemon: Any
    # Each daemon holds each of its methods to the message size it needs (its METHOD_MESSAGE_BYTES: what
    # its parsers take at most, spec section 10, with room for the other fields; ADR 0027), unless
    # ``limits.max_message_bytes`` caps them lower.
    method_limits: dict[str, int]
    try:
        if args.daemon == "coordinator":
            from coordinator.daemon import METHOD_MESSAGE_BYTES, CoordinatorConfig, CoordinatorDaemon

            config: Any = load_config(CoordinatorConfig, args.config)
            daemon = CoordinatorDaemon(config)
            method_limits = METHOD_MESSAGE_BYTES
        elif args.daemon == "signer":
            from signer.config import SignerConfig
            from signer.daemon import METHOD_MESSAGE_BYTES as SIGNER_LIMITS
            from signer.daemon import SignerDaemon

            config = load_config(SignerConfig, args.config)
            daemon = SignerDaemon(config)
            method_limits = SIGNER_LIMITS
        else:
            from verifier.daemon import METHOD_MESSAGE_BYTES as VERIFIER_LIMITS
            from verifier.daemon import VerifierConfig, VerifierDaemon

            config = load_config(VerifierConfig, args.config)
            daemon = VerifierDaemon(config)
            method_limits = VERIFIER_LIMITS
        return run_daemon(
            args.daemon,
            daemon,
            listen=config.listen,
            tls=config.tls,
            metrics_listen=config.metrics_listen,
            metrics_registry=daemon.metrics_registry,
            ready_file=config.ready_file,
            lifeline_fd=config.lifeline_fd,
            log_level=config.log_level,
            # Threads for calls, plus one per lane a verifier may hold open (each holds its thread).
            max_workers=worker_count(getattr(config, "max_workers", 0)) + getattr(config, "max_lanes", 0),
            limits=config.limits,
            max_message_bytes=config.limits.max_message_bytes or max(method_limits.values()),
            method_limits=method_limits,
        )
    except (ConfigError, SignerError) as exc:
        raise UsageError(f"bad configuration: {exc}") from None
    except CountersignError as exc:  # e.g. the durable store is unreachable at start-up
        raise UsageError(f"cannot start: {exc}") from None


# --- pki ---------------------------------------------------------------------------------------


def cmd_pki_init(args: argparse.Namespace) -> int:
    from countersign._daemon.tls import create_ca

    out = Path(args.out)
    if (out / "ca.key").exists():
        raise UsageError(f"{out / 'ca.key'} exists; refusing to overwrite a CA")
    create_ca(out)
    print(json.dumps({"ca": str(out / "ca.pem")}))
    return EXIT_OK


def identity_for(role: str, deployer: str | None, name: str) -> tuple[PeerIdentity, list[str]]:
    """The certificate identity and server DNS names for a role."""
    from countersign._daemon.tls import PeerIdentity
    from countersign.client.tls import coordinator_dns, signer_dns, verifier_dns

    if role in ("signer", "runtime"):
        if not deployer:
            raise UsageError(f"--deployer is required for the {role} role")
        return PeerIdentity(role, deployer=deployer), [signer_dns(deployer)] if role == "signer" else []
    if role == "coordinator":
        return PeerIdentity("coordinator"), [coordinator_dns()]
    if role == "verifier":
        return PeerIdentity("verifier", name=name), [verifier_dns()]
    if role == "operator":
        return PeerIdentity("operator"), []
    if role == "auditor":
        return PeerIdentity("auditor", name=name), []
    return PeerIdentity("client", name=name), []


def cmd_pki_issue(args: argparse.Namespace) -> int:
    from countersign._daemon.tls import issue_certificate

    identity, dns = identity_for(args.role, args.deployer, args.name)
    try:
        cert, key = issue_certificate(Path(args.ca), Path(args.out), args.name, identity, dns=dns, ips=args.ip)
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot issue certificate: {exc}") from None
    print(json.dumps({"cert": str(cert), "key": str(key), "identity": identity.uri, "dns": dns}))
    return EXIT_OK


# --- keys and the operator ---------------------------------------------------------------------


def cmd_public_key(args: argparse.Namespace) -> int:
    signer = load_key(args.key)
    print(json.dumps({"key_id": signer.key_id, "public_key": b64url_encode(signer.public_key)}))
    return EXIT_OK


def cmd_operator_init(args: argparse.Namespace) -> int:
    key = new_key_file(args.out, "the operator key")
    print(json.dumps({"key_id": key.key_id, "public_key": b64url_encode(key.public_key)}))
    return EXIT_OK


def cmd_operator_statement(args: argparse.Namespace) -> int:
    from countersign.canonical import b64url_decode
    from countersign.client import OperatorClient
    from countersign.keys import PUBLIC_KEY_LENGTH, key_id_for

    operator = load_key(args.key)
    public_key = getattr(args, "public_key", None)
    if public_key is not None:
        try:
            key_id = key_id_for(b64url_decode(public_key, PUBLIC_KEY_LENGTH))
        except ValueError as exc:
            raise UsageError(f"--public-key: {exc}") from None
    else:
        key_id = args.key_id
    at_ms = getattr(args, "at_ms", None)
    if at_ms is None and args.kind in (StatementKind.ENROL_DEPLOYER, StatementKind.ADD_KEY):
        at_ms = now_ms()  # valid from now: a new key vouches for nothing older
    if at_ms is None and args.kind is StatementKind.RETIRE_KEY:
        raise UsageError("--at-ms is required for retire-key")
    if args.out:
        return _sign_offline(args, operator, key_id, public_key, at_ms)
    if args.first or args.log or args.replaces:
        raise UsageError("--first, --log and --replaces are for signing offline: give --out too")
    if not args.coordinator:
        raise UsageError("give --coordinator (sign and submit) or --log and --out (sign offline)")
    client = OperatorClient(
        args.coordinator, client_tls(args, args.coordinator), operator,
        checkpoint_lifetime_ms=_lifetime(args), known_head=_known_head(args),
    )  # fmt: skip
    try:
        signed = client.submit(args.kind, args.deployer, key_id, public_key=public_key, at_ms=at_ms, note=args.note)
    except CountersignError as exc:
        raise UsageError(f"coordinator refused: {getattr(exc, 'code', '')} {exc}") from None
    finally:
        client.close()
    answer = {"sequence": signed.statement.sequence, "digest": signed.digest(), "kind": args.kind.value}
    print(json.dumps({**answer, "what": STATEMENT_WORDS[args.kind]}))
    return EXIT_OK


def _lifetime(args: argparse.Namespace) -> int:
    from countersign.checkpoint import MAX_CHECKPOINT_LIFETIME_MS

    if not 1_000 <= args.lifetime_ms <= MAX_CHECKPOINT_LIFETIME_MS:
        raise UsageError(f"--lifetime-ms must be between 1000 and {MAX_CHECKPOINT_LIFETIME_MS}")
    return int(args.lifetime_ms)


def _known_head(args: argparse.Namespace) -> KnownHead:
    """Every statement this operator signed or submitted, kept next to a key file so the statement
    commands and the checkpoint loop share it: the loop then refuses to checkpoint a log that lacks
    one (spec 7.5). A key with no file to sit beside needs ``--head-file``: a record in memory would
    protect nothing the next command or the loop does."""
    from countersign.client.operator import KnownHead

    if args.head_file:
        return KnownHead(args.head_file)
    if ":" in args.key and not args.key.startswith("file:"):
        raise UsageError(f"{args.key.split(':', 1)[0]}: keys need --head-file (shared with the checkpoint loop)")
    return KnownHead(Path(args.key.removeprefix("file:")).with_suffix(".head.json"))


def cmd_operator_checkpoint(args: argparse.Namespace) -> int:
    from countersign.client.operator import CheckpointLoop

    operator = load_key(args.key)
    lifetime = _lifetime(args)
    if args.every_ms and not 0 < args.every_ms < lifetime:
        raise UsageError("--every-ms must be shorter than --lifetime-ms")

    def report(checkpoint: SignedCheckpoint) -> None:
        body = checkpoint.checkpoint
        print(json.dumps({"sequence": body.sequence, "head": body.head, "expires_ms": body.expires_ms}), flush=True)

    def complain(exc: Exception) -> None:
        print(f"countersign: checkpoint not submitted: {getattr(exc, 'code', '')} {exc}", file=sys.stderr, flush=True)

    loop = CheckpointLoop(
        lambda: args.coordinator, client_tls(args, args.coordinator), operator,
        every_ms=args.every_ms or lifetime // 3, checkpoint_lifetime_ms=lifetime, known_head=_known_head(args),
        on_checkpoint=report, on_error=complain,
    )  # fmt: skip
    if args.every_ms:
        signal.signal(signal.SIGTERM, lambda *_: loop.stop())
        with contextlib.suppress(KeyboardInterrupt):
            loop.run()
        return EXIT_OK
    try:
        report(loop.once())
    except CountersignError as exc:
        raise UsageError(f"checkpoint not submitted: {getattr(exc, 'code', '')} {exc}") from None
    return EXIT_OK


def _read_log(location: str, operator: Signer) -> AdmissionLog:
    """A registry-log.json (``registry export``), verified against the operator's own key."""
    try:
        body = json.loads(Path(location).read_text())
        statements = [SignedStatement.from_bytes(canonicalize(s)) for s in body["statements"]]
        log = AdmissionLog(PublicKey(operator.public_key))
        log.extend(statements)
    except (OSError, ValueError, KeyError, TypeError, CountersignError) as exc:
        raise UsageError(f"{location} is not a registry log signed by this operator key: {exc}") from None
    return log


def _sign_offline(
    args: argparse.Namespace, operator: Signer, key_id: str, public_key: str | None, at_ms: int | None
) -> int:
    """Sign the next statement on a machine with no connection; submit it later with ``operator submit``."""
    if args.first and args.log:
        raise UsageError("--first and --log exclude each other: --first starts a registry, --log extends one")
    if not args.log and not args.first:
        raise UsageError(
            "--out needs --log (the current registry-log.json, to chain the statement onto its head), "
            "or --first for the registry's first statement"
        )
    from countersign.client.operator import check_chains_onto

    # The first statement chains onto the empty log, as the coordinator's empty registry does.
    log = AdmissionLog(PublicKey(operator.public_key)) if args.first else _read_log(args.log, operator)
    known = _known_head(args)
    statement = log.next_statement(
        args.kind, args.deployer, key_id, issued_ms=now_ms(), public_key=public_key,
        at_ms=at_ms, note=args.note,
    )  # fmt: skip
    signed = sign_statement(statement, operator)
    try:
        log.prepare(signed)  # refuse to write a statement the coordinator would refuse
        # Keep the operator's statements one chain, and record this one before it leaves (spec 7.5).
        check_chains_onto(log, known, statement.sequence, replaces=args.replaces)
        known.record(signed, replaces=args.replaces)
    except CountersignError as exc:
        raise UsageError(f"{getattr(exc, 'code', '')}: {exc}") from None
    Path(args.out).write_bytes(signed.to_bytes())
    answer = {"sequence": statement.sequence, "digest": signed.digest(), "kind": args.kind.value}
    print(json.dumps({**answer, "what": STATEMENT_WORDS[args.kind], "out": args.out}))
    return EXIT_OK


def cmd_operator_submit(args: argparse.Namespace) -> int:
    from countersign.client.operator import KnownHead, submit_statement

    try:
        signed = SignedStatement.from_bytes(Path(args.statement).read_bytes())
    except (OSError, CountersignError) as exc:
        raise UsageError(f"{args.statement} is not a signed statement: {exc}") from None
    try:
        tls = client_tls(args, args.coordinator)
        submit_statement(args.coordinator, tls, signed, known_head=KnownHead(args.head_file))
    except CountersignError as exc:
        raise UsageError(f"coordinator refused: {getattr(exc, 'code', '')} {exc}") from None
    print(json.dumps({"sequence": signed.statement.sequence, "digest": signed.digest()}))
    return EXIT_OK


def cmd_key_endorse(args: argparse.Namespace) -> int:
    from countersign.admission import endorse_key
    from countersign.canonical import b64url_decode
    from countersign.keys import PUBLIC_KEY_LENGTH

    try:
        new_key = PublicKey(b64url_decode(args.new_public_key, PUBLIC_KEY_LENGTH))
    except ValueError as exc:
        raise UsageError(f"--new-public-key: {exc}") from None
    old = load_key(args.signer_key)
    if old.key_id == new_key.key_id:
        raise UsageError("--new-public-key is the current key itself")
    signed = endorse_key(old, args.deployer, new_key, now_ms())
    Path(args.out).write_bytes(signed.to_bytes() + b"\n")
    print(json.dumps({"old_key_id": old.key_id, "new_key_id": new_key.key_id, "out": args.out}))
    return EXIT_OK


def cmd_operator_endorse(args: argparse.Namespace) -> int:
    from countersign.admission import SignedEndorsement
    from countersign.client import OperatorClient

    try:
        endorsement = SignedEndorsement.from_bytes(Path(args.endorsement).read_bytes())
    except (OSError, CountersignError) as exc:
        raise UsageError(f"{args.endorsement} is not a signed endorsement: {exc}") from None
    inner = endorsement.endorsement
    client = OperatorClient(
        args.coordinator, client_tls(args, args.coordinator), load_key(args.key),
        checkpoint_lifetime_ms=_lifetime(args), known_head=_known_head(args),
    )  # fmt: skip
    try:
        signed = client.submit(
            StatementKind.ENDORSE_KEY, inner.deployer, inner.new_key_id, note=args.note, endorsement=endorsement
        )
    except CountersignError as exc:
        raise UsageError(f"coordinator refused: {getattr(exc, 'code', '')} {exc}") from None
    finally:
        client.close()
    print(json.dumps({"sequence": signed.statement.sequence, "digest": signed.digest(), "kind": "endorse_key"}))
    return EXIT_OK


def cmd_registry_custody(args: argparse.Namespace) -> int:
    from countersign._daemon.config import parse_operator_key
    from countersign.admission import custody_chain
    from countersign.client.operator import coordinator_log

    try:
        operator = parse_operator_key(args.operator_public_key)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    copy = AdmissionLog(operator)
    try:  # every statement, endorsements included, re-checked against the pinned operator key
        copy.extend(
            [
                SignedStatement.from_bytes(s)
                for s in coordinator_log(args.coordinator, client_tls(args, args.coordinator))
            ]
        )
    except CountersignError as exc:
        raise UsageError(f"the served log does not verify: {exc}") from None
    if args.deployer not in copy.registry.deployers:
        raise UsageError(f"{args.deployer} is not enrolled")
    chain = custody_chain(copy, args.deployer)
    print(json.dumps(chain.to_json(), indent=2))
    return EXIT_OK if chain.unbroken else EXIT_REJECTED


def cmd_registry_export(args: argparse.Namespace) -> int:
    from countersign._daemon.config import parse_operator_key
    from countersign.client.operator import coordinator_log

    try:
        operator = parse_operator_key(args.operator_public_key)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    statements = coordinator_log(args.coordinator, client_tls(args, args.coordinator))
    copy = AdmissionLog(operator)
    try:
        copy.extend([SignedStatement.from_bytes(s) for s in statements])
    except CountersignError as exc:
        raise UsageError(f"the served log does not verify: {exc}") from None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "registry-log.json").write_text(
        json.dumps(
            {"operator_public_key": args.operator_public_key, "statements": [s.to_json() for s in copy.entries]},
            indent=2,
        )
        + "\n"
    )
    (out / "registry.json").write_text(json.dumps(copy.registry.to_json(), indent=2) + "\n")
    print(json.dumps({"statements": copy.head_sequence, "out": str(out)}))
    return EXIT_OK
