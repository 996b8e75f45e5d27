"""Preflight's check of the lab's own TLS certificate (lab_tls_cert_file, lab_tls_key_file,
lab_tls_ca_file): read on the control node, refused before anything changes, naming the cause."""

from __future__ import annotations

import ipaddress
from datetime import UTC, datetime
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization


def _names(cert: x509.Certificate) -> set[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return {str(n) for n in san.get_values_for_type(x509.DNSName)} | {str(a) for a in san.get_values_for_type(x509.IPAddress)}


def _normal(name: str) -> str:
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        return name.lower().rstrip(".")


def labctl_preflight_tls_problems(cert_pem: str, key_pem: str, ca_pem: str, files: dict[str, str], names: list[str],
                                  now: float | None = None) -> list[str]:
    """Problems with a given certificate: unreadable files, a key that is not the certificate's,
    a certificate not yet valid or expired, one the CA did not sign, one that names none of the
    host's names. ``files``: the variables' values (cert, key, ca) for the messages."""
    problems: list[str] = []
    try:
        cert = x509.load_pem_x509_certificate(cert_pem.encode())
    except ValueError:
        return [f"lab_tls_cert_file {files['cert']}: missing, unreadable or not a PEM certificate"]
    try:
        key = serialization.load_pem_private_key(key_pem.encode(), password=None)
    except (ValueError, TypeError):
        problems.append(f"lab_tls_key_file {files['key']}: missing, unreadable, encrypted or not a PEM private key")
        key = None
    if key is not None:
        def der(public: Any) -> bytes:
            return bytes(public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo))

        if der(key.public_key()) != der(cert.public_key()):
            problems.append(f"lab_tls_key_file {files['key']} is not the key of lab_tls_cert_file {files['cert']}")
    moment = datetime.fromtimestamp(now, UTC) if now is not None else datetime.now(UTC)
    if cert.not_valid_after_utc <= moment:
        problems.append(f"lab_tls_cert_file {files['cert']} expired on {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC")
    elif cert.not_valid_before_utc > moment:
        problems.append(f"lab_tls_cert_file {files['cert']} is valid only from {cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC")
    try:
        ca = x509.load_pem_x509_certificate(ca_pem.encode())
    except ValueError:
        problems.append(f"lab_tls_ca_file {files['ca']}: missing, unreadable or not a PEM certificate")
    else:
        try:
            cert.verify_directly_issued_by(ca)
        except (ValueError, TypeError, InvalidSignature):
            problems.append(f"lab_tls_cert_file {files['cert']} was not issued by lab_tls_ca_file {files['ca']}"
                            " (give the CA that signed it; an intermediate goes after the certificate in its file)")
    held = {_normal(n) for n in _names(cert)}
    wanted = [n for n in names if n]
    if not held & {_normal(n) for n in wanted}:
        problems.append(f"lab_tls_cert_file {files['cert']} names {sorted(held) or 'nothing (no subjectAltName)'},"
                        f" none of this host's names {wanted} (add the one clients use to lab_tls_extra_names)")
    return problems


def labctl_preflight_read_file(path: str) -> str:
    """A control-node file's text, '' when the path is empty or unreadable (the checks say which)."""
    if not path:
        return ""
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError):
        return ""


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"labctl_preflight_read_file": labctl_preflight_read_file,
                "labctl_preflight_tls_problems": labctl_preflight_tls_problems}
