"""The AWS KMS backend against a botocore Stubber under a real boto3 KMS client (see conftest.py).

These tests are offline: the Stubber answers before anything is sent, from a local Ed25519 key.
What they prove is the backend's own behaviour (requests, checks, error mapping, retries); that
real KMS returns what the stub returns is taken from the AWS documentation, not tested here.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ec import SECP256R1, generate_private_key
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from countersign.constructions import RecordFields, issue
from countersign.errors import SignerError, SignerUnavailable
from countersign.keys import Ed25519Signer, PublicKey, Signer, key_id_for
from countersign.reasons import Reason
from countersign.records import AgentRef, Construction, Path, Policy
from countersign.samples import SampleMesh
from countersign.state import InMemoryState
from countersign.verify import Mode, verify_path
from signer.backends import awskms, load_signer
from signer.backends.awskms import (
    MAX_RAW_MESSAGE_BYTES,
    AwsKmsSigner,
    ClientSettings,
    KmsRetryPolicy,
    MessageTooLarge,
)

pytestmark = pytest.mark.offline

ALIAS = "alias/countersign/signer/deployer-a"
NOW_MS = 1_800_000_000_000
OUTPUT = b"the exact bytes the leaf agent emitted"


def make_signer(kms: Any, sleeps: list[float], attempts: int = 3, key: str = ALIAS) -> AwsKmsSigner:
    return AwsKmsSigner(
        kms.client,
        key,
        retry=KmsRetryPolicy(attempts=attempts, base_backoff_s=0.05, max_backoff_s=1.0),
        sleep=sleeps.append,
    )


# --- construction ----------------------------------------------------------------------------------


def test_public_key_and_key_id_come_from_get_public_key_botocore_stub(
    stubbed_kms: Any, kms_key: Any, sleeps: list[float]
) -> None:
    signer = make_signer(stubbed_kms, sleeps)
    assert isinstance(signer, Signer)
    assert signer.public_key == kms_key.key.public_key
    assert signer.key_id == key_id_for(kms_key.key.public_key) == kms_key.key.key_id
    assert signer.key_arn == kms_key.arn
    assert stubbed_kms.calls == [("GetPublicKey", {"KeyId": ALIAS})]
    assert "ed25519:" in repr(signer)
    assert kms_key.arn in repr(signer)


@pytest.mark.parametrize(
    ("attribute", "value", "complaint"),
    [
        ("key_spec", "ECC_NIST_P256", "key spec ECC_NIST_P256"),
        ("key_usage", "ENCRYPT_DECRYPT", "key usage ENCRYPT_DECRYPT"),
        ("signing_algorithms", ("ED25519_PH_SHA_512",), "does not offer ED25519_SHA_512"),
    ],
)
def test_wrong_key_is_refused_at_construction_botocore_stub(
    stubbed_kms: Any, kms_key: Any, sleeps: list[float], attribute: str, value: Any, complaint: str
) -> None:
    setattr(kms_key, attribute, value)
    with pytest.raises(SignerError, match=complaint) as caught:
        make_signer(stubbed_kms, sleeps)
    assert type(caught.value) is SignerError
    assert stubbed_kms.count("Sign") == 0


def test_public_key_that_is_not_ed25519_is_refused_botocore_stub(
    stubbed_kms: Any, kms_key: Any, sleeps: list[float]
) -> None:
    p256 = generate_private_key(SECP256R1()).public_key()
    kms_key.der = p256.public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    with pytest.raises(SignerError, match="not an Ed25519 key"):
        make_signer(stubbed_kms, sleeps)
    kms_key.der = b"\x30\x03\x02\x01\x00"
    with pytest.raises(SignerError, match="not a DER SubjectPublicKeyInfo"):
        make_signer(stubbed_kms, sleeps)


# --- signing ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [1, 700, 2048, MAX_RAW_MESSAGE_BYTES])
def test_signature_is_pure_ed25519_over_the_raw_message_botocore_stub(
    stubbed_kms: Any, kms_key: Any, sleeps: list[float], size: int
) -> None:
    signer = make_signer(stubbed_kms, sleeps)
    message = bytes(range(256)) * (size // 256) + b"m" * (size % 256)
    signature = signer.sign(message)
    assert len(signature) == 64
    assert PublicKey(signer.public_key).verify(message, signature)
    # Ed25519 is deterministic: the same signature the key would make locally.
    assert signature == kms_key.key.sign(message)
    # The Stubber checked KeyId=ARN, MessageType=RAW, SigningAlgorithm=ED25519_SHA_512, Message=message.
    assert stubbed_kms.calls[-1][0] == "Sign"
    assert stubbed_kms.calls[-1][1]["KeyId"] == kms_key.arn


@pytest.mark.parametrize("size", [MAX_RAW_MESSAGE_BYTES + 1, 10_000])
def test_oversized_message_is_refused_without_calling_kms_botocore_stub(
    stubbed_kms: Any, sleeps: list[float], size: int
) -> None:
    signer = make_signer(stubbed_kms, sleeps)
    with pytest.raises(MessageTooLarge, match=f"{size} bytes exceeds the 4096-byte limit") as caught:
        signer.sign(b"x" * size)
    assert isinstance(caught.value, SignerError)
    assert not caught.value.retryable
    assert caught.value.size == size
    assert stubbed_kms.count("Sign") == 0


def test_empty_message_is_refused_botocore_stub(stubbed_kms: Any, sleeps: list[float]) -> None:
    signer = make_signer(stubbed_kms, sleeps)
    with pytest.raises(SignerError, match="at least 1 byte"):
        signer.sign(b"")
    assert stubbed_kms.count("Sign") == 0


def test_record_with_a_large_policy_exceeds_the_raw_limit_botocore_stub(stubbed_kms: Any, sleeps: list[float]) -> None:
    """Reachable in practice: 64 allowed children with long deployer ids make a >4 KB signing input."""
    signer = make_signer(stubbed_kms, sleeps)
    allowed = tuple(f"deployer-{i:02d}-" + "x" * 50 for i in range(64))
    fields = RecordFields(
        deployer="deployer-a",
        agent=AgentRef("agent-0", "system-1"),
        created_ms=NOW_MS - 1_000,
        expires_ms=NOW_MS + 60_000,
        policy=Policy(allowed_children=allowed),
    )
    with pytest.raises(MessageTooLarge):
        issue(Construction.SIGNED_DAG, fields, signer)
    assert stubbed_kms.count("Sign") == 0


@pytest.mark.parametrize(
    ("answer", "complaint"),
    [
        ({"Signature": bytes(64)}, "does not verify"),
        ({"Signature": b"\x01" * 63}, "no 64-byte signature"),
        ({"SigningAlgorithm": "ED25519_PH_SHA_512"}, "another signing algorithm"),
        ({"KeyId": "arn:aws:kms:eu-west-1:111122223333:key/other"}, "another key"),
    ],
)
def test_unusable_sign_answer_is_refused_botocore_stub(
    stubbed_kms: Any, sleeps: list[float], answer: dict[str, Any], complaint: str
) -> None:
    signer = make_signer(stubbed_kms, sleeps)
    stubbed_kms.answer("Sign", **answer)
    with pytest.raises(SignerError, match=complaint) as caught:
        signer.sign(b"a signing input")
    assert type(caught.value) is SignerError
    assert stubbed_kms.count("Sign") == 1


def test_signature_by_another_key_is_refused_botocore_stub(stubbed_kms: Any, kms_key: Any, sleeps: list[float]) -> None:
    """A misconfigured key (or an alias moved under us) signs validly, but not with our public key."""
    signer = make_signer(stubbed_kms, sleeps)
    message = b"a signing input"
    stubbed_kms.answer("Sign", Signature=Ed25519Signer.generate().sign(message))
    with pytest.raises(SignerError, match="does not verify under its public key"):
        signer.sign(message)


# --- error mapping and retries ---------------------------------------------------------------------


RETRYABLE = [
    ("ThrottlingException", 400),
    ("KMSInternalException", 500),
    ("DependencyTimeoutException", 503),
    ("KeyUnavailableException", 500),
    ("SomethingNew", 503),  # any 5xx
]
NOT_RETRYABLE = [
    ("AccessDeniedException", 400),
    ("DisabledException", 400),
    ("KMSInvalidStateException", 400),
    ("NotFoundException", 400),
    ("InvalidKeyUsageException", 400),
    ("InvalidGrantTokenException", 400),
    ("UnrecognizedClientException", 400),
    ("ValidationException", 400),
]


@pytest.mark.parametrize(("code", "status"), RETRYABLE)
def test_transient_sign_errors_are_retried_then_unavailable_botocore_stub(
    stubbed_kms: Any, sleeps: list[float], code: str, status: int
) -> None:
    signer = make_signer(stubbed_kms, sleeps, attempts=3)
    stubbed_kms.fail("Sign", code, status, times=3)
    with pytest.raises(SignerUnavailable, match=code) as caught:
        signer.sign(b"a signing input")
    assert caught.value.retryable
    assert "gave up after 3 attempts" in str(caught.value)
    assert stubbed_kms.count("Sign") == 3
    assert len(sleeps) == 2
    assert 0 <= sleeps[0] <= 0.05
    assert 0 <= sleeps[1] <= 0.1


@pytest.mark.parametrize(("code", "status"), NOT_RETRYABLE)
def test_permanent_sign_errors_are_not_retried_botocore_stub(
    stubbed_kms: Any, sleeps: list[float], code: str, status: int
) -> None:
    signer = make_signer(stubbed_kms, sleeps, attempts=3)
    stubbed_kms.fail("Sign", code, status, "no")
    with pytest.raises(SignerError, match=code) as caught:
        signer.sign(b"a signing input")
    assert type(caught.value) is SignerError
    assert not caught.value.retryable
    assert stubbed_kms.count("Sign") == 1
    assert sleeps == []


def test_throttling_is_retried_then_succeeds_botocore_stub(stubbed_kms: Any, kms_key: Any, sleeps: list[float]) -> None:
    signer = make_signer(stubbed_kms, sleeps, attempts=3)
    stubbed_kms.fail("Sign", "ThrottlingException", times=2)
    message = b"a signing input"
    assert signer.sign(message) == kms_key.key.sign(message)
    assert stubbed_kms.count("Sign") == 3
    assert len(sleeps) == 2


def test_access_denied_is_not_retried_and_names_the_policy_botocore_stub(stubbed_kms: Any, sleeps: list[float]) -> None:
    signer = make_signer(stubbed_kms, sleeps, attempts=5)
    stubbed_kms.fail("Sign", "AccessDeniedException", 400, "not authorized to perform kms:Sign")
    with pytest.raises(SignerError, match="key policy allows it kms:Sign") as caught:
        signer.sign(b"a signing input")
    assert not caught.value.retryable
    assert stubbed_kms.count("Sign") == 1


def test_disabled_key_botocore_stub(stubbed_kms: Any, sleeps: list[float]) -> None:
    signer = make_signer(stubbed_kms, sleeps)
    stubbed_kms.fail("Sign", "DisabledException", 400, "key is disabled")
    with pytest.raises(SignerError, match="DisabledException: key is disabled") as caught:
        signer.sign(b"a signing input")
    assert not caught.value.retryable
    # A key disabled before start-up: GetPublicKey fails the same way and no signer is built.
    stubbed_kms.fail("GetPublicKey", "DisabledException", 400, "key is disabled")
    with pytest.raises(SignerError, match="DisabledException"):
        make_signer(stubbed_kms, sleeps)


def test_get_public_key_throttled_then_succeeds_botocore_stub(
    stubbed_kms: Any, kms_key: Any, sleeps: list[float]
) -> None:
    stubbed_kms.fail("GetPublicKey", "ThrottlingException")
    signer = make_signer(stubbed_kms, sleeps)
    assert signer.public_key == kms_key.key.public_key
    assert stubbed_kms.count("GetPublicKey") == 2


def test_unknown_key_at_construction_botocore_stub(stubbed_kms: Any, sleeps: list[float]) -> None:
    stubbed_kms.fail("GetPublicKey", "NotFoundException", 400, "Alias is not found.")
    with pytest.raises(SignerError, match="NotFoundException") as caught:
        make_signer(stubbed_kms, sleeps)
    assert not caught.value.retryable
    assert stubbed_kms.count("GetPublicKey") == 1


def test_single_attempt_policy_does_not_retry_botocore_stub(stubbed_kms: Any, sleeps: list[float]) -> None:
    signer = make_signer(stubbed_kms, sleeps, attempts=1)
    stubbed_kms.fail("Sign", "ThrottlingException")
    with pytest.raises(SignerUnavailable):
        signer.sign(b"a signing input")
    assert stubbed_kms.count("Sign") == 1
    assert sleeps == []


def test_errors_never_carry_the_message_botocore_stub(
    stubbed_kms: Any, sleeps: list[float], caplog: pytest.LogCaptureFixture
) -> None:
    signer = make_signer(stubbed_kms, sleeps, attempts=2)
    secret = b"SECRET-RECORD-CONTENT-0123456789"
    stubbed_kms.fail("Sign", "ThrottlingException")
    stubbed_kms.fail("Sign", "AccessDeniedException")
    with caplog.at_level("DEBUG", logger="signer.backends.awskms"), pytest.raises(SignerError) as caught:
        signer.sign(secret)
    encoded = base64.b64encode(secret).decode()
    for text in (str(caught.value), caplog.text):
        assert secret.decode() not in text
        assert encoded not in text
        assert "testing" not in text  # the (fake) credentials
    assert "retrying" in caplog.text


# --- the project's verifier accepts what KMS signed ------------------------------------------------


def test_signed_dag_path_with_kms_deployers_is_accepted_botocore_stub(
    new_kms_key: Any, stub_kms: Any, sleeps: list[float]
) -> None:
    kms_a = stub_kms(new_kms_key(key_uuid="aaaaaaaa-0000-0000-0000-000000000001"))
    kms_c = stub_kms(new_kms_key(key_uuid="cccccccc-0000-0000-0000-000000000003"))
    signer_a = make_signer(kms_a, sleeps, key="alias/deployer-a")
    signer_c = make_signer(kms_c, sleeps, key="alias/deployer-c")
    # The registry is built from the signers' public keys, as an operator enrols a KMS key.
    mesh = SampleMesh({"deployer-a": signer_a, "deployer-b": Ed25519Signer.generate(), "deployer-c": signer_c})  # type: ignore[dict-item]
    route = ["deployer-a", "deployer-b", "deployer-c", "deployer-a"]
    path = mesh.issue_path(Construction.SIGNED_DAG, route, OUTPUT, now_ms=NOW_MS)

    # A signed primaries at 0 and 3 and co-signed as parent (edge 0->1) and child (edge 2->3);
    # C signed its primary and co-signed as child (edge 1->2) and as parent (edge 2->3).
    assert kms_a.count("Sign") == 4
    assert kms_c.count("Sign") == 3
    assert path.envelopes[0].key_id == signer_a.key_id
    assert path.envelopes[2].key_id == signer_c.key_id

    state = InMemoryState()
    audit = verify_path(path, OUTPUT, registry=mesh.registry, state=state, mode=Mode.AUDIT, now_ms=NOW_MS)
    assert audit, audit
    result = verify_path(path, OUTPUT, registry=mesh.registry, state=state, mode=Mode.ACCEPT, now_ms=NOW_MS)
    assert result, result

    # Round trip through the wire format changes nothing.
    reparsed = Path.from_bytes(path.to_bytes())
    again = verify_path(reparsed, OUTPUT, registry=mesh.registry, state=InMemoryState(), mode=Mode.AUDIT, now_ms=NOW_MS)
    assert again, again


def test_tampered_kms_signed_record_is_rejected_botocore_stub(stubbed_kms: Any, sleeps: list[float]) -> None:
    signer_a = make_signer(stubbed_kms, sleeps, key="alias/deployer-a")
    mesh = SampleMesh({"deployer-a": signer_a, "deployer-b": Ed25519Signer.generate()})  # type: ignore[dict-item]
    path = mesh.issue_path(Construction.SIGNED_DAG, ["deployer-b", "deployer-a"], OUTPUT, now_ms=NOW_MS)
    body = json.loads(path.to_bytes())

    # The leaf (signed through KMS) claims another agent instance.
    tampered = json.loads(json.dumps(body))
    tampered["envelopes"][1]["record"]["agent"]["instance"] = "agent-evil"
    result = verify_path(
        Path.from_json(tampered), OUTPUT, registry=mesh.registry, state=InMemoryState(), mode=Mode.AUDIT, now_ms=NOW_MS
    )
    assert not result
    assert result.reason is Reason.BAD_SIGNATURE
    assert result.index == 1

    # A different output under the untouched KMS-signed record.
    result = verify_path(
        Path.from_json(body),
        b"substituted",
        registry=mesh.registry,
        state=InMemoryState(),
        mode=Mode.AUDIT,
        now_ms=NOW_MS,
    )
    assert not result
    assert result.reason is Reason.OUTPUT_MISMATCH


# --- URI, client configuration, load_signer --------------------------------------------------------


def test_load_signer_builds_the_kms_signer_from_the_uri_botocore_stub(
    monkeypatch: pytest.MonkeyPatch, kms_key: Any, stub_kms: Any
) -> None:
    built: list[tuple[ClientSettings, Any]] = []
    real_factory = awskms.new_kms_client

    def stubbed_factory(settings: ClientSettings) -> Any:
        kms = stub_kms(kms_key, real_factory(settings))  # the real client, then the stub below it
        built.append((settings, kms))
        return kms.client

    monkeypatch.setattr(awskms, "new_kms_client", stubbed_factory)
    signer = load_signer(f"awskms:{kms_key.arn}?connect_timeout=1.5&read_timeout=3&sdk_max_attempts=4&attempts=2")
    assert isinstance(signer, AwsKmsSigner)
    assert signer.key_id == kms_key.key.key_id
    settings, kms = built[0]
    assert settings.region == kms_key.region  # from the ARN
    config = kms.client.meta.config
    assert kms.client.meta.region_name == kms_key.region
    assert config.connect_timeout == 1.5
    assert config.read_timeout == 3.0
    assert config.retries == {"mode": "standard", "total_max_attempts": 4}
    message = b"signed through load_signer"
    assert PublicKey(signer.public_key).verify(message, signer.sign(message))


def test_client_configuration_is_explicit() -> None:
    client = awskms.new_kms_client(
        ClientSettings(region="us-east-2", endpoint_url="http://127.0.0.1:4566", connect_timeout_s=1, read_timeout_s=2)
    )
    assert client.meta.region_name == "us-east-2"
    assert client.meta.endpoint_url == "http://127.0.0.1:4566"
    assert client.meta.config.retries == {"mode": "standard", "total_max_attempts": 2}
    assert client.meta.config.connect_timeout == 1
    assert client.meta.config.read_timeout == 2


def test_no_region_is_a_clear_error() -> None:
    with pytest.raises(SignerError, match="no AWS region"):
        awskms.new_kms_client(ClientSettings())


@pytest.mark.parametrize(
    ("location", "key", "region", "endpoint"),
    [
        (
            "1234abcd-12ab-34cd-56ef-1234567890ab?region=eu-west-1",
            "1234abcd-12ab-34cd-56ef-1234567890ab",
            "eu-west-1",
            None,
        ),
        ("alias/countersign/signer/a?region=us-east-1", "alias/countersign/signer/a", "us-east-1", None),
        (
            "arn:aws:kms:eu-central-1:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab",
            "arn:aws:kms:eu-central-1:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab",
            "eu-central-1",
            None,
        ),
        (
            "arn:aws:kms:eu-central-1:111122223333:alias/a?region=eu-west-1&endpoint_url=https://vpce-1.kms.eu-west-1.vpce.amazonaws.com",
            "arn:aws:kms:eu-central-1:111122223333:alias/a",
            "eu-west-1",
            "https://vpce-1.kms.eu-west-1.vpce.amazonaws.com",
        ),
        ("alias/a?endpoint_url=http://localhost:4566", "alias/a", None, "http://localhost:4566"),
    ],
)
def test_uri_parsing(location: str, key: str, region: str | None, endpoint: str | None) -> None:
    uri = awskms.parse_uri(location)
    assert uri.key == key
    assert uri.settings.region == region
    assert uri.settings.endpoint_url == endpoint


def test_uri_retry_parameters() -> None:
    uri = awskms.parse_uri("alias/a?attempts=4&backoff_ms=20&max_backoff_ms=400&sdk_max_attempts=1")
    assert uri.retry == KmsRetryPolicy(attempts=4, base_backoff_s=0.02, max_backoff_s=0.4)
    assert uri.settings.sdk_max_attempts == 1


@pytest.mark.parametrize(
    ("location", "complaint"),
    [
        ("", "expected awskms:"),
        ("?region=eu-west-1", "expected awskms:"),
        ("alias/with space", "expected awskms:"),
        ("alias/a?colour=blue", "unknown parameter 'colour'"),
        ("alias/a?region=eu-west-1&region=us-east-1", "given twice"),
        ("alias/a?region=", "is empty"),
        ("alias/a?region", "cannot parse"),
        ("alias/a?attempts=many", "invalid value"),
        ("alias/a?attempts=0", "attempts must be"),
        ("alias/a?read_timeout=0", "timeouts must be"),
        ("alias/a?endpoint_url=ftp://example.com", "http\\(s\\) URL"),
        ("alias/a?endpoint_url=http://kms.example.com", "only on loopback"),
        ("alias/a?backoff_ms=500&max_backoff_ms=100", "backoff_ms"),
    ],
)
def test_bad_uris_are_refused(location: str, complaint: str) -> None:
    with pytest.raises(SignerError, match=complaint):
        awskms.parse_uri(location)


def test_load_signer_reports_bad_uri() -> None:
    with pytest.raises(SignerError, match="unknown parameter"):
        load_signer("awskms:alias/a?regoin=eu-west-1")
