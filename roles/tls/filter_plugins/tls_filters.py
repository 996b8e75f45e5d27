"""The tls role's filters."""

from __future__ import annotations

import calendar
import hashlib
import ipaddress
import json
import os
import re
import stat
import time
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleFilterError

_DNS = re.compile(r"^\.?[A-Za-z0-9_](?:[A-Za-z0-9_-]*[A-Za-z0-9_])?(?:\.[A-Za-z0-9_](?:[A-Za-z0-9_-]*[A-Za-z0-9_])?)*$")


def labctl_tls_sans(names: list[str]) -> list[str]:
    """subjectAltName entries for names: IP:<address> for an address, DNS:<name> otherwise."""
    sans: list[str] = []
    for name in names:
        text = str(name).strip()
        if not text:
            continue
        try:
            entry = f"IP:{ipaddress.ip_address(text)}"
        except ValueError:
            entry = f"DNS:{text}"
        if entry not in sans:
            sans.append(entry)
    return sans


def labctl_tls_epoch(asn1_time: str) -> int:
    """Unix time of an ASN.1 time as community.crypto reports it (20271231235959Z, UTC)."""
    return calendar.timegm(time.strptime(str(asn1_time), "%Y%m%d%H%M%SZ"))


def _constraint(entry: str, variable: str) -> str:
    """One name constraint in community.crypto's spelling: IP:<network> for an address or a network
    (an address is a /32 or /128), DNS:<name> for a DNS name or domain (".lab.example": only below it)."""
    text = str(entry).strip()
    try:
        return f"IP:{ipaddress.ip_network(text, strict=True)}"
    except ValueError as exc:
        if "/" in text or (":" in text and not _DNS.match(text)):
            raise AnsibleFilterError(f"{variable}: {entry!r} is not an IP network ({exc})") from exc
    if not _DNS.match(text) or len(text) > 253:
        raise AnsibleFilterError(f"{variable}: {entry!r} is neither a DNS name or domain (lab.example, .lab.example) "
                                 "nor an IP address or network (10.20.0.0/16); no wildcards")
    return f"DNS:{text.lower()}"


def _sorted(constraints: set[str]) -> list[str]:
    """DNS first, then IP, each in order: the CA's extension comes out the same on every run."""
    def key(item: str) -> tuple[int, Any]:
        if item.startswith("IP:"):
            net = ipaddress.ip_network(item[3:])
            return (1, (net.version, net.network_address.packed, net.prefixlen))
        return (0, item)
    return sorted(constraints, key=key)


def labctl_tls_name_constraints(explicit: list[str], names: list[str], variable: str = "lab_tls_ca_name_constraints") -> list[str]:
    """The lab CA's permitted subtrees (X.509 nameConstraints, RFC 5280 4.2.1.10), community.crypto's
    spelling. ``explicit`` (the inventory's domains and networks) when given, plus localhost and the
    loopback addresses every certificate names; else exactly ``names``: the names of the certificates
    the CA signs (a DNS name also permits the names below it; an address is a /32 or /128; a
    wildcard name *.x permits x)."""
    if explicit:
        found = {_constraint(e, variable) for e in explicit}
        return _sorted(found | {"DNS:localhost", "IP:127.0.0.1/32"})
    derived: set[str] = set()
    for name in names:
        text = str(name).strip()
        if text:
            derived.add(_constraint(text.removeprefix("*."), "the certificate names (tls_names)"))
    return _sorted(derived)


def _covered(name: str, constraint: str) -> bool:
    """OpenSSL 3's matching (crypto/x509/v3_ncons.c nc_dns, nc_ip): a DNS name is covered by the same
    name or a domain above it (".x" only below it), case-insensitive; an address by a network of its
    family that holds it. A constraint of the other type does not apply."""
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        address = None
    if constraint.startswith("IP:"):
        if address is None:
            return False
        network = ipaddress.ip_network(constraint[3:])
        return network.version == address.version and address in network
    if address is not None:
        return False
    dns, base = name.lower().rstrip("."), constraint[4:].lower()
    if base.startswith("."):
        return dns.endswith(base)
    return dns == base or dns.endswith("." + base)


def labctl_tls_outside(names: list[str], constraints: list[str]) -> list[str]:
    """The names (DNS names or addresses) that none of the constraints covers, as OpenSSL decides when
    it verifies a certificate: a name of a type the constraints do not list is not limited."""
    kinds = {c.split(":", 1)[0] for c in constraints}
    outside = []
    for name in names:
        text = str(name).strip()
        if not text:
            continue
        try:
            ipaddress.ip_address(text)
            kind = "IP"
        except ValueError:
            kind = "DNS"
        if kind in kinds and not any(_covered(text, c) for c in constraints if c.startswith(kind + ":")):
            outside.append(text)
    return outside


def labctl_tls_signed_names(ca_dir: str) -> dict[str, list[str]]:
    """Per host, the names (DNS and IP subjectAltNames) of the certificates the lab CA signed before
    (``<ca_dir>/hosts/<host>.crt`` on the control node): the constraints keep covering them, so a run
    with --limit never narrows the CA below a certificate it issued."""
    from cryptography import x509

    found: dict[str, list[str]] = {}
    for path in sorted(Path(ca_dir, "hosts").glob("*.crt")):
        try:
            cert = x509.load_pem_x509_certificate(path.read_bytes())
            sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        except (OSError, ValueError, x509.ExtensionNotFound):
            continue
        found[path.stem] = [str(v) for v in sans.get_values_for_type(x509.DNSName)] + [
            str(v) for v in sans.get_values_for_type(x509.IPAddress)]
    return found


def labctl_tls_names_by_host(signed: dict[str, list[str]], hosts: list[str], hostvars: Any) -> dict[str, list[str]]:
    """Per host, the names of its certificate: ``signed`` (labctl_tls_signed_names), where the hosts of
    this play replace their entry with the names they get now (the role's own __tls_cert_names; a
    host with the lab's own certificate has none)."""
    now = {str(h): [str(n) for n in hostvars[h]["__tls_cert_names"]] for h in hosts if "__tls_cert_names" in hostvars[h]}
    return {**signed, **now}


def labctl_tls_constraint_problems(names_by_host: dict[str, list[str]], constraints: list[str]) -> list[str]:
    """"<host>: <name>, <name>" for each host with names the constraints leave out."""
    problems = []
    for host, names in sorted(names_by_host.items()):
        outside = labctl_tls_outside(names, constraints)
        if outside:
            problems.append(f"{host}: {', '.join(outside)}")
    return problems


def labctl_tls_key_state(path: str) -> str:
    """absent, encrypted or plain: the lab CA key's state on the control node, read from its PEM
    header (PKCS#8 "ENCRYPTED PRIVATE KEY" or the traditional "Proc-Type: 4,ENCRYPTED"); nothing of
    the key leaves this function."""
    try:
        head = Path(path).read_text(encoding="ascii", errors="replace")[:200]
    except FileNotFoundError:
        return "absent"
    except OSError as exc:
        raise AnsibleFilterError(f"{path}: cannot read the lab CA's key ({exc})") from exc
    return "encrypted" if "ENCRYPTED" in head else "plain"


def labctl_tls_memo(paths: list[str], inputs: Any, passphrase: str = "", key: str = "") -> str:
    """A digest of everything the lab CA's tasks read and write for one host: the files (mode, owner
    and content of each) and the tasks' inputs (names, constraints, lifetimes). The tasks ran and left
    everything current when it was recorded; the same digest now means they would change nothing again
    (their only other input is the time: the renewal is judged apart). '' - never a match - when a
    file is missing or `passphrase` does not open the key at `key` (the tasks then say so)."""
    digest = hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode())
    for path in paths:
        try:
            st = os.lstat(path)
            content = Path(path).read_bytes() if stat.S_ISREG(st.st_mode) else b""
        except OSError:
            return ""
        digest.update(f"{path}\0{st.st_mode:o}\0{st.st_uid}\0{st.st_gid}\0".encode())
        digest.update(hashlib.sha256(content).digest())
    if key and passphrase:
        from cryptography.hazmat.primitives.serialization import load_pem_private_key

        try:
            load_pem_private_key(Path(key).read_bytes(), password=passphrase.encode())
        except (OSError, ValueError, TypeError):
            return ""
    return digest.hexdigest()


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"labctl_tls_epoch": labctl_tls_epoch, "labctl_tls_sans": labctl_tls_sans,
                "labctl_tls_name_constraints": labctl_tls_name_constraints, "labctl_tls_outside": labctl_tls_outside,
                "labctl_tls_signed_names": labctl_tls_signed_names, "labctl_tls_key_state": labctl_tls_key_state,
                "labctl_tls_constraint_problems": labctl_tls_constraint_problems,
                "labctl_tls_names_by_host": labctl_tls_names_by_host, "labctl_tls_memo": labctl_tls_memo}
