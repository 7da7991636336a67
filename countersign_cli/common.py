"""What the commands share: exit codes and the usage error, reading and writing the user's files, times,
the registry and time options, keys, the client options of a command that talks to a daemon, and the
hint for a missing extra.

The command line's floors: :mod:`countersign_cli.main` parses and dispatches and imports every command
module; a command module imports this one and the helpers beside it (progress, settings_help,
localmesh, keep_running), never another command module nor ``main``; this module imports none of them
(tests/core/test_cli_layers.py). gRPC, TLS and the daemons' plumbing are imported by the functions that
use them, so that ``countersign --help`` and the offline commands run on the core alone.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path as FilePath
from typing import TYPE_CHECKING, Final, TypeAlias

from countersign._clock import now_ms
from countersign.admission import AdmissionError
from countersign.consumer import parse_registry
from countersign.errors import ConfigError, CountersignError, MalformedError, SignerError
from countersign.export.registry_log import MAX_LOG_BYTES, LogAudit, audit_log, operator_key, parse_log
from countersign.extras import extra_bringing, needs_extra
from countersign.keys import Ed25519Signer, PublicKey, Signer
from countersign.policy import MAX_POLICY_BYTES, ConsumerPolicy, PolicyError, parse_policy
from countersign.records import MAX_INPUT_BYTES, Path
from countersign.registry import Registry

if TYPE_CHECKING:
    from countersign.client.tls import TlsConfig
    from countersign.errors import ServiceError

EXIT_OK: Final = 0
EXIT_REJECTED: Final = 1
EXIT_USAGE: Final = 2
EXIT_BROKEN_PIPE: Final = 128 + 13  # what a shell reports for a process that SIGPIPE ended
MAX_OUTPUT_BYTES: Final = 64 << 20

Command = Callable[[argparse.Namespace], int]
Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"  # what a command module adds to


class UsageError(CountersignError):
    """Bad arguments or unreadable input: exit 2 with this message."""


# --- a missing extra ----------------------------------------------------------------------------

DAEMON_COMMANDS: Final = frozenset({"coordinator", "signer", "verifier"})


def missing_extra(exc: ModuleNotFoundError, command: str) -> str | None:
    """What to install for ``command`` that failed to import an optional package ("the 'server'
    extra (no module grpc): pip install ..."); None when no extra brings the module (a bug)."""
    extra = extra_bringing(exc.name)
    if extra is None:
        return None
    if extra == "grpc" and command in DAEMON_COMMANDS:
        extra = "server"  # the first module missing is gRPC's, but a daemon needs all of server
    return needs_extra(extra, exc.name)


# --- files ---------------------------------------------------------------------------------------


def read_bytes(location: str, what: str, limit: int, *, oversize_is_usage_error: bool = True) -> bytes:
    """Read a whole file (at most ``limit`` + 1 bytes), or raise UsageError with a clear message.

    A path file that is too large is still read (truncated) so that verification reports it as
    MALFORMED, like any other bad path; other oversized inputs are usage errors.
    """
    try:
        with open(location, "rb") as handle:
            data = handle.read(limit + 1)
    except OSError as exc:
        raise UsageError(f"cannot read {what} {location}: {exc.strerror}") from None
    if len(data) > limit and oversize_is_usage_error:
        raise UsageError(f"{what} {location} exceeds {limit} bytes")
    return data


def write_file(location: FilePath, data: bytes, mode: int = 0o644) -> None:
    fd = os.open(location, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)
        os.write(fd, data)
    finally:
        os.close(fd)


def write_document(data: bytes, out: str | None) -> None:
    """``data`` to the file ``out``, or to standard output when None. Raises UsageError."""
    if out is None:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return
    try:
        FilePath(out).write_bytes(data)
    except OSError as exc:
        raise UsageError(f"cannot write {out}: {exc.strerror}") from None


def read_registry(location: str) -> Registry:
    """The registry file at ``location``, read to at most the input limit. Raises UsageError."""
    try:
        return parse_registry(read_bytes(location, "registry", MAX_INPUT_BYTES), location)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def read_policy(location: str) -> ConsumerPolicy:
    data = read_bytes(location, "policy", MAX_POLICY_BYTES)
    try:
        return parse_policy(data)
    except PolicyError as exc:
        raise UsageError(f"{location} is not a valid policy: {exc}") from None


def read_path(location: str) -> Path:
    try:
        return Path.from_bytes(read_bytes(location, "path", MAX_INPUT_BYTES))
    except MalformedError as exc:
        raise UsageError(f"{location} is not a valid path: {exc}") from None


def read_operator(location: str) -> PublicKey:
    try:
        return operator_key(read_bytes(location, "operator key", MAX_INPUT_BYTES))
    except MalformedError as exc:
        raise UsageError(f"{location} is not an operator public key: {exc}") from None


def read_log(log_location: str, operator_location: str, at_ms: int | None = None) -> LogAudit:
    """Read and verify a registry log. Raises LogRefused (the log does not verify) or UsageError."""
    operator = read_operator(operator_location)
    return audit_log(parse_log(read_bytes(log_location, "registry log", MAX_LOG_BYTES)), operator, at_ms)


# --- times ---------------------------------------------------------------------------------------


def iso(ms: int) -> str:
    """``ms`` since the epoch as ISO 8601 in UTC, to the millisecond."""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def parse_time(text: str, flag: str) -> int:
    """Milliseconds since the epoch from an integer or an ISO 8601 time with a zone, given as ``flag``.
    Raises UsageError."""
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(
            f"{flag} must be ms since the epoch or an ISO 8601 time such as 2026-01-01T00:00:00Z, got {text!r}"
        ) from None
    if moment.tzinfo is None:
        raise UsageError(f"{flag} {text!r} needs a time zone (Z for UTC)")
    ms = (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)
    if ms < 0:
        raise UsageError(f"{flag} {text!r} lies before 1970")
    return ms


# --- the registry and the time a check runs at ---------------------------------------------------


def add_time_and_log_arguments(parser: argparse.ArgumentParser) -> None:
    """What ``verify`` gains for audits: a registry log instead of a registry file, and evidence time."""
    parser.add_argument("--registry-log", help="registry-log.json instead of --registry: checked against --operator")
    parser.add_argument("--operator", help="with --registry-log: operator.pub.json, the operator key you pin")
    parser.add_argument(
        "--at-evidence-time",
        action="store_true",
        help="verify as of the leaf's creation time (keys valid then, every revocation applied); implies --audit",
    )


def add_registry_arguments(parser: argparse.ArgumentParser) -> None:
    """``--registry R`` or ``--registry-log L --operator K``, and the time to verify at."""
    parser.add_argument("--registry", help="registry.json")
    add_time_and_log_arguments(parser)
    parser.add_argument("--now-ms", type=int, help="verify as of this time (ms since the epoch; default now)")


def registry_from_args(args: argparse.Namespace) -> Registry:
    registry = optional_registry(args)
    if registry is None:
        raise UsageError("--registry (or --registry-log with --operator) is required")
    return registry


def optional_registry(args: argparse.Namespace) -> Registry | None:
    """The registry the command checks against: ``--registry``, or the verified ``--registry-log``."""
    if args.registry and args.registry_log:
        raise UsageError("give --registry or --registry-log, not both")
    if args.registry_log:
        if not args.operator:
            raise UsageError("--registry-log needs --operator (the operator public key you pin)")
        try:
            return read_log(args.registry_log, args.operator).registry
        except AdmissionError as exc:
            raise UsageError(f"{args.registry_log} does not verify: {exc.code}: {exc}") from None
    if args.operator:
        raise UsageError("--operator goes with --registry-log")
    if args.registry:
        return read_registry(args.registry)
    return None


def verification_time(args: argparse.Namespace, path: Path) -> int:
    """``--at-evidence-time``: when the evidence was made, the leaf record's ``created_ms`` (the output
    receipt's time); else ``--now-ms``; else the clock."""
    if args.at_evidence_time:
        if args.now_ms is not None:
            raise UsageError("give --now-ms or --at-evidence-time, not both")
        return path.leaf.record.created_ms
    return now_ms() if args.now_ms is None else args.now_ms


def render_tree(path: Path) -> str:
    """A readable tree: one line per record, edges marked local or cross-deployer (with co-signers)."""
    root = path.envelopes[0].record
    deployers = sorted({e.record.deployer for e in path.envelopes})
    lines = [
        f"path v{path.v} · {root.construction} · {len(path)} records · system {root.agent.system} · "
        f"deployers {', '.join(deployers)}"
    ]
    for index, envelope in enumerate(path.envelopes):
        record = envelope.record
        indent = "   " * index
        branch = "" if index == 0 else "└─ "
        lines.append(
            f"{indent}{branch}[{index}] {record.deployer} · {record.agent.instance} · depth {record.depth} · "
            f"{record.event} · max_children {record.max_children} · expires {iso(record.expires_ms)}"
        )
        detail = indent + ("   " if index else "") + "   "
        lines.append(f"{detail}key {record.key_id} · nonce {record.nonce}")
        if index:
            parent = path.envelopes[index - 1].record
            if parent.deployer == record.deployer:
                lines.append(f"{detail}edge: same deployer (local signature only)")
            elif record.cosigs:
                signers = " + ".join(f"{c.role} {c.deployer} ({c.key_id})" for c in record.cosigs)
                lines.append(f"{detail}edge: cross-deployer, co-signed by {signers}")
            else:
                lines.append(f"{detail}edge: cross-deployer, not co-signed")
        if record.output is not None:
            out = record.output
            lines.append(f"{detail}output {out.sha256} · {out.binding_scope} · session {out.session} · seq {out.seq}")
    return "\n".join(lines)


# --- keys ----------------------------------------------------------------------------------------


def new_key_file(location: str, what: str = "a key") -> Ed25519Signer:
    """Generate a key and write it to a new 0600 key file; never overwrite one. Raises UsageError."""
    from signer.backends.file import write_key_file

    key = Ed25519Signer.generate()
    try:
        write_key_file(location, key)
    except FileExistsError:
        raise UsageError(f"{location} exists; refusing to overwrite {what}") from None
    except OSError as exc:
        raise UsageError(f"cannot create {location}: {exc.strerror}") from None
    return key


def load_key(uri: str) -> Signer:
    """The signer a key URI names, or a UsageError saying why it cannot be used."""
    from signer.backends import load_signer

    try:
        return load_signer(uri)
    except SignerError as exc:
        raise UsageError(str(exc)) from None


# --- a command that talks to a daemon ------------------------------------------------------------


def add_client_arguments(parser: argparse.ArgumentParser, address_flag: str, *, required: bool = True) -> None:
    parser.add_argument(address_flag, required=required, help="host:port")
    parser.add_argument("--ca", default="", help="CA certificate (mTLS)")
    parser.add_argument("--cert", default="", help="client certificate (mTLS)")
    parser.add_argument("--tls-key", default="", help="client private key (mTLS)")
    parser.add_argument("--insecure-loopback", action="store_true", help="plaintext, loopback only")


def client_tls(args: argparse.Namespace, address: str) -> TlsConfig:
    from countersign._daemon.config import parse_addresses
    from countersign.client.tls import TlsConfig

    tls = TlsConfig(ca=args.ca, cert=args.cert, key=args.tls_key, insecure_loopback=args.insecure_loopback)
    try:
        tls.validate("client")
        parse_addresses(address, "address", tls)  # one, or replicas separated by commas
    except ConfigError as exc:
        raise UsageError(in_flag_words(str(exc))) from None
    return tls


# What a TLS setting is called on the command line (the config's words would send a user to a file).
_FLAG_OF_SETTING = (
    ("client: ", ""),
    (" (or tls.ca_pem)", ""), (" (or tls.cert_pem)", ""), (" (or tls.key_pem)", ""),
    ("tls.insecure_loopback", "--insecure-loopback"), ("tls.ca", "--ca"), ("tls.cert", "--cert"),
    ("tls.key", "--tls-key"),
)  # fmt: skip


def in_flag_words(message: str) -> str:
    """A TLS configuration message with each setting named by its command-line flag."""
    for setting, flag in _FLAG_OF_SETTING:
        message = message.replace(setting, flag)
    return message


def verifier_refused(args: argparse.Namespace, exc: ServiceError) -> UsageError:
    """A verifier's refusal (or silence) as the command line reports it, with a transport hint when
    it did not answer at all."""
    unreachable = exc.code in ("UNAVAILABLE", "DEADLINE_EXCEEDED")
    hint = transport_hint(args.insecure_loopback, str(exc)) if unreachable else ""
    return UsageError(f"verifier {args.verifier}: {exc.code}: {exc}{hint}")


def transport_hint(insecure_loopback: bool, message: str) -> str:
    """Why a daemon may not answer: nothing listens there, or plaintext and mTLS do not meet."""
    if "Connection refused" in message:
        return " (nothing is listening at that address)"
    if insecure_loopback:
        return " (is it serving mTLS? then give --ca, --cert and --tls-key instead of --insecure-loopback)"
    return (
        " (is it running, and serving mTLS with a certificate of this CA? a plaintext daemon needs --insecure-loopback)"
    )
