"""labctl bundle build: layout, manifest, determinism, key handling, failures."""

from __future__ import annotations

import json
import re
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from labctl.bundle.builder import BuildResult
from labctl.bundle.errors import BuildError
from labctl.module_utils import verifycore
from labctl.module_utils.sums import sha256_file

from .conftest import Inputs, build, invoke, manifest_of, write_profile

LAYOUT = [
    "manifest.json",
    "manifest.json.sig",
    "keys/bundle.gpg",
    "keys/bundle.asc",
    "apt/Packages",
    "apt/Packages.gz",
    "apt/Release",
    "apt/InRelease",
    "apt/Release.gpg",
    "apt/pool/labctl-test-app_1.0-1_all.deb",
    "apt/pool/labctl-test-lib_2.0-1_amd64.deb",
    "apt/pool/labctl-test-tool_0.3_all.deb",
    "wheels/labctl_demo-1.2.3-py3-none-any.whl",
]


def test_cli_build_then_verify(runner: CliRunner, inputs: Inputs, tmp_path: Path) -> None:
    out = tmp_path / "b"
    result = invoke(runner, "bundle", "build", "--profile", str(inputs.profile), "--out", str(out), "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["path"] == str(out)
    assert summary["profile"] == "unit"
    assert summary["counts"] == {"apt_packages": 3, "apt_local": 3, "wheels": 1, "tiktoken": 0, "models": 0, "files": 11}
    assert summary["sizes"]["total"] > summary["sizes"]["apt"] > 0
    assert summary["skipped"] == []
    assert re.fullmatch(r"[0-9a-f]{64}", summary["content_digest"])
    assert isinstance(summary["duration_s"], float)
    for rel in LAYOUT:
        assert (out / rel).is_file(), rel
    assert not out.with_name("b.partial").exists()

    verified = invoke(runner, "bundle", "verify", str(out))
    assert verified.exit_code == 0, verified.output
    assert verified.stdout.startswith("ok: ")
    assert "the signer was NOT checked" in verified.stdout  # no --fingerprint: said, not implied
    trusted = invoke(runner, "bundle", "verify", str(out), "--fingerprint", manifest_of(out)["signing_key"]["fingerprint"])
    assert trusted.exit_code == 0 and "the expected key" in trusted.stdout, trusted.output
    assert verifycore.verify_bundle(str(out)).ok


def test_manifest_content(built: BuildResult) -> None:
    manifest = manifest_of(built.path)
    assert manifest["format_version"] == 1
    assert manifest["profile"] == "unit"
    assert manifest["builder"]["name"] == "labctl"
    assert manifest["target"] == {
        "os": "debian",
        "release": "12",
        "codename": "bookworm",
        "arch": "amd64",
        "python": "3.11",
        "python_abi": "cp311",
    }
    assert re.fullmatch(r"[0-9A-F]{40}", manifest["signing_key"]["fingerprint"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", manifest["created_at"])
    paths = [f["path"] for f in manifest["files"]]
    assert paths == sorted(paths)
    assert set(paths) == set(LAYOUT) - {"manifest.json", "manifest.json.sig"}
    assert manifest["content_digest"] == verifycore.content_digest(manifest["files"])

    packages = {p["name"]: p for p in manifest["components"]["apt"]["packages"]}
    lib = packages["labctl-test-lib"]
    assert lib["version"] == "1:2.0-1" and lib["arch"] == "amd64"
    assert lib["file"] == "apt/pool/labctl-test-lib_2.0-1_amd64.deb"
    by_path = {f["path"]: f for f in manifest["files"]}
    assert by_path[lib["file"]]["sha256"] == lib["sha256"]
    assert manifest["components"]["apt"]["skipped"] == []
    (wheel,) = manifest["components"]["wheels"]["files"]
    assert (wheel["name"], wheel["version"], wheel["file"]) == ("labctl_demo", "1.2.3", "wheels/labctl_demo-1.2.3-py3-none-any.whl")


def test_repo_indices(built: BuildResult) -> None:
    apt = built.path / "apt"
    packages = (apt / "Packages").read_text()
    stanzas = packages.strip().split("\n\n")
    assert [s.splitlines()[0] for s in stanzas] == [
        "Package: labctl-test-app",
        "Package: labctl-test-lib",
        "Package: labctl-test-tool",
    ]
    assert "Filename: pool/labctl-test-lib_2.0-1_amd64.deb" in packages
    assert "Description: labctl test package labctl-test-app\n A tiny package" in packages
    release = (apt / "Release").read_text()
    assert "Origin: labctl\n" in release
    assert "Suite: labctl-unit\n" in release and "Codename: labctl-unit\n" in release
    assert "Architectures: amd64 all\n" in release
    assert "Valid-Until" not in release
    sha256 = sha256_file(str(apt / "Packages.gz"))
    assert re.search(rf"^ {sha256} +\d+ Packages.gz$", release, re.MULTILINE)
    assert (apt / "InRelease").read_text().startswith("-----BEGIN PGP SIGNED MESSAGE-----")
    assert (apt / "Release.gpg").read_text().startswith("-----BEGIN PGP SIGNATURE-----")


def test_rebuild_is_identical(built: BuildResult, inputs: Inputs, key_dir: Path, cache_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "again"
    first = build(inputs.profile, out, key_dir, cache_dir)
    second = build(inputs.profile, out, key_dir, cache_dir)  # replaces the first in place
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again"]  # no .partial / .old left
    for result in (first, second):
        assert result.manifest["content_digest"] == built.manifest["content_digest"]
    ref = {f["path"]: f["sha256"] for f in built.manifest["files"]}
    now = {f["path"]: f["sha256"] for f in second.manifest["files"]}
    assert ref.keys() == now.keys()
    for path in ref:
        if path not in verifycore.SIGNATURE_ARTEFACTS:
            assert now[path] == ref[path], path
    assert verifycore.verify_bundle(str(out)).ok


def test_source_date_epoch(inputs: Inputs, key_dir: Path, cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    result = build(inputs.profile, tmp_path / "b", key_dir, cache_dir)
    assert "Date: Tue, 14 Nov 2023 22:13:20 UTC\n" in (result.path / "apt" / "Release").read_text()


def test_key_generated_once(built: BuildResult, inputs: Inputs, key_dir: Path, cache_dir: Path, tmp_path: Path) -> None:
    fingerprint = built.manifest["signing_key"]["fingerprint"]
    again = build(inputs.profile, tmp_path / "b", key_dir, cache_dir)
    assert again.manifest["signing_key"]["fingerprint"] == fingerprint
    assert stat.S_IMODE(key_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE(cache_dir.stat().st_mode) == 0o700
    secret = list((key_dir / "private-keys-v1.d").iterdir())
    assert len(secret) == 1
    for path in built.path.rglob("*"):  # no private material in the bundle
        if path.is_file():
            assert b"PRIVATE KEY" not in path.read_bytes()


def test_new_key_dir_is_private(inputs: Inputs, cache_dir: Path, tmp_path: Path) -> None:
    keys = tmp_path / "k2"
    result = build(inputs.profile, tmp_path / "b", keys, cache_dir)
    assert stat.S_IMODE(keys.stat().st_mode) == 0o700
    assert re.fullmatch(r"[0-9A-F]{40}", result.manifest["signing_key"]["fingerprint"])


def test_failed_build_keeps_previous_bundle(built: BuildResult, inputs: Inputs, key_dir: Path, cache_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "b"
    good = build(inputs.profile, out, key_dir, cache_dir)
    broken = tmp_path / "broken"
    (broken / "debs").mkdir(parents=True)
    (broken / "wheels").mkdir()
    (broken / "debs" / "bad_1_all.deb").write_bytes(b"not a deb")
    profile = write_profile(broken / "p.yml")
    with pytest.raises(BuildError, match=re.escape("bad_1_all.deb")):
        build(profile, out, key_dir, cache_dir)
    assert manifest_of(out)["content_digest"] == good.manifest["content_digest"]
    assert verifycore.verify_bundle(str(out)).ok
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b", "broken"]


def test_refuses_to_replace_foreign_dir(runner: CliRunner, inputs: Inputs, tmp_path: Path) -> None:
    out = tmp_path / "precious"
    out.mkdir()
    (out / "data.txt").write_text("keep me")
    result = invoke(runner, "bundle", "build", "--profile", str(inputs.profile), "--out", str(out))
    assert result.exit_code == 1
    assert "not a labctl bundle" in result.stderr
    assert (out / "data.txt").read_text() == "keep me"


def test_apt_packages_need_a_base(runner: CliRunner, inputs: Inputs, tmp_path: Path) -> None:
    (inputs.root / "debian.gpg").write_bytes(b"")
    profile = write_profile(
        inputs.root / "needs-base.yml",
        apt_extra=(
            "  sources:\n"
            "    - {name: debian, uris: ['http://127.0.0.1:9/debian'], suites: [bookworm], components: [main],"
            " signed_by: debian.gpg}\n"
            "  packages: [jq]\n"
        ),
    )
    result = invoke(runner, "bundle", "build", "--profile", str(profile), "--out", str(tmp_path / "b"))
    assert result.exit_code == 1
    assert "apt.packages" in result.stderr and "--base-image" in result.stderr and "--base-status" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "b").exists() and not (tmp_path / "b.partial").exists()


def test_optional_source_unreachable_is_skipped(runner: CliRunner, inputs: Inputs, tmp_path: Path) -> None:
    keyring = inputs.root / "vendor.gpg"
    keyring.write_bytes(b"")
    profile = write_profile(
        inputs.root / "optional.yml",
        apt_extra=(
            "  sources:\n"
            "    - name: vendor\n"
            "      uris: ['http://127.0.0.1:9/repo/']\n"  # nothing listens on the discard port
            "      suites: ['./']\n"
            "      signed_by: vendor.gpg\n"
            "      optional: true\n"
            "  groups:\n"
            "    gpu: {sources: [vendor], packages: [vendor-driver]}\n"
        ),
    )
    out = tmp_path / "b"
    result = invoke(runner, "bundle", "build", "--profile", str(profile), "--out", str(out), "--json")
    assert result.exit_code == 0, result.output
    (skipped,) = json.loads(result.stdout)["skipped"]
    assert skipped["source"] == "vendor"
    assert skipped["groups"] == [{"group": "gpu", "packages": ["vendor-driver"]}]
    assert "127.0.0.1:9" in skipped["reason"]
    assert "optional apt source vendor skipped" in result.stderr
    assert manifest_of(out)["components"]["apt"]["skipped"] == [skipped]


def test_version(runner: CliRunner) -> None:
    result = invoke(runner, "--version")
    assert result.exit_code == 0
    assert re.fullmatch(r"labctl \S+\n", result.stdout)
