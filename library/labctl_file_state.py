#!/usr/bin/python
"""Say, in one call and without changing anything, whether files and directories already are as wanted."""

from __future__ import annotations

import grp
import hashlib
import os
import pwd
import re
import shutil
import stat
import subprocess
import typing as t

from ansible.module_utils.labctl.sums import pump

DOCUMENTATION = r"""
---
module: labctl_file_state
short_description: Tell whether files already hold the given content and directories exist, with owner, group and mode
description:
  - Reads each path on the target and compares it with what a write would produce; changes nothing.
  - "The one call of the labctl_template and labctl_directories actions: a path that is current
    needs nothing more, any other is handed to M(ansible.builtin.template), M(ansible.builtin.copy)
    or M(ansible.builtin.file), which change it."
  - A file is current only when it is a regular file (not a link) whose SHA-1 equals its
    C(checksum); a directory only when it is a directory (not a link). In both cases C(owner),
    C(group) and C(mode), where given, must match. A symbolic mode, a host with SELinux enabled,
    an unknown user or group all answer "not current", so the full module decides.
options:
  files:
    description: The paths to judge, in order.
    type: list
    elements: dict
    required: true
    suboptions:
      path:
        description: The file or directory.
        type: path
        required: true
      state:
        description: What the path should be (C(absent) - nothing at that path, not even a link).
        type: str
        choices: [file, directory, absent]
        default: file
      checksum:
        description: SHA-1 (hex) of the content a file should hold (for C(state=file), this or O(files[].same_as)).
        type: str
      same_as:
        description: A file on the target whose content this file should hold (a copy with C(remote_src)).
        type: path
      owner:
        description: User name or numeric id the path should belong to.
        type: str
      group:
        description: Group name or numeric id the path should belong to.
        type: str
      mode:
        description: Octal permission bits (C("0640")); a symbolic mode is never judged current.
        type: raw
author:
  - labctl
"""

EXAMPLES = r"""
- name: Are the unit and its directory current?
  labctl_file_state:
    files:
      - path: /etc/systemd/system/vllm@.service.d
        state: directory
        owner: root
        group: root
        mode: "0755"
      - path: /etc/systemd/system/vllm@.service
        checksum: "{{ rendered | hash('sha1') }}"
        owner: root
        group: root
        mode: "0644"
"""

RETURN = r"""
files:
  description:
    - One answer per path, in order. C(current) says whether the path is exactly as wanted,
      C(reason) why not (empty when it is). A current path also carries its C(path), C(state),
      C(owner), C(group), C(uid), C(gid), C(mode) and C(size), and a file its C(checksum).
  returned: always
  type: list
  elements: dict
"""

_OCTAL = re.compile(r"0?[0-7]{3,4}")


def _want_mode(mode: t.Any) -> int | None:
    """The permission bits asked for; None for a mode this module does not judge (symbolic)."""
    if isinstance(mode, int):
        return mode
    text = str(mode)
    return int(text, 8) if _OCTAL.fullmatch(text) else None


def _want_id(name: str, by_name: t.Callable[[str], t.Any], attr: str) -> int | None:
    if name.isdigit():
        return int(name)
    try:
        return int(getattr(by_name(name), attr))
    except KeyError:
        return None


def sha1(path: str) -> str:
    """The SHA-1 ansible.builtin.copy and stat report, read through sums.pump."""
    digest = hashlib.sha1()
    with open(path, "rb", buffering=0) as reader:
        pump(reader, digest)
    return digest.hexdigest()


def selinux_enabled() -> bool:
    """Whether SELinux is on, without ansible (AnsibleModule.selinux_enabled() asks libselinux's
    bindings): its file system mounted, or selinuxenabled saying so. Never wrong the other way: on,
    the builtin decides (and sets the contexts)."""
    if os.path.exists("/sys/fs/selinux/enforce"):
        return True
    tool = shutil.which("selinuxenabled", path="/usr/sbin:/sbin:/usr/bin:/bin")
    return tool is not None and subprocess.run([tool], check=False).returncode == 0


def path_state(want: dict[str, t.Any], selinux: bool) -> dict[str, t.Any]:
    """Whether one path is as `want` says, with its attributes when it is."""
    path: str = want["path"]
    directory = want.get("state") == "directory"
    if want.get("state") == "absent":
        # nothing there, not even a dangling link, is current
        return {"current": True, "reason": "", "path": path, "state": "absent"} if not os.path.lexists(path) \
            else {"current": False, "reason": "present"}
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return {"current": False, "reason": "missing"}
    if not (stat.S_ISDIR(st.st_mode) if directory else stat.S_ISREG(st.st_mode)):
        return {"current": False, "reason": "not a directory" if directory else "not a regular file"}
    if want.get("mode") is not None:
        wanted = _want_mode(want["mode"])
        if wanted is None or wanted != stat.S_IMODE(st.st_mode):
            return {"current": False, "reason": "mode"}
    for key, by_name, attr, have in (("owner", pwd.getpwnam, "pw_uid", st.st_uid),
                                     ("group", grp.getgrnam, "gr_gid", st.st_gid)):
        if want.get(key) is not None and _want_id(str(want[key]), by_name, attr) != have:
            return {"current": False, "reason": key}
    if selinux:
        return {"current": False, "reason": "selinux"}
    facts: dict[str, t.Any] = {
        "current": True, "reason": "", "path": path, "state": "directory" if directory else "file",
        "size": st.st_size, "uid": st.st_uid, "gid": st.st_gid, "mode": "0%03o" % stat.S_IMODE(st.st_mode),
    }
    try:
        facts["owner"] = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        facts["owner"] = str(st.st_uid)
    try:
        facts["group"] = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        facts["group"] = str(st.st_gid)
    if not directory:
        try:
            facts["checksum"] = sha1(path)
            wanted_sum = sha1(want["same_as"]) if want.get("same_as") else want.get("checksum")
        except OSError:
            return {"current": False, "reason": "unreadable"}
        if facts["checksum"] != wanted_sum:
            return {"current": False, "reason": "content"}
    return facts


def light(args: dict[str, t.Any]) -> dict[str, t.Any]:
    """The answer, run by the labctl actions without the module wrapper (action_plugins/labctl_read.py)."""
    files = [{"state": "file", **want} for want in args["files"]]
    selinux = selinux_enabled()
    return {"changed": False, "files": [path_state(want, selinux) for want in files]}


def main() -> None:
    from ansible.module_utils.basic import AnsibleModule  # here: the light run has no ansible to import

    module = AnsibleModule(
        argument_spec={
            "files": {
                "type": "list", "elements": "dict", "required": True,
                "options": {
                    "path": {"type": "path", "required": True},
                    "state": {"type": "str", "choices": ["file", "directory", "absent"], "default": "file"},
                    "checksum": {"type": "str"},
                    "same_as": {"type": "path"},
                    "owner": {"type": "str"},
                    "group": {"type": "str"},
                    "mode": {"type": "raw"},
                },
                "required_if": [("state", "file", ("checksum", "same_as"), True)],
            },
        },
        supports_check_mode=True,
    )
    selinux = module.selinux_enabled()
    module.exit_json(changed=False, files=[path_state(want, selinux) for want in module.params["files"]])


if __name__ == "__main__":
    main()
