"""Opening the daemons' DynamoDB stores the same way everywhere: one URL reading, one client, one table shape.

URL: ``dynamodb://TABLE?region=REGION[&endpoint_url=http://HOST:PORT][&PARAMS]``. Credentials come from
boto3's default chain (task role, environment, profile). ``endpoint_url`` is the only thing that differs
between AWS and an emulator; every request goes through the same code. Other parameters:
``connect_timeout`` / ``read_timeout`` (seconds per HTTP attempt, default 2 / 5) and ``max_attempts``
(botocore attempts per call, standard retry mode, default 3).

Every table has hash key ``pk`` (S), range key ``sk`` (S), on-demand capacity and TTL on ``expires_at``
(epoch seconds): Terraform creates it in production, :func:`ensure_table` in tests and local runs.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from countersign.errors import ConfigError, StateUnavailable

TTL_ATTRIBUTE = "expires_at"
# How a store with expiring items forgets them: ``scan`` (default) deletes expired items found by a
# bounded, resumable Scan; ``ttl`` leaves them to DynamoDB's TTL alone (no read or write capacity, but
# items linger some time past ``expires_at``: harmless where an expired item is refused before it is used).
COLLECT_MODES = ("scan", "ttl")
_OWN_PARAMS = frozenset({"region", "endpoint_url", "connect_timeout", "read_timeout", "max_attempts"})


@dataclass(frozen=True, slots=True)
class DynamoDbSettings:
    table: str
    region: str
    endpoint_url: str | None = None
    connect_timeout: float = 2.0
    read_timeout: float = 5.0
    max_attempts: int = 3


def parse_dynamodb_url(url: str) -> DynamoDbSettings:
    """Read a table URL (module docstring). Raises ConfigError naming what is wrong."""
    parts = urlsplit(url)
    table = parts.netloc
    if parts.scheme != "dynamodb" or not table or parts.path not in ("", "/"):
        raise ConfigError(f"a DynamoDB URL must look like dynamodb://TABLE?region=REGION, got {url!r}")
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    unknown = sorted(set(query) - _OWN_PARAMS)
    if unknown:
        raise ConfigError(f"unknown DynamoDB URL parameters {unknown} in {url!r}")
    region = query.get("region")
    if not region:
        raise ConfigError(f"a DynamoDB URL needs ?region=REGION: {url!r}")
    try:
        settings = DynamoDbSettings(
            table=table,
            region=region,
            endpoint_url=query.get("endpoint_url") or None,
            connect_timeout=float(query.get("connect_timeout", "2")),
            read_timeout=float(query.get("read_timeout", "5")),
            max_attempts=int(query.get("max_attempts", "3")),
        )
    except ValueError as exc:
        raise ConfigError(f"invalid number in DynamoDB URL {url!r}: {exc}") from None
    if settings.connect_timeout <= 0 or settings.read_timeout <= 0 or settings.max_attempts < 1:
        raise ConfigError(f"DynamoDB URL timeouts must be positive and max_attempts >= 1: {url!r}")
    return settings


def split_collect_mode(url: str) -> tuple[str, str]:
    """(``url`` without its ``collect`` parameter, the mode it names: ``scan`` when absent), for the
    stores whose items expire. Raises ConfigError for an unknown mode."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    modes = [value for key, value in query if key == "collect"]
    collect = modes[-1] if modes else "scan"
    if collect not in COLLECT_MODES:
        raise ConfigError(f"DynamoDB URL parameter collect must be 'scan' or 'ttl', got {collect!r}")
    rest = urlencode([(key, value) for key, value in query if key != "collect"])
    return urlunsplit((parts.scheme, parts.netloc, parts.path, rest, parts.fragment)), collect


def make_client(settings: DynamoDbSettings) -> Any:
    """The boto3 DynamoDB client a store uses (bounded timeouts, standard retries)."""
    config = Config(
        region_name=settings.region,
        connect_timeout=settings.connect_timeout,
        read_timeout=settings.read_timeout,
        retries={"mode": "standard", "total_max_attempts": settings.max_attempts},
    )
    return boto3.session.Session().client("dynamodb", endpoint_url=settings.endpoint_url, config=config)


def error_text(exc: Exception) -> str:
    """A botocore error as one line: its code, HTTP status and message (no request or credentials)."""
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return f"{error.get('Code', '?')} (HTTP {status}): {error.get('Message', '')}"
    return f"{type(exc).__name__}: {exc}"


@contextmanager
def calls(table: str, what: str) -> Iterator[None]:
    """Every botocore failure inside becomes StateUnavailable naming the table and the call."""
    try:
        yield
    except (ClientError, BotoCoreError) as exc:
        raise StateUnavailable(f"DynamoDB table {table} ({what}): {error_text(exc)}") from exc


def check_table(client: Any, table: str) -> None:
    """Refuse a table without the expected keys (a wrong URL must not write into someone else's table)."""
    with calls(table, "describe table"):
        description = client.describe_table(TableName=table)["Table"]
    keys = {k["AttributeName"]: k["KeyType"] for k in description.get("KeySchema", [])}
    types = {a["AttributeName"]: a["AttributeType"] for a in description.get("AttributeDefinitions", [])}
    if keys != {"pk": "HASH", "sk": "RANGE"} or types.get("pk") != "S" or types.get("sk") != "S":
        raise StateUnavailable(
            f"DynamoDB table {table} must have hash key pk (S) and range key sk (S); has {keys} {types}"
        )


def ensure_table(url: str, *, wait_s: float = 60.0) -> None:
    """Create the table a URL names as Terraform does (module docstring); no-op if it exists."""
    settings = parse_dynamodb_url(url)
    client = make_client(settings)
    with calls(settings.table, "create table"):
        try:
            client.create_table(
                TableName=settings.table,
                AttributeDefinitions=[
                    {"AttributeName": "pk", "AttributeType": "S"},
                    {"AttributeName": "sk", "AttributeType": "S"},
                ],
                KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
                BillingMode="PAY_PER_REQUEST",
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "ResourceInUseException":
                raise
        client.get_waiter("table_exists").wait(
            TableName=settings.table, WaiterConfig={"Delay": 1, "MaxAttempts": max(1, int(wait_s))}
        )
        ttl = client.describe_time_to_live(TableName=settings.table)["TimeToLiveDescription"]
        if ttl.get("TimeToLiveStatus") not in ("ENABLED", "ENABLING"):
            client.update_time_to_live(
                TableName=settings.table, TimeToLiveSpecification={"Enabled": True, "AttributeName": TTL_ATTRIBUTE}
            )


def expires_at(expires_ms: int) -> str:
    """TTL value: epoch seconds, rounded up, so DynamoDB never deletes an item before it expires."""
    return str(max(0, math.ceil(expires_ms / 1000)))


def cancellation_codes(exc: ClientError) -> list[str]:
    """The per-item reasons of a cancelled TransactWriteItems (``ConditionalCheckFailed``, ``None``, ...)."""
    return [str(reason.get("Code", "None")) for reason in exc.response.get("CancellationReasons", [])]
