"""tests/forensics.py: what a failed molecule verify saves before destroy (molecule/conftest.py)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_SPEC = importlib.util.spec_from_file_location("forensics", REPO / "tests" / "forensics.py")
assert _SPEC and _SPEC.loader
forensics = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(forensics)

FAILED = "vllm@1.service loaded failed failed vLLM replica 1 (tiny-llama)\n"
UNITS = (
    "litellm.service loaded active running LiteLLM proxy\n"
    "vllm@0.service loaded active running vLLM replica 0 (tiny-llama)\n"
    "vllm@1.service loaded failed failed vLLM replica 1 (tiny-llama)\n"
    "prometheus.service loaded activating auto-restart Monitoring system\n"
    "labctl-node-metrics.service loaded inactive dead GPU readings\n"
    "nvidia-fabricmanager.service not-found inactive dead nvidia-fabricmanager.service\n"
)


def _fake(calls: list[list[str]]) -> Callable[[list[str]], tuple[int, str]]:
    def run(argv: list[str]) -> tuple[int, str]:
        calls.append(argv)
        command = argv[-1]
        if command == "true":
            return 0, ""
        if argv[3] == "python3":
            return 0, "vllm http://127.0.0.1:8001/metrics down connection refused\nvllm http://127.0.0.1:8000/metrics up \n"
        if command.startswith("systemctl --failed"):
            return 0, FAILED
        if command.startswith("systemctl list-units"):
            return 0, UNITS
        if command.startswith("journalctl"):
            return 0, "line 1\nEngineCore failed to start.\n"
        return 0, "ok\n"
    return run


def test_the_failed_and_inactive_site_units_get_their_journal(tmp_path: Path) -> None:
    calls: list[list[str]] = []
    result = forensics.collect(["labctl-stack"], tmp_path, run=_fake(calls))
    host = tmp_path / "labctl-stack"
    assert result["labctl-stack"]["affected"] == ["prometheus.service", "vllm@1.service"]
    assert (host / "journal-vllm@1.service.txt").read_text().endswith("EngineCore failed to start.\n")
    assert (host / "journal-prometheus.service.txt").exists()
    # The oneshot behind a timer is inactive between runs: not an affected unit.
    assert not (host / "journal-labctl-node-metrics.service.txt").exists()
    for name in ("systemctl-failed", "site-units", "addresses", "load", "prometheus-targets"):
        assert (host / f"{name}.txt").stat().st_size > 0, name
    assert all(argv[:3] == ["docker", "exec", "labctl-stack"] for argv in calls)
    assert (tmp_path / "summary.json").exists()
    lines = forensics.summary(result, tmp_path)
    assert str(tmp_path) in lines[0]
    assert "failed units: vllm@1.service" in lines[1]
    assert any("target down" in line and "8001" in line for line in lines)
    assert any("EngineCore failed to start." in line for line in lines)


def test_a_host_that_cannot_be_reached_still_leaves_a_record(tmp_path: Path) -> None:
    def gone(argv: list[str]) -> tuple[int, str]:
        return 1, "Error response from daemon: No such container: labctl-gone"
    result = forensics.collect(["labctl-gone"], tmp_path, run=gone)
    assert result["labctl-gone"] == {"reached": False, "failed": [], "affected": [], "targets_down": []}
    assert "labctl-gone: not reachable" in forensics.summary(result, tmp_path)[1]
    assert "No such container" in (tmp_path / "labctl-gone" / "systemctl-failed.txt").read_text()


def test_the_hosts_come_from_the_molecule_inventory(tmp_path: Path) -> None:
    inventory = tmp_path / "ansible_inventory.yml"
    inventory.write_text(
        "all:\n  hosts:\n    labctl-scaleout-gw: {ansible_connection: community.docker.docker}\n"
        "    labctl-scaleout-gpu1: {}\n  children:\n    gpu_hosts:\n      hosts:\n        labctl-scaleout-gpu1: {}\n"
        "        labctl-scaleout-gpu2: {}\n")
    assert forensics.inventory_hosts(inventory) == ["labctl-scaleout-gw", "labctl-scaleout-gpu1", "labctl-scaleout-gpu2"]


def test_a_failed_verify_saves_and_prints_before_destroy(tmp_path: Path) -> None:
    """The hook itself, in a real pytest run of a failing test: it writes build/forensics/<scenario>
    (here through a docker that is not there) and prints where into the terminal summary."""
    tests = tmp_path / "molecule" / "demo" / "tests"
    tests.mkdir(parents=True)
    (tmp_path / "molecule" / "conftest.py").write_text((REPO / "molecule" / "conftest.py").read_text()
                                                       .replace('REPO / "tests"', f'Path({str(REPO / "tests")!r})'))
    (tests / "test_fails.py").write_text("def test_fails():\n    assert False\n")
    inventory = tmp_path / "inventory.yml"
    inventory.write_text("all:\n  hosts:\n    labctl-no-such-container: {}\n")
    env = {"MOLECULE_INVENTORY_FILE": str(inventory), "MOLECULE_SCENARIO_NAME": "demo", "PATH": "/nonexistent"}
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", str(tests)], cwd=tmp_path,
                         capture_output=True, text=True, env=env, check=False)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "forensics (saved before destroy)" in run.stdout, run.stdout
    assert f"saved under {tmp_path / 'build' / 'forensics' / 'demo'}" in run.stdout
    assert (tmp_path / "build" / "forensics" / "demo" / "labctl-no-such-container" / "systemctl-failed.txt").exists()
