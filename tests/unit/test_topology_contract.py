"""The topology is the only contract between roles (Issue 30, point 3).

A role reads only what is its own (``<role>_*``, ``__<role>_*``, what its tasks register or loop
over), what Ansible gives every play (facts, magic and connection variables), the project's
variables (``lab_*``, declared in roles/preflight/files/project_argument_specs.yml; the topology
``lab_topology`` among them) and what its argument specs declare. It never reads the inventory's
groups (``groups``, ``group_names``): which host does what comes from ``lab_topology``. Every
``tasks_from`` entry point has an argument spec that declares the role variables it reads.

The variables a file reads are found by Jinja2's own parser (``jinja2.meta.find_undeclared_variables``)
over every template string of the role's YAML (tasks, handlers, defaults, vars; the bare expressions
of ``when``, ``that``, ``failed_when``, ``changed_when``, ``until`` as Ansible templates them) and
over its templates/.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jinja2
import jinja2.meta
import jinja2.nodes
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ROLES = sorted(p for p in (REPO / "roles").iterdir() if p.is_dir())
PROJECT_SPEC = REPO / "roles" / "preflight" / "files" / "project_argument_specs.yml"

# What Ansible gives every play (docs: "Special variables") and Jinja2's and Ansible's globals.
MAGIC = {
    "inventory_hostname", "inventory_hostname_short", "inventory_dir", "inventory_file", "hostvars", "omit",
    "playbook_dir", "role_path", "role_name", "play_hosts", "item", "environment",
    "range", "lipsum", "dict", "cycler", "joiner", "namespace", "lookup", "query", "q", "now", "undef",
    "true", "false", "none", "True", "False", "None",
}
GROUP_VARIABLES = {"groups", "group_names"}
# Keys of a task whose value Ansible templates as a bare expression.
BARE = {"when", "changed_when", "failed_when", "until", "that"}


class _Every(dict):  # type: ignore[type-arg]
    """Every filter and test name is known: Ansible's and the project's plugins are not loaded here."""

    def __contains__(self, name: object) -> bool:
        return True

    def get(self, name: Any, default: Any = None) -> Any:
        return super().get(name) or (lambda *args, **kwargs: None)


def _environment(start: str = "{{", end: str = "}}") -> jinja2.Environment:
    env = jinja2.Environment(variable_start_string=start, variable_end_string=end)  # parsed, never rendered
    env.filters = _Every(env.filters)
    env.tests = _Every(env.tests)
    return env


ENV = _environment()
BRACKETS = _environment("[[", "]]")


def _reads(text: str, env: jinja2.Environment = ENV) -> set[str]:
    if not any(mark in text for mark in ("{{", "{%", env.variable_start_string)):
        return set()
    with warnings.catch_warnings():  # a regular expression's backslashes in a YAML string
        warnings.simplefilter("ignore", DeprecationWarning)
        tree = env.parse(text)
    # A name the template sets anywhere ({% set %}, a loop's target) is its own, whatever the block.
    stored = {node.name for node in tree.find_all(jinja2.nodes.Name) if node.ctx in ("store", "param")}
    return set(jinja2.meta.find_undeclared_variables(tree)) - stored


def _expressions(value: Any) -> Iterator[str]:
    for item in value if isinstance(value, list) else [value]:
        if isinstance(item, str):
            yield "{{ (" + item + ") }}"
        elif isinstance(item, bool):
            continue


def _strings(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for value in node.values():
            yield from _strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from _strings(value)


def _tasks(node: Any) -> Iterator[dict[str, Any]]:
    for task in node if isinstance(node, list) else []:
        if isinstance(task, dict):
            yield task
            for key in ("block", "rescue", "always"):
                yield from _tasks(task.get(key))


def _task_reads(task: dict[str, Any]) -> set[str]:
    reads: set[str] = set()
    for key, value in task.items():
        if key in ("block", "rescue", "always"):
            continue
        if key in BARE:
            reads |= set().union(*(_reads(e) for e in _expressions(value)))
        elif key == "ansible.builtin.assert" and isinstance(value, dict):
            reads |= set().union(*(_reads(e) for e in _expressions(value.get("that"))))
            reads |= set().union(*(_reads(s) for k, v in value.items() if k != "that" for s in _strings(v)))
        else:
            reads |= set().union(*(_reads(s) for s in _strings(value)))
    return reads


def _task_defines(task: dict[str, Any]) -> set[str]:
    names = set(task.get("vars") or {})
    if task.get("register"):
        names.add(task["register"])
    names |= set((task.get("loop_control") or {}).get("loop_var", "item").split())
    facts = task.get("ansible.builtin.set_fact")
    if isinstance(facts, dict):
        names |= set(facts)
    return names


def _spec_options(spec: dict[str, Any]) -> set[str]:
    return {name for entry in (spec.get("argument_specs") or {}).values() for name in (entry.get("options") or {})}


PROJECT = _spec_options(yaml.safe_load(PROJECT_SPEC.read_text()))


class Role:
    """What one role's files read and define."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.name = path.name
        spec = path / "meta" / "argument_specs.yml"
        self.specs: dict[str, Any] = (yaml.safe_load(spec.read_text()) or {}).get("argument_specs", {}) if spec.exists() else {}
        self.reads: dict[Path, set[str]] = {}
        self.defined: set[str] = set()
        for file in sorted((path / "tasks").glob("*.yml")) + sorted((path / "handlers").glob("*.yml")):
            found: set[str] = set()
            for task in _tasks(yaml.safe_load(file.read_text())):
                found |= _task_reads(task)
                self.defined |= _task_defines(task)
            self.reads[file] = found
        for file in (path / "defaults" / "main.yml", path / "vars" / "main.yml"):
            if file.exists():
                data = yaml.safe_load(file.read_text()) or {}
                self.defined |= set(data)
                self.reads[file] = set().union(*(_reads(s) for s in _strings(data)))
        for file in sorted((path / "templates").rglob("*.j2")) if (path / "templates").is_dir() else []:
            env = BRACKETS if file.read_text().startswith("[[") else ENV
            self.reads[file] = _reads(file.read_text(), env)

    def own(self, name: str) -> bool:
        return name.startswith((f"{self.name}_", f"__{self.name}_", "ansible_")) or name in self.defined

    def declared(self) -> set[str]:
        return PROJECT | _spec_options({"argument_specs": self.specs})

    def foreign_reads(self) -> list[str]:
        """Each read of a variable that is neither the role's own, nor Ansible's, nor declared."""
        found = []
        for file, names in self.reads.items():
            where = file.relative_to(self.path.parent.parent)
            for name in sorted(names - MAGIC):
                if name in GROUP_VARIABLES:
                    found.append(f"{where} names the inventory's groups ({name}): take them from lab_topology")
                elif not self.own(name) and name not in self.declared():
                    found.append(f"{where} reads {name}, which is not the {self.name} role's own nor declared in its argument specs")
        return found


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_a_role_reads_only_its_own_or_declared_variables_and_no_group(role: Path) -> None:
    assert Role(role).foreign_reads() == []


def test_the_scanner_catches_a_group_and_another_roles_variable(tmp_path: Path) -> None:
    """The check above sees each way a role could name a group or read another role's variable."""
    role = tmp_path / "roles" / "demo"
    (role / "tasks").mkdir(parents=True)
    (role / "defaults").mkdir()
    (role / "defaults" / "main.yml").write_text("demo_clients: \"{{ [litellm_user | default('litellm')] }}\"\n")
    (role / "tasks" / "main.yml").write_text(yaml.safe_dump([
        {"name": "a", "ansible.builtin.debug": {"msg": "{{ groups['gateway_hosts'] | default([]) }}"}},
        {"name": "b", "ansible.builtin.debug": {"msg": "x"}, "when": "'gateway_hosts' in group_names"},
        {"name": "c", "ansible.builtin.assert": {"that": ["not (nvidia_driver_reboot_required | default(false))"]}},
        {"name": "d", "ansible.builtin.debug": {"msg": "{{ groups.gpu_hosts }} {{ demo_own }} {{ __demo_x }}"}},
        {"name": "e", "ansible.builtin.debug": {"msg": "{{ lab_topology.groups.gpu }} {{ item }}"}, "loop": "{{ demo_own }}"},
    ]))
    found = Role(role).foreign_reads()
    assert len(found) == 4, found  # the loop variable item and the topology are allowed
    assert sum("names the inventory's groups (groups)" in f for f in found) == 1  # one file, two reads of groups
    assert any("(group_names)" in f for f in found)
    assert any("reads litellm_user" in f for f in found)
    assert any("reads nvidia_driver_reboot_required" in f for f in found)


# --- Every entry point has an argument spec --------------------------------------------------------

def _file_tasks(path: Path) -> Iterator[dict[str, Any]]:
    """The tasks of a task file or of every play of a playbook."""
    data = yaml.safe_load(path.read_text()) or []
    for item in data:
        if isinstance(item, dict) and "hosts" in item:
            for key in ("pre_tasks", "tasks", "post_tasks", "handlers"):
                yield from _tasks(item.get(key))
    if not any(isinstance(item, dict) and ("hosts" in item or "ansible.builtin.import_playbook" in item) for item in data):
        yield from _tasks(data)


def _entry_points() -> set[tuple[str, str]]:
    """(role, entry) for every include_role/import_role with tasks_from in the project."""
    found = set()
    for path in [*REPO.glob("playbooks/*.yml"), REPO / "site.yml", *REPO.glob("roles/*/tasks/*.yml"), *REPO.glob("tests/*/*.yml"),
                 *REPO.glob("molecule/*/*.yml")]:
        for task in _file_tasks(path):
            for key in ("ansible.builtin.include_role", "ansible.builtin.import_role"):
                args = task.get(key)
                if isinstance(args, dict) and args.get("tasks_from"):
                    found.add((str(args["name"]), str(args["tasks_from"])))
    return found


ENTRY_POINTS = sorted(_entry_points())


def test_the_entry_points_are_found() -> None:
    assert ("vllm", "drain_host") in ENTRY_POINTS and ("litellm", "render") in ENTRY_POINTS


@pytest.mark.parametrize(("role_name", "entry"), ENTRY_POINTS, ids=[f"{r}:{e}" for r, e in ENTRY_POINTS])
def test_an_entry_point_is_named_as_its_spec(role_name: str, entry: str) -> None:
    """Ansible validates the spec whose name is tasks_from's value as written: "drain_host.yml"
    would find no spec and validate nothing (ansible/playbook/role/__init__.py, _prepend_validation_task)."""
    assert not entry.endswith((".yml", ".yaml")), f"tasks_from: {entry} for the {role_name} role: name the entry point without .yml"


def _entry_files(role: Path, entry: str) -> list[Path]:
    """The files an entry point reads: its task file, what it imports or includes, and the role's
    templates they render, transitively."""
    todo, seen = [role / "tasks" / f"{re.sub(r'[.]ya?ml$', '', entry)}.yml"], []
    while todo:
        file = todo.pop()
        if file in seen or not file.exists() or file.suffix != ".yml":
            if file.suffix == ".j2" and file.exists() and file not in seen:
                seen.append(file)
            continue
        seen.append(file)
        for task in _tasks(yaml.safe_load(file.read_text())):
            for key in ("ansible.builtin.import_tasks", "ansible.builtin.include_tasks"):
                if isinstance(task.get(key), str):
                    todo.append(role / "tasks" / task[key])
            for text in _strings(task):
                todo += [role / "templates" / name for name in re.findall(r"[\w./-]+\.j2\b", text)]
    return seen


def _internals(role: Role) -> dict[str, set[str]]:
    """What each of the role's internal variables (vars/main.yml) reads."""
    data = yaml.safe_load((role.path / "vars" / "main.yml").read_text()) if (role.path / "vars" / "main.yml").exists() else {}
    return {name: set().union(*(_reads(s) for s in _strings(value))) for name, value in (data or {}).items()}


@pytest.mark.parametrize(("role_name", "entry"), ENTRY_POINTS, ids=[f"{r}:{e}" for r, e in ENTRY_POINTS])
def test_every_entry_point_has_an_argument_spec_of_what_it_reads(role_name: str, entry: str) -> None:
    role = Role(REPO / "roles" / role_name)
    assert entry in role.specs, f"roles/{role_name}/meta/argument_specs.yml has no entry point {entry} (tasks_from: {entry})"
    options = set(role.specs[entry].get("options") or {})
    internals = _internals(role)
    reads: set[str] = set().union(*(role.reads[f] for f in _entry_files(role.path, entry)))
    todo = [n for n in reads if n in internals]
    while todo:  # the role's internals read role variables too
        for name in internals[todo.pop()]:
            if name not in reads:
                reads.add(name)
                if name in internals:
                    todo.append(name)
    defaults = yaml.safe_load((role.path / "defaults" / "main.yml").read_text()) or {}
    public = {n for n in reads if n in defaults or n in _spec_options({"argument_specs": {"main": role.specs["main"]}})}
    assert public - options == set(), f"{role_name} entry point {entry} reads {sorted(public - options)} without declaring them"
    for name, option in role.specs[entry]["options"].items():
        assert option.get("description"), f"{role_name}:{entry}: {name} has no description"
