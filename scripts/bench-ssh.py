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
     ansible.builtin.template/copy/file's own path), "nolight" (LABCTL_LIGHT=0: the light calls of
     labctl_read, labctl_stat, labctl_http and the actions' probes run as ordinary modules, through
     ansible's module wrapper) and, when it imports, "mitogen" (Mitogen's
     mitogen_linear strategy, from the PyPI wheel unpacked under build/, plugins as shipped) and
     "mitogen-builtin" (Mitogen with the builtin path). Each re-run must report changed=0;
  5. where the time goes: in the median re-run of each variant, the seconds of the file tasks
     (labctl_template) and directory tasks (labctl_directories) from profile_tasks' timestamps: what
     "fewer tasks" (StateDirectory=, merged templates) could save at most.
Writes build/bench-ssh.json and prints a table: median seconds per variant and ratios against "plugins".

Each re-run also records the controller's CPU seconds (ansible-playbook and its children: workers,
ssh clients) and the tasks per host (ok, skipped), and the seconds per role.

BENCH_BASE=<commit> adds the variant "base": that commit's site.yml, roles and plugins (a git worktree
under build/bench-ssh/base), re-run on the same converged container, interleaved with the others (the
before/after of a change in one run; the installed labctl package is the checkout's). The container is
converged by the checkout's site.yml, so both must converge to the same state (every re-run changed=0).

Environment: BENCH_SSH_NAME (labctl-benchssh), BENCH_ROUNDS (3), BENCH_KEEP=1 keeps the container,
BENCH_RERUN_ONLY=1 re-uses a kept converged container, BENCH_BASE (none), BENCH_VARIANTS (comma-separated,
default plugins,builtin,nolight,mitogen,mitogen-builtin, plus base when BENCH_BASE is set), MITOGEN_VERSION (0.3.54),
LABCTL_BUNDLE / LABCTL_BUNDLE_FINGERPRINT (the Makefile sets them: the test bundle).
"""

from __future__ import annotations

import json
import os
import re
import resource
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
BASE = os.environ.get("BENCH_BASE", "")
VARIANTS = [v for v in os.environ.get("BENCH_VARIANTS", "").split(",") if v]
WORK = REPO / "build" / "bench-ssh"
INVENTORY_DIR = WORK / "inventory"
OUT = REPO / "build" / "bench-ssh.json"
BIN = Path(sys.executable).parent
RECAP = re.compile(r"^(?P<host>\S+)\s+:\s+ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)\s+unreachable=(?P<unreachable>\d+)"
                   r"\s+failed=(?P<failed>\d+)\s+skipped=(?P<skipped>\d+)")
RUN_OPTS = ["--cap-add", "SYS_ADMIN", "--cap-add", "NET_ADMIN", "--security-opt", "seccomp=unconfined",
            "--security-opt", "apparmor=unconfined", "--cgroupns", "host", "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw",
            "--tmpfs", "/run", "--tmpfs", "/run/lock"]


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


def file_task_names() -> tuple[set[str], set[str]]:
    """'role : task name' of every task that writes a file (labctl_template) or directories
    (labctl_directories): the tasks the plugins serve and that "fewer tasks" would remove."""
    import yaml

    files: set[str] = set()
    dirs: set[str] = set()

    def walk(tasks: Any, role: str) -> None:
        for task in tasks or []:
            if not isinstance(task, dict):
                continue
            for key in ("block", "rescue", "always"):
                walk(task.get(key), role)
            if "labctl_template" in task:
                files.add(f"{role} : {task.get('name')}")
            if "labctl_directories" in task:
                dirs.add(f"{role} : {task.get('name')}")

    for path in sorted((REPO / "roles").glob("*/tasks/*.yml")):
        walk(yaml.safe_load(path.read_text()), path.parts[-3])
    return files, dirs


TASK_HEADER = re.compile(r"^(?:TASK|RUNNING HANDLER) \[(.+?)\] \*+")
# profile_tasks' line under each header: the previous task's duration in parentheses.
TASK_STAMP = re.compile(r"\((\d+):(\d\d):(\d\d\.\d+)\)\s+\d+:\d\d:\d\d\.\d+ \*+\s*$")


def where_the_time_goes(log_text: str, files: set[str], dirs: set[str]) -> dict[str, Any]:
    """Seconds per kind of task in one re-run, from profile_tasks' timestamps (ansible.cfg enables it)."""
    lines = log_text.splitlines()
    timed: list[tuple[str, float]] = []
    current: str | None = None
    for number, line in enumerate(lines):
        header = TASK_HEADER.match(line)
        if not header:
            continue
        stamp = TASK_STAMP.search(lines[number + 1]) if number + 1 < len(lines) else None
        if stamp and current is not None:
            timed.append((current, int(stamp[1]) * 3600 + int(stamp[2]) * 60 + float(stamp[3])))
        current = header[1]
    roles: dict[str, float] = {}
    for name, seconds in timed:
        role = name.split(" : ", 1)[0] if " : " in name else "(plays: topology, tls, facts)"
        roles[role] = roles.get(role, 0.0) + seconds
    return {"tasks_s": round(sum(s for _, s in timed), 1),
            "roles_s": {r: round(s, 1) for r, s in sorted(roles.items(), key=lambda kv: -kv[1])},
            "file_tasks": sum(1 for n, _ in timed if n in files), "file_tasks_s": round(sum(s for n, s in timed if n in files), 1),
            "dir_tasks": sum(1 for n, _ in timed if n in dirs), "dir_tasks_s": round(sum(s for n, s in timed if n in dirs), 1)}


def run_site(label: str, inventory: Path, env_extra: dict[str, str], tree: Path = REPO) -> dict[str, Any]:
    WORK.mkdir(parents=True, exist_ok=True)
    log_file = WORK / f"{label}.log"
    env = {**os.environ, "ANSIBLE_FORCE_COLOR": "0", "ANSIBLE_NOCOLOR": "1", "ANSIBLE_HOST_KEY_CHECKING": "False",
           **env_extra}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    with log_file.open("w") as handle:
        rc = subprocess.run([str(BIN / "ansible-playbook"), "site.yml", "-i", str(inventory)], cwd=tree, env=env,
                            stdout=handle, stderr=subprocess.STDOUT, check=False).returncode
    seconds = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    text = log_file.read_text()
    recap = {m["host"]: {k: int(m[k]) for k in ("ok", "changed", "unreachable", "failed", "skipped")}
             for m in (RECAP.match(line) for line in text.splitlines()) if m}
    changed = sum(h["changed"] for h in recap.values())
    log(f"{label}: {seconds:.1f} s, controller CPU {cpu:.1f} s, rc {rc}, changed={changed} ({log_file.relative_to(REPO)})")
    return {"label": label, "rc": rc, "seconds": round(seconds, 1), "cpu_s": round(cpu, 1), "changed": changed,
            "recap": recap, "log": str(log_file.relative_to(REPO)), "time": where_the_time_goes(text, *file_task_names())}


def base_tree() -> Path:
    """BENCH_BASE's tree: a detached git worktree under build/bench-ssh/base, made afresh."""
    tree = WORK / "base"
    sh("git", "worktree", "remove", "--force", str(tree), check=False, cwd=REPO)
    shutil.rmtree(tree, ignore_errors=True)
    sh("git", "worktree", "prune", cwd=REPO)
    sh("git", "worktree", "add", "--detach", str(tree), BASE, cwd=REPO)
    log(f"base: {BASE} = {sh('git', 'rev-parse', '--short', 'HEAD', cwd=tree).stdout.strip()} in {tree.relative_to(REPO)}")
    return tree


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
    variants: dict[str, dict[str, str]] = {"plugins": {}, "builtin": {"LABCTL_FILE_ACTIONS": "builtin"},
                                           "nolight": {"LABCTL_LIGHT": "0"}}
    trees: dict[str, Path] = {}
    if BASE:
        variants = {"base": {}, **variants}
        trees["base"] = base_tree()
    mito = mitogen() if not VARIANTS or any(v.startswith("mitogen") for v in VARIANTS) else None
    if mito is not None:
        mito_env = {"PYTHONPATH": str(mito), "ANSIBLE_STRATEGY": "mitogen_linear",
                    "ANSIBLE_STRATEGY_PLUGINS": str(mito / "ansible_mitogen" / "plugins" / "strategy")}
        variants["mitogen"] = mito_env
        variants["mitogen-builtin"] = {**mito_env, "LABCTL_FILE_ACTIONS": "builtin"}
    if VARIANTS:
        unknown = [v for v in VARIANTS if v not in variants]
        if unknown:
            raise SystemExit(f"bench-ssh: BENCH_VARIANTS names {unknown}; known here: {sorted(variants)}")
        variants = {name: extra for name, extra in variants.items() if name in VARIANTS or name == "base"}
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    for round_ in range(1, ROUNDS + 1):
        for name, extra in variants.items():
            runs[name].append(run_site(f"rerun-{name}-{round_}", inventory, extra, trees.get(name, REPO)))
    # Where the time goes: the timed re-run of median length of each variant, by kind of task.
    profile = {name: sorted(rs, key=lambda r: r["seconds"])[len(rs) // 2]["time"] for name, rs in runs.items() if rs}
    ok = {name: [r for r in rs if r["rc"] == 0 and r["changed"] == 0] for name, rs in runs.items()}
    median = {name: statistics.median(r["seconds"] for r in rs) if rs else None for name, rs in ok.items()}
    base = median.get("plugins")
    against = "base" if BASE else "plugins"
    print(f"\nno-op re-run of site.yml over SSH (ControlPersist, pipelining), {ROUNDS} rounds, median seconds:")
    print(f"{'variant':16} {'median s':>9} {'vs plugins':>11} {'vs ' + against:>11} {'CPU s':>6} {'ok':>4} {'skip':>4}  runs (s)")
    for name, rs in runs.items():
        m = median[name]
        ratio = f"{m / base:.2f}" if m and base else "-"
        ref = median.get(against)
        ratio_ref = f"{m / ref:.2f}" if m and ref else "-"
        cpu = statistics.median(r["cpu_s"] for r in rs) if rs else 0
        tasks: dict[str, int] = next(iter(rs[0]["recap"].values()), {}) if rs and rs[0]["recap"] else {}
        failed = [r["label"] for r in rs if r not in ok[name]]
        print(f"{name:16} {m if m is not None else '-':>9} {ratio:>11} {ratio_ref:>11} {cpu:>6.1f} {tasks.get('ok', '-'):>4}"
              f" {tasks.get('skipped', '-'):>4}  {[r['seconds'] for r in rs]}"
              + (f"  FAILED or changed: {failed}" if failed else ""))
    print("\nwhere the time goes (the median re-run of each variant, profile_tasks' timestamps):")
    for name, prof in profile.items():
        print(f"{name:16} {prof['file_tasks']:3} file tasks {prof['file_tasks_s']:6.1f} s, {prof['dir_tasks']:2} directory tasks"
              f" {prof['dir_tasks_s']:5.1f} s, all tasks {prof['tasks_s']:6.1f} s")
        print(f"{'':16} by role: " + ", ".join(f"{r} {s_}" for r, s_ in list(prof["roles_s"].items())[:8]))
    OUT.write_text(json.dumps({"container": NAME, "rounds": ROUNDS, "first_converge": first, "runs": runs,
                               "profile": profile,
                               "median_seconds": median, "cpus": os.cpu_count(),
                               "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
                               "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, indent=2) + "\n")
    print(f"JSON: {OUT.relative_to(REPO)}")
    if BASE:
        sh("git", "worktree", "remove", "--force", str(trees["base"]), check=False, cwd=REPO)
    if not KEEP and not RERUN_ONLY:
        sh("docker", "rm", "-f", NAME, check=False)
        sh("docker", "network", "rm", NETWORK, check=False)
    return 0 if all(ok[name] for name in variants if not name.startswith("mitogen")) else 1


if __name__ == "__main__":
    sys.exit(main())
