"""This host's raw costs, measured in the same run as ``zones measure``, and the floor they set.

The published figures came from other machines. A latency measured here moves with this host (one
VM's loopback mTLS round trip was 0.39 ms one day and 0.81 ms the next), so the report puts each
figure beside what any implementation of the same protocol pays on this host, in this run:

* the signatures a call must make and check (PyNaCl, as the daemons use; a verifier's checks split
  over as many lanes as its ``signature_threads`` and this host's CPUs allow, as the daemon splits them);
* one ``fdatasync`` of 4 KiB in the directory the signers' state lives in (a spent grant and a
  consumed nonce are synced before the answer);
* one mTLS gRPC round trip (a health check) inside a zone and across an inter-zone route;
* one PostgreSQL round trip (``SELECT 1``) from a verifier's zone, local and across a route.

A floor is the sum of the raw costs a call cannot avoid; ``measured ÷ floor`` says what the daemons
add on top, and compares across hosts where the absolute figure does not.

A second floor is this design's own: the same handlers the daemons run, called in one
process with no gRPC (``HandlerCosts``: both signers' issuance handlers on real SQLite state with the
parent's fsync; a verifier's parse, checks and PostgreSQL consume through the route its zone uses),
plus one raw round trip per hop. It is what the daemons would cost if serving added nothing: when it
is above a published target, this implementation cannot meet that target on this host, however
thin its serving layer. The handlers are timed as the daemons run them: each daemon's part of a
call starts after idling (``idle_ms``, the route's one-way delay in ``zones measure``), because on a
VM code that runs on a CPU just back from idle runs slower for a while, and a daemon always idles
while its call crosses the network (docs/zones.md). The same handlers back to back are printed too.
"""

from __future__ import annotations

import itertools
import math
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import nacl.signing
import psycopg
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.issuance import in_process_issuance
from bench.mesh import timed
from countersign._clock import now_ms
from countersign._daemon.server import usable_cpus
from countersign.client.tls import open_channel, verifier_dns
from countersign.keys import Ed25519Signer
from countersign.samples import SampleMesh
from countersign.verify import SERIAL, Mode, SignatureBatch, split_lanes, verify_path_bytes
from tools.zones.evidence import signed_paths
from tools.zones.mesh import DATABASE_ZONE, ZoneMesh
from verifier.daemon import VerifierConfig, signature_batch
from verifier.stores import open_store
from verifier.stores.postgres import parse_url

# What each measured call cannot avoid (see docs/zones.md, "Raw costs and floors"):
# issuance: the child co-signs, the parent checks that and co-signs, the child checks the parent's
# co-signature and seals the record (3 signs, 2 checks); the parent syncs the spent grant.
ISSUANCE_SIGNS, ISSUANCE_CHECKS = 3, 2
# full verification of a depth-5 SIGNED-DAG path: 5 record signatures + 4 edges x 2 co-signatures.
PATH_SIGNATURES = 13


WARMUP = 10  # calls made before each median is taken


def median_ms(call: Callable[[], object], count: int, idle_s: float = 0.0) -> float:
    """The median of ``count`` calls after ``WARMUP``; with ``idle_s``, each after sleeping that long (untimed)."""
    idle = (lambda: time.sleep(idle_s)) if idle_s else None
    return timed(call, count, warmup=WARMUP, before=idle)["p50"] / 1000


def remote_zone(zoned: ZoneMesh) -> str:
    """A zone other than the database's: where a store round trip crosses a route."""
    return next(zone for zone in zoned.net.zones if zone != DATABASE_ZONE)


@dataclass(frozen=True)
class RawCosts:
    """Medians in ms."""

    sign_ms: float
    verify_ms: float
    fsync_ms: float
    grpc_local_ms: float
    grpc_route_ms: float
    postgres_local_ms: float
    postgres_route_ms: float
    signature_lanes: int = 1  # threads a verifier checks one path's signatures on, when cores are free

    def issuance_floor(self) -> float:
        """The child's runtime and signer in one zone, the parent's signer across a route."""
        crypto = ISSUANCE_SIGNS * self.sign_ms + ISSUANCE_CHECKS * self.verify_ms
        return self.grpc_local_ms + self.grpc_route_ms + crypto + self.fsync_ms

    def verification_floor(self, *, client_remote: bool, database_remote: bool) -> float:
        """One call to the verifier, its signature checks, one round trip to the store and its commit."""
        grpc_ms = self.grpc_route_ms if client_remote else self.grpc_local_ms
        store_ms = self.postgres_route_ms if database_remote else self.postgres_local_ms
        checks = math.ceil(PATH_SIGNATURES / self.signature_lanes)  # the longest lane's share
        return grpc_ms + checks * self.verify_ms + store_ms + self.fsync_ms

    def lines(self) -> list[str]:
        return [
            f"Ed25519 sign {self.sign_ms * 1000:.0f} µs, verify {self.verify_ms * 1000:.0f} µs (PyNaCl;"
            f" a path's {PATH_SIGNATURES} checks on {self.signature_lanes} lane(s))",
            f"fdatasync of 4 KiB in the state directory {self.fsync_ms:.3f} ms",
            f"mTLS gRPC round trip (health check) in one zone {self.grpc_local_ms:.3f} ms,"
            f" across a route {self.grpc_route_ms:.3f} ms",
            f"PostgreSQL round trip (a one-row query) from the database's zone {self.postgres_local_ms:.3f} ms,"
            f" from another zone {self.postgres_route_ms:.3f} ms",
        ]


@dataclass(frozen=True)
class HandlerCosts:
    """Medians in ms of this implementation's handlers called in one process, with no gRPC, each
    daemon's part of a call started after ``idle_ms`` of idle (0: back to back)."""

    issuance_ms: float  # the child's AcceptDelegation, calling the parent's co-signing decision directly
    accept_local_ms: float  # a verifier's parse + verify_path (accept), PostgreSQL from the database's zone
    accept_route_ms: float  # the same, PostgreSQL from another zone
    idle_ms: float = 0.0

    def issuance_floor(self, raw: RawCosts) -> float:
        """The two handlers, one round trip to the child's signer and one across a route to the parent's."""
        return raw.grpc_local_ms + raw.grpc_route_ms + self.issuance_ms

    def verification_floor(self, raw: RawCosts, *, client_remote: bool, database_remote: bool) -> float:
        """One round trip to the verifier and its handler (whose store round trip it already includes)."""
        grpc_ms = raw.grpc_route_ms if client_remote else raw.grpc_local_ms
        return grpc_ms + (self.accept_route_ms if database_remote else self.accept_local_ms)

    def lines(self) -> list[str]:
        when = f"each part after {self.idle_ms:g} ms idle" if self.idle_ms else "back to back"
        return [
            f"{when}: both signers' issuance handlers {self.issuance_ms:.3f} ms",
            f"a verifier's accept of a depth-5 path {self.accept_local_ms:.3f} ms with the database in its zone,"
            f" {self.accept_route_ms:.3f} ms with the database a zone away",
        ]


def signature_lanes(signature_threads: int) -> int:
    """The lanes a verifier with ``signature_threads`` splits a depth-5 path's checks into, alone on this host."""
    return split_lanes(PATH_SIGNATURES, signature_threads, usable_cpus())


def measure_handlers(
    zoned: ZoneMesh,
    state_dir: Path,
    count: int = 300,
    signature_threads: int = VerifierConfig.signature_threads,
    idle_ms: float = 0.0,
) -> HandlerCosts:
    """This implementation's handlers in this process: the signers' on SQLite state in ``state_dir``
    (the disk the daemons' state is on), the verifier's on the zones' PostgreSQL schema through the
    forwarder routes the verifiers use, checking signatures as a verifier with ``signature_threads`` does.

    With ``idle_ms``, each daemon's part of a call starts after that long idle, as in the daemons,
    which wait while a call crosses the network (``in_process_issuance``)."""
    keys = zoned.local.deployer_keys
    signatures = signature_batch(signature_threads)
    idle_s = idle_ms / 1000
    try:
        return HandlerCosts(
            issuance_ms=in_process_issuance(count, state_dir, idle_s)["p50"] / 1000,
            accept_local_ms=accept_ms(zoned, DATABASE_ZONE, keys, count, signatures, idle_s),
            accept_route_ms=accept_ms(zoned, remote_zone(zoned), keys, count, signatures, idle_s),
            idle_ms=idle_ms,
        )
    finally:
        signatures.close()


def accept_ms(
    zoned: ZoneMesh,
    zone: str,
    keys: Mapping[str, Ed25519Signer],
    count: int,
    signatures: SignatureBatch = SERIAL,
    idle_s: float = 0.0,
) -> float:
    """A verifier's handler in accept mode (parse, every check, the consume) with the store a verifier
    in ``zone`` opens; fresh depth-5 paths, as ``zones measure`` presents to the daemons; each call
    after ``idle_s`` idle."""
    registry = SampleMesh(dict(keys)).registry
    presented = iter([(item.data, item.output) for item in signed_paths(keys, count + WARMUP, depth=5)])
    state = open_store(zoned.store_url(zone))

    def accept() -> None:
        data, output = next(presented)
        result = verify_path_bytes(
            data, output, registry=registry, state=state, mode=Mode.ACCEPT, now_ms=now_ms(), signatures=signatures
        )
        if not result:
            raise RuntimeError(f"a valid depth-5 path was rejected in process: {result}")

    try:
        return median_ms(accept, count, idle_s)
    finally:
        state.close()


def measure_raw(
    zoned: ZoneMesh, state_dir: Path, count: int = 300, signature_threads: int = VerifierConfig.signature_threads
) -> RawCosts:
    """Every raw cost, against the running zones (their routes carry the calibrated delay)."""
    key = nacl.signing.SigningKey.generate()
    message = os.urandom(650)  # about one record's canonical bytes
    signed = key.sign(message)
    return RawCosts(
        sign_ms=median_ms(lambda: key.sign(message), count * 5),
        verify_ms=median_ms(lambda: key.verify_key.verify(signed), count * 5),
        fsync_ms=fsync_ms(state_dir, count),
        grpc_local_ms=grpc_ms(zoned, from_zone="a", count=count),  # verifier-0 lives in zone-a
        grpc_route_ms=grpc_ms(zoned, from_zone="b", count=count),
        postgres_local_ms=postgres_ms(zoned, DATABASE_ZONE, count),
        postgres_route_ms=postgres_ms(zoned, remote_zone(zoned), count),
        signature_lanes=signature_lanes(signature_threads),
    )


def fsync_ms(directory: Path, count: int) -> float:
    """One 4 KiB write and ``fdatasync`` in place (a file that does not grow, as a reused WAL)."""
    with tempfile.NamedTemporaryFile(dir=directory) as handle:
        page = os.urandom(4096)
        handle.write(page * 64)
        handle.flush()
        os.fsync(handle.fileno())
        slots = itertools.count()

        def write_and_sync() -> None:
            os.pwrite(handle.fileno(), page, (next(slots) % 64) * 4096)
            os.fdatasync(handle.fileno())

        return median_ms(write_and_sync, count)


def grpc_ms(zoned: ZoneMesh, *, from_zone: str, count: int) -> float:
    """A health check to verifier-0 (zone-a) from ``from_zone``, over mTLS on a kept channel."""
    channel = open_channel(
        zoned.verifier_address(0, from_zone=from_zone), zoned.local.tls_for("client"), verifier_dns()
    )
    try:
        health = health_pb2_grpc.HealthStub(channel)
        return median_ms(lambda: health.Check(health_pb2.HealthCheckRequest(), timeout=5), count)
    finally:
        channel.close()


def postgres_ms(zoned: ZoneMesh, zone: str, count: int) -> float:
    """``SELECT 1`` over the connection a verifier in ``zone`` opens (its URL, the same forwarder route)."""
    conninfo, _, _ = parse_url(zoned.store_url(zone))
    with psycopg.connect(conninfo, autocommit=True) as connection:
        return median_ms(lambda: connection.execute("SELECT 1").fetchone(), count)
