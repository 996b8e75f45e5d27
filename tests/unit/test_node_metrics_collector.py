"""roles/node_exporter/files/labctl-node-metrics against the nvidia-smi test double's recorded machines."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
COLLECTOR = REPO / "roles" / "node_exporter" / "files" / "labctl-node-metrics"
FIXTURES = REPO / "tests" / "fixtures" / "nvidia-smi"
STUB = FIXTURES / "nvidia-smi-stub"
SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (-?[0-9.e+-]+)$')


def run(
    tmp_path: Path, data: str, *extra: str, klog: str = ""
) -> tuple[subprocess.CompletedProcess[str], dict[str, list[tuple[str, float]]]]:
    out = tmp_path / "textfile"
    out.mkdir(exist_ok=True)
    log = tmp_path / "kernel.log"
    log.write_text(klog)
    env = dict(os.environ, NVIDIA_SMI_STUB_DATA=str(FIXTURES / data),
               NVIDIA_SMI_STUB_SHARE=str(tmp_path / "share"), NVIDIA_SMI_STUB_RUN=str(tmp_path / "run"))
    proc = subprocess.run(
        [sys.executable, str(COLLECTOR), "--textfile-dir", str(out), "--nvidia-smi", str(STUB),
         "--kernel-log-command", f"cat {log}", "--state-file", str(tmp_path / "state" / "xid.json"), *extra],
        capture_output=True, text=True, env=env, check=False, timeout=60)
    samples: dict[str, list[tuple[str, float]]] = {}
    for path in out.glob("*.prom"):
        typed = set()
        for line in path.read_text().splitlines():
            if line.startswith("# TYPE "):
                typed.add(line.split()[2])
                continue
            if line.startswith("#"):
                continue
            match = SAMPLE.match(line)
            assert match, f"{path.name}: not a Prometheus text sample: {line!r}"
            name, labels, value = match.groups()
            assert name in typed, f"{name} has no # TYPE line"
            samples.setdefault(name, []).append((labels or "", float(value)))
    return proc, samples


def test_h200_readings_under_dcgm_names(tmp_path: Path) -> None:
    proc, samples = run(tmp_path, "h200x2.json", "--model-store", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    for name in ["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_GPU_TEMP",
                 "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK",
                 "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_XID_ERRORS"]:
        assert len(samples[name]) == 2, name
    temps = dict(samples["DCGM_FI_DEV_GPU_TEMP"])
    assert any('gpu="0"' in k and 'modelName="NVIDIA H200"' in k and 'pci_bus_id="00000000:18:00.0"' in k for k in temps)
    assert sorted(temps.values()) == [28.0, 30.0]
    assert [v for _, v in samples["DCGM_FI_DEV_FB_FREE"]] == [143771.0, 143771.0]
    assert [v for _, v in samples["DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"]] == [1.0, 1.0]  # 0x...1: idle
    assert samples["labctl_gpu_collector_success"] == [("", 1.0)]
    assert samples["labctl_gpu_collector_gpus"] == [("", 2.0)]
    avail, size = samples["labctl_model_store_avail_bytes"][0], samples["labctl_model_store_size_bytes"][0]
    assert avail[0] == f'{{path="{tmp_path}"}}' and 0 < avail[1] <= size[1]


def test_xid_reported_once_per_new_error(tmp_path: Path) -> None:
    klog = ("NVRM: loading NVIDIA UNIX Open Kernel Module\n"
            "NVRM: Xid (PCI:0000:9a:00): 79, pid=0, name=, GPU has fallen off the bus.\n")
    _, first = run(tmp_path, "h200x2.json", klog=klog)
    xids = {labels.split('gpu="')[1][0]: value for labels, value in first["DCGM_FI_DEV_XID_ERRORS"]}
    assert xids == {"0": 0.0, "1": 79.0}  # bus 9A is GPU 1
    _, second = run(tmp_path, "h200x2.json", klog=klog)
    assert [v for _, v in second["DCGM_FI_DEV_XID_ERRORS"]] == [0.0, 0.0]  # nothing new since
    _, third = run(tmp_path, "h200x2.json", klog=klog + "NVRM: Xid (PCI:0000:18:00): 48, pid=0, DBE\n")
    xids = {labels.split('gpu="')[1][0]: value for labels, value in third["DCGM_FI_DEV_XID_ERRORS"]}
    assert xids == {"0": 48.0, "1": 0.0}


def test_fields_the_gpu_lacks_are_left_out(tmp_path: Path) -> None:
    """GB10: memory, ECC and throttle reasons are [N/A]; nothing is invented."""
    proc, samples = run(tmp_path, "na-fields.json")
    assert proc.returncode == 0
    assert "DCGM_FI_DEV_FB_USED" not in samples and "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL" not in samples
    assert len(samples["DCGM_FI_DEV_GPU_TEMP"]) == 1


@pytest.mark.parametrize("fixture", ["no-devices.txt", "driver-not-loaded.txt"])
def test_nvidia_smi_failure_is_a_metric(tmp_path: Path, fixture: str) -> None:
    if fixture == "driver-not-loaded.txt":
        (tmp_path / "run").mkdir()
        (tmp_path / "run" / "not-loaded").write_text("")
        data = "h200x2.json"
    else:
        (tmp_path / "empty.json").write_text('{"description": "no GPU", "gpus": [], "fabric": null, "lspci": ""}')
        data = str(tmp_path / "empty.json")
    proc, samples = run(tmp_path, data)
    assert proc.returncode == 0
    assert samples["labctl_gpu_collector_success"] == [("", 0.0)]
    assert "DCGM_FI_DEV_GPU_TEMP" not in samples
    assert "nvidia-smi" in proc.stderr


def test_gpus_off_writes_only_the_model_store(tmp_path: Path) -> None:
    proc, samples = run(tmp_path, "h200x2.json", "--gpus", "off", "--model-store", str(tmp_path), "--model-store", "/nonexistent")
    assert proc.returncode == 0
    assert not (tmp_path / "textfile" / "labctl_gpu.prom").exists()
    assert len(samples["labctl_model_store_avail_bytes"]) == 1  # the missing path is reported on stderr only
    assert "/nonexistent" in proc.stderr


# --- Issue 39: the faults that look like hangs, latched until an operator clears them ------------------

# Kernel log lines of the five Xids as real drivers print them (the GPU's bus id replaced by GPU 1's of
# h200x2.json, 0000:9a:00); where each comes from:
XID_LINES = {
    # NVIDIA/gpu-operator issue 1146 (driver with pid=; a DBE in the framebuffer)
    48: "NVRM: Xid (PCI:0000:9a:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has "
        "been detected on GPU in the framebuffer at physAddr 0x7fdf0de80 partition 5, subpartition 1",
    # stas00/ml-engineering, "Xid errors" (a row remapper event on an H100 training node)
    63: "NVRM: Xid (PCI:0000:9a:00): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate.",
    # leptonai/gpud, components/accelerator/nvidia/query/xid (a GPU lost from the bus)
    79: "NVRM: Xid (PCI:0000:9a:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
    # NVIDIA/open-gpu-kernel-modules, the error containment log's format comment
    94: "NVRM: Xid (PCI:0000:9a:00): 94, pid=7062, Contained: CE User Channel (0x9). RST: No, D-RST: No",
    # NVIDIA/NVSentinel syslog health monitor tests (a GSP firmware timeout)
    119: "NVRM: Xid (PCI:0000:9a:00): 119, pid=1582259, name=nvc:[driver], Timeout after 6s of waiting for RPC response "
         "from GPU1 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20802a02 0x8).",
}
# Level faults: the data table's values for GPU 1 while the fault reads, as --query-gpu and
# --query-remapped-rows print them.
LEVELS = {
    "ecc_uncorrectable": {"ecc.errors.uncorrected.volatile.total": "2"},
    "row_remap_pending": {"remapped_rows.uncorrectable": "1", "remapped_rows.pending": "1"},
    "row_remap_failure": {"remapped_rows.uncorrectable": "8", "remapped_rows.failure": "1"},
}


def _table(tmp_path: Path, name: str, gpu1: dict[str, str] | None = None, drop_gpu1: bool = False) -> str:
    data = json.loads((FIXTURES / "h200x2.json").read_text())
    data["gpus"][1].update(gpu1 or {})
    if drop_gpu1:
        data["gpus"] = data["gpus"][:1]
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(data))
    return str(path)


def _faults(samples: dict[str, list[tuple[str, float]]]) -> set[tuple[str, str]]:
    """(gpu, fault) of every latched fault."""
    found = set()
    for lbl, value in samples.get("labctl_gpu_fault", []):
        assert value in (0.0, 1.0)
        fields = dict(re.findall(r'(\w+)="([^"]*)"', lbl))
        if value == 1.0:
            found.add((fields["gpu"], fields["fault"]))
    return found


def _clear(tmp_path: Path, data: str, gpu: str, reason: str = "GPU reset and dcgmi diag -r 3 passed") -> tuple[int, dict[str, Any]]:
    env = dict(os.environ, NVIDIA_SMI_STUB_DATA=data, NVIDIA_SMI_STUB_SHARE=str(tmp_path / "share"),
               NVIDIA_SMI_STUB_RUN=str(tmp_path / "run"))
    proc = subprocess.run([sys.executable, str(COLLECTOR), "--nvidia-smi", str(STUB), "--state-file",
                           str(tmp_path / "state" / "xid.json"), "--clear-fault", gpu, "--reason", reason, "--operator", "alice"],
                          capture_output=True, text=True, env=env, check=False, timeout=60)
    return proc.returncode, json.loads(proc.stdout)


def test_the_stub_prints_the_fault_fields_as_a_real_h200() -> None:
    """The double's ECC, retired-page and remapped-row sections of `nvidia-smi -q` are the real H200's
    (driver 580.159.04, 2026-12-04) byte for byte; the row remapper answers --query-remapped-rows with 0/1
    and is no --query-gpu field, as the real tool (Azure/azhpc-diagnostics' compatibility tests)."""
    env = dict(os.environ, NVIDIA_SMI_STUB_DATA=str(FIXTURES / "h200x2.json"), NVIDIA_SMI_STUB_SHARE="/nonexistent",
               NVIDIA_SMI_STUB_RUN="/nonexistent")

    def smi(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(STUB), *args], capture_output=True, text=True, env=env, check=False, timeout=30)

    def section(text: str) -> str:
        return text[text.index("    ECC Mode\n"):text.index("    Temperature\n")]

    real = (FIXTURES / "real-1xh200-580.159.04.q.txt").read_text()
    assert section(smi("-q", "-i", "0").stdout) == section(real)
    rows = smi("--query-remapped-rows=remapped_rows.failure,gpu_bus_id,remapped_rows.pending", "--format=csv,noheader")
    assert rows.returncode == 0 and rows.stdout.splitlines() == ["0, 00000000:18:00.0, 0", "0, 00000000:9A:00.0, 0"]
    refused = smi("--query-gpu=remapped_rows.pending", "--format=csv,noheader")
    assert refused.returncode == 2 and 'Field "remapped_rows.pending" is not a valid field to query.' in refused.stdout


def test_row_remapping_under_dcgm_names(tmp_path: Path) -> None:
    proc, samples = run(tmp_path, _table(tmp_path, "remap", LEVELS["row_remap_pending"]))
    assert proc.returncode == 0, proc.stderr
    pending = {re.search(r'gpu="(\d)"', k).group(1): v for k, v in samples["DCGM_FI_DEV_ROW_REMAP_PENDING"]}  # type: ignore[union-attr]
    assert pending == {"0": 0.0, "1": 1.0}
    assert sorted(v for _, v in samples["DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"]) == [0.0, 1.0]
    assert [v for _, v in samples["DCGM_FI_DEV_ROW_REMAP_FAILURE"]] == [0.0, 0.0]
    assert len(samples["DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"]) == 2


@pytest.mark.parametrize("fault", [f"xid{code}" for code in XID_LINES] + list(LEVELS))
def test_a_hang_fault_is_latched_until_an_operator_clears_it(tmp_path: Path, fault: str) -> None:
    """Each fault of issue 39 on GPU 1: labctl_gpu_fault{gpu="1",fault=...} from the first reading, kept
    when the reading is gone (and after a restart of the collector: the state directory), a clear refused
    while the GPU still reports it, accepted with a reason once it does not, recorded in cleared.jsonl."""
    healthy = str(FIXTURES / "h200x2.json")
    if fault in LEVELS:
        faulty, klog = _table(tmp_path, fault, LEVELS[fault]), ""
    else:
        faulty, klog = healthy, "NVRM: loading NVIDIA UNIX Open Kernel Module\n" + XID_LINES[int(fault[3:])] + "\n"
    proc, first = run(tmp_path, faulty, klog=klog)
    assert proc.returncode == 0 and _faults(first) == {("1", fault)}, proc.stderr
    assert "latched" in proc.stderr
    # The fault no longer reads (nothing new in the kernel log, the counters back to 0): still latched.
    _, later = run(tmp_path, healthy, klog=klog)
    assert _faults(later) == {("1", fault)}
    if fault in LEVELS:
        code, refused = _clear(tmp_path, faulty, "1")
        assert code == 3 and refused["refused"] and "still reports" in refused["msg"] and "reset" in refused["msg"], refused
        _, still = run(tmp_path, healthy, klog=klog)
        assert _faults(still) == {("1", fault)}
    code, cleared = _clear(tmp_path, healthy, "GPU-" + json.loads(Path(healthy).read_text())["gpus"][1]["uuid"][4:])
    assert code == 0 and cleared["changed"] and cleared["cleared"] == [fault], cleared
    record = json.loads((tmp_path / "state" / "cleared.jsonl").read_text().splitlines()[-1])
    assert (record["gpu"], record["reason"], record["operator"], list(record["faults"])) == (
        "1", "GPU reset and dcgmi diag -r 3 passed", "alice", [fault])
    _, after = run(tmp_path, healthy, klog=klog)
    assert _faults(after) == set()
    assert _clear(tmp_path, healthy, "1") == (0, {"changed": False, "gpu": "1", "msg": "no fault is latched for GPU 1"})


def test_a_gpu_that_fell_off_the_bus_keeps_its_fault_and_labels(tmp_path: Path) -> None:
    """After Xid 79 nvidia-smi no longer lists the GPU: its fault stays with the labels last read, and
    a clear is refused until the host (rebooted) lists it again."""
    run(tmp_path, "h200x2.json")
    gone = _table(tmp_path, "gone", drop_gpu1=True)
    proc, samples = run(tmp_path, gone, klog=XID_LINES[79] + "\n")
    assert proc.returncode == 0 and _faults(samples) == {("1", "xid79")}
    (lbl, _), = [sample for sample in samples["labctl_gpu_fault"] if sample[1] == 1.0]
    assert 'UUID="GPU-' in lbl and 'pci_bus_id="00000000:9A:00.0"' in lbl and 'modelName="NVIDIA H200"' in lbl
    code, refused = _clear(tmp_path, gone, "1")
    assert code == 3 and "not visible" in refused["msg"] and "reboot" in refused["msg"]


def test_other_xids_and_other_formats(tmp_path: Path) -> None:
    """Xid 13 (an application's fault) is no hang: not latched. The older "(0000:9a:00)" and the
    "(PCI:0000:9a:00.0)" forms of the bus id name the same GPU."""
    klog = ("NVRM: Xid (PCI:0000:9a:00): 13, pid=2519562, name=python3, Graphics Exception: ChID 000c\n"
            "NVRM: Xid (0000:18:00): 48, pid='<unknown>', name=<unknown>, Ch 00000008\n"
            "NVRM: Xid (PCI:0000:9a:00.0): 94, pid=1234, Contained: SM (0x1). RST: No, D-RST: No\n")
    _, samples = run(tmp_path, "h200x2.json", klog=klog)
    assert _faults(samples) == {("0", "xid48"), ("1", "xid94")}


def test_faults_mode_latches_without_the_dcgm_names(tmp_path: Path) -> None:
    """Where DCGM exporter gives the readings (--gpus faults) the latch still runs, and no DCGM_* series
    is written twice."""
    proc, samples = run(tmp_path, _table(tmp_path, "ecc", LEVELS["ecc_uncorrectable"]), "--gpus", "faults")
    assert proc.returncode == 0
    assert _faults(samples) == {("1", "ecc_uncorrectable")}
    assert not [name for name in samples if name.startswith("DCGM_")]
    assert samples["labctl_gpu_collector_success"] == [("", 1.0)]
