"""`labctl patch` (playbooks/patch.yml, roles/patch) and the bundle's security-update selection:
the pieces that decide, without containers. The run against containers is molecule scaleout's
test_security_updates_patch_one_host_at_a_time_each_drained_first; the selection against Debian's
real archives is tests/bundle/test_security_updates.py."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from labctl.bundle.updates import parse_madison

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "roles" / "patch" / "filter_plugins"))
sys.path.insert(0, str(REPO / "roles" / "patch" / "library"))

import labctl_stale_services as stale  # noqa: E402
from patch_filters import labctl_kernel_reboot_needed, labctl_package_changes  # noqa: E402


def _load(*parts: str) -> Any:
    return yaml.safe_load(REPO.joinpath(*parts).read_text())


# Rows as apt-cache madison prints them (bookworm, captured here against deb.debian.org).
MADISON = """\
    libssl3 | 3.0.22-1~deb12u2 | http://deb.debian.org/debian-security bookworm-security/main amd64 Packages
    libssl3 | 3.0.20-1~deb12u2 | http://deb.debian.org/debian bookworm/main amd64 Packages
 nvidia-smi | 580.95.05-1 | https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64 ./ Packages
"""


def test_madison_rows_say_which_suite_offers_a_version() -> None:
    offers = parse_madison(MADISON)
    assert [(o.name, o.version, o.suite, o.security) for o in offers] == [
        ("libssl3", "3.0.22-1~deb12u2", "bookworm-security", True),
        ("libssl3", "3.0.20-1~deb12u2", "bookworm", False),
        ("nvidia-smi", "580.95.05-1", ".", False),
    ]


def test_changes_between_two_package_facts() -> None:
    before = {"libssl3": [{"version": "3.0.20-1~deb12u2"}], "tzdata": [{"version": "2026b"}], "gone": [{"version": "1"}]}
    after = {"libssl3": [{"version": "3.0.22-1~deb12u2"}], "tzdata": [{"version": "2026b"}], "new": [{"version": "2"}]}
    assert labctl_package_changes(before, after) == [
        {"name": "gone", "from": "1", "to": None, "line": "gone 1 -> (removed)"},
        {"name": "libssl3", "from": "3.0.20-1~deb12u2", "to": "3.0.22-1~deb12u2",
         "line": "libssl3 3.0.20-1~deb12u2 -> 3.0.22-1~deb12u2"},
        {"name": "new", "from": None, "to": "2", "line": "new (new) -> 2"},
    ]
    assert labctl_package_changes(after, after) == []


@pytest.mark.parametrize(
    ("running", "installed", "needed"),
    [
        ("6.1.0-28-amd64", ["6.1.0-28-amd64", "6.1.0-9-amd64"], False),  # numeric, not text order
        ("6.1.0-9-amd64", ["6.1.0-9-amd64", "6.1.0-28-amd64"], True),
        ("6.8.0-51-generic", ["6.8.0-51-generic", "6.8.0-100-generic"], True),
        ("6.8.0-100-generic", ["6.8.0-51-generic", "6.8.0-100-generic"], False),
        ("6.12.0-1-cloud", [], False),  # a container: no kernel image installed
    ],
)
def test_a_reboot_only_for_a_newer_installed_kernel(running: str, installed: list[str], needed: bool) -> None:
    assert labctl_kernel_reboot_needed(running, installed) is needed


def _fake_pid(proc: Path, pid: str, maps: list[str], cgroup: str, exe: str = "/usr/bin/true") -> None:
    d = proc / pid
    d.mkdir(parents=True)
    (d / "maps").write_text("".join(f"7f0000000000-7f0000001000 r-xp 00000000 08:01 1234 {m}\n" for m in maps))
    (d / "cgroup").write_text(f"0::{cgroup}\n")
    (d / "exe").symlink_to(exe)


def test_stale_services_from_proc(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    _fake_pid(proc, "1", ["/usr/lib/x86_64-linux-gnu/libc.so.6 (deleted)"], "/init.scope", "/usr/lib/systemd/systemd")
    _fake_pid(proc, "10", ["/usr/lib/x86_64-linux-gnu/libssl.so.3 (deleted)", "/usr/lib/libz.so"],
              "/system.slice/postgresql@15-main.service")
    _fake_pid(proc, "11", ["/usr/lib/libz.so"], "/system.slice/redis-server.service")  # current code
    _fake_pid(proc, "12", ["/dev/shm/scratch (deleted)"], "/system.slice/grafana-server.service")  # not a system file
    _fake_pid(proc, "13", [], "/system.slice/system-vllm.slice/vllm@0.service", "/usr/bin/python3.11 (deleted)")
    _fake_pid(proc, "14", ["/usr/lib/libssl.so.3 (deleted)"], "/user.slice/user-0.slice/session-3.scope")  # no service
    _fake_pid(proc, "15", ["/usr/lib/libssl.so.3 (deleted)"],
              "/system.slice/docker-abc.scope/system.slice/litellm.service")  # nested (a container's systemd)
    result = stale.scan(["/usr/"], ["^vllm@"], str(proc))
    assert result["services"] == ["litellm.service", "postgresql@15-main.service"]
    assert result["excluded"] == ["vllm@0.service"]
    assert result["pid1"] is True
    assert result["files"]["postgresql@15-main.service"] == ["/usr/lib/x86_64-linux-gnu/libssl.so.3"]
    assert result["files"]["vllm@0.service"] == ["/usr/bin/python3.11"]


def test_a_real_process_on_a_replaced_binary_is_seen(tmp_path: Path) -> None:
    """The kernel's own marking: a running copy of sleep whose file is then removed."""
    binary = tmp_path / "bin" / "sleep"
    binary.parent.mkdir()
    shutil.copy2(shutil.which("sleep") or "/bin/sleep", binary)
    proc = subprocess.Popen([str(binary), "30"])
    try:
        time.sleep(0.2)
        assert stale.stale_files(str(proc.pid), [str(tmp_path)]) == set()
        binary.unlink()
        assert stale.stale_files(str(proc.pid), [str(tmp_path)]) == {str(binary)}
    finally:
        proc.kill()
        proc.wait()


def test_the_patch_play_goes_one_host_at_a_time_drained_first() -> None:
    topology, play = _load("playbooks", "patch.yml")
    assert topology["ansible.builtin.import_playbook"] == "topology.yml"
    assert play["serial"] == 1 and play["max_fail_percentage"] == 0
    tasks = play["tasks"]
    assert [t["ansible.builtin.include_role"]["name"] for t in tasks[:2]] == ["airgap", "patch"]
    assert tasks[1]["ansible.builtin.include_role"]["tasks_from"] == "pending"
    block = tasks[2]
    assert block["when"] == "patch_pending | length > 0"
    steps = [(t["ansible.builtin.include_role"]["name"], t["ansible.builtin.include_role"].get("tasks_from"))
             for t in block["block"] if "ansible.builtin.include_role" in t]
    assert steps == [("vllm", "drain_host"), ("patch", None), ("vllm", "undrain_host")]
    assert "rescue" not in block and "always" not in block  # a failed host stops the run, drained
    # A GPU host must come back with its NVIDIA modules; a refused reboot stops the run after the
    # host's replicas serve again (the last step), before the next host.
    patch_step = block["block"][1]
    assert "'nvidia' if inventory_hostname in groups['gpu_hosts']" in patch_step["vars"]["patch_boot_module"]
    assert "ansible.builtin.fail" in block["block"][-1]
    assert block["block"][-1]["when"] == "patch_report.reboot_refused | default('') | length > 0"


def test_apt_never_lets_needrestart_restart_services() -> None:
    env = _load("roles", "patch", "vars", "main.yml")["__patch_apt_environment"]
    assert env["NEEDRESTART_SUSPEND"] == "1"
    for name in ("main.yml", "pending.yml"):
        apt = [t for t in _load("roles", "patch", "tasks", name) if "ansible.builtin.apt" in t]
        assert apt and all(t["environment"] == "{{ __patch_apt_environment }}" for t in apt), name
    # and every other apt run of the lab: the airgap role's drop-in (list only, replicas never)
    conf = (REPO / "roles/airgap/templates/etc/needrestart/conf.d/50-labctl.conf.j2").read_text()
    assert "$nrconf{restart} = 'l';" in conf and "$nrconf{override_rc}{qr(^vllm@)} = 0;" in conf
    if shutil.which("perl"):
        assert subprocess.run(["perl", "-c", str(REPO / "roles/airgap/templates/etc/needrestart/conf.d/50-labctl.conf.j2")],
                              capture_output=True, check=False).returncode == 0


def test_services_restart_one_at_a_time_each_active_before_the_next() -> None:
    tasks = _load("roles", "patch", "tasks", "restart_one.yml")
    assert tasks[0]["ansible.builtin.systemd_service"]["state"] == "restarted"
    assert tasks[1]["until"] == "__patch_restarted.status.ActiveState == 'active'"
    main = _load("roles", "patch", "tasks", "main.yml")
    loop = next(t for t in main if t.get("ansible.builtin.include_tasks") == "restart_one.yml")
    assert "__patch_stale.services" in loop["loop"]
    defaults = _load("roles", "patch", "defaults", "main.yml")
    assert "^vllm@" in defaults["patch_restart_exclude"]
