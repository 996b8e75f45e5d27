"""Faults on the provisioned stack under a steady request stream (tests/traffic.py): a vLLM
replica killed with SIGKILL, PostgreSQL restarted. No client request may fail.

Runs after test_stack.py and before test_stack_monitoring.py (file order): this test waits
until the alert the kill fires has resolved.
"""

from __future__ import annotations

import json
import time

import pytest
from test_stack import REPLICAS, _py, _report, _traffic  # same directory

PROM = "http://127.0.0.1:9090"
# vllm@.service: RestartSec=30 (vllm_restart_sec), then a warm start of the tiny model on CPU.
BACK_WITHIN_S = 300


def _unit(host, unit: str, *props: str) -> dict[str, str]:
    out = host.check_output(f"systemctl show -p {','.join(props)} {unit}")
    return dict(line.split("=", 1) for line in out.splitlines())


def _healthy(host, url: str) -> bool:
    return host.run(f"python3 -c \"import urllib.request as u; u.urlopen('{url}/health', timeout=2)\"").rc == 0


def _replica_down_alerts(host, replica: str) -> list[str]:
    """States (pending, firing) of VllmReplicaDown for one replica, as Prometheus has them now."""
    alerts = json.loads(_py(host, "import urllib.request; "
                                  f"print(urllib.request.urlopen({PROM + '/api/v1/alerts'!r}, timeout=10).read().decode())"))
    return [a["state"] for a in alerts["data"]["alerts"]
            if a["labels"].get("alertname") == "VllmReplicaDown" and a["labels"].get("replica") == replica]


def test_a_killed_replica_is_restarted_by_systemd_while_requests_succeed(host):
    unit = "vllm@0"
    before = _unit(host, unit, "MainPID", "NRestarts")
    others = {u: _unit(host, u, "MainPID")["MainPID"] for u in ("vllm@1", "litellm")}
    states: set[str] = set()
    with _traffic(host, "kill") as traffic:
        killed = time.monotonic()
        host.run_test(f"kill -9 {before['MainPID']}")
        back = None
        while time.monotonic() - killed < BACK_WITHIN_S:
            states.update(_replica_down_alerts(host, "0"))
            now = _unit(host, unit, "MainPID", "NRestarts", "ActiveState")
            if now["MainPID"] not in ("0", before["MainPID"]) and now["ActiveState"] == "active" and _healthy(host, REPLICAS[0]):
                back = time.monotonic() - killed
                break
            time.sleep(2)
        assert back is not None, f"{unit} did not serve again within {BACK_WITHIN_S} s: {now}"
        # The alert the kill raised must resolve once the replica is scraped again, before the
        # monitoring tests (which expect only ProvisioningDriftDetected to fire).
        resolved = None
        while time.monotonic() - killed < back + 120:
            current = _replica_down_alerts(host, "0")
            states.update(current)
            if not current:
                resolved = time.monotonic() - killed
                break
            time.sleep(3)
        time.sleep(5)  # requests reach the restarted replica again (cooldown is 15 s)
    after = _unit(host, unit, "MainPID", "NRestarts")
    down_polls = sum(1 for _, up in traffic["health"] if not up[0])
    _report(kill_replica={"back_s": round(back, 1), "alert_states": sorted(states), "alert_resolved_s": resolved,
                          "requests_ok": traffic["ok"], "streamed_ok": traffic["ok_streamed"],
                          "requests_failed": len(traffic["failed"]), "polls_replica_0_down": down_polls})
    print(f"vllm@0 killed: serving again after {back:.1f} s; VllmReplicaDown {sorted(states)}, "
          f"gone after {resolved} s; {traffic['ok']} requests ok, {len(traffic['failed'])} failed")
    # systemd restarted it (not a test step): one more restart, a new main process.
    assert int(after["NRestarts"]) == int(before["NRestarts"]) + 1, (before, after)
    assert after["MainPID"] != before["MainPID"]
    assert {u: _unit(host, u, "MainPID")["MainPID"] for u in others} == others
    # The replica was down for a while, the other one never was, and no request failed.
    assert down_polls > 10 and traffic["both_down"] == 0
    assert traffic["failed"] == [] and traffic["ok"] > 20 and traffic["ok_streamed"] > 10, traffic["failed"][:5]
    # Prometheus noticed: VllmReplicaDown went pending (firing once the outage outlasts its
    # `for: 1m`), and it has resolved.
    assert states & {"pending", "firing"}, "VllmReplicaDown never became active for replica 0"
    assert resolved is not None, "VllmReplicaDown for replica 0 still active 2 minutes after the restart"
    # The gateway's readiness routing dropped the dead replica at once (refused) and took it
    # back when it answered /health again (labctl_readiness.py, one line per worker).
    log = host.check_output(f"journalctl -u litellm --since '-{int(time.monotonic() - killed) + 30}s' -o cat")
    assert f"replica {REPLICAS[0]}/v1 is not ready (down)" in log, log[-2000:]
    assert f"replica {REPLICAS[0]}/v1 is ready" in log, log[-2000:]


@pytest.mark.extended  # the gateway has no database here
def test_postgres_restart_leaves_the_gateway_unaffected(host):
    """The sandbox runs LiteLLM without database mode: a PostgreSQL restart must not touch it."""
    litellm = _unit(host, "litellm", "MainPID")["MainPID"]
    cluster = "postgresql@15-main"
    before = _unit(host, cluster, "MainPID")["MainPID"]
    with _traffic(host, "postgres") as traffic:
        time.sleep(3)
        host.run_test(f"systemctl restart {cluster}")
        for _ in range(60):
            if host.run("pg_isready -h 127.0.0.1 -p 5432").rc == 0:
                break
            time.sleep(1)
        time.sleep(5)
    _report(postgres_restart={"requests_ok": traffic["ok"], "requests_failed": len(traffic["failed"])})
    assert _unit(host, cluster, "MainPID")["MainPID"] != before
    assert host.run("pg_isready -h 127.0.0.1 -p 5432").rc == 0
    assert _unit(host, "litellm", "MainPID")["MainPID"] == litellm
    assert traffic["failed"] == [] and traffic["ok"] > 5, traffic["failed"][:5]
