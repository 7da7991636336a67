"""The verifier-store tests once more, against PostgreSQL in a container that testcontainers starts:
the LOCAL STAND-IN postgres image (Debian bookworm's postgresql-15 in the local base, see
docker/local-base/build.sh), on host networking and a loopback port of its own, Ryuk disabled (it
would be one more image from a registry).

The store tests are not copied: tests/stores runs unchanged in a child pytest with
``COUNTERSIGN_TEST_POSTGRES_URL`` pointing at the container (the variable tests/stores/conftest.py
selects its server by), and this test requires that run to pass with nothing skipped, and the
container's server to have done the work.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.docker.compose_host import LOOPBACK
from tests.docker.conftest import REPO_ROOT
from tests.ports import free_port

pytestmark = [pytest.mark.containers, pytest.mark.slow]

# The store tests that need a PostgreSQL server, less the one that restarts the machine's own server.
STORE_SELECTION = "postgres and not exclusive"


def host_network_postgres(image: str, port: int) -> Any:
    """testcontainers' PostgresContainer on host networking: the server listens on 127.0.0.1:port."""
    from testcontainers.community.postgres import PostgresContainer

    class HostNetworkPostgres(PostgresContainer):
        def get_container_host_ip(self) -> str:
            return LOOPBACK

        def _get_exposed_port(self, port: int) -> int:
            return port  # host networking: the container's port is the host's

    container = HostNetworkPostgres(
        image, port=port, username="countersign", password=secrets.token_urlsafe(16), dbname="test", driver=None
    )
    container.ports.clear()  # nothing to publish on host networking
    container.with_env("PGPORT", str(port))
    container.with_command(["postgres", "-c", f"listen_addresses={LOOPBACK}"])
    container.with_kwargs(network_mode="host")
    return container


@pytest.fixture
def postgres_container(local_base_images: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("TESTCONTAINERS_RYUK_DISABLED", "true")  # docker/engine.sh run sets it too
    from testcontainers.core.config import testcontainers_config

    assert testcontainers_config.ryuk_disabled, "Ryuk must be off (TESTCONTAINERS_RYUK_DISABLED=true)"
    with host_network_postgres(local_base_images.postgres, free_port()) as container:
        yield container.get_connection_url()


def committed_transactions(url: str) -> int:
    import psycopg

    with psycopg.connect(url, connect_timeout=5) as conn:
        row = conn.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()").fetchone()
    assert row is not None
    return int(row[0])


def test_store_conformance_on_testcontainers_postgres_local_base_image(postgres_container: str) -> None:
    import psycopg

    url = postgres_container
    assert url.startswith("postgresql://countersign:") and f"@{LOOPBACK}:" in url
    with psycopg.connect(url, connect_timeout=5) as conn:
        version = conn.execute("SELECT version()").fetchone()
        address = conn.execute("SELECT host(inet_server_addr())").fetchone()
    assert version is not None and "Debian" in version[0], version  # bookworm's postgresql-15
    assert address is not None and address[0] == LOOPBACK
    before = committed_transactions(url)

    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", STORE_SELECTION, "tests/stores"],
        cwd=REPO_ROOT,
        env={**os.environ, "COUNTERSIGN_TEST_POSTGRES_URL": url, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
    assert run.returncode == 0, f"tests/stores against the container:\n{run.stdout[-6000:]}\n{run.stderr[-2000:]}"
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) >= 20, summary
    assert not re.search(r"skipped|failed|error", summary), summary
    # The work happened in the container's server, not the machine's.
    assert committed_transactions(url) - before > 100
