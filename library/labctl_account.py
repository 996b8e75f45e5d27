#!/usr/bin/python
"""Documentation stub of the labctl_account action plugin (action_plugins/labctl_account.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: labctl_account
short_description: A service's system group and user in one task, answered in one light call when both already are
description:
  - An action plugin (runs on the control node). It asks the target once (M(labctl_account_state))
    whether O(group) exists and O(user) has it as primary group, with O(home), O(shell) and exactly
    O(groups). If so the task is ok and unchanged.
  - Otherwise M(ansible.builtin.group) (C(system=true)) and then M(ansible.builtin.user)
    (C(system=true), C(create_home=false), C(append=false) with O(groups)) run, in check mode too.
  - This file only documents the arguments (for ansible-doc and ansible-lint); running it as a
    module fails.
options:
  group:
    description: The system group (the user's primary group).
    type: str
    required: true
  user:
    description: The system user (omitted - the group alone).
    type: str
  home:
    description: The user's home (not created). Required with O(user).
    type: path
  shell:
    description: The user's shell. Required with O(user).
    type: path
  groups:
    description: The user's other groups, exactly (omitted - left as they are).
    type: list
    elements: str
author:
  - labctl
"""

EXAMPLES = r"""
- name: Create the service group and user
  labctl_account:
    group: litellm
    user: litellm
    home: /var/lib/litellm
    shell: /usr/sbin/nologin
"""

RETURN = r"""
changed:
  description: Whether the group or the user was created or changed.
  returned: always
  type: bool
answered_by:
  description: C(labctl_account_state) when both were already as asked (absent when the builtins ran).
  returned: when current
  type: str
"""

if __name__ == "__main__":
    import json
    import sys

    print(json.dumps({"failed": True, "msg": "labctl_account is an action plugin: run it from a playbook"}))
    sys.exit(1)
