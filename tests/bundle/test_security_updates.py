"""`labctl bundle build --updates-from STATUS` against Debian's real archives (deb.debian.org:
bookworm, bookworm-updates, bookworm-security): which upgrades of an installed host's dpkg status
are security updates, and the CLI end to end (part of make lab-parts). The host status is the
test base image's (a debootstrap of bookworm main), edited where a case needs it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from labctl.bundle.apt_stage import BaseSpec, collect_apt
from labctl.bundle.errors import BuildError
from labctl.bundle.staging import Staging
from labctl.cli import app
from labctl.paths import default_cache_dir
from labctl.profile import load_profile
from labctl.progress import PlainReporter

REPO = Path(__file__).resolve().parents[2]
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"

PROFILE = """\
name: updates
description: security updates only
target: {{os: debian, release: "12", codename: bookworm, arch: amd64, python: "3.11"}}
apt:
  sources:
    - {{name: debian, uris: [http://deb.debian.org/debian], suites: [bookworm, bookworm-updates],
       components: [main], signed_by: {keyring}}}
{security}
  packages: []
wheels: {{requirements: []}}
"""
SECURITY = f"""\
    - {{name: debian-security, uris: [http://deb.debian.org/debian-security], suites: [bookworm-security],
       components: [main], signed_by: {KEYRING}}}
"""


def _profile(tmp_path: Path, security: bool = True) -> Path:
    path = tmp_path / "updates.yml"
    path.write_text(PROFILE.format(keyring=KEYRING, security=SECURITY if security else ""))
    return path


@pytest.fixture(scope="module")
def host_status(tmp_path_factory: pytest.TempPathFactory) -> str:
    image = os.environ.get("LABCTL_TEST_IMAGE") or subprocess.run(
        [str(REPO / "scripts" / "build-base-image.sh"), "--print-tag"], capture_output=True, text=True, check=True
    ).stdout.strip()
    proc = subprocess.run(["docker", "run", "--rm", "--network", "none", image, "cat", "/var/lib/dpkg/status"],
                          capture_output=True, text=True, check=True)
    return proc.stdout


def _stanzas(status: str) -> dict[str, str]:
    return {re.search(r"^Package: (\S+)", s, re.MULTILINE)[1]: s for s in status.strip().split("\n\n")}  # type: ignore[index]


def _edit(status: str, name: str, **fields: str) -> str:
    stanzas = _stanzas(status)
    stanza = stanzas[name]
    for key, value in fields.items():
        stanza = re.sub(rf"^{key}: .*$", f"{key}: {value}", stanza, flags=re.MULTILINE)
    stanzas[name] = stanza
    return "\n\n".join(stanzas.values()) + "\n"


def _version(status: str, name: str) -> str:
    return re.search(r"^Version: (\S+)", _stanzas(status)[name], re.MULTILINE)[1]  # type: ignore[index]



def _collect(tmp_path: Path, *statuses: str, security: bool = True) -> Any:
    paths = []
    for index, text in enumerate(statuses):
        path = tmp_path / f"host{index}.status"
        path.write_text(text)
        paths.append(path)
    profile = load_profile(str(_profile(tmp_path, security)))
    staging = Staging.start(tmp_path / "bundle", PlainReporter())
    try:
        return collect_apt(profile, default_cache_dir(), BaseSpec(updates_from=tuple(paths)), staging)
    finally:
        shutil.rmtree(staging.root, ignore_errors=True)


def _packages(result: Any, index: int = 0) -> dict[str, dict[str, Any]]:
    return {p["name"]: p for p in result.component()["updates"][index]["packages"]}


def test_a_hosts_security_updates_and_only_those_are_bundled(tmp_path: Path, host_status: str) -> None:
    # hostname: a newer version in bookworm main, none in bookworm-security: an older installed
    # version is an upgrade, but not a security update.
    old_hostname = host_status.replace(f"Version: {_version(host_status, 'hostname')}", "Version: 3.22", 1)
    assert _version(old_hostname, "hostname") == "3.22"
    result = _collect(tmp_path, old_hostname)
    packages = _packages(result)
    security = {n for n, p in packages.items() if p["reason"] == "security"}
    print(f"security updates of the base image: {len(security)}: {sorted(security)[:12]}")
    assert security, "the base image is older than bookworm-security: there must be updates"
    assert "hostname" not in packages
    # openssl's library: bookworm-security carries fixes newer than the debootstrap's version.
    assert "libssl3" in security, sorted(security)
    ssl = packages["libssl3"]
    assert ssl["installed"] == _version(host_status, "libssl3")
    assert subprocess.run(["dpkg", "--compare-versions", ssl["version"], "gt", ssl["installed"]], check=False).returncode == 0
    # Every bundled update is in the apt pool, origin "update" where the closure did not bring it.
    pool = {(d.name, d.version) for d in result.debs}
    assert {(n, p["version"]) for n, p in packages.items()} <= pool
    assert set(result.origins.values()) == {"update"}


def test_a_held_or_current_package_is_left_and_each_host_gets_its_record(tmp_path: Path, host_status: str) -> None:
    """Two hosts: the base image's status, and one that holds libssl3 (as the roles hold the
    NVIDIA driver) and already has another package's fixed version."""
    first = _packages(_collect(tmp_path, host_status))
    current = next(name for name, p in first.items() if p["reason"] == "security" and name != "libssl3"
                   and "(=" not in (re.search(r"^Depends: .*$", _stanzas(host_status)[name], re.MULTILINE) or [""])[0])
    second = _edit(_edit(host_status, "libssl3", Status="hold ok installed"), current, Version=first[current]["version"])
    result = _collect(tmp_path, host_status, second)
    records = result.component()["updates"]
    assert [r["status"] for r in records] == ["host0.status", "host1.status"]
    assert {"libssl3", current} <= set(_packages(result, 0))
    left = _packages(result, 1)
    assert "libssl3" not in left and current not in left, current
    assert left, "the other security updates are still there"


def test_a_profile_without_a_security_suite_is_refused_by_name(tmp_path: Path, host_status: str) -> None:
    with pytest.raises(BuildError, match=r"--updates-from: profile updates has no apt source with a '\*-security' suite"):
        _collect(tmp_path, host_status, security=False)


def test_cli_refuses_a_missing_status_before_building(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["bundle", "build", "--profile", str(_profile(tmp_path)), "--out", str(out),
                                      "--updates-from", str(tmp_path / "gpu01.status")])
    assert result.exit_code == 1
    assert f"--updates-from {tmp_path / 'gpu01.status'}: no such file" in result.output
    assert not out.exists()


def test_cli_summary_names_the_updates(tmp_path: Path, host_status: str) -> None:
    status = tmp_path / "gpu01.status"
    status.write_text(host_status)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["bundle", "build", "--profile", str(_profile(tmp_path)), "--out", str(out),
                                      "--updates-from", str(status), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output[result.output.index("{"):])
    assert summary["updates"][0]["status"] == "gpu01.status" and summary["updates"][0]["security"] > 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["components"]["apt"]["updates"][0]["sha256"]
    verify = CliRunner().invoke(app, ["bundle", "verify", str(out)])
    assert verify.exit_code == 0, verify.output
