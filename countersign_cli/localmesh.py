"""A whole mesh on one machine, as real processes: the demo, the integration tests, the benchmarks and
the three-zone harness all start it the same way.

It writes a development PKI, the operator key, one key per deployer and a TOML file per daemon into a
work directory, starts each daemon as ``python -m countersign_cli <daemon> serve --config …``, waits for
its ready file (daemons bind port 0 and publish the port), and enrols the deployers through operator
statements. ``launcher`` wraps each command (the zone harness prefixes ``ip netns exec <zone>``).

Replicas: ``signer_replicas`` gives a deployer several signer processes over one state (its
``signer_state_urls`` entry, by default one SQLite file they share), named ``deployer-a``,
``deployer-a-r1``, ...; ``coordinators`` runs that many coordinators over one log store (by default one
SQLite file), named ``coordinator``, ``coordinator-1``, .... Followers are given every coordinator's
address, runtimes every replica's (ADR 0033).

Once the coordinator runs, the operator's checkpoint loop runs in this process (a thread), as an
operator runs ``countersign operator checkpoint --every-ms``: followers count their copy as fresh only
while they hold an unexpired operator checkpoint (spec 7.5), so without it every daemon would go stale
once the last submit's checkpoint expired.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from countersign._daemon.tls import PeerIdentity, create_ca, issue_certificate
from countersign.admission import StatementKind
from countersign.canonical import b64url_encode
from countersign.client import OperatorClient, SignerClient, VerifierClient
from countersign.client.operator import CheckpointLoop, KnownHead
from countersign.client.tls import TlsConfig, coordinator_dns, signer_dns, verifier_dns
from countersign.keys import Ed25519Signer

DEFAULT_DEPLOYERS = ("deployer-a", "deployer-b", "deployer-c")


class MeshError(RuntimeError):
    """A daemon did not start, or died."""


@dataclass
class Daemon:
    name: str
    kind: str
    config: Path
    ready_file: Path
    log_file: Path
    host: str
    port: int = 0
    metrics_port: int = 0
    process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


# Where a co-signed issuance's time goes, from the signers' own histograms (docs/operations.md), for a
# child deployer-b and a parent deployer-a: (what it is, daemon, histogram, labels). Read around the
# measured issuances with ``LocalMesh.histogram_totals`` by the issuance benchmark and ``zones measure``.
ISSUANCE_BREAKDOWN: tuple[tuple[str, str, str, dict[str, str]], ...] = (
    ("inside the child's signer (AcceptDelegation)", "deployer-b", "countersign_signer_seconds",
     {"method": "AcceptDelegation"}),
    ("its co-signing round trip to the parent's signer", "deployer-b", "countersign_cosign_seconds",
     {"outcome": "ok"}),
    ("inside the parent's signer (the co-signing decision)", "deployer-a", "countersign_signer_seconds",
     {"method": "CoSignEdge"}),
    ("the parent's durable commit (one fsync)", "deployer-a", "countersign_signer_commit_seconds", {"sync": "full"}),
)  # fmt: skip


def histogram_mean(before: tuple[float, float], after: tuple[float, float]) -> float:
    """Mean (seconds) of the observations made between two ``histogram_totals`` readings; NaN if none."""
    count = after[1] - before[1]
    return (after[0] - before[0]) / count if count else float("nan")


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(str(value))


def write_toml(path: Path, body: Mapping[str, Any]) -> None:
    lines = [f"{k} = {_toml(v)}" for k, v in body.items() if not isinstance(v, dict)]
    for section, values in body.items():
        if isinstance(values, dict):
            lines += ["", f"[{section}]"] + [f"{k} = {_toml(v)}" for k, v in values.items()]
    path.write_text("\n".join(lines) + "\n")


@dataclass
class LocalMesh:
    workdir: Path
    deployers: Sequence[str] = DEFAULT_DEPLOYERS
    verifiers: int = 1
    tls: bool = True
    hosts: Mapping[str, str] = field(default_factory=dict)
    verifier_store_url: str | None = None
    allowed_children: Mapping[str, Sequence[str]] | None = None
    staleness_ms: int = 30_000
    heartbeat_ms: int = 1_000
    cosign_timeout_ms: int = 2_000
    signer_options: Mapping[str, Any] = field(default_factory=dict)  # more signer settings, for every signer
    verifier_options: Mapping[str, Any] = field(default_factory=dict)  # more verifier settings, for every verifier
    launcher: Callable[[str, list[str]], list[str]] = field(default=lambda name, argv: argv)
    extra_env: Mapping[str, str] = field(default_factory=dict)
    checkpoint_lifetime_ms: int | None = None  # default: staleness_ms
    checkpoint_every_ms: int | None = None  # default: a third of the lifetime; 0: run no checkpoint loop
    coordinator_for_followers: str | None = None  # tests: point signers and verifiers elsewhere (a proxy)
    signer_replicas: Mapping[str, int] = field(default_factory=dict)  # deployer -> signer processes (default 1)
    signer_state_urls: Mapping[str, str] = field(default_factory=dict)  # deployer -> state_url (default SQLite)
    coordinators: int = 1
    log_store_url: str | None = None  # default: one SQLite file every coordinator shares
    daemons: dict[str, Daemon] = field(default_factory=dict, init=False)
    checkpoints: CheckpointLoop | None = field(default=None, init=False)
    operator_head: KnownHead = field(default_factory=KnownHead, init=False)
    # A pipe whose read end every daemon inherits (lifeline_fd): this process holds the write end, so
    # when it ends, even by SIGKILL, every daemon it started reads end of file and stops.
    lifeline: tuple[int, int] | None = field(default=None, init=False)

    @property
    def lifetime_ms(self) -> int:
        return self.checkpoint_lifetime_ms or self.staleness_ms

    # --- set-up ----------------------------------------------------------------------------------

    def setup(self) -> LocalMesh:
        self.workdir.mkdir(parents=True, exist_ok=True)
        for sub in ("pki", "keys", "config", "state", "logs"):
            (self.workdir / sub).mkdir(exist_ok=True)
        self.operator = Ed25519Signer.generate()
        self._write_key(self.workdir / "keys" / "operator.jwk", self.operator)
        self.deployer_keys = {d: Ed25519Signer.generate() for d in self.deployers}
        for deployer, key in self.deployer_keys.items():
            self._write_key(self.workdir / "keys" / f"{deployer}.jwk", key)
        if self.tls:
            create_ca(self.workdir / "pki")
            self._certificate("coordinator", PeerIdentity("coordinator"), [coordinator_dns()])
            self._certificate("operator", PeerIdentity("operator"), [])
            self._certificate("client", PeerIdentity("client", name="demo"), [])
            self._certificate("auditor", PeerIdentity("auditor", name="audit"), [])
            for deployer in self.deployers:
                self._certificate(
                    f"{deployer}-signer", PeerIdentity("signer", deployer=deployer), [signer_dns(deployer)]
                )
                self._certificate(f"{deployer}-runtime", PeerIdentity("runtime", deployer=deployer), [])
            for index in range(self.verifiers):
                self._certificate(f"verifier-{index}", PeerIdentity("verifier", name=f"v{index}"), [verifier_dns()])
        for name in self.coordinator_names:
            self._configure(
                name,
                "coordinator",
                {"log_store": self.log_store_url or self._sqlite("coordinator.db"), "heartbeat_ms": self.heartbeat_ms},
                tls_name="coordinator",
            )
        for deployer in self.deployers:
            allowed = (self.allowed_children or {}).get(deployer, [d for d in self.deployers if d != deployer])
            for name in self.signer_names(deployer):
                self._configure(
                    name,
                    "signer",
                    {
                        "deployer": deployer,
                        "signer_key": f"file:{self.workdir / 'keys' / f'{deployer}.jwk'}",
                        "state_url": self.signer_state_urls.get(deployer) or self._sqlite(f"{deployer}-signer.db"),
                        "allowed_children": list(allowed),
                        "cosign_timeout_ms": self.cosign_timeout_ms,
                        "registry_cache": str(self.workdir / "state" / f"{name}-registry.json"),
                        "staleness_ms": self.staleness_ms,
                        "heartbeat_ms": self.heartbeat_ms,
                        **self.signer_options,
                    },
                    tls_name=f"{deployer}-signer",
                )
        for index in range(self.verifiers):
            self._configure(
                f"verifier-{index}",
                "verifier",
                {
                    "store_url": self.verifier_store_url or self._sqlite(f"verifier-{index}.db"),
                    "registry_cache": str(self.workdir / "state" / f"verifier-{index}-registry.json"),
                    "staleness_ms": self.staleness_ms,
                    "heartbeat_ms": self.heartbeat_ms,
                    **self.verifier_options,
                },
            )
        return self

    @property
    def coordinator_names(self) -> list[str]:
        return ["coordinator", *(f"coordinator-{i}" for i in range(1, self.coordinators))]

    def signer_names(self, deployer: str) -> list[str]:
        """The daemon names of ``deployer``'s signer replicas (the first is the deployer's own name)."""
        return [deployer, *(f"{deployer}-r{i}" for i in range(1, self.signer_replicas.get(deployer, 1)))]

    def signer_addresses(self, deployer: str) -> str:
        """Every running replica of ``deployer``'s signer, as a runtime names them (comma-separated)."""
        names = self.signer_names(deployer)
        return (
            ",".join(self.daemons[n].address for n in names if self.daemons[n].port) or self.daemons[deployer].address
        )

    @property
    def coordinator_addresses(self) -> str:
        """Every coordinator's address, as followers name them (comma-separated)."""
        return ",".join(self.daemons[n].address for n in self.coordinator_names if self.daemons[n].port)

    def _write_key(self, path: Path, key: Ed25519Signer) -> None:
        from signer.backends.file import write_key_file

        if path.exists():
            path.unlink()
        write_key_file(path, key)

    def _certificate(self, name: str, identity: PeerIdentity, dns: list[str]) -> None:
        issue_certificate(self.workdir / "pki", self.workdir / "pki", name, identity, dns=dns)

    def _sqlite(self, name: str) -> str:
        return f"sqlite:///{self.workdir / 'state' / name}"

    def tls_for(self, name: str) -> TlsConfig:
        if not self.tls:
            return TlsConfig(insecure_loopback=True)
        pki = self.workdir / "pki"
        return TlsConfig(ca=str(pki / "ca.pem"), cert=str(pki / f"{name}.pem"), key=str(pki / f"{name}.key"))

    def _configure(self, name: str, kind: str, body: dict[str, Any], *, tls_name: str | None = None) -> None:
        host = self.hosts.get(name, "127.0.0.1")
        tls = self.tls_for(tls_name or name)
        settings: dict[str, Any] = {
            "listen": f"{host}:0",
            "metrics_listen": f"{host}:0",
            "ready_file": str(self.workdir / "state" / f"{name}.ready"),
            "operator_public_key": b64url_encode(self.operator.public_key),
            **body,
            "tls": {"ca": tls.ca, "cert": tls.cert, "key": tls.key, "insecure_loopback": tls.insecure_loopback},
        }
        config = self.workdir / "config" / f"{name}.toml"
        write_toml(config, settings)
        self.daemons[name] = Daemon(
            name, kind, config, Path(settings["ready_file"]), self.workdir / "logs" / f"{name}.log", host
        )

    # --- processes -------------------------------------------------------------------------------

    def start(self, name: str, *, timeout_s: float = 30.0) -> Daemon:
        """Start (or restart on its previous port) one daemon and wait until it serves."""
        daemon = self.daemons[name]
        if daemon.alive:
            return daemon
        env = {**os.environ, **self.extra_env}
        if daemon.kind != "coordinator":
            env["COUNTERSIGN_COORDINATOR"] = self.coordinator_for_followers or self.coordinator_addresses
        if daemon.port:
            env["COUNTERSIGN_LISTEN"] = daemon.address
            env["COUNTERSIGN_METRICS_LISTEN"] = f"{daemon.host}:{daemon.metrics_port}"
        daemon.ready_file.unlink(missing_ok=True)
        if self.lifeline is None:
            self.lifeline = os.pipe()
        env["COUNTERSIGN_LIFELINE_FD"] = str(self.lifeline[0])
        argv = [sys.executable, "-m", "countersign_cli", daemon.kind, "serve", "--config", str(daemon.config)]
        log = daemon.log_file.open("ab")
        # The command is our own interpreter and module with paths this object wrote: nothing untrusted.
        daemon.process = subprocess.Popen(  # noqa: S603
            self.launcher(name, argv), stdout=log, stderr=log, env=env, pass_fds=(self.lifeline[0],)
        )
        log.close()
        deadline = time.monotonic() + timeout_s
        while not daemon.ready_file.exists():
            if daemon.process.poll() is not None:
                raise MeshError(f"{name} exited with {daemon.process.returncode}:\n{self.log_tail(name)}")
            if time.monotonic() > deadline:
                raise MeshError(f"{name} did not become ready in {timeout_s} s:\n{self.log_tail(name)}")
            time.sleep(0.02)
        ready = json.loads(daemon.ready_file.read_text())
        daemon.port, daemon.metrics_port = ready["grpc_port"], ready["metrics_port"]
        if daemon.kind == "coordinator":
            self.start_checkpoints()
        return daemon

    def start_checkpoints(self) -> None:
        """Run the operator's checkpoint loop against the coordinator (once; it follows restarts)."""
        every = self.checkpoint_every_ms if self.checkpoint_every_ms is not None else self.lifetime_ms // 3
        if self.checkpoints is not None or every == 0:
            return
        self.checkpoints = CheckpointLoop(
            lambda: self.coordinator_addresses, self.tls_for("operator"), self.operator,
            every_ms=every, checkpoint_lifetime_ms=self.lifetime_ms, known_head=self.operator_head,
        ).start()  # fmt: skip

    def stop_checkpoints(self) -> None:
        if self.checkpoints is not None:
            self.checkpoints.stop()
            self.checkpoints = None

    def start_all(self) -> LocalMesh:
        for name in self.coordinator_names:
            self.start(name)
        for deployer in self.deployers:
            for name in self.signer_names(deployer):
                self.start(name)
        for index in range(self.verifiers):
            self.start(f"verifier-{index}")
        return self

    def stop(self, name: str, *, sig: int = signal.SIGTERM, timeout_s: float = 10.0) -> int | None:
        daemon = self.daemons[name]
        process = daemon.process
        if process is None or process.poll() is not None:
            return None if process is None else process.returncode
        process.send_signal(sig)
        try:
            return process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            return process.wait()

    def kill(self, name: str) -> None:
        self.stop(name, sig=signal.SIGKILL)

    def stop_all(self) -> dict[str, int | None]:
        self.stop_checkpoints()
        codes = {}
        for name in reversed(list(self.daemons)):
            codes[name] = self.stop(name)
        if self.lifeline is not None:  # none runs now: a later start opens a new one
            for fd in self.lifeline:
                os.close(fd)
            self.lifeline = None
        return codes

    def log_tail(self, name: str, lines: int = 30) -> str:
        try:
            return "\n".join(self.daemons[name].log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def histogram_totals(self, name: str, metric: str, labels: Mapping[str, str]) -> tuple[float, float]:
        """(sum, count) of the Prometheus histogram ``metric`` on daemon ``name``'s metrics port, over the
        series whose labels include ``labels``: read before and after some calls, the mean of those calls."""
        from prometheus_client.parser import text_string_to_metric_families

        daemon = self.daemons[name]
        with urllib.request.urlopen(f"http://{daemon.host}:{daemon.metrics_port}/metrics", timeout=10) as response:
            text = response.read().decode()
        total = count = 0.0
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if any(sample.labels.get(k) != v for k, v in labels.items()):
                    continue
                if sample.name == f"{metric}_sum":
                    total += sample.value
                elif sample.name == f"{metric}_count":
                    count += sample.value
        return total, count

    # --- enrolment and clients -------------------------------------------------------------------

    def operator_address(self) -> str:
        """Where the operator submits: the first coordinator that runs (any replica accepts)."""
        names = self.coordinator_names
        return next((self.daemons[n].address for n in names if self.daemons[n].alive), self.daemons[names[0]].address)

    def operator_client(self) -> OperatorClient:
        return OperatorClient(
            self.operator_address(), self.tls_for("operator"), self.operator,
            checkpoint_lifetime_ms=self.lifetime_ms, known_head=self.operator_head,
        )  # fmt: skip

    def enrol_all(self, *, wait: bool = True) -> None:
        client = self.operator_client()
        try:
            for deployer, key in self.deployer_keys.items():
                client.submit(
                    StatementKind.ENROL_DEPLOYER,
                    deployer,
                    key.key_id,
                    public_key=b64url_encode(key.public_key),
                    at_ms=0,
                )
        finally:
            client.close()
        if wait:
            self.wait_for_registry(len(self.deployers))

    def wait_for_registry(self, sequence: int, timeout_s: float = 15.0) -> None:
        """Wait until every running signer and verifier has applied ``sequence`` statements."""
        deadline = time.monotonic() + timeout_s
        for name, daemon in self.daemons.items():
            if daemon.kind == "coordinator" or not daemon.alive:
                continue
            cache = self.workdir / "state" / f"{name}-registry.json"
            while True:
                try:
                    if len(json.loads(cache.read_text())["statements"]) >= sequence:
                        break
                except (OSError, ValueError, KeyError):
                    pass
                if time.monotonic() > deadline:
                    raise MeshError(f"{name} did not reach registry sequence {sequence}")
                time.sleep(0.02)

    def runtime(self, deployer: str) -> SignerClient:
        """A runtime client of ``deployer``'s signer, naming every replica that runs."""
        return SignerClient(self.signer_addresses(deployer), self.tls_for(f"{deployer}-runtime"), deployer)

    def verifier_client(self, index: int = 0) -> VerifierClient:
        return VerifierClient(self.daemons[f"verifier-{index}"].address, self.tls_for("client"))

    def __enter__(self) -> LocalMesh:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()
