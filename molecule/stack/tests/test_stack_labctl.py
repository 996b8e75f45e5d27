"""labctl against the whole stack (runs after test_stack.py, before test_stack_monitoring.py):
drift finds a hand-changed file and changes nothing, smoke passes, a rolling restart of one
replica restarts only that one. Real ansible-runner runs over the molecule inventory."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
STATE = REPO / "build" / "reports" / "labctl-state"
SYSCTL = "/etc/sysctl.d/90-labctl-inference.conf"
WATCHED = ["/etc/labctl", "/etc/sysctl.d", "/etc/prometheus", "/etc/systemd/system", "/etc/redis", "/etc/default"]
UNITS = ["vllm@0", "vllm@1", "litellm", "redis-server", "postgresql@15-main", "prometheus", "prometheus-node-exporter"]


def labctl(*args: str, timeout: int = 1500) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, LABCTL_STATE_DIR=str(STATE))
    return subprocess.run(["labctl", *args, "-i", os.environ["MOLECULE_INVENTORY_FILE"]], capture_output=True,
                          text=True, timeout=timeout, check=False, cwd=REPO, env=env)


def snapshot(host) -> dict[str, str]:
    """sha256 of every regular file under the watched directories, and each unit's MainPID."""
    listing = host.check_output(f"find {' '.join(WATCHED)} -type f -exec sha256sum {{}} + 2>/dev/null | sort")
    pids = {unit: host.check_output(f"systemctl show -p MainPID --value {unit}") for unit in UNITS}
    return {"files": hashlib.sha256(listing.encode()).hexdigest(), **pids}


def test_drift_finds_a_hand_changed_file_and_changes_nothing(host):
    original = host.file(SYSCTL).content_string
    host.run_test(f"sed -i 's/^vm.swappiness.*/vm.swappiness = 60/' {SYSCTL}")
    changed = host.file(SYSCTL).content_string
    assert changed != original, "the test changes a managed setting by hand"
    before = snapshot(host)
    try:
        run = labctl("drift")
        after = snapshot(host)
        assert run.returncode == 5, run.stdout[-4000:] + run.stderr[-2000:]
        assert after == before, "labctl drift changed the host"
        assert host.file(SYSCTL).content_string == changed
        would = [line.strip()[2:] for line in run.stdout.splitlines() if line.startswith("    - ")]
        assert would and all("sysctl" in task.lower() or "kernel" in task.lower() for task in would), run.stdout
        prom = host.file("/var/lib/prometheus/node-exporter/labctl_drift.prom").content_string
        assert f'labctl_last_run_drift_tasks{{command="drift",inventory="inventory"}} {len(would)}' in prom
    finally:
        host.run_test(f"cat > {SYSCTL} <<'EOF'\n{original}EOF")
    assert host.file(SYSCTL).content_string == original


def test_smoke_passes_on_the_stack():
    run = labctl("smoke", "--json", timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    result = json.loads(run.stdout.splitlines()[-1])
    checks = {c["check"]: c for c in result["checks"]}
    assert set(checks) == {"replica vllm@0", "replica vllm@1", "gateway", "prometheus"}, checks
    assert all(str(c["ok"]).lower() == "true" for c in checks.values()), checks


def test_rolling_restart_of_one_replica(host):
    before = {unit: host.check_output(f"systemctl show -p MainPID --value {unit}") for unit in UNITS}
    run = labctl("rolling-restart", "--replica", "1", timeout=900)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    after = {unit: host.check_output(f"systemctl show -p MainPID --value {unit}") for unit in UNITS}
    assert after["vllm@1"] != before["vllm@1"]
    assert {u: p for u, p in after.items() if u != "vllm@1"} == {u: p for u, p in before.items() if u != "vllm@1"}
    status = subprocess.run(["labctl", "status", "--json"], capture_output=True, text=True, check=True,
                            env=dict(os.environ, LABCTL_STATE_DIR=str(STATE)))
    latest = json.loads(status.stdout)[0]
    assert latest["command"] == "rolling-restart" and latest["outcome"] == "ok"
