"""The models component: snapshots into models/<name>/<revision>/ with SHA256SUMS, reuse, sources."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from labctl.bundle.errors import BuildError
from labctl.bundle.models_stage import REUSE_FILE
from labctl.module_utils import verifycore
from labctl.module_utils.sums import sha256_file
from labctl.profile import ProfileError, load_profile

from .conftest import Inputs, build, flip_byte, invoke, manifest_of, write_profile

SNAPSHOT = {
    "config.json": b'{"model_type": "llama"}\n',
    "tokenizer.json": b'{"version": "1.0"}\n',
    "model-00001-of-00002.safetensors": bytes(range(256)) * 4096,  # 1 MiB
    "model-00002-of-00002.safetensors": b"\x01\x02" * 70000,
    "sub dir/notes.txt": b"a file with a space in its path\n",
}


def make_snapshot(root: Path, files: dict[str, bytes] = SNAPSHOT) -> Path:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def model_profile(inputs: Inputs, name: str, models: str) -> Path:
    return write_profile(inputs.root / f"{name}.yml", extra=f"models:\n{models}")


@pytest.fixture
def snap_profile(inputs: Inputs, tmp_path: Path) -> Path:
    """A profile with one local snapshot (a private copy per test, outside the profile dir)."""
    make_snapshot(tmp_path / "snap")
    return model_profile(inputs, f"models-{tmp_path.name}", f"  - {{name: tiny, revision: r1, path: '{tmp_path / 'snap'}'}}\n")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_layout_sums_and_manifest(runner: CliRunner, snap_profile: Path, tmp_path: Path) -> None:
    out = tmp_path / "b"
    result = invoke(runner, "bundle", "build", "--profile", str(snap_profile), "--out", str(out), "--json")
    assert result.exit_code == 0, result.output
    root = out / "models" / "tiny" / "r1"
    for rel, data in SNAPSHOT.items():
        assert (root / rel).read_bytes() == data
    sums = (root / "SHA256SUMS").read_text()
    assert sums == "".join(f"{sha256(SNAPSHOT[rel])}  {rel}\n" for rel in sorted(SNAPSHOT))
    check = subprocess.run(["sha256sum", "--strict", "-c", "SHA256SUMS"], cwd=root, capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.count(": OK") == len(SNAPSHOT)

    manifest = manifest_of(out)
    total = sum(len(data) for data in SNAPSHOT.values())
    assert manifest["components"]["models"] == [
        {
            "name": "tiny",
            "revision": "r1",
            "files": len(SNAPSHOT),
            "bytes": total,
            "sha256sums": "models/tiny/r1/SHA256SUMS",
            "source": f"path {tmp_path / 'snap'}",
        }
    ]
    listed = {f["path"]: f for f in manifest["files"]}
    for rel, data in SNAPSHOT.items():
        assert listed[f"models/tiny/r1/{rel}"] == {"path": f"models/tiny/r1/{rel}", "size": len(data), "sha256": sha256(data)}
    assert "models/tiny/r1/SHA256SUMS" in listed
    # what preflight sums for its disk check
    assert sum(f["size"] for f in manifest["files"] if f["path"].startswith("models/")) == total + len(sums)
    summary = result.stdout
    assert '"models": 1' in summary and f'"models": {total}' in summary

    verified = invoke(runner, "bundle", "verify", str(out))
    assert verified.exit_code == 0, verified.output


def test_tampered_model_file_is_named(runner: CliRunner, snap_profile: Path, tmp_path: Path) -> None:
    out = tmp_path / "b"
    assert invoke(runner, "bundle", "build", "--profile", str(snap_profile), "--out", str(out)).exit_code == 0
    rel = "models/tiny/r1/model-00001-of-00002.safetensors"
    flip_byte(out / rel)
    result = invoke(runner, "bundle", "verify", str(out))
    assert result.exit_code == 1
    found = sha256_file(str(out / rel))
    expected = sha256(SNAPSHOT["model-00001-of-00002.safetensors"])
    assert result.stdout.splitlines() == [f"modified: {rel} (sha256 expected {expected}, found {found})"]
    (out / "models/tiny/r1/extra.bin").write_bytes(b"x")
    assert "extra: models/tiny/r1/extra.bin (not listed in manifest.json)" in invoke(runner, "bundle", "verify", str(out)).stdout


def _inodes(root: Path) -> dict[str, int]:
    return {p.relative_to(root).as_posix(): p.stat().st_ino for p in root.rglob("*") if p.is_file()}


def test_rebuild_reuses_unchanged_files(
    snap_profile: Path, key_dir: Path, cache_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "b"
    first = build(snap_profile, out, key_dir, cache_dir)
    models = out / "models" / "tiny" / "r1"
    before = _inodes(models)
    capsys.readouterr()
    second = build(snap_profile, out, key_dir, cache_dir)
    assert second.manifest["content_digest"] == first.manifest["content_digest"]
    after = _inodes(models)
    for rel in SNAPSHOT:  # hard-linked from the previous bundle, not copied
        assert after[rel] == before[rel], rel
    assert "5 of 5 files linked from the previous bundle" in capsys.readouterr().err
    assert verifycore.verify_bundle(str(out)).ok
    assert (cache_dir / "models" / REUSE_FILE).is_file()


def test_rewritten_source_with_same_size_and_mtime_is_copied_again(
    snap_profile: Path, key_dir: Path, cache_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "b"
    build(snap_profile, out, key_dir, cache_dir)
    src = tmp_path / "snap" / "model-00002-of-00002.safetensors"
    st = src.stat()
    new = b"\x02\x01" * 70000  # same size
    src.write_bytes(new)
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))  # and the old mtime: only ctime tells
    rebuilt = build(snap_profile, out, key_dir, cache_dir)
    rel = "models/tiny/r1/model-00002-of-00002.safetensors"
    assert (out / rel).read_bytes() == new
    assert {f["path"]: f["sha256"] for f in rebuilt.manifest["files"]}[rel] == sha256(new)
    assert verifycore.verify_bundle(str(out)).ok


def test_no_reuse_into_another_out_dir(snap_profile: Path, key_dir: Path, cache_dir: Path, tmp_path: Path) -> None:
    first = build(snap_profile, tmp_path / "b1", key_dir, cache_dir)
    other = build(snap_profile, tmp_path / "b2", key_dir, cache_dir)
    assert other.manifest["content_digest"] == first.manifest["content_digest"]
    a, b = _inodes(tmp_path / "b1" / "models"), _inodes(tmp_path / "b2" / "models")
    assert all(a[rel] != b[rel] for rel in a)


def test_source_symlinks_followed_and_excludes(inputs: Inputs, key_dir: Path, cache_dir: Path, tmp_path: Path) -> None:
    """A Hugging Face cache snapshot: files are symlinks to blobs. .git/ and excluded globs stay out."""
    blobs = make_snapshot(tmp_path / "blobs", {"b1": b"weights", "b2": b"config"})
    snap = tmp_path / "snapshot"
    (snap / "original").mkdir(parents=True)
    (snap / "model.safetensors").symlink_to(blobs / "b1")
    (snap / "config.json").symlink_to(blobs / "b2")
    (snap / "original" / "model.safetensors").write_bytes(b"duplicate")
    (snap / ".git").mkdir()
    (snap / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    profile = model_profile(inputs, "models-links", f"  - {{name: m, revision: r2, path: '{snap}', exclude: ['original/*']}}\n")
    result = build(profile, tmp_path / "b", key_dir, cache_dir)
    root = result.path / "models" / "m" / "r2"
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) == ["SHA256SUMS", "config.json", "model.safetensors"]
    assert not (root / "model.safetensors").is_symlink()
    assert (root / "model.safetensors").read_bytes() == b"weights"


def test_two_models(inputs: Inputs, key_dir: Path, cache_dir: Path, tmp_path: Path) -> None:
    make_snapshot(tmp_path / "a", {"w.bin": b"a"})
    make_snapshot(tmp_path / "b", {"w.bin": b"b"})
    profile = model_profile(
        inputs,
        "models-two",
        f"  - {{name: m, revision: r1, path: '{tmp_path / 'a'}'}}\n  - {{name: m, revision: r2, path: '{tmp_path / 'b'}'}}\n",
    )
    result = build(profile, tmp_path / "out", key_dir, cache_dir)
    assert [(m["name"], m["revision"], m["files"], m["bytes"]) for m in result.manifest["components"]["models"]] == [
        ("m", "r1", 1, 1),
        ("m", "r2", 1, 1),
    ]


def test_missing_path_names_field_and_command(inputs: Inputs, key_dir: Path, cache_dir: Path, tmp_path: Path) -> None:
    profile = model_profile(
        inputs,
        "models-missing",
        "  - name: tiny-llama\n"
        "    revision: r1\n"
        "    path: nowhere/r1\n"
        "    create_with: python3 scripts/make-tiny-model.py build/models/tiny-llama/r1\n",
    )
    with pytest.raises(BuildError) as info:
        build(profile, tmp_path / "b", key_dir, cache_dir)
    assert str(info.value) == (
        f"models[0] (tiny-llama r1).path: {inputs.root / 'nowhere/r1'} does not exist (profile {profile}); "
        "create it with: python3 scripts/make-tiny-model.py build/models/tiny-llama/r1"
    )
    assert not (tmp_path / "b").exists()


def test_test_profile_points_at_the_generator() -> None:
    # The chat model, and the embedding model beside it (Issue 32: other weights, the same generator).
    model, embed = load_profile("test").spec.models
    assert (model.name, model.revision, model.path) == ("tiny-llama", "r1", "../build/models/tiny-llama/r1")
    assert model.create_with == "python3 scripts/make-tiny-model.py build/models/tiny-llama/r1"
    assert (embed.name, embed.revision, embed.path) == ("tiny-embed", "r1", "../build/models/tiny-embed/r1")
    assert embed.create_with == "python3 scripts/make-tiny-model.py build/models/tiny-embed/r1 --seed 3"


def test_snapshot_own_sha256sums_refused(inputs: Inputs, key_dir: Path, cache_dir: Path, tmp_path: Path) -> None:
    make_snapshot(tmp_path / "s", {"SHA256SUMS": b"", "w": b"w"})
    profile = model_profile(inputs, "models-sums", f"  - {{name: m, revision: r1, path: '{tmp_path / 's'}'}}\n")
    with pytest.raises(BuildError, match=r"^models\[0\] \(m r1\): .*has its own SHA256SUMS"):
        build(profile, tmp_path / "b", key_dir, cache_dir)


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        ("{name: ../evil, revision: r1, path: x}", "models.0.name: Value error, must be a safe path component"),
        ("{name: 'a/b', revision: r1, path: x}", "models.0.name: Value error"),
        ("{name: m, revision: '..', path: x}", "models.0.revision: Value error, must be a safe path component"),
        ("{name: m, revision: '.', path: x}", "models.0.revision: Value error"),
        ("{name: 'm m', revision: r1, path: x}", "models.0.name: Value error"),
        ("{name: m, revision: r1}", "models.0: Value error, give exactly one of path or huggingface"),
        ("{name: m, revision: r1, path: x, huggingface: {repo_id: a/b, revision: " + "a" * 40 + "}}",
         "models.0: Value error, give exactly one"),
        ("{name: m, revision: r1, huggingface: {repo_id: a/b}}", "models.0.huggingface.revision: Field required"),
        ("{name: m, revision: r1, huggingface: {repo_id: a/b, revision: main}}",
         "models.0.huggingface.revision: Value error, 'main' is not a commit"),
        ("{name: m, revision: r1, path: x, sha: y}", "models.0.sha: unknown field"),
    ],
)
def test_bad_model_entry_is_named(tmp_path: Path, entry: str, field: str) -> None:
    path = write_profile(tmp_path / "bad.yml", extra=f"models:\n  - {entry}\n")
    with pytest.raises(ProfileError) as info:
        load_profile(str(path))
    assert field in str(info.value)


def test_duplicate_model_refused(tmp_path: Path) -> None:
    path = write_profile(tmp_path / "dup.yml",
                         extra="models:\n  - {name: m, revision: r1, path: a}\n  - {name: m, revision: r1, path: b}\n")
    with pytest.raises(ProfileError, match="models: Value error, model m revision r1 is listed twice"):
        load_profile(str(path))


SHA = "b5c939de8f754692c1647ca79fbf85e8c1e70f8a"
HUB = "  - {name: oss, revision: r1, huggingface: {repo_id: openai/gpt-oss-120b, revision: " + SHA + "}, exclude: ['original/*']}\n"


def test_huggingface_not_installed(monkeypatch: pytest.MonkeyPatch, inputs: Inputs, key_dir: Path, cache_dir: Path, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import raises ImportError
    profile = model_profile(inputs, "models-hub-missing", HUB)
    with pytest.raises(BuildError) as info:
        build(profile, tmp_path / "b", key_dir, cache_dir)
    message = str(info.value)
    assert message.startswith(
        "models[0] (oss r1).huggingface: openai/gpt-oss-120b@" + SHA + ": the huggingface_hub package is not installed")
    assert "path:" in message


def _fake_hub(monkeypatch: pytest.MonkeyPatch, download: Any) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []

    def snapshot_download(**kwargs: Any) -> str:
        calls.append(kwargs)
        return str(download(**kwargs))

    module = types.ModuleType("huggingface_hub")
    module.snapshot_download = snapshot_download  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "huggingface_hub", module)
    return calls


def test_huggingface_unreachable(monkeypatch: pytest.MonkeyPatch, inputs: Inputs, key_dir: Path, cache_dir: Path, tmp_path: Path) -> None:
    def fail(**_: Any) -> Path:
        raise OSError("Cannot reach https://huggingface.co: offline\nmore")

    _fake_hub(monkeypatch, fail)
    profile = model_profile(inputs, "models-hub-down", HUB)
    with pytest.raises(BuildError) as info:
        build(profile, tmp_path / "b", key_dir, cache_dir)
    assert str(info.value) == (
        f"models[0] (oss r1).huggingface: openai/gpt-oss-120b@{SHA}: cannot download it from the Hugging Face hub: "
        "Cannot reach https://huggingface.co: offline more"
    )


def test_huggingface_snapshot(monkeypatch: pytest.MonkeyPatch, inputs: Inputs, key_dir: Path, cache_dir: Path, tmp_path: Path) -> None:
    snap = make_snapshot(tmp_path / "hub-snap", {"config.json": b"{}", "model.safetensors": b"w"})
    calls = _fake_hub(monkeypatch, lambda **_: snap)
    profile = model_profile(inputs, "models-hub", HUB)
    result = build(profile, tmp_path / "b", key_dir, cache_dir)
    (call,) = calls
    assert call["repo_id"] == "openai/gpt-oss-120b" and call["revision"] == SHA
    assert call["ignore_patterns"] == ["original/*"]
    assert call["cache_dir"] == str(cache_dir / "huggingface")
    (entry,) = result.manifest["components"]["models"]
    assert entry["source"] == f"huggingface openai/gpt-oss-120b@{SHA}" and entry["files"] == 2
    assert (result.path / "models" / "oss" / "r1" / "model.safetensors").read_bytes() == b"w"
