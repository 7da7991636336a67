"""The compact path encoding (docs/spec.md 19.1, tests/vectors/compact-path.json): the same evidence as
path JSON, byte for byte, for every path; one encoding per string; every bad string MALFORMED."""

from __future__ import annotations

import base64
import json
import zlib
from pathlib import Path as FilePath

import pytest
from hypothesis import given
from hypothesis import strategies as st

from countersign.compact import COMPACT_PREFIX, compact_path, path_from_compact, path_json_from_compact
from countersign.errors import MalformedError
from countersign.records import Path
from tests.core.strategies import valid_paths

pytestmark = pytest.mark.offline

VECTOR = json.loads((FilePath(__file__).parents[1] / "vectors" / "compact-path.json").read_text())


def test_the_vector_reads_back_to_its_path_json_and_writes_the_same_string() -> None:
    path = path_from_compact(VECTOR["compact"])
    assert path.to_bytes() == VECTOR["path_json"].encode()
    assert compact_path(Path.from_bytes(VECTOR["path_json"].encode())) == VECTOR["compact"]
    assert len(VECTOR["compact"]) < len(VECTOR["path_json"])


@pytest.mark.parametrize("case", VECTOR["invalid"], ids=lambda c: c["why"])
def test_each_invalid_compact_string_is_refused(case: dict[str, str]) -> None:
    with pytest.raises(MalformedError):
        path_from_compact(case["compact"])


@given(valid_paths(), st.integers(0, 9))
def test_every_path_reads_back_byte_for_byte_whatever_the_compression_level(
    sample: tuple[Path, bytes], level: int
) -> None:
    path, _ = sample
    assert path_from_compact(compact_path(path)).to_bytes() == path.to_bytes()
    # Any conforming DEFLATE encoder's output reads back to the same bytes: the encoding is transport only.
    deflate = zlib.compressobj(level, zlib.DEFLATED, -15)
    data = deflate.compress(path.to_bytes()) + deflate.flush()
    text = COMPACT_PREFIX + base64.urlsafe_b64encode(data).rstrip(b"=").decode()
    assert path_json_from_compact(text) == path.to_bytes()


@given(st.binary(max_size=512))
def test_any_other_body_is_malformed_or_a_path_never_anything_else(body: bytes) -> None:
    text = COMPACT_PREFIX + base64.urlsafe_b64encode(body).rstrip(b"=").decode()
    try:
        path = path_from_compact(text)
    except MalformedError:
        return
    assert compact_path(path) is not None  # a body that happens to hold a canonical path is one


@given(st.text(max_size=64))
def test_any_text_is_refused_as_malformed_only(text: str) -> None:
    with pytest.raises(MalformedError):
        path_from_compact(text)
