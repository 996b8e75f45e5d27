"""Action plugin: run a read-only labctl module in one light call (the target's Python, no module wrapper).

Documentation and argument spec: library/labctl_read.py (a module too, run where the light call cannot).

Every module call through ansible's module wrapper (AnsiballZ) costs about 0.2 s over SSH on this
machine class, of which about 0.11 s is the target's Python importing ansible's module_utils from the
wrapper's zip; a bare command over the same connection costs 0.03 s (bench/call-floor.yml). The
probes of a no-op re-run (is this file, unit, package, account as wanted? what does this command
print?) need none of module_utils. So they are written in plain Python (the standard library) with a
``light(args)`` function, and ``probe()`` below sends the module's own file and its arguments on
standard input to ``python3 -c`` on the target, through the task's connection and become as a
pipelined module would go: the answer is the same dictionary, for a quarter of the cost.

Where the light call cannot answer (no Python at the interpreter's path, an answer that is not
JSON), ``probe()`` runs the same file as an ordinary module, which discovers the interpreter and
validates its arguments as usual. ``LABCTL_LIGHT=0`` in the control node's environment takes that
path every time (scripts/bench-ssh.py measures the difference).

The other labctl actions (labctl_template, labctl_directories, labctl_service, labctl_packages,
labctl_account) ask their probes through ``probe()``: they reach it as this plugin class's static
method through ansible's action loader.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import typing as t
from pathlib import Path

import yaml
from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.common.text.converters import to_text
from ansible.module_utils.errors import UnsupportedError
from ansible.plugins.action import ActionBase

from labctl import module_utils as shared_code

# Read on the target's standard input: {"name", "source", "args", "utils"}. The shared code the module
# imports (ansible.module_utils.labctl.<x>, standard library only: src/labctl/module_utils) comes as
# source in "utils", served by an import finder under the names the module uses; the module runs under
# another name than __main__ (its main() and AnsibleModule stay unused) and its light(args) answers, as JSON.
BOOT = ("import importlib.util,json,sys\n"
        "d=json.loads(sys.stdin.buffer.read())\n"
        "u=d['utils']\n"
        "P=('ansible','ansible.module_utils','ansible.module_utils.labctl')\n"
        "class F:\n"
        " def find_spec(s,n,p=None,t=None):\n"
        "  return importlib.util.spec_from_loader(n,s,is_package=n in P) if n in u or n in P else None\n"
        " def create_module(s,spec):\n"
        "  return None\n"
        " def exec_module(s,m):\n"
        "  if m.__name__ in u:exec(compile(u[m.__name__],m.__name__,'exec'),m.__dict__)\n"
        "sys.meta_path.insert(0,F())\n"
        "g={'__name__':'labctl_light','__file__':d['name']}\n"
        "exec(compile(d['source'],d['name'],'exec'),g)\n"
        "sys.stdout.write('\\n'+json.dumps(g['light'](d['args'])))\n")
SHARED = "ansible.module_utils.labctl"
_IMPORTS = re.compile(r"^(?:from ansible\.module_utils\.labctl\.(\w+) import|import ansible\.module_utils\.labctl\.(\w+))",
                      re.MULTILINE)
_NEIGHBOURS = re.compile(r"^\s*from \.(\w+) import", re.MULTILINE)

_SOURCES: dict[str, str] = {}  # module name -> its file's text, read once per run
_UTILS: dict[str, dict[str, str]] = {}  # module name -> the shared code it imports, by module name
_SPECS: dict[str, dict[str, dict[str, t.Any]]] = {}


def light_enabled() -> bool:
    return os.environ.get("LABCTL_LIGHT", "1") != "0"


def _utils(name: str, source: str) -> dict[str, str]:
    """The shared target code module `name` imports, and what that imports in turn (relative imports
    between its modules), as {ansible.module_utils.labctl.<x>: source}: labctl's own copy
    (labctl.module_utils, the package library/'s and the roles' module_utils/labctl symlinks name)."""
    if name not in _UTILS:
        here = Path(shared_code.__file__).parent
        wanted = [a or b for a, b in _IMPORTS.findall(source)]
        found: dict[str, str] = {}
        while wanted:
            util = wanted.pop()
            if f"{SHARED}.{util}" in found:
                continue
            text = (here / f"{util}.py").read_text(encoding="utf-8")
            found[f"{SHARED}.{util}"] = text
            wanted += _NEIGHBOURS.findall(text)
        _UTILS[name] = found
    return _UTILS[name]


def _source(action: ActionBase, name: str) -> tuple[str, str] | None:
    if name not in _SOURCES:
        found = action._shared_loader_obj.module_loader.find_plugin_with_context(name)
        if not found.resolved or not found.plugin_resolved_path:
            return None
        with open(found.plugin_resolved_path, encoding="utf-8") as handle:
            _SOURCES[name] = handle.read()
    return name + ".py", _SOURCES[name]


def _interpreter(action: ActionBase, task_vars: dict[str, t.Any]) -> str:
    """The host's ansible_python_interpreter (the delegated host's, for a delegated task), else the one
    discovered on it earlier in the run, else /usr/bin/python3 (Debian and Ubuntu; a wrong guess only
    sends the call the module's way)."""
    host_vars = task_vars
    if action._task.delegate_to:
        host_vars = (task_vars.get("ansible_delegated_vars") or {}).get(action._task.delegate_to) or {}
    given = host_vars.get("ansible_python_interpreter")
    if given:
        return str(action._templar.template(given))
    discovered = (host_vars.get("ansible_facts") or {}).get("discovered_interpreter_python")
    return str(discovered) if discovered else "/usr/bin/python3"


def light_call(action: ActionBase, name: str, args: dict[str, t.Any], task_vars: dict[str, t.Any]
               ) -> dict[str, t.Any] | None:
    """The light answer of module `name` for `args`, or None when it cannot be had that way."""
    if not light_enabled():
        return None
    source = _source(action, name)
    if source is None:
        return None
    python = _interpreter(action, task_vars)
    data = json.dumps({"name": source[0], "source": source[1], "args": args, "utils": _utils(name, source[1])})
    command = f"{shlex.quote(python)} -I -c {shlex.quote(BOOT)}"
    done = action._low_level_execute_command(command, sudoable=True, in_data=data.encode("utf-8"))
    if done.get("rc") != 0:
        return None
    # the answer is the last line: anything a login script prints on the way comes before it
    text = to_text(done.get("stdout", "")).rstrip().rpartition("\n")[2]
    try:
        answer = json.loads(text)
    except ValueError:
        return None
    return answer if isinstance(answer, dict) else None


def probe(action: ActionBase, name: str, args: dict[str, t.Any], task_vars: dict[str, t.Any]) -> dict[str, t.Any]:
    """Module `name`'s answer for `args`: the light call, else the module through ansible's wrapper."""
    answer = light_call(action, name, args, task_vars)
    if answer is not None:
        return answer
    return t.cast(dict[str, t.Any], action._execute_module(module_name=name, module_args=args, task_vars=task_vars))


def _spec(action: ActionBase, name: str) -> dict[str, dict[str, t.Any]]:
    """Module `name`'s argument spec, made from its DOCUMENTATION's options (type, elements, default,
    choices, required; a path is checked as text: it is the target's)."""
    if name not in _SPECS:
        source = _source(action, name)
        if source is None:
            raise AnsibleActionFail(f"{name}: its module file is not found")
        tree = ast.parse(source[1])
        doc = next(node.value.value for node in tree.body if isinstance(node, ast.Assign)
                   and any(isinstance(target, ast.Name) and target.id == "DOCUMENTATION" for target in node.targets)
                   and isinstance(node.value, ast.Constant))
        options = yaml.safe_load(str(doc)).get("options") or {}
        _SPECS[name] = {
            key: {**{field: option[field] for field in ("type", "elements", "default", "choices", "required")
                     if field in option},
                  **({"type": "str"} if option.get("type") == "path" else {}),
                  **({"elements": "str"} if option.get("elements") == "path" else {}),
                  **({"no_log": True} if "password" in key else {})}
            for key, option in options.items()}
    return _SPECS[name]


class ActionModule(ActionBase):
    """labctl_read, and the other light reads that are only their module's light call (labctl_stat,
    labctl_http: their action files are this class): the task's arguments checked and converted
    against the module's documented options (the light call does not check them), then the light call."""

    TRANSFERS_FILES = False
    _requires_connection = True
    _supports_check_mode = True
    _supports_async = False

    # for the other labctl actions: action_loader.get("labctl_read", class_only=True).probe(self, ...)
    probe = staticmethod(probe)

    def run(self, tmp: t.Any = None, task_vars: dict[str, t.Any] | None = None) -> dict[str, t.Any]:
        task_vars = task_vars if task_vars is not None else {}
        result = super().run(tmp, task_vars)
        name = self._task.action.rpartition(".")[2]
        # the light call checks nothing: the arguments are checked and converted here, as the module would
        checked = ArgumentSpecValidator(_spec(self, name)).validate(dict(self._task.args))
        if checked.error_messages:
            raise AnsibleActionFail(f"{name}: " + "; ".join(
                f"unsupported parameter(s) {error.msg}" if isinstance(error, UnsupportedError) else error.msg
                for error in checked.errors))
        # the options given and the defaults (an option left unset stays unset, for the module's own checks)
        answer = probe(self, name, {k: v for k, v in checked.validated_parameters.items() if v is not None}, task_vars)
        answer.pop("invocation", None)
        return {**result, **answer, "changed": False}
