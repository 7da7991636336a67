"""Fixtures for the AWS KMS backend tests.

moto 5.2.5 has no ``ECC_NIST_EDWARDS25519`` keys (its CreateKey answers ValidationException), so the
Ed25519 tests put a :class:`botocore.stub.Stubber` under a real boto3 KMS client: the backend's code
path is the one it runs against AWS (the client validates and serialises every request), and only
the answers come from a local Ed25519 key instead of KMS. The stub does not exercise HTTP, SigV4 or
botocore's own retries; the emulator and transport tests cover those parts that moto can.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from countersign.keys import Ed25519Signer
from tests.ports import free_port

boto3 = pytest.importorskip("boto3")
stub = pytest.importorskip("botocore.stub")

REGION = "eu-west-1"
ACCOUNT = "111122223333"

# Test modules reach these helpers through fixtures, never by importing this file, so they work
# whether or not tests/ and tests/signer/ are packages.


@pytest.fixture(autouse=True)
def isolated_aws_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """Fake credentials, no shared config, no instance metadata: nothing can reach real AWS."""
    for name in (
        "AWS_PROFILE",
        "AWS_DEFAULT_PROFILE",
        "AWS_REGION",
        "AWS_DEFAULT_REGION",
        "AWS_SESSION_TOKEN",
        "AWS_SECURITY_TOKEN",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_KMS",
        "AWS_MAX_ATTEMPTS",
        "AWS_RETRY_MODE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_ROLE_ARN",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))


@dataclass
class LocalKmsKey:
    """What a KMS key looks like from outside, backed by a local Ed25519 key."""

    key: Ed25519Signer = field(default_factory=Ed25519Signer.generate)
    key_uuid: str = "1234abcd-12ab-34cd-56ef-1234567890ab"
    key_spec: str = "ECC_NIST_EDWARDS25519"
    key_usage: str = "SIGN_VERIFY"
    signing_algorithms: tuple[str, ...] = ("ED25519_SHA_512", "ED25519_PH_SHA_512")
    der: bytes | None = None
    region: str = REGION

    @property
    def arn(self) -> str:
        return f"arn:aws:kms:{self.region}:{ACCOUNT}:key/{self.key_uuid}"

    def public_key_der(self) -> bytes:
        """What GetPublicKey returns: a DER SubjectPublicKeyInfo."""
        if self.der is not None:
            return self.der
        public = Ed25519PublicKey.from_public_bytes(self.key.public_key)
        return public.public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)


@dataclass(frozen=True)
class Fail:
    """A planned error answer."""

    code: str
    status: int = 400
    message: str = "planned failure"


class StubbedKms:
    """A real boto3 KMS client whose answers come from a Stubber, computed per call.

    Each call first takes the next planned outcome of its operation (default: the honest answer),
    queues it on the Stubber together with the exact parameters the call must carry, and lets the
    client go on; the Stubber then checks the parameters and answers. ``calls`` records every call.
    A plan entry is a :class:`Fail` or a dict merged into the honest answer.
    """

    def __init__(self, client: Any, key: LocalKmsKey) -> None:
        self.client = client
        self.key = key
        self.stubber = stub.Stubber(client)
        self.plan: dict[str, list[Fail | dict[str, Any]]] = {"GetPublicKey": [], "Sign": []}
        self.calls: list[tuple[str, dict[str, Any]]] = []
        events = client.meta.events
        events.register_first("provide-client-params.kms.GetPublicKey", self._on_get_public_key)
        events.register_first("provide-client-params.kms.Sign", self._on_sign)
        self.stubber.activate()

    def fail(
        self, operation: str, code: str, status: int = 400, message: str = "planned failure", times: int = 1
    ) -> None:
        """Answer the next ``times`` calls of ``operation`` with the error ``code``."""
        self.plan[operation].extend([Fail(code, status, message)] * times)

    def answer(self, operation: str, **overrides: Any) -> None:
        """Answer the next call of ``operation`` honestly, except for ``overrides``."""
        self.plan[operation].append(overrides)

    def count(self, operation: str) -> int:
        return sum(1 for name, _ in self.calls if name == operation)

    def _next(self, operation: str) -> Fail | dict[str, Any]:
        planned = self.plan[operation]
        return planned.pop(0) if planned else {}

    def _answer(
        self, method: str, outcome: Fail | dict[str, Any], honest: dict[str, Any], params: dict[str, Any]
    ) -> None:
        if isinstance(outcome, Fail):
            self.stubber.add_client_error(
                method,
                service_error_code=outcome.code,
                service_message=outcome.message,
                http_status_code=outcome.status,
                expected_params=params,
            )
        else:
            self.stubber.add_response(method, {**honest, **outcome}, expected_params=params)

    def _on_get_public_key(self, params: dict[str, Any], **_: Any) -> None:
        self.calls.append(("GetPublicKey", dict(params)))
        honest = {
            "KeyId": self.key.arn,
            "PublicKey": self.key.public_key_der(),
            "CustomerMasterKeySpec": self.key.key_spec,
            "KeySpec": self.key.key_spec,
            "KeyUsage": self.key.key_usage,
            "SigningAlgorithms": list(self.key.signing_algorithms),
        }
        self._answer("get_public_key", self._next("GetPublicKey"), honest, dict(params))

    def _on_sign(self, params: dict[str, Any], **_: Any) -> None:
        self.calls.append(("Sign", dict(params)))
        message = params["Message"]
        honest = {
            "KeyId": self.key.arn,
            "Signature": self.key.key.sign(message),
            "SigningAlgorithm": params["SigningAlgorithm"],
        }
        # The exact request a real KMS would receive: pure Ed25519 over the raw message, by key ARN.
        expected = {
            "KeyId": self.key.arn,
            "Message": message,
            "MessageType": "RAW",
            "SigningAlgorithm": "ED25519_SHA_512",
        }
        self._answer("sign", self._next("Sign"), honest, expected)


@pytest.fixture
def kms_key() -> LocalKmsKey:
    return LocalKmsKey()


@pytest.fixture
def new_kms_key() -> Callable[..., LocalKmsKey]:
    """Makes further keys: ``new_kms_key(key_uuid=..., key_spec=...)``."""
    return LocalKmsKey


@pytest.fixture
def stub_kms() -> Iterator[Callable[..., StubbedKms]]:
    """``stub_kms(key, client=None)``: a Stubber under ``client``, by default a client built by the
    backend's own factory (its real configuration)."""
    from signer.backends.awskms import ClientSettings, new_kms_client

    made: list[StubbedKms] = []

    def make(key: LocalKmsKey, client: Any = None) -> StubbedKms:
        kms = StubbedKms(client if client is not None else new_kms_client(ClientSettings(region=key.region)), key)
        made.append(kms)
        return kms

    yield make
    for kms in made:
        kms.stubber.deactivate()


@pytest.fixture
def stubbed_kms(kms_key: LocalKmsKey, stub_kms: Callable[..., StubbedKms]) -> StubbedKms:
    return stub_kms(kms_key)


@pytest.fixture
def sleeps() -> list[float]:
    """Records the backend's backoff sleeps instead of sleeping."""
    return []


@pytest.fixture
def unused_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    return free_port()


@pytest.fixture(scope="module")
def kms_emulator_url() -> Iterator[str]:
    """moto in server mode on a free loopback port: a real HTTP endpoint (an emulator, not AWS)."""
    server_module = pytest.importorskip("moto.server")
    port = free_port()
    server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()
