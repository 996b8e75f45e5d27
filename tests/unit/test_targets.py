"""The supported OSes (src/labctl/targets.py) and the lab profile per OS: one profile, per-OS data,
an OS the README does not list refused by name, wheel platform tags from the target's glibc."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from labctl.bundle.wheels import pip_download_command
from labctl.profile import ProfileError, load_profile
from labctl.targets import SUPPORTED, UnsupportedTarget, manylinux_tags, os_release

REPO = Path(__file__).resolve().parents[2]
ROLE_VARS = yaml.safe_load((REPO / "roles" / "nvidia_driver" / "vars" / "main.yml").read_text())


def test_the_readme_lists_the_supported_oses() -> None:
    readme = (REPO / "README.md").read_text()
    assert [entry.name for entry in SUPPORTED.values()] == ["Ubuntu 24.04", "Ubuntu 22.04", "Debian 12"]
    for entry in SUPPORTED.values():
        assert entry.name in readme


def test_manylinux_tags_are_every_tag_the_glibc_runs() -> None:
    tags = manylinux_tags("2.36", "amd64")
    assert tags[0] == "manylinux_2_36_x86_64" and "manylinux_2_37_x86_64" not in tags
    # The CUDA 12.9 libraries torch cu129 needs are manylinux_2_27 only (nvidia-cublas-cu12 12.9.1.4).
    assert "manylinux_2_27_x86_64" in tags and "manylinux_2_5_x86_64" in tags
    assert tags[-3:] == ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
    assert manylinux_tags("2.39", "arm64")[-1] == "manylinux2014_aarch64"
    with pytest.raises(UnsupportedTarget, match="architecture 'riscv64'"):
        manylinux_tags("2.39", "riscv64")


def test_pip_gets_the_targets_tags() -> None:
    lab = load_profile("lab", "debian-12").spec.target
    cmd = pip_download_command(Path("/d"), Path("/r"), lab.python, lab.abi, lab.platforms)
    platforms = [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "--platform"]
    assert platforms == manylinux_tags("2.36", "amd64")
    assert cmd[cmd.index("--abi") + 1] == "cp311"


@pytest.mark.parametrize(
    ("os", "codename", "python", "repo", "anchor", "kernel"),
    [
        ("ubuntu-24.04", "noble", "3.12", "ubuntu2404", "libnvidia-compute-580",
         ["linux-image-generic", "linux-headers-generic", "linux-image-generic-hwe-24.04", "linux-headers-generic-hwe-24.04"]),
        ("ubuntu-22.04", "jammy", "3.11", "ubuntu2204", "libnvidia-compute-580",
         ["linux-image-generic", "linux-headers-generic", "linux-image-generic-hwe-22.04", "linux-headers-generic-hwe-22.04"]),
        ("debian-12", "bookworm", "3.11", "debian12", "nvidia-driver-cuda", ["linux-image-amd64", "linux-headers-amd64"]),
    ],
)
def test_the_lab_profile_for_each_os(os: str, codename: str, python: str, repo: str, anchor: str, kernel: list[str]) -> None:
    lab = load_profile("lab", os)
    spec = lab.spec
    assert lab.os == os and spec.target.codename == codename and spec.target.python == python
    sources = {source.name: source for source in spec.apt.sources}
    assert sources["cuda"].uris == [f"https://developer.download.nvidia.com/compute/cuda/repos/{repo}/x86_64/"]
    assert sources["archive"].suites == [codename, f"{codename}-updates"]
    assert sources["security"].suites == [f"{codename}-security"]
    # Each kernel flavour's image and headers metapackages: the GPU layer installs the headers
    # metapackage of the host's flavour, and the image one where the running kernel has no headers.
    assert spec.apt.groups["kernel"].packages == kernel
    assert ("contrib" in sources["archive"].components) == (os == "debian-12")
    assert "mokutil" in spec.apt.packages
    # The nvidia group is the set the nvidia_driver role installs for the OS's packaging.
    family = "debian" if os.startswith("debian") else "ubuntu"
    role_set = [n.replace("{S}", "-580") for n in ROLE_VARS["__nvidia_driver_packages_by_family"][family]["open"]]
    nvidia = spec.apt.groups["nvidia"]
    assert nvidia.packages[: len(role_set)] == role_set and nvidia.packages[0] == anchor
    assert {"nvidia-fabricmanager", "libnvidia-nscq", "cuda-toolkit-12-9"} <= set(nvidia.packages)
    assert nvidia.pin is not None and nvidia.pin.version == "580.95.05-*"
    # Database mode needs Node.js >= 16.13 for Prisma's CLI: not on jammy (12.22).
    assert (spec.prisma is None) == (os == "ubuntu-22.04")
    assert ("database" in spec.apt.groups) == (os != "ubuntu-22.04")


def test_the_default_os_is_the_profiles_target() -> None:
    assert load_profile("lab").os == "ubuntu-24.04"
    assert load_profile("test").os == "debian-12"


@pytest.mark.parametrize(
    ("os", "message"),
    [
        ("ubuntu-20.04", ("--os ubuntu-20.04: ubuntu 20.04 is not a supported OS; bundles are built for "
                          "Ubuntu 24.04, Ubuntu 22.04, Debian 12 (README)")),
        ("debian-13", "debian 13 is not a supported OS"),
        ("rhel-9", "rhel 9 is not a supported OS"),
    ],
)
def test_an_os_the_readme_does_not_list_is_refused_by_name(os: str, message: str) -> None:
    with pytest.raises(ProfileError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_profile("lab", os)


def test_a_profile_without_os_section_takes_only_its_own_os() -> None:
    assert load_profile("test", "debian-12").os == "debian-12"  # its target (labctl bundle lock --os)
    with pytest.raises(ProfileError, match=re.escape("has no os: section, so --os ubuntu-24.04 cannot be chosen")):
        load_profile("test", "ubuntu-24.04")


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "p.yml"
    path.write_text(text)
    return str(path)


def test_an_os_entry_for_an_unlisted_os_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, "target: {os: debian, release: '12'}\nos:\n  debian-12: {}\n  ubuntu-20.04: {}\n")
    with pytest.raises(ProfileError, match=re.escape("os.ubuntu-20.04: ubuntu 20.04 is not a supported OS")):
        load_profile(path)


def test_an_os_entry_must_target_its_os(tmp_path: Path) -> None:
    path = _write(tmp_path, "target: {os: debian, release: '12'}\nos:\n  debian-12: {}\n  ubuntu-24.04: {}\n")
    with pytest.raises(ProfileError, match=re.escape("os.ubuntu-24.04: its target must be ubuntu-24.04")):
        load_profile(path, "ubuntu-24.04")


def test_database_mode_is_refused_where_node_is_too_old(tmp_path: Path) -> None:
    """Prisma 5.17's CLI needs Node.js >= 16.13; Ubuntu 22.04 ships 12.22."""
    commit = "393aa359c9ad4a4bb28630fb5613f9c281cde053"
    path = _write(tmp_path, "target: {os: ubuntu, release: '22.04'}\n"
                            f"prisma: {{cli_version: '5.17.0', engine_commit: {commit}}}\n")
    with pytest.raises(ProfileError, match=re.escape("prisma: Ubuntu 22.04 ships Node.js 12.22; Prisma's CLI needs 16.13 or newer")):
        load_profile(path)


def test_another_python_must_come_from_the_bundle(tmp_path: Path) -> None:
    path = _write(tmp_path, "target: {os: ubuntu, release: '22.04', python: '3.11'}\napt: {packages: [python3.11]}\n")
    with pytest.raises(ProfileError, match=re.escape("must carry python3.11-venv, python3.11-dev")):
        load_profile(path)
    assert os_release("ubuntu", "22.04").pythons == ("3.10", "3.11")
