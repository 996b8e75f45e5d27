"""TLS: the tls role's filters (certificate names, expiry) and preflight's check of the lab's own
certificate (roles/preflight/filter_plugins/preflight_tls.py). The certificates the role makes are
checked on the stack (test_stack.py: test_the_gateway_speaks_https_only_with_the_lab_ca)."""

from __future__ import annotations

import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "roles" / "tls" / "filter_plugins"))
sys.path.insert(0, str(REPO / "roles" / "preflight" / "filter_plugins"))

from preflight_tls import labctl_preflight_read_file, labctl_preflight_tls_problems  # noqa: E402
from tls_filters import labctl_tls_epoch, labctl_tls_sans  # noqa: E402

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=timezone.utc)
FILES = {"cert": "/lab/gw01.crt", "key": "/lab/gw01.key", "ca": "/lab/ca.crt"}
PEM = serialization.Encoding.PEM


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()


def _ca(key: ec.EllipticCurvePrivateKey, name: str = "Lab CA") -> x509.Certificate:
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(1).not_valid_before(NOW - timedelta(days=10)).not_valid_after(NOW + timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True).sign(key, hashes.SHA256()))


def _cert(key: ec.EllipticCurvePrivateKey, ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey,
          names: list[x509.GeneralName], before: timedelta = timedelta(days=-1), after: timedelta = timedelta(days=300)) -> str:
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gw01")]))
            .issuer_name(ca.subject).public_key(key.public_key()).serial_number(2)
            .not_valid_before(NOW + before).not_valid_after(NOW + after)
            .add_extension(x509.SubjectAlternativeName(names), critical=False).sign(ca_key, hashes.SHA256()))
    return cert.public_bytes(PEM).decode()


@pytest.fixture(scope="module")
def lab() -> dict[str, object]:
    ca_key, key = _key(), _key()
    ca = _ca(ca_key)
    return {"ca_key": ca_key, "ca": ca, "ca_pem": ca.public_bytes(PEM).decode(), "key": key, "key_pem": _key_pem(key)}


def _problems(cert: str, key: str, ca: str, names: list[str] | None = None) -> list[str]:
    return labctl_preflight_tls_problems(cert, key, ca, FILES, names or ["gw01", "192.0.2.20"], now=NOW.timestamp())


def test_a_good_certificate_passes(lab: dict) -> None:
    cert = _cert(lab["key"], lab["ca"], lab["ca_key"], [x509.DNSName("gw01.lab.example"), x509.DNSName("gw01")])
    assert _problems(cert, lab["key_pem"], lab["ca_pem"]) == []


def test_an_address_matches_in_any_spelling(lab: dict) -> None:
    import ipaddress

    cert = _cert(lab["key"], lab["ca"], lab["ca_key"], [x509.IPAddress(ipaddress.ip_address("192.0.2.20"))])
    assert _problems(cert, lab["key_pem"], lab["ca_pem"], ["192.0.2.20"]) == []


def test_a_key_that_is_not_the_certificates_is_named(lab: dict) -> None:
    cert = _cert(lab["key"], lab["ca"], lab["ca_key"], [x509.DNSName("gw01")])
    assert _problems(cert, _key_pem(_key()), lab["ca_pem"]) == [
        "lab_tls_key_file /lab/gw01.key is not the key of lab_tls_cert_file /lab/gw01.crt"]


def test_an_expired_and_a_future_certificate_are_named(lab: dict) -> None:
    expired = _cert(lab["key"], lab["ca"], lab["ca_key"], [x509.DNSName("gw01")], timedelta(days=-400), timedelta(days=-1))
    assert _problems(expired, lab["key_pem"], lab["ca_pem"]) == [
        "lab_tls_cert_file /lab/gw01.crt expired on 2026-12-01 12:00 UTC"]
    future = _cert(lab["key"], lab["ca"], lab["ca_key"], [x509.DNSName("gw01")], timedelta(days=2), timedelta(days=300))
    assert "is valid only from 2026-12-04 12:00 UTC" in _problems(future, lab["key_pem"], lab["ca_pem"])[0]


def test_another_ca_and_other_names_are_named(lab: dict) -> None:
    cert = _cert(lab["key"], lab["ca"], lab["ca_key"], [x509.DNSName("mail.example")])
    other_ca = _ca(_key(), "Other CA").public_bytes(PEM).decode()
    problems = _problems(cert, lab["key_pem"], other_ca)
    assert problems[0].startswith("lab_tls_cert_file /lab/gw01.crt was not issued by lab_tls_ca_file /lab/ca.crt")
    assert "names ['mail.example'], none of this host's names ['gw01', '192.0.2.20']" in problems[1]


def test_unreadable_files_are_named(lab: dict, tmp_path: Path) -> None:
    assert _problems("", "", "") == ["lab_tls_cert_file /lab/gw01.crt: missing, unreadable or not a PEM certificate"]
    cert = _cert(lab["key"], lab["ca"], lab["ca_key"], [x509.DNSName("gw01")])
    assert _problems(cert, "", "junk") == [
        "lab_tls_key_file /lab/gw01.key: missing, unreadable, encrypted or not a PEM private key",
        "lab_tls_ca_file /lab/ca.crt: missing, unreadable or not a PEM certificate"]
    assert labctl_preflight_read_file(str(tmp_path / "absent")) == "" and labctl_preflight_read_file("") == ""


def test_certificate_names_and_expiry() -> None:
    assert labctl_tls_sans(["gw01", "192.0.2.20", "gw01", "::1", "", "localhost"]) == [
        "DNS:gw01", "IP:192.0.2.20", "IP:::1", "DNS:localhost"]
    assert labctl_tls_epoch("20271231235959Z") == int(datetime(2027, 12, 31, 23, 59, 59, tzinfo=timezone.utc).timestamp())
