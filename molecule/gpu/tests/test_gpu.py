"""GPU layer after site.yml (up to the host layer: converge.yml) moved a 575 host to branch 580
(stub packages, recorded H200 output)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
# The NVIDIA repository the bundle's stub packages mirror (make test-gpu-flavours sets it).
FLAVOUR = os.environ.get("LABCTL_NVIDIA_FLAVOUR") or "debian12"
DEBIAN = FLAVOUR == "debian12"
REV = "1" if DEBIAN else "0ubuntu1"
DRIVER = f"580.95.05-{REV}"
NEWER = f"580.105.08-{REV}"
# The compute-only set the role installs (roles/nvidia_driver/vars/main.yml), per packaging.
ANCHOR = "nvidia-driver-cuda" if DEBIAN else "libnvidia-compute-580"
SMI = "nvidia-smi" if DEBIAN else "nvidia-utils-580"
PERSISTENCED = "nvidia-persistenced" if DEBIAN else "nvidia-compute-utils-580"
DESKTOP = (["nvidia-open", "nvidia-driver", "cuda-drivers"] if DEBIAN
           else ["nvidia-open-580", "nvidia-driver-580-open", "libnvidia-gl-580", "cuda-drivers-580", "nvidia-open"])


def test_driver_580_replaced_575_compute_only(host):
    pkg = host.package(ANCHOR)
    assert pkg.is_installed and pkg.version == DRIVER
    # Nothing of the 575 release is left (on Ubuntu the names change with the branch).
    assert not host.run("dpkg -l | grep -E '^ii .*575\\.57\\.08'").stdout
    # Compute only: no desktop meta, no GL stack.
    assert [name for name in DESKTOP if host.package(name).is_installed] == []


def test_driver_packages_are_held_and_pinned(host):
    held = host.check_output("apt-mark showhold").split()
    for name in (ANCHOR, SMI, PERSISTENCED):
        assert name in held, name
    pin = host.file("/etc/apt/preferences.d/labctl-nvidia-driver").content_string
    assert "Package: src:*nvidia*:any" in pin and "Pin: version 580.95.05-*" in pin and "Pin-Priority: 1000" in pin
    assert "Pin-Priority: -1" not in pin  # the driver's dependencies from other sources stay installable


def test_apt_upgrade_does_not_move_the_driver(host):
    # The bundle carries 580.105.08 (same branch) and 590 (next branch): neither may come in.
    assert NEWER in host.check_output(f"apt-cache madison {ANCHOR}")
    sim = host.check_output("apt-get -s upgrade")
    assert "Inst nvidia" not in sim and "Inst libnvidia" not in sim
    host.run_test("apt-get -y upgrade")
    assert host.package(ANCHOR).version == DRIVER
    assert host.check_output(f"apt-cache policy {ANCHOR} | sed -n 's/ *Candidate: //p'") == DRIVER


def test_persistence_daemon_runs_in_persistence_mode(host):
    svc = host.service("nvidia-persistenced")
    assert svc.is_running
    # Started at boot: enabled, or (Ubuntu's static unit) wanted by multi-user.target.
    assert svc.is_enabled or host.file("/etc/systemd/system/multi-user.target.wants/nvidia-persistenced.service").is_symlink
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


# Bad plans in two site.yml runs: preflight reports every problem it finds at once, and any one
# stops the run, so each case checks its own message in a shared run (a run per case cost seven).
BAD_RUNS = {
    "plan": ["-e", "lab_vllm_replicas=3", "-e", "lab_litellm_port=8001", "-e", "nvidia_driver_kernel_modules=closed",
             "-e", "nvidia_driver_brnach=575"],
    "host": ["-e", "lab_nvidia_driver_branch=570",
             "-e", "lab_model_name=gpt-oss-120b", "-e", "vllm_gpu_memory_utilization=0.46",
             # Secure Boot on (an efivarfs SecureBoot variable = 1), the Debian DKMS key not enrolled
             "-e", "preflight_efivars_dir=/tmp/efivars-secure-boot",
             # Database mode where the distribution's Node.js is too old for Prisma's CLI (Ubuntu 22.04;
             # the container is Debian 12, so the table names it here).
             "-e", "lab_litellm_database_mode=true",
             "-e", '{"preflight_database_mode_unsupported": {"Debian 12": "Debian 12 stands in for Ubuntu 22.04 here"}}',
             # A bundle built for another Python than the services' interpreter (the test bundle is cp311).
             "-e", "lab_python=python3.12",
             # Every layer, serving included, as site.yml runs them: the replicas' CUDA line is checked, and the
             # test bundle's vLLM set is the CPU build (roles/preflight/filter_plugins/preflight_cuda.py).
             "-e", '{"preflight_layers": ["airgap", "gpu", "artifacts", "host", "serving", "gateway", "monitoring"]}'],
}
BAD_CASES = {
    "replicas-above-gpus": ("plan", [
        "lab_vllm_replicas=3 x lab_vllm_tensor_parallel_size=1 needs 3 GPUs, but the host has 2 (labctl_gpu_facts)"]),
    "duplicate-ports": ("plan", ["port clash: vLLM replica 1 (lab_vllm_base_port+1) and lab_litellm_port all use port 8001"]),
    "closed-modules": ("plan", ["nvidia_driver_kernel_modules"]),
    "mistyped-variable": ("plan", ["unknown variable nvidia_driver_brnach (did you mean nvidia_driver_branch?)"]),
    "driver-too-old": ("host", ["lab_nvidia_driver_branch=570 is too old"]),
    # labctl plan's numbers for 2 x H200 at 0.46 (tests/unit/test_plan.py checks the same line)
    "kv-cache-below-one-sequence": ("host", [
        ("memory plan (labctl plan): replicas 0, 1: KV cache holds 46,155 tokens, less than one vllm_max_model_len "
         "(128,000) sequence: vLLM refuses to start; lower vllm_max_model_len to 46,155")]),
    # The key Debian's dkms signs with (made at its first build), and Debian's way to enrol it.
    "secure-boot-without-key": ("host", [
        ("Secure Boot is on and /var/lib/dkms/mok.pub is not enrolled (mokutil is not installed): the kernel will refuse "
         "the DKMS-built NVIDIA modules"), "mokutil --import /var/lib/dkms/mok.pub"]),
    "database-mode-without-node": ("host", [
        ("lab_litellm_database_mode=true is not supported on Debian 12: Debian 12 stands in for Ubuntu 22.04 here; "
         "set lab_litellm_database_mode: false")]),
    "bundle-for-another-python": ("host", [
        "holds wheels for Python 3.11 (debian-12), but lab_python=python3.12 is Python 3.12 here"]),
    "cuda-replicas-from-a-cpu-build": ("host", [
        "the bundle's vllm set (torch 2.13.0+cpu) is built for no CUDA, but vllm_flavor is cuda here"]),
}
_BAD_DONE: dict[str, tuple[subprocess.CompletedProcess[str], str, str]] = {}


def _bad_run(host, key: str) -> tuple[subprocess.CompletedProcess[str], str, str]:
    """One site.yml run per entry of BAD_RUNS (cached), with the host's state before and after."""
    if key not in _BAD_DONE:
        efivars = "/tmp/efivars-secure-boot"
        host.run_test(f"mkdir -p {efivars} && printf '\\006\\000\\000\\000\\001' "
                      f"> {efivars}/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c")
        before = _state(host)
        result = _site(*BAD_RUNS[key])
        _BAD_DONE[key] = (result, before, _state(host))
    return _BAD_DONE[key]


@pytest.mark.parametrize("case", list(BAD_CASES))
def test_preflight_refuses_a_bad_plan_before_anything_changes(host, case):
    key, expected = BAD_CASES[case]
    result, before, after = _bad_run(host, key)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "Preflight found" in output, output[-3000:]
    for text in expected:
        assert text in output, f"{text!r} not in:\n{output[-3000:]}"
    # The run stopped in the first play: no other layer ran.
    assert "airgap :" not in result.stdout
    assert after == before


def test_preflight_refuses_canonicals_server_driver_already_installed(host):
    """Canonical's server driver stack (nvidia-graphics-drivers-580-server; names and version as
    Ubuntu noble's archive has them) on a host: it conflicts with NVIDIA's packages, so the run
    stops in preflight, naming the packages and how to remove them."""
    name, version = "libnvidia-compute-580-server", "580.126.20-0ubuntu0.24.04.1"
    host.run_test(
        f"rm -rf /tmp/server-pkg && mkdir -p /tmp/server-pkg/DEBIAN && printf 'Package: {name}\\nVersion: {version}\\n"
        "Architecture: amd64\\nMaintainer: Ubuntu Developers <ubuntu-devel-discuss@lists.ubuntu.com>\\nSource: "
        "nvidia-graphics-drivers-580-server\\nDescription: NVIDIA libcompute package (test double: no driver)\\n' "
        f"> /tmp/server-pkg/DEBIAN/control && dpkg-deb -b /tmp/server-pkg /tmp/server.deb >/dev/null && dpkg -i /tmp/server.deb")
    try:
        before = _state(host)
        result = _site()
        output = " ".join((result.stdout + result.stderr).split())
        assert result.returncode != 0
        assert (f"Canonical's server driver packages are installed ({name}): they conflict with NVIDIA's packages "
                "the lab installs from the bundle") in output, output[-3000:]
        assert f"apt-get purge {name}" in output
        assert "airgap :" not in result.stdout
        assert _state(host) == before
    finally:
        host.run_test(f"dpkg --purge {name}")


def test_second_run_changes_nothing_and_restarts_nothing(host):
    pid = host.check_output("systemctl show -p MainPID --value nvidia-persistenced")
    result = _site()
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    recap = [line for line in result.stdout.splitlines() if "changed=" in line]
    assert recap and all("changed=0" in line for line in recap), recap
    assert host.check_output("systemctl show -p MainPID --value nvidia-persistenced") == pid


def test_a_newer_release_in_the_bundle_is_not_installed_unasked(host):
    """The bundle carries 580.105.08 as well. With nvidia_driver_version empty (a site that did not
    pin one), a run keeps the installed release and says what it keeps out."""
    result = _site("-e", "nvidia_driver_version=")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert host.package(ANCHOR).version == DRIVER
    assert f"keeps NVIDIA driver {DRIVER}; the repository also carries {NEWER}" in result.stdout
    recap = [line for line in result.stdout.splitlines() if "changed=" in line]
    assert recap and all("changed=0" in line for line in recap), recap


def _ran(stdout: str, task: str) -> bool:
    """Whether a task of that name did anything in a run's output (listed and skipped is not running)."""
    for block in stdout.split("\nTASK [")[1:]:
        header, _, body = block.partition("\n")
        if task in header and any(line.startswith(("ok:", "changed:", "fatal:")) for line in body.splitlines()):
            return True
    return False


def _boot(host) -> str:
    """PID 1's start time: a container's boot (the kernel's boot id is the machine's)."""
    return host.check_output("cut -d' ' -f22 /proc/1/stat")


def test_driver_change_waits_for_a_reboot_then_the_run_reboots_and_verifies(host):
    """On a real host (kernel modules managed) a driver change is reported, not verified, until the
    host rebooted. With reboots allowed, the GPU layer's reboot play reboots the host (a container
    restart of its own: systemctl reboot under the restart policy; /run is a tmpfs, as on a real
    host), waits for it, and verifies the new driver in the same run."""
    real_host = ["-e", f"nvidia_driver_version={NEWER}"]
    no_reboot = [*real_host, "-e", "nvidia_driver_reboot_allowed=false"]
    # The persistence daemon down (as on a host where it had not started yet): the new driver is not
    # loaded before the reboot, and the daemon cannot start on it (the stand-in refuses, as NVML does).
    host.run_test("systemctl stop nvidia-persistenced")
    first = _site(*no_reboot)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-2000:]
    assert "REBOOT REQUIRED" in first.stdout
    assert host.package(ANCHOR).version == NEWER
    assert host.file("/run/labctl/nvidia-driver-reboot-required").exists
    assert not host.service("nvidia-persistenced").is_running
    assert host.run("nvidia-smi -L").rc == 18  # Driver/library version mismatch until the reboot
    # DKMS built the new release for the running kernel; it loads at the next boot.
    assert host.check_output("modinfo -k \"$(cat /run/labctl-test/osrelease)\" -F version nvidia") == NEWER.split("-")[0]
    # Until the reboot, every run says so again instead of failing the verification.
    boot = _boot(host)
    again = _site(*no_reboot)
    assert again.returncode == 0 and "REBOOT REQUIRED" in again.stdout
    assert not _ran(again.stdout, "Read the GPUs through the installed driver")
    assert "nvidia_driver : Reboot into the new driver" not in again.stdout
    assert not host.service("nvidia-persistenced").is_running
    assert _boot(host) == boot
    rebooted = _site(*real_host, "-e", "nvidia_driver_reboot_allowed=true")
    assert rebooted.returncode == 0, rebooted.stdout[-3000:] + rebooted.stderr[-2000:]
    assert "REBOOT REQUIRED" not in rebooted.stdout
    assert "reboots into NVIDIA driver" in rebooted.stdout
    assert "TASK [nvidia_driver : Reboot into the new driver]" in rebooted.stdout
    assert "driver 580.105.08 on every GPU" in rebooted.stdout
    assert _boot(host) != boot
    assert not host.file("/run/labctl/nvidia-driver-reboot-required").exists
    assert host.service("nvidia-persistenced").is_running
    # Loaded: the next run has nothing to reboot for and changes nothing.
    after = _site(*real_host, "-e", "nvidia_driver_reboot_allowed=true")
    assert after.returncode == 0, after.stdout[-3000:] + after.stderr[-2000:]
    assert "Reboot into the new driver" not in after.stdout
    assert "driver 580.105.08 on every GPU" in after.stdout
    recap = [line for line in after.stdout.splitlines() if "changed=" in line]
    assert recap and all("changed=0" in line for line in recap), recap


def test_an_hgx_host_gets_fabric_manager_in_the_same_run(host):
    """Last (it leaves fabric manager installed). A board whose NVSwitches (NVIDIA, PCI class
    0x0680; the H100/H200 baseboard's device 22a3) are on the bus: preflight sees them in sysfs,
    before and whatever the driver, and the same run installs fabric manager and NSCQ of the
    driver's release (on Ubuntu another revision than the driver's) and starts it."""
    root = "/tmp/sys-hgx/bus/pci/devices"
    nodes = [(f"0000:0{n}:00.0", "0x068000", "0x22a3") for n in range(5, 9)]
    nodes += [(f"0000:{bus}:00.0", "0x030200", "0x2335") for bus in ("18", "9a")]
    for address, pci_class, device in nodes:
        host.run_test(f"mkdir -p {root}/{address} && echo 0x10de > {root}/{address}/vendor && "
                      f"echo {pci_class} > {root}/{address}/class && echo {device} > {root}/{address}/device")
    result = _site("-e", "lab_sysfs_root=/tmp/sys-hgx", "-e", f"nvidia_driver_version={NEWER}")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert host.package("nvidia-fabricmanager").version == "580.105.08-1"
    assert host.package("libnvidia-nscq").version == "580.105.08-1"
    assert host.service("nvidia-fabricmanager").is_running
    held = host.check_output("apt-mark showhold").split()
    assert "nvidia-fabricmanager" in held and "libnvidia-nscq" in held
