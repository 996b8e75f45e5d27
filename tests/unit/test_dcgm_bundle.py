"""Issue 39: the lab bundle carries DCGM where NVIDIA's repository ships it for the pinned driver. The
lab profile's dcgm group, resolved with the real bundle builder against the signed stub repository of
each flavour (tests/fixtures/nvidia-repo, dcgm.py: NVIDIA's DCGM 4 packaging), gives DCGM 4 for the
CUDA 13 user-mode driver of branch 580 and its exporter, exactly the packages the topology looks for
in a bundle and the node_exporter role installs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from labctl import topology

from .conftest import make_deb
from .test_nvidia_flavours import FIXTURE, FLAVOURS, OUT, _resolve

REPO = Path(__file__).resolve().parents[2]
LAB = yaml.safe_load((REPO / "profiles" / "lab.yml").read_text())
# What DCGM needs from the distribution (real names; no content): core's Depends and Pre-Depends,
# cuda13's Recommends.
DISTRO = {"libc6": "2.36-9", "lshw": "02.19.git.2021.06.19.996aaad9c7-2", "passwd": "1:4.13+dfsg1-1",
          "login": "1:4.13+dfsg1-1", "libnuma1": "2.0.16-1"}


@pytest.fixture(scope="module")
def distro_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    subprocess.run([sys.executable, str(FIXTURE / "build.py")], check=True, capture_output=True)
    repo, work = tmp_path_factory.mktemp("distro"), tmp_path_factory.mktemp("distro-work")
    for name, version in DISTRO.items():
        make_deb(repo, name, version, "amd64", None, work)
    sys.path.insert(0, str(FIXTURE))
    import build

    build.write_index(repo, "distro", build.signing_key(), dict(os.environ, LC_ALL="C.UTF-8"))
    return repo


@pytest.mark.parametrize("flavour", sorted(FLAVOURS))
def test_the_lab_bundle_carries_dcgm_for_the_drivers_cuda(tmp_path: Path, flavour: str, distro_repo: Path) -> None:
    got = _resolve(tmp_path, flavour, LAB["apt"]["groups"]["dcgm"], distro_repo)
    dcgm = {name: version for name, version in got.items() if name not in DISTRO}
    assert dcgm == {"datacenter-gpu-manager-4-core": "1:4.5.3-1", "datacenter-gpu-manager-4-cuda13": "1:4.5.3-1",
                    "datacenter-gpu-manager-exporter": "4.8.2-1"}, dcgm
    # Everything the topology needs to run DCGM exporter, nothing for another CUDA major.
    assert set(topology.DCGM_PACKAGES) <= set(got)
    assert "libnuma1" in got and "lshw" in got  # cuda13's Recommends (install_recommends), core's Depends


def test_every_os_of_the_lab_resolves_the_group_from_nvidias_repository() -> None:
    """The group takes its packages from the cuda source, which every OS of the lab profile has, and no
    OS drops it (as Debian 12 drops the firewall group)."""
    assert LAB["apt"]["groups"]["dcgm"]["sources"] == ["cuda"]
    assert [s["name"] for s in LAB["apt"]["sources"]].count("cuda") == 1
    for os_name, override in LAB["os"].items():
        assert "dcgm" not in ((override or {}).get("apt") or {}).get("groups", {}), os_name


def test_the_role_installs_what_the_topology_looks_for() -> None:
    defaults = yaml.safe_load((REPO / "roles" / "node_exporter" / "defaults" / "main.yml").read_text())
    assert tuple(defaults["node_exporter_dcgm_packages"]) == topology.DCGM_PACKAGES
    assert tuple(LAB["apt"]["groups"]["dcgm"]["packages"]) == topology.DCGM_PACKAGES


def test_the_stub_index_of_each_flavour_holds_its_own_packages_only() -> None:
    """dpkg-scanpackages descends into every directory: the Debian flavour's index (out/) must not list
    the Ubuntu flavours' packages (out/ubuntu2404/), which a rebuild once put there."""
    index = (OUT / "Packages").read_text()
    files = [line.split(": ", 1)[1] for line in index.splitlines() if line.startswith("Filename: ")]
    assert files and not [f for f in files if "ubuntu" in f], [f for f in files if "ubuntu" in f][:3]
    assert "./dcgm/datacenter-gpu-manager-4-core_4.5.3-1_amd64.deb" in files


def test_dcgm_exporter_exports_every_dcgm_reading_the_alerts_read() -> None:
    """Where DCGM exporter runs, the fault alerts read its own names (DCGM_EXP_XID_ERRORS_COUNT, the row
    remapper, ECC): each must be in the counters file the role gives the exporter (-f), or the alert
    reads nothing there. NVLink and NVSwitch counters are there too (what only DCGM gives on HGX)."""
    import re

    rules = (REPO / "roles" / "prometheus" / "templates" / "rules" / "labctl-alerts.rules.yml.j2").read_text()
    counters = (REPO / "roles" / "node_exporter" / "templates" / "dcgm-counters.csv.j2").read_text()
    listed = {line.split(",")[0].strip() for line in counters.splitlines() if line.startswith("DCGM_")}
    read = set(re.findall(r"\b(DCGM_(?:FI|EXP)_[A-Z0-9_]+)", rules))
    assert {"DCGM_EXP_XID_ERRORS_COUNT", "DCGM_FI_DEV_ROW_REMAP_PENDING", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"} <= read
    assert read - listed == set()
    assert {"DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVSWITCH_FATAL_ERRORS"} <= listed
