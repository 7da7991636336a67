"""``countersign demo --keep-running`` (``make mesh``): after the demonstration, leave the local mesh
up, and say how to use it: the settings of a producer and of a consumer, ready to paste.

Under the work directory it writes (docs/quickstart-runtime.md starts here):

* ``deployer-a.env`` (one per deployer): a producer's settings, the variables ``Runtime.from_env``
  reads: that deployer's signer (every replica, comma-separated), its id and its runtime certificate,
  and the verifier (which takes any client certificate of the mesh's CA), so that a producer's shell
  can check what it signed;
* ``consumer.env``: a consumer's, for ``Consumer.from_env`` online: the verifier and a client
  certificate; ``consumer-offline.env``: the registry file instead, to check in process;
* ``registry.json`` (the operator-signed registry as the coordinator serves it) and
  ``operator.pub.json`` (the operator's public key, to audit the registry log);
* ``mesh.json``: every daemon's address, a path to try with ``countersign verify --verifier``, and
  ``settings``: every deployer's and the consumer's settings in one file, which the examples read
  from ``COUNTERSIGN_MESH`` to run against this mesh.

Each ``.env`` file is ``export NAME=value`` lines (``. mesh/deployer-a.env`` in a POSIX shell), and
clears the variable of the other way to check, so that sourcing one after another is safe. SIGINT
(Ctrl-C) or SIGTERM stops the mesh cleanly.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import signal
from pathlib import Path as FilePath
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from countersign.client import SignerClient, TlsConfig
    from countersign_cli.localmesh import LocalMesh

STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}
TRY_OUTPUT = b"an output you can verify against the running mesh\n"
PRODUCER = "deployer-a"  # whose settings are printed; every deployer's are written


def _tls_variables(tls: TlsConfig) -> dict[str, str]:
    if tls.insecure_loopback:
        return {"COUNTERSIGN_CLIENT_INSECURE_LOOPBACK": "1"}
    return {"COUNTERSIGN_CLIENT_CA": tls.ca, "COUNTERSIGN_CLIENT_CERT": tls.cert, "COUNTERSIGN_CLIENT_KEY": tls.key}


def env_file(variables: dict[str, str], unset: tuple[str, ...] = ()) -> str:
    """``export`` lines a POSIX shell sources (values quoted), after ``unset`` of the names given."""
    lines = [f"unset {name}" for name in unset]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in variables.items()]
    return "\n".join(lines) + "\n"


def mesh_settings(mesh: LocalMesh, root: FilePath) -> dict[str, object]:
    """Every deployer's producer settings and the consumer's, as environment variables, with the
    registry file and the operator's public key: what ``mesh.json`` holds under ``settings``."""
    verifier = mesh.daemons["verifier-0"].address
    producers = {
        deployer: {"COUNTERSIGN_SIGNER": mesh.signer_addresses(deployer), "COUNTERSIGN_DEPLOYER": deployer,
                   "COUNTERSIGN_VERIFIER": verifier, **_tls_variables(mesh.tls_for(f"{deployer}-runtime"))}
        for deployer in mesh.deployers
    }  # fmt: skip
    consumer = {"COUNTERSIGN_VERIFIER": verifier, **_tls_variables(mesh.tls_for("client"))}
    return {
        "producers": producers,
        "consumer": consumer,
        "consumer_offline": {"COUNTERSIGN_REGISTRY": str(root / "registry.json")},
        "registry": str(root / "registry.json"),
        "operator_public_key": str(root / "operator.pub.json"),
    }


def write_settings(mesh: LocalMesh, root: FilePath) -> dict[str, object]:
    """Write the registry, the operator's public key and the ``.env`` files; return :func:`settings`."""
    from countersign.admission import AdmissionLog, SignedStatement
    from countersign.canonical import b64url_encode
    from countersign.client.operator import coordinator_log
    from countersign.keys import PublicKey

    operator = PublicKey(mesh.operator.public_key)
    log = AdmissionLog(operator)
    served = coordinator_log(mesh.daemons["coordinator"].address, mesh.tls_for("client"))
    log.extend([SignedStatement.from_bytes(statement) for statement in served])
    (root / "registry.json").write_text(json.dumps(log.registry.to_json(), indent=2) + "\n")
    (root / "operator.pub.json").write_text(
        json.dumps({"key_id": operator.key_id, "public_key": b64url_encode(operator.raw)}) + "\n"
    )
    described = mesh_settings(mesh, root)
    producers = described["producers"]
    assert isinstance(producers, dict)
    for deployer, variables in producers.items():
        (root / f"{deployer}.env").write_text(env_file(variables, unset=("COUNTERSIGN_REGISTRY",)))
    consumer, offline = described["consumer"], described["consumer_offline"]
    assert isinstance(consumer, dict)
    assert isinstance(offline, dict)
    (root / "consumer.env").write_text(env_file(consumer, unset=("COUNTERSIGN_REGISTRY",)))
    (root / "consumer-offline.env").write_text(env_file(offline, unset=("COUNTERSIGN_VERIFIER",)))
    return described


def describe_mesh(mesh: LocalMesh, runtime: SignerClient, root: FilePath) -> dict[str, object]:
    """Write a fresh path to try, the settings and ``mesh.json`` (last: its presence says the mesh is
    ready); return what ``mesh.json`` holds."""
    tried = root / "try"
    tried.mkdir(parents=True, exist_ok=True)
    agent = runtime.root("try-me", "keep-running", ttl_ms=24 * 3_600_000)
    path = runtime.receipt(agent, hashlib.sha256(TRY_OUTPUT).digest())
    (tried / "path.json").write_bytes(path.to_bytes())
    (tried / "output.bin").write_bytes(TRY_OUTPUT)
    client = mesh.tls_for("client")
    tls_flags = (
        ["--insecure-loopback"]
        if client.insecure_loopback
        else ["--ca", client.ca, "--cert", client.cert, "--tls-key", client.key]
    )
    command = [
        "countersign", "verify", "--path", str(tried / "path.json"), "--output", str(tried / "output.bin"),
        "--verifier", mesh.daemons["verifier-0"].address, *tls_flags,
    ]  # fmt: skip
    description: dict[str, object] = {
        "daemons": {name: {"address": d.address, "pid": d.process.pid if d.process else None}
                    for name, d in mesh.daemons.items()},
        "path": str(tried / "path.json"),
        "output": str(tried / "output.bin"),
        "verify_command": command,
        "settings": write_settings(mesh, root),
    }  # fmt: skip
    (root / "mesh.json").write_text(json.dumps(description, indent=2))
    return description


def print_settings(root: FilePath) -> None:
    """The producer's and the consumer's settings, as the lines to paste into their shells."""
    print(f"\nSettings for a producer ({PRODUCER}'s runtime), to paste into its shell (or: . {root}/{PRODUCER}.env):")
    print("".join(f"  {line}\n" for line in (root / f"{PRODUCER}.env").read_text().splitlines()), end="")
    print(f"Settings for a consumer checking through the verifier (or: . {root}/consumer.env):")
    print("".join(f"  {line}\n" for line in (root / "consumer.env").read_text().splitlines()), end="")
    print(f"  (offline instead, with the registry: . {root}/consumer-offline.env)")
    print(f"Other deployers: {root}/deployer-*.env; operator public key: {root}/operator.pub.json")
    print(f"The examples run on this mesh with: export COUNTERSIGN_MESH={shlex.quote(str(root / 'mesh.json'))}")


def hold(mesh: LocalMesh, runtime: SignerClient, root: FilePath) -> None:
    """Describe the mesh, then wait for SIGINT or SIGTERM (the caller stops the mesh)."""
    description = describe_mesh(mesh, runtime, root)
    command = description["verify_command"]
    assert isinstance(command, list)
    print("\nThe mesh keeps running (Ctrl-C or SIGTERM stops it).")
    print_settings(root)
    print("\nOr try the command line, from another shell:")
    print(f"  {shlex.join(command)}")
    print("The first run accepts; a second is NONCE_REPLAYED (add --audit to check without consuming).")
    print(f"Addresses and certificates: {root / 'mesh.json'}", flush=True)
    # Wait synchronously for the signal: a handler would run between two bytecodes of whatever the
    # main thread does; blocked signals are delivered to sigwait instead.
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        received = signal.sigwait(STOP_SIGNALS)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    print(f"\n{signal.Signals(received).name}: stopping the mesh", flush=True)
