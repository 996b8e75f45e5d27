#!/usr/bin/python
"""Wait until every worker of the LiteLLM proxy runs the settings on disk (issue 40)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: labctl_gateway_workers
short_description: Wait until every worker of the LiteLLM proxy runs the current settings
description:
  - Each worker of the proxy writes, once its callbacks are loaded, the digest of the settings it loaded to
    O(stamps)/<pid> (labctl_guard.py). This module computes the same digest over O(config_dir) (config.yaml,
    labctl_*.py, labctl_*.yaml) and waits until each worker of the unit's main process (its
    C(multiprocessing.spawn) children, or the main process itself when it has none: one worker) has
    written it, and there are O(workers) of them.
  - It fails after O(timeout) seconds naming each worker that runs other settings or wrote none.
  - It changes nothing.
options:
  unit:
    description: The systemd unit whose main process is the proxy.
    type: str
  main_pid:
    description: The proxy's main process, instead of O(unit) (tests).
    type: int
  config_dir:
    description: Where config.yaml and the callbacks are.
    type: path
    required: true
  stamps:
    description: Where the workers write their stamps.
    type: path
    required: true
  workers:
    description: How many workers the proxy runs.
    type: int
    required: true
  timeout:
    description: Seconds to wait.
    type: int
    default: 180
author: labctl
"""

import hashlib
import subprocess
import time
from pathlib import Path
from typing import Any

from ansible.module_utils.basic import AnsibleModule


def settings_digest(directory: Path) -> str:
    """roles/litellm/files/etc/labctl/litellm/labctl_guard.py's settings_digest (the worker's side)."""
    names = sorted(p.name for p in directory.iterdir()
                   if p.is_file() and (p.name == "config.yaml" or (p.name.startswith("labctl_") and p.suffix in (".py", ".yaml"))))
    lines = "".join(f"{hashlib.sha256((directory / name).read_bytes()).hexdigest()}  {name}\n" for name in names)
    return hashlib.sha256(lines.encode()).hexdigest()


def main_pid(unit: str) -> int:
    out = subprocess.run(["systemctl", "show", "-p", "MainPID", "--value", unit], capture_output=True, text=True, check=False)
    return int(out.stdout.strip() or 0)


def workers_of(main: int) -> list[int]:
    """uvicorn's workers: the main process's children started by multiprocessing's spawn; the main process
    itself when it has none (one worker, served in the main process)."""
    children = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == main and b"spawn_main" in cmdline:
            children.append(int(proc.name))
    return sorted(children) or [main]


def problems(main: int, stamps: Path, want: str, workers: int) -> list[str]:
    """What keeps the proxy from running the current settings on every worker (nothing: [])."""
    if main <= 0:
        return ["the proxy is not running"]
    pids = workers_of(main)
    found = []
    if len(pids) != workers:
        found.append(f"{len(pids)} worker(s) ({', '.join(map(str, pids))}) where {workers} should run")
    for pid in pids:
        try:
            have = (stamps / str(pid)).read_text().strip()
        except OSError:
            found.append(f"worker {pid} wrote no settings stamp in {stamps}")
            continue
        if have != want:
            found.append(f"worker {pid} runs other settings ({have[:12]}, not {want[:12]})")
    return found


def check(params: dict[str, Any]) -> tuple[bool, str, list[str]]:
    """(ok, the digest, the last problems) after waiting up to params['timeout'] seconds."""
    want = settings_digest(Path(params["config_dir"]))
    deadline = time.monotonic() + int(params["timeout"])
    while True:
        main = int(params["main_pid"]) if params.get("main_pid") else main_pid(str(params["unit"]))
        found = problems(main, Path(params["stamps"]), want, int(params["workers"]))
        if not found or time.monotonic() >= deadline:
            return not found, want, found
        time.sleep(1)


def main() -> None:
    module = AnsibleModule(
        argument_spec={"unit": {"type": "str"}, "main_pid": {"type": "int"}, "config_dir": {"type": "path", "required": True},
                       "stamps": {"type": "path", "required": True}, "workers": {"type": "int", "required": True},
                       "timeout": {"type": "int", "default": 180}},
        required_one_of=[("unit", "main_pid")],
        supports_check_mode=True,
    )
    ok, digest, found = check(module.params)
    if not ok:
        module.fail_json(msg=f"Not every worker of the proxy runs the settings of {module.params['config_dir']} "
                             f"({digest[:12]}) after {module.params['timeout']} s: " + "; ".join(found)
                             + " (a worker still serving old requests, or one that failed to start: journalctl -u litellm;"
                               " systemctl restart litellm replaces them all)",
                         digest=digest, problems=found)
    module.exit_json(changed=False, digest=digest)


if __name__ == "__main__":
    main()
