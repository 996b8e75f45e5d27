#!/usr/bin/python
"""Ansible module: the systemd services still running code an upgrade replaced."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: labctl_stale_services
short_description: Find the systemd services that run replaced (deleted) binaries or libraries
description:
  - Reads C(/proc/PID/maps) and C(/proc/PID/exe) of every process. A process whose executable or
    a mapped file under the system directories is marked C((deleted)) runs code a package upgrade
    replaced; it is mapped to its systemd service through C(/proc/PID/cgroup) (the last
    C(.service) in the path). What C(needrestart -b) lists, without needrestart, and without
    restarting anything.
  - PID 1 (systemd) is reported apart (C(pid1)): it is re-executed, not restarted.
  - Read-only: reports C(changed=false). Standard library only.
options:
  exclude:
    description: Regular expressions; services matching one are left out (listed in C(excluded)).
    type: list
    elements: str
    default: []
  prefixes:
    description: Only mapped files under these directories count (not a process's own scratch files).
    type: list
    elements: str
    default: [/usr/, /lib/, /lib64/, /bin/, /sbin/, /opt/]
author: labctl maintainers
"""

EXAMPLES = r"""
- name: Find the services that run replaced libraries
  labctl_stale_services:
    exclude: ['^vllm@']
  register: stale
"""

RETURN = r"""
services:
  description: Services to restart, sorted.
  returned: always
  type: list
  elements: str
excluded:
  description: Stale services left out by O(exclude).
  returned: always
  type: list
  elements: str
pid1:
  description: Whether PID 1 runs replaced code (systemd daemon-reexec picks up the new one).
  returned: always
  type: bool
files:
  description: Per service, up to 5 of the replaced files it maps.
  returned: always
  type: dict
"""

import os
import re
from typing import Any

from ansible.module_utils.basic import AnsibleModule

DELETED = " (deleted)"


def stale_files(pid: str, prefixes: list[str], proc: str = "/proc") -> set[str]:
    """Replaced files process PID runs: its executable and mapped files marked deleted."""
    found: set[str] = set()
    try:
        exe = os.readlink(os.path.join(proc, pid, "exe"))
        if exe.endswith(DELETED) and exe.startswith(tuple(prefixes)):
            found.add(exe[: -len(DELETED)])
    except OSError:
        pass
    try:
        with open(os.path.join(proc, pid, "maps"), encoding="utf-8", errors="replace") as maps:
            for line in maps:
                line = line.rstrip("\n")
                if not line.endswith(DELETED):
                    continue
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[5].startswith(tuple(prefixes)):
                    found.add(parts[5][: -len(DELETED)])
    except OSError:
        pass
    return found


def service_of(pid: str, proc: str = "/proc") -> str | None:
    """The systemd service of PID from its cgroup path (the last *.service component), or None."""
    try:
        with open(os.path.join(proc, pid, "cgroup"), encoding="utf-8") as cgroup:
            lines = cgroup.read().splitlines()
    except OSError:
        return None
    for line in lines:
        path = line.split(":", 2)[-1]
        units = [part for part in path.split("/") if part.endswith(".service")]
        if units:
            return units[-1]
    return None


def scan(prefixes: list[str], exclude: list[str], proc: str = "/proc") -> dict[str, Any]:
    services: set[str] = set()
    files: dict[str, set[str]] = {}
    pid1 = False
    own = {str(os.getpid()), str(os.getppid())}
    for pid in os.listdir(proc):
        if not pid.isdigit() or pid in own:
            continue
        replaced = stale_files(pid, prefixes, proc)
        if not replaced:
            continue
        if pid == "1":
            pid1 = True
            continue
        unit = service_of(pid, proc)
        if unit is None:
            continue
        services.add(unit)
        files.setdefault(unit, set()).update(replaced)
    patterns = [re.compile(p) for p in exclude]
    kept = sorted(u for u in services if not any(p.search(u) for p in patterns))
    excluded = sorted(services - set(kept))
    return {
        "services": kept,
        "excluded": excluded,
        "pid1": pid1,
        "files": {u: sorted(f)[:5] for u, f in sorted(files.items())},
    }


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "exclude": {"type": "list", "elements": "str", "default": []},
            "prefixes": {"type": "list", "elements": "str", "default": ["/usr/", "/lib/", "/lib64/", "/bin/", "/sbin/", "/opt/"]},
        },
        supports_check_mode=True,
    )
    for pattern in module.params["exclude"]:
        try:
            re.compile(pattern)
        except re.error as exc:
            module.fail_json(msg=f"exclude: {pattern!r} is not a regular expression: {exc}")
    module.exit_json(changed=False, **scan(module.params["prefixes"], module.params["exclude"]))


if __name__ == "__main__":
    main()
