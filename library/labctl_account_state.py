#!/usr/bin/python
"""Say, in one light call and without changing anything, whether a system group and user already are as wanted."""

from __future__ import annotations

import grp
import pwd
import typing as t

DOCUMENTATION = r"""
---
module: labctl_account_state
short_description: Tell whether a group and a user exist with the given primary group, home, shell and other groups
description:
  - Reads the host's group and user databases (NSS); changes nothing.
  - "The probe of the labctl_account action: an account that is current needs nothing more, any other
    goes to M(ansible.builtin.group) and M(ansible.builtin.user) with the task's arguments."
options:
  group:
    description: The group (the user's primary group when O(user) is given).
    type: str
    required: true
  user:
    description: The user.
    type: str
  home:
    description: The user's home directory.
    type: path
  shell:
    description: The user's shell.
    type: path
  groups:
    description: The user's other groups, exactly (omitted - not judged).
    type: list
    elements: str
author:
  - labctl
"""

EXAMPLES = r"""
- name: Are the proxy's group and user as wanted?
  labctl_account_state:
    group: litellm
    user: litellm
    home: /var/lib/litellm
    shell: /usr/sbin/nologin
"""

RETURN = r"""
current:
  description: Whether the group and the user exist exactly as asked.
  returned: always
  type: bool
reason:
  description: Why not (empty when current).
  returned: always
  type: str
"""


def judge(want: dict[str, t.Any]) -> dict[str, t.Any]:
    try:
        group = grp.getgrnam(want["group"])
    except KeyError:
        return {"current": False, "reason": f"no group {want['group']}"}
    if not want.get("user"):
        return {"current": True, "reason": "", "gid": group.gr_gid}
    try:
        user = pwd.getpwnam(want["user"])
    except KeyError:
        return {"current": False, "reason": f"no user {want['user']}"}
    for key, have, wanted in (("primary group", user.pw_gid, group.gr_gid), ("home", user.pw_dir, want.get("home")),
                              ("shell", user.pw_shell, want.get("shell"))):
        if wanted is not None and have != wanted:
            return {"current": False, "reason": f"{key} {have}"}
    if want.get("groups") is not None:
        others = sorted(g.gr_name for g in grp.getgrall() if want["user"] in g.gr_mem and g.gr_gid != user.pw_gid)
        if others != sorted(set(want["groups"])):
            return {"current": False, "reason": f"other groups {', '.join(others) or 'none'}"}
    return {"current": True, "reason": "", "uid": user.pw_uid, "gid": group.gr_gid}


def light(args: dict[str, t.Any]) -> dict[str, t.Any]:
    """The answer, run by the labctl actions without the module wrapper (action_plugins/labctl_read.py)."""
    return {"changed": False, **judge(args)}


def main() -> None:
    from ansible.module_utils.basic import AnsibleModule  # here: the light run has no ansible to import

    module = AnsibleModule(
        argument_spec={"group": {"type": "str", "required": True}, "user": {"type": "str"}, "home": {"type": "path"},
                       "shell": {"type": "path"}, "groups": {"type": "list", "elements": "str"}},
        supports_check_mode=True,
    )
    module.exit_json(**light(module.params))


if __name__ == "__main__":
    main()
