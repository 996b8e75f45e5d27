"""A driver change reboots the GPU hosts one at a time, each drained from the gateways first
(playbooks/gpu.yml's reboot play). Before, the nvidia_driver role's handler rebooted every host of
the GPU play at once, with its replicas still in the gateways' rotation. The container runs are
molecule `gpu` (one host, reboot + verify in one run) and `scaleout` (two hosts under traffic)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]


def _load(*parts: str) -> Any:
    return yaml.safe_load((REPO.joinpath(*parts)).read_text())


def _modules(tasks: list[dict[str, Any]]) -> list[str]:
    found: list[str] = []
    for task in tasks:
        for key in ("block", "rescue", "always"):
            found += _modules(task.get(key, []))
        found += [key for key in task if "." in key or key.startswith("labctl_")]
    return found


def test_no_reboot_happens_outside_the_serial_play() -> None:
    roles = REPO / "roles"
    for path in sorted(roles.glob("*/handlers/*.yml")) + sorted(roles.glob("*/tasks/*.yml")):
        tasks = yaml.safe_load(path.read_text()) or []
        if "ansible.builtin.reboot" in _modules(tasks):
            # the driver's reboot play, and playbooks/patch.yml's (also one host at a time, drained)
            assert path.relative_to(REPO).as_posix() in (
                "roles/nvidia_driver/tasks/reboot_host.yml", "roles/patch/tasks/main.yml"), path


def test_the_reboot_play_takes_one_host_at_a_time_drained_first() -> None:
    plays = [p for p in _load("playbooks", "gpu.yml") if "hosts" in p]  # after the topology import
    assert [play["hosts"] for play in plays] == ["gpu_hosts", "gpu_hosts"]
    reboot = plays[1]
    assert reboot["serial"] == 1 and reboot["max_fail_percentage"] == 0
    [block] = reboot["tasks"]
    assert block["when"] == "nvidia_driver_reboot_due | default(false) | bool"
    steps = [(task["ansible.builtin.include_role"]["name"], task["ansible.builtin.include_role"]["tasks_from"])
             for task in block["block"]]
    # The kernel the host boots next is checked for the driver's modules before the host is drained
    # (a refused host keeps serving), and again right before the reboot (reboot_host.yml).
    assert steps == [("nvidia_driver", "boot_check"), ("vllm", "drain_host"), ("nvidia_driver", "reboot_host"),
                     ("vllm", "undrain_host")]


def test_the_role_says_when_a_reboot_is_due() -> None:
    tasks = _load("roles", "nvidia_driver", "tasks", "reboot.yml")
    facts = next(t["ansible.builtin.set_fact"] for t in tasks if "ansible.builtin.set_fact" in t)
    assert "nvidia_driver_reboot_allowed" in facts["nvidia_driver_reboot_due"]
    after = _load("roles", "nvidia_driver", "tasks", "reboot_host.yml")
    names = [t["name"] for t in after]
    assert names.index("Check once more the modules of the kernel the host boots next") < names.index("Reboot into the new driver")
    assert names.index("Reboot into the new driver") < names.index("Verify the driver on every GPU")
    assert names.index("Refuse a host that came back without a reboot") < names.index("Verify the driver on every GPU")


def test_a_drained_host_stops_only_after_its_replicas_finished_and_returns_only_serving() -> None:
    drain = [t["name"] for t in _load("roles", "vllm", "tasks", "drain_host.yml")]
    assert drain.index("Take this host's replicas out of the gateways' rotation") \
        < drain.index("Let the replicas finish their requests | {{ inventory_hostname }}") \
        < drain.index("Stop the drained replicas | {{ inventory_hostname }}")
    undrain = [t["name"] for t in _load("roles", "vllm", "tasks", "undrain_host.yml")]
    assert undrain.index("Wait until the replicas serve again | {{ inventory_hostname }}") \
        < undrain.index("Put this host's replicas back in the gateways' rotation")


def test_the_markers_outlive_the_reboot() -> None:
    """A marker's expiry covers the drain, the host's absence (the reboot timeout) and the health
    gate, so the gateways do not route to a host that is still booting."""
    plays = [p for p in _load("playbooks", "gpu.yml") if "hosts" in p]  # after the topology import
    drain = next(t for t in plays[1]["tasks"][0]["block"]
                 if t["ansible.builtin.include_role"]["tasks_from"] == "drain_host")
    assert "nvidia_driver_reboot_timeout" in drain["vars"]["vllm_drain_hold"]
    rotation = _load("roles", "vllm", "tasks", "rotation_out.yml")
    marker = next(t for t in rotation if t["name"].startswith("Take the replica out"))
    content = marker["ansible.builtin.copy"]["content"]
    for part in ("vllm_drain_timeout", "vllm_health_timeout", "__vllm_rotation_hold", "vllm_drain_grace"):
        assert part in content
