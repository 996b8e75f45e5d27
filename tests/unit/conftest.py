"""Shared fixtures: tiny .debs and wheels, an offline profile and a bundle built from it.

Nothing here touches the network, docker or the user's ~/.cache and key dir.
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import json
import os
import pkgutil
import pwd
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import labctl.module_utils
from labctl.bundle.apt_stage import BaseSpec
from labctl.bundle.builder import BuildOptions, BuildResult, build_bundle
from labctl.cli import app
from labctl.profile import load_profile
from labctl.progress import PlainReporter

# library/'s modules import labctl's shared target code as ansible.module_utils.labctl (ansible packs it
# with them, the light call sends it along); the tests that load a module's file in-process find it
# under that name as labctl's own package.
sys.modules.setdefault("ansible.module_utils.labctl", labctl.module_utils)
for _shared in pkgutil.iter_modules(labctl.module_utils.__path__):
    sys.modules.setdefault(f"ansible.module_utils.labctl.{_shared.name}",
                           importlib.import_module(f"labctl.module_utils.{_shared.name}"))

# (name, version, arch, depends); pkgb has an epoch to check pool naming.
DEBS = [
    ("labctl-test-app", "1.0-1", "all", "labctl-test-lib (>= 1:2.0)"),
    ("labctl-test-lib", "1:2.0-1", "amd64", None),
    ("labctl-test-tool", "0.3", "all", None),
]
WHEEL = ("labctl_demo", "1.2.3")


def make_deb(dest: Path, name: str, version: str, arch: str, depends: str | None, work: Path) -> Path:
    root = work / f"{name}-root"
    (root / "DEBIAN").mkdir(parents=True)
    doc = root / "usr" / "share" / "doc" / name
    doc.mkdir(parents=True)
    (doc / "README").write_text(f"{name} {version}\n")
    control = [
        f"Package: {name}",
        f"Version: {version}",
        f"Architecture: {arch}",
        "Maintainer: labctl tests <tests@example.invalid>",
        "Section: misc",
        "Priority: optional",
    ]
    if depends:
        control.append(f"Depends: {depends}")
    control += [f"Description: labctl test package {name}", " A tiny package for the bundle tests.", " .", " Second paragraph."]
    (root / "DEBIAN" / "control").write_text("\n".join(control) + "\n")
    env = dict(os.environ, SOURCE_DATE_EPOCH="1700000000")
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(dest)],
        check=True,
        capture_output=True,
        env=env,
    )
    return next(dest.glob(f"{name}_*.deb"))


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(dest: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    """A minimal valid pure-python wheel (deterministic), with optional Requires-Dist lines."""
    dist_info = f"{name}-{version}.dist-info"
    depends = "".join(f"Requires-Dist: {req}\n" for req in requires)
    files = {
        f"{name}/__init__.py": f'__version__ = "{version}"\n'.encode(),
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{depends}".encode(),
        f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: labctl-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{path},{_record_hash(data)},{len(data)}\n" for path, data in files.items())
    record += f"{dist_info}/RECORD,,\n"
    files[f"{dist_info}/RECORD"] = record.encode()
    path = dest / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for member, data in files.items():
            info = zipfile.ZipInfo(member, date_time=(2024, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data)
    return path


@dataclass(frozen=True)
class Inputs:
    root: Path
    profile: Path
    debs: list[Path]
    wheel: Path


def write_profile(path: Path, extra: str = "", apt_extra: str = "") -> Path:
    path.write_text(
        "name: unit\n"
        "target: {os: debian, release: '12', codename: bookworm, arch: amd64, python: '3.11'}\n"
        "apt:\n"
        "  local_debs: [debs]\n"
        f"{apt_extra}"
        "wheels:\n"
        "  local: [wheels]\n"
        f"{extra}"
    )
    return path


@pytest.fixture(scope="session")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Inputs:
    root = tmp_path_factory.mktemp("in")
    (root / "debs").mkdir()
    (root / "wheels").mkdir()
    work = root / "work"
    debs = [make_deb(root / "debs", *spec, work=work) for spec in DEBS]
    shutil.rmtree(work)
    wheel = make_wheel(root / "wheels", *WHEEL)
    return Inputs(root=root, profile=write_profile(root / "unit.yml"), debs=debs, wheel=wheel)


@pytest.fixture(scope="session")
def key_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Short: gpg-agent puts its sockets here when /run/user/UID is missing.
    return tmp_path_factory.mktemp("k") / "key"


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache") / "bundle"


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch, key_dir: Path, cache_dir: Path) -> None:
    monkeypatch.setenv("LABCTL_BUNDLE_KEY_DIR", str(key_dir))
    monkeypatch.setenv("LABCTL_CACHE_DIR", str(cache_dir))
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)


def build(profile: Path, out: Path, key_dir: Path, cache_dir: Path) -> BuildResult:
    options = BuildOptions(
        profile=load_profile(str(profile)), out=out, key_dir=key_dir, cache_dir=cache_dir, base=BaseSpec()
    )
    return build_bundle(options, PlainReporter())


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory, inputs: Inputs, key_dir: Path, cache_dir: Path) -> BuildResult:
    """One bundle for the whole session; tests that modify it use ``bundle``."""
    return build(inputs.profile, tmp_path_factory.mktemp("built") / "bundle", key_dir, cache_dir)


@pytest.fixture
def bundle(built: BuildResult, tmp_path: Path) -> Path:
    """A private copy of the session bundle, free to tamper with."""
    dest = tmp_path / "bundle"
    shutil.copytree(built.path, dest)
    return dest


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def invoke(runner: CliRunner, *args: str) -> Any:
    return runner.invoke(app, list(args), catch_exceptions=False)


def manifest_of(bundle: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((bundle / "manifest.json").read_text())
    return data


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@dataclass(frozen=True)
class IsolatedApt:
    """apt-get with a private config, like a fresh target consuming the bundle."""

    root: Path

    @property
    def config(self) -> Path:
        return self.root / "apt.conf"

    def run(self, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("APT_", "LC_", "LANG"))}
        env.update(APT_CONFIG=str(self.config), LC_ALL="C.UTF-8")
        return subprocess.run(["apt-get", *args], env=env, cwd=cwd, capture_output=True, text=True, check=False)


def isolated_apt(root: Path, bundle: Path) -> IsolatedApt:
    etc = root / "etc"
    for sub in ("apt.conf.d", "preferences.d", "sources.list.d", "trusted.gpg.d"):
        (etc / sub).mkdir(parents=True)
    for sub in ("lists/partial", "cache/archives/partial", "state", "log"):
        (root / sub).mkdir(parents=True)
    (root / "status").write_text("")
    # deb822, like the Ansible role's /etc/apt/sources.list.d/labctl-bundle.sources
    (etc / "sources.list.d" / "bundle.sources").write_text(
        "Types: deb\n"
        f"URIs: file:{bundle}/apt\n"
        "Suites: ./\n"
        f"Signed-By: {bundle}/keys/bundle.gpg\n"
    )
    user = pwd.getpwuid(os.getuid()).pw_name
    conf = {
        "Dir::Etc": etc,
        "Dir::Etc::sourcelist": "sources.list",
        "Dir::Etc::sourceparts": "sources.list.d",
        "Dir::Etc::parts": "apt.conf.d",
        "Dir::Etc::main": "apt.conf",
        "Dir::Etc::preferences": "preferences",
        "Dir::Etc::preferencesparts": "preferences.d",
        "Dir::Etc::trusted": "trusted.gpg",
        "Dir::Etc::trustedparts": "trusted.gpg.d",
        "Dir::State": root / "state",
        "Dir::State::lists": root / "lists",
        "Dir::State::status": root / "status",
        "Dir::Cache": root / "cache",
        "Dir::Log": root / "log",
        "APT::Architecture": "amd64",
        "APT::Sandbox::User": user,
        "Debug::NoLocking": "1",
    }
    text = "".join(f'{key} "{value}";\n' for key, value in conf.items())
    text += 'APT::Architectures { "amd64"; };\n'
    (root / "apt.conf").write_text(text)
    return IsolatedApt(root)
