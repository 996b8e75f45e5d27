#!/usr/bin/env python3
"""Benchmark of provisioning speed (not a test): the first converge of the whole site and a no-op re-run.

Usage: python3 scripts/bench-provision.py   (make bench-provision)

In one run, on a fresh network-less sandbox container of the base image (scripts/sandbox.sh, container
BENCH_PROVISION_NAME, default labctl-benchprov, with its own inventory generated under build/benchprov from
inventories/sandbox):
  1. the first converge of site.yml from the test bundle (timed);
  2. the re-run of site.yml on the converged host (timed). It must report changed=0 for every host in
     ansible's recap, and no service the site manages may have restarted: MainPID, start timestamps and
     NRestarts of the vLLM replicas, LiteLLM, PostgreSQL, Redis, Prometheus, node_exporter, Grafana (when
     it runs), the NVIDIA persistence daemon and every labctl-* unit, and the activation time of every timer,
     are read inside the container before and after the re-run and must be equal;
  3. both times, their ratio and the ten slowest tasks of each run (ansible.posix.profile_tasks).
Writes build/bench-provision.json (and each run's full log under build/bench-provision/). Exits 1 when the
re-run is slower than BENCH_TARGET_S (60), changes something or restarts a service; 2 when a run fails.

Environment: BENCH_PROVISION_NAME (labctl-benchprov), BENCH_TARGET_S (60), BENCH_TOP (10), BENCH_KEEP=1 keeps
the container afterwards, BENCH_RERUN_ONLY=1 skips the fresh container and the first converge and measures
only the re-run on the kept container (for iterating on the re-run; the JSON then has no first converge),
LABCTL_BUNDLE / LABCTL_BUNDLE_FINGERPRINT (set by the Makefile: the test bundle).
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
NAME = os.environ.get("BENCH_PROVISION_NAME", "labctl-benchprov")
TARGET_S = float(os.environ.get("BENCH_TARGET_S", "60"))
TOP = int(os.environ.get("BENCH_TOP", "10"))
KEEP = os.environ.get("BENCH_KEEP") == "1"
RERUN_ONLY = os.environ.get("BENCH_RERUN_ONLY") == "1"
# The inventory directory's name also names the generated secrets (group_vars/all/project.yml lab_secrets_dir).
INVENTORY_DIR = REPO / "build" / "benchprov"
LOG_DIR = REPO / "build" / "bench-provision"
OUT = REPO / "build" / "bench-provision.json"
ANSIBLE_PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"
# The units the site manages (services and timers); a timer-triggered oneshot is judged by its timer.
UNIT_PATTERN = re.compile(
    r"^(vllm@[0-9]+|litellm|postgresql@.+|redis-server|prometheus|prometheus-node-exporter|grafana-server"
    r"|nvidia-persistenced|nvidia-fabricmanager|labctl-.+)\.(service|timer)$"
)
PROPERTIES = ["Id", "Type", "ActiveState", "SubState", "MainPID", "ExecMainStartTimestampMonotonic",
              "ActiveEnterTimestampMonotonic", "NRestarts", "TriggeredBy", "RemainAfterExit"]
RECAP = re.compile(r"^(?P<host>\S+)\s+:\s+ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)\s+unreachable=(?P<unreachable>\d+)"
                   r"\s+failed=(?P<failed>\d+)")
PROFILE_LINE = re.compile(r"^(?P<name>.*?)[ -]+(?P<seconds>\d+\.\d+)s$")


def log(text: str) -> None:
    print(f"bench-provision: {text}", file=sys.stderr, flush=True)


def sandbox(action: str) -> None:
    subprocess.run([str(REPO / "scripts" / "sandbox.sh"), action], check=True,
                   env={**os.environ, "LABCTL_SANDBOX_NAME": NAME})


def write_inventory() -> Path:
    """inventories/sandbox with the host renamed: the same group_vars, another container."""
    INVENTORY_DIR.mkdir(parents=True, exist_ok=True)
    source = REPO / "inventories" / "sandbox"
    hosts = INVENTORY_DIR / "hosts.yml"
    hosts.write_text((source / "hosts.yml").read_text().replace("labctl-sandbox", NAME))
    shutil.rmtree(INVENTORY_DIR / "group_vars", ignore_errors=True)
    shutil.copytree(source / "group_vars", INVENTORY_DIR / "group_vars")
    return hosts


def units() -> dict[str, dict[str, str]]:
    """The state of every unit the site manages, read inside the container."""
    listing = subprocess.run(
        ["docker", "exec", NAME, "systemctl", "list-units", "--all", "--plain", "--no-legend", "--no-pager",
         "--type=service,timer"], capture_output=True, text=True, check=True).stdout
    names = sorted({line.split()[0] for line in listing.splitlines() if line.split() and UNIT_PATTERN.match(line.split()[0])})
    if not names:
        return {}
    shown = subprocess.run(
        ["docker", "exec", NAME, "systemctl", "show", "--no-pager", *[f"-p{p}" for p in PROPERTIES], *names],
        capture_output=True, text=True, check=True).stdout
    out: dict[str, dict[str, str]] = {}
    for block in shown.strip().split("\n\n"):
        props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        if props.get("Id"):
            out[props["Id"]] = props
    return out


def restarted(before: dict[str, dict[str, str]], after: dict[str, dict[str, str]]) -> tuple[list[str], list[str]]:
    """(units that restarted, stopped or appeared; units compared)."""
    problems: list[str] = []
    compared: list[str] = []
    for name in sorted(set(before) | set(after)):
        old, new = before.get(name), after.get(name)
        if old is None or new is None:
            problems.append(f"{name}: {'appeared' if old is None else 'disappeared'} during the re-run")
            continue
        if name.endswith(".service") and old.get("TriggeredBy"):
            continue  # a timer's oneshot: it runs on its own schedule (its timer is compared)
        if old.get("ActiveState") != "active" and new.get("ActiveState") != "active":
            continue  # not running before or after (e.g. a unit whose condition fails in a container)
        if name.endswith(".timer") or (old.get("Type") == "oneshot" and old.get("RemainAfterExit") == "yes"):
            keys = ["ActiveState", "ActiveEnterTimestampMonotonic"]
        else:
            keys = ["ActiveState", "MainPID", "ExecMainStartTimestampMonotonic", "NRestarts"]
        compared.append(name)
        diffs = [f"{k} {old.get(k)} -> {new.get(k)}" for k in keys if old.get(k) != new.get(k)]
        if diffs:
            problems.append(f"{name}: " + ", ".join(diffs))
    return problems, compared


def run_site(label: str, inventory: Path) -> dict[str, Any]:
    """One timed ansible-playbook site.yml; its output goes to the terminal and to a log file."""
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log_file = LOG_DIR / f"{label}.log"
    env = {**os.environ, "LABCTL_SANDBOX_NAME": NAME, "PROFILE_TASKS_TASK_OUTPUT_LIMIT": "all",
           "ANSIBLE_FORCE_COLOR": "0", "ANSIBLE_NOCOLOR": "1"}
    argv = [str(ANSIBLE_PLAYBOOK), "site.yml", "-i", str(inventory)]
    log(f"{label}: {' '.join(argv)} (log: {log_file.relative_to(REPO)})")
    started = time.monotonic()
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with log_file.open("w", buffering=1) as handle:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            handle.write(line)
            if os.environ.get("BENCH_QUIET") != "1":
                sys.stdout.write(line)
        rc = proc.wait()
    seconds = time.monotonic() - started
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # CPU time of ansible and its children on this machine: less sensitive than the wall time to other load.
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    lines = log_file.read_text().splitlines()
    recap = {m["host"]: {k: int(m[k]) for k in ("ok", "changed", "unreachable", "failed")}
             for m in (RECAP.match(line) for line in lines) if m}
    tasks: list[dict[str, Any]] = []
    if "TASKS RECAP" in "\n".join(lines):
        start = max(i for i, line in enumerate(lines) if "TASKS RECAP" in line)
        for line in lines[start + 1:]:
            m = PROFILE_LINE.match(line.strip())
            if m and not line.startswith(("=", "Sunday", "Monday")):
                tasks.append({"task": m["name"].rstrip(" -"), "seconds": float(m["seconds"])})
    tasks.sort(key=lambda t: -t["seconds"])
    return {"label": label, "rc": rc, "seconds": round(seconds, 1), "control_cpu_seconds": round(cpu, 1), "recap": recap,
            "changed": sum(h["changed"] for h in recap.values()), "tasks": len(tasks), "slowest": tasks[:TOP],
            "log": str(log_file.relative_to(REPO))}


def show(result: dict[str, Any]) -> None:
    print(f"\n{result['label']}: {result['seconds']:.1f} s ({result['control_cpu_seconds']:.1f} s CPU on this machine), "
          f"rc {result['rc']}, changed={result['changed']}, "
          f"{result['tasks']} tasks timed; the {len(result['slowest'])} slowest:")
    for task in result["slowest"]:
        print(f"  {task['seconds']:7.2f} s  {task['task']}")


def main() -> int:
    load_at_start = os.getloadavg()
    inventory = write_inventory()
    first: dict[str, Any] | None = None
    if not RERUN_ONLY:
        log(f"fresh container {NAME}")
        sandbox("down")
        sandbox("up")
        first = run_site("first-converge", inventory)
        if first["rc"] != 0:
            show(first)
            log(f"the first converge failed (rc {first['rc']}): see {first['log']}")
            return 2
    before = units()
    rerun = run_site("re-run", inventory)
    after = units()
    problems, compared = restarted(before, after)
    if first:
        show(first)
    show(rerun)
    failures: list[str] = []
    if rerun["rc"] != 0:
        failures.append(f"the re-run failed (rc {rerun['rc']}): see {rerun['log']}")
    if rerun["changed"] != 0 or not rerun["recap"]:
        failures.append(f"the re-run changed {rerun['changed']} task(s) (recap {rerun['recap']}); it must change nothing")
    failures += [f"restarted: {p}" for p in problems]
    if rerun["seconds"] > TARGET_S:
        failures.append(f"the re-run took {rerun['seconds']:.1f} s, over the target of {TARGET_S:.0f} s")
    ratio = round(rerun["seconds"] / first["seconds"], 3) if first else None
    print(f"\nfirst converge: {first['seconds']:.1f} s" if first else "\nfirst converge: not run (BENCH_RERUN_ONLY=1)")
    print(f"re-run:         {rerun['seconds']:.1f} s (target <= {TARGET_S:.0f} s), changed={rerun['changed']}"
          + (f", ratio re-run/first converge {ratio:.2f}" if ratio is not None else ""))
    print(f"load average:   {load_at_start[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the end ({os.cpu_count()} CPUs;"
          " other work on this machine slows both runs)")
    print(f"services:       {len(compared)} units compared, {len(problems)} restarted ({', '.join(compared)})")
    load = os.getloadavg()
    OUT.write_text(json.dumps({
        "container": NAME, "target_seconds": TARGET_S, "first_converge": first, "rerun": rerun, "ratio": ratio,
        "units_compared": compared, "units_restarted": problems, "ok": not failures, "failures": failures,
        "cpus": os.cpu_count(), "loadavg_at_start": [round(x, 2) for x in load_at_start],
        "loadavg_at_end": [round(x, 2) for x in load],
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }, indent=2) + "\n")
    print(f"JSON: {OUT.relative_to(REPO)}")
    if KEEP or RERUN_ONLY:
        log(f"container {NAME} kept (scripts/sandbox.sh down with LABCTL_SANDBOX_NAME={NAME} removes it)")
    else:
        sandbox("down")
    for failure in failures:
        log(f"FAIL: {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
