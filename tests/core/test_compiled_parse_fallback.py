"""Without msgspec (the ``fast`` extra), the reference parser is chosen at import and gives every answer
the compiled decoder gives: a child interpreter in which msgspec cannot be imported reads the vectors
and the mutation corpus of ``test_compiled_parse`` exactly as this process does."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from countersign import records
from countersign.errors import MalformedError

from .test_compiled_parse import CORPUS_PATHS, CORPUS_SESSIONS, VECTOR_INPUTS, _public

pytestmark = pytest.mark.daemons  # a child interpreter


_BLOCKED_CHILD = """
import json, sys
sys.modules["msgspec"] = None  # as if the fast extra were not installed
from countersign import records
from countersign.errors import MalformedError
from countersign.records import Path
from countersign.sessions import SessionEvidence
answers = []
for kind, text in json.load(sys.stdin):
    try:
        value = (Path if kind == "path" else SessionEvidence).from_bytes(text.encode("latin-1"))
    except MalformedError as exc:
        answers.append([type(exc).__name__, str(exc), exc.index])
    else:
        answers.append(value.to_bytes().decode())
print(json.dumps({"decoder": records.DECODER, "compiled": "countersign._compiled_parse" in sys.modules,
                  "answers": answers}))
"""


def test_the_reference_is_chosen_at_import_without_msgspec_and_gives_the_same_answers() -> None:
    corpus = [(kind, data) for _, data, kind in VECTOR_INPUTS] + [("path", data) for data, _ in CORPUS_PATHS[:400]]
    corpus += [("session", data) for data, _ in CORPUS_SESSIONS[:200]]
    done = subprocess.run(
        [sys.executable, "-c", _BLOCKED_CHILD],
        input=json.dumps([(kind, data.decode("latin-1")) for kind, data in corpus]),
        capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    child = json.loads(done.stdout)
    assert child["decoder"] == "reference (json)" and not child["compiled"]
    assert records.DECODER.startswith("msgspec")  # this process: the compiled decoder
    here = []
    for kind, data in corpus:
        try:
            here.append(_public(kind)(data).to_bytes().decode())
        except MalformedError as exc:
            here.append([type(exc).__name__, str(exc), exc.index])
    assert child["answers"] == here
