#!/usr/bin/env python3
"""Benchmark (not a test): the no-op re-run of site.yml over SSH, the lab's connection, with and without
the one-call file plugins (labctl_template, labctl_directories), and with Mitogen.

Usage: python3 scripts/bench-ssh.py   (make bench-ssh)

In one run:
  1. an image with sshd: the base image plus Debian's openssh-server (installed once from the Debian
     mirror in a throw-away container, committed as labctl/bench-ssh:<base tag>);
  2. a systemd container of it on an internal Docker network (no route out), root's authorized_keys
     holding a key generated for the run;
  3. site.yml over SSH (ControlPersist 60 s, pipelining on: ansible.cfg) for the first converge;
  4. the no-op re-run, ROUNDS times each, variants interleaved so that drift in the machine's load hits
     all alike: "plugins" (as shipped), "builtin" (LABCTL_FILE_ACTIONS=builtin: every file task takes
     ansible.builtin.template/copy/file's own path) and, when it imports, "mitogen" (Mitogen's
     mitogen_linear strategy, from the PyPI wheel unpacked under build/, plugins as shipped) and
     "mitogen-builtin" (Mitogen with the builtin path). Each re-run must report changed=0;
  5. one more re-run per variant with the json callback (ansible.posix.json): the tasks that ran and
     their wall time by action, so the share of the file tasks (what "fewer tasks" could save) shows.
Writes build/bench-ssh.json and prints a table: median seconds per variant and ratios against "plugins".

Environment: BENCH_SSH_NAME (labctl-benchssh), BENCH_ROUNDS (3), BENCH_KEEP=1 keeps the container,
BENCH_RERUN_ONLY=1 re-uses a kept converged container, MITOGEN_VERSION (0.3.54),
LABCTL_BUNDLE / LABCTL_BUNDLE_FINGERPRINT (the Makefile sets them: the test bundle).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
NAME = os.environ.get("BENCH_SSH_NAME", "labctl-benchssh")
NETWORK = f"{NAME}-net"
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
KEEP = os.environ.get("BENCH_KEEP") == "1"
RERUN_ONLY = os.environ.get("BENCH_RERUN_ONLY") == "1"
MITOGEN_VERSION = os.environ.get("MITOGEN_VERSION", "0.3.54")
WORK = REPO / "build" / "bench-ssh"
INVENTORY_DIR = WORK / "inventory"
OUT = REPO / "build" / "bench-ssh.json"
BIN = Path(sys.executable).parent
RECAP = re.compile(r"^(?P<host>\S+)\s+:\s+ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)\s+unreachable=(?P<unreachable>\d+)"
                   r"\s+failed=(?P<failed>\d+)")
# The tasks the one-call plugins serve, and the builtins the same tasks become without them.
FILE_ACTIONS = frozenset(("labctl_template", "labctl_directories", "ansible.builtin.template", "ansible.builtin.copy",
                          "ansible.builtin.file", "template", "copy", "file"))
RUN_OPTS = ["--cap-add", "SYS_ADMIN", "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
            "--cgroupns", "host", "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw", "--tmpfs", "/run", "--tmpfs", "/run/lock"]


def log(text: str) -> None:
    print(f"bench-ssh: {text}", file=sys.stderr, flush=True)


def sh(*args: str, check: bool = True, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), check=check, capture_output=True, text=True, **kw)


def image() -> str:
    """labctl/bench-ssh:<base tag>: the base image with openssh-server, built once."""
    base = sh(str(REPO / "scripts" / "build-base-image.sh")).stdout.strip().splitlines()[-1]
    tag = "labctl/bench-ssh:" + base.split(":", 1)[1]
    if sh("docker", "image", "inspect", tag, check=False).returncode == 0:
        return tag
    log(f"building {tag} (openssh-server from the Debian mirror)")
    builder = f"{NAME}-build"
    sh("docker", "rm", "-f", builder, check=False)
    sh("docker", "run", "--name", builder, base, "bash", "-c",
       "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server >/dev/null"
       " && systemctl enable ssh && rm -f /etc/ssh/ssh_host_*")
    # docker commit would keep the build's bash as the command: give the image back systemd as PID 1.
    sh("docker", "commit", "--change", 'CMD ["/lib/systemd/systemd"]', "--change", "ENV container=docker", builder, tag)
    sh("docker", "rm", "-f", builder)
    return tag


def up(tag: str, key: Path) -> str:
    """The container on an internal network; its address."""
    sh("docker", "rm", "-f", NAME, check=False)
    if sh("docker", "network", "inspect", NETWORK, check=False).returncode != 0:
        sh("docker", "network", "create", "--internal", NETWORK)
    sh("docker", "run", "-d", "--name", NAME, "--hostname", NAME, "--network", NETWORK, *RUN_OPTS, tag)
    for _ in range(60):
        state = sh("docker", "exec", NAME, "systemctl", "is-system-running", check=False).stdout.strip()
        if state in ("running", "degraded"):
            break
        time.sleep(1)
    # The image has no host keys (removed at build): sshd failed at boot; make them and start it.
    for _ in range(20):
        started = sh("docker", "exec", NAME, "bash", "-c", "ssh-keygen -A >/dev/null && mkdir -p -m 700 /root/.ssh"
                     " && systemctl reset-failed ssh; systemctl restart ssh && systemctl is-active ssh", check=False)
        if started.returncode == 0:
            break
        time.sleep(2)
    else:
        raise SystemExit(f"bench-ssh: sshd did not start in {NAME}: {started.stdout}{started.stderr}")
    sh("docker", "exec", "-i", NAME, "bash", "-c", "cat > /root/.ssh/authorized_keys && chmod 600 /root/.ssh/authorized_keys",
       input=Path(str(key) + ".pub").read_text())
    return sh("docker", "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", NAME).stdout.strip()


def write_inventory(address: str, key: Path) -> Path:
    """inventories/sandbox's variables, the host reached over SSH."""
    shutil.rmtree(INVENTORY_DIR, ignore_errors=True)
    shutil.copytree(REPO / "inventories" / "sandbox" / "group_vars", INVENTORY_DIR / "group_vars", symlinks=False)
    hosts = {"all": {"children": {"lab": {"children": {g: {"hosts": {NAME: None}} for g in
                                                         ("gpu_hosts", "gateway_hosts", "monitoring_hosts")}}},
                     "vars": {"ansible_connection": "ssh", "ansible_host": address, "ansible_user": "root",
                              "ansible_ssh_private_key_file": str(key), "ansible_python_interpreter": "/usr/bin/python3",
                              "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null"
                                                         " -o ControlMaster=auto -o ControlPersist=60s"}}}
    (INVENTORY_DIR / "hosts.yml").write_text(json.dumps(hosts, indent=1))
    return INVENTORY_DIR / "hosts.yml"


def mitogen() -> Path | None:
    """Mitogen's wheel unpacked under build/ (not installed into the project's venv); None if unavailable."""
    target = WORK / f"mitogen-{MITOGEN_VERSION}"
    if not (target / "ansible_mitogen").is_dir():
        wheels = WORK / "wheels"
        got = sh(str(BIN / "pip"), "download", "--no-deps", "-q", "-d", str(wheels), f"mitogen=={MITOGEN_VERSION}", check=False)
        found = sorted(wheels.glob(f"mitogen-{MITOGEN_VERSION}-*.whl"))
        if got.returncode != 0 or not found:
            log(f"mitogen {MITOGEN_VERSION} not available: {got.stderr.strip()[-300:]}")
            return None
        with zipfile.ZipFile(found[0]) as wheel:
            wheel.extractall(target)
    return target


def _stamp(text: str) -> float:
    return time.mktime(time.strptime(text[:19], "%Y-%m-%dT%H:%M:%S")) + float("0" + text[19:].rstrip("Z"))


def file_task_seconds(report: dict[str, Any]) -> dict[str, Any]:
    """From the json callback's report: how many tasks ran per action and their summed wall time, for the
    file actions (the plugins and the builtins they stand in for) and for everything else."""
    by_action: dict[str, dict[str, float]] = {}
    for play in report.get("plays", []):
        for entry in play.get("tasks", []):
            hosts = entry.get("hosts", {})
            if not hosts or all(h.get("skipped") for h in hosts.values()):
                continue
            action = next(iter(hosts.values())).get("action", "?")
            duration = entry["task"].get("duration", {})
            seconds = _stamp(duration["end"]) - _stamp(duration["start"]) if "end" in duration else 0.0
            slot = by_action.setdefault(action, {"tasks": 0, "seconds": 0.0})
            slot["tasks"] += 1
            slot["seconds"] += seconds
    files = {a: v for a, v in by_action.items() if a in FILE_ACTIONS}
    return {"file_tasks": sum(int(v["tasks"]) for v in files.values()),
            "file_seconds": round(sum(v["seconds"] for v in files.values()), 1),
            "all_tasks": sum(int(v["tasks"]) for v in by_action.values()),
            "all_seconds": round(sum(v["seconds"] for v in by_action.values()), 1),
            "by_action": {a: {"tasks": int(v["tasks"]), "seconds": round(v["seconds"], 2)} for a, v in
                          sorted(by_action.items(), key=lambda kv: -kv[1]["seconds"])}}


def run_site(label: str, inventory: Path, env_extra: dict[str, str], as_json: bool = False) -> dict[str, Any]:
    """One site.yml run. as_json: the json callback's report (per-task durations and actions) instead of the
    default output; the recap is then read from its stats."""
    WORK.mkdir(parents=True, exist_ok=True)
    log_file = WORK / f"{label}.{'json' if as_json else 'log'}"
    env = {**os.environ, "ANSIBLE_FORCE_COLOR": "0", "ANSIBLE_NOCOLOR": "1", "ANSIBLE_HOST_KEY_CHECKING": "False",
           **env_extra}
    if as_json:
        env.update(ANSIBLE_STDOUT_CALLBACK="ansible.posix.json", ANSIBLE_CALLBACKS_ENABLED="")
    started = time.monotonic()
    with log_file.open("w") as handle:
        rc = subprocess.run([str(BIN / "ansible-playbook"), "site.yml", "-i", str(inventory)], cwd=REPO, env=env,
                            stdout=handle, stderr=subprocess.PIPE if as_json else subprocess.STDOUT, check=False).returncode
    seconds = time.monotonic() - started
    text = log_file.read_text()
    tasks: dict[str, Any] | None = None
    if as_json:
        try:
            report = json.loads(text[text.index("{"):])
        except ValueError:
            report = {}
        recap = {host: {k: int(stats.get(k, 0)) for k in ("ok", "changed", "unreachable", "failed")}
                 for host, stats in report.get("stats", {}).items()}
        tasks = file_task_seconds(report) if report else None
    else:
        recap = {m["host"]: {k: int(m[k]) for k in ("ok", "changed", "unreachable", "failed")}
                 for m in (RECAP.match(line) for line in text.splitlines()) if m}
    changed = sum(h["changed"] for h in recap.values())
    if not recap:
        rc = rc or 1  # no recap: the run did not finish as a run
    log(f"{label}: {seconds:.1f} s, rc {rc}, changed={changed} ({log_file.relative_to(REPO)})")
    return {"label": label, "rc": rc, "seconds": round(seconds, 1), "changed": changed, "recap": recap,
            "log": str(log_file.relative_to(REPO)), "tasks": tasks}


def main() -> int:
    WORK.mkdir(parents=True, exist_ok=True)
    key = WORK / "id_ed25519"
    if not key.exists():
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key))
    if RERUN_ONLY:
        address = sh("docker", "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", NAME).stdout.strip()
    else:
        address = up(image(), key)
    inventory = write_inventory(address, key)
    first = None
    if not RERUN_ONLY:
        first = run_site("first-converge", inventory, {})
        if first["rc"] != 0:
            log(f"the first converge failed: see {first['log']}")
            return 2
    variants: dict[str, dict[str, str]] = {"plugins": {}, "builtin": {"LABCTL_FILE_ACTIONS": "builtin"}}
    mito = mitogen()
    if mito is not None:
        mito_env = {"PYTHONPATH": str(mito), "ANSIBLE_STRATEGY": "mitogen_linear",
                    "ANSIBLE_STRATEGY_PLUGINS": str(mito / "ansible_mitogen" / "plugins" / "strategy")}
        variants["mitogen"] = mito_env
        variants["mitogen-builtin"] = {**mito_env, "LABCTL_FILE_ACTIONS": "builtin"}
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    for round_ in range(1, ROUNDS + 1):
        for name, extra in variants.items():
            runs[name].append(run_site(f"rerun-{name}-{round_}", inventory, extra))
    # One more re-run per variant with the json callback: where the time goes, by action (not timed above:
    # a different stdout callback would change what is measured).
    profile = {name: run_site(f"profile-{name}", inventory, extra, as_json=True).get("tasks")
               for name, extra in variants.items()}
    ok = {name: [r for r in rs if r["rc"] == 0 and r["changed"] == 0] for name, rs in runs.items()}
    median = {name: statistics.median(r["seconds"] for r in rs) if rs else None for name, rs in ok.items()}
    base = median["plugins"]
    print(f"\nno-op re-run of site.yml over SSH (ControlPersist, pipelining), {ROUNDS} rounds, median seconds:")
    print(f"{'variant':16} {'median s':>9} {'vs plugins':>11}  runs (s)")
    for name, rs in runs.items():
        m = median[name]
        ratio = f"{m / base:.2f}" if m and base else "-"
        failed = [r["label"] for r in rs if r not in ok[name]]
        print(f"{name:16} {m if m is not None else '-':>9} {ratio:>11}  {[r['seconds'] for r in rs]}"
              + (f"  FAILED or changed: {failed}" if failed else ""))
    print("\nwhere the time goes (json callback re-run): file tasks (template/copy/file/directories) vs all tasks")
    for name, prof in profile.items():
        if prof:
            print(f"{name:16} file tasks {prof['file_tasks']:3} in {prof['file_seconds']:6.1f} s;"
                  f" all tasks {prof['all_tasks']:3} in {prof['all_seconds']:6.1f} s")
    OUT.write_text(json.dumps({"container": NAME, "rounds": ROUNDS, "first_converge": first, "runs": runs,
                               "profile": profile,
                               "median_seconds": median, "cpus": os.cpu_count(),
                               "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
                               "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, indent=2) + "\n")
    print(f"JSON: {OUT.relative_to(REPO)}")
    if not KEEP and not RERUN_ONLY:
        sh("docker", "rm", "-f", NAME, check=False)
        sh("docker", "network", "rm", NETWORK, check=False)
    return 0 if ok["plugins"] and ok["builtin"] else 1


if __name__ == "__main__":
    sys.exit(main())
