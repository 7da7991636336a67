"""Health, reflection and graceful shutdown of every daemon."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from countersign._proto.v1 import coordinator_pb2
from countersign_cli.localmesh import LocalMesh
from tests.mesh.helpers import channel_to, coordinator_stub, delegate, service_error

pytestmark = pytest.mark.daemons
GRACE_S = 5.0  # run_daemon's grace period
SERVICES = {
    "coordinator": "countersign.v1.Coordinator",
    "signer": "countersign.v1.Signer",
    "verifier": "countersign.v1.Verifier",
}


def test_health_reports_serving(mesh: LocalMesh) -> None:
    for name, daemon in mesh.daemons.items():
        channel = channel_to(mesh, name, "client")
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", SERVICES[daemon.kind]):
            answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING, (name, service)
        error = service_error(
            lambda health=health: health.Check(health_pb2.HealthCheckRequest(service="x.Y"), timeout=10)
        )
        assert error.status is grpc.StatusCode.NOT_FOUND
        channel.close()


def test_reflection_lists_the_services(mesh: LocalMesh) -> None:
    for name, daemon in mesh.daemons.items():
        channel = channel_to(mesh, name, "client")
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        requests = [
            reflection_pb2.ServerReflectionRequest(list_services=""),
            reflection_pb2.ServerReflectionRequest(file_containing_symbol=SERVICES[daemon.kind]),
        ]
        listed, described = list(stub.ServerReflectionInfo(iter(requests), timeout=10))
        services = {s.name for s in listed.list_services_response.service}
        assert services == {SERVICES[daemon.kind], "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"}
        assert described.file_descriptor_response.file_descriptor_proto, name
        channel.close()


def stopped_cleanly(mesh: LocalMesh, name: str) -> bool:
    """The "stopping" event, "stopped" as the last line, and nothing worse than a warning between them
    (a follower may log that the already stopped coordinator is unreachable while the daemon drains)."""
    lines = mesh.daemons[name].log_file.read_text().splitlines()
    records = [json.loads(line) for line in lines if line.startswith("{")]
    events = [record.get("event") for record in records]
    if "stopping" not in events or events[-1] != "stopped":
        return False
    during = records[events.index("stopping") + 1 : -1]
    return all(record.get("level") in ("info", "warning") for record in during)


def terminate(mesh: LocalMesh, name: str, sig: int = signal.SIGTERM) -> tuple[int, float]:
    process = mesh.daemons[name].process
    assert process is not None
    assert process.poll() is None
    started = time.monotonic()
    process.send_signal(sig)
    code = process.wait(timeout=GRACE_S + 10)
    return code, time.monotonic() - started


def test_sigterm_exits_0_within_the_grace_period(make_mesh: Callable[..., LocalMesh]) -> None:
    mesh = make_mesh()
    runtime = mesh.runtime("deployer-a")
    delegate(mesh, runtime.root("planner", "shutdown"), "deployer-b", "r")  # peer channels are open
    runtime.close()

    # A watcher of our own: the coordinator must end the stream when it stops, not hold it open.
    channel = channel_to(mesh, "coordinator", "client")
    stream = coordinator_stub(channel).Watch(coordinator_pb2.WatchRequest(heartbeat_ms=100), timeout=60)
    assert sum(1 for _, event in zip(range(3), stream, strict=False) if event.HasField("statement")) == 3

    # The coordinator first, while every signer and verifier still watches it.
    code, elapsed = terminate(mesh, "coordinator")
    assert code == 0
    assert elapsed < GRACE_S, f"the coordinator took {elapsed:.2f} s to stop"
    list(stream)  # ends without raising: the coordinator closed it (a cancelled stream raises)
    assert stream.code() is grpc.StatusCode.OK
    channel.close()
    assert stopped_cleanly(mesh, "coordinator")

    for name in ("deployer-a", "deployer-b", "deployer-c", "verifier-0"):
        code, elapsed = terminate(mesh, name, signal.SIGINT if name == "verifier-0" else signal.SIGTERM)
        assert code == 0, name
        assert elapsed < GRACE_S, f"{name} took {elapsed:.2f} s to stop"
        assert stopped_cleanly(mesh, name), name


STOP_SIGNAL_ROUNDS = """
import os, queue, random, signal, sys, threading, time
from countersign._daemon.server import StopSignals

rounds = int(sys.argv[1])
stop = StopSignals()
acknowledged = queue.SimpleQueue()

def send():
    for _ in range(rounds):
        time.sleep(random.random() * 2e-4)
        os.kill(os.getpid(), random.choice((signal.SIGTERM, signal.SIGINT)))
        acknowledged.get()

threading.Thread(target=send, daemon=True).start()
received = set()
for _ in range(rounds):
    received.add(stop.wait())
    acknowledged.put(None)
print(sorted(received))
"""


def test_stop_signals_are_never_lost() -> None:
    """A stop signal may land anywhere in the main thread, including the moment it starts to wait
    (where a handler that set a threading.Event once deadlocked a verifier and it ignored SIGTERM).
    Thousands of signals at random instants must each be seen, promptly."""
    rounds = 3000
    finished = subprocess.run(
        [sys.executable, "-c", STOP_SIGNAL_ROUNDS, str(rounds)], capture_output=True, text=True, timeout=60, check=False
    )
    assert finished.returncode == 0, finished.stderr
    assert finished.stdout.split() == [f"[{int(signal.SIGINT)},", f"{int(signal.SIGTERM)}]"]
