"""The offline tier is offline: under the guard, every way out of the process is refused and recorded.

Each test here is an offline test that tries one way out inside ``pytest.raises`` and then takes the
record, so that the conftest does not fail it for the attempt it was meant to make. The last test runs
a small suite in a child pytest to show the conftest itself: a refusal the code under test swallows
still fails the test, a test without a tier fails, and offline mixed with another tier fails.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import subprocess
import sys
import textwrap
import threading
import tomllib
from pathlib import Path

import pytest

from tests.offline_guard import GUARD, OfflineViolation

REPO_ROOT = Path(__file__).resolve().parents[2]


def refused(attempt: object) -> list[str]:
    """What the guard recorded for an attempt that it refused."""
    assert callable(attempt)
    with pytest.raises(OfflineViolation):
        attempt()
    return GUARD.take()


@pytest.mark.offline
def test_a_tcp_connect_to_loopback_is_refused() -> None:
    with socket.socket() as sock:
        (record,) = refused(lambda: sock.connect(("127.0.0.1", 9)))
    assert record.startswith("opened a socket: socket.connect")


@pytest.mark.offline
def test_binding_a_unix_socket_is_refused(tmp_path: Path) -> None:
    with socket.socket(socket.AF_UNIX) as sock:
        (record,) = refused(lambda: sock.bind(str(tmp_path / "s")))
    assert "socket.bind" in record
    assert not (tmp_path / "s").exists()


@pytest.mark.offline
def test_a_udp_datagram_and_a_name_lookup_are_refused() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        assert "socket.sendto" in refused(lambda: sock.sendto(b"x", ("127.0.0.1", 9)))[0]
    assert "socket.getaddrinfo" in refused(lambda: socket.getaddrinfo("localhost", 80))[0]


@pytest.mark.offline
def test_a_socket_from_a_thread_the_test_starts_is_refused() -> None:
    errors: list[BaseException] = []

    def connect() -> None:
        with socket.socket() as sock:
            try:
                sock.connect(("127.0.0.1", 9))
            except BaseException as exc:
                errors.append(exc)

    thread = threading.Thread(target=connect)
    thread.start()
    thread.join()
    assert [type(e) for e in errors] == [OfflineViolation]
    assert len(GUARD.take()) == 1


@pytest.mark.offline
def test_a_subprocess_is_refused() -> None:
    (record,) = refused(lambda: subprocess.run(["true"], check=True))
    assert record.startswith("started a process: subprocess.Popen")


@pytest.mark.offline
def test_os_level_process_starts_are_refused() -> None:
    assert "os.system" in refused(lambda: os.system("true"))[0]
    assert "os.posix_spawn" in refused(lambda: os.posix_spawn("/bin/true", ["true"], {}))[0]

    def fork() -> None:
        pid = os.fork()
        if pid == 0:  # only if the guard failed: leave at once, and the parent's check fails
            os._exit(0)
        os.waitpid(pid, 0)

    assert "os.fork" in refused(fork)[0]


@pytest.mark.offline
def test_a_multiprocessing_process_is_refused() -> None:
    process = multiprocessing.get_context("fork").Process(target=int)
    (record,) = refused(process.start)
    assert record == "started a process: multiprocessing"


@pytest.mark.offline
def test_grpc_channels_and_servers_are_refused() -> None:
    grpc = pytest.importorskip("grpc")
    assert "grpc.insecure_channel" in refused(lambda: grpc.insecure_channel("127.0.0.1:9"))[0]
    assert "grpc.server" in refused(lambda: grpc.server(None))[0]  # type: ignore[arg-type]


@pytest.mark.offline
def test_pure_work_passes_the_guard(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"files in tmp_path are fine")
    worker = threading.Thread(target=sum, args=([1, 2],))
    worker.start()
    worker.join()
    left, right = socket.socketpair()  # no address: what asyncio's event loop makes for itself
    left.close()
    right.close()
    assert GUARD.take() == []


INNER_TESTS = """
import socket

import pytest


@pytest.mark.offline
def test_swallows_a_refusal():
    try:
        socket.create_connection(("127.0.0.1", 9), timeout=1)
    except Exception:
        pass


@pytest.mark.offline
def test_pure():
    assert sum([1, 2]) == 3


def test_without_a_tier():
    pass


@pytest.mark.offline
@pytest.mark.daemons
def test_offline_and_daemons():
    pass


@pytest.mark.daemons
def test_daemons_may_connect():
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", 9)) != 0
"""


@pytest.mark.daemons  # a child pytest
def test_the_conftest_fails_what_the_tiers_forbid(tmp_path: Path) -> None:
    """The real tests/conftest.py and guard, copied into a scratch project with this project's markers."""
    project = tmp_path / "project"
    (project / "tests").mkdir(parents=True)
    for name in ("__init__.py", "conftest.py", "offline_guard.py"):
        (project / "tests" / name).write_bytes((REPO_ROOT / "tests" / name).read_bytes())
    (project / "tests" / "test_inner.py").write_text(INNER_TESTS)
    markers = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    (project / "pytest.ini").write_text(
        "[pytest]\naddopts = --strict-markers -p no:cacheprovider\nmarkers =\n"
        + textwrap.indent("\n".join(markers), "    ")
        + "\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-rA", "tests"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(project)},
        check=False,
    )
    outcome = {
        line.split(" ", 2)[1].split("::")[-1]: line.split(" ", 1)[0]
        for line in done.stdout.splitlines()
        if line.startswith(("PASSED ", "FAILED ", "ERROR "))
    }
    assert outcome == {
        "test_swallows_a_refusal": "FAILED",
        "test_pure": "PASSED",
        "test_without_a_tier": "ERROR",
        "test_offline_and_daemons": "ERROR",
        "test_daemons_may_connect": "PASSED",
    }, done.stdout + done.stderr
    assert "offline test reached outside the process" in done.stdout
    assert "no tier marker" in done.stdout
    assert "marked offline and daemons" in done.stdout
