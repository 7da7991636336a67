"""Session benchmark (issue 17; issue 22's session row): ``python -m bench --only sessions``.

* **Verification from bytes**: ``check_session_evidence_bytes`` over a closed session of 10, 100 and 1,000
  outputs (every output's bytes presented), per receipt, beside one raw PyNaCl Ed25519 verify of a
  receipt's real signing input, measured in the same interleaved rounds (thread CPU time, so a busy
  neighbour's time slices are not counted). Target: at most 1.3x raw per receipt. The **floor** is
  what any verifier of this format must do per receipt besides the signature, measured in the same
  rounds: read the receipt's JSON with no checks (the fastest decoder installed), encode its record
  canonically (what the signature covers; the encoder that decoder offers), digest the envelope (the
  next receipt's ``prev``) and hash the output.
* **Streaming issuance** over a real signer daemon on loopback with mTLS (``StreamReceipts``): receipts
  per second per signer with the runtime sending a stream's chunks as fast as it can, and the latency
  a chunk adds at the runtime when it waits for each chunk's receipt before sending the next.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import queue
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import nacl.signing

from bench.mesh import percentiles, pinned_mesh
from countersign._proto.v1 import signer_pb2, signer_pb2_grpc
from countersign.client.tls import open_channel, signer_dns
from countersign.constructions import record_signing_input
from countersign.records import DECODER, Construction, Path
from countersign.samples import SampleMesh
from countersign.sessions import SessionEvidence, check_session_evidence_bytes

NOW_MS = 1_780_000_000_000
SIZES = (10, 100, 1_000)
TARGET_RATIO = 1.3
CHUNK_BYTES = 256  # a few dozen tokens of text per signed chunk


def _session(outputs: int) -> tuple[bytes, list[bytes | None], SessionEvidence, SampleMesh]:
    mesh = SampleMesh.create(["deployer-a", "deployer-b"], seed=b"bench-sessions")
    trunk = mesh.issue_path(Construction.SIGNED_DAG, ["deployer-a", "deployer-b", "deployer-b"], b"", now_ms=NOW_MS)
    agent = Path(trunk.envelopes[:2])  # a delegated agent: the session's receipts hang under it
    texts = [b"turn %d: " % i + b"answer text " * 16 for i in range(outputs)]
    session = SessionEvidence(agent, mesh.issue_session(agent, texts, now_ms=NOW_MS, closed=True))
    return session.to_bytes(), [*texts, None], session, mesh


def _plain_codec() -> tuple[Callable[[bytes], object], Callable[[object], bytes]]:
    """JSON read and written with no checks, by msgspec when the ``fast`` extra is installed (sorted keys:
    canonical bytes for a valid record), else by the standard library's C codec."""
    if importlib.util.find_spec("msgspec") is not None:
        msgspec: Any = importlib.import_module("msgspec")
        return msgspec.json.decode, msgspec.json.Encoder(order="sorted").encode
    return json.loads, lambda value: json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


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
    assert check_session_evidence_bytes(
        data, presented, registry=mesh.registry, now_ms=NOW_MS, require_closed=True
    ).result
    sample = receipts[len(receipts) // 2]
    message = record_signing_input(sample.record.construction, sample)
    key = nacl.signing.SigningKey(b"\x07" * 32)
    signed, verify_key = key.sign(message), key.verify_key
    envelopes = [json.dumps(r.to_json(), separators=(",", ":")).encode() for r in receipts]
    texts = [t or b"" for t in presented]
    decode, encode = _plain_codec()

    def raw() -> None:
        for _ in range(count):
            verify_key.verify(signed)

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
    floors = [(r + f) / r for r, f in zip(samples["raw"], samples["floor"], strict=True)]
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
        "per receipt, beside one raw PyNaCl verify in the same rounds (thread CPU time, median of rounds; "
        f"parsed by {results.get('decoder', DECODER)})",
        "",
        "| outputs | receipts | bytes | raw verify, µs | per receipt, µs | ratio (min) | floor | target |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in results["verification"]:
        mark = "met" if row["ratio"] <= TARGET_RATIO else "missed"
        lines.append(
            f"| {row['outputs']:,} | {row['receipts']:,} | {row['bytes']:,} | {row['raw_us']:.1f} | "
            f"{row['check_us']:.1f} | {row['ratio']:.2f}x ({row['ratio_min']:.2f}x) | {row['floor_ratio']:.2f}x | "
            f"≤ {TARGET_RATIO}x {mark} |"
        )
    floor = max(row["floor_ratio"] for row in results["verification"])
    if floor >= TARGET_RATIO:
        lines.append(f"\nThe floor ({floor:.2f}x: read, canonical record bytes, two digests) is above the target.")
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
