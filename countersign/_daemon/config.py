"""Daemon configuration: a TOML file, then ``COUNTERSIGN_*`` environment overrides, then validation.

A field ``store_url`` is overridden by ``COUNTERSIGN_STORE_URL``; a field of the ``[tls]`` table by
``COUNTERSIGN_TLS_CERT`` and so on. Unknown keys, wrong types and missing required values are errors
with a message that names the key, never a traceback.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from countersign.client.tls import TlsConfig
from countersign.errors import ConfigError

ENV_PREFIX = "COUNTERSIGN_"
MISSING = object()
T = TypeVar("T")


def load_config(cls: type[T], path: str | None, environ: Mapping[str, str] | None = None) -> T:
    """Build ``cls`` (a dataclass) from the TOML file at ``path`` and the environment. Raises ConfigError."""
    raw: dict[str, Any] = {}
    if path:
        try:
            raw = tomllib.loads(Path(path).read_text())
        except OSError as exc:
            raise ConfigError(f"cannot read config {path}: {exc.strerror}") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"config {path} is not valid TOML: {exc}") from None
    env = os.environ if environ is None else environ
    config = _build(cls, raw, env, prefix=ENV_PREFIX, where=path or "environment")
    validate = getattr(config, "validate", None)
    if validate is not None:
        validate()
    return config


def _build(cls: type[T], raw: dict[str, Any], env: Mapping[str, str], prefix: str, where: str) -> T:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(raw) - names)
    if unknown:
        raise ConfigError(f"{where}: unknown setting(s) {', '.join(unknown)}")
    values: dict[str, Any] = {}
    for item in dataclasses.fields(cls):  # type: ignore[arg-type]
        kind = hints[item.name]
        env_name = prefix + item.name.upper()
        if dataclasses.is_dataclass(kind):
            section = raw.get(item.name, {})
            if not isinstance(section, dict):
                raise ConfigError(f"{where}: [{item.name}] must be a table")
            values[item.name] = _build(typing.cast(type, kind), section, env, prefix=env_name + "_", where=where)
            continue
        if env_name in env:
            values[item.name] = _from_text(env[env_name], kind, env_name)
        elif item.name in raw:
            values[item.name] = _typed(raw[item.name], kind, f"{where}: {item.name}")
        elif item.default is dataclasses.MISSING and item.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{where}: {item.name} is required (or set {env_name})")
    return cls(**values)


def _typed(value: Any, kind: Any, what: str) -> Any:
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        options = [k for k in typing.get_args(kind) if k is not type(None)]
        if value is None:
            return None
        return _typed(value, options[0], what)
    if origin is list:
        (item,) = typing.get_args(kind)
        if not isinstance(value, list):
            raise ConfigError(f"{what} must be a list")
        return [_typed(v, item, what) for v in value]
    if origin is dict:
        key_kind, value_kind = typing.get_args(kind)
        if not isinstance(value, dict):
            raise ConfigError(f"{what} must be a table")
        return {_typed(k, key_kind, what): _typed(v, value_kind, f"{what}.{k}") for k, v in value.items()}
    if kind is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{what} must be true or false")
        return value
    if kind is int:
        if type(value) is not int:
            raise ConfigError(f"{what} must be an integer")
        return value
    if kind is str:
        if not isinstance(value, str):
            raise ConfigError(f"{what} must be a string")
        return value
    raise ConfigError(f"{what}: unsupported setting type {kind}")


def _from_text(text: str, kind: Any, what: str) -> Any:
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        options = [k for k in typing.get_args(kind) if k is not type(None)]
        return None if text == "" else _from_text(text, options[0], what)
    if origin is list:
        return [part.strip() for part in text.split(",") if part.strip()]
    if origin is dict:  # a table in the environment is a JSON object
        try:
            value = json.loads(text)
        except ValueError:
            raise ConfigError(f"{what} must be a JSON object") from None
        return _typed(value, kind, what)
    if kind is bool:
        if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
            raise ConfigError(f"{what} must be true or false")
        return text.lower() in ("true", "1", "yes")
    if kind is int:
        try:
            return int(text)
        except ValueError:
            raise ConfigError(f"{what} must be an integer") from None
    return text


def parse_operator_key(encoded: str) -> Any:
    """The pinned operator public key (base64url of 32 bytes). Raises ConfigError."""
    from countersign.canonical import b64url_decode
    from countersign.keys import PUBLIC_KEY_LENGTH, PublicKey

    try:
        return PublicKey(b64url_decode(encoded, PUBLIC_KEY_LENGTH))
    except ValueError as exc:
        raise ConfigError(f"operator_public_key is not a base64url Ed25519 public key: {exc}") from None


def parse_address(address: str, what: str) -> tuple[str, int]:
    """``host:port`` (IPv6 in brackets). Raises ConfigError."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535 or not host:
        raise ConfigError(f"{what} must be host:port, got {address!r}")
    return host.strip("[]"), int(port)


def parse_addresses(text: str, what: str, tls: TlsConfig | None = None) -> list[str]:
    """One ``host:port`` or several separated by commas (a service's replicas, tried in order).
    Plaintext (``tls.insecure_loopback``) only to loopback ones. Raises ConfigError."""
    addresses = [part.strip() for part in text.split(",")]
    if not text.strip() or any(not address for address in addresses):
        raise ConfigError(f"{what} must be host:port, or several separated by commas, got {text!r}")
    for address in addresses:
        parse_address(address, what)
    if tls is not None:
        for address in addresses:
            require_loopback(tls, {what: address})
    return addresses


def validate_daemon(
    where: str, tls: TlsConfig, operator_public_key: str, addresses: Mapping[str, str], *, optional: tuple[str, ...]
) -> None:
    """Checks every daemon shares: its addresses (those named in ``optional`` may be empty), its TLS
    material (or plaintext only on loopback) and the pinned operator key. Raises ConfigError."""
    for what, address in addresses.items():
        if address or what not in optional:
            parse_address(address, what)
    tls.validate(where)
    require_loopback(tls, dict(addresses))
    parse_operator_key(operator_public_key)


def validate_follower(clock_skew_ms: int, registry_cache: str, max_clock_skew_ms: int) -> None:
    """Checks the signer and the verifier share: they follow the registry log and judge times."""
    if not 0 <= clock_skew_ms <= max_clock_skew_ms:
        raise ConfigError(f"clock_skew_ms must be between 0 and {max_clock_skew_ms}")
    if not registry_cache:
        raise ConfigError("registry_cache is required (the persisted copy of the registry log)")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def require_loopback(tls: TlsConfig, addresses: dict[str, str]) -> None:
    """Plaintext is allowed only when explicitly asked for and every address is loopback."""
    if not tls.insecure_loopback:
        return
    for what, address in addresses.items():
        if not address:
            continue
        host, _ = parse_address(address, what)
        if not is_loopback(host):
            raise ConfigError(f"tls.insecure_loopback is only allowed on loopback; {what} is {address}")
