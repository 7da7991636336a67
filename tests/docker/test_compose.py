"""docker/compose.yaml, read as Compose reads it (merge keys, ``${VAR:-default}``): the services and
their order, mTLS for every daemon, least-privilege volumes, health checks, hardening, ports on
127.0.0.1 only, and no secret in any environment value. This is the check that runs where no docker
CLI with the compose plugin exists (docker/lint.sh runs ``docker compose config`` where one does)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest

from tests.docker.conftest import (
    COMPOSE_FILE,
    DOCKER_DIR,
    RUNTIME_UID,
    Dockerfile,
    built_here,
    daemon_settings,
    environment_of,
    kind_of,
    load_compose,
    load_demo_flow,
    mounts_of,
)

pytestmark = pytest.mark.offline

DAEMONS = {
    "coordinator": "coordinator",
    "signer-a": "signer",
    "signer-a2": "signer",
    "signer-b": "signer",
    "signer-c": "signer",
    "verifier-1": "verifier",
    "verifier-2": "verifier",
}
JOBS = {"init", "enrol", "demo"}
# Long-running dev-mesh services that are not daemons: the operator's checkpoint loop (spec 7.5).
LOOPS = {"checkpoints"}
SERVE_CONFIG = "/run/countersign/public/operator.toml"
HEALTH_PROBE = ["CMD", "/opt/countersign/bin/python", "/usr/local/lib/countersign/healthcheck.py"]
# Variables for libraries rather than for countersign.
OTHER_DAEMON_ENV = {"PGPASSFILE"}


def test_services_present(services: dict[str, Any]) -> None:
    assert set(services) == {"postgres", *DAEMONS, *JOBS, *LOOPS}
    assert {name: kind_of(s) for name, s in services.items() if kind_of(s)} == DAEMONS
    assert services["demo"].get("profiles") == ["demo"], "the demo runs only when asked for"
    assert all(not services[name].get("profiles") for name in set(services) - {"demo"})


def test_every_countersign_service_is_built_from_the_dockerfile(
    services: dict[str, Any], dockerfile: Dockerfile
) -> None:
    stages = {s.name for s in dockerfile.stages}
    for name in (*DAEMONS, *JOBS, *LOOPS):
        service = services[name]
        assert built_here(service), f"{name} must build docker/Dockerfile"
        assert service["build"]["context"] == "..", name
        target = service["build"]["target"]
        assert target in stages, f"{name}: no stage {target}"
        # Daemons run exactly what production runs; only the jobs get the dev-mesh scripts.
        assert target == ("runtime" if name in DAEMONS else "dev-mesh"), name
        assert service["image"] in ("countersign:dev", "countersign-dev-mesh:dev"), service["image"]


def test_non_root_and_hardened(services: dict[str, Any], dockerfile: Dockerfile) -> None:
    image_user = dockerfile.effective("runtime", "USER")
    assert image_user is not None and "0" not in image_user.split(":")
    for name in (*DAEMONS, *JOBS, *LOOPS):
        service = services[name]
        uid, _, gid = str(service["user"]).partition(":")
        assert int(uid) == RUNTIME_UID and int(gid) != 0, f"{name}: user {service['user']}"
        assert service["read_only"] is True, name
        assert service["cap_drop"] == ["ALL"], name
        assert "no-new-privileges:true" in service["security_opt"], name
        assert service["tmpfs"] == ["/tmp"], name
        assert "privileged" not in service and "cap_add" not in service, name
        assert service.get("network_mode") is None and service.get("pid") is None, name
    assert "no-new-privileges:true" in services["postgres"]["security_opt"]


def test_daemons_have_grpc_health_checks(services: dict[str, Any]) -> None:
    for name in DAEMONS:
        healthcheck = services[name]["healthcheck"]
        assert healthcheck["test"] == HEALTH_PROBE, name
        assert {"interval", "timeout", "retries", "start_period"} <= set(healthcheck), name
        assert services[name]["restart"] == "unless-stopped", name
    assert services["postgres"]["healthcheck"]["test"][:2] == ["CMD", "pg_isready"]
    assert "--host=127.0.0.1" in services["postgres"]["healthcheck"]["test"]
    for name in JOBS:
        assert services[name]["healthcheck"] == {"disable": True}, name
        assert services[name]["restart"] == "no", name
    for name in LOOPS:
        assert services[name]["restart"] == "unless-stopped", name


def test_the_checkpoint_loop_shares_the_operator_head_with_the_enrol_job(services: dict[str, Any]) -> None:
    """Without the loop every follower goes stale when the enrol job's checkpoint expires; without the
    shared head file the loop would checkpoint a log that withholds what enrol submitted."""
    loop = services["checkpoints"]
    assert loop["command"][:2] == ["operator", "checkpoint"]
    flags = dict(arg.removeprefix("--").split("=", 1) for arg in loop["command"][2:])
    assert 0 < int(flags["every-ms"]) * 3 <= int(flags["lifetime-ms"])
    state = [m for m in mounts_of(loop) if m.source == "operator-state"]
    assert len(state) == 1 and not state[0].read_only and flags["head-file"].startswith(state[0].target + "/")
    enrol_state = [m for m in mounts_of(services["enrol"]) if m.source == "operator-state"]
    assert len(enrol_state) == 1 and enrol_state[0].target == state[0].target
    assert conditions(loop) == {"coordinator": "service_healthy"}


def conditions(service: dict[str, Any]) -> dict[str, str]:
    depends = service.get("depends_on", {})
    assert isinstance(depends, dict), "depends_on must name a condition for each dependency"
    return {dep: spec["condition"] for dep, spec in depends.items()}


def test_start_order_uses_conditions(services: dict[str, Any]) -> None:
    done, healthy = "service_completed_successfully", "service_healthy"
    assert conditions(services["postgres"]) == {"init": done}
    assert conditions(services["coordinator"]) == {"init": done, "postgres": healthy}
    for name in ("signer-a", "signer-a2"):  # deployer-a's state is in PostgreSQL
        assert conditions(services[name]) == {"init": done, "postgres": healthy, "coordinator": healthy}, name
    for name in ("signer-b", "signer-c"):
        assert conditions(services[name]) == {"init": done, "coordinator": healthy}, name
    for name in ("verifier-1", "verifier-2"):
        assert conditions(services[name]) == {"init": done, "postgres": healthy, "coordinator": healthy}, name
    assert conditions(services["enrol"]) == {"coordinator": healthy}
    assert conditions(services["demo"]) == {"enrol": done, **dict.fromkeys(set(DAEMONS) - {"coordinator"}, healthy)}
    for name, service in services.items():
        for dependency, condition in conditions(service).items():
            assert dependency in services, f"{name} depends on unknown {dependency}"
            if condition == healthy:
                assert "healthcheck" in services[dependency], f"{dependency} has no health check"
                assert services[dependency]["healthcheck"] != {"disable": True}


def test_daemons_serve_with_the_pinned_operator_key(services: dict[str, Any]) -> None:
    for name, kind in DAEMONS.items():
        service = services[name]
        assert service["command"] == [kind, "serve", "--config", SERVE_CONFIG], name
        public = [m for m in mounts_of(service) if m.source == "public"]
        assert len(public) == 1 and public[0].read_only and SERVE_CONFIG.startswith(public[0].target + "/"), name
        assert "COUNTERSIGN_OPERATOR_PUBLIC_KEY" not in environment_of(service), "the key comes from init"


def test_every_daemon_has_mtls(services: dict[str, Any]) -> None:
    for name, kind in DAEMONS.items():
        service = services[name]
        env = environment_of(service)
        assert not any(k.startswith("COUNTERSIGN_TLS_INSECURE") for k in env), name
        read_only = {m.target for m in mounts_of(service) if m.read_only}
        for part in ("CA", "CERT", "KEY"):
            path = env.get(f"COUNTERSIGN_TLS_{part}")
            assert path, f"{name}: COUNTERSIGN_TLS_{part} missing"
            assert any(path.startswith(t + "/") for t in read_only), f"{name}: {path} is not on a read-only mount"
        # The listen and metrics addresses are wildcards inside the container, on the design's ports.
        port = {"coordinator": 7400, "signer": 7401, "verifier": 7402}[kind]
        assert env["COUNTERSIGN_LISTEN"] == f"0.0.0.0:{port}", name
        assert env["COUNTERSIGN_METRICS_LISTEN"] == f"0.0.0.0:{port + 2000}", name
        if kind != "coordinator":
            assert env["COUNTERSIGN_COORDINATOR"] == "coordinator:7400", name


def test_daemon_environment_names_are_settings(services: dict[str, Any]) -> None:
    for name, kind in DAEMONS.items():
        known = daemon_settings(kind) | OTHER_DAEMON_ENV
        unknown = sorted(set(environment_of(services[name])) - known)
        assert unknown == [], f"{name}: the {kind} reads no such setting: {unknown}"


def signer_replicas(services: dict[str, Any]) -> dict[str, list[str]]:
    """Deployer -> the services running its signer, in file order."""
    out: dict[str, list[str]] = {}
    for name, kind in DAEMONS.items():
        if kind == "signer":
            out.setdefault(environment_of(services[name])["COUNTERSIGN_DEPLOYER"], []).append(name)
    return out


def test_signers_persist_their_state_and_pin_their_deployer(services: dict[str, Any]) -> None:
    children = {"deployer-a": ["deployer-b", "deployer-c"], "deployer-b": ["deployer-c"], "deployer-c": []}
    assert signer_replicas(services) == {
        "deployer-a": ["signer-a", "signer-a2"], "deployer-b": ["signer-b"], "deployer-c": ["signer-c"]
    }  # fmt: skip
    for deployer, replicas in signer_replicas(services).items():
        for name in replicas:
            env = environment_of(services[name])
            assert env["COUNTERSIGN_SIGNER_KEY"] == "file:/run/countersign/secrets/signer.jwk"
            assert [c for c in env["COUNTERSIGN_ALLOWED_CHILDREN"].split(",") if c] == children[deployer]
            # Each replica keeps its own copy of the registry in a volume of its own.
            state = [m for m in mounts_of(services[name]) if m.source == f"{name}-state"]
            assert len(state) == 1 and not state[0].read_only
            assert env["COUNTERSIGN_REGISTRY_CACHE"].startswith(state[0].target + "/")
            if len(replicas) == 1:
                assert env["COUNTERSIGN_STATE_URL"] == f"sqlite:///{state[0].target}/signer.db"
    for name in ("verifier-1", "verifier-2"):
        env = environment_of(services[name])
        state = [m for m in mounts_of(services[name]) if m.source == f"{name}-state"]
        assert len(state) == 1 and env["COUNTERSIGN_REGISTRY_CACHE"].startswith(state[0].target + "/")
        # Both replicas share one PostgreSQL schema (a nonce consumed on one is seen by the other).
        assert env["COUNTERSIGN_STORE_URL"].startswith("postgresql://countersign@postgres:5432/countersign?")
        assert "schema=countersign_nonces" in env["COUNTERSIGN_STORE_URL"]


def test_deployer_a_runs_two_replicas_on_one_postgresql_state(services: dict[str, Any]) -> None:
    """The same deployer, key, settings and state URL; the state in a schema of its own, apart from the
    registry log's and the verifiers' nonce store's, reached without a password in any value."""
    first, second = (environment_of(services[name]) for name in ("signer-a", "signer-a2"))
    assert first == second, "replicas of one signer differ only outside their settings (ports, volumes)"
    url = urlsplit(first["COUNTERSIGN_STATE_URL"])
    assert (url.scheme, url.username, url.hostname, url.port, url.path) == (
        "postgresql", "countersign", "postgres", 5432, "/countersign"
    )  # fmt: skip
    schema = dict(parse_qsl(url.query))["schema"]
    others = [
        dict(parse_qsl(urlsplit(env[key]).query))["schema"]
        for env in (environment_of(services[name]) for name in ("coordinator", "verifier-1", "verifier-2"))
        for key in ("COUNTERSIGN_LOG_STORE", "COUNTERSIGN_STORE_URL")
        if key in env
    ]
    assert len(others) == 3 and schema not in others, (schema, others)
    assert first["PGPASSFILE"] == "/run/countersign/db/pgpass"
    db = [m for m in mounts_of(services["signer-a"]) if m.source == "db"]
    assert len(db) == 1 and db[0].read_only and first["PGPASSFILE"].startswith(db[0].target + "/")
    for name in ("signer-a", "signer-a2"):
        assert {m.source: m.target for m in mounts_of(services[name]) if m.read_only} == {
            "public": "/run/countersign/public", "signer-a-secrets": "/run/countersign/secrets",
            "db": "/run/countersign/db",
        }, name  # fmt: skip
    ports = [p.split(":", 1)[1] for name in ("signer-a", "signer-a2") for p in services[name]["ports"]]
    assert len(set(ports)) == 4, ports


def test_everything_that_talks_to_a_signer_names_every_replica(services: dict[str, Any]) -> None:
    """The demo's runtimes, and through them every delegation's parent_signer, name all of a deployer's
    replicas, and the demo waits until each is healthy."""
    command = services["demo"]["command"]
    named = load_demo_flow().pairs(command[command.index("--signers") + 1])
    for deployer, replicas in signer_replicas(services).items():
        assert named[deployer].split(",") == [f"{name}:7401" for name in replicas], deployer
        for name in replicas:
            assert conditions(services["demo"])[name] == "service_healthy", name


def test_each_secret_volume_is_mounted_only_where_needed(services: dict[str, Any], compose: dict[str, Any]) -> None:
    users: dict[str, set[str]] = {}
    for name, service in services.items():
        for mount in mounts_of(service):
            users.setdefault(mount.source, set()).add(name)
            # The operator's head file is written by both of the operator's services that submit.
            shared_state = mount.source == "operator-state" and name in ("enrol", "checkpoints")
            if name not in ("init", "postgres") and mount.source != f"{name}-state" and not shared_state:
                assert mount.read_only, f"{name} mounts {mount.source} writable"
    expected = {
        "ca": {"init"},
        "operator-secrets": {"init", "enrol", "checkpoints"},
        "operator-state": {"enrol", "checkpoints"},
        "demo-tls": {"init", "demo"},
        "coordinator-tls": {"init", "coordinator"},
        "db": {"init", "postgres", "coordinator", "signer-a", "signer-a2", "verifier-1", "verifier-2"},
        "pgdata": {"postgres"},
        "public": {"init", "enrol", *DAEMONS},
    }
    # deployer-a's replicas share its one key and TLS identity (ADR 0033); each has its own state volume.
    expected["signer-a-secrets"] = {"init", "signer-a", "signer-a2"}
    for name in ("signer-b", "signer-c"):
        expected[f"{name}-secrets"] = {"init", name}
    for name in ("signer-a", "signer-a2", "signer-b", "signer-c"):
        expected[f"{name}-state"] = {name}
    for name in ("verifier-1", "verifier-2"):
        expected[f"{name}-tls"] = {"init", name}
        expected[f"{name}-state"] = {name}
    assert users == expected
    assert set(compose["volumes"]) == set(expected), "every volume is declared, and only those used"


SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|PRIVATE|_PEM$|CREDENTIAL")
SECRET_VALUE = [
    re.compile(r"-----BEGIN"),  # PEM
    re.compile(r"://[^/@\s]*:[^/@\s]*@"),  # user:password@ in a URL
    re.compile(r"^[A-Za-z0-9_-]{43}$"),  # a bare base64url Ed25519 key
    re.compile(r"[A-Za-z0-9+/_=-]{40,}"),  # any long token-like string
]


def test_no_secret_in_any_environment_value(services: dict[str, Any]) -> None:
    for name, service in services.items():
        for key, value in environment_of(service).items():
            if SECRET_NAME.search(key):
                # Only references to files may carry such names (POSTGRES_PASSWORD_FILE, PGPASSFILE).
                assert key.endswith("_FILE") and value.startswith("/"), f"{name}: {key} carries a value"
            for pattern in SECRET_VALUE:
                assert not pattern.search(value), f"{name}: {key} looks like a secret"
    text = COMPOSE_FILE.read_text()
    assert "POSTGRES_PASSWORD:" not in text and "PGPASSWORD" not in text


def test_secret_checks_catch_secrets() -> None:
    def flagged(key: str, value: str) -> bool:
        bad_name = bool(SECRET_NAME.search(key)) and not (key.endswith("_FILE") and value.startswith("/"))
        return bad_name or any(p.search(value) for p in SECRET_VALUE)

    assert flagged("POSTGRES_PASSWORD", "hunter2")
    assert flagged("COUNTERSIGN_TLS_KEY_PEM", "x")
    assert flagged("COUNTERSIGN_STORE_URL", "postgresql://countersign:hunter2@postgres/db")
    assert flagged("COUNTERSIGN_OPERATOR_PUBLIC_KEY", "A" * 43)
    assert not flagged("POSTGRES_PASSWORD_FILE", "/run/countersign/db/postgres-password")
    assert not flagged("COUNTERSIGN_STORE_URL", "postgresql://countersign@postgres:5432/countersign?sslmode=disable")


def test_ports_are_published_on_loopback_only(services: dict[str, Any]) -> None:
    published = 0
    for name, service in services.items():
        for port in service.get("ports", []):
            assert isinstance(port, str), f"{name}: use the short port syntax with an address"
            assert re.fullmatch(r"127\.0\.0\.1:\d+:\d+", port), f"{name}: {port} is not bound to 127.0.0.1"
            published += 1
        assert "expose" not in service or name in DAEMONS
    assert published == 14, "gRPC and metrics of the seven daemons"
    assert "ports" not in services["postgres"]
    # Overriding the host ports keeps them on loopback.
    moved = load_compose({"MESH_PORT_COORDINATOR": "17400"})["services"]["coordinator"]["ports"]
    assert moved[0] == "127.0.0.1:17400:7400"
    host_ports = [p.split(":")[1] for s in services.values() for p in s.get("ports", [])]
    assert len(host_ports) == len(set(host_ports)), "host ports collide"


def test_job_scripts_exist_and_are_copied_into_the_dev_mesh_image(
    services: dict[str, Any], dockerfile: Dockerfile
) -> None:
    copies = dockerfile.stage("dev-mesh").all("COPY")
    assert any("docker/dev-mesh/ /usr/local/share/countersign/dev-mesh/" in c for c in copies)
    for name in JOBS:
        entrypoint = services[name]["entrypoint"]
        script = next(part for part in entrypoint if part.startswith("/usr/local/share/countersign/dev-mesh/"))
        local = DOCKER_DIR / "dev-mesh" / Path(script).name
        assert local.is_file(), f"{name}: {local} missing"
    # Every mount target of the init job is a directory the dev-mesh image creates for the runtime
    # user (so that a new named volume starts out owned by it).
    (run,) = dockerfile.stage("dev-mesh").all("RUN")
    for mount in mounts_of(services["init"]):
        assert mount.target.startswith("/mesh/") and mount.target.removeprefix("/mesh/") in run, mount
        assert not mount.read_only


def test_init_writes_what_the_daemons_read(services: dict[str, Any]) -> None:
    """The files each daemon is told about are the ones init.sh writes, in the volume it mounts."""
    init_env = environment_of(services["init"])
    init_mounts = {m.source: m.target for m in mounts_of(services["init"])}
    script = (DOCKER_DIR / "dev-mesh" / "init.sh").read_text()
    for file in ("tls.pem", "tls.key", "ca.pem", "signer.jwk", "operator.toml", "pgpass", "postgres-password"):
        assert file in script, file
    for name in DAEMONS:
        env = environment_of(services[name])
        for mount in mounts_of(services[name]):
            if mount.source in init_mounts:
                assert init_mounts[mount.source] in " ".join(init_env.values()), f"init does not fill {mount.source}"
        assert env.get("PGPASSFILE", "/run/countersign/db/pgpass").endswith("/pgpass")
    assert environment_of(services["postgres"])["POSTGRES_PASSWORD_FILE"].endswith("/postgres-password")
