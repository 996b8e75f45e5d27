#!/usr/bin/python
"""Documentation stub of the labctl_template action plugin (action_plugins/labctl_template.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: labctl_template
short_description: ansible.builtin.template, answered in one call when the file is already current
description:
  - An action plugin (runs on the control node) with the arguments of M(ansible.builtin.template)
    that the project uses.
  - It renders O(src) as the builtin does and asks the target once (M(labctl_file_state)) whether
    O(dest) already holds exactly that content with O(owner), O(group) and O(mode). If so the task
    is ok and unchanged after that one call; the builtin needs five on the target (home
    directory, temporary directory, stat, file, cleanup).
  - Otherwise, or with an argument not listed here, the task is handed unchanged to
    M(ansible.builtin.template), which writes, validates, diffs and reports. Check mode and diff
    mode behave as the builtin's.
  - Exactly one of O(src), O(content) and O(files) is given.
  - "With O(files) one task writes several files and directories: one call on the target judges
    them all; only those not current go, in order, to M(ansible.builtin.template),
    M(ansible.builtin.copy) or M(ansible.builtin.file). The task is changed when any entry
    changed; its C(results) hold one answer per entry, C(changed_files) the paths written."
  - This file only documents the arguments (for ansible-doc and ansible-lint); running it as a
    module fails.
options:
  src:
    description: The Jinja2 template, looked up in the role's C(templates/) like the builtin's.
    type: path
  content:
    description:
      - Instead of O(src), the exact text of the file, as M(ansible.builtin.copy)'s C(content) (for
        a generated file that cannot carry a comment, such as a JSON dashboard). The fallback is
        then M(ansible.builtin.copy).
    type: str
  dest:
    description: The file on the target (required without O(files)).
    type: path
  files:
    description: Several files and directories, each judged in the same one call.
    type: list
    elements: dict
    suboptions:
      src:
        description: A template, as O(src); with O(files[].remote_src) a file already on the target.
        type: path
      remote_src:
        description:
          - O(files[].src) is a file on the target, copied as it is (as M(ansible.builtin.copy) with
            C(remote_src)); current when the destination has the same content (SHA-1 of both, in the one call).
        type: bool
        default: false
      content:
        description: The exact text, as O(content).
        type: str
      state:
        description:
          - C(directory) for a directory (no O(files[].src) nor O(files[].content)).
          - C(absent) for a path to remove (O(files[].dest) alone).
        type: str
        choices: [file, directory, absent]
        default: file
      dest:
        description: The file or directory on the target.
        type: path
        required: true
      owner:
        description: Owner (required unless C(state=absent)).
        type: str
      group:
        description: Group (required unless C(state=absent)).
        type: str
      mode:
        description: Octal permission bits, quoted (required unless C(state=absent)).
        type: raw
      validate:
        description: As O(validate).
        type: str
      vars:
        description: Variables added to the template's (a loop item, such as the replica the file is for).
        type: dict
      variable_start_string:
        description: As O(variable_start_string).
        type: str
      variable_end_string:
        description: As O(variable_end_string).
        type: str
  owner:
    description: Owner of the file.
    type: str
  group:
    description: Group of the file.
    type: str
  mode:
    description: Octal permission bits, quoted (C("0644")).
    type: raw
  validate:
    description: Command that checks the new file (C(%s) is its path) before it replaces O(dest).
    type: str
  backup:
    description: Keep a timestamped copy of the file it replaces.
    type: bool
    default: false
  variable_start_string:
    description: Jinja2's variable start, as in M(ansible.builtin.template).
    type: str
  variable_end_string:
    description: Jinja2's variable end.
    type: str
  block_start_string:
    description: Jinja2's block start.
    type: str
  block_end_string:
    description: Jinja2's block end.
    type: str
  comment_start_string:
    description: Jinja2's comment start.
    type: str
  comment_end_string:
    description: Jinja2's comment end.
    type: str
author:
  - labctl
"""

EXAMPLES = r"""
- name: Write the systemd template unit
  labctl_template:
    src: vllm@.service.j2
    dest: /etc/systemd/system/vllm@.service
    owner: root
    group: root
    mode: "0644"
  notify: Reload systemd

- name: Write the environment and each replica's flags (one call when all are current)
  labctl_template:
    files:
      - src: vllm.env.j2
        dest: /etc/labctl/vllm/vllm.env
        owner: root
        group: vllm
        mode: "0640"
      - dest: /etc/labctl/vllm/replicas
        state: directory
        owner: root
        group: vllm
        mode: "0750"
      - src: replica.yaml.j2
        dest: /etc/labctl/vllm/replicas/0.yaml
        owner: root
        group: vllm
        mode: "0640"
        vars:
          replica: {index: 0, port: 8000}
  register: written
"""

RETURN = r"""
changed:
  description: Whether the file was written or its attributes set.
  returned: always
  type: bool
checksum:
  description: SHA-1 of the file's content.
  returned: success
  type: str
results:
  description: With O(files), one answer per entry (C(dest), C(changed)), in order.
  returned: with files
  type: list
  elements: dict
changed_files:
  description: With O(files), the paths written or whose attributes were set.
  returned: with files
  type: list
  elements: str
answered_by:
  description: C(labctl_file_state) when the one-call check found the file current (absent when the builtin ran).
  returned: when the file was current
  type: str
"""

if __name__ == "__main__":
    import json
    import sys

    print(json.dumps({"failed": True, "msg": "labctl_template is an action plugin: run it from a playbook"}))
    sys.exit(1)
