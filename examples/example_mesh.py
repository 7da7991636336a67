"""Where the examples run: your mesh when ``COUNTERSIGN_MESH`` names its settings, else a private one.

``countersign demo --keep-running --workdir mesh`` leaves a mesh up and writes ``mesh/mesh.json``
(docs/quickstart-runtime.md); with ``export COUNTERSIGN_MESH=$PWD/mesh/mesh.json`` every example runs
against it. Its ``settings`` hold each deployer's producer settings and the consumer's, as the
environment variables ``Runtime.from_env`` and ``Consumer.from_env`` read, and the registry file. A mesh
of your own takes the same file. Without it, an example starts a private local mesh (real daemons on
loopback with mTLS, in a temporary directory) and writes the same settings for it.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from countersign.client import AsyncRuntime, Consumer, Runtime
from countersign.registry import Registry

ENV_MESH = "COUNTERSIGN_MESH"


@dataclass(frozen=True)
class MeshSettings:
    """Each deployer's producer settings and the consumer's (environment variables), and the registry."""

    producers: dict[str, dict[str, str]]
    consumer_env: dict[str, str]
    registry_file: str

    @classmethod
    def load(cls, location: str) -> MeshSettings:
        settings = json.loads(Path(location).read_text())["settings"]
        return cls(settings["producers"], settings["consumer"], settings["registry"])

    def env(self, deployer: str) -> dict[str, str]:
        """What deployer's runtime reads (``Runtime.from_env(settings.env("deployer-b"))``)."""
        return self.producers[deployer]

    def runtime(self, deployer: str) -> Runtime:
        return Runtime.from_env(self.env(deployer))

    def async_runtime(self, deployer: str) -> AsyncRuntime:
        """Call inside the event loop that will use it."""
        return AsyncRuntime.from_env(self.env(deployer))

    def consumer(self) -> Consumer:
        """A consumer checking through the mesh's verifier."""
        return Consumer.from_env(self.consumer_env)

    def registry(self) -> Registry:
        from countersign.client import load_registry

        return load_registry(self.registry_file)


@contextmanager
def the_mesh() -> Iterator[MeshSettings]:
    """The settings of the mesh named by ``COUNTERSIGN_MESH``, else of a private mesh started here."""
    named = os.environ.get(ENV_MESH)
    if named:
        print(f"on the mesh of {named}", file=sys.stderr)
        yield MeshSettings.load(named)
        return
    from countersign_cli.keep_running import write_settings
    from countersign_cli.localmesh import LocalMesh

    with tempfile.TemporaryDirectory(prefix="countersign-example-") as workdir, LocalMesh(Path(workdir)) as mesh:
        mesh.setup().start_all().enrol_all()
        root = Path(workdir)
        (root / "mesh.json").write_text(json.dumps({"settings": write_settings(mesh, root)}))
        print("on a private local mesh (set COUNTERSIGN_MESH to use yours)", file=sys.stderr)
        yield MeshSettings.load(str(root / "mesh.json"))
