#!/usr/bin/python
"""Run one command that only reads, and return what it printed (ansible.builtin.command's answer)."""

from __future__ import annotations

import os
import shlex
import subprocess
import typing as t

DOCUMENTATION = r"""
---
module: labctl_read
short_description: Run a command that only reads the host and return its output, in one light call
description:
  - Runs one command (no shell) and returns C(rc), C(stdout), C(stderr) and their lines, as
    M(ansible.builtin.command) does; never reports a change, and runs in check mode too (the
    command must change nothing on the host - a query, a version, a state).
  - "The action plugin of the same name runs this file with the target's Python, without the
    module wrapper: one call of about 0.05 s over SSH instead of 0.2 s (Issue 31). Where that
    cannot run (no Python at the interpreter's path), this file runs as an ordinary module."
  - The command runs with C(LC_ALL=C), so what it prints does not depend on the host's language.
  - The task fails when the command exits with another status than 0, unless O(ok_rc) lists it;
    the task's own C(failed_when) decides instead where it has one.
options:
  argv:
    description: The command and its arguments, as a list. Give exactly one of O(argv) and O(cmd).
    type: list
    elements: str
  cmd:
    description: The command line, split as a POSIX shell would split it (quotes), but run without a shell.
    type: str
  stdin:
    description: Text given to the command on its standard input.
    type: str
  stdin_add_newline:
    description: Whether to end O(stdin) with a newline (as M(ansible.builtin.command) does).
    type: bool
    default: true
  ok_rc:
    description: The exit statuses that are not a failure.
    type: list
    elements: int
    default: [0]
author:
  - labctl
"""

EXAMPLES = r"""
- name: Read the state of the replicas' units
  labctl_read:
    argv: [systemctl, list-units, --all, --plain, --no-legend, --type=service, "vllm@*"]
  register: units

- name: List the driver packages (dpkg-query exits 1 when a pattern matches nothing)
  labctl_read:
    cmd: dpkg-query --show nvidia-driver-*
    ok_rc: [0, 1]
"""

RETURN = r"""
rc:
  description: The command's exit status; the error number when it cannot run (2 not found, 13 not executable).
  returned: always
  type: int
stdout:
  description: What it printed, without the trailing line ends (as ansible.builtin.command strips them).
  returned: always
  type: str
stderr:
  description: What it printed on standard error, without the trailing line ends.
  returned: always
  type: str
stdout_lines:
  description: O(stdout) split into lines.
  returned: always
  type: list
  elements: str
stderr_lines:
  description: O(stderr) split into lines.
  returned: always
  type: list
  elements: str
cmd:
  description: The command that ran.
  returned: always
  type: list
  elements: str
"""

# where get_bin_path looks beyond PATH: a command in /usr/sbin is found with become from a plain PATH
SBIN = ("/usr/local/sbin", "/usr/sbin", "/sbin")


def command_line(args: dict[str, t.Any]) -> list[str]:
    """The argv to run; ValueError for anything but exactly one of argv (non-empty list) and cmd."""
    argv, cmd = args.get("argv"), args.get("cmd")
    if (argv is None) == (cmd is None):
        raise ValueError("give exactly one of argv and cmd")
    words = [str(word) for word in argv] if isinstance(argv, list) else shlex.split(str(cmd))
    if not words:
        raise ValueError("the command is empty")
    return words


def light(args: dict[str, t.Any]) -> dict[str, t.Any]:
    """Run the command and answer as ansible.builtin.command would (plus failed, from ok_rc)."""
    try:
        argv = command_line(args)
    except ValueError as error:
        return {"failed": True, "msg": f"labctl_read: {error}", "rc": 256}
    path = os.environ.get("PATH", "/usr/bin:/bin")
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "LANGUAGE": "C",
           "PATH": ":".join([path, *[d for d in SBIN if d not in path.split(":")]])}
    stdin = args.get("stdin")
    cannot = ""
    try:
        if stdin is not None and args.get("stdin_add_newline", True):
            stdin = f"{stdin}\n"
        done = subprocess.run(argv, input=None if stdin is None else str(stdin).encode(), capture_output=True,
                              env=env, check=False)
        rc, out, err = done.returncode, done.stdout, done.stderr
    except OSError as error:  # not found, not executable: its errno, as ansible.builtin.command reports it
        rc, out, err, cannot = error.errno or 1, b"", b"", f"Error executing command: {error}"
    stdout = out.decode("utf-8", "replace").rstrip("\r\n")
    stderr = err.decode("utf-8", "replace").rstrip("\r\n")
    ok = [int(code) for code in (args.get("ok_rc") or [0])]
    # failed always said: ansible takes a result with a non-zero rc and no "failed" as a failure
    answer: dict[str, t.Any] = {"changed": False, "failed": rc not in ok, "rc": rc, "cmd": argv, "stdout": stdout,
                                "stderr": stderr, "stdout_lines": stdout.splitlines(), "stderr_lines": stderr.splitlines()}
    if rc not in ok:
        answer["msg"] = cannot or ("non-zero return code" if rc else f"return code 0 is not in {ok}")
    return answer


def main() -> None:
    from ansible.module_utils.basic import AnsibleModule  # here: the light run has no ansible to import

    module = AnsibleModule(
        argument_spec={"argv": {"type": "list", "elements": "str"}, "cmd": {"type": "str"}, "stdin": {"type": "str"},
                       "stdin_add_newline": {"type": "bool", "default": True},
                       "ok_rc": {"type": "list", "elements": "int", "default": [0]}},
        mutually_exclusive=[("argv", "cmd")], required_one_of=[("argv", "cmd")],
        supports_check_mode=True,
    )
    answer = light(module.params)
    if answer.pop("failed"):
        module.fail_json(**answer)
    module.exit_json(failed=False, **answer)


if __name__ == "__main__":
    main()
