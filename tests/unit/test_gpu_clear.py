"""`labctl gpu-clear` end to end on this machine (connection local): the real CLI, ansible-runner,
playbooks/gpu-clear.yml and the node_exporter role's clear_fault entry point, running the real
collector against the nvidia-smi double. A GPU whose row remapping is still pending is refused; once
the double reports it repaired the clear goes through, is recorded (the run, and cleared.jsonl with the
reason and who), and labctl_gpu_faults.prom is rewritten at once; a second clear changes nothing."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from labctl.runs.records import RecordStore

REPO = Path(__file__).resolve().parents[2]
LABCTL = str(Path(sys.executable).parent / "labctl")
COLLECTOR = REPO / "roles" / "node_exporter" / "files" / "labctl-node-metrics"
SMI = REPO / "tests" / "fixtures" / "nvidia-smi"


@pytest.fixture
def lab(tmp_path: Path) -> dict[str, Path]:
    inventory = tmp_path / "inventories" / "unitlab"
    inventory.mkdir(parents=True)
    paths = {"inventory": inventory, "state": tmp_path / "labctl-state", "collector": tmp_path / "node-metrics",
             "textfile": tmp_path / "textfile", "healthy": SMI / "h200x2.json", "faulty": tmp_path / "faulty.json"}
    paths["textfile"].mkdir()
    data = json.loads((SMI / "h200x2.json").read_text())
    data["gpus"][1].update({"remapped_rows.uncorrectable": "1", "remapped_rows.pending": "1"})
    paths["faulty"].write_text(json.dumps(data))
    (inventory / "hosts.yml").write_text(json.dumps({"all": {"children": {"lab": {"children": {"gpu_hosts": {"hosts": {"gpu01": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable,
        "node_exporter_textfile_dir": str(paths["textfile"]), "node_exporter_collector_state_dir": str(paths["collector"]),
        "node_exporter_nvidia_smi": str(SMI / "nvidia-smi-stub")}}}}}}}}))
    return paths


def _env(lab: dict[str, Path], table: str) -> dict[str, str]:
    return dict(os.environ, LABCTL_STATE_DIR=str(lab["state"]), NVIDIA_SMI_STUB_DATA=str(lab[table]),
                NVIDIA_SMI_STUB_SHARE="/nonexistent", NVIDIA_SMI_STUB_RUN="/nonexistent", USER="alice")


def _clear(lab: dict[str, Path], table: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([LABCTL, "gpu-clear", "-i", str(lab["inventory"]), *args,
                           "-e", f"__node_exporter_collector_program={COLLECTOR}", "-e", "ansible_become=false"],
                          capture_output=True, text=True, env=_env(lab, table), timeout=240, check=False)


def test_a_clear_is_refused_while_the_gpu_reports_the_fault_then_recorded(lab: dict[str, Path]) -> None:
    subprocess.run([sys.executable, str(COLLECTOR), "--textfile-dir", str(lab["textfile"]), "--nvidia-smi",
                    str(SMI / "nvidia-smi-stub"), "--kernel-log-command", "true", "--state-file", str(lab["collector"] / "xid.json")],
                   env=_env(lab, "faulty"), check=True, capture_output=True, timeout=60)
    latched = (lab["textfile"] / "labctl_gpu_faults.prom").read_text()
    assert 'labctl_gpu_fault{gpu="1",' in latched and 'fault="row_remap_pending"} 1' in latched, latched
    reason = "GPU 1 reset, Pending: No, dcgmi diag -r 3 passed (ticket 77)"

    refused = _clear(lab, "faulty", "--host", "gpu01", "--gpu", "1", "--reason", reason)
    assert refused.returncode != 0, refused.stdout
    assert "still reports" in refused.stdout and "row remapping waits for a GPU reset" in refused.stdout, refused.stdout
    assert not (lab["collector"] / "cleared.jsonl").exists()

    unknown = _clear(lab, "healthy", "--host", "gw01", "--gpu", "1", "--reason", reason)
    assert unknown.returncode != 0 and "gw01 is not in the inventory's gpu_hosts: gpu01" in unknown.stdout, unknown.stdout

    cleared = _clear(lab, "healthy", "--host", "gpu01", "--gpu", "1", "--reason", reason)
    assert cleared.returncode == 0, cleared.stdout + cleared.stderr
    assert "gpu01: ok=4 changed=1 failed=0" in cleared.stdout, cleared.stdout
    record = json.loads((lab["collector"] / "cleared.jsonl").read_text())
    assert (record["gpu"], record["faults"].keys() == {"row_remap_pending"}, record["reason"], record["operator"]) == (
        "1", True, reason, "alice")
    published = (lab["textfile"] / "labctl_gpu_faults.prom").read_text()  # published at once: every fault 0
    assert 'fault="row_remap_pending"} 0' in published and not re.search(r"^labctl_gpu_fault\{.*\} 1$", published, re.MULTILINE)
    runs = RecordStore(lab["state"]).latest(10)
    assert [r.argv[:2] for r in runs[:1]] == [["labctl", "gpu-clear"]] and reason in " ".join(runs[0].argv)

    again = _clear(lab, "healthy", "--host", "gpu01", "--gpu", "1", "--reason", reason)
    assert again.returncode == 0 and "gpu01: ok=4 changed=0 failed=0" in again.stdout, again.stdout


def test_a_clear_needs_a_reason(lab: dict[str, Path]) -> None:
    run = _clear(lab, "healthy", "--host", "gpu01", "--gpu", "1", "--reason", " ")
    assert run.returncode != 0 and "--reason must say why" in run.stderr
