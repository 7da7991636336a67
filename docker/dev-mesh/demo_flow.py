"""The demo flow against a running mesh (the `demo` service of docker/compose.yaml).

Planner (deployer-a) -> Researcher (deployer-b) -> Writer (deployer-c): each runtime asks its own
signer, over mTLS with its runtime certificate; each cross-deployer edge is co-signed by the
parent's signer, which the child's signer reaches at the address given here (the compose service
name). Then the final output is verified on one verifier replica, its replay on the OTHER replica
(both share PostgreSQL, so the nonce consumed by the first is seen by the second), and a
substituted output is rejected.

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

OUTPUTS = (
    b"plan: research the question, then write it up\n",
    b"findings: three independent sources agree\n",
    b"Final report: the three sources agree on the answer.\n",
)


def pairs(text: str) -> dict[str, str]:
    """``a=x,b=y`` -> {a: x, b: y}."""
    out = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"expected NAME=HOST:PORT, got {item!r}")
        out[name] = value
    return out


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


def run(signers: dict[str, str], verifiers: list[str], tls_dir: Path, wait_s: float) -> int:
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
        planner = first_root(runtimes["deployer-a"], system, wait_s)
        runtimes["deployer-a"].receipt(planner, hashlib.sha256(OUTPUTS[0]).digest(), session="planner")
        grant_b = runtimes["deployer-a"].open_grant(planner, "deployer-b")
        researcher = runtimes["deployer-b"].accept(planner, grant_b, signers["deployer-a"], "researcher-1")
        runtimes["deployer-b"].receipt(researcher, hashlib.sha256(OUTPUTS[1]).digest(), session="researcher")
        grant_c = runtimes["deployer-b"].open_grant(researcher, "deployer-c")
        writer = runtimes["deployer-c"].accept(researcher, grant_c, signers["deployer-b"], "writer-1")
        final = runtimes["deployer-c"].receipt(writer, hashlib.sha256(OUTPUTS[2]).digest(), session="writer")
        print(f"  2 co-signed cross-deployer edges and the writer's receipt: {len(final)} records", flush=True)

        data = final.to_bytes()
        print(f"Verification on {verifiers[0]} and {verifiers[1]} (one shared store):", flush=True)
        outcome("final output of the Writer (replica 1)", first.verify(data, OUTPUTS[2]).result, None)
        outcome("replay of the same path (replica 2)", second.verify(data, OUTPUTS[2]).result, Reason.NONCE_REPLAYED)
        outcome(
            "substituted output bytes (replica 2)",
            second.verify(data, b"Final report: they disagree.\n", audit=True).result,
            Reason.OUTPUT_MISMATCH,
        )
    except CountersignError as exc:
        print(f"the mesh refused or could not be reached: {getattr(exc, 'code', '')} {exc}", file=sys.stderr)
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
    parser.add_argument("--signers", type=pairs, required=True, help="deployer=host:port,... of the three signers")
    parser.add_argument("--verifiers", required=True, help="host:port,host:port of two verifier replicas")
    parser.add_argument(
        "--tls-dir", type=Path, required=True, help="ca.pem, runtime-<deployer>.pem/.key, client.pem/.key"
    )
    parser.add_argument("--wait", type=float, default=60.0, help="seconds to wait for the enrolment to arrive")
    args = parser.parse_args(argv)
    verifiers = [v.strip() for v in args.verifiers.split(",") if v.strip()]
    return run(args.signers, verifiers, args.tls_dir, args.wait)


if __name__ == "__main__":
    sys.exit(main())
