"""Kernels keep the GPUs (runs after test_gpu.py; the tests run in this order and build on each other).

The container stands in for a Debian 12 GPU host whose kernel the test double of a boot decides
(tests/fixtures/kernel-repo): prepare installed a host running 6.1.0-50-amd64, whose headers are in
no repository, and the GPU layer had to install the bundle's kernel (6.1.0-56-amd64) with its
headers first. Then `labctl patch` (playbooks/patch.yml) brings 6.1.0-57-amd64 from later bundles:
once built without its headers (the reboot is refused, the host keeps serving), once with them
(DKMS builds the driver before the reboot, the GPUs are there after it)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[3]
KERNELS = REPO / "tests" / "fixtures" / "kernel-repo" / "out"
RUNNING = "6.1.0-56-amd64"
NEXT = "6.1.0-57-amd64"
# test_gpu.py left the driver at 580.105.08: keep it, so these runs change only the kernel.
REV = "1" if (os.environ.get("LABCTL_NVIDIA_FLAVOUR") or "debian12") == "debian12" else "0ubuntu1"
DRIVER = f"580.105.08-{REV}"
KEEP_DRIVER = ["-e", f"nvidia_driver_version={DRIVER}"]


def _playbook(playbook: Path, *extra: str, timeout: int = 1200) -> subprocess.CompletedProcess[str]:
    cmd = ["ansible-playbook", "-i", os.environ["MOLECULE_INVENTORY_FILE"], str(playbook), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, cwd=REPO)


def _site(*extra: str) -> subprocess.CompletedProcess[str]:
    return _playbook(Path(__file__).resolve().parents[1] / "converge.yml", *KEEP_DRIVER, *extra)


def _boot(host) -> str:
    return host.check_output("cut -d' ' -f22 /proc/1/stat")


def _bundle(tmp_path: Path, name: str, debs: Path) -> Path:
    """A later bundle that carries only what the kernel update needs (signed with the test key). Its
    profile keeps the test bundle's name, as a lab's later bundles keep the lab profile's: apt
    refuses a repository whose Label or Suite changed."""
    profile = {
        "name": "test", "description": f"test: {name}",
        "target": {"os": "debian", "release": "12", "codename": "bookworm", "arch": "amd64", "python": "3.11"},
        "apt": {"local_debs": [str(debs)]},
    }
    path = tmp_path / f"{name}.yml"
    path.write_text(yaml.safe_dump(profile))
    out = REPO / "build" / "bundles" / name
    build = subprocess.run(["labctl", "bundle", "build", "--profile", str(path), "--out", str(out)],
                           capture_output=True, text=True, timeout=600, check=False, cwd=REPO)
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-2000:]
    return out


def _patch(bundle: Path) -> subprocess.CompletedProcess[str]:
    # As `labctl patch -i INV -e lab_bundle_src=DIR` runs it: the bundle copied from the control node.
    return _playbook(REPO / "playbooks" / "patch.yml", "-e", "lab_bundle_source=control",
                     "-e", "lab_bundle_dir=/srv/labctl/bundle", "-e", f"lab_bundle_src={bundle}")


def _gpus(host) -> Any:  # testinfra's CommandResult
    return host.run("nvidia-smi --query-gpu=name,driver_version --format=csv,noheader")


def test_a_host_whose_kernel_had_no_headers_now_runs_the_bundles_kernel_with_the_driver(host):
    assert host.file("/run/labctl-test/osrelease").content_string.strip() == RUNNING
    assert host.package("linux-image-amd64").version == "6.1.192-2"
    # The headers of the host's kernel flavour (the metapackage) and of the running kernel.
    assert host.package("linux-headers-amd64").is_installed
    assert host.package(f"linux-headers-{RUNNING}").is_installed
    # The old kernel stays, without the driver: its headers are nowhere.
    assert host.package("linux-image-6.1.0-50-amd64").is_installed
    status = host.check_output("dkms status nvidia")
    assert f", {RUNNING}, x86_64: installed" in status and "6.1.0-50-amd64" not in status
    info = host.check_output(f"modinfo -k {RUNNING} nvidia")
    assert "updates/dkms/nvidia.ko" in info and "signer:         DKMS module signing key" in info
    assert "NVIDIA driver" in host.file("/run/labctl-test/boot.log").content_string
    assert _gpus(host).rc == 0


def test_every_kernels_initramfs_blacklists_nouveau(host):
    """update-initramfs -u -k all: the kernel a host falls back to keeps nouveau away too."""
    for release in ("6.1.0-50-amd64", RUNNING):
        host.run_test(f"rm -rf /tmp/initrd && mkdir /tmp/initrd && unmkinitramfs /boot/initrd.img-{release} /tmp/initrd")
        found = host.run("grep -rh '^blacklist nouveau' /tmp/initrd --include=*.conf")
        assert found.rc == 0 and "blacklist nouveau" in found.stdout, release


def test_a_patch_refuses_to_reboot_into_a_kernel_without_the_driver(host, tmp_path):
    """A later bundle whose profile named the kernel image but not its headers: the upgrade brings
    6.1.0-57 without headers, DKMS cannot build the driver for it, and the reboot is refused."""
    bundle = _bundle(tmp_path, "test-kernel-noheaders", KERNELS / "update-noheaders")
    boot = _boot(host)
    run = _patch(bundle)
    output = run.stdout + run.stderr
    assert run.returncode != 0, output[-3000:]
    assert (f"REBOOT REFUSED on labctl-gpu: the kernel the host boots next, {NEXT}, would come up without GPUs: "
            f"it has no nvidia module (modinfo -k {NEXT} nvidia); its headers are missing: install linux-headers-{NEXT}"
            in " ".join(output.split())), output[-3000:]
    assert "labctl-gpu was patched but not rebooted" in output
    # Not rebooted, still on its kernel with its GPUs and the persistence daemon.
    assert _boot(host) == boot
    assert host.file("/run/labctl-test/osrelease").content_string.strip() == RUNNING
    assert host.package(f"linux-image-{NEXT}").is_installed and not host.package(f"linux-headers-{NEXT}").is_installed
    assert _gpus(host).rc == 0
    assert host.service("nvidia-persistenced").is_running


def test_site_stops_before_any_change_while_the_next_kernel_has_no_headers(host):
    """The state the refused patch left: the next boot's kernel has no headers in the bundle."""
    before = host.check_output("dpkg -l | sha256sum")
    run = _site()
    output = " ".join((run.stdout + run.stderr).split())
    assert run.returncode != 0
    assert "Preflight found" in output
    assert (f"the kernel this host boots next, {NEXT}, has no headers (linux-headers-{NEXT} is neither installed nor "
            "in the bundle)") in output, output[-3000:]
    assert "airgap :" not in run.stdout
    assert host.check_output("dpkg -l | sha256sum") == before


def test_a_patch_with_the_kernels_headers_reboots_into_it_with_the_gpus(host, tmp_path):
    """The bundle with the kernel's image and headers metapackages: the headers metapackage the GPU
    layer installed moves to 6.1.0-57, DKMS builds the driver for it before the reboot, and the
    host comes back on the new kernel with its GPUs."""
    bundle = _bundle(tmp_path, "test-kernel-update", KERNELS / "update")
    boot = _boot(host)
    run = _patch(bundle)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    assert "REBOOT REFUSED" not in output
    assert _boot(host) != boot
    assert host.file("/run/labctl-test/osrelease").content_string.strip() == NEXT
    assert f", {NEXT}, x86_64: installed" in host.check_output("dkms status nvidia")
    smi = _gpus(host)
    assert smi.rc == 0, smi.stdout + smi.stderr
    assert smi.stdout.splitlines() == ["NVIDIA H200, 580.105.08", "NVIDIA H200, 580.105.08"]
    assert host.service("nvidia-persistenced").is_running
    assert "NVIDIA driver 580.105.08 loaded" in host.file("/run/labctl-test/boot.log").content_string
