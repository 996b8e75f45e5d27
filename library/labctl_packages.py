#!/usr/bin/python
"""Documentation stub of the labctl_packages action plugin (action_plugins/labctl_packages.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: labctl_packages
short_description: ansible.builtin.apt (state present), answered in one light call when every package is installed
description:
  - An action plugin (runs on the control node) with the arguments of M(ansible.builtin.apt) that the
    project's install tasks use.
  - It asks dpkg's database once (M(labctl_package_state)) whether every package is installed (at
    exactly the version given as C(name=version)). If so the task is ok and unchanged; apt's cache
    is never opened.
  - Otherwise the task goes with its own arguments to M(ansible.builtin.apt), which installs and
    reports. Check mode behaves as the builtin's.
  - This file only documents the arguments (for ansible-doc and ansible-lint); running it as a
    module fails.
options:
  name:
    description: A package or a list of packages, each optionally C(name=version).
    type: list
    elements: str
    required: true
  state:
    description: C(present) - installed after the task.
    type: str
    choices: [present]
    default: present
  install_recommends:
    description: As M(ansible.builtin.apt)'s, for an install.
    type: bool
  allow_change_held_packages:
    description: As M(ansible.builtin.apt)'s, for an install.
    type: bool
    default: false
  allow_downgrade:
    description: As M(ansible.builtin.apt)'s, for an install.
    type: bool
    default: false
author:
  - labctl
"""

EXAMPLES = r"""
- name: Install PostgreSQL
  labctl_packages:
    name: [postgresql, postgresql-contrib]
    state: present
"""

RETURN = r"""
changed:
  description: Whether apt installed anything.
  returned: always
  type: bool
answered_by:
  description: C(labctl_package_state) when every package was installed (absent when apt ran).
  returned: when every package was installed
  type: str
"""

if __name__ == "__main__":
    import json
    import sys

    print(json.dumps({"failed": True, "msg": "labctl_packages is an action plugin: run it from a playbook"}))
    sys.exit(1)
