"""Bad input stops site.yml before anything changes, and the running service keeps serving (issue 8).

site.yml runs the way an operator would, against the converged stack, with bad input: extra
vars, a doctored copy of the bundle (hard links of the test bundle on the control node, the
changed files rewritten, re-signed with the bundle key where the case is a well-signed but wrong
bundle), or a full file system under lab_model_root. While it runs, a steady stream of chat
completions goes through the gateway. Each cause's test asserts: the run failed, its message
names the cause, the recap shows changed=0, it stopped in the expected check (preflight, or the
bundle verification that runs before the target is touched), the files the stack is made of and
the services' PIDs are unchanged, and no request of the stream failed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC
from pathlib import Path
from typing import Any

import pytest
from test_stack import ENV_FILE, PUBLIC, REPLICAS, _main_pids, _report, _site  # the scenario's helpers (same directory)

from labctl.bundle.gpg import SigningKey
from labctl.paths import default_key_dir

BUNDLE = Path(os.environ["LABCTL_BUNDLE"])
MODEL = "models/tiny-llama/r1"
FULL = "/srv/bad-input-full"
# What the stack is made of: a changed file (content, size, mtime, mode or owner) shows here.
WATCHED = ["/etc/labctl", "/etc/systemd/system", "/etc/apt", "/etc/pip.conf", "/etc/sysctl.d", "/etc/prometheus",
           "/etc/redis", "/etc/default", "/srv/models", "/opt/labctl/tiktoken"]
TIMES: dict[str, float] = {}


def _manifest(root: Path) -> dict[str, Any]:
    return json.loads((root / "manifest.json").read_text())


def _rewrite(path: Path, data: bytes) -> None:
    """New content under the same name, without touching the hard-linked original."""
    path.unlink()
    path.write_bytes(data)


def _resign(root: Path, manifest: dict[str, Any]) -> None:
    """Write the manifest and sign it with the bundle key: a well-signed bundle with wrong content."""
    (root / "manifest.json").unlink()
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    (root / "manifest.json.sig").unlink()
    key = SigningKey(default_key_dir(), os.environ["LABCTL_BUNDLE_FINGERPRINT"])
    try:
        key.detach_sign(root / "manifest.json", root / "manifest.json.sig")
    finally:
        key.close()


def _without_model(root: Path) -> None:
    """No model at all (the test bundle also carries tiny-embed, for the two-model test)."""
    manifest = _manifest(root)
    shutil.rmtree(root / "models")
    manifest["files"] = [f for f in manifest["files"] if not f["path"].startswith("models/")]
    manifest["components"]["models"] = []
    _resign(root, manifest)


def _tampered(root: Path) -> None:
    """One byte of a package changed, same size; the signed manifest is left as it was."""
    deb = next(f["path"] for f in _manifest(root)["files"] if f["path"].endswith(".deb"))
    data = bytearray((root / deb).read_bytes())
    data[len(data) // 2] ^= 0xFF
    _rewrite(root / deb, bytes(data))


def _truncated_weights(root: Path) -> None:
    weights = root / MODEL / "model.safetensors"
    _rewrite(weights, weights.read_bytes()[: weights.stat().st_size // 2])


def _wrong_tiktoken(root: Path) -> None:
    """o200k_base.tiktoken carries cl100k_base's content, and the re-signed manifest says so."""
    manifest = _manifest(root)
    data = (root / "tiktoken" / "cl100k_base.tiktoken").read_bytes()
    _rewrite(root / "tiktoken" / "o200k_base.tiktoken", data)
    for entry in manifest["files"]:
        if entry["path"] == "tiktoken/o200k_base.tiktoken":
            entry.update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
    _resign(root, manifest)


def _tampered_and_truncated(root: Path) -> None:
    _tampered(root)
    _truncated_weights(root)


@contextmanager
def _bundle(mutate: Callable[[Path], None]) -> Iterator[list[str]]:
    """A doctored copy of the test bundle, served from the control node; removed afterwards."""
    # Beside the bundle: hard links need the same file system.
    tmp = Path(tempfile.mkdtemp(prefix=".bad-input-", dir=BUNDLE.parent))
    try:
        root = tmp / "bundle"
        shutil.copytree(BUNDLE, root, copy_function=os.link)
        mutate(root)
        yield ["-e", "lab_bundle_source=control", "-e", f"lab_bundle_src={root}"]
    finally:
        shutil.rmtree(tmp)


@dataclass
class Run:
    """One site.yml run with several bad inputs: preflight, like the bundle verification, reports
    every problem it finds at once, and any one of them stops the run. So each cause's test checks
    its own message in a shared run; four runs cover the fifteen causes."""

    extra: list[str]
    # The task that stops the run: preflight's, or the bundle verification on the control node.
    stops_in: str
    bundle: Callable[[Path], None] | None = None
    full_disk: bool = False
    # ufw switched on (its settings file says ENABLED=yes) during the run.
    ufw_on: bool = False


def _bad_tls_files() -> list[str]:
    """The lab's "own" certificate, gone wrong twice over: expired yesterday, and the key given is
    another key (control-node files, made with the cryptography library labctl's venv has)."""
    from datetime import datetime, timedelta

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    where = Path(tempfile.mkdtemp(prefix="bad-tls-"))
    now = datetime.now(UTC)
    ca_key, key, other = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bad-input test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(1).not_valid_before(now - timedelta(days=30)).not_valid_after(now + timedelta(days=30))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True).sign(ca_key, hashes.SHA256()))
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "labctl-stack")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(2)
            .not_valid_before(now - timedelta(days=20)).not_valid_after(now - timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("labctl-stack")]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    (where / "ca.crt").write_bytes(ca.public_bytes(pem))
    (where / "server.crt").write_bytes(cert.public_bytes(pem))
    (where / "other.key").write_bytes(other.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return ["-e", f"lab_tls_cert_file={where / 'server.crt'}", "-e", f"lab_tls_key_file={where / 'other.key'}",
            "-e", f"lab_tls_ca_file={where / 'ca.crt'}"]


PREFLIGHT = "preflight : Stop on any problem"
# A control node whose secrets directory is not the lab's (lost, or a timer with another $HOME): empty.
NO_SECRETS = Path(tempfile.mkdtemp(prefix="labctl-no-secrets-"))
RUNS = {
    # Variables, GPUs, ports, disk and a well-signed bundle with a wrong tokenizer file.
    "preflight": Run(["-e", "vllm_replica_count=3", "-e", "vlm_max_model_len=256", "-e", "lab_vllm_replicas=3",
                      "-e", "lab_litellm_port=8001",
                      "-e", f"lab_model_root={FULL}/models", "-e", "preflight_disk_headroom_gib=0", *_bad_tls_files(),
                      "-e", json.dumps({"lab_app_keys": [{"name": "notebook", "class": "urgent", "sha256": "0" * 64}],
                                        "lab_firewall_client_networks": ["192.168.0.0/16", "10.1.2.3/8"],
                                        # A lab that does not say it keeps the firewall open (the scenarios do).
                                        "lab_firewall_accept_open": []})],
                     PREFLIGHT, bundle=_wrong_tiktoken, full_disk=True, ufw_on=True),
    # A well-signed bundle without the model (its own run: with no model the disk check has nothing to size).
    "no-model": Run([], PREFLIGHT, bundle=_without_model),
    # Another secrets directory than the lab's: stopped before any secret is read (and so generated).
    "secrets": Run(["-e", f"lab_secrets_dir={NO_SECRETS}"],
                   "preflight : Stop when lab_secrets_dir is not the directory the lab was provisioned with"),
    # Files that differ from the signed manifest: stopped by the verification before the target is touched.
    "verify": Run([], "airgap : Verify the bundle on the control node before touching the target",
                  bundle=_tampered_and_truncated),
}
# cause: (run, what the message must say)
CASES = {
    "unknown-variable": ("preflight", ["unknown variable vllm_replica_count (did you mean vllm_"]),
    "mistyped-variable": ("preflight", ["unknown variable vlm_max_model_len (did you mean vllm_max_model_len?)"]),
    "replicas-above-gpus": ("preflight", ["lab_vllm_replicas=3 x lab_vllm_tensor_parallel_size=1 needs 3 GPUs, but the host has 2"]),
    "duplicate-ports": ("preflight", ["port clash: vLLM replica 1 (lab_vllm_base_port+1) and lab_litellm_port all use port 8001"]),
    "full-disk": ("preflight", [f"free space on {FULL} for lab_model_root={FULL}/models is 1.0 MiB; tiny-llama r1 still needs 1.3 MiB"]),
    "tls-key-not-the-certificates": ("preflight", ["other.key is not the key of lab_tls_cert_file "]),
    "tls-expired-certificate": ("preflight", ["server.crt expired on "]),
    "app-key-class": ("preflight", ["got: urgent found in lab_app_keys"]),
    "client-network-not-a-cidr": ("preflight", ["lab_firewall_client_networks: '10.1.2.3/8' is not a network in CIDR notation"]),
    "client-networks-a-whole-private-range": ("preflight", [
        "lab_firewall_client_networks ['192.168.0.0/16'] opens the gateway and Grafana to a whole private range"]),
    "ssh-open-to-every-address": ("preflight", ["SSH would stay open to every address: this run does not come over SSH"]),
    "ufw-on": ("preflight", ["ufw is active: a connection would have to pass its rules and labctl's firewall both"]),
    "wrong-tiktoken": ("preflight", ["has a wrong tiktoken/o200k_base.tiktoken: sha256 223921b7", "openai-harmony expects 446a9538"]),
    "bundle-without-the-model": ("no-model", [
        "has no model tiny-llama revision r1 (lab_model_name, lab_model_revision): it carries no model at all"]),
    "secrets-dir-not-the-labs": ("secrets", [f"lab_secrets_dir={NO_SECRETS} has no secrets-id",
                                             "rotate the master and salt keys under the running service"]),
    "tampered-bundle": ("verify", ["failed verification (2 problem(s))", "modified: apt/pool/", ".deb (sha256 expected "]),
    "truncated-weights": ("verify", [f"size: {MODEL}/model.safetensors (expected "]),
}
DONE: dict[str, dict[str, Any]] = {}


def _snapshot(host) -> list[str]:
    return host.check_output(f"find {' '.join(WATCHED)} -xdev -printf '%p %s %T@ %m %u\\n' 2>/dev/null | sort").splitlines()


@contextmanager
def _traffic(host) -> Iterator[dict[str, Any]]:
    """Chat completions one after another through the gateway while the body runs."""
    host.run_test("rm -f /tmp/bad-input.stop /tmp/bad-input.json")
    script = (Path(__file__).parent / "traffic.py").read_text()
    host.run_test("cat > /tmp/traffic.py <<'EOF'\n" + script + "\nEOF")
    name = host.check_output("hostname")
    subprocess.run(["docker", "exec", "-d", name, "python3", "/tmp/traffic.py", ENV_FILE, PUBLIC, "/tmp/bad-input.stop",
                    "/tmp/bad-input.json", *REPLICAS.values()], check=True)
    summary: dict[str, Any] = {}
    try:
        yield summary
    finally:
        host.run_test("touch /tmp/bad-input.stop")
        for _ in range(240):
            if host.file("/tmp/bad-input.json").exists:
                break
            time.sleep(0.25)
        summary.update(json.loads(host.file("/tmp/bad-input.json").content_string))


@contextmanager
def _ufw_on(host, wanted: bool) -> Iterator[None]:
    """ufw on, as far as its settings file tells (the test image has no ufw package)."""
    if not wanted:
        yield
        return
    host.run_test("mkdir -p /etc/ufw && printf 'ENABLED=yes\\nLOGLEVEL=low\\n' > /etc/ufw/ufw.conf")
    try:
        yield
    finally:
        host.run_test("rm -rf /etc/ufw")


@contextmanager
def _full_disk(host, wanted: bool) -> Iterator[None]:
    """A 1 MiB file system where the model root will be (the tiny model needs 1.3 MiB)."""
    if not wanted:
        yield
        return
    host.run_test(f"mkdir -p {FULL} && mount -t tmpfs -o size=1m labctl-bad-input {FULL}")
    try:
        yield
    finally:
        host.run_test(f"umount {FULL} && rmdir {FULL}")


def _run(host, key: str) -> dict[str, Any]:
    """Run site.yml once per Run (cached): while a request stream goes through the gateway, with
    the files and PIDs of the stack read before and after."""
    if key in DONE:
        return DONE[key]
    spec = RUNS[key]
    pids, files = _main_pids(host), _snapshot(host)
    started = time.monotonic()
    with (_full_disk(host, spec.full_disk), _ufw_on(host, spec.ufw_on),
          (_bundle(spec.bundle) if spec.bundle else _nothing()) as bundle_args, _traffic(host) as traffic):
        result = _site(*spec.extra, *(bundle_args or []), timeout=600)
    seconds = round(time.monotonic() - started, 1)
    TIMES[key] = seconds
    _report(bad_input_seconds=TIMES)
    print(f"bad input run {key}: {seconds} s, {traffic['ok']} requests served during it")
    DONE[key] = {"result": result, "out": result.stdout + result.stderr, "traffic": traffic, "pids": (pids, _main_pids(host)),
                 "files": (files, _snapshot(host))}
    return DONE[key]


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_stops_the_run_before_anything_changes(host, case: str) -> None:
    key, expected = CASES[case]
    run = _run(host, key)
    out = run["out"]
    assert run["result"].returncode != 0, out[-3000:]
    for text in expected:
        assert text in out, f"{text!r} not in the output:\n{out[-4000:]}"
    name = host.check_output("hostname")
    recap = re.search(rf"^{re.escape(name)}\s+: ok=\d+\s+changed=(\d+)\s+unreachable=0\s+failed=(\d+)", out, re.MULTILINE)
    assert recap and recap.groups() == ("0", "1"), out[-2000:]
    # It stopped in the check, and no task after it ran.
    failed_task = re.findall(r"^TASK \[([^\]]+)\]", out.split("fatal: [")[0], re.MULTILINE)[-1]
    assert failed_task == RUNS[key].stops_in, out[-3000:]
    assert run["pids"][0] == run["pids"][1]
    assert run["files"][0] == run["files"][1]
    traffic = run["traffic"]
    assert traffic["ok"] >= 1 and traffic["failed"] == [], traffic["failed"][:5]
    assert traffic["both_down"] == 0


@contextmanager
def _nothing() -> Iterator[None]:
    yield None


def test_a_control_node_without_the_labs_secrets_generates_none(host) -> None:
    """The run with an empty lab_secrets_dir stopped before anything read a secret: nothing was
    generated there (a generated master key would have been the rotation the check prevents)."""
    _run(host, "secrets")
    assert sorted(p.name for p in NO_SECRETS.iterdir()) == []
