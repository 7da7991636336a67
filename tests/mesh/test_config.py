"""Configuration errors: exit code 2, one clear line on stderr, no traceback, nothing served."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from countersign._daemon.tls import PeerIdentity, create_ca, issue_certificate
from countersign.canonical import b64url_encode
from countersign.client.tls import TlsConfig
from countersign.errors import ConfigError
from countersign.keys import Ed25519Signer
from countersign_cli.localmesh import write_toml

pytestmark = pytest.mark.daemons


def base(daemon: str, tmp_path: Path) -> dict[str, object]:
    """A configuration of ``daemon`` that would be valid with a [tls] table."""
    body: dict[str, object] = {
        "operator_public_key": b64url_encode(Ed25519Signer.generate().public_key),
        "listen": "127.0.0.1:0",
        "metrics_listen": "127.0.0.1:0",
        "ready_file": str(tmp_path / "ready"),
    }
    if daemon in ("signer", "verifier"):
        body |= {"coordinator": "127.0.0.1:1", "registry_cache": str(tmp_path / "registry.json")}
    if daemon == "signer":
        body |= {"deployer": "deployer-a", "signer_key": f"file:{tmp_path / 'missing.jwk'}"}
    return body


LOOPBACK_PLAINTEXT = {"insecure_loopback": True}
CASES = {
    "unknown-key": ({"retention_days": 7, "tls": LOOPBACK_PLAINTEXT}, "unknown setting(s) retention_days"),
    "unknown-tls-key": ({"tls": {"insecure_loopback": True, "cipher": "x"}}, "unknown setting(s) cipher"),
    "wrong-type": ({"listen": 7402, "tls": LOOPBACK_PLAINTEXT}, "listen must be a string"),
    "wrong-type-bool": ({"tls": {"insecure_loopback": "yes"}}, "insecure_loopback must be true or false"),
    "tls-missing": ({}, "tls.ca (or tls.ca_pem) is required, or tls.insecure_loopback"),
    "tls-file-missing": ({"tls": {"ca": "/nonexistent/ca.pem"}}, "tls.ca /nonexistent/ca.pem is not a readable file"),
    "plaintext-off-loopback": (
        {"listen": "0.0.0.0:0", "tls": LOOPBACK_PLAINTEXT},
        "tls.insecure_loopback is only allowed on loopback; listen is 0.0.0.0:0",
    ),
    "no-lanes": ({"lanes_per_client": 0, "tls": LOOPBACK_PLAINTEXT}, "lanes_per_client must be between 1 and"),
    "lanes-over-total": (
        {"lanes_per_client": 9, "max_lanes": 8, "tls": LOOPBACK_PLAINTEXT},
        "lanes_per_client must be between 1 and max_lanes",
    ),
    "signature-threads": (
        {"signature_threads": 0, "tls": LOOPBACK_PLAINTEXT},
        "signature_threads must be between 1 and 16",
    ),
    "prefix-cache": (
        {"prefix_cache_entries": -1, "tls": LOOPBACK_PLAINTEXT},
        "prefix_cache_entries must be between 0 and 1000000",
    ),
}
SIGNER_CASES = {
    "no-peer-lanes": ({"lanes_per_peer": 0, "tls": LOOPBACK_PLAINTEXT}, "lanes_per_peer must be between 1 and 64"),
    "lane-idle": ({"lane_idle_ms": 0, "tls": LOOPBACK_PLAINTEXT}, "lane_idle_ms must be positive"),
}


def serve(daemon: str, config: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COUNTERSIGN_")}
    argv = [sys.executable, "-m", "countersign_cli", daemon, "serve", "--config", str(config)]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)


# Every case for the verifier; the main ones for the other two daemons (the loader is shared).
PAIRS = (
    [("verifier", case) for case in CASES]
    + [
        (daemon, case)
        for daemon in ("signer", "coordinator")
        for case in ("unknown-key", "wrong-type", "tls-missing", "plaintext-off-loopback")
    ]
    + [("signer", case) for case in SIGNER_CASES]
)
CASES |= SIGNER_CASES


@pytest.mark.parametrize(("daemon", "case"), PAIRS)
def test_bad_configuration_exits_2_with_one_line(tmp_path: Path, daemon: str, case: str) -> None:
    changes, expected = CASES[case]
    config = tmp_path / f"{case}.toml"
    write_toml(config, base(daemon, tmp_path) | changes)
    assert expected in refused_with_one_line(daemon, config, tmp_path)


def refused_with_one_line(daemon: str, config: Path, tmp_path: Path) -> str:
    """Serve ``config``; assert the daemon refused it (exit 2, one line on stderr, no traceback,
    nothing served) and return that line."""
    done = serve(daemon, config)
    lines = done.stderr.splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"countersign {daemon}: bad configuration: "), lines[0]
    assert "Traceback" not in done.stderr
    assert done.stdout == ""
    assert not (tmp_path / "ready").exists()
    return lines[0]


def test_missing_config_file(tmp_path: Path) -> None:
    done = serve("verifier", tmp_path / "absent.toml")
    assert done.returncode == 2
    absent = tmp_path / "absent.toml"
    expected = f"countersign verifier: bad configuration: cannot read config {absent}: No such file or directory"
    assert done.stderr.splitlines() == [expected]


def _expired_copy(
    certificate: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, valid_days: tuple[int, int]
) -> x509.Certificate:
    """``certificate`` (same names and key) re-signed by the CA, valid only from ``valid_days[0]`` to
    ``valid_days[1]`` days ago."""
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(certificate.subject)
        .issuer_name(certificate.issuer)
        .public_key(certificate.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=valid_days[0]))
        .not_valid_after(now - datetime.timedelta(days=valid_days[1]))
        .sign(ca_key, hashes.SHA256())
    )


def _material(tmp_path: Path) -> dict[str, Path]:
    """A development CA and a verifier certificate, a second certificate, and bad material beside them."""
    ca_dir = tmp_path / "ca"
    create_ca(ca_dir)
    cert, key = issue_certificate(ca_dir, tmp_path / "certs", "verifier", PeerIdentity("verifier"))
    _, other_key = issue_certificate(ca_dir, tmp_path / "certs", "other", PeerIdentity("verifier"))
    ca_key = serialization.load_pem_private_key((ca_dir / "ca.key").read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    leaf = x509.load_pem_x509_certificate(cert.read_bytes())
    ca = x509.load_pem_x509_certificate((ca_dir / "ca.pem").read_bytes())
    expired = _expired_copy(leaf, ca_key, valid_days=(2, 1))
    retired_ca = _expired_copy(ca, ca_key, valid_days=(400, 35))
    paths = {"ca": ca_dir / "ca.pem", "cert": cert, "key": key, "other_key": other_key}
    paths["expired"] = tmp_path / "expired.pem"
    paths["expired"].write_bytes(expired.public_bytes(serialization.Encoding.PEM))
    paths["expired_ca"] = tmp_path / "expired-ca.pem"
    paths["expired_ca"].write_bytes(retired_ca.public_bytes(serialization.Encoding.PEM))
    paths["ca_bundle"] = tmp_path / "ca-bundle.pem"  # a retired CA kept beside its successor
    paths["ca_bundle"].write_bytes(paths["expired_ca"].read_bytes() + paths["ca"].read_bytes())
    paths["garbage"] = tmp_path / "garbage.pem"
    paths["garbage"].write_text(f"-----BEGIN PRIVATE KEY-----\n{SECRET_LOOKING}\n-----END PRIVATE KEY-----\n")
    return paths


SECRET_LOOKING = "c2VjcmV0LWxvb2tpbmctYnl0ZXMtdGhhdC1tdXN0LW5vdC1sZWFr"
MATERIAL_CASES = {
    "ca-garbage": ({"ca": "garbage"}, "tls.ca {garbage} holds no PEM certificate"),
    "cert-garbage": ({"cert": "garbage"}, "tls.cert {garbage} holds no PEM certificate"),
    "cert-is-a-key": ({"cert": "key"}, "tls.cert {key} holds no PEM certificate"),
    "key-garbage": ({"key": "garbage"}, "tls.key {garbage} holds no unencrypted PEM private key"),
    "key-is-a-cert": ({"key": "cert"}, "tls.key {cert} holds no unencrypted PEM private key"),
    "key-of-another-cert": ({"key": "other_key"}, "tls.key {other_key} is not the key of tls.cert {cert}"),
    "cert-expired": ({"cert": "expired"}, "tls.cert {expired} expired at"),
    "ca-expired": ({"ca": "expired_ca"}, "every certificate in tls.ca {expired_ca} has expired"),
}


@pytest.mark.parametrize("case", MATERIAL_CASES)
def test_bad_tls_material_is_named_before_any_port_is_bound(tmp_path: Path, case: str) -> None:
    """Material gRPC cannot use would otherwise surface only as "cannot listen" (or a failed dial):
    each is a one-line configuration error naming the setting and file, never the file's bytes."""
    paths = _material(tmp_path)
    choice, expected = MATERIAL_CASES[case]
    tls = {name: str(paths[choice.get(name, name)]) for name in ("ca", "cert", "key")}
    config = tmp_path / f"{case}.toml"
    write_toml(config, base("verifier", tmp_path) | {"tls": tls})
    line = refused_with_one_line("verifier", config, tmp_path)  # the one line: no secret elsewhere
    assert expected.format(**{name: str(path) for name, path in paths.items()}) in line
    assert SECRET_LOOKING not in line


def test_good_tls_material_passes_the_same_checks(tmp_path: Path) -> None:
    paths = _material(tmp_path)
    for ca in (paths["ca"], paths["ca_bundle"]):
        tls = TlsConfig(ca=str(ca), cert=str(paths["cert"]), key=str(paths["key"]))
        tls.validate("verifier")  # raises ConfigError on any of the cases above
    inline = TlsConfig(
        ca_pem=paths["ca"].read_text(), cert_pem=paths["cert"].read_text(), key_pem=paths["other_key"].read_text()
    )
    with pytest.raises(ConfigError, match=r"tls\.key_pem is not the key of tls\.cert_pem"):
        inline.validate("verifier")
