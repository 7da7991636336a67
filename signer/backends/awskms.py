"""AWS KMS: Ed25519 signatures made inside KMS; the private key never leaves it.

``awskms:<key id | key ARN | alias/name | alias ARN>[?param=value&...]`` names an asymmetric KMS key
with key spec ``ECC_NIST_EDWARDS25519`` and key usage ``SIGN_VERIFY``. The backend signs with
``SigningAlgorithm=ED25519_SHA_512`` and ``MessageType=RAW``: pure Ed25519 (RFC 8032) over the exact
signing input, the same signature an in-memory key would produce, so the project's verifier checks it
with nothing KMS-specific. See docs/kms.md.

Importing this module needs no AWS SDK: boto3 is imported when a signer is built, and a missing
``aws`` extra becomes a :class:`SignerError` that says so. This module never logs message contents or
credentials, nor puts them in an error message.
"""

from __future__ import annotations

import ipaddress
import logging
import secrets
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import load_der_public_key

from countersign.errors import SignerError, SignerUnavailable
from countersign.extras import needs_extra
from countersign.keys import SIGNATURE_LENGTH, PublicKey

KEY_SPEC: Final = "ECC_NIST_EDWARDS25519"
KEY_USAGE: Final = "SIGN_VERIFY"
SIGNING_ALGORITHM: Final = "ED25519_SHA_512"
"""Pure Ed25519. (``ED25519_PH_SHA_512`` is Ed25519ph, a different scheme our verifiers reject.)"""
MESSAGE_TYPE: Final = "RAW"
"""``ED25519_SHA_512`` requires ``RAW``: KMS signs the message itself, never a digest of it."""
MAX_RAW_MESSAGE_BYTES: Final = 4096
"""KMS ``Sign`` accepts messages of 1 to 4096 bytes."""
MAX_KEY_ID_LENGTH: Final = 2048

RETRYABLE_ERROR_CODES: Final = frozenset(
    {
        # KMS, documented as "you can retry the request"
        "ThrottlingException",
        "KMSInternalException",
        "DependencyTimeoutException",
        "KeyUnavailableException",
        # generic AWS transient codes
        "InternalFailure",
        "ServiceUnavailable",
        "RequestTimeout",
        "RequestTimeoutException",
    }
)
"""Error codes after which the same request may succeed unchanged. Any HTTP 5xx counts as well.
Everything else (access denied, disabled key, wrong key state, unknown key, wrong key usage, bad
credentials, validation) needs an operator, and retrying it would only hammer KMS."""

_LOOPBACK_NAMES: Final = frozenset({"localhost"})
_CLIENT_METHODS: Final = {"GetPublicKey": "get_public_key", "Sign": "sign"}
_CREDENTIAL_OR_POLICY_CODES: Final = frozenset(
    {"AccessDeniedException", "UnrecognizedClientException", "InvalidSignatureException", "ExpiredTokenException"}
)

logger = logging.getLogger(__name__)


class MessageTooLarge(SignerError):
    """The signing input exceeds what KMS signs with ``MessageType=RAW``. Not retryable.

    KMS cannot sign it as pure Ed25519: sending a digest instead would produce a signature over the
    digest, which does not verify as an Ed25519 signature over the message.
    """

    def __init__(self, size: int, limit: int = MAX_RAW_MESSAGE_BYTES) -> None:
        super().__init__(
            f"signing input of {size} bytes exceeds the {limit}-byte limit of AWS KMS Sign with "
            f"MessageType=RAW; KMS cannot sign it as Ed25519 over the message (signing a digest would not "
            f"verify). Shrink the record (e.g. a shorter policy.allowed_children list) or sign with a file key"
        )
        self.size = size
        self.limit = limit


# --- configuration -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KmsRetryPolicy:
    """Retries of the backend around each KMS call, on top of botocore's own retries.

    A call is attempted at most ``attempts`` times, and only while the failure is retryable
    (:class:`SignerUnavailable`). Before retry ``n`` (1-based) it sleeps a random time in
    ``[0, min(max_backoff_s, base_backoff_s * 2**(n-1))]`` (full jitter). Each attempt is itself one
    botocore call, which makes up to ``sdk_max_attempts`` HTTP requests (see :class:`ClientSettings`).
    Re-sending ``Sign`` is safe: Ed25519 is deterministic, and signing the same input twice yields
    the same signature and changes nothing.
    """

    attempts: int = 2
    base_backoff_s: float = 0.05
    max_backoff_s: float = 1.0

    def __post_init__(self) -> None:
        if not 1 <= self.attempts <= 10:
            raise SignerError("awskms: attempts must be between 1 and 10")
        if not 0 <= self.base_backoff_s <= self.max_backoff_s <= 30:
            raise SignerError("awskms: need 0 <= backoff_ms <= max_backoff_ms <= 30000")

    def delay(self, retry: int, uniform: Callable[[float, float], float]) -> float:
        return uniform(0.0, min(self.max_backoff_s, self.base_backoff_s * 2 ** (retry - 1)))


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """How the boto3 KMS client is built. ``None`` leaves a value to boto3's usual lookup
    (``AWS_REGION``, ``AWS_PROFILE``, the shared config files, the instance or task role)."""

    region: str | None = None
    endpoint_url: str | None = None
    profile: str | None = None
    connect_timeout_s: float = 2.0
    read_timeout_s: float = 5.0
    sdk_max_attempts: int = 2
    """botocore ``total_max_attempts``: HTTP requests per call, the first one included."""

    def __post_init__(self) -> None:
        if not 0 < self.connect_timeout_s <= 60 or not 0 < self.read_timeout_s <= 60:
            raise SignerError("awskms: timeouts must be more than 0 and at most 60 seconds")
        if not 1 <= self.sdk_max_attempts <= 10:
            raise SignerError("awskms: sdk_max_attempts must be between 1 and 10")
        if self.endpoint_url is not None:
            _check_endpoint_url(self.endpoint_url)

    def botocore_config(self) -> Any:
        from botocore.config import Config

        return Config(
            region_name=self.region,
            connect_timeout=self.connect_timeout_s,
            read_timeout=self.read_timeout_s,
            retries={"mode": "standard", "total_max_attempts": self.sdk_max_attempts},
            user_agent_extra="countersign-signer",
        )


@dataclass(frozen=True, slots=True)
class KmsKeyUri:
    """A parsed ``awskms:`` location."""

    key: str
    settings: ClientSettings = field(default_factory=ClientSettings)
    retry: KmsRetryPolicy = field(default_factory=KmsRetryPolicy)


# URI query parameter -> (object, field, converter)
_PARAMETERS: Final[Mapping[str, tuple[str, str, Callable[[str], object]]]] = {
    "region": ("settings", "region", str),
    "endpoint_url": ("settings", "endpoint_url", str),
    "profile": ("settings", "profile", str),
    "connect_timeout": ("settings", "connect_timeout_s", float),
    "read_timeout": ("settings", "read_timeout_s", float),
    "sdk_max_attempts": ("settings", "sdk_max_attempts", int),
    "attempts": ("retry", "attempts", int),
    "backoff_ms": ("retry", "base_backoff_s", lambda v: int(v) / 1000),
    "max_backoff_ms": ("retry", "max_backoff_s", lambda v: int(v) / 1000),
}


def parse_uri(location: str) -> KmsKeyUri:
    """Parse what follows ``awskms:``. Raises SignerError for anything it does not understand.

    When the key is an ARN and no ``region`` parameter is given, the region comes from the ARN.
    """
    key, _, query = location.partition("?")
    if not key or len(key) > MAX_KEY_ID_LENGTH or any(c.isspace() for c in key):
        raise SignerError(f"awskms: expected awskms:<key id | key ARN | alias/name>, got {location!r}")
    values: dict[str, dict[str, Any]] = {"settings": {}, "retry": {}}
    try:
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise SignerError(f"awskms: cannot parse the query of {location!r}") from None
    for name, raw in pairs:
        if name not in _PARAMETERS:
            raise SignerError(f"awskms: unknown parameter {name!r}; known: {sorted(_PARAMETERS)}")
        target, attribute, convert = _PARAMETERS[name]
        if attribute in values[target]:
            raise SignerError(f"awskms: parameter {name!r} given twice")
        if not raw:
            raise SignerError(f"awskms: parameter {name!r} is empty")
        try:
            values[target][attribute] = convert(raw)
        except ValueError:
            raise SignerError(f"awskms: parameter {name!r} has an invalid value {raw!r}") from None
    if "region" not in values["settings"] and key.startswith("arn:"):
        parts = key.split(":", 5)
        if len(parts) == 6 and parts[2] == "kms" and parts[3]:
            values["settings"]["region"] = parts[3]
    settings = ClientSettings(**values["settings"])
    retry = KmsRetryPolicy(**values["retry"])
    return KmsKeyUri(key, settings, retry)


def _check_endpoint_url(url: str) -> None:
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in {"https", "http"} or not parsed.hostname:
        raise SignerError(f"awskms: endpoint_url must be an http(s) URL, got {url!r}")
    if parsed.scheme == "http" and not _is_loopback(parsed.hostname):
        raise SignerError("awskms: a plain-http endpoint_url is allowed only on loopback (tests); use https")


def _is_loopback(host: str) -> bool:
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def new_kms_client(settings: ClientSettings) -> Any:
    """A boto3 KMS client with explicit timeouts and retry configuration."""
    try:
        import boto3
        import botocore.exceptions
    except ImportError as exc:
        raise SignerError(f"the awskms key backend needs {needs_extra('aws', exc.name)}") from None
    try:
        session = boto3.session.Session(profile_name=settings.profile)
        return session.client("kms", endpoint_url=settings.endpoint_url, config=settings.botocore_config())
    except botocore.exceptions.NoRegionError:
        raise SignerError("awskms: no AWS region; use a key ARN, add ?region=..., or set AWS_REGION") from None
    except botocore.exceptions.BotoCoreError as exc:
        raise SignerError(f"awskms: cannot create the KMS client: {exc}") from None


# --- error mapping -------------------------------------------------------------------------------


def typed_error(operation: str, key: str, exc: Exception) -> SignerError:
    """The signer error for a failed KMS call: :class:`SignerUnavailable` when retrying may help."""
    from botocore import exceptions as bce

    where = f"KMS {operation} with {key}"
    if isinstance(exc, bce.ClientError):
        response: Mapping[str, Any] = exc.response
        error = response.get("Error", {})
        meta = response.get("ResponseMetadata", {})
        code = str(error.get("Code", "Unknown"))
        status = meta.get("HTTPStatusCode")
        detail = f"{where} failed: {code}: {error.get('Message', '')}"
        if meta.get("RequestId"):
            detail += f" (request id {meta['RequestId']})"
        if code in RETRYABLE_ERROR_CODES or (isinstance(status, int) and status >= 500):
            return SignerUnavailable(detail)
        if code in _CREDENTIAL_OR_POLICY_CODES:
            detail += "; check the signer's credentials and that the key policy allows it kms:Sign and kms:GetPublicKey"
        return SignerError(detail)
    if isinstance(exc, bce.ConnectionError | bce.HTTPClientError | bce.CredentialRetrievalError):
        # cannot connect, timed out, connection dropped, or the credential endpoint did not answer
        return SignerUnavailable(f"{where} failed: {type(exc).__name__}: {exc}")
    if isinstance(exc, bce.NoCredentialsError | bce.PartialCredentialsError):
        return SignerError(f"{where} failed: no usable AWS credentials ({type(exc).__name__})")
    if isinstance(exc, bce.ParamValidationError):
        # its text may quote a parameter value: never include it
        return SignerError(f"{where} failed: the request was invalid (ParamValidationError)")
    if isinstance(exc, bce.BotoCoreError):
        # other botocore errors may quote request parameters: name the class only
        return SignerError(f"{where} failed: {type(exc).__name__}")
    raise exc


# --- the signer ----------------------------------------------------------------------------------


class AwsKmsSigner:
    """Signs with an Ed25519 key held in AWS KMS.

    The public key, and from it the ``key_id``, are read once with ``GetPublicKey`` when the signer is
    built; the key spec, key usage and signing algorithm are checked then. ``Sign`` calls name the key
    by the ARN ``GetPublicKey`` returned, so a later change of an alias cannot switch keys under a
    running signer. Every signature KMS returns is verified locally before it is handed out.
    """

    __slots__ = ("_client", "_key_arn", "_public", "_retry", "_sleep", "_uniform", "requested_key")

    def __init__(
        self,
        client: Any,
        key: str,
        *,
        retry: KmsRetryPolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
        uniform: Callable[[float, float], float] | None = None,
    ) -> None:
        self._client = client
        self.requested_key = key
        self._retry = retry or KmsRetryPolicy()
        self._sleep = sleep
        self._uniform = uniform or secrets.SystemRandom().uniform
        self._key_arn = key  # until GetPublicKey names the key
        response = self._call("GetPublicKey", {"KeyId": key})
        self._key_arn, self._public = _checked_public_key(key, response)
        logger.info("awskms: using KMS key %s (%s)", self._key_arn, self._public.key_id)

    @classmethod
    def from_uri(cls, location: str) -> AwsKmsSigner:
        """Build a signer from what follows ``awskms:`` in a key URI."""
        uri = parse_uri(location)
        return cls(new_kms_client(uri.settings), uri.key, retry=uri.retry)

    @property
    def key_id(self) -> str:
        return self._public.key_id

    @property
    def public_key(self) -> bytes:
        return self._public.raw

    @property
    def key_arn(self) -> str:
        """The KMS key every ``Sign`` call names."""
        return self._key_arn

    def sign(self, message: bytes) -> bytes:
        """Ed25519 over ``message``, made in KMS and verified here. Raises SignerError."""
        message = bytes(message)
        if len(message) > MAX_RAW_MESSAGE_BYTES:
            raise MessageTooLarge(len(message))
        if not message:
            raise SignerError("KMS Sign needs a message of at least 1 byte")
        response = self._call(
            "Sign",
            {
                "KeyId": self._key_arn,
                "Message": message,
                "MessageType": MESSAGE_TYPE,
                "SigningAlgorithm": SIGNING_ALGORITHM,
            },
        )
        signature = response.get("Signature")
        if response.get("SigningAlgorithm") != SIGNING_ALGORITHM:
            raise SignerError(f"KMS Sign with {self._key_arn} answered with another signing algorithm")
        if response.get("KeyId") not in {None, self._key_arn}:
            raise SignerError(f"KMS Sign with {self._key_arn} answered for another key")
        if not isinstance(signature, bytes) or len(signature) != SIGNATURE_LENGTH:
            raise SignerError(f"KMS Sign with {self._key_arn} returned no {SIGNATURE_LENGTH}-byte signature")
        if not self._public.verify(message, signature):
            raise SignerError(
                f"the signature KMS returned for {self._key_arn} does not verify under its public key "
                f"{self._public.key_id}; refusing to use it"
            )
        return signature

    def _call(self, operation: str, params: dict[str, Any]) -> Mapping[str, Any]:
        method = getattr(self._client, _CLIENT_METHODS[operation])
        attempts = self._retry.attempts
        for attempt in range(1, attempts + 1):
            try:
                response = method(**params)
            except Exception as exc:
                error = typed_error(operation, self._key_arn, exc)
                if not error.retryable or attempt == attempts:
                    if attempts > 1 and error.retryable:
                        error = SignerUnavailable(f"{error} (gave up after {attempts} attempts)")
                    raise error from None
                delay = self._retry.delay(attempt, self._uniform)
                logger.warning(
                    "awskms: %s (attempt %d of %d); retrying in %.0f ms", error, attempt, attempts, delay * 1000
                )
                self._sleep(delay)
                continue
            if not isinstance(response, Mapping):
                raise SignerError(f"KMS {operation} with {self._key_arn} returned no response")
            return response
        raise AssertionError("unreachable")  # pragma: no cover

    def __repr__(self) -> str:
        return f"AwsKmsSigner(key_id={self.key_id!r}, kms_key={self._key_arn!r})"


def _checked_public_key(requested: str, response: Mapping[str, Any]) -> tuple[str, PublicKey]:
    """The key ARN and the Ed25519 public key of a GetPublicKey answer, or SignerError if the key
    cannot sign pure Ed25519."""
    arn = response.get("KeyId")
    if not isinstance(arn, str) or not arn:
        raise SignerError(f"KMS GetPublicKey for {requested} returned no key ARN")
    spec = response.get("KeySpec") or response.get("CustomerMasterKeySpec")
    if spec != KEY_SPEC:
        raise SignerError(f"KMS key {arn} has key spec {spec}; Countersign needs {KEY_SPEC} (Ed25519)")
    usage = response.get("KeyUsage")
    if usage != KEY_USAGE:
        raise SignerError(f"KMS key {arn} has key usage {usage}; Countersign needs {KEY_USAGE}")
    algorithms = response.get("SigningAlgorithms") or []
    if SIGNING_ALGORITHM not in algorithms:
        raise SignerError(f"KMS key {arn} does not offer {SIGNING_ALGORITHM} (it offers {sorted(algorithms)})")
    der = response.get("PublicKey")
    if not isinstance(der, bytes):
        raise SignerError(f"KMS GetPublicKey for {arn} returned no public key")
    try:
        public = load_der_public_key(der)
    except (ValueError, UnsupportedAlgorithm):
        raise SignerError(f"KMS key {arn}: the public key is not a DER SubjectPublicKeyInfo") from None
    if not isinstance(public, Ed25519PublicKey):
        raise SignerError(f"KMS key {arn}: the public key is not an Ed25519 key")
    return arn, PublicKey(public.public_bytes_raw())


__all__ = [
    "KEY_SPEC",
    "MAX_RAW_MESSAGE_BYTES",
    "SIGNING_ALGORITHM",
    "AwsKmsSigner",
    "ClientSettings",
    "KmsKeyUri",
    "KmsRetryPolicy",
    "MessageTooLarge",
    "new_kms_client",
    "parse_uri",
    "typed_error",
]
