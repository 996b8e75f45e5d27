"""Action plugin: several directories, each with its owner, group and mode, in one call when all are current.

Documentation and argument spec: library/labctl_directories.py (a stub module for ansible-doc and
ansible-lint).

A loop of ansible.builtin.file (state=directory) costs one call on the target per directory even
when nothing changes. This action asks the target once (labctl_file_state) about every directory
and runs ansible.builtin.file (state=directory) only for those that are missing or have another
owner, group or mode; that module then creates or fixes them, in check mode and diff mode as usual.
"""

from __future__ import annotations

import os
import typing as t

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

KEYS = ("path", "owner", "group", "mode")


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = True
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp: t.Any = None, task_vars: dict[str, t.Any] | None = None) -> dict[str, t.Any]:
        task_vars = task_vars if task_vars is not None else {}
        result = super().run(tmp, task_vars)
        wanted = self._wanted()
        if os.environ.get("LABCTL_FILE_ACTIONS", "") == "builtin":  # measurement: one file call per directory
            answer: dict[str, t.Any] = {"files": [{} for _ in wanted]}
        else:
            answer = self._shared_loader_obj.action_loader.get("labctl_read", class_only=True).probe(
                self, "labctl_file_state", {"files": [{**want, "state": "directory"} for want in wanted]}, task_vars)
        if answer.get("failed"):
            return {**result, **answer}
        results: list[dict[str, t.Any]] = []
        diffs: list[t.Any] = []
        for want, state in zip(wanted, answer["files"], strict=True):
            if state.get("current"):
                results.append({**state, "changed": False})
                continue
            done = self._execute_module(module_name="ansible.legacy.file",
                                        module_args={**want, "state": "directory"}, task_vars=task_vars)
            if done.get("failed"):
                return {**result, **done, "failed": True, "msg": f"{want['path']}: {done.get('msg', 'failed')}"}
            if done.get("diff"):
                diffs.append(done["diff"])
            results.append({key: value for key, value in done.items() if key != "diff"})
        result.update(changed=any(r.get("changed") for r in results), directories=results)
        if diffs:
            result["diff"] = diffs
        return result

    def _wanted(self) -> list[dict[str, t.Any]]:
        """The directories argument, checked: a list of {path, owner, group, mode}, all four given."""
        directories = self._task.args.get("directories")
        extra = sorted(set(self._task.args) - {"directories"})
        if extra:
            raise AnsibleActionFail(f"labctl_directories: unsupported argument(s) {', '.join(extra)}")
        if not isinstance(directories, list) or not directories:
            raise AnsibleActionFail("labctl_directories: directories must be a non-empty list")
        wanted = []
        for number, entry in enumerate(directories, 1):
            if not isinstance(entry, dict) or set(entry) != set(KEYS) or not all(entry.values()):
                raise AnsibleActionFail(
                    f"labctl_directories: entry {number} needs exactly path, owner, group and mode, got {entry!r}")
            wanted.append({key: entry[key] for key in KEYS})
        return wanted
