"""The control node's scheduled labctl runs (role control_node through playbooks/control-node.yml),
with the labctl test double (tests/fixtures/labctl-stub/labctl) at /opt/labctl/.venv/bin/labctl and
the settings of molecule/control_node/group_vars/all/10-scenario.yml (user labops, provision at boot,
notify command writing /tmp/notified, a webhook on 127.0.0.1:18089 where nothing listens by default)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
INVENTORY = "/opt/labctl/inventories/lab"
LABCTL = "/opt/labctl/.venv/bin/labctl"
USER = "labops"
STATE_DIR = "/home/labops/.local/state/labctl"
STUB_LOG = "/var/lib/labctl-stub/calls.log"
STUB_CONF = "/etc/labctl-stub"
NOTIFIED = "/tmp/notified"
NOTIFY_SCRIPT = "/usr/local/lib/labctl/labctl-notify"
NOTIFY_CONF = "/etc/labctl/notify.conf"
UNIT_DIR = "/etc/systemd/system"
UNITS = ("labctl-notify@.service", "labctl-drift.service", "labctl-drift.timer", "labctl-provision.service")
DRIFT = "labctl-drift.service"
NOTIFY = "labctl-notify@labctl-drift.service.service"
RUN_ID = "20261129T030000Z-drift-abc123"
# Everything the role writes: a refused run must leave each byte as it was.
MANAGED = [f"{UNIT_DIR}/{u}" for u in UNITS] + [NOTIFY_SCRIPT, NOTIFY_CONF]


def _show(host, unit: str, prop: str) -> str:
    return host.check_output(f"systemctl show {unit} --property {prop} --value")


def _journal(host, unit: str, lines: int = 40) -> str:
    return host.run(f"journalctl -u {unit} --no-pager -n {lines}").stdout


def _stub(host, **files: int) -> None:
    """/etc/labctl-stub/<name> (drift-exit, drift-sleep, status-age): absent means 0."""
    host.run_test(f"rm -f {STUB_CONF}/*")
    for name, value in files.items():
        host.run_test(f"echo {value} > {STUB_CONF}/{name.replace('_', '-')}")


def _fresh(host) -> None:
    """Forget earlier failures and notifications; the next start is the only one that counts."""
    host.run(f"systemctl reset-failed {DRIFT} {NOTIFY}")
    host.run_test(f"rm -f {NOTIFIED} /tmp/hook.json /tmp/hook.ready")
    host.run_test(f"install -o {USER} -g {USER} -m 0644 /dev/null {STUB_LOG}")


def _until(condition, what: str, timeout: float = 60) -> None:
    """Wait for ``condition`` by the clock, not by a count of tries: under load (make test runs two
    scenarios at once) each look into the container takes longer."""
    deadline = time.time() + timeout
    while not condition():
        if time.time() > deadline:
            pytest.fail(f"not within {timeout:.0f} s: {what}")
        time.sleep(0.25)


def _wait_for_notification(host, timeout: float = 60) -> None:
    """OnFailure= starts the notify unit after the failed one: wait until it ran to its end."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if host.file(NOTIFIED).exists and _show(host, NOTIFY, "ActiveState") in ("inactive", "failed"):
            return
        time.sleep(0.5)
    pytest.fail(f"no notification within {timeout:.0f} s:\n{_journal(host, NOTIFY)}\n{_journal(host, DRIFT)}")


def _notified(host) -> tuple[dict[str, str], dict]:
    """/tmp/notified: the command's LABCTL_* environment, then the JSON document from its stdin."""
    env_part, sep, stdin = host.file(NOTIFIED).content_string.partition("--- stdin\n")
    assert sep, host.file(NOTIFIED).content_string
    env = dict(line.split("=", 1) for line in env_part.splitlines() if "=" in line)
    return env, json.loads(stdin)


def _last_invocation(host, unit: str) -> str:
    """The journal of the unit's latest run only."""
    invocation = _show(host, unit, "InvocationID")
    return host.check_output(f"journalctl _SYSTEMD_INVOCATION_ID={invocation} --no-pager -o cat")


def _next_elapse(host) -> tuple[int, int]:
    text = _show(host, "labctl-drift.timer", "NextElapseUSecRealtime")
    match = re.search(r"\b(\d\d):(\d\d):\d\d\b", text)
    assert match, f"labctl-drift.timer has no next elapse: {text!r}"
    return int(match.group(1)), int(match.group(2))


def _snapshot(host) -> str:
    return host.check_output("sha256sum " + " ".join(MANAGED)) + _show(host, "labctl-drift.timer", "NextElapseUSecRealtime")


def _playbook(**extra: object) -> subprocess.CompletedProcess[str]:
    """playbooks/control-node.yml against the molecule host, with extra variables (-e, JSON)."""
    binary = shutil.which("ansible-playbook") or str(Path(sys.executable).parent / "ansible-playbook")
    cmd = [binary, "-i", os.environ["MOLECULE_INVENTORY_FILE"], str(REPO / "playbooks" / "control-node.yml"),
           "-e", json.dumps({"control_node_hosts": "all", **extra})]
    env = dict(os.environ, ANSIBLE_ROLES_PATH=str(REPO / "roles"), ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False, cwd=REPO, env=env)


def _recap(result: subprocess.CompletedProcess[str]) -> dict[str, int]:
    match = re.search(r"ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", result.stdout)
    assert match, result.stdout[-3000:] + result.stderr[-2000:]
    return dict(zip(("ok", "changed", "unreachable", "failed"), map(int, match.groups()), strict=True))


def test_units_script_and_settings_are_installed(host):
    for path in [f"{UNIT_DIR}/{u}" for u in UNITS]:
        unit = host.file(path)
        assert unit.is_file and unit.user == "root" and unit.group == "root" and unit.mode == 0o644, path
        assert unit.content_string.startswith("#"), f"{path}: no ansible_managed header"
    script = host.file(NOTIFY_SCRIPT)
    assert script.user == "root" and script.mode == 0o755
    conf = host.file(NOTIFY_CONF)
    assert conf.user == "root" and conf.group == USER and conf.mode == 0o640
    assert 'webhook="http://127.0.0.1:18089/labctl-hook"' in conf.content_string
    state = host.file(STATE_DIR)
    assert state.is_directory and state.user == USER and state.mode == 0o700
    # No provision schedule: no provision timer.
    assert not host.file(f"{UNIT_DIR}/labctl-provision.timer").exists
    # systemd reads them without a complaint.
    verify = host.run("systemd-analyze verify --man=no " + " ".join(f"{UNIT_DIR}/{u}" for u in UNITS[1:]))
    assert verify.rc == 0, verify.stdout + verify.stderr


def test_services_run_labctl_as_configured(host):
    drift = host.file(f"{UNIT_DIR}/labctl-drift.service").content_string
    for line in (f"ExecStart={LABCTL} drift -i {INVENTORY}", f"User={USER}", f"Environment=LABCTL_STATE_DIR={STATE_DIR}",
                 "WorkingDirectory=/opt/labctl", "TimeoutStartSec=2h", "Nice=10", "Type=oneshot",
                 "OnFailure=labctl-notify@%n.service"):
        assert line in drift.splitlines(), line
    provision = host.file(f"{UNIT_DIR}/labctl-provision.service").content_string
    assert f"ExecStart={LABCTL} provision -i {INVENTORY}" in provision.splitlines()
    assert "OnFailure=labctl-notify@%n.service" in provision.splitlines()
    # systemd's view agrees (the files are loaded, daemon-reload happened).
    assert _show(host, DRIFT, "User") == USER
    assert f"LABCTL_STATE_DIR={STATE_DIR}" in _show(host, DRIFT, "Environment")
    assert _show(host, DRIFT, "OnFailure") == "labctl-notify@labctl-drift.service.service"


def test_drift_timer_is_enabled_with_a_next_elapse(host):
    assert host.check_output("systemctl is-enabled labctl-drift.timer") == "enabled"
    assert host.check_output("systemctl is-active labctl-drift.timer") == "active"
    timer = host.file(f"{UNIT_DIR}/labctl-drift.timer").content_string.splitlines()
    assert "OnCalendar=*-*-* 03:30:00" in timer and "Persistent=true" in timer and "RandomizedDelaySec=15min" in timer
    listing = host.check_output("systemctl list-timers --all --no-pager labctl-drift.timer")
    line = next(line for line in listing.splitlines() if "labctl-drift.timer" in line)
    assert not line.startswith("n/a") and "labctl-drift.service" in line, listing
    hour, minute = _next_elapse(host)
    # 03:30 plus up to 15 minutes of randomized delay.
    assert hour == 3 and 30 <= minute <= 45, (hour, minute)


def test_provision_runs_after_boot_without_boot_waiting_for_it(host):
    assert host.check_output("systemctl is-enabled labctl-provision.service") == "enabled"
    assert "labctl-provision.service" in _show(host, "multi-user.target", "Wants").split()
    assert "labctl-provision.service" not in _show(host, "multi-user.target", "After").split()
    assert "network-online.target" in _show(host, "labctl-provision.service", "After").split()
    # Enabling did not start it: the converge ran no provision.
    assert _show(host, "labctl-provision.service", "ExecMainStartTimestampMonotonic") == "0"
    assert host.check_output("systemctl is-enabled labctl-drift.timer") == "enabled"


def test_provision_service_runs_labctl_provision(host):
    _fresh(host)
    _stub(host)
    host.run_test("systemctl start labctl-provision.service")
    assert _show(host, "labctl-provision.service", "Result") == "success"
    log = host.file(STUB_LOG).content_string
    assert f"argv=provision -i {INVENTORY} LABCTL_STATE_DIR={STATE_DIR} user={USER}" in log, log


def test_drift_without_drift_succeeds_and_notifies_nobody(host):
    _fresh(host)
    _stub(host, drift_exit=0)
    result = host.run(f"systemctl start {DRIFT}")
    assert result.rc == 0, result.stderr + _journal(host, DRIFT)
    assert _show(host, DRIFT, "Result") == "success"
    log = host.file(STUB_LOG).content_string
    assert f"argv=drift -i {INVENTORY} LABCTL_STATE_DIR={STATE_DIR} user={USER}" in log, log
    time.sleep(2)
    assert not host.file(NOTIFIED).exists
    assert "argv=status" not in host.file(STUB_LOG).content_string


def test_drift_found_fails_the_unit_and_notifies(host):
    _fresh(host)
    _stub(host, drift_exit=5)
    assert host.run(f"systemctl start {DRIFT}").rc != 0
    assert host.run(f"systemctl is-failed {DRIFT}").stdout.strip() == "failed"
    assert _show(host, DRIFT, "ExecMainStatus") == "5"
    _wait_for_notification(host)
    assert _show(host, NOTIFY, "Result") == "success", _journal(host, NOTIFY)
    env, document = _notified(host)
    assert env["LABCTL_UNIT"] == DRIFT
    assert env["LABCTL_OUTCOME"] == "drift"
    assert env["LABCTL_EXIT_CODE"] == "5"
    assert env["LABCTL_RUN_ID"] == RUN_ID
    assert env["LABCTL_SUMMARY"].startswith(f"{DRIFT} on ") and RUN_ID in env["LABCTL_SUMMARY"]
    assert "2 task(s) would change 1 host(s) (gpu-01)" in env["LABCTL_SUMMARY"], env["LABCTL_SUMMARY"]
    assert document["outcome"] == "drift" and document["exit_code"] == 5 and document["unit"] == DRIFT
    assert document["run_id"] == RUN_ID and document["record"]["id"] == RUN_ID
    assert document["record"]["changes"][0]["host"] == "gpu-01"
    assert document["summary"] == env["LABCTL_SUMMARY"]
    # The notification read the record with the runs' state directory, as the runs' user.
    assert f"argv=status --json -n 1 LABCTL_STATE_DIR={STATE_DIR} user={USER}" in host.file(STUB_LOG).content_string
    # The summary is in the journal at warning priority; the webhook (nothing listening) failed
    # without failing the unit.
    journal = _last_invocation(host, NOTIFY)
    assert env["LABCTL_SUMMARY"] in journal, journal
    assert "webhook http://127.0.0.1:18089: " in journal and "(not fatal)" in journal, journal
    warnings = host.check_output(f"journalctl _SYSTEMD_INVOCATION_ID={_show(host, NOTIFY, 'InvocationID')} -p warning -o cat")
    assert RUN_ID in warnings


HOOK = """
import http.server, pathlib, sys
class Hook(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        pathlib.Path(sys.argv[2]).write_text(self.headers["Content-Type"] + "\\n" + body.decode())
        self.send_response(204)
        self.end_headers()
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Hook)
server.timeout = 120
pathlib.Path("/tmp/hook.ready").touch()
server.handle_request()
"""


def test_webhook_gets_the_json_document(host):
    _fresh(host)
    _stub(host, drift_exit=5)
    host.run_test("cat > /tmp/hook.py <<'EOF'\n" + HOOK + "\nEOF")
    host.run("systemctl stop labctl-test-hook.service")
    host.run_test("systemd-run --unit labctl-test-hook --collect python3 /tmp/hook.py 18089 /tmp/hook.json")
    try:
        _until(lambda: host.file("/tmp/hook.ready").exists, "the webhook listens")
        assert host.run(f"systemctl start {DRIFT}").rc != 0
        _wait_for_notification(host)
        _until(lambda: host.file("/tmp/hook.json").exists, "the webhook got the document")
        content_type, _, body = host.file("/tmp/hook.json").content_string.partition("\n")
        assert content_type == "application/json"
        document = json.loads(body)
        assert document["outcome"] == "drift" and document["run_id"] == RUN_ID and document["unit"] == DRIFT
        assert "webhook http://127.0.0.1:18089: HTTP 204" in _last_invocation(host, NOTIFY)
    finally:
        host.run("systemctl stop labctl-test-hook.service")


def test_run_without_a_record_of_its_own_is_reported_from_its_exit_code(host):
    """Refused by the inventory's lock, labctl writes no record: the latest one (an hour old) is
    another run's and must not be reported as this one."""
    _fresh(host)
    _stub(host, drift_exit=4, status_age=3600)
    assert host.run(f"systemctl start {DRIFT}").rc != 0
    _wait_for_notification(host)
    env, document = _notified(host)
    assert env["LABCTL_OUTCOME"] == "refused" and env["LABCTL_EXIT_CODE"] == "4"
    assert env["LABCTL_RUN_ID"] == "" and document["record"] is None
    assert "no run record for this start" in env["LABCTL_SUMMARY"], env["LABCTL_SUMMARY"]


def test_changed_schedule_restarts_the_timer_not_a_running_run(host):
    _fresh(host)
    _stub(host, drift_exit=0, drift_sleep=300)
    host.run_test(f"systemctl start --no-block {DRIFT}")
    _until(lambda: _show(host, DRIFT, "ActiveState") == "activating", f"{DRIFT} is running")
    pid = _show(host, DRIFT, "MainPID")
    assert pid != "0"
    try:
        result = _playbook(control_node_drift_schedule="*-*-* 05:10:00", control_node_timeout="3h")
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
        assert _recap(result)["changed"] > 0
        # The run goes on; the timer has the new schedule; the next start gets the new timeout.
        assert _show(host, DRIFT, "ActiveState") == "activating" and _show(host, DRIFT, "MainPID") == pid
        hour, minute = _next_elapse(host)
        assert hour == 5 and 10 <= minute <= 25, (hour, minute)
        assert "TimeoutStartSec=3h" in host.file(f"{UNIT_DIR}/labctl-drift.service").content_string
    finally:
        restored = _playbook()
        host.run(f"systemctl stop {DRIFT}")
        host.run(f"systemctl reset-failed {DRIFT} {NOTIFY}")
        _stub(host)
    assert restored.returncode == 0, restored.stdout[-3000:] + restored.stderr[-2000:]
    assert _next_elapse(host)[0] == 3
    assert "TimeoutStartSec=2h" in host.file(f"{UNIT_DIR}/labctl-drift.service").content_string


@pytest.mark.parametrize(("extra", "named"), [
    ({"control_node_inventory": "/nonexistent/inventory"}, "control_node_inventory: /nonexistent/inventory does not exist"),
    ({"control_node_inventory": "inventories/lab"}, "control_node_inventory must be the absolute path"),
    ({"control_node_drift_schedule": "nightly at three"},
     "control_node_drift_schedule: 'nightly at three' is not a systemd calendar event"),
    ({"control_node_labctl": "/opt/labctl/inventories/lab/hosts.yml"},
     "control_node_labctl: /opt/labctl/inventories/lab/hosts.yml is not an executable"),
    ({"control_node_user": "nosuchuser"}, "control_node_user: no user nosuchuser"),
    ({"control_node_timeout": "two hours"}, "control_node_timeout: 'two hours' is not a systemd time span"),
    ({"control_node_user": "root"}, "control_node_user=root is root: the runs would execute the checkout's code"),
], ids=["inventory-missing", "inventory-relative", "schedule", "labctl", "user", "timeout", "root"])
def test_bad_input_is_refused_before_anything_changes(host, extra, named):
    before = _snapshot(host)
    # Valid changes next to the bad value: had the role gone on, these files would differ.
    result = _playbook(control_node_provision_schedule="Sun *-*-* 04:00:00", control_node_notify_command="true",
                       control_node_randomized_delay="1min", **extra)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output[-3000:]
    assert named in output, output[-3000:]
    recap = _recap(result)
    assert recap["changed"] == 0 and recap["failed"] == 1, recap
    assert _snapshot(host) == before
    assert not host.file(f"{UNIT_DIR}/labctl-provision.timer").exists


@pytest.mark.parametrize(("setup", "named"), [
    ("install -o labops -m 0644 /dev/null /opt/labctl/site.yml.labops", "/opt/labctl/site.yml.labops labops 644"),
    ("chmod 0777 /opt/labctl/.venv/bin", "/opt/labctl/.venv/bin root 777"),
], ids=["file-of-the-runs-user", "world-writable-venv"])
def test_a_checkout_others_can_change_is_refused(host, setup, named):
    """The runs' user (or anyone) able to change the checkout or the virtualenv could change what
    the runs execute: refused before anything changes, naming the path."""
    before = _snapshot(host)
    host.run_test(setup)
    try:
        result = _playbook(control_node_provision_schedule="Sun *-*-* 04:00:00")
    finally:
        host.run_test("rm -f /opt/labctl/site.yml.labops && chmod 0755 /opt/labctl/.venv/bin")
    output = result.stdout + result.stderr
    assert result.returncode != 0 and named in output and "could change what the runs execute" in output, output[-3000:]
    assert _recap(result)["changed"] == 0
    assert _snapshot(host) == before
