"""TLS: the tls role's filters (certificate names, expiry, name constraints), preflight's check of
the lab's own certificate (roles/preflight/filter_plugins/preflight_tls.py), and the lab CA the role
makes on the control node (its tasks run here for real; openssl verifies what they made). The
certificates in use are checked on the stack (test_stack.py: test_the_gateway_speaks_https_only_with_the_lab_ca)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from ansible.errors import AnsibleFilterError
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "roles" / "tls" / "filter_plugins"))
sys.path.insert(0, str(REPO / "roles" / "preflight" / "filter_plugins"))

from preflight_tls import labctl_preflight_read_file, labctl_preflight_tls_problems  # noqa: E402
from tls_filters import labctl_tls_epoch, labctl_tls_name_constraints, labctl_tls_outside, labctl_tls_sans  # noqa: E402

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
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
def lab() -> dict[str, Any]:
    ca_key, key = _key(), _key()
    ca = _ca(ca_key)
    return {"ca_key": ca_key, "ca": ca, "ca_pem": ca.public_bytes(PEM).decode(), "key": key, "key_pem": _key_pem(key)}


def _problems(cert: str, key: str, ca: str, names: list[str] | None = None) -> list[str]:
    return labctl_preflight_tls_problems(cert, key, ca, FILES, names or ["gw01", "192.0.2.20"], now=NOW.timestamp())


def test_a_good_certificate_passes(lab: dict[str, Any]) -> None:
    cert = _cert(lab["key"], lab["ca"], lab["ca_key"], [x509.DNSName("gw01.lab.example"), x509.DNSName("gw01")])
    assert _problems(cert, lab["key_pem"], lab["ca_pem"]) == []


def test_an_address_matches_in_any_spelling(lab: dict[str, Any]) -> None:
    import ipaddress

    cert = _cert(lab["key"], lab["ca"], lab["ca_key"], [x509.IPAddress(ipaddress.ip_address("192.0.2.20"))])
    assert _problems(cert, lab["key_pem"], lab["ca_pem"], ["192.0.2.20"]) == []


def test_a_key_that_is_not_the_certificates_is_named(lab: dict[str, Any]) -> None:
    cert = _cert(lab["key"], lab["ca"], lab["ca_key"], [x509.DNSName("gw01")])
    assert _problems(cert, _key_pem(_key()), lab["ca_pem"]) == [
        "lab_tls_key_file /lab/gw01.key is not the key of lab_tls_cert_file /lab/gw01.crt"]


def test_an_expired_and_a_future_certificate_are_named(lab: dict[str, Any]) -> None:
    expired = _cert(lab["key"], lab["ca"], lab["ca_key"], [x509.DNSName("gw01")], timedelta(days=-400), timedelta(days=-1))
    assert _problems(expired, lab["key_pem"], lab["ca_pem"]) == [
        "lab_tls_cert_file /lab/gw01.crt expired on 2026-12-01 12:00 UTC"]
    future = _cert(lab["key"], lab["ca"], lab["ca_key"], [x509.DNSName("gw01")], timedelta(days=2), timedelta(days=300))
    assert "is valid only from 2026-12-04 12:00 UTC" in _problems(future, lab["key_pem"], lab["ca_pem"])[0]


def test_another_ca_and_other_names_are_named(lab: dict[str, Any]) -> None:
    cert = _cert(lab["key"], lab["ca"], lab["ca_key"], [x509.DNSName("mail.example")])
    other_ca = _ca(_key(), "Other CA").public_bytes(PEM).decode()
    problems = _problems(cert, lab["key_pem"], other_ca)
    assert problems[0].startswith("lab_tls_cert_file /lab/gw01.crt was not issued by lab_tls_ca_file /lab/ca.crt")
    assert "names ['mail.example'], none of this host's names ['gw01', '192.0.2.20']" in problems[1]


def test_unreadable_files_are_named(lab: dict[str, Any], tmp_path: Path) -> None:
    assert _problems("", "", "") == ["lab_tls_cert_file /lab/gw01.crt: missing, unreadable or not a PEM certificate"]
    cert = _cert(lab["key"], lab["ca"], lab["ca_key"], [x509.DNSName("gw01")])
    assert _problems(cert, "", "junk") == [
        "lab_tls_key_file /lab/gw01.key: missing, unreadable, encrypted or not a PEM private key",
        "lab_tls_ca_file /lab/ca.crt: missing, unreadable or not a PEM certificate"]
    assert labctl_preflight_read_file(str(tmp_path / "absent")) == "" and labctl_preflight_read_file("") == ""


def test_certificate_names_and_expiry() -> None:
    assert labctl_tls_sans(["gw01", "192.0.2.20", "gw01", "::1", "", "localhost"]) == [
        "DNS:gw01", "IP:192.0.2.20", "IP:::1", "DNS:localhost"]
    assert labctl_tls_epoch("20271231235959Z") == int(datetime(2027, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp())


# --- the lab CA: name constraints and a passphrase (issue 29, item 6d) ------------------------------
# The role's control-node tasks run for real (ansible-playbook, connection local, community.crypto);
# what they make is checked with the real openssl CLI, as a client's TLS library would check it.

OPENSSL = "openssl"
CA_PASS = "unit-test-ca-passphrase"


def _tls_play(tmp_path: Path, hosts: dict[str, dict[str, object]], *extra: str, **variables: object) -> subprocess.CompletedProcess[str]:
    inventory = tmp_path / "inventories" / "unitlab"
    inventory.mkdir(parents=True, exist_ok=True)
    (inventory / "hosts.yml").write_text(json.dumps({"all": {"children": {"certified": {"hosts": {
        name: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, **values}
        for name, values in hosts.items()}}}}}))
    playbook = tmp_path / "tls.yml"
    playbook.write_text(
        "- name: The tls role's control-node part\n  hosts: certified\n  gather_facts: false\n  tasks:\n"
        "    - name: Certificates\n      ansible.builtin.include_role:\n        name: tls\n"
        "        tasks_from: control_node.yml\n")
    args = {"lab_secrets_dir": str(tmp_path / "secrets"), "lab_tls_ca_dir": str(tmp_path / "tls"), **variables}
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1",
               ANSIBLE_LOCAL_TEMP=str(tmp_path / ".ansible-tmp"), ANSIBLE_HOME=str(tmp_path / ".ansible"))
    return subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory), str(playbook),
                           "-e", json.dumps(args), *extra], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=600, check=False)


def _ok(run: subprocess.CompletedProcess[str]) -> str:
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    return run.stdout


def _changed(run: subprocess.CompletedProcess[str]) -> int:
    total = 0
    for line in _ok(run).splitlines():
        if " : ok=" in line:
            counted = re.search(r"changed=(\d+)", line)
            assert counted, line
            total += int(counted.group(1))
    return total


def _verify(ca: Path, cert: Path) -> subprocess.CompletedProcess[str]:
    """openssl verify, as a client checks a server: the chain up to ca.crt, its name constraints included."""
    return subprocess.run([OPENSSL, "verify", "-CAfile", str(ca), str(cert)], capture_output=True, text=True, check=False)


def _sign_with_ca(tmp_path: Path, ca_dir: Path, san: str, passphrase: str = "") -> Path:
    """A certificate for ``san`` signed with the lab CA's own key by the openssl CLI: what someone who
    holds the key (a copy of the control node's disk) could mint."""
    key, csr, cert = (tmp_path / f"{n}-{re.sub(r'[^a-z0-9]', '_', san.lower())}" for n in ("key", "csr", "crt"))
    ext = tmp_path / "ext.cnf"
    ext.write_text(f"subjectAltName={san}\nextendedKeyUsage=serverAuth\n")
    subprocess.run([OPENSSL, "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", str(key),
                    "-subj", "/CN=outside", "-out", str(csr)], check=True, capture_output=True)
    subprocess.run([OPENSSL, "x509", "-req", "-in", str(csr), "-CA", str(ca_dir / "ca.crt"), "-CAkey", str(ca_dir / "ca.key"),
                    "-passin", f"pass:{passphrase}", "-days", "30", "-extfile", str(ext), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert


def _constraints(ca_crt: Path) -> tuple[bool, list[str]]:
    ext = x509.load_pem_x509_certificate(ca_crt.read_bytes()).extensions.get_extension_for_class(x509.NameConstraints)
    return ext.critical, [f"DNS:{n.value}" if isinstance(n, x509.DNSName) else f"IP:{n.value}"
                          for n in ext.value.permitted_subtrees or []]


def _public(path: Path, passphrase: str = "") -> str:
    return subprocess.run([OPENSSL, "pkey", "-in", str(path), "-passin", f"pass:{passphrase}", "-pubout"],
                          capture_output=True, text=True, check=True).stdout


HOSTS: dict[str, dict[str, object]] = {"gw01": {"ansible_host": "192.0.2.10"}, "mon01": {"ansible_host": "mon01.lab.example"}}


def test_the_lab_ca_vouches_only_for_the_labs_names(tmp_path: Path) -> None:
    ca_dir = tmp_path / "tls"
    first = _tls_play(tmp_path, HOSTS)
    assert _changed(first) > 0
    for host in HOSTS:
        assert _verify(ca_dir / "ca.crt", ca_dir / "hosts" / f"{host}.crt").returncode == 0
    # The CA's own key, used for a name or an address outside the lab: a client refuses it.
    for san in ("DNS:intranet.hospital.example", "IP:203.0.113.5", "DNS:gw01.attacker.example"):
        refused = _verify(ca_dir / "ca.crt", _sign_with_ca(tmp_path, ca_dir, san))
        assert refused.returncode != 0 and "permitted subtree violation" in refused.stdout + refused.stderr, san
    assert _constraints(ca_dir / "ca.crt") == (True, [
        "DNS:gw01", "DNS:localhost", "DNS:mon01", "DNS:mon01.lab.example", "IP:127.0.0.1/32", "IP:192.0.2.10/32"])
    # The CA names no host: Go's verifier (Prometheus, Grafana) reads every subjectAltName of a chain
    # under name constraints as a host name and refused the CA's common name given as one ("x509:
    # cannot parse dnsName \"labctl lab CA (inventory)\"": the stack's litellm target was down).
    ca = x509.load_pem_x509_certificate((ca_dir / "ca.crt").read_bytes())
    assert not [e for e in ca.extensions if isinstance(e.value, x509.SubjectAlternativeName)], ca.extensions
    assert _verify(ca_dir / "ca.crt", _sign_with_ca(tmp_path, ca_dir, "DNS:api.mon01.lab.example")).returncode == 0
    # Idempotent; a run with --limit keeps the other host's names in the CA (ca.crt unchanged).
    before = (ca_dir / "ca.crt").read_bytes()
    assert _changed(_tls_play(tmp_path, HOSTS)) == 0
    assert _changed(_tls_play(tmp_path, HOSTS, "--limit", "gw01")) == 0
    assert (ca_dir / "ca.crt").read_bytes() == before


def test_the_inventorys_domains_and_networks_bound_the_ca(tmp_path: Path) -> None:
    ca_dir = tmp_path / "tls"
    hosts: dict[str, dict[str, object]] = {"gw01.lab.example": {"ansible_host": "192.0.2.10"}}
    outside = _tls_play(tmp_path, hosts, lab_tls_ca_name_constraints=["lab.example", "10.0.0.0/8"])
    assert outside.returncode != 0
    assert ("lab_tls_ca_name_constraints ['lab.example', '10.0.0.0/8'] leaves out these certificate names: "
            "gw01.lab.example: 192.0.2.10") in outside.stdout
    assert not (ca_dir / "ca.key").exists()  # refused before anything was made
    bad = _tls_play(tmp_path, hosts, lab_tls_ca_name_constraints=["*.lab.example"])
    assert bad.returncode != 0 and "lab_tls_ca_name_constraints: '*.lab.example' is neither a DNS name" in bad.stdout
    _ok(_tls_play(tmp_path, hosts, lab_tls_ca_name_constraints=["lab.example", "192.0.2.0/24"]))
    assert _constraints(ca_dir / "ca.crt") == (True, ["DNS:lab.example", "DNS:localhost", "IP:127.0.0.1/32", "IP:192.0.2.0/24"])
    assert _verify(ca_dir / "ca.crt", ca_dir / "hosts" / "gw01.lab.example.crt").returncode == 0
    assert _verify(ca_dir / "ca.crt", _sign_with_ca(tmp_path, ca_dir, "IP:192.0.2.77")).returncode == 0
    assert _verify(ca_dir / "ca.crt", _sign_with_ca(tmp_path, ca_dir, "IP:192.0.3.1")).returncode != 0


def test_a_passphrase_encrypts_the_ca_key(tmp_path: Path) -> None:
    ca_dir = tmp_path / "tls"
    _ok(_tls_play(tmp_path, HOSTS, lab_tls_ca_passphrase=CA_PASS))
    key = ca_dir / "ca.key"
    assert key.read_text().startswith("-----BEGIN ENCRYPTED PRIVATE KEY-----")
    structure = subprocess.run([OPENSSL, "asn1parse", "-in", str(key)], capture_output=True, text=True, check=True).stdout
    assert ":PBES2" in structure and ":PBKDF2" in structure and ":aes-256-cbc" in structure
    assert oct(key.stat().st_mode & 0o777) == "0o600"
    wrong = subprocess.run([OPENSSL, "pkey", "-in", str(key), "-passin", "pass:wrong", "-noout"], capture_output=True, check=False)
    assert wrong.returncode != 0
    assert "PUBLIC KEY" in _public(key, CA_PASS)
    assert _verify(ca_dir / "ca.crt", ca_dir / "hosts" / "gw01.crt").returncode == 0
    assert _changed(_tls_play(tmp_path, HOSTS, lab_tls_ca_passphrase=CA_PASS)) == 0
    forgotten = _tls_play(tmp_path, HOSTS)
    assert forgotten.returncode != 0
    assert f"{ca_dir}/ca.key is encrypted, but lab_tls_ca_passphrase is empty" in forgotten.stdout


def test_an_existing_unconstrained_ca_is_reissued_with_the_same_key(tmp_path: Path) -> None:
    """A lab CA made before name constraints (the role's earlier CA: P-384 key, plain, 0600; CA:TRUE
    pathlen:0 and keyCertSign, cRLSign, both critical; no nameConstraints) and a host certificate it
    signed. The next run keeps the key (encrypting it when a passphrase is set) and re-issues ca.crt
    from it with the constraints: certificates signed before verify against the new ca.crt, and the
    old ca.crt that clients still hold keeps verifying the hosts."""
    ca_dir = tmp_path / "tls"
    (ca_dir / "hosts").mkdir(parents=True)
    ca_dir.chmod(0o700)
    ca_key = _key()
    (ca_dir / "ca.key").write_text(ca_key.private_bytes(PEM, serialization.PrivateFormat.PKCS8,
                                                        serialization.NoEncryption()).decode())
    (ca_dir / "ca.key").chmod(0o600)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "labctl lab CA (unitlab)")])
    now = datetime.now(UTC)
    old_ca = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(ca_key.public_key())
              .serial_number(x509.random_serial_number()).not_valid_before(now - timedelta(days=100))
              .not_valid_after(now + timedelta(days=3000))
              .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
              .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                           data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                                           encipher_only=False, decipher_only=False), critical=True)
              .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
              .sign(ca_key, hashes.SHA256()))
    (ca_dir / "ca.crt").write_bytes(old_ca.public_bytes(PEM))
    old_ca_file = tmp_path / "clients-ca.crt"
    old_ca_file.write_bytes(old_ca.public_bytes(PEM))
    import ipaddress

    signed_before = tmp_path / "gw01-before.crt"
    signed_before.write_text(_cert(_key(), old_ca, ca_key, [x509.DNSName("gw01"), x509.IPAddress(ipaddress.ip_address("192.0.2.10")),
                                                            x509.DNSName("localhost")]))
    (ca_dir / "hosts" / "gw01.crt").write_bytes(signed_before.read_bytes())
    public_before = _public(ca_dir / "ca.key")

    _ok(_tls_play(tmp_path, HOSTS, lab_tls_ca_passphrase=CA_PASS))
    assert (ca_dir / "ca.key").read_text().startswith("-----BEGIN ENCRYPTED PRIVATE KEY-----")
    assert _public(ca_dir / "ca.key", CA_PASS) == public_before  # the same key, now encrypted
    new_ca = x509.load_pem_x509_certificate((ca_dir / "ca.crt").read_bytes())
    assert new_ca.subject == old_ca.subject and new_ca.public_key() == old_ca.public_key()
    assert _constraints(ca_dir / "ca.crt")[0] is True
    assert _verify(ca_dir / "ca.crt", signed_before).returncode == 0
    for host in HOSTS:
        assert _verify(old_ca_file, ca_dir / "hosts" / f"{host}.crt").returncode == 0
        assert _verify(ca_dir / "ca.crt", ca_dir / "hosts" / f"{host}.crt").returncode == 0
    assert _changed(_tls_play(tmp_path, HOSTS, lab_tls_ca_passphrase=CA_PASS)) == 0


@pytest.mark.parametrize("name", ["gw01", "GW01", "api.gw01", "gw01x", "xgw01", "lab.example", "a.lab.example",
                                  "a.b.lab.example", "lab.example.evil", "sub.only.example", "only.example",
                                  "192.0.2.10", "192.0.2.11", "10.1.2.3", "10.2.0.1", "2001:db8::5", "2001:db9::1"])
def test_the_constraint_check_agrees_with_openssl(tmp_path: Path, name: str) -> None:
    """labctl_tls_outside (the role's check before it signs) says what OpenSSL's verification says."""
    import ipaddress

    constraints = ["DNS:gw01", "DNS:lab.example", "DNS:.only.example", "IP:192.0.2.10/32", "IP:10.1.0.0/16",
                   "IP:2001:db8::/32"]
    ca_key = _key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Constrained CA")])
    subtrees: list[x509.GeneralName] = [x509.DNSName(c[4:]) if c.startswith("DNS:") else x509.IPAddress(ipaddress.ip_network(c[3:]))
                                        for c in constraints]
    ca = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(ca_key.public_key())
          .serial_number(1).not_valid_before(datetime.now(UTC) - timedelta(days=1))
          .not_valid_after(datetime.now(UTC) + timedelta(days=30))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.NameConstraints(permitted_subtrees=subtrees, excluded_subtrees=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    try:
        general: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        general = x509.DNSName(name)
    leaf_key = _key()
    leaf = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "leaf")]))
            .issuer_name(subject).public_key(leaf_key.public_key()).serial_number(2)
            .not_valid_before(datetime.now(UTC) - timedelta(days=1))
            .not_valid_after(datetime.now(UTC) + timedelta(days=10))
            .add_extension(x509.SubjectAlternativeName([general]), critical=False).sign(ca_key, hashes.SHA256()))
    (tmp_path / "ca.crt").write_bytes(ca.public_bytes(PEM))
    (tmp_path / "leaf.crt").write_bytes(leaf.public_bytes(PEM))
    openssl_accepts = _verify(tmp_path / "ca.crt", tmp_path / "leaf.crt").returncode == 0
    assert (labctl_tls_outside([name], constraints) == []) == openssl_accepts


def test_name_constraints_from_the_inventory_or_the_certificates() -> None:
    assert labctl_tls_name_constraints([], ["gw01", "192.0.2.10", "localhost", "127.0.0.1", "*.lab.example", "::1", "gw01"]) == [
        "DNS:gw01", "DNS:lab.example", "DNS:localhost", "IP:127.0.0.1/32", "IP:192.0.2.10/32", "IP:::1/128"]
    assert labctl_tls_name_constraints(["Lab.Example", "10.20.0.0/16", "192.0.2.7"], []) == [
        "DNS:lab.example", "DNS:localhost", "IP:10.20.0.0/16", "IP:127.0.0.1/32", "IP:192.0.2.7/32"]
    for bad in ("*.lab.example", "10.0.0.1/8", "10.0.0.0/33", "https://lab.example", "lab example", ""):
        with pytest.raises(AnsibleFilterError, match="lab_tls_ca_name_constraints: "):
            labctl_tls_name_constraints([bad], [])


# --- the no-op re-run asks community.crypto nothing (Issue 31) -------------------------------------

_GATED = ("Create the CA directory (0700)", "Generate the lab CA's key once", "Describe the lab CA (with its name constraints)",
          "Self-sign the lab CA", "Generate this host's key", "Describe this host's certificate (its names)",
          "See whether this host's certificate must be renewed", "Sign this host's certificate with the lab CA",
          "Read the certificate's expiry")


def _outcomes(stdout: str) -> dict[str, set[str]]:
    """Each task's outcomes (ok, changed, skipping, fatal) in a run's output, by task name."""
    found: dict[str, set[str]] = {}
    task = ""
    for line in stdout.splitlines():
        header = re.match(r"^TASK \[(?:tls : )?(.*?)\] \*+", line)
        if header:
            task = header.group(1)
            found.setdefault(task, set())
        elif task and (word := re.match(r"^(ok|changed|skipping|fatal):", line)):
            found[task].add(word.group(1))
    return found


def _gated(stdout: str) -> set[str]:
    outcomes = _outcomes(stdout)
    return {outcome for name, seen in outcomes.items() if name.startswith(_GATED) for outcome in seen}


def test_a_no_op_run_asks_community_crypto_nothing_and_any_change_asks_again(tmp_path: Path) -> None:
    ca_dir = tmp_path / "tls"
    first = _ok(_tls_play(tmp_path, HOSTS))
    assert _gated(first) >= {"ok", "changed"}
    memo = {host: json.loads((ca_dir / "hosts" / f"{host}.memo.json").read_text()) for host in HOSTS}
    for host, record in memo.items():
        assert oct((ca_dir / "hosts" / f"{host}.memo.json").stat().st_mode & 0o777) == "0o600"
        cert = x509.load_pem_x509_certificate((ca_dir / "hosts" / f"{host}.crt").read_bytes())
        assert labctl_tls_epoch(record["not_after"]) == int(cert.not_valid_after_utc.timestamp())
    # Nothing changed: every community.crypto task is skipped, the run changes nothing.
    again = _tls_play(tmp_path, HOSTS)
    assert _changed(again) == 0 and _gated(again.stdout) == {"skipping"}
    # A file changed by hand: the tasks run and put it back.
    (ca_dir / "hosts" / "gw01.crt").chmod(0o600)
    repaired = _tls_play(tmp_path, HOSTS)
    assert _changed(repaired) > 0 and oct((ca_dir / "hosts" / "gw01.crt").stat().st_mode & 0o777) == "0o644"
    assert _gated(_tls_play(tmp_path, HOSTS).stdout) == {"skipping"}
    # A new name: the certificate is signed again with it.
    extra = _tls_play(tmp_path, HOSTS, lab_tls_extra_names=["gw01.lab.example"])
    assert _changed(extra) > 0
    cert = x509.load_pem_x509_certificate((ca_dir / "hosts" / "gw01.crt").read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "gw01.lab.example" in sans.get_values_for_type(x509.DNSName)
    # A certificate due for renewal (its recorded expiry within tls_renew_days): the tasks look again.
    record = json.loads((ca_dir / "hosts" / "gw01.memo.json").read_text())
    soon = (datetime.now(UTC) + timedelta(days=10)).strftime("%Y%m%d%H%M%SZ")
    (ca_dir / "hosts" / "gw01.memo.json").write_text(json.dumps({**record, "not_after": soon}))
    due = _tls_play(tmp_path, HOSTS, lab_tls_extra_names=["gw01.lab.example"])
    assert _changed(due) == 0 and "ok" in _gated(due.stdout)
    assert json.loads((ca_dir / "hosts" / "gw01.memo.json").read_text())["not_after"] == record["not_after"]


def test_a_wrong_passphrase_still_stops_the_run(tmp_path: Path) -> None:
    _ok(_tls_play(tmp_path, HOSTS, lab_tls_ca_passphrase=CA_PASS))
    assert _gated(_tls_play(tmp_path, HOSTS, lab_tls_ca_passphrase=CA_PASS).stdout) == {"skipping"}
    wrong = _tls_play(tmp_path, HOSTS, lab_tls_ca_passphrase="not-the-passphrase")
    assert wrong.returncode != 0 and "fatal" in _gated(wrong.stdout), wrong.stdout[-3000:]


def test_the_memo_digest_follows_every_file_and_input(tmp_path: Path) -> None:
    from tls_filters import labctl_tls_memo

    files = [tmp_path / "a", tmp_path / "b"]
    for f in files:
        f.write_text("x")
    paths = [str(f) for f in files]
    base = labctl_tls_memo(paths, {"sans": ["DNS:gw01"]})
    assert base and base == labctl_tls_memo(paths, {"sans": ["DNS:gw01"]})
    assert labctl_tls_memo(paths, {"sans": ["DNS:gw02"]}) != base
    files[1].chmod(0o600)
    assert labctl_tls_memo(paths, {"sans": ["DNS:gw01"]}) != base
    files[1].chmod(0o644)
    files[0].write_text("y")
    assert labctl_tls_memo(paths, {"sans": ["DNS:gw01"]}) != base
    files[0].unlink()
    assert labctl_tls_memo(paths, {"sans": ["DNS:gw01"]}) == ""
    key = tmp_path / "ca.key"
    key.write_bytes(_key().private_bytes(PEM, serialization.PrivateFormat.PKCS8,
                                         serialization.BestAvailableEncryption(CA_PASS.encode())))
    assert labctl_tls_memo([str(key)], {}, CA_PASS, str(key))
    assert labctl_tls_memo([str(key)], {}, "wrong", str(key)) == ""
