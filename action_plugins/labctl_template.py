"""Action plugin: ansible.builtin.template with a one-call answer when the file is already current.

Documentation and argument spec: library/labctl_template.py (a stub module for ansible-doc and
ansible-lint).

ansible.builtin.template costs five calls on the target for a file that is already right: the home
directory, a temporary directory, stat, file (owner, group, mode) and removing the directory. A
no-op re-run of site.yml writes about sixty files, so most of its time went there. This action
renders the template on the control node exactly as the builtin does, and asks the target once
(labctl_file_state) whether the file already has that content, owner, group and mode. If it has,
the task is done: ok, nothing changed. In every other case, and for any argument beyond the plain
ones (src, dest, owner, group, mode, validate, backup, the Jinja2 delimiters), the task is handed unchanged to
ansible.builtin.template, which writes, validates, backs up, diffs and reports as usual. So the
fast path can only ever say "unchanged" for a file that is byte for byte what the builtin would
write, with the same attributes; a file it is unsure of goes the builtin's way.

With ``content`` instead of ``src`` the file holds exactly that text, as ansible.builtin.copy writes
it (a generated JSON dashboard, which cannot carry an ansible_managed comment); the fallback is then
ansible.builtin.copy.

With ``files`` (a list of such files, of files already on the target to copy with ``remote_src: true``,
of directories with ``state: directory`` and of paths to remove with ``state: absent``) one task writes
several: one call on the target judges them all, and only those not current go, in order, the
builtin's way (ansible.builtin.template, copy or file). A role's configuration files then cost one
call on a no-op re-run instead of one each (Issue 31). An entry's ``vars`` are added to the
template's variables (a loop's item, e.g. the replica a file is for). The task reports changed when
any entry changed; ``results`` holds one answer per entry and ``changed_files`` the paths written.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import pwd
import time
import typing as t

from ansible import constants
from ansible.errors import AnsibleActionFail, AnsibleError
from ansible.module_utils.common.text.converters import to_bytes
from ansible.plugins.action import ActionBase
from ansible.template import trust_as_template

# Jinja2 delimiters a task may set, passed to the renderer as the builtin passes them.
DELIMITERS = ("variable_start_string", "variable_end_string", "block_start_string", "block_end_string",
              "comment_start_string", "comment_end_string")
# Arguments the fast path understands; any other sends the task to the builtin.
FAST_ARGS = frozenset(("src", "dest", "owner", "group", "mode", "validate", "backup", *DELIMITERS))
# With content instead of src the task is ansible.builtin.copy's (a file with exactly that text).
CONTENT_ARGS = frozenset(("content", "dest", "owner", "group", "mode", "validate", "backup"))
# An entry of files: a template (src) or a content file, a directory (state: directory), or a path to
# remove (state: absent, dest alone); vars are extra template variables. Owner, group and mode are
# required for the first three: a batch writes nothing with default attributes.
ENTRY_ARGS = frozenset(("src", "remote_src", "content", "state", "dest", "owner", "group", "mode", "validate", "vars",
                        "variable_start_string", "variable_end_string"))
ENTRY_REQUIRED = ("dest", "owner", "group", "mode")


def template_vars(path: str, fullpath: str, dest_path: str, include_ansible_managed: bool) -> dict[str, t.Any]:
    """The variables ansible.builtin.template adds for a template (template_* and, unless the play
    sets it, ansible_managed from the DEFAULT_MANAGED_STR setting), made from public APIs only:
    ansible-core documents these variables, not the private function that makes them."""
    stat = os.stat(fullpath)
    try:
        uid: int | str = pwd.getpwuid(stat.st_uid).pw_name
    except KeyError:
        uid = stat.st_uid
    variables: dict[str, t.Any] = {
        "template_host": os.uname()[1], "template_path": path, "template_fullpath": fullpath,
        "template_destpath": dest_path, "template_uid": uid,
        # local, naive times: what the builtin gives templates
        "template_mtime": datetime.datetime.fromtimestamp(stat.st_mtime),  # noqa: DTZ006
        "template_run_date": datetime.datetime.now(),  # noqa: DTZ005
    }
    if include_ansible_managed:
        managed = str(constants.config.get_config_value("DEFAULT_MANAGED_STR"))
        managed = managed.format(host="{{ template_host }}", uid="{{ template_uid }}", file="{{ template_path }}")
        variables["ansible_managed"] = trust_as_template(time.strftime(managed, time.localtime(stat.st_mtime)))
    return variables


def builtin_only() -> bool:
    """LABCTL_FILE_ACTIONS=builtin: every task takes the builtin's path (scripts/bench-ssh.py measures
    the no-op re-run with and without the one-call answer)."""
    return os.environ.get("LABCTL_FILE_ACTIONS", "") == "builtin"


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = True
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp: t.Any = None, task_vars: dict[str, t.Any] | None = None) -> dict[str, t.Any]:
        task_vars = task_vars if task_vars is not None else {}
        result = super().run(tmp, task_vars)
        args = self._task.args
        if "files" in args:
            return self._many(result, task_vars)
        if "content" in args:
            builtin, content = "ansible.builtin.copy", args["content"]
            fast = set(args) <= CONTENT_ARGS and isinstance(content, str) and isinstance(args.get("dest"), str)
            rendered = to_bytes(content, errors="surrogate_or_strict") if fast else None
        else:
            builtin = "ansible.builtin.template"
            rendered = self._render(args, task_vars) if set(args) <= FAST_ARGS else None
        if rendered is not None and not builtin_only():
            want = {"path": args["dest"], "checksum": hashlib.sha1(rendered).hexdigest(),
                    **{key: args[key] for key in ("owner", "group", "mode") if args.get(key) is not None}}
            answer = self._shared_loader_obj.action_loader.get("labctl_read", class_only=True).probe(
                self, "labctl_file_state", {"files": [want]}, task_vars)
            state = (answer.get("files") or [{}])[0] if not answer.get("failed") else {}
            if state.get("current"):
                for key in ("path", "checksum", "state", "size", "uid", "gid", "owner", "group", "mode"):
                    result[key] = state[key]
                result.update(dest=state["path"], changed=False, answered_by="labctl_file_state")
                return result
        return self._builtin(builtin, task_vars)

    def _entries(self) -> list[dict[str, t.Any]]:
        """The files argument, checked: each entry names its path, owner, group and mode, and is a
        template (src), a content file or a directory (state: directory); nothing else is allowed."""
        extra = sorted(set(self._task.args) - {"files"})
        if extra:
            raise AnsibleActionFail(f"labctl_template: files cannot be combined with {', '.join(extra)}")
        files = self._task.args["files"]
        if not isinstance(files, list):
            raise AnsibleActionFail("labctl_template: files must be a list")
        for number, entry in enumerate(files, 1):
            where = f"labctl_template: files entry {number}"
            if not isinstance(entry, dict):
                raise AnsibleActionFail(f"{where} is not a mapping: {entry!r}")
            where += f" ({entry.get('dest', '?')})"
            unknown = sorted(set(entry) - ENTRY_ARGS)
            if unknown or not entry.get("dest"):
                raise AnsibleActionFail(f"{where}: unsupported {', '.join(unknown) or '-'}; dest {entry.get('dest')!r}")
            state = entry.get("state", "file")
            if state not in ("file", "directory", "absent"):
                raise AnsibleActionFail(f"{where}: state must be file, directory or absent")
            if state == "absent":
                if set(entry) - {"dest", "state", "vars"}:
                    raise AnsibleActionFail(f"{where}: state: absent takes dest alone")
                continue
            missing = [key for key in ENTRY_REQUIRED if entry.get(key) in (None, "")]
            if missing:
                raise AnsibleActionFail(f"{where}: missing {', '.join(missing)}")
            if (state == "directory") != (("src" not in entry) and ("content" not in entry)) or (
                    "src" in entry and "content" in entry):
                raise AnsibleActionFail(f"{where}: give exactly one of src and content (or state: directory alone)")
            if entry.get("remote_src") and ("src" not in entry or set(entry) & {"variable_start_string",
                                                                              "variable_end_string"}):
                raise AnsibleActionFail(f"{where}: remote_src copies src as it is (no template variables)")
            if not isinstance(entry.get("vars", {}), dict):
                raise AnsibleActionFail(f"{where}: vars must be a mapping")
        return files

    def _many(self, result: dict[str, t.Any], task_vars: dict[str, t.Any]) -> dict[str, t.Any]:
        """Several files and directories: one call judges them all; the builtin writes those not current."""
        entries = self._entries()
        wants: list[dict[str, t.Any]] = []
        for entry in entries:
            if entry.get("state") == "absent":
                wants.append({"path": entry["dest"], "state": "absent"})
                continue
            attrs = {key: entry[key] for key in ("owner", "group", "mode")}
            if entry.get("state") == "directory":
                wants.append({"path": entry["dest"], "state": "directory", **attrs})
                continue
            args = {key: value for key, value in entry.items() if key not in ("vars", "state", "remote_src")}
            if entry.get("remote_src"):  # the target compares the two files in the same call
                wants.append({"path": entry["dest"], "same_as": args["src"], **attrs})
                continue
            if "content" in args:
                content = args["content"]
                rendered = to_bytes(content, errors="surrogate_or_strict") if isinstance(content, str) else None
            else:
                rendered = self._render(args, {**task_vars, **entry.get("vars", {})})
            # a file that cannot be rendered here is never current: the builtin renders it and says why
            wants.append({"path": entry["dest"], "checksum": hashlib.sha1(rendered).hexdigest() if rendered is not None
                          else "-", **attrs})
        if not wants:  # an empty list (e.g. no dashboards): nothing to judge, no call
            states: list[dict[str, t.Any]] = []
        elif builtin_only():
            states = [{} for _ in wants]
        else:
            answer = self._shared_loader_obj.action_loader.get("labctl_read", class_only=True).probe(
                self, "labctl_file_state", {"files": wants}, task_vars)
            states = answer.get("files") or [{} for _ in wants] if not answer.get("failed") else [{} for _ in wants]
        results: list[dict[str, t.Any]] = []
        diffs: list[t.Any] = []
        for entry, state in zip(entries, states, strict=True):
            if state.get("current"):
                results.append({"dest": entry["dest"], "changed": False, "answered_by": "labctl_file_state"})
                continue
            if entry.get("state") == "absent":
                done = self._execute_module(module_name="ansible.legacy.file", task_vars=task_vars,
                                            module_args={"path": entry["dest"], "state": "absent"})
            elif entry.get("state") == "directory":
                done = self._execute_module(
                    module_name="ansible.legacy.file", task_vars=task_vars,
                    module_args={"path": entry["dest"], "state": "directory",
                                 **{key: entry[key] for key in ("owner", "group", "mode")}})
            else:
                args = {key: value for key, value in entry.items() if key not in ("vars", "state", "remote_src")}
                if entry.get("remote_src"):
                    args["remote_src"] = True
                builtin = "ansible.builtin.copy" if "content" in args or entry.get("remote_src") \
                    else "ansible.builtin.template"
                done = self._builtin(builtin, {**task_vars, **entry.get("vars", {})}, args)
            if done.get("diff"):
                diffs.extend(done["diff"] if isinstance(done["diff"], list) else [done["diff"]])
            if done.get("failed"):
                result.update(failed=True, msg=f"{entry['dest']}: {done.get('msg', 'failed')}", results=results,
                              changed=any(r["changed"] for r in results))
                return result
            results.append({"dest": entry["dest"], "changed": bool(done.get("changed"))})
        result.update(changed=any(r["changed"] for r in results), results=results,
                      changed_files=[r["dest"] for r in results if r["changed"]])
        if diffs:
            result["diff"] = diffs
        return result

    def _render(self, args: dict[str, t.Any], task_vars: dict[str, t.Any]) -> bytes | None:
        """The bytes ansible.builtin.template would write, or None when in doubt (the builtin decides)."""
        src, dest = args.get("src"), args.get("dest")
        if not isinstance(src, str) or not isinstance(dest, str):
            return None
        try:
            source: str = self._find_needle("templates", src)  # type: ignore[no-untyped-call]
            data = trust_as_template(self._loader.get_text_file_contents(source))
            search: list[str] = []
            for path in [*task_vars.get("ansible_search_path", []), self._loader._basedir, os.path.dirname(source)]:
                search += [os.path.join(path, "templates"), path]
            variables = dict(task_vars)
            variables.update(template_vars(src, source, dest, include_ansible_managed="ansible_managed" not in variables))
            templar = self._templar.copy_with_new_env(searchpath=search, available_variables=variables)
            overrides = {"trim_blocks": True, "lstrip_blocks": False, "newline_sequence": "\n",
                         **{key: args[key] for key in DELIMITERS if key in args}}
            text = templar.template(data, escape_backslashes=False, overrides=overrides)
        except AnsibleError:
            return None  # the builtin reports the error in its own words
        return bytes(to_bytes("" if text is None else str(text), encoding="utf-8", errors="surrogate_or_strict"))

    def _builtin(self, name: str, task_vars: dict[str, t.Any], args: dict[str, t.Any] | None = None
                 ) -> dict[str, t.Any]:
        task = self._task.copy()
        if args is not None:
            task.args = args
        action = self._shared_loader_obj.action_loader.get(
            name, task=task, connection=self._connection,
            play_context=self._play_context, loader=self._loader, templar=self._templar,
            shared_loader_obj=self._shared_loader_obj)
        return t.cast(dict[str, t.Any], action.run(task_vars=task_vars))
