"""mTLS between daemons: a development PKI, credentials, and peer identities.

Every certificate carries a SPIFFE-style URI naming who holds it
(``spiffe://countersign.local/deployer/<id>/signer``, ``…/deployer/<id>/runtime``, ``…/coordinator``,
``…/verifier/<name>``, ``…/client/<name>``, ``…/auditor/<name>``, ``…/operator``). An auditor reads
and marks a verifier's whole verdict log (``Impact``); a client (a consumer) sees only its own
verdicts there. Servers also carry a DNS name that
clients pin with ``ssl_target_name_override``: a child's signer dialling the parent's signer checks
that the certificate is *that deployer's* signer, whatever address it was told.
"""

from __future__ import annotations

import datetime
import functools
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from countersign.client.tls import TRUST_DOMAIN, TlsConfig
from countersign.errors import ConfigError


@dataclass(frozen=True)
class PeerIdentity:
    """Who is on the other end of an mTLS connection, from its certificate's URI SAN."""

    role: str  # signer | runtime | coordinator | verifier | client | auditor | operator
    deployer: str | None = None
    name: str | None = None

    @property
    def uri(self) -> str:
        if self.deployer is not None:
            return f"spiffe://{TRUST_DOMAIN}/deployer/{self.deployer}/{self.role}"
        if self.name is not None:
            return f"spiffe://{TRUST_DOMAIN}/{self.role}/{self.name}"
        return f"spiffe://{TRUST_DOMAIN}/{self.role}"

    @classmethod
    def parse(cls, uri: str) -> PeerIdentity | None:
        prefix = f"spiffe://{TRUST_DOMAIN}/"
        if not uri.startswith(prefix):
            return None
        parts = uri[len(prefix) :].split("/")
        if len(parts) == 3 and parts[0] == "deployer" and parts[2] in ("signer", "runtime"):
            return cls(parts[2], deployer=parts[1])
        if len(parts) == 2 and parts[0] in ("verifier", "client", "auditor"):
            return cls(parts[0], name=parts[1])
        if len(parts) == 1 and parts[0] in ("coordinator", "operator"):
            return cls(parts[0])
        return None


def peer_identity(context: grpc.ServicerContext) -> PeerIdentity | None:
    """The verified client certificate's identity, or None (plaintext, or no usable SAN)."""
    pems = context.auth_context().get("x509_pem_cert")
    if not pems:
        return None
    return _identity_of(pems[0])


@functools.lru_cache(maxsize=256)
def _identity_of(pem: bytes) -> PeerIdentity | None:
    """Parsed once per certificate: peers present the same certificate on every call."""
    certificate = x509.load_pem_x509_certificate(pem)
    try:
        names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return None
    for uri in names.get_values_for_type(x509.UniformResourceIdentifier):
        identity = PeerIdentity.parse(uri)
        if identity is not None:
            return identity
    return None


# --- the development PKI ---------------------------------------------------------------------


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
    finally:
        os.close(fd)


def create_ca(directory: Path, *, days: int = 365) -> None:
    """Write ``ca.pem`` and ``ca.key`` (0600): a development certificate authority."""
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Countersign development CA")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(key, hashes.SHA256())
    )
    (directory / "ca.pem").write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    _write_private(
        directory / "ca.key",
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    )


def issue_certificate(
    ca_directory: Path,
    out: Path,
    name: str,
    identity: PeerIdentity,
    *,
    dns: list[str] | None = None,
    ips: list[str] | None = None,
    days: int = 90,
) -> tuple[Path, Path]:
    """Write ``<name>.pem`` and ``<name>.key`` (0600) signed by the CA; return their paths."""
    ca_key = serialization.load_pem_private_key((ca_directory / "ca.key").read_bytes(), password=None)
    ca_certificate = x509.load_pem_x509_certificate((ca_directory / "ca.pem").read_bytes())
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ConfigError("the CA key must be an EC key")
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    alternative: list[x509.GeneralName] = [x509.UniformResourceIdentifier(identity.uri)]
    alternative += [x509.DNSName(d) for d in dns or []]
    alternative += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips or []]
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(alternative), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    out.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = out / f"{name}.pem", out / f"{name}.key"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    _write_private(
        key_path,
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    )
    return cert_path, key_path


# --- credentials ------------------------------------------------------------------------------


def server_credentials(tls: TlsConfig) -> grpc.ServerCredentials:
    """Server side of mTLS: present our certificate, require and verify the client's."""
    return grpc.ssl_server_credentials(
        [(tls.material("key"), tls.material("cert"))],
        root_certificates=tls.material("ca"),
        require_client_auth=True,
    )
