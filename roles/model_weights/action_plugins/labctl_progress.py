"""Action plugin: one progress line of a running async job, read from its progress file.

Documentation and argument spec: library/labctl_progress.py (a stub module for ansible-doc and
ansible-lint). Meant for ``until: result.finished`` with ``retries`` and ``delay: 0``: each call
waits up to ``wait`` seconds for the job, then returns the job's result when it finished, or a
progress line otherwise. ``_ansible_verbose_always`` makes the default callback print that line
on every retry ("FAILED - RETRYING: ... Result was: {... "msg": "gpt-oss-120b r1: ..."}"),
without -v.
"""

from __future__ import annotations

import base64
import json
import time
import typing as t

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

# Keys of the finished job's result that are async bookkeeping, not the module's answer.
_ASYNC_KEYS = frozenset(("ansible_job_id", "results_file", "started", "finished", "erased", "stdout", "stderr",
                         "stdout_lines", "stderr_lines", "_ansible_parsed"))


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = True
    _supports_check_mode = True
    _supports_async = False

    def _async_status(self, jid: str, mode: str, task_vars: dict[str, t.Any]) -> dict[str, t.Any]:
        option = self.get_shell_option("async_dir", default="~/.ansible_async")  # type: ignore[no-untyped-call]
        async_dir = self._remote_expand_user(option)  # type: ignore[no-untyped-call]
        return self._execute_module(  # type: ignore[no-any-return]
            module_name="ansible.legacy.async_status",
            module_args={"jid": jid, "mode": mode, "_async_dir": async_dir},
            task_vars=task_vars,
        )

    def _progress(self, path: str, task_vars: dict[str, t.Any]) -> dict[str, t.Any] | None:
        if not path:
            return None
        read = self._execute_module(module_name="ansible.legacy.slurp", module_args={"src": path}, task_vars=task_vars)
        if read.get("failed") or "content" not in read:
            return None
        try:
            data = json.loads(base64.b64decode(read["content"]))
        except ValueError:
            return None  # caught between write and rename: the next call reads it
        return data if isinstance(data, dict) else None

    def _wait(self, jid: str, seconds: int, task_vars: dict[str, t.Any]) -> dict[str, t.Any]:
        """async_status every second until the job finished or ``seconds`` passed."""
        deadline = time.monotonic() + seconds
        while True:
            status = self._async_status(jid, "status", task_vars)
            if status.get("finished"):
                return status
            if status.get("failed"):
                # async_status itself failed (unknown job id, unreadable results file).
                raise AnsibleActionFail("async job %s: %s" % (jid, status.get("msg", "status unknown")))
            if time.monotonic() >= deadline:
                return status
            time.sleep(1)

    def run(self, tmp: t.Any = None, task_vars: dict[str, t.Any] | None = None) -> dict[str, t.Any]:
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        del tmp
        _valid, args = self.validate_argument_spec(  # type: ignore[no-untyped-call]
            argument_spec={
                "jid": {"type": "str", "required": True},
                "path": {"type": "str", "default": ""},
                "label": {"type": "str", "default": ""},
                "wait": {"type": "int", "default": 5},
                "cleanup": {"type": "bool", "default": True},
            },
        )
        jid = args["jid"]
        status = self._wait(jid, max(0, args["wait"]), task_vars)
        progress = None
        if not status.get("finished"):
            progress = self._progress(args["path"], task_vars)
            if progress and progress.get("phase") in ("done", "failed"):
                # The job wrote its last line and is exiting: its result is a moment away.
                status = self._wait(jid, 10, task_vars)

        if status.get("finished"):
            if args["cleanup"]:
                self._async_status(jid, "cleanup", task_vars)
            job = {k: v for k, v in status.items() if k not in _ASYNC_KEYS}
            if job.get("failed") and "data" in job and not str(job.get("data") or "").strip():
                # async_wrapper found no result on the module's stdout: the process was killed or crashed.
                job = {"failed": True, "stderr": job.get("stderr", ""),
                       "msg": "%s: the job ended without a result (killed, out of memory or crashed); "
                              "run again to resume where it stopped" % (args["label"] or jid)}
            result.update(job)
            result["finished"] = True
            result["ansible_job_id"] = jid
            if not result.get("msg"):
                result["msg"] = "%s: finished" % (args["label"] or jid)
            return result

        label = args["label"] or jid
        if progress and progress.get("msg"):
            line = progress["msg"]
        else:
            line = "%s: starting (no progress written yet)" % label
        # Only what the line needs: the callback prints this whole dict on every retry.
        return {"changed": False, "finished": False, "msg": line, "_ansible_verbose_always": True}
