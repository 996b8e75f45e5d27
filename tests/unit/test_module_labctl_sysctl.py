"""The labctl_sysctl module, run by ansible itself against a stand-in /proc/sys tree."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _run(proc: Path, values: dict[str, object], check: bool = False) -> dict[str, object]:
    args = json.dumps({"values": values, "proc_root": str(proc)})
    cmd = [str(BIN / "ansible"), "localhost", "-c", "local", "-m", "labctl_sysctl", "-a", args, "-o"]
    if check:
        cmd.append("--check")
    env = dict(os.environ, ANSIBLE_LIBRARY=str(REPO / "roles" / "host_tuning" / "library"), ANSIBLE_LOCALHOST_WARNING="False",
               ANSIBLE_INVENTORY_UNPARSED_WARNING="False", ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False).stdout
    assert "=>" in out, out
    return json.loads(out.split("=>", 1)[1])  # type: ignore[no-any-return]


def _tree(tmp_path: Path) -> Path:
    proc = tmp_path / "sys"
    (proc / "vm").mkdir(parents=True)
    (proc / "net" / "ipv4").mkdir(parents=True)
    (proc / "vm" / "swappiness").write_text("60\n")
    (proc / "vm" / "max_map_count").write_text("1048576\n")
    (proc / "net" / "ipv4" / "tcp_rmem").write_text("4096\t131072\t6291456\n")
    return proc


def test_applies_changed_values_and_reports_the_rest(tmp_path: Path) -> None:
    proc = _tree(tmp_path)
    wanted = {"vm.swappiness": 1, "vm.max_map_count": 1048576,
              "net.ipv4.tcp_rmem": "4096 87380 134217728", "kernel.numa_balancing": 0}
    result = _run(proc, wanted)
    assert result["changed"] is True
    assert result["applied"] == ["net.ipv4.tcp_rmem", "vm.swappiness"]
    assert result["in_effect"] == ["vm.max_map_count"]
    assert result["absent"] == ["kernel.numa_balancing"]
    assert (proc / "vm" / "swappiness").read_text().strip() == "1"
    # Second run: nothing to do (tabs in the kernel's format match spaces in ours).
    (proc / "net" / "ipv4" / "tcp_rmem").write_text("4096\t87380\t134217728\n")
    again = _run(proc, wanted)
    assert again["changed"] is False and again["applied"] == []


def test_check_mode_changes_nothing(tmp_path: Path) -> None:
    proc = _tree(tmp_path)
    result = _run(proc, {"vm.swappiness": 1}, check=True)
    assert result["changed"] is True and result["applied"] == ["vm.swappiness"]
    assert (proc / "vm" / "swappiness").read_text().strip() == "60"
