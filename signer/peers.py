"""Co-signing lanes from this signer to the parents' signers, on kept channels.

A child's signer asks a parent's signer for every cross-deployer edge: one mTLS channel per parent
signer (one TLS handshake, not one per edge), carrying up to ``lanes_per_peer`` co-signing lanes
(docs/adr/0008-lanes.md).
"""

from __future__ import annotations

import threading
from typing import Protocol

import grpc

from countersign._proto.v1 import signer_pb2, signer_pb2_grpc
from countersign.client.lanes import Lanes, unary
from countersign.client.tls import TlsConfig, open_channel, signer_dns

CoSignLanes = Lanes[signer_pb2.CoSignEdgeRequest, signer_pb2.CoSignEdgeResponse]


class CoSigningLane(Protocol):
    """Where a child's signer sends an edge to be co-signed: raises ``ServiceError`` as a call would."""

    def ask(self, request: signer_pb2.CoSignEdgeRequest, timeout_s: float) -> signer_pb2.CoSignEdgeResponse: ...

    def close(self) -> None: ...


class Peers(Protocol):
    """The parents' signers as the servicer sees them (:class:`PeerPool`, or an in-process stand-in
    such as the issuance benchmark's)."""

    def lanes(self, address: str, deployer: str) -> CoSigningLane: ...

    def forget(self, address: str, deployer: str, lanes: CoSigningLane) -> None: ...

    def close(self) -> None: ...


class PeerPool:
    """One kept channel and its co-signing lanes per (address, parent deployer)."""

    def __init__(self, tls: TlsConfig, lanes_per_peer: int, lane_idle_s: float) -> None:
        self._tls = tls
        self._lanes_per_peer = lanes_per_peer
        self._lane_idle_s = lane_idle_s
        self._peers: dict[tuple[str, str], tuple[grpc.Channel, CoSignLanes]] = {}
        self._lock = threading.Lock()

    def lanes(self, address: str, deployer: str) -> CoSignLanes:
        """Co-signing lanes to ``deployer``'s signer at ``address`` (its certificate must name it)."""
        with self._lock:
            peer = self._peers.get((address, deployer))
            if peer is None:
                channel = open_channel(address, self._tls, signer_dns(deployer))
                stub = signer_pb2_grpc.SignerStub(channel)
                lanes: CoSignLanes = Lanes(
                    stub.CoSignEdges, self._lanes_per_peer, self._lane_idle_s, unary(stub.CoSignEdge)
                )
                peer = self._peers[(address, deployer)] = (channel, lanes)
            return peer[1]

    def forget(self, address: str, deployer: str, lanes: CoSigningLane) -> None:
        """Drop the kept channel after UNAVAILABLE: a channel that saw its peer go away waits out
        gRPC's reconnect backoff (growing to minutes), so the next delegation dials afresh instead.
        The dropped channel is not closed here (edges still in flight on it would be cancelled); its
        idle lanes are, and it is freed when the rest finish."""
        with self._lock:
            peer = self._peers.get((address, deployer))
            if peer is not None and peer[1] is lanes:
                del self._peers[(address, deployer)]
        lanes.close()

    def close(self) -> None:
        with self._lock:
            for channel, lanes in self._peers.values():
                lanes.close()
                channel.close()
            self._peers.clear()
