"""roles/node_exporter/files/labctl-node-metrics against the nvidia-smi test double's recorded machines."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

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
