"""Session benchmark (issue 17; issue 22's session row): ``python -m bench --only sessions``.

* **Verification from bytes**: ``check_session_evidence_bytes`` over a closed session of 10, 100 and 1,000
  outputs (every output's bytes presented), per receipt, beside the raw PyNaCl Ed25519 verifies of the
  receipts' own signatures over their signing inputs (libsodium's ``crypto_sign_open``, as the check
  calls it), measured in the same interleaved rounds (thread CPU time, so a busy
  neighbour's time slices are not counted). Target: at most 1.3x raw per receipt. The **floor** is
  what any verifier of this format must do per receipt besides the signature, measured in the same
  rounds: read the receipt's JSON with no checks (the fastest decoder installed), encode its record
  canonically (what the signature covers; the encoder that decoder offers), digest the envelope (the
  next receipt's ``prev``) and hash the output; and its share of the agent path's own signatures,
  which a session's first receipt verifies once (4 here: two records and one edge's co-signatures).
* **Streaming issuance** over a real signer daemon on loopback with mTLS (``StreamReceipts``): receipts
  per second per signer with the runtime sending a stream's chunks as fast as it can, and the latency
  a chunk adds at the runtime when it waits for each chunk's receipt before sending the next.
"""

from __future__ import annotations

import hashlib
import json
import queue
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

from bench.core import RecordingSignatures, plain_codec, raw_verifies
from bench.mesh import percentiles, pinned_mesh
from countersign._proto.v1 import signer_pb2, signer_pb2_grpc
from countersign.canonical import b64url_decode
from countersign.client.tls import open_channel, signer_dns
from countersign.constructions import record_signing_input
from countersign.keys import PublicKey
from countersign.records import DECODER, Construction, Path
from countersign.samples import SampleMesh
from countersign.sessions import SessionEvidence, check_session_evidence_bytes

NOW_MS = 1_780_000_000_000
SIZES = (10, 100, 1_000)
TARGET_RATIO = 1.3
TARGET_FROM_OUTPUTS = 100  # the target is per receipt from 100 outputs on (issue 32)
CHUNK_BYTES = 256  # a few dozen tokens of text per signed chunk


def _session(outputs: int) -> tuple[bytes, list[bytes | None], SessionEvidence, SampleMesh]:
    mesh = SampleMesh.create(["deployer-a", "deployer-b"], seed=b"bench-sessions")
    trunk = mesh.issue_path(Construction.SIGNED_DAG, ["deployer-a", "deployer-b", "deployer-b"], b"", now_ms=NOW_MS)
    agent = Path(trunk.envelopes[:2])  # a delegated agent: the session's receipts hang under it
    texts = [b"turn %d: " % i + b"answer text " * 16 for i in range(outputs)]
    session = SessionEvidence(agent, mesh.issue_session(agent, texts, now_ms=NOW_MS, closed=True))
    return session.to_bytes(), [*texts, None], session, mesh


def _cpu_s(fn: Callable[[], object]) -> float:
    started = time.thread_time()
    fn()
    return time.thread_time() - started


def verification(sizes: tuple[int, ...] = SIZES, rounds: int = 21) -> list[dict[str, float]]:
    """Per receipt, µs (median of ``rounds`` interleaved rounds), and the ratios to raw."""
    return [_verification_row(outputs, rounds) for outputs in sizes]


def _verification_row(outputs: int, rounds: int) -> dict[str, float]:
    data, presented, session, mesh = _session(outputs)
    receipts = session.receipts
    count = len(receipts)
    recorder = RecordingSignatures()  # what receipt 0's walk verifies: the agent path's signatures, and its own
    assert check_session_evidence_bytes(
        data, presented, registry=mesh.registry, now_ms=NOW_MS, require_closed=True, signatures=recorder
    ).result
    agent_signatures = len(recorder.checks) - 1  # verified once a session, beside one a receipt
    # Each receipt's own signature over its own signing input, as the check verifies them.
    triples = []
    for receipt in receipts:
        record = receipt.record
        key = mesh.registry.resolve(record.deployer, record.key_id, record.created_ms)
        assert isinstance(key, PublicKey)
        assert receipt.sig is not None
        triples.append((key.raw, record_signing_input(record.construction, receipt), b64url_decode(receipt.sig, 64)))
    envelopes = [json.dumps(r.to_json(), separators=(",", ":")).encode() for r in receipts]
    texts = [t or b"" for t in presented]
    decode, encode = plain_codec()
    raw = raw_verifies(triples)

    def floor() -> None:  # besides the signature: read, canonical record bytes, two digests
        for envelope, text in zip(envelopes, texts, strict=True):
            value: Any = decode(envelope)
            body = encode(value["record"])  # sorted keys, no whitespace: canonical for a valid record
            hashlib.sha256(body).digest()
            hashlib.sha256(text).digest()

    def check() -> None:
        check_session_evidence_bytes(data, presented, registry=mesh.registry, now_ms=NOW_MS, require_closed=True)

    samples: dict[str, list[float]] = {"raw": [], "floor": [], "check": []}
    for _ in range(rounds):
        for name, fn in (("raw", raw), ("floor", floor), ("check", check)):
            samples[name].append(_cpu_s(fn) / count * 1e6)
    ratios = [c / r for c, r in zip(samples["check"], samples["raw"], strict=True)]
    # The floor, per receipt: its signature, its share of the agent path's, and the reading besides.
    floors = [
        (r * (1 + agent_signatures / count) + f) / r for r, f in zip(samples["raw"], samples["floor"], strict=True)
    ]
    return {
        "outputs": outputs,
        "receipts": count,
        "bytes": len(data),
        "raw_us": statistics.median(samples["raw"]),
        "check_us": statistics.median(samples["check"]),
        "ratio": statistics.median(ratios),
        "ratio_min": min(ratios),
        "floor_ratio": statistics.median(floors),
    }


class _Stream:
    """One StreamReceipts call fed from a queue, so the caller decides when each chunk is sent."""

    def __init__(self, stub: signer_pb2_grpc.SignerStub, parent: Path, session: str) -> None:
        self._queue: queue.Queue[signer_pb2.OutputChunk | None] = queue.Queue()
        self._queue.put(signer_pb2.OutputChunk(parent_path=parent.to_bytes(), session=session, unit="bytes",
                                               n=CHUNK_BYTES))  # fmt: skip
        self.answers: Iterator[signer_pb2.ChunkReceipt] = stub.StreamReceipts(self._messages(), timeout=600)

    def _messages(self) -> Iterator[signer_pb2.OutputChunk]:
        while (message := self._queue.get()) is not None:
            yield message

    def send(self, data: bytes) -> None:
        self._queue.put(signer_pb2.OutputChunk(data=data))

    def end(self) -> None:
        self._queue.put(None)


def streaming(chunks: int) -> dict[str, Any]:
    with pinned_mesh("countersign-bench-sessions-") as mesh:
        runtime = mesh.runtime("deployer-a")
        agent = runtime.root("streamer", "bench-sessions")
        channel = open_channel(mesh.daemons["deployer-a"].address, mesh.tls_for("deployer-a-runtime"),
                               signer_dns("deployer-a"))  # fmt: skip
        stub = signer_pb2_grpc.SignerStub(channel)
        piece = b"t" * CHUNK_BYTES
        try:
            runtime.stream_receipts(agent, [piece] * 20, session="warm", n=CHUNK_BYTES)  # connections, caches
            started = time.perf_counter()
            done = runtime.stream_receipts(agent, [piece] * chunks, session="flood", n=CHUNK_BYTES)
            flood_s = time.perf_counter() - started
            assert len(done) == chunks
            # Lock-step: each chunk sent only once the one before has its receipt.
            stream = _Stream(stub, agent, "lockstep")
            latencies = []
            for index in range(chunks):
                sent = time.perf_counter()
                stream.send(piece)
                answer = next(stream.answers)
                latencies.append((time.perf_counter() - sent) * 1e6)
                assert answer.seq == index
            stream.end()
            assert list(stream.answers) == []
            # The same signer's unary IssueReceipt, one at a time, for comparison.
            digest = hashlib.sha256(piece).digest()
            unary = []
            for _ in range(min(chunks, 300)):
                sent = time.perf_counter()
                runtime.receipt(agent, digest, session="unary")
                unary.append((time.perf_counter() - sent) * 1e6)
        finally:
            channel.close()
            runtime.close()
    return {
        "chunks": chunks,
        "chunk_bytes": CHUNK_BYTES,
        "receipts_per_s": chunks / flood_s,
        "lockstep_us": percentiles(latencies),
        "unary_receipt_us": percentiles(unary),
    }


def run(quick: bool = False) -> dict[str, Any]:
    return {
        "decoder": DECODER,
        "verification": verification(rounds=5 if quick else 21),
        "streaming": streaming(200 if quick else 2_000),
    }


def report(results: dict[str, Any]) -> str:
    lines = [
        "Session verification from bytes (check_session_evidence_bytes, closed session, every output presented), "
        "per receipt, beside the raw PyNaCl verifies of the receipts' own signatures in the same rounds (thread "
        "CPU time, median of rounds; the floor adds reading the bytes with no checks and the agent path's share; "
        f"parsed by {results.get('decoder', DECODER)})",
        "",
        "| outputs | receipts | bytes | raw verify a receipt, µs | per receipt, µs | ratio (min) | floor | target |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in results["verification"]:
        if row["outputs"] < TARGET_FROM_OUTPUTS:
            target = f"none (≤ {TARGET_RATIO}x from {TARGET_FROM_OUTPUTS:,} outputs on)"
        else:
            target = f"≤ {TARGET_RATIO}x {'met' if row['ratio'] <= TARGET_RATIO else 'missed'}"
        lines.append(
            f"| {row['outputs']:,} | {row['receipts']:,} | {row['bytes']:,} | {row['raw_us']:.1f} | "
            f"{row['check_us']:.1f} | {row['ratio']:.2f}x ({row['ratio_min']:.2f}x) | {row['floor_ratio']:.2f}x | "
            f"{target} |"
        )
    targeted = [row["floor_ratio"] for row in results["verification"] if row["outputs"] >= TARGET_FROM_OUTPUTS]
    floor = max(targeted, default=0.0)
    if floor >= TARGET_RATIO:
        lines.append(
            f"\nThe floor ({floor:.2f}x: read, canonical record bytes, two digests, the agent path's share) is "
            "above the target."
        )
    stream = results["streaming"]
    lock, unary = stream["lockstep_us"], stream["unary_receipt_us"]
    lines += [
        "",
        f"Streaming issuance over one signer daemon (loopback, mTLS), {stream['chunks']:,} chunks of "
        f"{stream['chunk_bytes']} bytes",
        "",
        "| measure | mean | p50 | p95 | p99 |",
        "|---|---:|---:|---:|---:|",
        f"| receipts per second per signer, chunks sent back to back | {stream['receipts_per_s']:,.0f} | | | |",
        f"| latency a chunk adds at the runtime (lock-step), µs | {lock['mean']:.0f} | {lock['p50']:.0f} | "
        f"{lock['p95']:.0f} | {lock['p99']:.0f} |",
        f"| one unary IssueReceipt on a lane, µs (for comparison) | {unary['mean']:.0f} | {unary['p50']:.0f} | "
        f"{unary['p95']:.0f} | {unary['p99']:.0f} |",
    ]
    return "\n".join(lines)


def as_json(results: dict[str, Any]) -> str:
    return json.dumps(results)


if __name__ == "__main__":
    print(report(run()))
