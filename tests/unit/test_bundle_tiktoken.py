"""The tiktoken component: harmony's files from a wheel, a directory or a URL, checked by sha256.

The real files cannot be had offline, so these tests use stand-in bytes and put their sha256
into ``tiktoken_stage.EXPECTED_SHA256`` (the table the builder checks against).
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from labctl.bundle import tiktoken_stage
from labctl.bundle.errors import BuildError
from labctl.module_utils import verifycore
from labctl.profile import ProfileError, load_profile

from .conftest import Inputs, build, flip_byte, invoke, manifest_of, write_profile

# The facts the targets depend on (openai-harmony's public_encodings.rs).
O200K_SHA1 = "fb374d419588a4632f3f557e76b4b70aebbca790"
CL100K_SHA1 = "9b5ad71b2ce5302211f9c61530b329a4922fc6a4"
HARMONY_SHA256 = {
    "o200k_base": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    "cl100k_base": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
}
FAKE = {
    "o200k_base": b"bzw= 0\nIQ== 1\n" * 50,  # base64 token + rank lines, like the real files
    "cl100k_base": b"YQ== 0\nYg== 1\n" * 40,
}
MEMBER_DIR = "litellm/litellm_core_utils/tokenizers"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def fake_hashes(monkeypatch: pytest.MonkeyPatch) -> None:
    for encoding, data in FAKE.items():
        monkeypatch.setitem(tiktoken_stage.EXPECTED_SHA256, encoding, _sha256(data))


def make_litellm_wheel(dest: Path, contents: dict[str, bytes], name: str = "fakellm", version: str = "1.0.0") -> Path:
    """A valid pure-python wheel carrying ``contents`` under litellm's tokenizers dir, sha1-named."""
    dist_info = f"{name}-{version}.dist-info"
    files = {f"{MEMBER_DIR}/{tiktoken_stage.sha1_name(enc)}": data for enc, data in contents.items()}
    files[f"{MEMBER_DIR}/__init__.py"] = b""
    files[f"{dist_info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    files[f"{dist_info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: labctl-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = "".join(
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}\n"
        for path, data in files.items()
    )
    files[f"{dist_info}/RECORD"] = (record + f"{dist_info}/RECORD,,\n").encode()
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for member, data in files.items():
            archive.writestr(zipfile.ZipInfo(member, date_time=(2024, 1, 1, 0, 0, 0)), data, zipfile.ZIP_DEFLATED)
    return path


def tiktoken_profile(inputs: Inputs, name: str, section: str) -> Path:
    return write_profile(inputs.root / f"{name}.yml", extra=section)


def test_harmony_facts() -> None:
    assert tiktoken_stage.EXPECTED_SHA256 == HARMONY_SHA256
    assert tiktoken_stage.sha1_name("o200k_base") == O200K_SHA1
    assert tiktoken_stage.sha1_name("cl100k_base") == CL100K_SHA1
    assert tiktoken_stage.canonical_url("o200k_base") == "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"


def test_shipped_profiles() -> None:
    test = load_profile("test").spec.tiktoken
    assert test is not None and test.source == "wheel" and test.wheel == "litellm==1.106.0"
    assert test.encodings == ["o200k_base", "cl100k_base"]
    lab = load_profile("lab").spec.tiktoken
    assert lab is not None and lab.source == "url"
    assert lab.url == "https://openaipublic.blob.core.windows.net/encodings/"


def test_wheel_file(fake_hashes: None, runner: CliRunner, inputs: Inputs, tmp_path: Path) -> None:
    make_litellm_wheel(inputs.root / "tik", FAKE)
    profile = tiktoken_profile(inputs, "tik-wheel", "tiktoken:\n  source: wheel\n  wheel: tik/fakellm-1.0.0-py3-none-any.whl\n")
    out = tmp_path / "b"
    result = invoke(runner, "bundle", "build", "--profile", str(profile), "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "tiktoken: 2 files" in result.stdout
    for encoding, data in FAKE.items():
        assert (out / "tiktoken" / f"{encoding}.tiktoken").read_bytes() == data
    assert sorted(p.name for p in (out / "tiktoken").iterdir()) == ["cl100k_base.tiktoken", "o200k_base.tiktoken"]
    manifest = manifest_of(out)
    component = manifest["components"]["tiktoken"]
    assert component["source"] == "wheel tik/fakellm-1.0.0-py3-none-any.whl"
    assert component["files"] == [
        {
            "encoding": "o200k_base",
            "file": "tiktoken/o200k_base.tiktoken",
            "sha256": _sha256(FAKE["o200k_base"]),
            "size": len(FAKE["o200k_base"]),
            "url": "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken",
            "sha1_name": O200K_SHA1,
        },
        {
            "encoding": "cl100k_base",
            "file": "tiktoken/cl100k_base.tiktoken",
            "sha256": _sha256(FAKE["cl100k_base"]),
            "size": len(FAKE["cl100k_base"]),
            "url": "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken",
            "sha1_name": CL100K_SHA1,
        },
    ]
    listed = {f["path"]: f for f in manifest["files"]}
    for entry in component["files"]:
        assert listed[entry["file"]]["sha256"] == entry["sha256"]
    assert invoke(runner, "bundle", "verify", str(out)).exit_code == 0

    flip_byte(out / "tiktoken" / "o200k_base.tiktoken")
    tampered = invoke(runner, "bundle", "verify", str(out))
    assert tampered.exit_code == 1
    assert "modified: tiktoken/o200k_base.tiktoken (sha256 expected" in tampered.stdout


def test_wrong_file_is_refused(runner: CliRunner, inputs: Inputs, tmp_path: Path) -> None:
    # EXPECTED_SHA256 keeps harmony's real values: the stand-in bytes must be refused.
    wheel = make_litellm_wheel(inputs.root / "tik-bad", FAKE)
    profile = tiktoken_profile(inputs, "tik-bad", "tiktoken:\n  source: wheel\n  wheel: tik-bad/fakellm-1.0.0-py3-none-any.whl\n")
    out = tmp_path / "b"
    result = invoke(runner, "bundle", "build", "--profile", str(profile), "--out", str(out))
    assert result.exit_code == 1
    message = result.stderr
    assert "tiktoken: o200k_base.tiktoken from wheel tik-bad/fakellm-1.0.0-py3-none-any.whl" in message
    assert f"{wheel.name}:{MEMBER_DIR}/{O200K_SHA1}" in message
    assert f"has sha256 {_sha256(FAKE['o200k_base'])}" in message
    assert f"openai-harmony expects {HARMONY_SHA256['o200k_base']}" in message
    assert not out.exists() and not out.with_name("b.partial").exists()


def test_one_wrong_encoding(monkeypatch: pytest.MonkeyPatch, inputs: Inputs, key_dir: Path, cache_dir: Path, tmp_path: Path) -> None:
    monkeypatch.setitem(tiktoken_stage.EXPECTED_SHA256, "o200k_base", _sha256(FAKE["o200k_base"]))
    make_litellm_wheel(inputs.root / "tik-half", FAKE)
    profile = tiktoken_profile(inputs, "tik-half", "tiktoken: {source: wheel, wheel: tik-half/fakellm-1.0.0-py3-none-any.whl}\n")
    with pytest.raises(BuildError, match=r"cl100k_base\.tiktoken .* has sha256 [0-9a-f]{64}, openai-harmony expects 223921b7"):
        build(profile, tmp_path / "b", key_dir, cache_dir)


def test_wheel_requirement_through_pip(
    fake_hashes: None, monkeypatch: pytest.MonkeyPatch, inputs: Inputs, key_dir: Path, cache_dir: Path, tmp_path: Path
) -> None:
    """A requirement is fetched with pip download (here from a local find-links dir, no index)."""
    links = tmp_path / "links"
    make_litellm_wheel(links, FAKE, version="2.0.0")
    make_litellm_wheel(links, {"o200k_base": b"older"}, version="1.0.0")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    profile = tiktoken_profile(inputs, "tik-pip", "tiktoken: {source: wheel, wheel: 'fakellm==2.0.0'}\n")
    result = build(profile, tmp_path / "b", key_dir, cache_dir)
    assert (result.path / "tiktoken" / "o200k_base.tiktoken").read_bytes() == FAKE["o200k_base"]
    assert (cache_dir / "tiktoken" / "wheels" / "fakellm-2.0.0-py3-none-any.whl").is_file()
    assert result.manifest["components"]["tiktoken"]["source"] == "wheel fakellm==2.0.0"
    # An exact pin already in the cache is not fetched again (fast, and works without an index).
    for path in links.iterdir():
        path.unlink()
    again = build(profile, tmp_path / "b", key_dir, cache_dir)
    assert again.manifest["content_digest"] == result.manifest["content_digest"]

    missing = tiktoken_profile(inputs, "tik-pip-missing", "tiktoken: {source: wheel, wheel: 'fakellm==9.9'}\n")
    with pytest.raises(BuildError, match=r"^tiktoken\.wheel: pip download fakellm==9\.9 failed: ERROR: "):
        build(missing, tmp_path / "b2", key_dir, cache_dir)


@pytest.mark.parametrize("naming", ["plain", "sha1"])
def test_path_source(fake_hashes: None, naming: str, inputs: Inputs, key_dir: Path, cache_dir: Path, tmp_path: Path) -> None:
    directory = inputs.root / f"tik-dir-{naming}"
    directory.mkdir()
    for encoding, data in FAKE.items():
        name = f"{encoding}.tiktoken" if naming == "plain" else tiktoken_stage.sha1_name(encoding)
        (directory / name).write_bytes(data)
    profile = tiktoken_profile(inputs, f"tik-path-{naming}", f"tiktoken: {{source: path, path: {directory.name}}}\n")
    result = build(profile, tmp_path / "b", key_dir, cache_dir)
    files = result.manifest["components"]["tiktoken"]["files"]
    assert [(f["encoding"], f["sha1_name"]) for f in files] == [("o200k_base", O200K_SHA1), ("cl100k_base", CL100K_SHA1)]
    assert verifycore.verify_bundle(str(result.path)).ok


def test_path_missing_file(fake_hashes: None, inputs: Inputs, key_dir: Path, cache_dir: Path, tmp_path: Path) -> None:
    directory = inputs.root / "tik-dir-half"
    directory.mkdir()
    (directory / "o200k_base.tiktoken").write_bytes(FAKE["o200k_base"])
    profile = tiktoken_profile(inputs, "tik-half-dir", "tiktoken: {source: path, path: tik-dir-half}\n")
    with pytest.raises(BuildError, match=rf"^tiktoken\.path: {directory} has neither cl100k_base\.tiktoken nor {CL100K_SHA1}"):
        build(profile, tmp_path / "b", key_dir, cache_dir)
    only_o200k = tiktoken_profile(inputs, "tik-o200k", "tiktoken: {source: path, path: tik-dir-half, encodings: [o200k_base]}\n")
    result = build(only_o200k, tmp_path / "b", key_dir, cache_dir)
    assert [f["encoding"] for f in result.manifest["components"]["tiktoken"]["files"]] == ["o200k_base"]


def test_url_source_and_cache(fake_hashes: None, inputs: Inputs, key_dir: Path, cache_dir: Path, tmp_path: Path) -> None:
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    for encoding, data in FAKE.items():
        (mirror / f"{encoding}.tiktoken").write_bytes(data)
    profile = tiktoken_profile(inputs, "tik-url", f"tiktoken: {{source: url, url: 'file://{mirror}'}}\n")
    first = build(profile, tmp_path / "b", key_dir, cache_dir)
    files = first.manifest["components"]["tiktoken"]["files"]
    # The recorded URL and sha1 name are harmony's, whatever mirror the files came from.
    assert files[0]["url"] == "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"
    assert files[0]["sha1_name"] == O200K_SHA1
    for path in mirror.iterdir():  # the next build is served from the cache
        path.unlink()
    second = build(profile, tmp_path / "b", key_dir, cache_dir)
    assert second.manifest["content_digest"] == first.manifest["content_digest"]


def test_url_wrong_file_not_cached(monkeypatch: pytest.MonkeyPatch, inputs: Inputs, key_dir: Path, cache_dir: Path, tmp_path: Path) -> None:
    mirror = tmp_path / "bad-mirror"
    mirror.mkdir()
    (mirror / "o200k_base.tiktoken").write_bytes(b"truncated")
    profile = tiktoken_profile(inputs, "tik-url-bad", f"tiktoken: {{source: url, url: 'file://{mirror}/', encodings: [o200k_base]}}\n")
    with pytest.raises(BuildError, match=rf"from file://{mirror}/o200k_base\.tiktoken has sha256 {_sha256(b'truncated')}"):
        build(profile, tmp_path / "b", key_dir, cache_dir)
    cached = cache_dir / "tiktoken" / hashlib.sha1(f"file://{mirror}/o200k_base.tiktoken".encode()).hexdigest()
    assert not cached.exists()
    (mirror / "o200k_base.tiktoken").unlink()
    with pytest.raises(BuildError, match=r"^tiktoken\.url: cannot download file://"):
        build(profile, tmp_path / "b", key_dir, cache_dir)


@pytest.mark.parametrize(
    ("section", "field"),
    [
        ("tiktoken: {source: wheel}\n", "tiktoken: Value error, source: wheel needs wheel"),
        ("tiktoken: {source: path}\n", "tiktoken: Value error, source: path needs path"),
        ("tiktoken: {source: url, path: x}\n", "tiktoken: Value error, path is only read with source: path"),
        ("tiktoken: {source: ftp}\n", "tiktoken.source: Input should be 'url', 'path' or 'wheel'"),
        ("tiktoken: {source: url, encodings: [p50k_base]}\n", "tiktoken.encodings.0: Input should be"),
        ("tiktoken: {source: url, url: 'ftp://x/'}\n", "tiktoken.url: Value error, must start with"),
        ("tiktoken: {source: url, mirror: x}\n", "tiktoken.mirror: unknown field"),
    ],
)
def test_bad_section_is_named(tmp_path: Path, section: str, field: str) -> None:
    path = write_profile(tmp_path / "bad.yml", extra=section)
    with pytest.raises(ProfileError) as info:
        load_profile(str(path))
    assert field in str(info.value)
