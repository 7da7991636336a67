"""How a client reaches a daemon: mTLS material, the pinned server names, and channel options.

Every daemon presents a certificate with a DNS name that clients pin with ``ssl_target_name_override``:
a child's signer dialling the parent's signer checks that the certificate is *that deployer's* signer,
whatever address it was told. ``countersign._daemon.tls`` holds the server side and the development PKI.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from countersign.errors import ConfigError

TRUST_DOMAIN = "countersign.local"
ENV_CLIENT_TLS = "COUNTERSIGN_CLIENT_"  # a client's mTLS material: COUNTERSIGN_CLIENT_{CA,CERT,KEY}
MAX_MESSAGE_BYTES = 24 << 20
CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # Servers accept the clients' keepalive pings above; the default policy (one ping per 5 minutes
    # without data) answers them with GOAWAY "too_many_pings", dropping the connection and costing a
    # new TLS handshake on the next call.
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
    ("grpc.http2.max_ping_strikes", 0),
]


def coordinator_dns() -> str:
    return f"coordinator.{TRUST_DOMAIN}"


def verifier_dns() -> str:
    return f"verifier.{TRUST_DOMAIN}"


def signer_dns(deployer: str) -> str:
    return f"{deployer}.signer.{TRUST_DOMAIN}"


@dataclasses.dataclass
class TlsConfig:
    """mTLS material, as file paths (``ca``, ``cert``, ``key``) or inline PEM (``ca_pem``, ``cert_pem``,
    ``key_pem``, e.g. from a secrets manager through the environment). ``insecure_loopback`` turns TLS
    off and is refused unless every address is loopback."""

    ca: str = ""
    cert: str = ""
    key: str = ""
    ca_pem: str = ""
    cert_pem: str = ""
    key_pem: str = ""
    insecure_loopback: bool = False

    def validate(self, where: str) -> None:
        if self.insecure_loopback:
            return
        for name in ("ca", "cert", "key"):
            if getattr(self, name + "_pem"):
                continue
            location = getattr(self, name)
            if not location:
                raise ConfigError(f"{where}: tls.{name} (or tls.{name}_pem) is required, or tls.insecure_loopback")
            if not Path(location).is_file():
                raise ConfigError(f"{where}: tls.{name} {location} is not a readable file")
        self._check_material(where)

    def _check_material(self, where: str) -> None:
        """Parse what gRPC would otherwise reject only when it binds or dials, with no word of why.
        Messages name the setting, never the key's bytes."""

        def source(name: str) -> str:
            return f"tls.{name}_pem" if getattr(self, name + "_pem") else f"tls.{name} {getattr(self, name)}"

        certificates: dict[str, list[x509.Certificate]] = {}
        for name in ("ca", "cert"):
            try:
                certificates[name] = x509.load_pem_x509_certificates(self.material(name))
            except ValueError:
                raise ConfigError(f"{where}: {source(name)} holds no PEM certificate") from None
        try:
            key = serialization.load_pem_private_key(self.material("key"), password=None)
        except (ValueError, TypeError):
            raise ConfigError(f"{where}: {source('key')} holds no unencrypted PEM private key") from None
        leaf = certificates["cert"][0]  # a chain starts with this daemon's own certificate
        spki = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
        if key.public_key().public_bytes(*spki) != leaf.public_key().public_bytes(*spki):
            raise ConfigError(f"{where}: {source('key')} is not the key of {source('cert')}")
        now = datetime.datetime.now(datetime.UTC)
        if leaf.not_valid_after_utc <= now:
            raise ConfigError(f"{where}: {source('cert')} expired at {leaf.not_valid_after_utc.isoformat()}")
        # A CA bundle may keep a retired CA beside its successor while certificates move over.
        if all(ca.not_valid_after_utc <= now for ca in certificates["ca"]):
            last = max(ca.not_valid_after_utc for ca in certificates["ca"]).isoformat()
            raise ConfigError(f"{where}: every certificate in {source('ca')} has expired (the last at {last})")

    def material(self, name: str) -> bytes:
        """The PEM bytes of ``ca``, ``cert`` or ``key``. Raises ConfigError if unreadable."""
        inline = getattr(self, name + "_pem")
        if inline:
            return str(inline).encode()
        location = getattr(self, name)
        try:
            return Path(location).read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read tls.{name} {location}: {exc.strerror}") from None


def tls_from_env(environ: Mapping[str, str] | None = None) -> TlsConfig:
    """This client's mTLS material from ``COUNTERSIGN_CLIENT_{CA,CERT,KEY}`` (file paths;
    ``COUNTERSIGN_CLIENT_INSECURE_LOOPBACK=1`` instead: no TLS, loopback only). Raises ConfigError
    naming what is missing or unreadable."""
    env = os.environ if environ is None else environ
    if env.get(ENV_CLIENT_TLS + "INSECURE_LOOPBACK", "") in ("1", "true"):
        return TlsConfig(insecure_loopback=True)
    ca, cert, key = (env.get(ENV_CLIENT_TLS + part, "") for part in ("CA", "CERT", "KEY"))
    tls = TlsConfig(ca=ca, cert=cert, key=key)
    tls.validate(f"{ENV_CLIENT_TLS}{{CA,CERT,KEY}}")
    return tls


def _credentials(tls: TlsConfig) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        root_certificates=tls.material("ca"),
        private_key=tls.material("key"),
        certificate_chain=tls.material("cert"),
    )


def open_channel(address: str, tls: TlsConfig, server_name: str) -> grpc.Channel:
    """A channel to ``address`` whose server must hold a certificate for ``server_name``."""
    if tls.insecure_loopback:
        return grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
    options = [*CHANNEL_OPTIONS, ("grpc.ssl_target_name_override", server_name)]
    return grpc.secure_channel(address, _credentials(tls), options=options)


def open_aio_channel(address: str, tls: TlsConfig, server_name: str) -> grpc.aio.Channel:
    """:func:`open_channel` for ``grpc.aio``: the same mTLS material, pinned server name and options.
    Call it inside the event loop that will use the channel."""
    if tls.insecure_loopback:
        return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
    options = [*CHANNEL_OPTIONS, ("grpc.ssl_target_name_override", server_name)]
    return grpc.aio.secure_channel(address, _credentials(tls), options=options)
