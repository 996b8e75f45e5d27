"""The NVIDIA driver packages as NVIDIA's repositories publish them, per flavour (the stub repos of
tests/fixtures/nvidia-repo, served as signed apt sources): the lab profile's nvidia group resolves
with the real builder to exactly the pinned release, compute only; the nvidia_driver role's package
sets exist in each flavour; the pin the role writes leaves the distribution's dependencies alone."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from labctl.bundle.apt_stage import BaseSpec, collect_apt
from labctl.bundle.staging import Staging
from labctl.profile import load_profile
from labctl.progress import PlainReporter

from .conftest import make_deb

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "nvidia-repo"
OUT = FIXTURE / "out"
FLAVOURS = {"debian12": OUT, "ubuntu2404": OUT / "ubuntu2404", "ubuntu2204": OUT / "ubuntu2204"}
ROLE_VARS = yaml.safe_load((REPO / "roles" / "nvidia_driver" / "vars" / "main.yml").read_text())
LAB = yaml.safe_load((REPO / "profiles" / "lab.yml").read_text())
RELEASE = "580.95.05"
# What the distribution provides to the driver packages (real names; no content, no dependencies).
# nvidia-kernel-common at bookworm contrib's version: NVIDIA's debian12 kernel module packages need it.
DISTRO = {"dkms": "1.0-1", "ocl-icd-libopencl1": "1.0-1", "adduser": "1.0-1", "python3": "1.0-1",
          "xserver-xorg-core": "1.0-1", "nvidia-kernel-common": "20220217+3~deb12u1"}


def _family(flavour: str) -> str:
    return "debian" if flavour == "debian12" else "ubuntu"


def _driver_packages(flavour: str, modules: str = "open", branch: str = "580") -> list[str]:
    suffix = f"-{branch}" if int(branch) <= 580 else ""
    names = ROLE_VARS["__nvidia_driver_packages_by_family"][_family(flavour)][modules]
    return [name.replace("{S}", suffix) for name in names]


@pytest.fixture(scope="module")
def stub_repos() -> Path:
    subprocess.run([sys.executable, str(FIXTURE / "build.py")], check=True, capture_output=True)
    return OUT


@pytest.fixture(scope="module")
def distro_repo(tmp_path_factory: pytest.TempPathFactory, stub_repos: Path) -> Path:
    """The distribution's packages the driver depends on, as a signed flat repo (the stub key)."""
    repo = tmp_path_factory.mktemp("distro")
    work = tmp_path_factory.mktemp("distro-work")
    for name, version in DISTRO.items():
        make_deb(repo, name, version, "all", None, work)
    sys.path.insert(0, str(FIXTURE))
    import build  # the fixture builder's index writer and signing key

    build.write_index(repo, "distro", build.signing_key(), dict(os.environ, LC_ALL="C.UTF-8"))
    return repo


def _resolve(tmp_path: Path, flavour: str, group: dict[str, Any], distro: Path) -> dict[str, str]:
    """The real builder's apt stage on a profile with one group from the flavour's repo: name -> version."""
    keyring = str(OUT / "nvidia-stub-keyring.gpg")
    profile = {
        "name": f"nvidia-{flavour}",
        "target": {"os": "debian", "release": "12", "codename": "bookworm", "arch": "amd64", "python": "3.11"},
        "apt": {
            "sources": [
                {"name": "cuda", "uris": [f"file:{FLAVOURS[flavour]}"], "suites": ["./"], "signed_by": keyring},
                {"name": "distro", "uris": [f"file:{distro}"], "suites": ["./"], "signed_by": keyring},
            ],
            "groups": {"nvidia": group},
            "install_recommends": True,
        },
    }
    path = tmp_path / "profile.yml"
    path.write_text(yaml.safe_dump(profile))
    status = tmp_path / "status"
    status.write_text("Package: base-files\nStatus: install ok installed\nVersion: 12.4\nArchitecture: amd64\n\n")
    staging = Staging.start(tmp_path / "bundle", PlainReporter())
    try:
        result = collect_apt(load_profile(str(path)), tmp_path / "cache", BaseSpec(status_file=status), staging)
    finally:
        shutil.rmtree(staging.root, ignore_errors=True)
    return {deb.name: deb.version for deb in result.debs}


@pytest.mark.parametrize("flavour", ["ubuntu2404", "ubuntu2204"])
def test_the_lab_profile_resolves_to_the_pinned_release_compute_only(
        tmp_path: Path, flavour: str, distro_repo: Path) -> None:
    group = LAB["apt"]["groups"]["nvidia"]
    got = _resolve(tmp_path, flavour, group, distro_repo)
    nvidia = {name: version for name, version in got.items() if name not in DISTRO and not name.startswith("cuda-")}
    # Every NVIDIA package is of the pinned release: the driver at -0ubuntu1, NVIDIA's own at -1.
    assert {v.split("-")[0] for v in nvidia.values()} == {RELEASE}, nvidia
    assert nvidia["libnvidia-compute-580"] == "580.95.05-0ubuntu1"
    assert nvidia["nvidia-fabricmanager"] == "580.95.05-1" and nvidia["libnvidia-nscq"] == "580.95.05-1"
    # Compute only: no desktop stack, no meta of another branch or flavour.
    assert not [n for n in nvidia if n.startswith(("libnvidia-gl", "xserver-", "nvidia-driver-", "nvidia-open"))], nvidia
    assert "libnvidia-egl-wayland1" not in got and "nvidia-dkms-580" not in nvidia
    assert {"nvidia-dkms-580-open", "nvidia-kernel-common-580", "nvidia-kernel-source-580-open",
            "nvidia-firmware-580-580.95.05", "nvidia-compute-utils-580", "nvidia-utils-580"} <= set(nvidia)
    assert got["cuda-toolkit-12-9"] == "12.9.1-1"


@pytest.mark.parametrize("flavour", ["debian12", "ubuntu2404", "ubuntu2204"])
def test_the_roles_package_set_resolves_in_every_flavour(tmp_path: Path, flavour: str, distro_repo: Path) -> None:
    group = {"sources": ["cuda"], "pin": LAB["apt"]["groups"]["nvidia"]["pin"],
             "packages": [*_driver_packages(flavour), "nvidia-fabricmanager", "libnvidia-nscq"]}
    got = _resolve(tmp_path, flavour, group, distro_repo)
    nvidia = {name: version for name, version in got.items() if name not in DISTRO}
    assert {v.split("-")[0] for v in nvidia.values()} == {RELEASE}, nvidia
    assert not [n for n in nvidia if n in ("nvidia-open", "nvidia-driver", "cuda-drivers") or "-gl" in n], nvidia


def test_the_lab_profile_lists_the_roles_ubuntu_set() -> None:
    packages = LAB["apt"]["groups"]["nvidia"]["packages"]
    assert packages[:4] == _driver_packages("ubuntu2404")
    assert {"nvidia-fabricmanager", "libnvidia-nscq"} <= set(packages)


def test_bare_nvidia_open_is_the_newest_branch_on_ubuntu(stub_repos: Path) -> None:
    """Why the lab profile may not name nvidia-open: in NVIDIA's Ubuntu repositories the bare
    name exists only from 590 (the renames); 580's open meta is nvidia-open-580."""
    index = (FLAVOURS["ubuntu2404"] / "Packages").read_text()
    stanzas = [dict(line.split(": ", 1) for line in block.splitlines() if ": " in line and not line.startswith(" "))
               for block in index.split("\n\n") if block.strip()]
    versions = {s["Version"] for s in stanzas if s["Package"] == "nvidia-open"}
    assert versions == {"590.44.01-1ubuntu1"}
    assert {s["Version"] for s in stanzas if s["Package"] == "nvidia-open-580"} == {"580.95.05-0ubuntu1", "580.105.08-0ubuntu1"}


# The preferences file the nvidia_driver role wrote before issue 16: the branch at 1000, every
# other version of every nvidia-*/libnvidia-* name at -1.
OLD_PIN = """Package: nvidia-* libnvidia-* libcuda1 libcuda1-* cuda-drivers cuda-drivers-* libxnvctrl*
Pin: version 580.95.05*
Pin-Priority: 1000

Package: nvidia-* libnvidia-* libcuda1 libcuda1-* cuda-drivers cuda-drivers-* libxnvctrl*
Pin: version *
Pin-Priority: -1
"""


def _simulate(tmp_path: Path, preferences: str, packages: list[str], distro: Path) -> subprocess.CompletedProcess[str]:
    from labctl.bundle.aptclosure import IsolatedApt, SourceSpec

    keyring = OUT / "nvidia-stub-keyring.gpg"
    tmp_path.mkdir(parents=True, exist_ok=True)
    status = tmp_path / "status"
    status.write_text("Package: base-files\nStatus: install ok installed\nVersion: 12.4\nArchitecture: amd64\n\n")
    apt = IsolatedApt(state_dir=tmp_path / "apt", archives=tmp_path / "archives", base_status=status, arch="amd64",
                      foreign_arches=[], install_recommends=False, preferences=preferences,
                      sources=[SourceSpec("cuda", (f"file:{FLAVOURS['ubuntu2404']}",), ("./",), (), keyring),
                               SourceSpec("distro", (f"file:{distro}",), ("./",), (), keyring)])
    apt.update()
    return apt.run("-s", "install", *packages)


def test_the_pin_leaves_the_distributions_packages_alone(tmp_path: Path, distro_repo: Path) -> None:
    """Ubuntu's libnvidia-gl-580 depends on the distribution's libnvidia-egl-wayland1
    (1:1.1.13-1build1): the old pin's -1 on every libnvidia-* name outside the branch made the
    driver's own dependency uninstallable, and its name globs missed packages of the driver's
    source (xserver-xorg-video-nvidia-580 floated to the newest release). The role's pin (NVIDIA's
    src: form at 1000, no -1) installs both, each at the pinned release."""
    gl, desktop = ["libnvidia-gl-580=580.95.05-0ubuntu1"], ["nvidia-driver-580-open=580.95.05-0ubuntu1"]
    old_gl = _simulate(tmp_path / "old-gl", OLD_PIN, gl, distro_repo)
    assert old_gl.returncode != 0 and "libnvidia-egl-wayland1" in old_gl.stdout, old_gl.stdout[-1500:]
    old_desktop = _simulate(tmp_path / "old-desktop", OLD_PIN, desktop, distro_repo)
    assert old_desktop.returncode != 0, old_desktop.stdout[-1500:]
    new_pin = (REPO / "roles" / "nvidia_driver" / "templates" / "etc" / "apt" / "preferences.d"
               / "labctl-nvidia-driver.j2").read_text()
    stanza = "\n".join(line for line in new_pin.splitlines() if line and not line.startswith(("#", "{{")))
    stanza = stanza.replace("{{ __nvidia_driver_pin_version }}", "580.95.05-*") + "\n"
    for packages in (gl, desktop):
        new = _simulate(tmp_path / f"new-{packages[0].split('=')[0]}", stanza, packages, distro_repo)
        assert new.returncode == 0, new.stdout[-2000:] + new.stderr[-2000:]
        assert "Inst libnvidia-egl-wayland1 (1:1.1.13-1build1" in new.stdout
        assert "580.105.08" not in new.stdout
