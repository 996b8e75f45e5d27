"""labctl bundle verify and verifycore: every kind of tampering is named."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from labctl.bundle.builder import BuildResult
from labctl.module_utils import verifycore
from labctl.module_utils.sums import sha256_file

from .conftest import flip_byte, invoke, manifest_of


def problems(runner: CliRunner, bundle: Path, *extra: str) -> list[str]:
    result = invoke(runner, "bundle", "verify", str(bundle), *extra)
    assert result.exit_code == 1, result.output
    lines: list[str] = result.stdout.splitlines()
    return lines


@pytest.mark.parametrize(
    "rel",
    [
        "apt/pool/labctl-test-lib_2.0-1_amd64.deb",
        "apt/Packages",
        "wheels/labctl_demo-1.2.3-py3-none-any.whl",
        "keys/bundle.gpg",
    ],
)
def test_flipped_byte_is_named(runner: CliRunner, bundle: Path, rel: str) -> None:
    expected = next(f["sha256"] for f in manifest_of(bundle)["files"] if f["path"] == rel)
    flip_byte(bundle / rel)
    found = sha256_file(str(bundle / rel))
    lines = problems(runner, bundle)
    assert f"modified: {rel} (sha256 expected {expected}, found {found})" in lines


def test_missing_file(runner: CliRunner, bundle: Path) -> None:
    (bundle / "wheels" / "labctl_demo-1.2.3-py3-none-any.whl").unlink()
    assert problems(runner, bundle) == ["missing: wheels/labctl_demo-1.2.3-py3-none-any.whl"]


def test_extra_file(runner: CliRunner, bundle: Path) -> None:
    (bundle / "apt" / "pool" / "evil.deb").write_bytes(b"evil")
    assert problems(runner, bundle) == ["extra: apt/pool/evil.deb (not listed in manifest.json)"]


def test_size_mismatch_is_not_hashed(bundle: Path) -> None:
    with (bundle / "apt" / "Packages").open("ab") as handle:
        handle.write(b"\n")
    report = verifycore.verify_bundle(str(bundle))
    assert [(p.kind, p.path) for p in report.problems] == [("size", "apt/Packages")]


def _rewrite_manifest(bundle: Path, edit: object) -> None:
    manifest = manifest_of(bundle)
    assert callable(edit)
    edit(manifest)
    (bundle / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


def test_manifest_size_edited_without_resigning(runner: CliRunner, bundle: Path) -> None:
    def edit(manifest: dict[str, list[dict[str, Any]]]) -> None:
        entry = next(f for f in manifest["files"] if f["path"] == "apt/Packages")
        entry["size"] += 1

    _rewrite_manifest(bundle, edit)
    lines = problems(runner, bundle)
    assert any(line == "signature: manifest.json.sig (does not verify manifest.json with keys/bundle.gpg: BADSIG)" for line in lines)
    report = verifycore.verify_bundle(str(bundle))
    assert not report.ok
    assert {p.kind for p in report.problems} >= {"signature", "size", "manifest"}


def test_manifest_entry_removed_without_resigning(bundle: Path) -> None:
    rel = "apt/pool/labctl-test-tool_0.3_all.deb"

    def edit(manifest: dict[str, list[dict[str, str]]]) -> None:
        manifest["files"] = [f for f in manifest["files"] if f["path"] != rel]

    _rewrite_manifest(bundle, edit)
    report = verifycore.verify_bundle(str(bundle))
    kinds = {(p.kind, p.path) for p in report.problems}
    assert ("signature", "manifest.json.sig") in kinds
    assert ("extra", rel) in kinds
    assert not report.ok


def test_file_problems_reported_even_when_signature_fails(bundle: Path) -> None:
    flip_byte(bundle / "manifest.json.sig")
    (bundle / "apt" / "Release").unlink()
    report = verifycore.verify_bundle(str(bundle))
    assert {(p.kind, p.path) for p in report.problems} == {
        ("signature", "manifest.json.sig"),
        ("missing", "apt/Release"),
    }
    assert report.fingerprint is None and not report.ok


def test_wrong_fingerprint(runner: CliRunner, bundle: Path, built: BuildResult) -> None:
    real = built.manifest["signing_key"]["fingerprint"]
    wrong = "0123456789ABCDEF0123456789ABCDEF01234567"
    assert problems(runner, bundle, "--fingerprint", wrong) == [
        f"fingerprint: manifest.json.sig (signed by {real}, expected {wrong})"
    ]
    spaced = " ".join(real[i : i + 4] for i in range(0, 40, 4)).lower()
    assert invoke(runner, "bundle", "verify", str(bundle), "--fingerprint", spaced).exit_code == 0


def test_manifest_declares_other_key(bundle: Path) -> None:
    def edit(manifest: dict[str, dict[str, str]]) -> None:
        manifest["signing_key"]["fingerprint"] = "F" * 40

    _rewrite_manifest(bundle, edit)
    kinds = [p.kind for p in verifycore.verify_bundle(str(bundle)).problems]
    assert "signature" in kinds  # the edit itself breaks the signature


def test_json_output(runner: CliRunner, bundle: Path, built: BuildResult) -> None:
    ok = invoke(runner, "bundle", "verify", str(bundle), "--json")
    assert ok.exit_code == 0
    data = json.loads(ok.stdout)
    assert data["ok"] is True and data["problems"] == []
    assert data["fingerprint"] == built.manifest["signing_key"]["fingerprint"]
    assert data["content_digest"] == built.manifest["content_digest"]
    assert data["files_checked"] == len(built.manifest["files"])

    (bundle / "keys" / "bundle.asc").unlink()
    bad = invoke(runner, "bundle", "verify", str(bundle), "--json")
    assert bad.exit_code == 1
    data = json.loads(bad.stdout)
    assert data["ok"] is False
    assert data["problems"] == [{"kind": "missing", "path": "keys/bundle.asc", "detail": ""}]


def test_not_a_bundle(runner: CliRunner, tmp_path: Path) -> None:
    assert problems(runner, tmp_path) == ["missing: manifest.json"]


def test_on_file_callback_and_workers(built: BuildResult) -> None:
    seen: list[tuple[str, int]] = []
    report = verifycore.verify_bundle(str(built.path), workers=1, on_file=lambda p, s: seen.append((p, s)))
    assert report.ok
    assert sorted(seen) == sorted((f["path"], f["size"]) for f in built.manifest["files"])


def test_unsafe_manifest_path(bundle: Path) -> None:
    def edit(manifest: dict[str, list[dict[str, object]]]) -> None:
        manifest["files"].append({"path": "../outside", "size": 1, "sha256": "0" * 64})

    _rewrite_manifest(bundle, edit)
    kinds = {(p.kind, p.path) for p in verifycore.verify_bundle(str(bundle)).problems}
    assert ("manifest", "../outside") in kinds


def test_stamp_skips_hashing_only_files_that_are_untouched(bundle: Path, tmp_path: Path) -> None:
    stamps = tmp_path / "stamps"
    first = verifycore.verify_bundle(str(bundle), stamp_dir=str(stamps))
    assert first.ok and first.files_hashed == first.files_checked > 3
    written = Path(verifycore.write_stamp(str(stamps), first))
    assert written.parent == stamps and oct(written.stat().st_mode & 0o777) == "0o600"
    assert oct(stamps.stat().st_mode & 0o777) == "0o700"

    again = verifycore.verify_bundle(str(bundle), stamp_dir=str(stamps))
    assert again.ok and again.files_hashed == 0 and again.files_checked == first.files_checked
    assert verifycore.verify_bundle(str(bundle)).files_hashed == first.files_checked  # no stamp_dir: all

    # One byte changed in place, with its mtime put back (touch -r): ctime still moved, so it is hashed.
    rel = "apt/pool/labctl-test-lib_2.0-1_amd64.deb"
    target = bundle / rel
    before = target.stat()
    flip_byte(target)
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
    report = verifycore.verify_bundle(str(bundle), stamp_dir=str(stamps))
    assert report.files_hashed == 1
    assert [(p.kind, p.path) for p in report.problems] == [("modified", rel)]


def test_stamp_of_another_signing_key_or_bundle_is_ignored(bundle: Path, tmp_path: Path) -> None:
    stamps = tmp_path / "stamps"
    first = verifycore.verify_bundle(str(bundle))
    verifycore.write_stamp(str(stamps), first)
    digest = str(first.manifest["content_digest"]) if first.manifest else ""
    stamp = Path(verifycore.stamp_file(str(stamps), digest))
    data = json.loads(stamp.read_text())
    data["fingerprint"] = "0" * 40
    stamp.write_text(json.dumps(data))
    assert verifycore.verify_bundle(str(bundle), stamp_dir=str(stamps)).files_hashed == first.files_checked
    stamp.write_text("not json")
    assert verifycore.verify_bundle(str(bundle), stamp_dir=str(stamps)).files_hashed == first.files_checked


def test_a_failed_verification_gets_no_stamp(bundle: Path, tmp_path: Path) -> None:
    (bundle / "apt" / "pool" / "evil.deb").write_bytes(b"evil")
    report = verifycore.verify_bundle(str(bundle))
    with pytest.raises(ValueError, match="only a bundle that verified gets a stamp"):
        verifycore.write_stamp(str(tmp_path), report)


def test_content_digest_ignores_signature_artefacts() -> None:
    files = [
        {"path": "b", "sha256": "2" * 64, "size": 2},
        {"path": "a", "sha256": "1" * 64, "size": 1},
    ]
    digest = verifycore.content_digest(files)
    assert digest == verifycore.content_digest(list(reversed(files)))
    with_sigs = files + [{"path": p, "sha256": "3" * 64, "size": 3} for p in verifycore.SIGNATURE_ARTEFACTS]
    assert verifycore.content_digest(with_sigs) == digest
    expected = hashlib.sha256(f"a {'1' * 64} 1\nb {'2' * 64} 2\n".encode()).hexdigest()
    assert digest == expected
