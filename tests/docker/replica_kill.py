"""One of deployer-a's signer replicas killed while the demo flow is issuing (issue 28), the same way
in the engine-less compose flow (tests/docker/test_compose_flow.py, a SIGKILL to the replica's
process) and in the container tier (tests/docker/test_containers_e2e.py, ``docker kill``).

The demo runs with ``--hold FILE``: after the Planner's first receipts it prints ``holding: ...`` and
goes on issuing receipts of the same session until FILE exists. Meanwhile:

1. the replica answering them is found from the replicas' own metrics (the one whose count of signed
   receipts rises), so the kill always hits the replica the runtime is talking to;
2. it is killed;
3. the hold is released only once the other replica has signed receipts of that session too, so
   receipts were being issued across the kill, not merely before and after it.

The demo then finishes its flow (the delegation asks deployer-a's replicas in turn, the killed one
first) and verifies the Planner's session as one; the caller checks its exit code and output.
"""

from __future__ import annotations

import queue
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

HOLDING = "holding: "
RISE = 3  # receipts a replica must sign to count as the one answering


def signed_receipts(metrics_address: str) -> float:
    """Receipts a signer replica has signed since it started (``countersign_signer_requests_total``)."""
    with urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "countersign_signer_requests_total" and sample.labels.get("method") == "IssueReceipt"
    )


@dataclass
class ReplicaKill:
    victim: str
    survivor: str
    at_kill: dict[str, float]  # receipts each replica had signed when the victim was killed
    survivor_at_release: float  # the survivor's count when the hold was released
    returncode: int
    output: str  # the demo's stdout and stderr


class _Lines:
    """A child's output, line by line, readable with a deadline (a reader thread drains the pipe)."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.seen: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        assert process.stdout is not None
        self._thread = threading.Thread(target=self._read, args=(process.stdout,), daemon=True)
        self._thread.start()

    def _read(self, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            self._queue.put(line)
        self._queue.put(None)

    def wait_for(self, marker: str, deadline: float) -> None:
        while True:
            try:
                line = self._queue.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                raise AssertionError(f"no line with {marker!r} in time:\n{self.text()}") from None
            if line is None:
                raise AssertionError(f"the demo ended before {marker!r}:\n{self.text()}")
            self.seen.append(line)
            if marker in line:
                return

    def drain(self, timeout_s: float = 0.0) -> None:
        """Take what was read so far (after waiting up to ``timeout_s`` for the end of the output)."""
        self._thread.join(timeout_s)
        while True:
            try:
                line = self._queue.get_nowait()
            except queue.Empty:
                return
            if line is not None:
                self.seen.append(line)

    def text(self) -> str:
        self.drain()
        return "".join(self.seen)


def _wait(
    condition: Callable[[], bool], timeout_s: float, what: str, demo: subprocess.Popen[str], lines: _Lines
) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if demo.poll() is not None:
            raise AssertionError(f"{what}: the demo exited {demo.returncode}:\n{lines.text()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout_s:.0f} s:\n{lines.text()}")
        time.sleep(0.1)


def kill_mid_session(
    demo: subprocess.Popen[str],
    hold_file: Path,
    metrics: dict[str, str],
    kill: Callable[[str], object],
    *,
    timeout_s: float = 240.0,
) -> ReplicaKill:
    """Drive a demo started with ``--hold hold_file`` (stdout piped, stderr merged into it): kill the
    replica of ``metrics`` (name -> its metrics host:port) answering the held session with ``kill``."""
    lines = _Lines(demo)
    try:
        lines.wait_for(HOLDING, time.monotonic() + timeout_s)
        start = {name: signed_receipts(address) for name, address in metrics.items()}
        rising: list[str] = []

        def one_rises() -> bool:
            rising[:] = [n for n, a in metrics.items() if signed_receipts(a) >= start[n] + RISE]
            return bool(rising)

        _wait(one_rises, 60, "no replica signed the held session's receipts", demo, lines)
        assert len(rising) == 1, f"the runtime spread one session over {rising}: it keeps to the one answering"
        victim = rising[0]
        at_kill = {name: signed_receipts(address) for name, address in metrics.items()}
        kill(victim)
        (survivor,) = (name for name in metrics if name != victim)
        _wait(
            lambda: signed_receipts(metrics[survivor]) >= at_kill[survivor] + RISE,
            60,
            f"{survivor} signed none of the session's receipts after {victim} was killed",
            demo,
            lines,
        )
        survivor_at_release = signed_receipts(metrics[survivor])
        hold_file.write_text("released\n")
        returncode = demo.wait(timeout=timeout_s)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
        lines.drain(30)
    return ReplicaKill(victim, survivor, at_kill, survivor_at_release, returncode, lines.text())
