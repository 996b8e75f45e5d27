"""GPU layer after site.yml (up to the host layer: converge.yml) moved a 575 host to branch 580
(stub packages, recorded H200 output)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
DRIVER = "580.95.05-1"


def test_driver_580_replaced_575(host):
    pkg = host.package("nvidia-open")
    assert pkg.is_installed and pkg.version == DRIVER
    assert not host.run("dpkg -l | grep -E '^ii .*575\\.57\\.08'").stdout


def test_driver_packages_are_held_and_pinned(host):
    held = host.check_output("apt-mark showhold").split()
    for name in ("nvidia-open", "nvidia-smi", "nvidia-persistenced"):
        assert name in held, name
    pin = host.file("/etc/apt/preferences.d/labctl-nvidia-driver").content_string
    assert "Pin: version 580.95.05*" in pin and "Pin-Priority: 1000" in pin


def test_apt_upgrade_does_not_move_the_driver(host):
    # The bundle carries 580.105.08 (same branch) and 590 (next branch): neither may come in.
    assert "580.105.08-1" in host.check_output("apt-cache madison nvidia-open")
    sim = host.check_output("apt-get -s upgrade")
    assert "nvidia" not in sim.lower() or "kept back" in sim.lower()
    assert "Inst nvidia" not in sim and "Inst libnvidia" not in sim
    host.run_test("apt-get -y upgrade")
    assert host.package("nvidia-open").version == DRIVER
    assert host.check_output("apt-cache policy nvidia-open | sed -n 's/ *Candidate: //p'") == DRIVER


def test_persistence_daemon_runs_in_persistence_mode(host):
    svc = host.service("nvidia-persistenced")
    assert svc.is_enabled and svc.is_running
    assert "--persistence-mode" in host.check_output("systemctl show -p ExecStart --value nvidia-persistenced")


def test_gpu_facts_report_two_h200_on_580(host):
    out = host.check_output("nvidia-smi --query-gpu=name,driver_version --format=csv,noheader")
    assert out.splitlines() == ["NVIDIA H200, 580.95.05", "NVIDIA H200, 580.95.05"]


def test_no_fabric_manager_without_nvswitch(host):
    assert not host.package("nvidia-fabricmanager").is_installed
    assert not host.package("nvidia-fabricmanager-575").is_installed


def test_nouveau_is_blacklisted(host):
    assert "blacklist nouveau" in host.file("/etc/modprobe.d/blacklist-nouveau.conf").content_string


def test_cuda_toolkit_12_9(host):
    assert "release 12.9, V12.9.86" in host.check_output("/usr/local/cuda-12.9/bin/nvcc --version")
    assert "release 12.9" in host.check_output("bash -lc 'nvcc --version'")
    assert "/usr/local/cuda-12.9/lib64" in host.file("/etc/ld.so.conf.d/cuda-12-9.conf").content_string


def _site(*extra: str) -> subprocess.CompletedProcess[str]:
    # site.yml's layers up to the host layer (the stack scenario runs the whole site.yml)
    converge = Path(__file__).resolve().parents[1] / "converge.yml"
    cmd = ["ansible-playbook", "-i", os.environ["MOLECULE_INVENTORY_FILE"], str(converge), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False, cwd=REPO)


def _state(host) -> str:
    return host.check_output("dpkg -l | sha256sum; ls -la --time-style=full-iso /etc/apt/preferences.d /etc/systemd/system | sha256sum")


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["-e", "lab_vllm_replicas=3"],
         ["lab_vllm_replicas=3 x lab_vllm_tensor_parallel_size=1 needs 3 GPUs, but the host has 2 (gpu_facts)"]),
        (["-e", "lab_vllm_replicas=3", "-e", "lab_litellm_port=8001", "-e", "nvidia_driver_kernel_modules=closed",
          "-e", "nvidia_driver_brnach=575"],
         ["needs 3 GPUs",
          "port clash: vLLM replica 1 (lab_vllm_base_port+1) and lab_litellm_port all use port 8001",
          "nvidia_driver_kernel_modules",
          "unknown variable nvidia_driver_brnach (did you mean nvidia_driver_branch?)"]),
        (["-e", "lab_nvidia_driver_branch=570"], ["lab_nvidia_driver_branch=570 is too old"]),
    ],
    ids=["replicas-above-gpus", "all-problems-at-once", "driver-too-old"],
)
def test_preflight_refuses_a_bad_plan_before_anything_changes(host, extra, expected):
    before = _state(host)
    result = _site(*extra)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "Preflight found" in output, output[-3000:]
    for text in expected:
        assert text in output, text
    # The run stopped in the first play: no other layer ran.
    assert "airgap :" not in result.stdout
    assert _state(host) == before


def test_second_run_changes_nothing_and_restarts_nothing(host):
    pid = host.check_output("systemctl show -p MainPID --value nvidia-persistenced")
    result = _site()
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    recap = [line for line in result.stdout.splitlines() if "changed=" in line]
    assert recap and all("changed=0" in line for line in recap), recap
    assert host.check_output("systemctl show -p MainPID --value nvidia-persistenced") == pid


def test_driver_change_waits_for_a_reboot_then_verifies(host):
    """On a real host (kernel modules managed, reboots not allowed) a driver change is reported,
    not verified, until the host rebooted; after the reboot the run verifies the new driver.
    A container restart is the reboot here: /run is a tmpfs, as on a real host."""
    real_host = ["-e", "nvidia_driver_kernel_module_managed=true", "-e", "nvidia_driver_install_kernel_headers=false",
                 "-e", "nvidia_driver_version=580.105.08-1"]
    first = _site(*real_host)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-2000:]
    assert "REBOOT REQUIRED" in first.stdout
    assert host.package("nvidia-open").version == "580.105.08-1"
    assert host.file("/run/labctl/nvidia-driver-reboot-required").exists
    # Until the reboot, every run says so again instead of failing the verification.
    again = _site(*real_host)
    assert again.returncode == 0 and "REBOOT REQUIRED" in again.stdout
    assert "Read the GPUs through the installed driver" not in again.stdout
    name = host.check_output("hostname")
    subprocess.run(["docker", "restart", name], check=True, capture_output=True, timeout=120)
    subprocess.run(["docker", "exec", name, "systemctl", "is-system-running", "--wait"],
                   capture_output=True, timeout=120, check=False)
    after = _site(*real_host)
    assert after.returncode == 0, after.stdout[-3000:] + after.stderr[-2000:]
    assert "REBOOT REQUIRED" not in after.stdout
    assert "driver 580.105.08 on every GPU" in after.stdout
