"""``countersign demo --keep-running`` (``make mesh``): after the demonstration, leave the local mesh
up so the README's ``countersign verify --verifier`` example can be tried without Docker.

A fresh path and its output are written under the work directory (the demo's own are consumed), with
``mesh.json`` naming every daemon's address and the client certificate, and the exact command to try
is printed. SIGINT (Ctrl-C) or SIGTERM stops the mesh cleanly.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import signal
from pathlib import Path as FilePath
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from countersign.client import SignerClient
    from countersign_cli.localmesh import LocalMesh

STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}
TRY_OUTPUT = b"an output you can verify against the running mesh\n"


def describe(mesh: LocalMesh, runtime: SignerClient, root: FilePath) -> dict[str, object]:
    """Write a fresh path to try and ``mesh.json``; return what ``mesh.json`` holds."""
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
    }  # fmt: skip
    (root / "mesh.json").write_text(json.dumps(description, indent=2))
    return description


def hold(mesh: LocalMesh, runtime: SignerClient, root: FilePath) -> None:
    """Describe the mesh, then wait for SIGINT or SIGTERM (the caller stops the mesh)."""
    description = describe(mesh, runtime, root)
    command = description["verify_command"]
    assert isinstance(command, list)
    print("\nThe mesh keeps running (Ctrl-C or SIGTERM stops it). Try, from another shell:")
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
