"""Memory under a burst of large requests (issue 21, "Memory"; ADR 0027).

An independent run sent 56 concurrent 22 MiB requests to each daemon: the verifier went to 1,147 MiB,
the coordinator to 1,692 MiB and the signer to 1,145 MiB (the Terraform task limit is 1,024 MiB), and
RSS stayed at 4-5x idle afterwards. The target: under the same burst each daemon stays below 512 MiB
(its peak resident set, VmHWM), still serves, and its RSS comes back within 1.5x of idle.

A 22 MiB request is over every daemon's size limit now, so that burst measures how cheaply a refusal
comes; the verifier is also sent 56 concurrent requests just under its ``VerifyPath`` limit, which it
must parse, so that burst measures the receive budget (``countersign._daemon.server.ReceiveBudget``).
Marked exclusive: it measures resident memory and sends about 1.2 GiB from the test process, which
neighbours running beside it would disturb.
"""

from __future__ import annotations

import hashlib
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path as FilePath

import grpc
import pytest

from countersign._proto.v1 import verifier_pb2
from countersign.client.errors import from_rpc_error
from countersign.records import MAX_INPUT_BYTES
from countersign_cli.localmesh import LocalMesh
from tests.mesh.helpers import big_channel_to
from verifier.daemon import MAX_OUTPUT_BYTES, VERIFY_MESSAGE_BYTES

pytestmark = [pytest.mark.daemons, pytest.mark.slow, pytest.mark.exclusive]

MIB = 1 << 20
BURST = 56
LARGE = 22 * MIB
PEAK_LIMIT_MIB = 512
AUDIT = verifier_pb2.VerifyPathRequest.AUDIT
CHANNELS = 8  # the burst's calls spread over several connections, as separate attackers would
METHODS = {  # daemon -> a method every client certificate may call, that takes a bytes field
    "verifier-0": "/countersign.v1.Verifier/VerifyPath",
    "deployer-a": "/countersign.v1.Signer/IssueRoot",
    "coordinator": "/countersign.v1.Coordinator/Submit",
}


def _status(pid: int, field: str) -> int:
    """A ``/proc/PID/status`` figure in KiB (VmRSS: resident now; VmHWM: the highest resident so far)."""
    for line in FilePath(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


def _pid(mesh: LocalMesh, name: str) -> int:
    process = mesh.daemons[name].process
    assert process is not None
    return process.pid


def _verify_once(mesh: LocalMesh) -> None:
    """The verifier answers a real path (so it serves), and so do the signer and the coordinator."""
    runtime = mesh.runtime("deployer-a")
    try:
        output = f"after the burst {time.time_ns()}\n".encode()
        path = runtime.receipt(runtime.root("writer", "svc"), hashlib.sha256(output).digest())
    finally:
        runtime.close()
    client = mesh.verifier_client()
    try:
        assert client.verify(path, output).result, "the verifier no longer accepts a fresh path"
    finally:
        client.close()


def _burst(mesh: LocalMesh, name: str, method: str, body: bytes) -> list[str]:
    """``BURST`` concurrent calls sending ``body``; the status code each ended with."""
    channels = [big_channel_to(mesh, name, "client", len(body) + MIB) for _ in range(CHANNELS)]
    try:
        calls = [
            channel.unary_unary(method, request_serializer=None, response_deserializer=None) for channel in channels
        ]

        def one(index: int) -> str:
            try:
                calls[index % CHANNELS](body, timeout=60)
            except grpc.RpcError as exc:
                return from_rpc_error(exc).code
            return "OK"

        with ThreadPoolExecutor(BURST) as pool:
            return list(pool.map(one, range(BURST)))
    finally:
        for channel in channels:
            channel.close()


def _settled_rss(pid: int, idle_kib: int) -> int:
    """Wait (up to 20 s) for RSS to come back within 1.5x idle; return the last reading."""
    deadline = time.monotonic() + 20
    while True:
        rss = _status(pid, "VmRSS")
        if rss <= 1.5 * idle_kib or time.monotonic() > deadline:
            return rss
        time.sleep(0.2)


def _report(name: str, what: str, idle: int, peak: int, after: int) -> str:
    return f"{name} {what}: idle {idle // 1024} MiB, peak {peak // 1024} MiB, after {after // 1024} MiB"


@pytest.fixture
def burst_mesh(make_mesh: object) -> LocalMesh:
    mesh = make_mesh(deployers=("deployer-a",))  # type: ignore[operator]
    assert isinstance(mesh, LocalMesh)
    _verify_once(mesh)  # warm: the idle figure is a daemon that has served
    return mesh


@pytest.mark.parametrize("name", list(METHODS))
def test_a_burst_of_22_mib_requests_is_refused_at_the_size_limit_and_memory_stays_bounded(
    burst_mesh: LocalMesh, name: str
) -> None:
    pid = _pid(burst_mesh, name)
    idle = _status(pid, "VmRSS")
    body = verifier_pb2.VerifyPathRequest(path=b"{}", output=b"x" * LARGE, mode=AUDIT).SerializeToString()
    codes = _burst(burst_mesh, name, METHODS[name], body)
    peak, after = _status(pid, "VmHWM"), _settled_rss(pid, idle)
    print(_report(name, f"{BURST} x 22 MiB", idle, peak, after))
    assert set(codes) == {"RESOURCE_EXHAUSTED"}, codes
    assert peak < PEAK_LIMIT_MIB * 1024, _report(name, "burst", idle, peak, after)
    assert after <= 1.5 * idle, _report(name, "burst", idle, peak, after)
    _verify_once(burst_mesh)
    assert burst_mesh.daemons[name].alive


def test_a_burst_just_under_the_verify_limit_is_held_to_the_receive_budget(burst_mesh: LocalMesh) -> None:
    pid = _pid(burst_mesh, "verifier-0")
    idle = _status(pid, "VmRSS")
    # A path of 1 MiB (parsed, then MALFORMED) and 1 MiB of output: the most VerifyPath takes.
    request = verifier_pb2.VerifyPathRequest(path=b"[" * MAX_INPUT_BYTES, output=b"x" * MAX_OUTPUT_BYTES, mode=AUDIT)
    body = request.SerializeToString()
    assert len(body) <= VERIFY_MESSAGE_BYTES
    codes = _burst(burst_mesh, "verifier-0", METHODS["verifier-0"], body)
    peak, after = _status(pid, "VmHWM"), _settled_rss(pid, idle)
    print(_report("verifier-0", f"{BURST} x {len(body) // 1024} KiB", idle, peak, after), codes.count("OK"), "answered")
    # Each is answered (a MALFORMED verdict for the "{}" path) or refused by the budget, retryably.
    assert set(codes) <= {"OK", "RESOURCE_EXHAUSTED"}, codes
    assert "OK" in codes
    assert peak < PEAK_LIMIT_MIB * 1024
    assert after <= 1.5 * idle, _report("verifier-0", "budget burst", idle, peak, after)
    _verify_once(burst_mesh)
