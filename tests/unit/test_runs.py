"""labctl provision / drift / status / runs show: real ansible-runner runs against this machine
(connection local) with small playbooks, so locking, records, exit codes, signals and the
textfile are exercised end to end in seconds. (The sandbox container runs are in molecule.)"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from labctl.runs.exitcodes import Exit
from labctl.runs.lock import InventoryLock, LockHeld, lock_path
from labctl.runs.playbook import _Collector, _outcome, summary_lines
from labctl.runs.records import HostStats, Record, RecordStore, TaskNote

LABCTL = str(Path(sys.executable).parent / "labctl")
SECRET = "sk-labctl-test-secret-4f9a8b7c6d5e"


@pytest.fixture
def lab(tmp_path: Path) -> dict[str, Path]:
    inventory = tmp_path / "inventories" / "unitlab"
    inventory.mkdir(parents=True)
    textfiles = tmp_path / "textfile"
    (inventory / "hosts.yml").write_text(json.dumps({"all": {"children": {"lab": {"hosts": {"local1": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable,
        "node_exporter_textfile_dir": str(textfiles)}}}}}}))
    target = tmp_path / "managed.conf"
    playbook = tmp_path / "site.yml"
    playbook.write_text(f"""
- name: A small site
  hosts: lab
  gather_facts: false
  vars:
    secret: {SECRET}
    should_fail: false
    pause_seconds: 0
  tasks:
    - name: Write the managed file
      ansible.builtin.copy:
        content: "managed by the test\\n"
        dest: {target}
        mode: "0644"
    - name: Use a secret
      ansible.builtin.command: echo {{{{ secret }}}}
      no_log: true
      changed_when: false
    - name: Wait when asked
      ansible.builtin.command: sleep {{{{ pause_seconds }}}}
      changed_when: false
      when: pause_seconds | int > 0
    - name: Fail when asked
      ansible.builtin.fail:
        msg: the test asked this task to fail
      when: should_fail | bool
    - name: Show what was given
      ansible.builtin.debug:
        msg: "GIVEN[{{{{ greeting | default('') }}}}][{{{{ vaulted | default('') }}}}]"
""")
    return {"inventory": inventory, "playbook": playbook, "target": target, "textfiles": textfiles,
            "state": tmp_path / "state"}


def labctl(lab: dict[str, Path], *args: str, timeout: int = 240) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, LABCTL_STATE_DIR=str(lab["state"]))
    return subprocess.run([LABCTL, *args, "-i", str(lab["inventory"]), "--playbook", str(lab["playbook"])],
                          capture_output=True, text=True, env=env, timeout=timeout, check=False)


def records(lab: dict[str, Path]) -> list[Record]:
    return RecordStore(lab["state"]).latest(100)


def prom(path: Path) -> dict[str, float]:
    values = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            name, value = line.split("{")[0], line.rsplit(" ", 1)[1]
            values[name] = float(value)
    return values


def test_provision_records_the_run_and_writes_the_textfile(lab: dict[str, Path]) -> None:
    run = labctl(lab, "provision")
    assert run.returncode == Exit.OK, run.stdout + run.stderr
    assert "labctl provision: ok in" in run.stdout and "local1: ok=" in run.stdout
    (record,) = records(lab)
    assert record.outcome == "ok" and record.exit_code == 0
    assert record.hosts["local1"].changed == 1
    assert record.revision and record.argv[:2] == ["labctl", "provision"]
    metrics = prom(lab["textfiles"] / "labctl_provision.prom")
    assert metrics["labctl_last_run_success"] == 1
    assert metrics["labctl_last_run_changed_tasks"] == 1
    assert metrics["labctl_last_run_failed_tasks"] == 0
    assert metrics["labctl_last_run_drift_tasks"] == 0
    assert abs(metrics["labctl_last_run_timestamp_seconds"] - time.time()) < 120
    assert 'command="provision",inventory="unitlab"' in (lab["textfiles"] / "labctl_provision.prom").read_text()
    # The secret of the no_log task is nowhere in the record (events, runner artifacts).
    for path in (lab["state"] / "runs").rglob("*"):
        if path.is_file():
            assert SECRET not in path.read_text(errors="replace"), path


def test_drift_lists_the_hand_changed_file_and_changes_nothing(lab: dict[str, Path]) -> None:
    assert labctl(lab, "provision").returncode == Exit.OK
    clean = labctl(lab, "drift")
    assert clean.returncode == Exit.OK, clean.stdout + clean.stderr
    lab["target"].write_text("changed by hand\n")
    before = lab["target"].stat()
    run = labctl(lab, "drift")
    assert run.returncode == Exit.DRIFT, run.stdout + run.stderr
    assert "local1 would change (1):" in run.stdout and "- Write the managed file" in run.stdout
    assert lab["target"].read_text() == "changed by hand\n"
    assert lab["target"].stat().st_mtime_ns == before.st_mtime_ns
    metrics = prom(lab["textfiles"] / "labctl_drift.prom")
    assert metrics["labctl_last_run_drift_tasks"] == 1 and metrics["labctl_last_run_success"] == 1
    assert prom(lab["textfiles"] / "labctl_provision.prom")["labctl_last_run_success"] == 1  # one file per command


def test_failed_task_exit_code_and_runs_show(lab: dict[str, Path]) -> None:
    run = labctl(lab, "provision", "-e", "should_fail=true")
    assert run.returncode == Exit.FAILED
    (record,) = records(lab)
    assert record.outcome == "failed"
    assert [(f.host, f.task, f.message) for f in record.failures] == [
        ("local1", "Fail when asked", "the test asked this task to fail")]
    env = dict(os.environ, LABCTL_STATE_DIR=str(lab["state"]))
    shown = subprocess.run([LABCTL, "runs", "show", record.id], capture_output=True, text=True, env=env, check=False)
    assert shown.returncode == 0
    assert "FAILED local1: Fail when asked: the test asked this task to fail" in shown.stdout
    status = subprocess.run([LABCTL, "status", "--json"], capture_output=True, text=True, env=env, check=False)
    assert json.loads(status.stdout)[0]["outcome"] == "failed"
    assert prom(lab["textfiles"] / "labctl_provision.prom")["labctl_last_run_success"] == 0


def test_unreachable_host_exit_code(lab: dict[str, Path]) -> None:
    (lab["inventory"] / "hosts.yml").write_text(json.dumps({"all": {"children": {"lab": {"hosts": {"gone": {
        "ansible_host": "127.0.0.1", "ansible_port": 1, "ansible_connection": "ssh",
        "ansible_ssh_common_args": "-o ConnectTimeout=3 -o StrictHostKeyChecking=no"}}}}}}))
    run = labctl(lab, "provision")
    assert run.returncode == Exit.UNREACHABLE, run.stdout + run.stderr
    assert records(lab)[0].outcome == "unreachable"


def test_json_output_is_one_object_per_line(lab: dict[str, Path]) -> None:
    run = labctl(lab, "provision", "--json")
    assert run.returncode == 0
    lines = [json.loads(line) for line in run.stdout.splitlines()]
    kinds = [line["event"] for line in lines]
    assert kinds[0] == "playbook_on_play_start" and kinds[-1] == "summary"
    assert {"host": "local1", "task": "Write the managed file"}.items() <= next(
        line for line in lines if line["event"] == "runner_on_ok").items()


def _wait_for(path_glob: Path, pattern: str, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        for events in path_glob.glob("runs/*/events.jsonl"):
            if pattern in events.read_text():
                return
        time.sleep(0.3)
    raise AssertionError(f"{pattern!r} never appeared in the events")


def test_a_second_run_is_refused_and_names_the_holder(lab: dict[str, Path]) -> None:
    env = dict(os.environ, LABCTL_STATE_DIR=str(lab["state"]))
    first = subprocess.Popen([LABCTL, "provision", "-i", str(lab["inventory"]), "--playbook", str(lab["playbook"]),
                              "-e", "pause_seconds=20"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lab["state"], "Wait when asked")
        second = labctl(lab, "drift")
        assert second.returncode == Exit.REFUSED
        assert f"PID {first.pid}" in second.stderr and "labctl provision" in second.stderr
    finally:
        first.wait(timeout=120)
    assert first.returncode == 0
    assert labctl(lab, "drift").returncode == Exit.OK  # released


def test_sigterm_interrupts_records_and_releases_the_lock(lab: dict[str, Path]) -> None:
    env = dict(os.environ, LABCTL_STATE_DIR=str(lab["state"]))
    run = subprocess.Popen([LABCTL, "provision", "-i", str(lab["inventory"]), "--playbook", str(lab["playbook"]),
                            "-e", "pause_seconds=60"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    launched = time.time()
    _wait_for(lab["state"], "Wait when asked")
    started = time.time()
    status = [line for line in Path(f"/proc/{run.pid}/status").read_text().splitlines()
              if line.startswith(("SigCgt", "SigBlk", "SigIgn", "State"))]
    run.send_signal(signal.SIGTERM)
    out, err = run.communicate(timeout=90)
    # events.jsonl is written as the run goes (line-buffered): the 60 s task was seen while it ran.
    assert run.returncode == Exit.INTERRUPTED, (status, time.time() - started, out[-2000:], err[-2000:])
    assert time.time() - launched < 45, "the task showed in events.jsonl as it started, and the run stopped well before its 60 s"
    (record,) = records(lab)
    assert record.outcome == "interrupted" and record.ended is not None
    assert prom(lab["textfiles"] / "labctl_provision.prom")["labctl_last_run_success"] == 0
    assert labctl(lab, "provision").returncode == Exit.OK  # the lock is free again


def test_a_dead_holders_lock_is_taken_over(lab: dict[str, Path]) -> None:
    path = lock_path(lab["state"], lab["inventory"])
    proc = subprocess.Popen(["true"])
    proc.wait()
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"pid": proc.pid, "host": "control", "started": time.time() - 3600,
                                "command": "labctl provision -i inventories/lab"}))
    run = labctl(lab, "provision")
    assert run.returncode == Exit.OK, run.stderr
    assert f"took over the lock of an earlier run that did not finish (PID {proc.pid}, no longer running" in run.stderr
    assert json.loads(path.read_text())["released"]


def test_lock_is_exclusive_within_and_across_processes(tmp_path: Path) -> None:
    path = tmp_path / "locks" / "x.lock"
    with InventoryLock(path, "first"), pytest.raises(LockHeld, match=f"PID {os.getpid()}.*: first"):
        InventoryLock(path, "second").__enter__()
    with InventoryLock(path, "third") as again:
        assert again.previous is None  # the first released it properly


def test_outcome_rules() -> None:
    def record(command: str = "provision", **kw: object) -> Record:
        return Record(id="x", command=command, argv=[], inventory="", revision="", started=0, **kw)  # type: ignore[arg-type]

    assert _outcome(record(), "successful", False) == "ok"
    assert _outcome(record(), "successful", True) == "interrupted"
    assert _outcome(record(failures=[TaskNote("h", "t", "m", "preflight")]), "failed", False) == "refused"
    assert _outcome(record(failures=[TaskNote("h", "t", "m", "preflight"), TaskNote("h", "u", "m", "vllm")]),
                    "failed", False) == "failed"
    assert _outcome(record(hosts={"h": HostStats(unreachable=1)}), "failed", False) == "unreachable"
    assert _outcome(record("drift", changes=[TaskNote("h", "t")]), "successful", False) == "drift"
    assert _outcome(record("drift"), "successful", False) == "ok"
    assert _outcome(record(), "failed", False) == "failed"  # e.g. a syntax error: no task failed


def test_drift_names_the_files_a_many_file_task_would_change() -> None:
    """labctl_template's files: one task writes a role's files; drift names those that differ."""
    import io

    class Quiet:
        def event(self, event: object) -> None:
            pass

    record = Record(id="x", command="drift", argv=[], inventory="", revision="", started=0)
    collect = _Collector(record, io.StringIO(), Quiet())  # type: ignore[arg-type]
    for res in ({"changed": True, "changed_files": ["/etc/labctl/vllm/replica-1.yaml", "/etc/labctl/vllm/replica-1.env"]},
                {"changed": True}, {"changed": True, "censored": "no_log"}, {"changed": False, "changed_files": []}):
        collect({"event": "runner_on_ok", "event_data": {"host": "gpu1", "task": "Write", "role": "vllm", "res": res}})
    lines = summary_lines(record)
    assert "  gpu1 would change (3):" in lines
    assert "    - Write (/etc/labctl/vllm/replica-1.yaml, /etc/labctl/vllm/replica-1.env)" in lines
    assert lines.count("    - Write") == 2


def test_old_records_are_pruned(tmp_path: Path) -> None:
    store = RecordStore(tmp_path, keep_days=30)
    record, path = store.create("provision", ["labctl"], tmp_path, False)
    old = time.time() - 31 * 86400
    os.utime(path / "record.json", (old, old))
    fresh, _ = store.create("drift", ["labctl"], tmp_path, True)
    assert store.prune() == [record.id]
    assert [r.id for r in store.latest(10)] == [fresh.id]


def test_extra_vars_vault_files_and_verbosity_reach_ansible_as_given(lab: dict[str, Path], tmp_path: Path) -> None:
    """-e with a quoted value and a vault-encrypted @file, --vault-password-file and -v, as
    ansible-playbook takes them (labctl used to split key=value on spaces and read @file as YAML)."""
    password = tmp_path / "vault-pass"
    password.write_text("unit-test-vault-password\n")
    vars_file = tmp_path / "secret-vars.yml"
    vars_file.write_text("vaulted: from the vault\n")
    ansible_vault = str(Path(sys.executable).parent / "ansible-vault")
    subprocess.run([ansible_vault, "encrypt", "--vault-password-file", str(password), str(vars_file)], check=True,
                   capture_output=True)
    assert vars_file.read_text().startswith("$ANSIBLE_VAULT;")
    run = labctl(lab, "provision", "--json", "-e", "greeting='hello lab'", "-e", f"@{vars_file}",
                 "--vault-password-file", str(password), "-vv")
    assert run.returncode == Exit.OK, run.stdout + run.stderr
    (record,) = records(lab)
    runner = lab["state"] / "runs" / record.id / "runner"
    assert "GIVEN[hello lab][from the vault]" in next(runner.rglob("stdout")).read_text()
    command = json.loads(next(runner.rglob("command")).read_text())["command"]
    assert "-vv" in command and "--vault-password-file" in command
    # Without the password the encrypted file is refused by ansible-playbook, before any task.
    refused = labctl(lab, "provision", "-e", f"@{vars_file}")
    assert refused.returncode == Exit.FAILED and "vault" in (refused.stdout + refused.stderr).lower()
    missing = labctl(lab, "provision", "-e", f"@{tmp_path / 'nope.yml'}")
    assert missing.returncode == Exit.USAGE and "nope.yml: no such file" in missing.stderr


def test_extra_vars_secrets_are_kept_nowhere_in_the_state_directory(lab: dict[str, Path]) -> None:
    """Issue 29, item 5: a secret given with -e (key=value, JSON, --extra-vars=) reaches the play,
    and no file under the state directory keeps it: not the record, the lock, events.jsonl, nor
    what ansible-runner 2.4.3 writes into its private data directory (env/cmdline and
    env/extravars from utils.dump_artifacts, artifacts/<id>/command from Runner.run, job_events/,
    stdout), at ansible-playbook's highest verbosity. Names stay; values do not."""
    secrets_given = {name: f"sk-SECRET-{name}-{os.urandom(8).hex()}"
                     for name in ("lab_litellm_master_key", "lab_json_token", "lab_equals_token")}
    checks = "\n".join(f"          - {name} | hash('sha256') == '{hashlib.sha256(value.encode()).hexdigest()}'"
                       for name, value in secrets_given.items())
    lab["playbook"].write_text(f"""
- name: Secrets given with -e
  hosts: lab
  gather_facts: false
  tasks:
    - name: Each secret arrived as given
      ansible.builtin.assert:
        that:
{checks}
        quiet: true
""")
    run = labctl(lab, "provision", "--json", "-vvvv",
                 "-e", f"lab_litellm_master_key={secrets_given['lab_litellm_master_key']}",
                 "-e", json.dumps({"lab_json_token": secrets_given["lab_json_token"]}),
                 f"--extra-vars=lab_equals_token={secrets_given['lab_equals_token']}")
    assert run.returncode == Exit.OK, run.stdout[-3000:] + run.stderr[-3000:]
    (record,) = records(lab)
    assert record.hosts["local1"].ok == 1 and not record.failures
    assert "lab_litellm_master_key=<redacted>" in " ".join(record.argv)
    # ansible-playbook quotes an -e it cannot use whole in its error ("Invalid extra vars data
    # supplied. '...' could not be made into a dictionary"): the record's message quotes that output.
    secrets_given["not_a_mapping"] = f"sk-SECRET-list-{os.urandom(8).hex()}"
    refused = labctl(lab, "provision", "-e", f'["{secrets_given["not_a_mapping"]}"]')
    assert refused.returncode == Exit.FAILED, refused.stdout[-3000:] + refused.stderr[-3000:]
    assert "could not be made into a dictionary" in records(lab)[0].message
    kept = [path for path in lab["state"].rglob("*") if path.is_file()]
    assert any(path.name == "command" for path in kept) and any(path.name == "stdout" for path in kept)
    for path in kept:
        text = path.read_text(errors="replace")
        for name, value in secrets_given.items():
            assert value not in text, f"{path.relative_to(lab['state'])} keeps the value of {name}"
    # The -vvvv dump of ansible-playbook's options still names the variables.
    assert "extra_vars: ('lab_litellm_master_key=<redacted>'" in next((lab["state"] / "runs" / record.id).rglob("stdout")).read_text()
