"""A fresh apt (private config, empty dpkg status) consumes the bundle's flat repo."""

from __future__ import annotations

import shutil
from pathlib import Path

from labctl.bundle.builder import BuildResult

from .conftest import flip_byte, isolated_apt


def test_apt_update_and_resolve(built: BuildResult, tmp_path: Path) -> None:
    apt = isolated_apt(tmp_path / "apt", built.path)
    update = apt.run("update")
    output = update.stdout + update.stderr
    assert update.returncode == 0, output
    for bad in ("W:", "E:", "NO_PUBKEY", "not signed", "unsigned", "insecure"):
        assert bad not in output, output
    assert list((tmp_path / "apt" / "lists").glob("*_InRelease")), "apt should use the clearsigned InRelease"

    simulate = apt.run("-s", "install", "labctl-test-app")
    assert simulate.returncode == 0, simulate.stdout + simulate.stderr
    inst = [line.split()[1] for line in simulate.stdout.splitlines() if line.startswith("Inst ")]
    assert sorted(inst) == ["labctl-test-app", "labctl-test-lib"]
    assert "Inst labctl-test-lib (1:2.0-1 labctl-unit:labctl-unit [amd64])" in simulate.stdout

    # apt fetches the pool files (checking their hashes against the signed index)
    fetched = tmp_path / "fetched"
    fetched.mkdir()
    download = apt.run("download", "labctl-test-app", "labctl-test-lib", cwd=fetched)
    assert download.returncode == 0, download.stdout + download.stderr
    assert sorted(p.name for p in fetched.iterdir()) == [
        "labctl-test-app_1.0-1_all.deb",
        "labctl-test-lib_1%3a2.0-1_amd64.deb",
    ]


def test_apt_rejects_tampered_index(built: BuildResult, tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    shutil.copytree(built.path, bundle)
    flip_byte(bundle / "apt" / "Packages.gz")
    flip_byte(bundle / "apt" / "Packages")
    apt = isolated_apt(tmp_path / "apt", bundle)
    update = apt.run("update")
    assert update.returncode != 0 or "E:" in update.stdout + update.stderr


def test_apt_rejects_foreign_key(built: BuildResult, tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    shutil.copytree(built.path, bundle)
    shutil.copyfile("/usr/share/keyrings/debian-archive-keyring.gpg", bundle / "keys" / "bundle.gpg")
    apt = isolated_apt(tmp_path / "apt", bundle)
    update = apt.run("update")
    output = update.stdout + update.stderr
    assert update.returncode != 0 or "NO_PUBKEY" in output or "not signed" in output, output
