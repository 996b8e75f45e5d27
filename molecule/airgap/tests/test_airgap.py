"""Effective state after the airgap role: apt and pip reach the bundle and nothing else."""

from __future__ import annotations

import difflib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

BUNDLE_DIR = "/srv/labctl/bundle"
SOURCE_FILE = "/etc/apt/sources.list.d/labctl-bundle.sources"
SCENARIO_DIR = Path(__file__).resolve().parent.parent


def _manifest() -> dict:
    return json.loads(Path(os.environ["LABCTL_BUNDLE"], "manifest.json").read_text())


def test_bundle_is_a_verified_release(host):
    link = host.file(BUNDLE_DIR)
    assert link.is_symlink
    digest = _manifest()["content_digest"]
    assert link.linked_to == f"{BUNDLE_DIR}-releases/{digest[:16]}"
    assert host.file(f"{BUNDLE_DIR}/manifest.json").exists


def test_only_the_bundle_source_is_enabled(host):
    source = host.file(SOURCE_FILE)
    assert source.user == "root" and source.mode == 0o644
    assert f"URIs: file:{BUNDLE_DIR}/apt" in source.content_string
    assert "Signed-By: /etc/apt/keyrings/labctl-bundle.gpg" in source.content_string
    assert not host.file("/etc/apt/sources.list").exists
    assert host.file("/etc/apt/sources.list.labctl.disabled").exists
    policy = host.check_output("apt-cache policy")
    assert f"file:{BUNDLE_DIR}/apt" in policy
    assert "http://" not in policy and "https://" not in policy


def test_keyring_is_the_bundle_key(host):
    keyring = host.file("/etc/apt/keyrings/labctl-bundle.gpg")
    assert keyring.mode == 0o644
    assert keyring.sha256sum == host.file(f"{BUNDLE_DIR}/keys/bundle.gpg").sha256sum


def test_apt_installs_from_the_bundle_without_network(host):
    # The container has no network interface but loopback: this can only come from the bundle.
    assert host.check_output("ip -o link show | grep -v ' lo:' | wc -l") == "0"
    cmd = host.run("DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends jq python3-venv")
    assert cmd.rc == 0, cmd.stderr
    assert "WARNING" not in cmd.stderr and "unauthenticated" not in cmd.stdout.lower()
    assert host.run("jq --version").rc == 0


def test_pip_installs_from_the_wheelhouse_only(host):
    conf = host.file("/etc/pip.conf").content_string
    assert "no-index = true" in conf and f"find-links = {BUNDLE_DIR}/wheels" in conf
    host.run_test("rm -rf /tmp/venv && python3 -m venv /tmp/venv")
    cmd = host.run("/tmp/venv/bin/pip install requests")
    assert cmd.rc == 0, cmd.stdout + cmd.stderr
    assert host.run("/tmp/venv/bin/python -c 'import requests, charset_normalizer'").rc == 0


def _state(host) -> str:
    """Everything the role may change on the target, as one comparable string."""
    return host.check_output(
        "ls -la /etc/apt/sources.list.d /etc/apt/keyrings /srv/labctl; "
        f"ls -la {BUNDLE_DIR}-releases; readlink {BUNDLE_DIR}; "
        f"sha256sum {SOURCE_FILE} /etc/pip.conf /etc/apt/keyrings/labctl-bundle.gpg"
    )


def _converge(*extra: str) -> subprocess.CompletedProcess[str]:
    cmd = [
        "ansible-playbook",
        "-i",
        os.environ["MOLECULE_INVENTORY_FILE"],
        str(SCENARIO_DIR / "converge.yml"),
        *extra,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)


@pytest.fixture
def tampered_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "bundle"
    shutil.copytree(os.environ["LABCTL_BUNDLE"], copy)
    return copy


def test_tampered_bundle_on_control_node_is_refused_before_any_change(host, tampered_copy: Path):
    deb = min((tampered_copy / "apt" / "pool").glob("*.deb"))
    data = bytearray(deb.read_bytes())
    data[len(data) // 2] ^= 0x01
    deb.write_bytes(bytes(data))
    before = _state(host)
    result = _converge("-e", f"airgap_bundle_src={tampered_copy}")
    assert result.returncode != 0
    assert f"modified: apt/pool/{deb.name}" in result.stdout + result.stderr
    assert _state(host) == before


def test_tampered_bundle_on_target_is_refused_before_any_change(host):
    host.run_test(f"rm -rf /srv/tampered && cp -a {BUNDLE_DIR}/ /srv/tampered")
    wheel = host.check_output("ls /srv/tampered/wheels | head -1")
    host.run_test(f"printf X | dd of=/srv/tampered/wheels/{wheel} bs=1 seek=100 conv=notrunc status=none")
    before = _state(host)
    result = _converge("-e", "airgap_bundle_source=target", "-e", "airgap_bundle_dir=/srv/tampered")
    # Read before the copy goes: its removal moves /srv's mtime, which the listing shows as "..".
    after = _state(host)
    host.run_test("rm -rf /srv/tampered")
    assert result.returncode != 0
    assert f"modified: wheels/{wheel}" in result.stdout + result.stderr
    assert after == before, "\n".join(difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm=""))


def test_bundle_signed_by_another_key_is_refused(host):
    before = _state(host)
    result = _converge("-e", "airgap_bundle_fingerprint=" + "A" * 40)
    assert result.returncode != 0
    assert "fingerprint" in result.stdout + result.stderr
    assert _state(host) == before


def _verify(host_pattern: str, path: str, *extra: str, check: bool = False) -> dict:
    """The role's verification module run on its own (ad hoc), as the role calls it; its JSON result."""
    inventory = ["-i", os.environ["MOLECULE_INVENTORY_FILE"]] if host_pattern != "localhost" else []
    args = f"path={path} fingerprint={os.environ['LABCTL_BUNDLE_FINGERPRINT']} " + " ".join(extra)
    cmd = ["ansible", host_pattern, *inventory, "-m", "labctl_bundle_verify", "-a", args, *(["-C"] if check else [])]
    role = SCENARIO_DIR.parent.parent / "roles" / "airgap"  # the module and its module_utils live in the role
    env = dict(os.environ, ANSIBLE_LIBRARY=str(role / "library"), ANSIBLE_MODULE_UTILS=str(role / "module_utils"))
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False, cwd=SCENARIO_DIR.parent.parent, env=env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    # "<host> | SUCCESS => {...}" (ad hoc's minimal output).
    start = result.stdout.index(" | SUCCESS => ") + len(" | SUCCESS => ")
    return dict(json.JSONDecoder().raw_decode(result.stdout[start:])[0])


def test_a_rerun_hashes_only_files_written_since_the_last_good_verification(host):
    """The converge and its idempotence run left records on both sides: nothing is hashed again, but a
    file written since (even with its mtime put back) is, and check mode records nothing."""
    stamp = "stamp_dir=/var/lib/labctl/verified"
    files = len(_manifest()["files"])
    assert _verify("all", BUNDLE_DIR, stamp)["hashed"] == 0
    control = _verify("localhost", os.environ["LABCTL_BUNDLE"], "stamp_dir=~/.cache/labctl/verified")
    assert (control["hashed"], control["files"]) == (0, files)

    wheel = host.check_output(f"ls {BUNDLE_DIR}/wheels | head -1")
    # Same bytes written back and the mtime restored: only the ctime tells.
    host.run_test(f"f={BUNDLE_DIR}/wheels/{wheel}; m=$(stat -c %y \"$f\"); cp -p \"$f\" /tmp/w && cat /tmp/w > \"$f\" "
                  f"&& touch -d \"$m\" \"$f\" && rm /tmp/w")
    assert _verify("all", BUNDLE_DIR, stamp, check=True)["hashed"] == 1
    assert _verify("all", BUNDLE_DIR, stamp, check=True)["hashed"] == 1  # check mode wrote no record
    assert _verify("all", BUNDLE_DIR, stamp)["hashed"] == 1
    assert _verify("all", BUNDLE_DIR, stamp)["hashed"] == 0
    full = _verify("all", BUNDLE_DIR, stamp, "rehash=true")
    assert full["hashed"] == files


def test_an_operators_mirror_stays_enabled_when_asked(host):
    """airgap_keep_sources: the site's internal mirror stays (here a second source over the
    bundle's own repository, so apt can read it without network); a kept source an earlier run
    disabled is enabled again; every other source is still disabled; a name that is not a source
    of the host is refused naming the variable."""
    mirror = "Types: deb\nURIs: file:/srv/labctl/bundle/apt\nSuites: ./\nSigned-By: /etc/apt/keyrings/labctl-bundle.gpg\n"
    host.run_test(f"printf '{mirror}' > /etc/apt/sources.list.d/hospital-mirror.sources")
    host.run_test(f"printf '{mirror}' > /etc/apt/sources.list.d/old-mirror.sources.labctl.disabled")
    host.run_test("echo 'deb http://deb.debian.org/debian bookworm main' > /etc/apt/sources.list.d/stray.list")
    try:
        bad = _converge("-e", '{"airgap_keep_sources": ["hospital-mirror.sources", "nope.sources"]}')
        assert bad.returncode != 0
        assert ("airgap_keep_sources: /etc/apt/sources.list.d/nope.sources is not an apt source file of this host"
                in bad.stdout + bad.stderr)
        assert host.file("/etc/apt/sources.list.d/stray.list").exists  # refused before any change
        keep = '{"airgap_keep_sources": ["hospital-mirror.sources", "old-mirror.sources"]}'
        result = _converge("-e", keep)
        assert result.returncode == 0, result.stdout[-3000:]
        assert host.file("/etc/apt/sources.list.d/hospital-mirror.sources").exists
        assert host.file("/etc/apt/sources.list.d/old-mirror.sources").exists
        assert not host.file("/etc/apt/sources.list.d/stray.list").exists
        assert host.file("/etc/apt/sources.list.d/stray.list.labctl.disabled").exists
        assert host.run("apt-get update").rc == 0
        again = _converge("-e", keep)
        recap = [line for line in again.stdout.splitlines() if "changed=" in line]
        assert recap and all("changed=0" in line for line in recap), recap
    finally:
        host.run("rm -f /etc/apt/sources.list.d/hospital-mirror.sources /etc/apt/sources.list.d/old-mirror.sources "
                 "/etc/apt/sources.list.d/stray.list.labctl.disabled")
