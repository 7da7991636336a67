"""The package imports and works without the ``aws`` extra; asking for a KMS key then says what is missing."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.daemons  # a child interpreter without the extras

PROGRAM = textwrap.dedent(
    """
    import importlib.abc
    import sys

    class BlockAws(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {"boto3", "botocore", "s3transfer"}:
                raise ImportError(f"blocked for this test: {name}")
            return None

    sys.meta_path.insert(0, BlockAws())
    for name in ("boto3", "botocore"):
        sys.modules[name] = None

    import countersign
    import countersign.verify
    import countersign.samples
    import signer.backends
    import signer.backends.file
    from countersign.errors import SignerError
    from signer.backends import SIGNER_FOR_URI_SCHEME, load_signer

    assert "awskms" in SIGNER_FOR_URI_SCHEME  # the registry names it ...
    assert "signer.backends.awskms" not in sys.modules  # ... and imports it only when asked for
    try:
        load_signer("awskms:alias/countersign/signer/a?region=eu-west-1")
    except SignerError as exc:
        print("SignerError:", exc)
    else:
        raise SystemExit("load_signer did not fail")
    assert "signer.backends.awskms" in sys.modules  # the module itself imported fine
    assert sys.modules["boto3"] is None
    print("OK")
    """
)


def test_package_imports_without_the_aws_extra() -> None:
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1] == "OK"
    assert "needs the 'aws' extra (no module boto3): pip install 'countersign-mesh[aws]'" in lines[0]
