#!/usr/bin/python
"""Say, in one light call and without changing anything, whether systemd units are already as wanted."""

from __future__ import annotations

import os
import shutil
import subprocess
import typing as t

DOCUMENTATION = r"""
---
module: labctl_unit_state
short_description: Tell whether systemd units are loaded, enabled and running as wanted, with no reload pending
description:
  - Reads each unit's state with one C(systemctl show) and compares it with what
    M(ansible.builtin.systemd_service) would be asked for; changes nothing.
  - "The probe of the labctl_service action: a unit that is current needs nothing more, any other is
    handed to M(ansible.builtin.systemd_service) with the task's own arguments."
  - A unit is current only when it is loaded, its unit files and those of the units it triggers (a
    timer's service) need no daemon reload (C(NeedDaemonReload=no)), it is C(active) when O(units[].started), and its C(UnitFileState) is
    C(enabled) when O(units[].enabled) is true or C(disabled) when it is false. Anything else (a static,
    masked, generated or alias unit, a unit that is activating) answers "not current", so the full
    module decides.
options:
  units:
    description: The units to judge, in order.
    type: list
    elements: dict
    required: true
    suboptions:
      name:
        description: The unit (C(.service) is added by systemctl when the name has no suffix).
        type: str
        required: true
      enabled:
        description: Whether the unit should be enabled (omitted - not judged).
        type: bool
      started:
        description: Whether the unit should be running.
        type: bool
        default: false
author:
  - labctl
"""

EXAMPLES = r"""
- name: Is Prometheus enabled and running?
  labctl_unit_state:
    units:
      - name: prometheus.service
        enabled: true
        started: true
"""

RETURN = r"""
units:
  description: One answer per unit, in order. C(current) says whether it is as wanted, C(reason) why not.
  returned: always
  type: list
  elements: dict
"""

PROPERTIES = ("Id", "LoadState", "ActiveState", "SubState", "UnitFileState", "NeedDaemonReload", "Triggers")


def parse_show(text: str) -> list[dict[str, str]]:
    """`systemctl show -p ... a b` output: one block of KEY=value lines per unit, blank-line separated."""
    blocks: list[dict[str, str]] = [{}]
    for line in text.splitlines():
        if not line.strip():
            if blocks[-1]:
                blocks.append({})
            continue
        key, _, value = line.partition("=")
        blocks[-1][key] = value
    return [b for b in blocks if b]


def judge(want: dict[str, t.Any], status: dict[str, str], triggered: dict[str, str] | None = None) -> dict[str, t.Any]:
    """Whether one unit is as `want` says. ``triggered``: NeedDaemonReload of the units it triggers (a
    timer's service): a changed service file behind a current timer still needs the reload."""
    reason = ""
    stale = sorted(name for name in status.get("Triggers", "").split() if (triggered or {}).get(name) != "no")
    if status.get("LoadState") != "loaded":
        reason = f"LoadState={status.get('LoadState', '?')}"
    elif status.get("NeedDaemonReload") != "no":
        reason = "a daemon reload is pending"
    elif stale:
        reason = f"a daemon reload is pending for {', '.join(stale)}"
    elif want.get("started") and status.get("ActiveState") != "active":
        reason = f"ActiveState={status.get('ActiveState', '?')}"
    elif want.get("enabled") is not None and status.get("UnitFileState") != ("enabled" if want["enabled"] else "disabled"):
        reason = f"UnitFileState={status.get('UnitFileState', '?')}"
    return {"name": want["name"], "current": not reason, "reason": reason, "status": status}


def run(argv: list[str]) -> tuple[int, str]:
    """Run a command with the C locale: its exit status and output."""
    done = subprocess.run(argv, capture_output=True, env={**os.environ, "LC_ALL": "C", "LANG": "C"}, check=False)
    return done.returncode, done.stdout.decode("utf-8", "replace")


def states(units: list[dict[str, t.Any]], systemctl: str | None,
           runner: t.Callable[[list[str]], tuple[int, str]]) -> list[dict[str, t.Any]]:
    """One answer per unit, from one `systemctl show` (and one more for the units timers trigger)."""
    if systemctl is None:
        return [{"name": u["name"], "current": False, "reason": "no systemctl"} for u in units]
    rc, out = runner([systemctl, "show", "--property=" + ",".join(PROPERTIES), "--", *[u["name"] for u in units]])
    blocks = parse_show(out) if rc == 0 else []
    if len(blocks) != len(units):
        return [{"name": u["name"], "current": False, "reason": "unreadable"} for u in units]
    behind = sorted({name for status in blocks for name in status.get("Triggers", "").split()})
    triggered: dict[str, str] = {}
    if behind:
        rc, out = runner([systemctl, "show", "--property=Id,NeedDaemonReload", "--", *behind])
        shown = parse_show(out) if rc == 0 else []
        if len(shown) == len(behind):
            triggered = {name: status.get("NeedDaemonReload", "") for name, status in zip(behind, shown, strict=True)}
    return [judge(want, status, triggered) for want, status in zip(units, blocks, strict=True)]


def light(args: dict[str, t.Any]) -> dict[str, t.Any]:
    """The answer, run by the labctl actions without the module wrapper (action_plugins/labctl_read.py)."""
    units = [{"started": False, **unit} for unit in args["units"]]
    systemctl = shutil.which("systemctl", path="/usr/bin:/bin:/usr/sbin:/sbin")
    return {"changed": False, "units": states(units, systemctl, run)}


def main() -> None:
    from ansible.module_utils.basic import AnsibleModule  # here: the light run has no ansible to import

    module = AnsibleModule(
        argument_spec={
            "units": {
                "type": "list", "elements": "dict", "required": True,
                "options": {
                    "name": {"type": "str", "required": True},
                    "enabled": {"type": "bool"},
                    "started": {"type": "bool", "default": False},
                },
            },
        },
        supports_check_mode=True,
    )

    def runner(argv: list[str]) -> tuple[int, str]:
        rc, out, _ = module.run_command(argv)
        return rc, out

    module.exit_json(changed=False, units=states(module.params["units"], module.get_bin_path("systemctl"), runner))


if __name__ == "__main__":
    main()
