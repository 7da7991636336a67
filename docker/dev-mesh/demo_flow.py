"""The demo flow against a running mesh (the `demo` service of docker/compose.yaml).

Planner (deployer-a) -> Researcher (deployer-b) -> Writer (deployer-c): each runtime asks its own
signer, over mTLS with its runtime certificate; each cross-deployer edge is co-signed by the
parent's signer, which the child's signer reaches at the addresses given here (the compose service
names). A deployer's signer may be several replicas (``deployer-a=signer-a:7401,signer-a2:7401``):
its runtime and every delegation's ``parent_signer`` name them all, and the SDK retries a call at
the next one under the same request id (docs/spec.md 21.3). The Planner also keeps a session of
receipts, closed and verified as one session (``VerifySession``: no gap, no repeat). Then the
final output is verified on one verifier replica, its replay on the OTHER replica (both share
PostgreSQL, so the nonce consumed by the first is seen by the second), and a substituted output
is rejected.

``--hold FILE`` makes the Planner's session go on issuing receipts (one every 20 ms, at most
800) until FILE exists, after the line ``holding: ...``: the compose tests (tests/docker) kill
one of deployer-a's signer replicas meanwhile, and the flow must still complete.

``--save-path FILE`` also writes the accepted path (its bytes, then the output it attests) to FILE;
``--replay FILE`` later offers that path again to every verifier given, each of which must refuse it
as a replay (NONCE_REPLAYED): the consumed nonce outlives a restart of any replica.

Exit 0 when every verdict is the expected one, 1 otherwise, 2 when the mesh cannot be reached.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path

from countersign.client import SignerClient, VerifierClient
from countersign.client.tls import TlsConfig
from countersign.errors import CountersignError
from countersign.reasons import Reason, VerificationResult
from countersign.records import Path as EvidencePath
from countersign.sessions import SessionEvidence

PLANNER_TURNS = 3  # the Planner's session: receipts before any hold, and as many after it
HOLD_PAUSE_S = 0.02
HOLD_MAX_RECEIPTS = 800  # with the turns and the close, within one VerifySession request (1,024)
HOLD_MAX_S = 300.0

OUTPUTS = (
    b"plan: research the question, then write it up\n",
    b"findings: three independent sources agree\n",
    b"Final report: the three sources agree on the answer.\n",
)


def pairs(text: str) -> dict[str, str]:
    """``a=x,b=y`` -> {a: x, b: y}; an item without ``=`` is one more replica of the name before it:
    ``a=x1,x2,b=y`` -> {a: "x1,x2", b: y} (the comma-separated form a runtime and a parent_signer take)."""
    out: dict[str, list[str]] = {}
    name = ""
    for item in filter(None, (part.strip() for part in text.split(","))):
        named, sep, value = item.partition("=")
        if sep:
            name = named.strip()
            if not name or name in out:
                raise argparse.ArgumentTypeError(f"each NAME once, with an address: {item!r}")
            out[name] = []
        elif not name:
            raise argparse.ArgumentTypeError(f"expected NAME=HOST:PORT[,HOST:PORT...], got {item!r}")
        else:
            value = item
        if not value.strip():
            raise argparse.ArgumentTypeError(f"{name} has an empty address")
        out[name].append(value.strip())
    return {n: ",".join(addresses) for n, addresses in out.items()}


def tls(directory: Path, name: str) -> TlsConfig:
    return TlsConfig(
        ca=str(directory / "ca.pem"), cert=str(directory / f"{name}.pem"), key=str(directory / f"{name}.key")
    )


def first_root(runtime: SignerClient, system: str, timeout_s: float) -> EvidencePath:
    """The planner's root, retried while the signer has not seen the enrolment yet."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return runtime.root("planner-1", system, max_children=4)
        except CountersignError as exc:
            if time.monotonic() > deadline:
                raise
            print(f"  waiting for the signer of deployer-a: {getattr(exc, 'code', '')} {exc}", flush=True)
            time.sleep(1.0)


class HoldNotReleased(Exception):
    """The harness never created the hold file."""


def planner_session(
    runtime: SignerClient, planner: EvidencePath, hold: Path | None
) -> tuple[list[EvidencePath], list[bytes | None]]:
    """The Planner's session: its turns, then (``hold``) receipts until the hold file exists, then as
    many turns again and the close receipt. The paths to the receipts and their outputs (None: the close)."""
    receipts: list[EvidencePath] = []
    outputs: list[bytes | None] = []

    def turn(output: bytes) -> None:
        receipts.append(runtime.receipt(planner, hashlib.sha256(output).digest(), session="planner"))
        outputs.append(output)

    turn(OUTPUTS[0])
    for index in range(1, PLANNER_TURNS):
        turn(f"plan, step {index + 1}\n".encode())
    if hold is not None:
        print(f"  holding: deployer-a's session goes on until {hold} exists", flush=True)
        started, held = time.monotonic(), 0
        while not hold.exists():
            if time.monotonic() - started > HOLD_MAX_S:
                raise HoldNotReleased(f"{hold} did not appear within {HOLD_MAX_S:.0f} s")
            if held < HOLD_MAX_RECEIPTS:
                turn(f"plan, note {held + 1} while held\n".encode())
                held += 1
            time.sleep(HOLD_PAUSE_S)
        print(f"  hold released after {held} more receipts", flush=True)
    for index in range(PLANNER_TURNS):
        turn(f"plan, step {PLANNER_TURNS + index + 1}\n".encode())
    receipts.append(runtime.close_session(planner, session="planner"))
    outputs.append(None)
    return receipts, outputs


def session_seqs(receipts: list[EvidencePath]) -> list[int]:
    return [r.leaf.record.output.seq if r.leaf.record.output is not None else -1 for r in receipts]


def save(path_file: Path, data: bytes, output: bytes) -> None:
    """The accepted path and its output: a 4-byte big-endian length, the path, then the output."""
    path_file.write_bytes(len(data).to_bytes(4, "big") + data + output)


def load(path_file: Path) -> tuple[bytes, bytes]:
    raw = path_file.read_bytes()
    size = int.from_bytes(raw[:4], "big")
    if len(raw) < 4 + size:
        raise ValueError(f"{path_file} is truncated")
    return raw[4 : 4 + size], raw[4 + size :]


def replay(path_file: Path, verifiers: list[str], tls_dir: Path) -> int:
    """Offer a path accepted earlier to every verifier: each must refuse it as a replay."""
    try:
        data, output = load(path_file)
    except (OSError, ValueError) as exc:
        print(f"cannot read the saved path: {exc}", file=sys.stderr)
        return 2
    clients = [VerifierClient(address, tls(tls_dir, "client")) for address in verifiers]
    refused = 0
    try:
        print(f"Replay of the path saved in {path_file}:", flush=True)
        for address, client in zip(verifiers, clients, strict=True):
            result = client.verify(data, output).result
            ok = not result and result.reason is Reason.NONCE_REPLAYED
            refused += ok
            verdict = "ACCEPT" if result else f"REJECT {result.reason}"
            print(f"  {'ok ' if ok else 'BAD'} {'replay of the accepted path on ' + address:<58} {verdict}", flush=True)
    except CountersignError as exc:
        print(f"the mesh refused or could not be reached: {getattr(exc, 'code', '')} {exc}", file=sys.stderr)
        return 2
    finally:
        for client in clients:
            client.close()
    every = refused == len(verifiers)
    print("every replay refused" if every else f"NOT as expected: {len(verifiers) - refused} accepted", flush=True)
    return 0 if every else 1


def run(
    signers: dict[str, str],
    verifiers: list[str],
    tls_dir: Path,
    wait_s: float,
    save_path: Path | None = None,
    hold: Path | None = None,
) -> int:
    deployers = ("deployer-a", "deployer-b", "deployer-c")
    missing = [d for d in deployers if d not in signers]
    if missing or len(verifiers) < 2:
        print(f"need signers for {', '.join(deployers)} and two verifiers; missing {missing}", file=sys.stderr)
        return 2
    runtimes = {d: SignerClient(signers[d], tls(tls_dir, f"runtime-{d}"), d) for d in deployers}
    first, second = (VerifierClient(address, tls(tls_dir, "client")) for address in verifiers[:2])
    failed: list[str] = []

    def outcome(label: str, result: VerificationResult, expected: Reason | None) -> None:
        ok = (expected is None and bool(result)) or (expected is not None and result.reason is expected)
        verdict = "ACCEPT" if result else f"REJECT {result.reason}"
        print(f"  {'ok ' if ok else 'BAD'} {label:<58} {verdict}", flush=True)
        if not ok:
            failed.append(label)

    try:
        system = f"compose-demo-{int(time.time())}"
        print("Delegation: Planner (deployer-a) -> Researcher (deployer-b) -> Writer (deployer-c)", flush=True)
        replicas = len(runtimes["deployer-a"].addresses)
        planner = first_root(runtimes["deployer-a"], system, wait_s)
        receipts, outputs = planner_session(runtimes["deployer-a"], planner, hold)
        seqs = session_seqs(receipts)
        print(f"  the Planner's session: {len(receipts) - 1} receipts and its close, seq {seqs[0]}-{seqs[-1]}, "
              f"through deployer-a's signer ({replicas} replica{'s' if replicas > 1 else ''})", flush=True)  # fmt: skip
        grant_b = runtimes["deployer-a"].open_grant(planner, "deployer-b")
        researcher = runtimes["deployer-b"].accept(planner, grant_b, signers["deployer-a"], "researcher-1")
        runtimes["deployer-b"].receipt(researcher, hashlib.sha256(OUTPUTS[1]).digest(), session="researcher")
        grant_c = runtimes["deployer-b"].open_grant(researcher, "deployer-c")
        writer = runtimes["deployer-c"].accept(researcher, grant_c, signers["deployer-b"], "writer-1")
        final = runtimes["deployer-c"].receipt(writer, hashlib.sha256(OUTPUTS[2]).digest(), session="writer")
        print(f"  2 co-signed cross-deployer edges and the writer's receipt: {len(final)} records", flush=True)

        data = final.to_bytes()
        print(f"Verification on {verifiers[0]} and {verifiers[1]} (one shared store):", flush=True)
        # One session: seq 0, 1, 2, ... with no gap and no repeat, whichever replica signed each.
        numbered = seqs == list(range(len(receipts)))
        label = "the Planner's session: seq 0, 1, 2, ... (no gap, no repeat)"
        print(f"  {'ok ' if numbered else 'BAD'} {label:<58} {'as expected' if numbered else seqs}", flush=True)
        if not numbered:
            failed.append(label)
        session = SessionEvidence(planner, tuple(r.leaf for r in receipts))
        verdict = first.verify_session(session, outputs, require_closed=True).result
        outcome(f"the Planner's session, {len(receipts)} receipts (replica 1)", verdict, None)
        accepted = first.verify(data, OUTPUTS[2]).result
        outcome("final output of the Writer (replica 1)", accepted, None)
        if accepted and save_path is not None:
            save(save_path, data, OUTPUTS[2])
        outcome("replay of the same path (replica 2)", second.verify(data, OUTPUTS[2]).result, Reason.NONCE_REPLAYED)
        outcome(
            "substituted output bytes (replica 2)",
            second.verify(data, b"Final report: they disagree.\n", audit=True).result,
            Reason.OUTPUT_MISMATCH,
        )
    except CountersignError as exc:
        print(f"the mesh refused or could not be reached: {getattr(exc, 'code', '')} {exc}", file=sys.stderr)
        return 2
    except HoldNotReleased as exc:
        print(f"the hold was not released: {exc}", file=sys.stderr)
        return 2
    finally:
        for runtime in runtimes.values():
            runtime.close()
        first.close()
        second.close()
    print("all outcomes as expected" if not failed else f"NOT as expected: {', '.join(failed)}", flush=True)
    return 0 if not failed else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--signers", type=pairs, help="deployer=host:port[,host:port...],... of the three signers (and their replicas)"
    )
    parser.add_argument("--verifiers", required=True, help="host:port,host:port of the verifier replicas")
    parser.add_argument(
        "--tls-dir", type=Path, required=True, help="ca.pem, runtime-<deployer>.pem/.key, client.pem/.key"
    )
    parser.add_argument("--wait", type=float, default=60.0, help="seconds to wait for the enrolment to arrive")
    parser.add_argument("--save-path", type=Path, help="write the accepted path (and its output) to this file")
    parser.add_argument("--replay", type=Path, help="only offer the path saved in this file to every verifier")
    parser.add_argument(
        "--hold", type=Path, help="the Planner's session issues receipts until this file exists (tests/docker)"
    )
    args = parser.parse_args(argv)
    verifiers = [v.strip() for v in args.verifiers.split(",") if v.strip()]
    if args.replay is not None:
        return replay(args.replay, verifiers, args.tls_dir)
    if args.signers is None:
        parser.error("--signers is required unless --replay is given")
    return run(args.signers, verifiers, args.tls_dir, args.wait, args.save_path, args.hold)


if __name__ == "__main__":
    sys.exit(main())
