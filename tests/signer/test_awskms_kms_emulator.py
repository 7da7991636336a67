"""The AWS KMS backend over real HTTP against moto in server mode: an emulator, not AWS.

moto 5.2.5 cannot create ``ECC_NIST_EDWARDS25519`` keys, so nothing here signs. What the emulator
adds to the stub tests is the real wire: the backend's client configuration, request signing,
JSON protocol and error parsing, and botocore's retry layer, for the calls moto does support.
"""

from __future__ import annotations

from typing import Any

import pytest

from countersign.errors import SignerError
from signer.backends import load_signer
from signer.backends.awskms import AwsKmsSigner, ClientSettings, KmsRetryPolicy, new_kms_client

pytestmark = pytest.mark.daemons  # moto in server mode, a process on loopback


def emulator_client(url: str) -> Any:
    return new_kms_client(ClientSettings(region="us-east-1", endpoint_url=url, sdk_max_attempts=3))


def count_http_requests(client: Any) -> list[str]:
    sent: list[str] = []
    client.meta.events.register("before-send.kms.*", lambda request, **_: sent.append(request.url))
    return sent


def test_emulator_cannot_create_ed25519_keys_kms_emulator(kms_emulator_url: str) -> None:
    """Records why the Ed25519 tests use a Stubber: if this starts failing, moto gained Ed25519."""
    client = emulator_client(kms_emulator_url)
    with pytest.raises(client.exceptions.ClientError, match="ECC_NIST_EDWARDS25519"):
        client.create_key(KeySpec="ECC_NIST_EDWARDS25519", KeyUsage="SIGN_VERIFY")


def test_non_ed25519_signing_key_is_refused_kms_emulator(kms_emulator_url: str) -> None:
    client = emulator_client(kms_emulator_url)
    arn = client.create_key(KeySpec="ECC_NIST_P256", KeyUsage="SIGN_VERIFY")["KeyMetadata"]["Arn"]
    client.create_alias(AliasName="alias/p256-signer", TargetKeyId=arn)
    for location in (arn, "alias/p256-signer?region=us-east-1"):
        with pytest.raises(SignerError, match="key spec ECC_NIST_P256; Countersign needs ECC_NIST_EDWARDS25519"):
            load_signer(f"awskms:{location}{'&' if '?' in location else '?'}endpoint_url={kms_emulator_url}")


def test_unknown_key_is_not_found_and_not_retried_kms_emulator(kms_emulator_url: str) -> None:
    client = emulator_client(kms_emulator_url)
    sent = count_http_requests(client)
    with pytest.raises(SignerError, match="NotFoundException") as caught:
        AwsKmsSigner(client, "alias/no-such-key", retry=KmsRetryPolicy(attempts=3), sleep=lambda _: None)
    assert not caught.value.retryable
    assert len(sent) == 1  # neither botocore nor the backend retried


def test_wrong_key_usage_is_refused_kms_emulator(kms_emulator_url: str) -> None:
    client = emulator_client(kms_emulator_url)
    arn = client.create_key(KeySpec="RSA_2048", KeyUsage="ENCRYPT_DECRYPT")["KeyMetadata"]["Arn"]
    with pytest.raises(SignerError, match="key spec RSA_2048"):
        AwsKmsSigner(client, arn)
