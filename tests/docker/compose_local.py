"""docker/compose.yaml played as local processes, for a machine without a Docker engine.

Each service runs the command, environment and start order the compose file gives it, with what a
container engine would provide replaced by its local equivalent:

* a named volume is a directory (``volumes/<name>``); a path under a service's mount target is
  rewritten to that directory, in its environment and its arguments;
* a file the Dockerfile COPYs into the image (the health probe, the dev-mesh scripts) is read from
  the repository; ``countersign`` and ``python`` are this interpreter;
* a service name with a port (``coordinator:7400``, ``signer-a:7401``) and a wildcard listen address
  (``0.0.0.0:7401``) become 127.0.0.1 and a free port per (service, port);
* the ``postgres`` service is the test server (``COUNTERSIGN_TEST_POSTGRES_URL``), with every schema
  named in a URL suffixed so that runs never share state;
* ``depends_on`` conditions are honoured: a job must exit 0, a daemon must pass its health check
  (the compose file's own command: docker/healthcheck.py, given the daemon's pid).

What it cannot show: image builds, file ownership and permissions in volumes, read-only root file
systems, container DNS and networks, Docker's restart policies. The container tier
(tests/docker/test_containers_e2e.py, `make containers`) shows all but container DNS and networks.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from tests.docker.conftest import REPO_ROOT, Dockerfile, environment_of, mounts_of
from tests.ports import free_port

IMAGE_PYTHON = "/opt/countersign/bin/python"


def image_files(dockerfile: Dockerfile) -> dict[str, Path]:
    """Image path -> repository path, from the COPY instructions that take files from the context."""
    out: dict[str, Path] = {}
    for stage in dockerfile.stages:
        for args in stage.all("COPY"):
            if "--from=" in args:
                continue
            parts = [a for a in args.split() if not a.startswith("--")]
            *sources, destination = parts
            for source in sources:
                out[destination.rstrip("/")] = REPO_ROOT / source.rstrip("/")
    return out


@dataclass
class Running:
    name: str
    process: subprocess.Popen[bytes]
    log: Path


@dataclass
class LocalCompose:
    compose: dict[str, Any]
    dockerfile: Dockerfile
    workdir: Path
    postgres_url: str
    suffix: str
    ports: dict[tuple[str, int], int] = field(default_factory=dict)
    running: dict[str, Running] = field(default_factory=dict)
    schemas: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.services: dict[str, dict[str, Any]] = self.compose["services"]
        self.files = image_files(self.dockerfile)
        for name, service in self.services.items():
            for port in self._container_ports(service):
                self.ports[(name, port)] = free_port()

    @staticmethod
    def _container_ports(service: dict[str, Any]) -> set[int]:
        ports = {int(p.rsplit(":", 1)[1]) for p in service.get("ports", [])}
        for value in environment_of(service).values():
            ports |= {int(p) for p in re.findall(r"^0\.0\.0\.0:(\d+)$", value)}
        return ports

    # --- translation ------------------------------------------------------------------------

    def volume(self, name: str) -> Path:
        path = self.workdir / "volumes" / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _postgres(self, match: re.Match[str]) -> str:
        url = match.group(0)
        query = dict(parse_qsl(urlsplit(url).query))
        if "schema" in query:
            query["schema"] = f"{query['schema']}_{self.suffix}"
            self.schemas.add(query["schema"])
        base = urlsplit(self.postgres_url)
        return urlunsplit(base._replace(query=urlencode(query)))

    def translate(self, service_name: str, value: str) -> str:
        service = self.services[service_name]
        value = re.sub(r"postgresql://[^\s@/]+@postgres:5432/[^\s?]+(\?[^\s]*)?", self._postgres, value)
        for mount in sorted(mounts_of(service), key=lambda m: -len(m.target)):
            value = re.sub(re.escape(mount.target) + r"(?=/|$|[\s,])", str(self.volume(mount.source)), value)
        for image_path, local in sorted(self.files.items(), key=lambda item: -len(item[0])):
            value = re.sub(re.escape(image_path) + r"(?=/|$)", str(local), value)
        value = re.sub(
            r"^0\.0\.0\.0:(\d+)$", lambda m: f"127.0.0.1:{self.ports[(service_name, int(m.group(1)))]}", value
        )
        return re.sub(
            r"\b([a-z][a-z0-9-]*):(\d{2,5})\b",
            lambda m: (
                f"127.0.0.1:{self.ports[(m.group(1), int(m.group(2)))]}"
                if (m.group(1), int(m.group(2))) in self.ports
                else m.group(0)
            ),
            value,
        )

    def address(self, service: str, port: int) -> str:
        """Where ``service``'s container port ``port`` listens here."""
        return f"127.0.0.1:{self.ports[(service, port)]}"

    def argv(self, name: str, extra: tuple[str, ...] = ()) -> list[str]:
        """The service's entrypoint and command, translated, then ``extra`` (given as local values)."""
        service = self.services[name]
        entrypoint = service.get("entrypoint") or ["countersign"]
        command = service.get("command") or ([] if "entrypoint" in service else ["--help"])
        argv = [self.translate(name, str(part)) for part in [*entrypoint, *command]] + list(extra)
        if argv[0] == "countersign":
            argv = [sys.executable, "-m", "countersign_cli", *argv[1:]]
        elif argv[0] in (IMAGE_PYTHON, "python"):
            argv[0] = sys.executable
        return argv

    def environment(self, name: str) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith(("COUNTERSIGN_", "PG"))}
        base["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{base.get('PATH', '')}"
        base["PYTHONPATH"] = str(REPO_ROOT)
        for key, value in environment_of(self.services[name]).items():
            base[key] = self.translate(name, value)
        return base

    # --- running ------------------------------------------------------------------------------

    def order(self, targets: list[str]) -> list[str]:
        ordered: list[str] = []

        def visit(name: str) -> None:
            if name in ordered:
                return
            for dependency in self.services[name].get("depends_on", {}):
                visit(dependency)
            ordered.append(name)

        for target in targets:
            visit(target)
        return ordered

    def up(self, targets: list[str], *, timeout_s: float = 90.0) -> None:
        for name in self.order(targets):
            if name == "postgres" or name in self.running:
                continue
            if "command" in self.services[name] and "entrypoint" not in self.services[name]:
                self.start_daemon(name)
                self.wait_healthy(name, timeout_s)
            elif name not in targets:
                self.run_job(name, timeout_s=timeout_s, check=True)

    def run_job(
        self, name: str, *extra: str, timeout_s: float = 90.0, check: bool = False
    ) -> subprocess.CompletedProcess[str]:
        workdir = self.workdir / "cwd" / name
        workdir.mkdir(parents=True, exist_ok=True)
        result = subprocess.run(
            self.argv(name, extra),
            env=self.environment(name),
            cwd=workdir,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"job {name} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
        return result

    def start_job(self, name: str, *extra: str) -> subprocess.Popen[str]:
        """A job started and left running: its stdout (stderr merged in) is a pipe to read as it goes."""
        workdir = self.workdir / "cwd" / name
        workdir.mkdir(parents=True, exist_ok=True)
        return subprocess.Popen(
            self.argv(name, extra),
            env=self.environment(name),
            cwd=workdir,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def kill(self, name: str) -> None:
        """SIGKILL a daemon (what ``docker kill`` does to a container's process); it stays down."""
        process = self.running[name].process
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)

    def start_daemon(self, name: str) -> Running:
        workdir = self.workdir / "cwd" / name
        workdir.mkdir(parents=True, exist_ok=True)
        log = self.workdir / "logs" / f"{name}.log"
        log.parent.mkdir(exist_ok=True)
        with log.open("ab") as out:
            process = subprocess.Popen(self.argv(name), env=self.environment(name), cwd=workdir, stdout=out, stderr=out)
        self.running[name] = Running(name, process, log)
        return self.running[name]

    def health(self, name: str) -> subprocess.CompletedProcess[str]:
        """The service's own health check command, pointed at the daemon's pid."""
        test = [self.translate(name, part) for part in self.services[name]["healthcheck"]["test"]]
        assert test[0] == "CMD", test
        argv = [sys.executable if part in (IMAGE_PYTHON, "python") else part for part in test[1:]]
        argv += ["--pid", str(self.running[name].process.pid)]
        return subprocess.run(argv, env=self.environment(name), capture_output=True, text=True, timeout=30, check=False)

    def wait_healthy(self, name: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            running = self.running[name]
            if running.process.poll() is not None:
                raise AssertionError(f"{name} exited {running.process.returncode}:\n{self.log_tail(name)}")
            result = self.health(name)
            if result.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{name} not healthy: {result.stdout}{result.stderr}\n{self.log_tail(name)}")
            time.sleep(0.2)

    def log_tail(self, name: str, lines: int = 40) -> str:
        try:
            return "\n".join(self.running[name].log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def down(self) -> dict[str, int | None]:
        codes: dict[str, int | None] = {}
        for name, running in reversed(list(self.running.items())):
            if running.process.poll() is None:
                running.process.send_signal(signal.SIGTERM)
                try:
                    running.process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    running.process.kill()
                    running.process.wait()
            codes[name] = running.process.returncode
        self.running.clear()
        self.drop_schemas()
        return codes

    def drop_schemas(self) -> None:
        if not self.schemas:
            return
        import psycopg
        from psycopg import sql

        try:
            with psycopg.connect(self.postgres_url, autocommit=True, connect_timeout=5) as conn:
                for schema in sorted(self.schemas):
                    conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
        except psycopg.Error:
            pass  # best effort: the schemas carry a random suffix, nothing else uses them
