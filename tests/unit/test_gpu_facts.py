"""The labctl_gpu_facts module: its parsers, the module run by ansible against the nvidia-smi stub, and the stub.

Fixtures live in tests/fixtures/nvidia-smi/: one JSON data table per machine shape (also what the stub
answers from) and raw text for the failure shapes. Their descriptions say where each shape comes from.
The module runs are started together in one session fixture (each `ansible localhost` costs ~1 s).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
FIXTURES = REPO / "tests" / "fixtures" / "nvidia-smi"
STUB = FIXTURES / "nvidia-smi-stub"
MACHINES = ("h200x2", "h100x8-hgx", "a100-mig", "na-fields")
NOT_LOADED = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running."
)


def _load_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("labctl_gpu_facts", REPO / "library" / "labctl_gpu_facts.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


labctl_gpu_facts = _load_module()


def _data(machine: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"{machine}.json").read_text())
    return data


def _csv(machine: str) -> str:
    """What `nvidia-smi --query-gpu=<QUERY_FIELDS> --format=csv,noheader,nounits` prints for the table."""
    rows = _data(machine)["gpus"]
    return "".join(", ".join(gpu[field] for field in labctl_gpu_facts.QUERY_FIELDS) + "\n" for gpu in rows)


def _stub(*args: str, data: str | Path = "h200x2", share: Path | None = None, run: Path | None = None,
          ) -> subprocess.CompletedProcess[str]:
    path = data if isinstance(data, Path) else FIXTURES / f"{data}.json"
    env = dict(os.environ, NVIDIA_SMI_STUB_DATA=str(path),
               NVIDIA_SMI_STUB_SHARE=str(share or "/nonexistent/share"),
               NVIDIA_SMI_STUB_RUN=str(run or "/nonexistent/run"))
    return subprocess.run([sys.executable, str(STUB), *args], capture_output=True, text=True, env=env, check=False)


# --- the parsers, on the fixtures' values ------------------------------------------------------------


def test_h200_pair() -> None:
    gpus = labctl_gpu_facts.parse_query_output(_csv("h200x2"))
    assert [g["index"] for g in gpus] == [0, 1]
    first = gpus[0]
    assert first["name"] == "NVIDIA H200"
    assert first["memory_total_mib"] == 143771
    assert first["compute_cap"] == "9.0"
    assert first["driver_version"] == "580.95.05"
    assert first["persistence_mode"] is True
    assert first["mig_mode"] == "Disabled" and first["ecc_mode"] == "Enabled"
    assert first["power_limit_w"] == 700.0
    assert first["serial"] == "1753724031847" and first["pci_bus_id"] == "00000000:18:00.0"
    assert labctl_gpu_facts.driver_branch(first["driver_version"]) == "580"
    assert set(first) == {"index", "name", "uuid", "serial", "pci_bus_id", "memory_total_mib", "driver_version",
                          "vbios_version", "persistence_mode", "compute_cap", "compute_mode", "mig_mode",
                          "ecc_mode", "power_limit_w"}


def test_hgx_h100_eight_gpus() -> None:
    gpus = labctl_gpu_facts.parse_query_output(_csv("h100x8-hgx"))
    assert len(gpus) == 8
    assert {g["memory_total_mib"] for g in gpus} == {81559}
    assert gpus[7]["pci_bus_id"] == "00000000:DB:00.0"


def test_a100_mig() -> None:
    gpus = labctl_gpu_facts.parse_query_output(_csv("a100-mig"))
    assert gpus[0]["mig_mode"] == "Enabled"
    assert gpus[1]["mig_mode"] == "Disabled"
    assert gpus[0]["memory_total_mib"] == 81920 and gpus[0]["compute_cap"] == "8.0"


def test_unavailable_fields_are_none() -> None:
    (gpu,) = labctl_gpu_facts.parse_query_output(_csv("na-fields"))
    assert gpu["serial"] is None  # [Not Supported]
    assert gpu["memory_total_mib"] is None  # [N/A] on unified memory
    assert gpu["mig_mode"] is None and gpu["ecc_mode"] is None
    assert gpu["power_limit_w"] is None
    assert gpu["vbios_version"] is None
    assert gpu["compute_cap"] == "12.1"
    assert labctl_gpu_facts.driver_branch(gpu["driver_version"]) == "580"  # "580.142": two parts


@pytest.mark.parametrize(
    ("line", "quoted"),
    [
        # -L output mixed into the query output (garbage.txt's second line)
        ("GPU 1: NVIDIA H200 (UUID: GPU-5e0a4c71-93d2-6b8f-0c1e-8a2f47d9b316)", "GPU 1: NVIDIA H200"),
        # --format=csv,noheader without nounits: memory with its unit
        (("0, NVIDIA H200, GPU-x, 1, 00000000:18:00.0, 143771 MiB, 580.95.05, 96.00.A5.00.03, Enabled, 9.0, "
          "Default, Disabled, Enabled, 700.00 W"), "143771 MiB"),
        (("x, NVIDIA H200, GPU-x, 1, 00000000:18:00.0, 143771, 580.95.05, 96.00.A5.00.03, Enabled, 9.0, "
          "Default, Disabled, Enabled, 700.00"), "'x'"),
        ("0, NVIDIA H200, GPU-x, 1, 00000000:18:00.0, 143771, 580.95.05", "fields"),
    ],
)
def test_malformed_output_names_the_line(line: str, quoted: str) -> None:
    with pytest.raises(labctl_gpu_facts.ParseError) as exc:
        labctl_gpu_facts.parse_query_output(_csv("h200x2") + line + "\n")
    assert quoted in str(exc.value)
    assert repr(line) in str(exc.value)


def test_blank_lines_are_not_gpus() -> None:
    assert labctl_gpu_facts.parse_query_output("\n\n") == []


H100_NVSWITCH_BRIDGE = "05:00.0 Bridge: NVIDIA Corporation GH100 [H100 NVSwitch] (rev a1)"


@pytest.mark.parametrize(
    ("q_text", "lspci", "expected"),
    [
        ("    Fabric\n        State                             : Completed\n", "", True),
        # NVSwitch board whose fabric manager is not running yet: exactly when it is needed
        ("    Fabric\n        State                             : Not Started\n", "", True),
        ("    Fabric\n        State                             : N/A\n        Status : N/A\n", "", False),
        ("    Fabric\n        State                             : Not Supported\n", "", False),
        # "Performance State" is not the fabric's state
        ("    Performance State                     : P0\n", "", False),
        # an older driver without a Fabric section, switches on the bus (both pci.ids spellings)
        ("", "05:00.0 Bridge: NVIDIA Corporation Device 22a3 (rev a1)\n", True),
        ("", H100_NVSWITCH_BRIDGE + "\n", True),
        ("", "05:00.0 Bridge [0680]: NVIDIA Corporation GH100 [H100 NVSwitch] [10de:22a3] (rev a1)\n", True),
        # root ports / CPU bridges of NVIDIA-built boards are not NVSwitches
        ("", "0000:00:00.0 PCI bridge: NVIDIA Corporation Device 22b2\n0000:00:01.0 Host bridge: NVIDIA Corp x\n",
         False),
        ("", "18:00.0 3D controller: NVIDIA Corporation GH100 [H200 SXM 141GB] (rev a1)\n", False),
        ("", "", False),
    ],
)
def test_parse_nvswitch(q_text: str, lspci: str, expected: bool) -> None:
    assert labctl_gpu_facts.parse_nvswitch(q_text, lspci) is expected


@pytest.mark.parametrize(("machine", "expected"), [
    ("h200x2", False), ("h100x8-hgx", True), ("a100-mig", False), ("na-fields", False)])
def test_fixture_lspci_and_stub_q_agree_on_nvswitch(machine: str, expected: bool) -> None:
    q_text = _stub("-q", data=machine).stdout
    assert labctl_gpu_facts.parse_nvswitch(q_text, "") is expected
    assert labctl_gpu_facts.parse_nvswitch("", _data(machine)["lspci"]) is expected


# --- the module, run by ansible ----------------------------------------------------------------------


def _executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def _replay(path: Path, fixture: str | Path, rc: int) -> Path:
    """An nvidia-smi that prints a raw fixture and exits rc, whatever it is asked."""
    return _executable(path, f"#!/bin/sh\ncat '{FIXTURES / fixture}'\nexit {rc}\n")


# lspci's class names -> sysfs `class` values (0xCCSSPP).
_PCI_CLASSES = {"Bridge": "0x068000", "3D controller": "0x030200", "VGA compatible controller": "0x030000"}
# Device IDs of the lspci lines that carry a name instead (pci.ids); detection reads only the class.
_PCI_IDS = {"GH100 [H200 SXM 141GB]": "2335", "GA100 [A100 SXM4 80GB]": "20b2"}


def _sysfs(root: Path, machine: str) -> Path:
    """A sysfs PCI tree with the machine's NVIDIA functions (from its recorded `lspci -d 10de:`)
    and two Intel ones (a root port and a host bridge, which must not count)."""
    devices = root / "bus" / "pci" / "devices"
    rows = [("0000:00:00.0", "0x8086", "0x060000", "0x09a2"), ("0000:00:01.0", "0x8086", "0x060400", "0x347a")]
    for line in _data(machine)["lspci"].splitlines():
        address, rest = line.split(" ", 1)
        kind, _sep, name = rest.partition(": ")
        model = name.removeprefix("NVIDIA Corporation ").rsplit(" (rev", 1)[0]
        device = model.split("Device ", 1)[1] if model.startswith("Device ") else _PCI_IDS[model]
        rows.append((f"0000:{address}", "0x10de", _PCI_CLASSES[kind], "0x" + device))
    for address, vendor, pci_class, device in rows:
        node = devices / address
        node.mkdir(parents=True)
        for key, value in (("vendor", vendor), ("class", pci_class), ("device", device)):
            (node / key).write_text(value + "\n")
    return root


def _ansible(args: dict[str, Any], env: dict[str, str], check: bool = False) -> dict[str, Any]:
    # The default callback (not -o): it also prints the module's warnings, on stderr.
    cmd = [str(BIN / "ansible"), "localhost", "-c", "local", "-m", "labctl_gpu_facts"]
    if args:  # `-a '{}'` would be taken for raw parameters
        cmd += ["-a", json.dumps(args)]
    if check:
        cmd.append("--check")
    full_env = {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"),
                "ANSIBLE_LIBRARY": str(REPO / "library"), "ANSIBLE_LOCALHOST_WARNING": "False",
                "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False", "ANSIBLE_DEPRECATION_WARNINGS": "False",
                "ANSIBLE_PYTHON_INTERPRETER": sys.executable,
                "NVIDIA_SMI_STUB_SHARE": "/nonexistent/share", "NVIDIA_SMI_STUB_RUN": "/nonexistent/run"}
    full_env.update(env)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=full_env, check=False, cwd=REPO)
    out = proc.stdout
    assert "=>" in out, out + proc.stderr
    status, _sep, text = out.partition("=>")
    result: dict[str, Any] = json.loads(text)
    if "FAILED!" in status:  # the callback says it there, not in the JSON
        result.setdefault("failed", True)
    result["_stderr"] = proc.stderr  # where the callback prints the module's warnings
    return result


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Every module run of this file, started at once."""
    tmp = tmp_path_factory.mktemp("labctl_gpu_facts")
    cases: dict[str, tuple[dict[str, Any], dict[str, str], bool]] = {}

    def machine_bin(machine: str) -> Path:
        # nvidia-smi (the stub) and an lspci that lists the machine's NVIDIA devices, found on PATH
        bin_dir = tmp / f"bin-{machine}"
        bin_dir.mkdir()
        (bin_dir / "nvidia-smi").symlink_to(STUB)
        lspci = json.dumps(_data(machine)["lspci"])
        _executable(bin_dir / "lspci", f"#!{sys.executable}\nimport sys\nsys.stdout.write({lspci})\n")
        return bin_dir

    def on_path(bin_dir: Path, data: str) -> dict[str, str]:
        return {"PATH": f"{bin_dir}:{BIN}:/usr/bin:/bin", "NVIDIA_SMI_STUB_DATA": str(FIXTURES / f"{data}.json")}

    for machine in MACHINES:
        cases[machine] = ({}, on_path(machine_bin(machine), machine), machine == "a100-mig")  # one in check mode
    # The stub by explicit path, NVSwitch detection off
    cases["h100-no-detect"] = ({"nvidia_smi": str(STUB), "detect_nvswitch": False},
                               {"NVIDIA_SMI_STUB_DATA": str(FIXTURES / "h100x8-hgx.json")}, False)
    # A fake driver package's version file overrides the table (what the packaged stub reports)
    share = tmp / "share"
    share.mkdir()
    (share / "driver_version").write_text("575.57.08\n")
    cases["h200-packaged-575"] = ({"nvidia_smi": str(STUB)},
                                  {"NVIDIA_SMI_STUB_DATA": str(FIXTURES / "h200x2.json"),
                                   "NVIDIA_SMI_STUB_SHARE": str(share)}, False)
    # The raw "No devices were found" (nvidia-smi exits 6); the stub says the same for an empty table
    cases["no-devices"] = ({"nvidia_smi": str(_replay(tmp / "smi-no-devices", "no-devices.txt", 6))}, {}, False)
    # Driver not loaded: the stub's flag file (its message is driver-not-loaded.txt, exit 9)
    run_dir = tmp / "run"
    run_dir.mkdir()
    (run_dir / "not-loaded").touch()
    cases["not-loaded"] = ({"nvidia_smi": str(STUB)},
                           {"NVIDIA_SMI_STUB_DATA": str(FIXTURES / "h200x2.json"),
                            "NVIDIA_SMI_STUB_RUN": str(run_dir)}, False)
    # No nvidia-smi on PATH, or not at the given path
    empty_bin = tmp / "bin-empty"
    empty_bin.mkdir()
    cases["missing"] = ({}, {"PATH": f"{empty_bin}:{BIN}:/usr/bin:/bin"}, False)
    cases["missing-path"] = ({"nvidia_smi": str(tmp / "nope" / "nvidia-smi")}, {}, False)
    cases["garbage"] = ({"nvidia_smi": str(_replay(tmp / "smi-garbage", "garbage.txt", 0))}, {}, False)
    # A corrupted infoROM: a WARNING line before the rows, exit 14; the rows are still good
    inforom = tmp / "inforom.txt"
    inforom.write_text("WARNING: infoROM is corrupted at gpu 0000:18:00.0\n" + _csv("h200x2"))
    cases["inforom"] = ({"nvidia_smi": str(_replay(tmp / "smi-inforom", inforom, 14)), "detect_nvswitch": False},
                        {}, False)
    # A fresh host: no driver, no nvidia-smi, no lspci; only the PCI devices in sysfs
    for machine in ("h100x8-hgx", "h200x2"):
        cases[f"fresh-{machine}"] = ({"sysfs_root": str(_sysfs(tmp / f"sys-{machine}", machine))},
                                     {"PATH": f"{empty_bin}:{BIN}:/usr/bin:/bin"}, False)
    cases["fresh-hgx-no-detect"] = ({"sysfs_root": str(tmp / "sys-h100x8-hgx"), "detect_nvswitch": False},
                                    {"PATH": f"{empty_bin}:{BIN}:/usr/bin:/bin"}, False)
    # The project's ansible.cfg (callbacks, inventory) is not what is tested here, and costs time
    config = tmp / "ansible.cfg"
    config.write_text("[defaults]\n")
    for _args, env, _check in cases.values():
        env["ANSIBLE_CONFIG"] = str(config)

    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {name: pool.submit(_ansible, *case) for name, case in cases.items()}
        return {name: future.result() for name, future in futures.items()}


def _facts(result: dict[str, Any]) -> dict[str, Any]:
    assert result.get("failed") is not True, result
    assert result["changed"] is False
    facts: dict[str, Any] = result["ansible_facts"]
    return facts


def test_module_h200_pair(runs: dict[str, dict[str, Any]]) -> None:
    facts = _facts(runs["h200x2"])
    assert facts["gpu_count"] == 2
    assert facts["gpu_driver_version"] == "580.95.05" and facts["gpu_driver_branch"] == "580"
    assert facts["gpu_nvswitch"] is False
    assert facts["gpu_facts_reason"] == ""
    assert [g["memory_total_mib"] for g in facts["gpus"]] == [143771, 143771]
    assert {g["compute_cap"] for g in facts["gpus"]} == {"9.0"}
    assert facts["gpus"] == labctl_gpu_facts.parse_query_output(_csv("h200x2"))


def test_module_hgx_h100(runs: dict[str, dict[str, Any]]) -> None:
    facts = _facts(runs["h100x8-hgx"])
    assert facts["gpu_count"] == 8 and facts["gpu_nvswitch"] is True
    assert facts["gpu_driver_branch"] == "565"
    no_detect = _facts(runs["h100-no-detect"])
    assert no_detect["gpu_nvswitch"] is False and no_detect["gpu_count"] == 8


def test_module_a100_mig_in_check_mode(runs: dict[str, dict[str, Any]]) -> None:
    facts = _facts(runs["a100-mig"])
    assert [g["mig_mode"] for g in facts["gpus"]] == ["Enabled", "Disabled", "Disabled", "Disabled"]
    assert facts["gpu_nvswitch"] is False


def test_module_unavailable_fields(runs: dict[str, dict[str, Any]]) -> None:
    (gpu,) = _facts(runs["na-fields"])["gpus"]
    for key in ("serial", "memory_total_mib", "mig_mode", "ecc_mode", "power_limit_w", "vbios_version"):
        assert gpu[key] is None, key
    assert gpu["persistence_mode"] is True


def test_module_reports_the_packaged_driver_version(runs: dict[str, dict[str, Any]]) -> None:
    facts = _facts(runs["h200-packaged-575"])
    assert facts["gpu_driver_version"] == "575.57.08" and facts["gpu_driver_branch"] == "575"
    assert {g["driver_version"] for g in facts["gpus"]} == {"575.57.08"}


def test_module_no_devices(runs: dict[str, dict[str, Any]]) -> None:
    facts = _facts(runs["no-devices"])
    assert facts["gpu_count"] == 0 and facts["gpus"] == []
    assert facts["gpu_facts_reason"] == "No devices were found"
    assert facts["gpu_driver_version"] == "" and facts["gpu_driver_branch"] == ""
    assert facts["gpu_nvswitch"] is False


def test_module_driver_not_loaded(runs: dict[str, dict[str, Any]]) -> None:
    facts = _facts(runs["not-loaded"])
    assert facts["gpu_count"] == 0
    assert facts["gpu_facts_reason"] == NOT_LOADED


def test_module_without_nvidia_smi(runs: dict[str, dict[str, Any]]) -> None:
    explicit = _facts(runs["missing-path"])
    assert explicit["gpu_count"] == 0 and "not found at" in explicit["gpu_facts_reason"]
    # ansible's local connection needs /usr/bin and /bin, and the module also looks in the sbin dirs
    if shutil.which("nvidia-smi", path="/usr/bin:/bin:/usr/sbin:/sbin:/usr/local/sbin"):
        pytest.skip("this machine has a real nvidia-smi where the module looks")
    facts = _facts(runs["missing"])
    assert facts["gpu_count"] == 0
    assert facts["gpu_facts_reason"] == "nvidia-smi not found (no NVIDIA driver installed)"


def test_a_fresh_hgx_host_is_an_nvswitch_host_before_any_driver(runs: dict[str, dict[str, Any]]) -> None:
    """Fabric manager is installed in the same run as the driver: the NVSwitches (PCI class
    0x0680, NVIDIA) are seen on the bus before nvidia-smi exists."""
    hgx = _facts(runs["fresh-h100x8-hgx"])
    assert hgx["gpu_count"] == 0 and hgx["gpu_facts_reason"] == "nvidia-smi not found (no NVIDIA driver installed)"
    assert hgx["gpu_nvswitch"] is True and hgx["gpu_pci_count"] == 8
    pair = _facts(runs["fresh-h200x2"])
    assert pair["gpu_nvswitch"] is False and pair["gpu_pci_count"] == 2
    off = _facts(runs["fresh-hgx-no-detect"])
    assert off["gpu_nvswitch"] is False and off["gpu_pci_count"] == 8


def test_module_fails_on_garbage_quoting_the_line(runs: dict[str, dict[str, Any]]) -> None:
    result = runs["garbage"]
    assert result["failed"] is True
    assert "GPU 1: NVIDIA H200 (UUID: GPU-5e0a4c71-93d2-6b8f-0c1e-8a2f47d9b316)" in result["msg"]


def test_module_reads_past_an_inforom_warning(runs: dict[str, dict[str, Any]]) -> None:
    result = runs["inforom"]
    assert _facts(result)["gpu_count"] == 2
    assert "nvidia-smi: WARNING: infoROM is corrupted at gpu 0000:18:00.0" in result["_stderr"]


# --- the stub speaks nvidia-smi ------------------------------------------------------------------------


@pytest.mark.parametrize("machine", MACHINES)
def test_stub_answers_the_modules_query_with_the_table(machine: str) -> None:
    proc = _stub(*labctl_gpu_facts.QUERY_ARGS, data=machine)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout == _csv(machine)


def test_stub_header_and_units() -> None:
    proc = _stub("--query-gpu=index,name,memory.total,power.limit,utilization.gpu,clocks.sm,temperature.gpu",
                 "--format=csv", "-i", "1")
    assert proc.stdout.splitlines() == [
        ("index, name, memory.total [MiB], power.limit [W], utilization.gpu [%], clocks.current.sm [MHz], "
         "temperature.gpu"),
        "1, NVIDIA H200, 143771 MiB, 700.00 W, 0 %, 345 MHz, 30",
    ]
    na = _stub("--query-gpu=memory.total,power.limit,serial", "--format=csv,noheader", data="na-fields")
    assert na.stdout == "[N/A], [N/A], [Not Supported]\n"


def test_stub_refuses_an_unknown_field() -> None:
    proc = _stub("--query-gpu=index,cuda_version", "--format=csv")
    assert proc.returncode == 2
    assert proc.stdout.startswith('Field "cuda_version" is not a valid field to query.')


def test_stub_selects_lists_and_reports_versions() -> None:
    assert _stub("-L").stdout.splitlines() == [
        "GPU 0: NVIDIA H200 (UUID: GPU-cb3dfa52-e2f3-9ca4-a399-7d16041c3732)",
        "GPU 1: NVIDIA H200 (UUID: GPU-5e0a4c71-93d2-6b8f-0c1e-8a2f47d9b316)",
    ]
    by_uuid = _stub("-i", "GPU-5e0a4c71-93d2-6b8f-0c1e-8a2f47d9b316", "--query-gpu=index", "--format=csv,noheader")
    assert by_uuid.stdout == "1\n"
    missing = _stub("-i", "7", "-L")
    assert missing.returncode == 6 and missing.stdout == "No devices were found\n"
    assert "CUDA Version        : 13.0" in _stub("--version").stdout


def test_stub_table_header_and_driver_override(tmp_path: Path) -> None:
    table = _stub().stdout.splitlines()
    assert table[2] == "| NVIDIA-SMI 580.95.05              Driver Version: 580.95.05      CUDA Version: 13.0     |"
    assert "|   0  NVIDIA H200                    On  |   00000000:18:00.0 Off |" in table[8]
    assert all(len(line) == 91 for line in table[1:] if line.startswith(("|", "+")))
    (tmp_path / "driver_version").write_text("575.57.08\n")
    overridden = _stub(share=tmp_path).stdout.splitlines()
    assert overridden[2] == "| NVIDIA-SMI 575.57.08              Driver Version: 575.57.08      CUDA Version: 12.9     |"


def test_stub_persistence_mode_and_not_loaded(tmp_path: Path) -> None:
    proc = _stub("-pm", "1", "-i", "0", run=tmp_path)
    if os.geteuid() == 0:
        assert proc.returncode == 0
        assert proc.stdout == "Enabled persistence mode for GPU 00000000:18:00.0.\nAll done.\n"
        _stub("-pm", "0", run=tmp_path)
        assert _stub("--query-gpu=persistence_mode", "--format=csv,noheader", run=tmp_path).stdout == \
            "Disabled\nDisabled\n"
    else:
        assert proc.returncode == 4 and "Insufficient Permissions" in proc.stdout
    (tmp_path / "not-loaded").touch()
    down = _stub("--query-gpu=index", "--format=csv", run=tmp_path)
    assert down.returncode == 9
    assert down.stdout == (FIXTURES / "driver-not-loaded.txt").read_text()


def test_stub_without_gpus_says_no_devices(tmp_path: Path) -> None:
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"description": "no GPU", "gpus": [], "fabric": None, "lspci": ""}))
    for args in ([*labctl_gpu_facts.QUERY_ARGS], ["-L"], ["-q"], []):
        proc = _stub(*args, data=empty)
        assert proc.returncode == 6
        assert proc.stdout == (FIXTURES / "no-devices.txt").read_text()


# --- real output dropped in by scripts/device-check.sh --------------------------------------------------

REAL_CASES = sorted(p.name[: -len(".facts.json")] for p in FIXTURES.glob("real-*.facts.json"))


@pytest.mark.parametrize("case", REAL_CASES)
def test_real_output_case(case: str) -> None:
    """A capture from real GPUs: the parsers agree with what the module said there, the stub replays it."""
    result = json.loads((FIXTURES / f"{case}.facts.json").read_text())
    facts = result["ansible_facts"]
    query = (FIXTURES / f"{case}.query.csv").read_text()
    if not facts["gpu_count"]:
        assert facts["gpu_facts_reason"]
        return
    assert labctl_gpu_facts.parse_query_output(query) == facts["gpus"]
    q_text = (FIXTURES / f"{case}.q.txt").read_text()
    lspci = (FIXTURES / f"{case}.lspci.txt").read_text()
    assert labctl_gpu_facts.parse_nvswitch(q_text, lspci) is facts["gpu_nvswitch"]
    replayed = _stub(*labctl_gpu_facts.QUERY_ARGS, data=FIXTURES / f"{case}.json")
    assert replayed.stdout == query
    assert labctl_gpu_facts.parse_nvswitch(_stub("-q", data=FIXTURES / f"{case}.json").stdout, "") is (
        _data(case)["fabric"] is not None)
