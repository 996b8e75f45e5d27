"""Issue 39, part 2: replicas that share a GPU start one after another, each serving before the next
starts - in the vllm role's run, after a reboot and in a rolling restart - and replicas on different
GPUs still start together.

The vllm role runs here with its own tasks, units and drop-ins, on this stand-in 2 x H200 host, with
stand-in engines that keep vLLM 0.32.0's rule (tests/fixtures/vllm-standin: an engine fails, as vLLM
does, when another process changes its GPU's memory while it profiles; molecule/gpu/shared-gpu.yml
installs them). Two models: tiny-llama on both GPUs (0.80: replicas 0 and 1) and tiny-embed on GPU 1
(0.15: replica 100). The topology fills the shared GPU first: replica 0 shares GPU 1 with replica 100,
replica 1 has GPU 0 alone. Each engine appends its steps (and its GPUs) to the ledger's events.log,
which the tests read.

Before this issue the role started new replicas all at once and nothing ordered the units at boot:
replicas 1 and 100 profiled together and one of them failed (docs/verification.md). Last in the
scenario: it leaves the stand-in replicas running."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[3]
LEDGER = "/var/lib/vllm/labctl-test-gpus"
MODELS = [
    {"id": 0, "name": "tiny-llama", "revision": "r1", "classes": ["interactive", "batch"], "gpu_memory_utilization": 0.8},
    {"id": 1, "name": "tiny-embed", "revision": "r1", "kind": "embed", "gpus": [1], "gpu_memory_utilization": 0.15},
]
# The facts the role's install.yml sets (left out: --skip-tags vllm_install), and short waits.
STANDIN = "/opt/labctl-test/vllm-standin"
EXTRA = {"lab_models": MODELS, "__vllm_venv": STANDIN, "__vllm_cuda_home": STANDIN, "vllm_health_interval": 1,
         "vllm_health_timeout": 120, "vllm_drain_grace": 0, "vllm_rolling_restart_settle": 0}
HARNESS = Path(__file__).resolve().parents[1] / "shared-gpu.yml"
REPLICAS = {0: [1], 1: [0], 100: [1]}  # replica: its GPUs (labctl.models.place: a shared GPU is filled first)


def _playbook(path: Path, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    given = tmp_path / "extra.json"
    given.write_text(json.dumps(EXTRA))
    cmd = ["ansible-playbook", "-i", os.environ["MOLECULE_INVENTORY_FILE"], str(path), "-e", f"@{given}", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False, cwd=REPO)


def _events(host) -> list[dict[str, Any]]:
    text = host.run(f"cat {LEDGER}/events.log").stdout
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _clear(host) -> None:
    host.run_test(f"truncate -s 0 {LEDGER}/events.log")


def _wait_serving(host, replicas: set[int], timeout: float = 120) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            events = _events(host)
        except (AssertionError, RuntimeError):
            events = []  # the container is still coming up
        done = {e["replica"] for e in events if e["event"] in ("serving", "failed")}
        if replicas <= done:
            return events
        time.sleep(1)
    raise AssertionError(f"not all of {sorted(replicas)} served within {timeout} s: {events}")


def _wait_active(host, timeout: float = 120) -> None:
    """Every replica's unit active (its start job over: the readiness wait ended too)."""
    units = " ".join(f"vllm@{r}.service" for r in REPLICAS)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = host.run(f"systemctl is-active {units}").stdout.split()
        if states == ["active"] * len(REPLICAS):
            return
        time.sleep(1)
    raise AssertionError(f"{units}: {states}")


def _windows(events: list[dict[str, Any]]) -> dict[int, tuple[float, float]]:
    """Each replica's last start: from its profiling's begin to serving."""
    begun = {e["replica"]: e["t"] for e in events if e["event"] == "profile-begin"}
    served = {e["replica"]: e["t"] for e in events if e["event"] == "serving"}
    return {r: (begun[r], served[r]) for r in served if r in begun}


def _assert_order(events: list[dict[str, Any]]) -> None:
    failed = [e for e in events if e["event"] == "failed"]
    assert not failed, failed
    assert {e["replica"]: e["gpus"] for e in events if e["event"] == "start"} == REPLICAS, events
    windows = _windows(events)
    assert set(windows) == set(REPLICAS), events
    # GPU 1: replica 100 began profiling only after replica 0 served.
    assert windows[100][0] > windows[0][1], windows
    # GPU 0 and GPU 1 at once: replicas 1 and 0 profiled at the same time.
    assert windows[0][0] < windows[1][1] and windows[1][0] < windows[0][1], windows


@pytest.fixture(scope="module")
def served(host, tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    """The serving layer's first run with the two models (the role's install.yml left out)."""
    host.run("systemctl stop 'vllm@*.service'; systemctl reset-failed 'vllm@*.service'")
    host.run(f"rm -rf {LEDGER}")
    return _playbook(HARNESS, tmp_path_factory.mktemp("served"), "--skip-tags", "vllm_install")


def test_the_role_starts_the_replicas_of_a_shared_gpu_one_after_another(host, served):
    assert served.returncode == 0, served.stdout[-4000:] + served.stderr[-2000:]
    _assert_order(_events(host))
    # Only the replicas of the shared GPU have a drop-in; replica 1 (alone on GPU 0) has none.
    assert host.file("/etc/systemd/system/vllm@0.service.d/labctl-gpu-order.conf").contains("^ExecStartPost=+")
    assert host.file("/etc/systemd/system/vllm@100.service.d/labctl-gpu-order.conf").contains("^After=vllm@0.service$")
    assert not host.file("/etc/systemd/system/vllm@1.service.d/labctl-gpu-order.conf").exists


def _boot(host) -> str:
    return host.check_output("cut -d' ' -f22 /proc/1/stat")


def test_after_a_reboot_systemd_starts_them_one_after_another(host, served):
    assert served.returncode == 0
    _clear(host)
    boot = _boot(host)
    host.run("systemctl reboot")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if _boot(host) != boot:
                break
        except (AssertionError, RuntimeError):
            pass
        time.sleep(1)
    else:
        raise AssertionError("the container did not come back")
    _assert_order(_wait_serving(host, set(REPLICAS)))


def test_a_rolling_restart_restarts_them_one_after_another(host, served, tmp_path):
    assert served.returncode == 0
    _wait_active(host)
    _clear(host)
    run = _playbook(REPO / "playbooks" / "rolling-restart.yml", tmp_path, "-e", '{"labctl_restart_replicas": [0, 100]}')
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    events = _events(host)
    assert not [e for e in events if e["event"] == "failed"], events
    windows = _windows(events)
    assert set(windows) == {0, 100}, events
    assert windows[100][0] > windows[0][1], windows


def test_the_stand_in_fails_as_vllm_does_when_both_start_at_once(host, served):
    """The control: the same two units started together, ordering ignored (systemctl's ignore-dependencies
    job mode, as two units without the drop-ins start at boot): one of them fails with vLLM's error."""
    assert served.returncode == 0
    _wait_active(host)
    host.run_test("systemctl stop vllm@0.service vllm@100.service")
    _clear(host)
    host.run_test("systemctl start --no-block --job-mode=ignore-dependencies vllm@0.service vllm@100.service")
    events = _wait_serving(host, {0, 100}, timeout=60)
    failed = [e["error"] for e in events if e["event"] == "failed"]
    assert failed, events
    # Which of vLLM's errors depends on how the two windows overlap (a slower machine: the other engine's
    # whole load inside this one's window leaves no KV cache at all): each is vLLM's own failure.
    assert any(text.startswith(("AssertionError: Error in memory profiling", "ValueError: Free memory on device",
                                "ValueError: No available memory for the cache blocks",
                                "RuntimeError: labctl stand-in: another process changed GPU 1's memory")) for text in failed), failed
    journal = host.run("journalctl -u vllm@0.service -u vllm@100.service --no-pager -o cat").stdout
    assert "EngineCore failed to start." in journal
