"""Preflight's Prisma check (roles/preflight/tasks/platform.yml) on this machine, connection local.

One run, one local host per case, each with a bundle manifest of its own; each host writes its
``__preflight_problems`` to a file, and the test keeps the ones about database mode.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
REBUILD = (": rebuild the bundle where binaries.prisma.sh (or a mirror: profile prisma.mirror) is reachable, "
           "or set lab_litellm_database_mode: false")
PREFIX = "lab_litellm_database_mode=true needs Prisma's engines in the bundle, but "
UNREACHABLE = "cannot fetch https://binaries.prisma.sh/all_commits/393aa359/debian-openssl-3.0.x/query-engine.gz.sha256: timed out"

NO_SECTION = {"available": False, "reason": "profile has no prisma section", "files": []}
CASES: dict[str, tuple[dict[str, Any] | None, bool | str, bool, list[str]]] = {
    # host: (components.prisma (None: no such key), lab_litellm_database_mode, gateway host, expected)
    "gw-no-section": (NO_SECTION, True, True, [PREFIX + "profile has no prisma section" + REBUILD]),
    "gw-unreachable": ({"available": False, "reason": UNREACHABLE, "files": []}, True, True, [PREFIX + UNREACHABLE + REBUILD]),
    "gw-old-bundle": (None, "true", True, [PREFIX + "the bundle has no prisma component" + REBUILD]),
    "gw-no-reason": ({"available": False, "reason": None}, True, True, [PREFIX + "the bundle has no prisma component" + REBUILD]),
    "gw-available": ({"available": True, "reason": None, "files": [{"kind": "cli"}]}, True, True, []),
    "gw-no-database": (NO_SECTION, False, True, []),
    "gpu-only": (NO_SECTION, True, False, []),
}


def test_preflight_prisma_check(tmp_path: Path) -> None:
    hosts: dict[str, dict[str, dict[str, Any]]] = {"gateway_hosts": {}, "gpu_hosts": {}}
    for name, (prisma, database_mode, gateway, _) in CASES.items():
        bundle = tmp_path / "bundles" / name
        bundle.mkdir(parents=True)
        components: dict[str, Any] = {"apt": {"packages": [], "skipped": []}}
        if prisma is not None:
            components["prisma"] = prisma
        (bundle / "manifest.json").write_text(json.dumps({"files": [], "components": components}))
        group = "gateway_hosts" if gateway else "gpu_hosts"
        hosts[group][name] = {"lab_bundle_src": str(bundle), "lab_litellm_database_mode": database_mode}
    inventory = {
        "all": {
            "children": {group: {"hosts": members} for group, members in hosts.items()},
            "vars": {
                "ansible_connection": "local",
                "ansible_python_interpreter": sys.executable,
                "lab_bundle_source": "control",
                "lab_model_root": str(tmp_path),
                # group_vars/all/project.yml's pinned tokenizer files (every inventory links that file)
                "lab_tiktoken_files": yaml.safe_load((REPO / "group_vars" / "all" / "project.yml").read_text())["lab_tiktoken_files"],
            },
        }
    }
    (tmp_path / "hosts.json").write_text(json.dumps(inventory))
    out = tmp_path / "problems"
    out.mkdir()
    playbook = tmp_path / "play.yml"
    # The lab's topology first, as playbooks/preflight.yml runs it (from the inventory alone here;
    # its problems are preflight's to report, not this test's).
    playbook.write_text(
        f"- name: The lab's topology\n  ansible.builtin.import_playbook: {REPO / 'playbooks' / 'topology.yml'}\n"
        "  vars: {lab_topology_gpu_source: inventory, lab_topology_report: preflight}\n"
        "- name: Preflight's platform checks\n"
        "  hosts: all\n"
        "  gather_facts: true\n"
        "  tasks:\n"
        "    - name: Start with no problems\n"
        "      ansible.builtin.set_fact:\n"
        "        __preflight_problems: []\n"
        "    - name: Run the platform checks\n"
        "      ansible.builtin.include_role:\n"
        "        name: preflight\n"
        "        tasks_from: platform\n"
        "    - name: Write the problems\n"
        "      ansible.builtin.copy:\n"
        "        content: \"{{ __preflight_problems | to_json }}\"\n"
        f"        dest: \"{out}/{{{{ inventory_hostname }}}}.json\"\n"
        "        mode: '0644'\n"
    )
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
        ANSIBLE_FORCE_COLOR="0",
        ANSIBLE_LOCAL_TEMP=str(tmp_path / ".ansible-tmp"),
        ANSIBLE_HOME=str(tmp_path / ".ansible"),
    )
    cmd = [str(BIN / "ansible-playbook"), "-i", str(tmp_path / "hosts.json"), str(playbook)]
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=300, check=False)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    for name, (_, _, _, expected) in CASES.items():
        problems = json.loads((out / f"{name}.json").read_text())
        assert [p for p in problems if "lab_litellm_database_mode" in p] == expected, name
