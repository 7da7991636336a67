"""A dishonest coordinator for tests: a gRPC proxy in front of a real coordinator that lies on demand.

It holds no operator key, so it can only do what a compromised coordinator host can: accept a
statement and not serve it (withhold), serve an old checkpoint in place of the newest (freeze), or
drop heartbeats. Honest until a test switches a mode on. Test-only: the product has no such flag.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent import futures

import grpc

from countersign._proto.v1 import coordinator_pb2, coordinator_pb2_grpc
from countersign.admission import SignedStatement


class DishonestCoordinator(coordinator_pb2_grpc.CoordinatorServicer):
    def __init__(self, upstream: str) -> None:
        self._channel = grpc.insecure_channel(upstream)
        self._stub = coordinator_pb2_grpc.CoordinatorStub(self._channel)
        self.withhold: Callable[[SignedStatement], bool] = lambda signed: False
        self.withheld: list[SignedStatement] = []
        self.frozen_checkpoint: bytes | None = None  # served in place of any newer checkpoint
        self.drop_heartbeats = threading.Event()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=32))
        coordinator_pb2_grpc.add_CoordinatorServicer_to_server(self, self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def freeze_checkpoint(self) -> bytes:
        """From now on serve the checkpoint served now, whatever the operator submits later."""
        served = self._stub.GetLog(coordinator_pb2.GetLogRequest(from_sequence=1 << 62), timeout=5).checkpoint
        assert served, "nothing to freeze: the coordinator serves no checkpoint yet"
        self.frozen_checkpoint = served
        return served

    def close(self) -> None:
        self._server.stop(grace=None)
        self._channel.close()

    def _checkpoint(self, served: bytes) -> bytes:
        return self.frozen_checkpoint if self.frozen_checkpoint is not None else served

    # --- the service ---------------------------------------------------------------------------

    def Submit(
        self, request: coordinator_pb2.SubmitRequest, context: grpc.ServicerContext
    ) -> coordinator_pb2.SubmitResponse:
        signed = SignedStatement.from_bytes(request.statement)
        if self.withhold(signed):
            # "Stored": answer exactly what an honest coordinator would, and serve nothing of it.
            self.withheld.append(signed)
            return coordinator_pb2.SubmitResponse(sequence=signed.statement.sequence, head_digest=signed.digest())
        response: coordinator_pb2.SubmitResponse = self._stub.Submit(request, timeout=10)
        return response

    def SubmitCheckpoint(
        self, request: coordinator_pb2.SubmitCheckpointRequest, context: grpc.ServicerContext
    ) -> coordinator_pb2.SubmitCheckpointResponse:
        response: coordinator_pb2.SubmitCheckpointResponse = self._stub.SubmitCheckpoint(request, timeout=10)
        return response

    def GetLog(
        self, request: coordinator_pb2.GetLogRequest, context: grpc.ServicerContext
    ) -> coordinator_pb2.GetLogResponse:
        response: coordinator_pb2.GetLogResponse = self._stub.GetLog(request, timeout=10)
        response.checkpoint = self._checkpoint(response.checkpoint)
        return response

    def Watch(
        self, request: coordinator_pb2.WatchRequest, context: grpc.ServicerContext
    ) -> Iterator[coordinator_pb2.WatchEvent]:
        upstream = self._stub.Watch(request)
        context.add_callback(upstream.cancel)
        try:
            for event in upstream:
                if event.HasField("heartbeat"):
                    if self.drop_heartbeats.is_set():
                        continue
                    event.heartbeat.checkpoint = self._checkpoint(event.heartbeat.checkpoint)
                yield event
        except grpc.RpcError:
            return  # the follower went away (its cancel reached upstream) or upstream ended
