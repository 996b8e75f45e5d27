"""Two GPU-host details checked before or at the first start: the Secure Boot state that preflight
reads (roles/preflight/library/labctl_secure_boot.py, against efivarfs files laid out as the kernel shows them) and
the UVM device script (roles/nvidia_driver/files/labctl-nvidia-uvm) that creates /dev/nvidia-uvm as
root, because the replicas' NoNewPrivileges=yes disables the setuid nvidia-modprobe."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
VAR = "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
UVM = REPO / "roles" / "nvidia_driver" / "files" / "labctl-nvidia-uvm"


def _module(args: dict[str, Any], path: str | None = None) -> dict[str, Any]:
    cmd = [str(BIN / "ansible"), "localhost", "-c", "local", "-m", "labctl_secure_boot", "-a", json.dumps(args), "-o"]
    env = dict(os.environ, ANSIBLE_LIBRARY=str(REPO / "roles" / "preflight" / "library"), ANSIBLE_LOCALHOST_WARNING="False",
               ANSIBLE_INVENTORY_UNPARSED_WARNING="False", ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    if path is not None:
        env["PATH"] = path
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False).stdout
    assert "=>" in out, out
    return json.loads(out.split("=>", 1)[1])  # type: ignore[no-any-return]


def _efivars(tmp_path: Path, value: int | None) -> Path:
    efivars = tmp_path / "efivars"
    efivars.mkdir()
    if value is not None:
        # efivarfs: 4 bytes of attributes (NV+BS+RT = 0x06 here, as the kernel shows it), then the value.
        (efivars / VAR).write_bytes(b"\x06\x00\x00\x00" + bytes([value]))
    return efivars


@pytest.mark.parametrize(("value", "efi", "on"), [(1, True, True), (0, True, False), (None, False, False)],
                         ids=["secure-boot-on", "secure-boot-off", "bios-or-container"])
def test_secure_boot_state(tmp_path: Path, value: int | None, efi: bool, on: bool) -> None:
    result = _module({"efivars_dir": str(_efivars(tmp_path, value))})
    assert (result["efi"], result["secure_boot"]) == (efi, on)
    # With Secure Boot on, the key of the distribution's DKMS is asked about (Debian's by default;
    # not on this machine); off, no key matters.
    assert result["key_enrolled"] == (False if on else None)
    assert result["key"] == "/var/lib/dkms/mok.pub"
    assert result["changed"] is False


def test_an_enrolled_key_is_asked_of_mokutil(tmp_path: Path) -> None:
    key = tmp_path / "MOK.der"
    key.write_bytes(b"0\x82")
    tools = tmp_path / "bin"
    tools.mkdir()
    mokutil = tools / "mokutil"
    # mokutil's own words for both answers (mokutil.c, test_key()).
    mokutil.write_text("#!/bin/sh\nif [ \"$2\" = '%s' ]; then echo \"$2 is already enrolled\"; exit 1; fi\n"
                       "echo \"$2 is not enrolled\"; exit 0\n" % key)
    mokutil.chmod(0o755)
    path = f"{tools}:{BIN}:/usr/bin:/bin"
    enrolled = _module({"efivars_dir": str(_efivars(tmp_path, 1)), "key": str(key)}, path)
    assert enrolled["secure_boot"] is True and enrolled["key_enrolled"] is True
    other = tmp_path / "other.der"
    other.write_bytes(b"0\x82")
    assert _module({"efivars_dir": str(tmp_path / "efivars"), "key": str(other)}, path)["key_enrolled"] is False
    missing = _module({"efivars_dir": str(tmp_path / "efivars"), "key": str(tmp_path / "nope.der")}, path)
    assert missing["key_enrolled"] is False and "does not exist" in missing["key_detail"]


def _uvm(tmp_path: Path, devices: str, modprobe_rc: int = 0) -> subprocess.CompletedProcess[str]:
    (tmp_path / "devices").write_text(devices)
    (tmp_path / "dev").mkdir(exist_ok=True)
    modprobe = tmp_path / "modprobe"
    modprobe.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/modprobe.log\nexit {modprobe_rc}\n")
    modprobe.chmod(0o755)
    env = dict(os.environ, LABCTL_PROC_DEVICES=str(tmp_path / "devices"), LABCTL_DEV_DIR=str(tmp_path / "dev"),
               LABCTL_MODPROBE=str(modprobe))
    return subprocess.run(["sh", str(UVM)], capture_output=True, text=True, env=env, check=False)


# /proc/devices of an H200 host with the driver loaded (character devices part).
PROC_DEVICES = """Character devices:
  1 mem
  4 /dev/vc/0
195 nvidia-frontend
234 nvidia-caps
508 nvidia-uvm
509 nvidia-nvswitch

Block devices:
  8 sd
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod of a character device needs root")
def test_the_uvm_script_loads_the_module_and_creates_both_nodes_once(tmp_path: Path) -> None:
    first = _uvm(tmp_path, PROC_DEVICES)
    assert first.returncode == 0, first.stderr
    assert (tmp_path / "modprobe.log").read_text() == "nvidia-uvm\n"
    for name, minor in (("nvidia-uvm", 0), ("nvidia-uvm-tools", 1)):
        node = (tmp_path / "dev" / name).stat()
        assert stat.S_ISCHR(node.st_mode) and os.major(node.st_rdev) == 508 and os.minor(node.st_rdev) == minor
        assert stat.S_IMODE(node.st_mode) == 0o666
    again = _uvm(tmp_path, PROC_DEVICES)
    assert again.returncode == 0 and "created" not in again.stdout


def test_the_uvm_script_fails_clearly(tmp_path: Path) -> None:
    no_module = _uvm(tmp_path, PROC_DEVICES, modprobe_rc=1)
    assert no_module.returncode != 0 and not (tmp_path / "dev" / "nvidia-uvm").exists()
    no_device = _uvm(tmp_path, PROC_DEVICES.replace("508 nvidia-uvm\n", ""))
    assert no_device.returncode == 1 and "lists no nvidia-uvm device" in no_device.stderr


def test_every_replica_starts_after_the_uvm_unit() -> None:
    unit = (REPO / "roles" / "vllm" / "templates" / "etc" / "systemd" / "system" / "vllm@.service.j2").read_text()
    after = next(line for line in unit.splitlines() if line.startswith("After="))
    wants = next(line for line in unit.splitlines() if line.startswith("Wants="))
    assert "labctl-nvidia-uvm.service" in after and "labctl-nvidia-uvm.service" in wants
    assert "NoNewPrivileges=yes" in unit
    uvm = (REPO / "roles" / "nvidia_driver" / "templates" / "etc" / "systemd" / "system"
           / "labctl-nvidia-uvm.service.j2").read_text()
    assert "Type=oneshot" in uvm and "RemainAfterExit=yes" in uvm
    assert not [line for line in uvm.splitlines() if line.startswith("NoNewPrivileges")]
