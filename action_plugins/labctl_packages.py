"""Action plugin: ansible.builtin.apt (state present), answered in one light call when every package
is already installed.

Documentation and argument spec: library/labctl_packages.py (a stub module for ansible-doc and
ansible-lint).

ansible.builtin.apt opens apt's cache before it can say that installed packages are installed:
0.3 to 1.3 s per task over SSH, ten tasks in a no-op re-run. This action asks dpkg's database once
(labctl_package_state: one dpkg-query) whether every name is installed, at exactly the version
given with name=version. If so the task is done: ok, nothing changed. In every other case, and for
any argument beyond name, state (present), install_recommends, allow_change_held_packages and
allow_downgrade (which matter only to an install), the task goes unchanged to ansible.builtin.apt,
which installs and reports as usual.
"""

from __future__ import annotations

import os
import typing as t

from ansible.plugins.action import ActionBase

FAST_ARGS = frozenset(("name", "state", "install_recommends", "allow_change_held_packages", "allow_downgrade"))


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = True
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp: t.Any = None, task_vars: dict[str, t.Any] | None = None) -> dict[str, t.Any]:
        task_vars = task_vars if task_vars is not None else {}
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        names = args.get("name")
        names = [names] if isinstance(names, str) else names
        fast = (set(args) <= FAST_ARGS and args.get("state", "present") == "present" and isinstance(names, list)
                and bool(names) and all(isinstance(n, str) for n in names)
                and os.environ.get("LABCTL_FILE_ACTIONS", "") != "builtin")
        if fast:
            answer = self._shared_loader_obj.action_loader.get("labctl_read", class_only=True).probe(
                self, "labctl_package_state", {"names": names}, task_vars)
            packages = answer.get("packages") or [] if not answer.get("failed") else []
            if packages and all(p.get("current") for p in packages):
                result.update(changed=False, answered_by="labctl_package_state",
                              packages={p["name"]: p["version"] for p in packages})
                return result
        done = self._execute_module(module_name="ansible.legacy.apt", module_args=args, task_vars=task_vars)
        return {**result, **done}
