"""Store selection by URL, and the optional extras staying optional."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from verifier.stores import STORE_FOR_SCHEME, StoreConfigError, open_store

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.offline
def test_every_backend_has_a_scheme() -> None:
    assert {"memory", "sqlite", "postgresql", "dynamodb"} <= set(STORE_FOR_SCHEME)
    with pytest.raises(StoreConfigError, match="unknown store URL scheme"):
        open_store("redis://localhost")


@pytest.mark.daemons  # a child interpreter without the extras
def test_package_imports_and_serves_without_the_optional_extras(tmp_path: Path) -> None:
    """With psycopg and boto3 unimportable, memory and SQLite still work and the shared backends say
    which extra they need (a configuration error, not a crash at import time)."""
    script = textwrap.dedent(
        f"""
        import sys
        for name in ("psycopg", "psycopg_pool", "boto3", "botocore"):
            sys.modules[name] = None  # import of these now fails
        from verifier.stores import StoreConfigError, open_store
        open_store("memory:").close()
        open_store("sqlite:///{tmp_path / "x.db"}").close()
        for url, extra in (("postgresql://u@h/db", "postgres"), ("dynamodb://t?region=r", "aws")):
            try:
                open_store(url)
            except StoreConfigError as exc:
                assert extra in str(exc), exc
            else:
                raise AssertionError(url)
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO_ROOT, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
