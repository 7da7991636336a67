"""The AWS KMS backend when KMS cannot be reached: real HTTP to loopback, no emulator, no AWS."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest

from countersign.errors import SignerUnavailable
from signer.backends import load_signer
from signer.backends.awskms import AwsKmsSigner, ClientSettings, KmsRetryPolicy, new_kms_client

pytestmark = pytest.mark.daemons  # listeners on loopback


def count_http_requests(client: Any) -> list[str]:
    sent: list[str] = []
    client.meta.events.register("before-send.kms.*", lambda request, **_: sent.append(request.url))
    return sent


@pytest.fixture
def silent_listener() -> Iterator[int]:
    """A loopback port that accepts connections (kernel backlog) and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield sock.getsockname()[1]


def test_refused_connection_is_unavailable_after_bounded_retries(unused_port: int) -> None:
    settings = ClientSettings(
        region="eu-west-1", endpoint_url=f"http://127.0.0.1:{unused_port}", connect_timeout_s=1, sdk_max_attempts=2
    )
    client = new_kms_client(settings)
    sent = count_http_requests(client)
    sleeps: list[float] = []
    with pytest.raises(SignerUnavailable, match="EndpointConnectionError") as caught:
        AwsKmsSigner(client, "alias/a", retry=KmsRetryPolicy(attempts=2), sleep=sleeps.append)
    assert caught.value.retryable
    # 2 backend attempts x 2 botocore attempts each
    assert len(sent) == 4
    assert len(sleeps) == 1


def test_read_timeout_is_unavailable(silent_listener: int) -> None:
    settings = ClientSettings(
        region="eu-west-1", endpoint_url=f"http://127.0.0.1:{silent_listener}", read_timeout_s=0.3, sdk_max_attempts=1
    )
    client = new_kms_client(settings)
    sent = count_http_requests(client)
    with pytest.raises(SignerUnavailable, match="ReadTimeoutError"):
        AwsKmsSigner(client, "alias/a", retry=KmsRetryPolicy(attempts=1))
    assert len(sent) == 1


def test_load_signer_against_unreachable_endpoint_is_unavailable(unused_port: int) -> None:
    uri = f"awskms:alias/a?region=eu-west-1&endpoint_url=http://127.0.0.1:{unused_port}&sdk_max_attempts=1&attempts=1"
    with pytest.raises(SignerUnavailable):
        load_signer(uri)
