#!/usr/bin/python
"""Say, in one light call and without changing anything, whether Debian packages are already installed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import typing as t

DOCUMENTATION = r"""
---
module: labctl_package_state
short_description: Tell whether Debian packages are installed (at a given version), reading dpkg's database only
description:
  - Reads the packages' state with one C(dpkg-query); changes nothing and opens no apt cache.
  - "The probe of the labctl_packages action: when every package is installed the task needs nothing
    more, otherwise it goes to M(ansible.builtin.apt) with the task's own arguments."
  - C(name) is installed when dpkg says so (status C(installed), no error flag); C(name=version) only
    when the installed version is exactly C(version). A name with a wildcard, a version relation or a
    path, a virtual package, a package half installed or unknown all answer "not current", so apt decides.
options:
  names:
    description: Package names, each optionally C(=version).
    type: list
    elements: str
    required: true
author:
  - labctl
"""

EXAMPLES = r"""
- name: Are PostgreSQL's packages installed?
  labctl_package_state:
    names: [postgresql, postgresql-contrib]
"""

RETURN = r"""
packages:
  description: One answer per name, in order. C(current) says whether it is installed as asked, C(reason) why not.
  returned: always
  type: list
  elements: dict
"""

PLAIN = re.compile(r"^[a-z0-9][a-z0-9+.-]+(:[a-z0-9-]+)?$")


def installed(text: str) -> dict[str, tuple[str, str]]:
    """dpkg-query's `${Package}\\t${Version}\\t${db:Status-Abbrev}` lines: package -> (version, status)."""
    found: dict[str, tuple[str, str]] = {}
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) == 3:
            found[parts[0]] = (parts[1], parts[2])
    return found


def judge(spec: str, known: dict[str, tuple[str, str]]) -> dict[str, t.Any]:
    name, _, version = spec.partition("=")
    if not PLAIN.match(name) or (version and not re.match(r"^[A-Za-z0-9.+~:-]+$", version)):
        return {"name": spec, "current": False, "reason": "not a plain package name"}
    have = known.get(name) or known.get(name.split(":")[0])
    if have is None:
        return {"name": spec, "current": False, "reason": "not installed"}
    status = have[1]
    # db:Status-Abbrev: desired (u, i, h, r, p), status (n, i, c, U, F, H, W, t), error flag (space or R)
    if len(status) < 2 or status[1] != "i" or status[2:].strip():
        return {"name": spec, "current": False, "reason": f"dpkg status {status.strip() or '?'}"}
    if version and have[0] != version:
        return {"name": spec, "current": False, "reason": f"version {have[0]}"}
    return {"name": spec, "current": True, "reason": "", "version": have[0]}


FORMAT = "-f=${Package}\\t${Version}\\t${db:Status-Abbrev}\\n"


def light(args: dict[str, t.Any]) -> dict[str, t.Any]:
    """The answer, run by the labctl actions without the module wrapper (action_plugins/labctl_read.py)."""
    names = [str(name) for name in args["names"]]
    query = shutil.which("dpkg-query", path="/usr/bin:/bin:/usr/sbin:/sbin")
    plain = [n.partition("=")[0] for n in names if PLAIN.match(n.partition("=")[0])]
    known: dict[str, tuple[str, str]] = {}
    if query and plain:
        # exit status 1 when a name is unknown: the others are still listed
        done = subprocess.run([query, "-W", FORMAT, "--", *plain], capture_output=True, check=False,
                              env={**os.environ, "LC_ALL": "C", "LANG": "C"})
        known = installed(done.stdout.decode("utf-8", "replace"))
    return {"changed": False, "packages": [judge(n, known) for n in names]}


def main() -> None:
    from ansible.module_utils.basic import AnsibleModule  # here: the light run has no ansible to import

    module = AnsibleModule(argument_spec={"names": {"type": "list", "elements": "str", "required": True}},
                           supports_check_mode=True)
    module.exit_json(**light(module.params))


if __name__ == "__main__":
    main()
