"""A verifier that checks a path's signatures on several threads (``signature_threads``) reaches the
verdict the serial offline check reaches, for every signature of a real delegated path broken in turn."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from countersign.keys import PublicKey
from countersign.records import Envelope, Path
from countersign.registry import KeyEntry, Registry
from countersign.state import InMemoryState
from countersign.verify import Mode, verify_path
from countersign_cli.localmesh import LocalMesh
from tests.mesh.helpers import delegate, now_ms, sha256

pytestmark = pytest.mark.daemons
OUTPUT = b"what the writer emitted\n"


@pytest.fixture(scope="module")
def threaded_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalMesh]:
    from tests.mesh.conftest import start_mesh

    mesh = start_mesh(tmp_path_factory.mktemp("threads"), verifier_options={"signature_threads": 3})
    yield mesh
    mesh.stop_all()


def broken(signature: str) -> str:
    """The same signature with one base64url character changed (still well-formed)."""
    return ("B" if signature[0] == "A" else "A") + signature[1:]


def signature_breaks(path: Path) -> Iterator[tuple[str, Path]]:
    """Every signature of the path (primary and co-signatures), broken one at a time."""
    for index, envelope in enumerate(path.envelopes):
        assert envelope.sig is not None
        variants = [("primary", Envelope(envelope.record, envelope.key_id, broken(envelope.sig), envelope.record_json))]
        for n, cosig in enumerate(envelope.record.cosigs):
            cosigs = list(envelope.record.cosigs)
            cosigs[n] = dataclasses.replace(cosig, sig=broken(cosig.sig))
            record = dataclasses.replace(envelope.record, cosigs=tuple(cosigs))
            json = dict(envelope.record_json)
            json["cosigs"] = [c.to_json() for c in cosigs]
            variants.append((f"cosig {n}", Envelope(record, envelope.key_id, envelope.sig, json)))
        for name, variant in variants:
            envelopes = list(path.envelopes)
            envelopes[index] = variant
            yield f"record {index} {name}", Path(tuple(envelopes))


def test_threaded_signature_checks_agree_with_the_serial_offline_verdict(threaded_mesh: LocalMesh) -> None:
    runtime = threaded_mesh.runtime("deployer-a")
    writer = threaded_mesh.runtime("deployer-c")
    try:
        root = runtime.root("planner", "threads", max_children=4)
        researcher = delegate(threaded_mesh, root, "deployer-b", "researcher")
        writer_path = delegate(threaded_mesh, researcher, "deployer-c", "writer")
        path = writer.receipt(writer_path, sha256(OUTPUT))
    finally:
        runtime.close()
        writer.close()
    registry = Registry(
        {d: {k.key_id: KeyEntry(PublicKey(k.public_key), 0)} for d, k in threaded_mesh.deployer_keys.items()}
    )
    client = threaded_mesh.verifier_client()
    try:
        cases = [("intact", path), *signature_breaks(path)]
        assert len(cases) >= 1 + 4 + 2 * 2  # four records, two of them co-signed
        for name, presented in cases:
            offline = verify_path(
                presented, OUTPUT, registry=registry, state=InMemoryState(), mode=Mode.AUDIT, now_ms=now_ms()
            )
            served = client.verify(presented.to_bytes(), OUTPUT, audit=True).result
            assert (served.verdict, served.reason, served.index) == (offline.verdict, offline.reason, offline.index), (
                name
            )
            assert bool(served) is (name == "intact"), name
    finally:
        client.close()
