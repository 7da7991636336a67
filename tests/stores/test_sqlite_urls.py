"""``sqlite:`` URLs mean what they mean to SQLAlchemy and most tools, in every daemon's setting and on
the command line: three slashes and a relative path are relative to the working directory, four
slashes an absolute path. (``--state sqlite:///state.db``, the help text's own example, used to write
``/state.db`` at the filesystem root.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from coordinator.log_stores import open_log_store
from countersign._daemon.sqlite import sqlite_file
from countersign.errors import ConfigError
from signer.stores import open_signer_state
from verifier.stores import StoreConfigError, open_store

pytestmark = pytest.mark.offline


@pytest.mark.parametrize(
    ("url", "relative"),
    [("sqlite:///state.db", "state.db"), ("sqlite:///sub/dir/state.db", "sub/dir/state.db")],
)
def test_three_slashes_are_relative_to_the_working_directory(
    url: str, relative: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert sqlite_file(url) == str(tmp_path / relative)


def test_four_slashes_are_absolute(tmp_path: Path) -> None:
    assert sqlite_file(f"sqlite:///{tmp_path}/state.db") == str(tmp_path / "state.db")
    assert sqlite_file("sqlite:////var/lib/countersign/state.db") == "/var/lib/countersign/state.db"


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///", "sqlite://host/x.db", "postgresql:///x", "state.db"])
def test_anything_else_names_no_file(url: str) -> None:
    assert sqlite_file(url) is None


def test_every_store_opens_its_file_in_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    open_store("sqlite:///verifier.db").close()
    open_signer_state("sqlite:///signer.db").close()
    open_log_store("sqlite:///coordinator.db").close()
    assert {p.name for p in tmp_path.iterdir()} >= {"verifier.db", "signer.db", "coordinator.db"}
    assert not Path("/verifier.db").exists()


def test_a_bad_url_is_one_clear_error() -> None:
    with pytest.raises(StoreConfigError, match="sqlite:////absolute"):
        open_store("sqlite://host/x.db")
    with pytest.raises(ConfigError, match="sqlite:////absolute"):
        open_signer_state("sqlite://host/x.db")
    with pytest.raises(ConfigError, match="sqlite:////absolute"):
        open_log_store("sqlite://host/x.db")


def test_a_url_whose_meaning_changed_is_refused_while_the_earlier_file_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Earlier releases read ``sqlite:///x`` as the absolute ``/x``. A daemon upgraded with such a URL
    must not start on a new, empty store (a fresh store forgets consumed nonces and spent grants)."""
    earlier = tmp_path / "state.db"
    earlier.write_bytes(b"")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    url = f"sqlite://{earlier}"  # three slashes in all: relative to the working directory now
    with pytest.raises(ConfigError, match="to keep using it, write sqlite:///"):
        sqlite_file(url)
    assert sqlite_file(f"sqlite:///{earlier}") == str(earlier)
