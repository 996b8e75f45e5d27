#!/usr/bin/python
"""Ansible module: apply kernel parameters live where the kernel lets us."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: labctl_sysctl
short_description: Apply sysctl values live where the kernel allows it
description:
  - For each key, reads C(/proc/sys); when the value differs and the file is writable, writes it.
  - Keys the kernel does not have, and keys that are read-only here (containers mount /proc/sys
    read-only; some values belong to the host's network namespace), are reported, not failed:
    persisting them in C(/etc/sysctl.d) is the caller's job and takes effect at boot.
  - Whitespace inside values is normalised, so C(4096 87380 134217728) matches the kernel's tabs.
options:
  values:
    description: Mapping of sysctl key (dotted) to the wanted value.
    type: dict
    required: true
  proc_root:
    description: Where the kernel parameters are read and written (tests point it elsewhere).
    type: path
    default: /proc/sys
author:
  - labctl maintainers
"""

EXAMPLES = r"""
- name: Apply kernel parameters now
  labctl_sysctl:
    values:
      vm.swappiness: 1
"""

RETURN = r"""
applied:
  description: Keys written now (or that would be, in check mode).
  returned: always
  type: list
in_effect:
  description: Keys whose live value already matched.
  returned: always
  type: list
read_only:
  description: Keys that differ but cannot be written here (persisted only, effective at boot).
  returned: always
  type: list
absent:
  description: Keys this kernel does not have.
  returned: always
  type: list
"""

import os

from ansible.module_utils.basic import AnsibleModule


def _norm(value: object) -> str:
    return " ".join(str(value).split())


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "values": {"type": "dict", "required": True},
            "proc_root": {"type": "path", "default": "/proc/sys"},
        },
        supports_check_mode=True,
    )
    applied, in_effect, read_only, absent = [], [], [], []
    for key, wanted in sorted(module.params["values"].items()):
        path = os.path.join(module.params["proc_root"], *key.split("."))
        if not os.path.exists(path):
            absent.append(key)
            continue
        with open(path, encoding="ascii") as handle:
            current = _norm(handle.read())
        if current == _norm(wanted):
            in_effect.append(key)
            continue
        if not os.access(path, os.W_OK):
            read_only.append(key)
            continue
        if not module.check_mode:
            try:
                with open(path, "w", encoding="ascii") as handle:
                    handle.write(_norm(wanted) + "\n")
            except OSError as exc:
                # EROFS/EPERM/EACCES: this kernel or namespace does not let us; keep it persisted.
                read_only.append(key)
                module.warn(f"{key}: not writable here ({exc.strerror}); it takes effect at boot")
                continue
        applied.append(key)
    module.exit_json(
        changed=bool(applied), applied=applied, in_effect=in_effect, read_only=read_only, absent=absent
    )


if __name__ == "__main__":
    main()
