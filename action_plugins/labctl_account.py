"""Action plugin: a service's system group and user (ansible.builtin.group then ansible.builtin.user)
in one task, answered in one light call when both already are as wanted.

Documentation and argument spec: library/labctl_account.py (a stub module for ansible-doc and
ansible-lint).

A role's account took two tasks, each a call on the target (0.25-0.5 s over SSH) even when nothing
changes. This action asks the target once (labctl_account_state: the group and user databases)
whether the group exists and the user has it as primary group, the home, the shell and exactly the
other groups given. If so the task is done. Otherwise ansible.builtin.group (system) and then
ansible.builtin.user (system, no home created, append: false for the other groups) run as the two
tasks did, in check mode too.
"""

from __future__ import annotations

import os
import typing as t

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

ARGS = frozenset(("group", "user", "home", "shell", "groups"))


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = True
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp: t.Any = None, task_vars: dict[str, t.Any] | None = None) -> dict[str, t.Any]:
        task_vars = task_vars if task_vars is not None else {}
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        unknown = sorted(set(args) - ARGS)
        if unknown or not isinstance(args.get("group"), str) or not args["group"]:
            raise AnsibleActionFail(f"labctl_account: group is required; unsupported: {', '.join(unknown) or '-'}")
        if args.get("user") and not (args.get("home") and args.get("shell")):
            raise AnsibleActionFail("labctl_account: a user needs its home and shell")
        if os.environ.get("LABCTL_FILE_ACTIONS", "") != "builtin":
            answer = self._shared_loader_obj.action_loader.get("labctl_read", class_only=True).probe(
                self, "labctl_account_state", args, task_vars)
            if answer.get("current"):
                result.update(changed=False, answered_by="labctl_account_state", group=args["group"],
                              user=args.get("user"))
                return result
        done = self._execute_module(module_name="ansible.legacy.group", task_vars=task_vars,
                                    module_args={"name": args["group"], "system": True})
        if done.get("failed") or not args.get("user"):
            return {**result, **done}
        user_args: dict[str, t.Any] = {"name": args["user"], "group": args["group"], "system": True,
                                       "home": args["home"], "create_home": False, "shell": args["shell"]}
        if args.get("groups") is not None:
            user_args.update(groups=list(args["groups"]), append=False)
        made = self._execute_module(module_name="ansible.legacy.user", module_args=user_args, task_vars=task_vars)
        return {**result, **made, "changed": bool(done.get("changed")) or bool(made.get("changed"))}
