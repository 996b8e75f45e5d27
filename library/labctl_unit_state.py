#!/usr/bin/python
"""Say, in one light call and without changing anything, whether systemd units are already as wanted."""

from __future__ import annotations

import typing as t

from ansible.module_utils.basic import AnsibleModule

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


def main() -> None:
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
    units = module.params["units"]
    systemctl = module.get_bin_path("systemctl")
    if systemctl is None:
        module.exit_json(changed=False, units=[{"name": u["name"], "current": False, "reason": "no systemctl"} for u in units])
    rc, out, _ = module.run_command([systemctl, "show", "--property=" + ",".join(PROPERTIES), "--", *[u["name"] for u in units]])
    blocks = parse_show(out) if rc == 0 else []
    if len(blocks) != len(units):
        module.exit_json(changed=False, units=[{"name": u["name"], "current": False, "reason": "unreadable"} for u in units])
    behind = sorted({name for status in blocks for name in status.get("Triggers", "").split()})
    triggered: dict[str, str] = {}
    if behind:
        rc, out, _ = module.run_command([systemctl, "show", "--property=Id,NeedDaemonReload", "--", *behind])
        shown = parse_show(out) if rc == 0 else []
        if len(shown) == len(behind):
            triggered = {name: status.get("NeedDaemonReload", "") for name, status in zip(behind, shown, strict=True)}
    module.exit_json(changed=False, units=[judge(want, status, triggered) for want, status in zip(units, blocks, strict=True)])


if __name__ == "__main__":
    main()
