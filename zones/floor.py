"""This host's raw costs, measured in the same run as ``zones measure``, and the floor they set.

The published figures came from other machines. A latency measured here moves with this host (one
VM's loopback mTLS round trip was 0.39 ms one day and 0.81 ms the next), so the report puts each
figure beside what any implementation of the same protocol pays on this host, in this run:

* the signatures a call must make and check (PyNaCl, as the daemons use);
* one ``fdatasync`` of 4 KiB in the directory the signers' state lives in (a spent grant and a
  consumed nonce are synced before the answer);
* one mTLS gRPC round trip (a health check) inside a zone and across an inter-zone route;
* one PostgreSQL round trip (``SELECT 1``) from a verifier's zone, local and across a route.

A floor is the sum of the raw costs a call cannot avoid; ``measured ÷ floor`` says what the daemons
add on top, and compares across hosts where the absolute figure does not.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import nacl.signing
import psycopg
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.mesh import timed
from countersign.service.tls import open_channel, verifier_dns
from verifier.stores.postgres import parse_url
from zones.mesh import ZoneMesh

# What each measured call cannot avoid (see docs/zones.md, "Raw costs and floors"):
# issuance: the child co-signs, the parent checks that and co-signs, the child checks the parent's
# co-signature and seals the record (3 signs, 2 checks); the parent syncs the spent grant.
ISSUANCE_SIGNS, ISSUANCE_CHECKS = 3, 2
# full verification of a depth-5 SIGNED-DAG path: 5 record signatures + 4 edges x 2 co-signatures.
PATH_SIGNATURES = 13


def median_ms(call: Callable[[], object], count: int) -> float:
    return timed(call, count, warmup=10)["p50"] / 1000


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

    def issuance_floor(self) -> float:
        """The child's runtime and signer in one zone, the parent's signer across a route."""
        crypto = ISSUANCE_SIGNS * self.sign_ms + ISSUANCE_CHECKS * self.verify_ms
        return self.grpc_local_ms + self.grpc_route_ms + crypto + self.fsync_ms

    def verification_floor(self, *, client_remote: bool, database_remote: bool) -> float:
        """One call to the verifier, its signature checks, one round trip to the store and its commit."""
        grpc_ms = self.grpc_route_ms if client_remote else self.grpc_local_ms
        store_ms = self.postgres_route_ms if database_remote else self.postgres_local_ms
        return grpc_ms + PATH_SIGNATURES * self.verify_ms + store_ms + self.fsync_ms

    def lines(self) -> list[str]:
        return [
            f"Ed25519 sign {self.sign_ms * 1000:.0f} µs, verify {self.verify_ms * 1000:.0f} µs (PyNaCl)",
            f"fdatasync of 4 KiB in the state directory {self.fsync_ms:.3f} ms",
            f"mTLS gRPC round trip (health check) in one zone {self.grpc_local_ms:.3f} ms,"
            f" across a route {self.grpc_route_ms:.3f} ms",
            f"PostgreSQL round trip (a one-row query) from the database's zone {self.postgres_local_ms:.3f} ms,"
            f" from another zone {self.postgres_route_ms:.3f} ms",
        ]


def measure_raw(zoned: ZoneMesh, state_dir: Path, count: int = 300) -> RawCosts:
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
        postgres_local_ms=postgres_ms(zoned, "a", count),  # the database's zone
        postgres_route_ms=postgres_ms(zoned, "b", count),
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
