"""How a client reaches a daemon: mTLS material, the pinned server names, and channel options.

Every daemon presents a certificate with a DNS name that clients pin with ``ssl_target_name_override``:
a child's signer dialling the parent's signer checks that the certificate is *that deployer's* signer,
whatever address it was told. ``countersign._daemon.tls`` holds the server side and the development PKI.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import re
import socket
import ssl
import threading
from collections import OrderedDict
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


# --- which service an address was dialled as, and which one answered -----------------------------

# address as dialled -> the server name pinned for it, and the client's TLS material
_PINNED: OrderedDict[str, tuple[str, TlsConfig]] = OrderedDict()
_PINNED_LOCK = threading.Lock()
_MAX_PINNED = 256
_PROBE_TIMEOUT_S = 2.0
# gRPC names the peer of a failed connection as ipv4:HOST:PORT or ipv6:[HOST]:PORT.
_PEER = re.compile(r"ipv[46]:(\[[^\]]+\]|[0-9.]+):(\d+)")


def _remember(address: str, server_name: str, tls: TlsConfig) -> None:
    """Note that this process dialled ``address`` expecting ``server_name`` (most recent first out)."""
    with _PINNED_LOCK:
        _PINNED[address] = (server_name, tls)
        _PINNED.move_to_end(address)
        while len(_PINNED) > _MAX_PINNED:
            _PINNED.popitem(last=False)


def expected_server(address: str) -> tuple[str, TlsConfig] | None:
    """The server name this process last pinned for ``address`` (HOST:PORT as dialled, or as gRPC
    reports the peer) and the TLS material it dialled with; None if it never dialled it, or several
    dialled addresses share its port."""
    with _PINNED_LOCK:
        if address in _PINNED:
            return _PINNED[address]
        port = address.rsplit(":", 1)[-1]
        same_port = [pinned for dialled, pinned in _PINNED.items() if dialled.rsplit(":", 1)[-1] == port]
    return same_port[0] if len({name for name, _ in same_port}) == 1 else None


def describe_name(name: str) -> str:
    """A server DNS name or certificate URI in the domain's words: ``deployer-a's signer``, ``a
    verifier``, ``the coordinator``; the name itself when it is none of ours."""
    suffix = f".{TRUST_DOMAIN}"
    if name.startswith("spiffe://"):
        from_uri = name.removeprefix(f"spiffe://{TRUST_DOMAIN}/").split("/")
        if len(from_uri) == 3 and from_uri[0] == "deployer":
            return f"{from_uri[1]}'s {from_uri[2]}"
        if len(from_uri) == 2:
            return f"a {from_uri[0]} ({from_uri[1]})"
        if len(from_uri) == 1:
            return f"the {from_uri[0]}"
        return name
    if name == coordinator_dns():
        return "the coordinator"
    if name == verifier_dns():
        return "a verifier"
    if name.endswith(".signer" + suffix):
        return f"{name.removesuffix('.signer' + suffix)}'s signer"
    return name


def server_identity(address: str, tls: TlsConfig | None = None) -> list[str] | None:
    """The identities (URI, then DNS names) in the certificate the TLS server at ``address`` presents,
    read with a handshake of its own; None when nothing answers in time (or the chain is not of
    ``tls``'s CA). With ``tls`` (files) it presents the client's certificate and checks the chain
    against its CA, as gRPC did; without, a bare handshake (a TLS 1.3 server asks for the client's
    certificate only after it has sent its own) that describes, not trusts."""
    host, _, port = address.rpartition(":")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    try:
        if tls is not None and not tls.insecure_loopback:
            context.load_verify_locations(cadata=tls.material("ca").decode())
            context.verify_mode = ssl.CERT_REQUIRED
            if tls.cert and tls.key:
                context.load_cert_chain(tls.cert, tls.key)
    except (OSError, ValueError, ssl.SSLError, ConfigError):
        context.verify_mode = ssl.CERT_NONE
    try:
        with (
            socket.create_connection((host.strip("[]"), int(port)), timeout=_PROBE_TIMEOUT_S) as raw,
            context.wrap_socket(raw, server_hostname="countersign-probe") as conn,
        ):
            der = conn.getpeercert(binary_form=True)
    except (OSError, ValueError):
        return None
    if der is None:
        return None
    try:
        names = x509.load_der_x509_certificate(der).extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except (ValueError, x509.ExtensionNotFound):
        return []
    return [
        *names.value.get_values_for_type(x509.UniformResourceIdentifier),
        *names.value.get_values_for_type(x509.DNSName),
    ]


def wrong_server_message(transport_message: str) -> str:
    """What to tell a caller whose TLS connection failed hostname verification: which server it
    reached and which it expected. ``transport_message`` is gRPC's text, which names the peer."""
    found = _PEER.search(transport_message)
    address = f"{found.group(1)}:{found.group(2)}" if found else ""
    pinned = expected_server(address) if address else None
    expected = None if pinned is None else pinned[0]
    identities = server_identity(address, None if pinned is None else pinned[1]) if address else None
    where = f"the server at {address}" if address else "the server"
    if identities:
        ours = [i for i in identities if i.startswith("spiffe://")] or identities
        what = f"{where} is {describe_name(ours[0])} (its certificate names {', '.join(identities)})"
    else:
        what = f"{where} holds a certificate of this CA for another name"
    wanted = f"{describe_name(expected)} ({expected})" if expected else "the service this client dials"
    return f"{what}, not {wanted}: check the address (or the deployer it was configured for)"


def open_channel(address: str, tls: TlsConfig, server_name: str) -> grpc.Channel:
    """A channel to ``address`` whose server must hold a certificate for ``server_name``."""
    _remember(address, server_name, tls)
    if tls.insecure_loopback:
        return grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
    options = [*CHANNEL_OPTIONS, ("grpc.ssl_target_name_override", server_name)]
    return grpc.secure_channel(address, _credentials(tls), options=options)


def open_aio_channel(address: str, tls: TlsConfig, server_name: str) -> grpc.aio.Channel:
    """:func:`open_channel` for ``grpc.aio``: the same mTLS material, pinned server name and options.
    Call it inside the event loop that will use the channel."""
    _remember(address, server_name, tls)
    if tls.insecure_loopback:
        return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
    options = [*CHANNEL_OPTIONS, ("grpc.ssl_target_name_override", server_name)]
    return grpc.aio.secure_channel(address, _credentials(tls), options=options)
