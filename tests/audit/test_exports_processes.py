"""The export checks that need a child process: a fresh interpreter (other hash seeds, no optional
library loaded, the extra missing) or the vector generator run as a script."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path as FilePath

import pytest

from tests.audit.test_exports import EXPORT_DIR, VECTORS
from tests.vectors.generate import EXPORT_FILES

pytestmark = pytest.mark.daemons  # starts child processes (the tier for anything beyond this process)


def test_generator_writes_the_committed_export_vectors(tmp_path: FilePath) -> None:
    subprocess.run([sys.executable, str(VECTORS / "generate.py"), "--out", str(tmp_path)], check=True)
    for name in EXPORT_FILES.values():
        assert (tmp_path / "export" / name).read_bytes() == (EXPORT_DIR / name).read_bytes(), name


def test_exports_do_not_depend_on_hash_randomisation(tmp_path: FilePath) -> None:
    """prov keeps attributes in sets; the bytes must not change with Python's string hashing."""
    code = (
        "import json, base64, sys, hashlib; from countersign.records import Path; "
        "from countersign.export import export_path, FORMATS; "
        "v = json.load(open(sys.argv[1])); p = Path.from_json(v['presentation']['path']); "
        "print(hashlib.sha256(b''.join(export_path(p, f) for f in FORMATS)).hexdigest())"
    )
    digests = set()
    for seed in ("1", "2", "3"):
        env = {"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)}
        result = subprocess.run(
            [sys.executable, "-c", code, str(VECTORS / "valid" / "signed-dag.json")],
            capture_output=True, text=True, check=True, env=env,
        )  # fmt: skip
        digests.add(result.stdout.strip())
    assert len(digests) == 1


def test_without_the_extra_prov_formats_name_it_and_the_others_still_work() -> None:
    code = (
        "import sys; sys.modules['prov'] = None; sys.modules['prov.model'] = None\n"
        "import json; from countersign.records import Path; from countersign.export import export_path, ExtraMissing\n"
        "v = json.load(open(sys.argv[1])); p = Path.from_json(v['presentation']['path'])\n"
        "assert export_path(p, 'dsse') and export_path(p, 'in-toto')\n"
        "try:\n    export_path(p, 'prov-n')\nexcept ExtraMissing as exc:\n    print(exc)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(VECTORS / "valid" / "signed-dag.json")],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "pip install 'countersign-mesh[export]'" in result.stdout


def test_importing_the_export_package_loads_no_optional_library() -> None:
    code = "import sys, countersign.export; print([m for m in ('prov', 'rdflib') if m in sys.modules])"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
