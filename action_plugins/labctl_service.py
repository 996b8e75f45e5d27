"""Action plugin: ansible.builtin.systemd_service (enable and start), answered in one light call when
the unit is already enabled, running and loaded from its current files.

Documentation and argument spec: library/labctl_service.py (a stub module for ansible-doc and
ansible-lint).

A no-op re-run asks about a dozen units to be enabled and started, most with daemon_reload: true.
ansible.builtin.systemd_service then reloads systemd (every unit file re-read) and queries the unit,
0.45 s per task over SSH. This action asks the target once (labctl_unit_state: one
`systemctl show`) whether the unit is loaded, needs no daemon reload, runs and is enabled as asked.
If so the task is done: ok, nothing changed, no reload. In every other case, and for any argument
beyond name, enabled, state (started), daemon_reload and no_block, the task goes unchanged to
ansible.builtin.systemd_service, which reloads, enables, starts and reports as usual. A unit whose
files changed since systemd loaded them reports NeedDaemonReload=yes, so a changed unit file or
drop-in always takes the builtin's path, with its reload; so does a timer whose service's file
changed (the probe reads the units it triggers too).
"""

from __future__ import annotations

import os
import typing as t

from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase

# no_block only changes how a start the unit needs is made (systemctl --no-block): a unit already running
# needs none.
FAST_ARGS = frozenset(("name", "enabled", "state", "daemon_reload", "no_block"))


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = True
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp: t.Any = None, task_vars: dict[str, t.Any] | None = None) -> dict[str, t.Any]:
        task_vars = task_vars if task_vars is not None else {}
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        try:
            enabled, plain = (None if args.get("enabled") is None else boolean(args["enabled"], strict=True)), True
        except TypeError:
            enabled, plain = None, False  # not a boolean: the builtin says so
        fast = (plain and set(args) <= FAST_ARGS and isinstance(args.get("name"), str) and args.get("state") in (None, "started")
                and os.environ.get("LABCTL_FILE_ACTIONS", "") != "builtin")
        if fast:
            want: dict[str, t.Any] = {"name": args["name"], "started": args.get("state") == "started"}
            if enabled is not None:
                want["enabled"] = enabled
            answer = self._shared_loader_obj.action_loader.get("labctl_read", class_only=True).probe(
                self, "labctl_unit_state", {"units": [want]}, task_vars)
            state = (answer.get("units") or [{}])[0] if not answer.get("failed") else {}
            if state.get("current"):
                status = state.get("status", {})
                result.update(changed=False, name=args["name"], answered_by="labctl_unit_state",
                              enabled=status.get("UnitFileState") == "enabled",
                              state="started" if status.get("ActiveState") == "active" else "stopped", status=status)
                return result
        done = self._execute_module(module_name="ansible.legacy.systemd_service", module_args=args, task_vars=task_vars)
        return {**result, **done}
