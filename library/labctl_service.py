#!/usr/bin/python
"""Documentation stub of the labctl_service action plugin (action_plugins/labctl_service.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: labctl_service
short_description: ansible.builtin.systemd_service (enable, start), answered in one light call when the unit already is
description:
  - An action plugin (runs on the control node) with the arguments of M(ansible.builtin.systemd_service)
    that the project's "enable and start" tasks use.
  - It asks the target once (M(labctl_unit_state), one C(systemctl show)) whether the unit is loaded,
    needs no daemon reload, runs (with O(state=started)) and is enabled or disabled as O(enabled)
    says. If so the task is ok and unchanged, with no daemon reload.
  - Otherwise the task goes with its own arguments to M(ansible.builtin.systemd_service), which
    reloads, enables, starts and reports. Check mode behaves as the builtin's.
  - This file only documents the arguments (for ansible-doc and ansible-lint); running it as a
    module fails.
options:
  name:
    description: The unit.
    type: str
    required: true
  enabled:
    description: Whether the unit starts at boot.
    type: bool
  state:
    description: C(started) - running after the task.
    type: str
    choices: [started]
  daemon_reload:
    description: Reload systemd first, when the unit is not already current (a changed unit file or drop-in).
    type: bool
    default: false
  no_block:
    description:
      - Queue the start and return (C(systemctl --no-block)) instead of waiting until the unit's start job ends
        (a unit with C(ExecStartPost=) or ordered C(After=) another unit's start). A unit already running needs no start.
    type: bool
    default: false
author:
  - labctl
"""

EXAMPLES = r"""
- name: Enable and start Prometheus
  labctl_service:
    name: prometheus.service
    enabled: true
    state: started
    daemon_reload: true
"""

RETURN = r"""
changed:
  description: Whether the unit was enabled, started or systemd reloaded.
  returned: always
  type: bool
answered_by:
  description: C(labctl_unit_state) when the one-call check found the unit current (absent when the builtin ran).
  returned: when the unit was current
  type: str
"""

if __name__ == "__main__":
    import json
    import sys

    print(json.dumps({"failed": True, "msg": "labctl_service is an action plugin: run it from a playbook"}))
    sys.exit(1)
