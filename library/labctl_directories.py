#!/usr/bin/python
"""Documentation stub of the labctl_directories action plugin (action_plugins/labctl_directories.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: labctl_directories
short_description: Several directories with their owner, group and mode, one call on the target when all are current
description:
  - An action plugin (runs on the control node). It asks the target once (M(labctl_file_state))
    whether every directory in O(directories) exists with its owner, group and mode, then runs
    M(ansible.builtin.file) with C(state=directory) for each one that does not. A loop of
    M(ansible.builtin.file) costs a call per directory even when nothing changes.
  - Check mode and diff mode behave as M(ansible.builtin.file)'s. The task is changed when any
    directory was created or fixed; C(directories) has one entry per directory.
  - This file only documents the arguments (for ansible-doc and ansible-lint); running it as a
    module fails.
options:
  directories:
    description: The directories, in the order they are made (a parent before its children).
    type: list
    elements: dict
    required: true
    suboptions:
      path:
        description: The directory (parents are created as M(ansible.builtin.file) does).
        type: path
        required: true
      owner:
        description: Its owner.
        type: str
        required: true
      group:
        description: Its group.
        type: str
        required: true
      mode:
        description: Its octal permission bits, quoted (C("0750")).
        type: raw
        required: true
author:
  - labctl
"""

EXAMPLES = r"""
- name: Create the directories
  labctl_directories:
    directories:
      - {path: /opt/vllm, owner: root, group: root, mode: "0755"}
      - {path: /var/lib/vllm, owner: vllm, group: vllm, mode: "0750"}
"""

RETURN = r"""
directories:
  description: One result per directory, in order (C(path), C(changed), C(owner), C(group), C(mode), ...).
  returned: always
  type: list
  elements: dict
"""

if __name__ == "__main__":
    import json
    import sys

    print(json.dumps({"failed": True, "msg": "labctl_directories is an action plugin: run it from a playbook"}))
    sys.exit(1)
