"""Project-level invariants: collections, variable precedence, role interfaces, templates."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # the venv that runs the tests carries ansible
ROLES = sorted(p for p in (REPO / "roles").iterdir() if p.is_dir())


def test_installed_collections_satisfy_requirements_yml() -> None:
    wanted = yaml.safe_load((REPO / "requirements.yml").read_text())["collections"]
    out = subprocess.run(
        [str(BIN / "ansible-galaxy"), "collection", "list", "--format", "json"],
        capture_output=True, text=True, check=True, cwd=REPO,
    ).stdout
    installed: dict[str, str] = {}
    for path_entries in json.loads(out).values():
        for name, info in path_entries.items():
            installed.setdefault(name, info["version"])
    for entry in wanted:
        assert entry["name"] in installed, f"{entry['name']} is not installed"
        assert installed[entry["name"]] == entry["version"], (
            f"{entry['name']}: requirements.yml pins {entry['version']}, installed {installed[entry['name']]}"
        )


@pytest.mark.parametrize("inventory", ["lab", "sandbox"])
def test_project_group_vars_reach_imported_playbooks(tmp_path: Path, inventory: str) -> None:
    """Plays imported from a sub-directory see group_vars/all/project.yml, and the site overrides it.

    A group_vars/ next to site.yml alone would not apply to plays in playbooks/; the inventories
    link the project file into their group_vars/all instead. This probe has the same shape as
    site.yml -> playbooks/<layer>.yml.
    """
    (tmp_path / "playbooks").mkdir()
    (tmp_path / "site.yml").write_text(
        "- name: Probe layer\n  ansible.builtin.import_playbook: playbooks/probe.yml\n"
    )
    (tmp_path / "playbooks" / "probe.yml").write_text(
        yaml.safe_dump([{
            "name": "Probe",
            "hosts": "all",
            "gather_facts": False,
            "connection": "local",
            "tasks": [{
                "name": "Show",
                "ansible.builtin.debug": {"msg": "PROBE {{ lab_bundle_dir }} {{ lab_bundle_fingerprint | length }}"},
            }],
        }])
    )
    out = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", str(REPO / "inventories" / inventory), str(tmp_path / "site.yml"),
         "--limit", "all[0]", "-e", "ansible_python_interpreter=/usr/bin/env python3"],
        capture_output=True, text=True, cwd=tmp_path, check=False,
        env={"PATH": f"{BIN}:/usr/bin:/bin", "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
             "LABCTL_BUNDLE_FINGERPRINT": "F" * 40, "HOME": str(tmp_path)},
    )
    assert out.returncode == 0, out.stdout + out.stderr
    # The project default for lab_bundle_dir, and a 40-character fingerprint from the site's own
    # group_vars file (the project default is empty): the site wins over the project.
    assert "PROBE /srv/labctl/bundle 40" in out.stdout


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_argument_specs_cover_exactly_the_defaults(role: Path) -> None:
    defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text()) or {}
    specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())
    options = specs["argument_specs"]["main"]["options"]
    # A variable with no role default is a topology input (src/labctl/topology.py reads it from the
    # inventory; the role gets the result from lab_topology), and says so, or a project variable the
    # role requires (lab_topology: group_vars/all/project.yml's spec, roles/preflight/files).
    project = yaml.safe_load((REPO / "roles" / "preflight" / "files" / "project_argument_specs.yml").read_text())
    project_options = project["argument_specs"]["main"]["options"]
    assert set(defaults) <= set(options), f"{role.name}: defaults missing from argument_specs: {set(defaults) - set(options)}"
    for name in set(options) - set(defaults):
        assert str(options[name].get("description", "")).startswith("Topology input") or (
            name in project_options and options[name].get("required")), \
            f"{role.name}: {name} is in argument_specs but has no default (only topology inputs and required project variables may)"
    for name in options:
        assert name.startswith(role.name + "_") or name in project_options, f"{name} lacks the role prefix {role.name}_"
        assert options[name].get("description"), f"{name} has no description"


# What a role may read of other hosts: hostvars only for its own host (preflight's check of what
# the inventory gives) and the vllm role's own restart marks across the play.
_HOSTVARS_ALLOWED = {
    ("preflight", "hostvars[inventory_hostname]"),
    ("vllm", "labctl_restart_queue(ansible_play_hosts, hostvars)"),
    ("tls", "labctl_tls_names_by_host(ansible_play_hosts, hostvars)"),  # its own __tls_cert_names, for the CA's constraints
}


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_no_role_reads_another_roles_facts(role: Path) -> None:
    import re

    others = [r.name for r in ROLES if r.name != role.name]
    for path in sorted(p for p in role.rglob("*") if p.is_file() and p.suffix in (".yml", ".j2")):
        text = path.read_text()
        for match in re.finditer(r"hostvars", text):
            line = text[text.rfind("\n", 0, match.start()) + 1:text.find("\n", match.start())]
            assert any(r == role.name and allowed in line for r, allowed in _HOSTVARS_ALLOWED), \
                f"{path.relative_to(REPO)}: reads hostvars: {line.strip()} (take it from lab_topology or a role input)"
        for other in others:
            assert not re.search(rf"\b__{other}_\w+", text), f"{path.relative_to(REPO)} reads a private variable of the {other} role"
        for published in ("vllm_endpoints", "node_exporter_targets"):
            if not path.is_relative_to(REPO / "roles" / published.split("_")[0]):
                assert published not in text, f"{path.relative_to(REPO)} reads {published}, another role's fact"


@pytest.mark.parametrize("template", sorted((REPO / "roles").glob("*/templates/**/*.j2")), ids=lambda p: p.name)
def test_templates_carry_ansible_managed(template: Path) -> None:
    # Prometheus rule templates are rendered with [[ ]] delimiters (their {{ }} are Prometheus').
    rules = template.parent.name == "rules" and "prometheus" in template.parts
    start = "[[ ansible_managed | comment" if rules else "{{ ansible_managed | comment"
    assert template.read_text().startswith(start), template


def test_site_imports_only_existing_layer_playbooks() -> None:
    site = yaml.safe_load((REPO / "site.yml").read_text())
    for play in site:
        assert (REPO / play["ansible.builtin.import_playbook"]).is_file()


def _tasks(node: object) -> list[dict[str, Any]]:
    """Every task of a task file, blocks opened."""
    found: list[dict[str, Any]] = []
    for task in node if isinstance(node, list) else []:
        if isinstance(task, dict):
            found.append(task)
            for key in ("block", "rescue", "always"):
                found += _tasks(task.get(key))
    return found


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_files_are_written_through_the_one_call_checks(role: Path) -> None:
    # The decision of Issue 30, point 5 (bench/README.md, "The file plugins"): the file plugins stay, so every
    # file task goes through them. Over SSH a current file costs labctl_template one call on the target and
    # ansible.builtin.template two; the re-run took 1.24 x as long without them (2026-12-05, median of three).
    # Both need explicit attributes.
    for path in sorted((role / "tasks").glob("*.yml")):
        for task in _tasks(yaml.safe_load(path.read_text())):
            assert "ansible.builtin.template" not in task, f"{path.relative_to(REPO)}: {task.get('name')}: use labctl_template"
            args = task.get("labctl_template")
            where = f"{path.relative_to(REPO)}: {task.get('name')}"
            if isinstance(args, dict) and "files" in args:
                # several files in one task: a literal list is checked here, a computed one (labctl_each)
                # by the action itself, which refuses an entry without them before anything changes
                entries = args["files"] if isinstance(args["files"], list) else []
                for entry in entries:
                    assert entry.get("state") == "absent" or {"owner", "group", "mode"} <= set(entry), \
                        f"{where}: {entry.get('dest')}: owner, group and mode are explicit"
            elif args is not None:
                assert isinstance(args, dict) and {"owner", "group", "mode"} <= set(args), \
                    f"{where}: owner, group and mode are explicit"


def test_no_private_ansible_core_api() -> None:
    """The project's plugins and modules use ansible-core's public API only: `ansible._internal` and
    `ansible.module_utils._internal` may change in any release (the fast file action kept its gain
    without them: labctl_template's template_vars)."""
    import re

    private = re.compile(r"^\s*(from|import)\s+ansible(\.module_utils)?\._internal", re.MULTILINE)
    roots = [REPO / "action_plugins", REPO / "filter_plugins", REPO / "library", REPO / "roles", REPO / "src"]
    found = [str(path.relative_to(REPO)) for root in roots for path in sorted(root.rglob("*.py"))
             if private.search(path.read_text())]
    assert found == [], f"private ansible-core API imported by: {found}"


def test_one_way_from_python_to_ansible() -> None:
    """Only labctl.ansible_run runs Ansible (ansible-runner, ansible-playbook, ansible-inventory),
    and results come back as set_stats data, never found by a task's name."""
    import re

    for path in sorted((REPO / "src" / "labctl").rglob("*.py")):
        text = path.read_text()
        if path.name == "ansible_run.py":
            continue
        assert "import ansible_runner" not in text, f"{path.relative_to(REPO)}: run Ansible through labctl.ansible_run"
        assert not re.search(r"""["']ansible(-playbook|-inventory)?["']\s*,""", text), \
            f"{path.relative_to(REPO)} runs an Ansible command"
        assert not re.search(r"""get\(["']task["'][^)]*\)\)?\s*(==|\.endswith)""", text), \
            f"{path.relative_to(REPO)} finds a result by task name"


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_one_handler_style_and_one_way_into_task_files(role: Path) -> None:
    """Handlers are notified by topic (listen:), never by name; a role's main.yml enters its task
    files with import_tasks (static: --tags and --list-tasks see every task), include_tasks only
    where a loop or a handler needs it."""
    handlers_file = role / "handlers" / "main.yml"
    handlers = yaml.safe_load(handlers_file.read_text()) if handlers_file.exists() else []
    names = {h["name"] for h in handlers or []}
    for handler in handlers or []:
        assert str(handler.get("listen", "")).startswith(role.name + " "), \
            f"{role.name}: {handler['name']} has no '{role.name} ...' listen topic"
    for path in sorted((role / "tasks").glob("*.yml")):
        for task in _tasks(yaml.safe_load(path.read_text())):
            notify = task.get("notify")
            for topic in [notify] if isinstance(notify, str) else notify or []:
                assert topic not in names, f"{path.relative_to(REPO)}: {task.get('name')} notifies the handler {topic!r} by name"
            if path.name == "main.yml":
                assert "ansible.builtin.include_tasks" not in task or "loop" in task, \
                    f"{path.relative_to(REPO)}: {task.get('name')}: use import_tasks"
