"""Which replicas a file change restarts (roles/vllm/tasks/configure.yml, "Work out which replicas a
change touches"): the role's own expressions, read from its task file and run by ansible-playbook
against the register shapes labctl_template's files give (changed_files). A change to one replica's
flags, devices or NUMA drop-in restarts that replica only; a shared file restarts every one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TASK = "Work out which replicas a change touches"
PLAN = [{"index": i, "port": 8000 + i} for i in range(4)]


def _task() -> dict[str, Any]:
    tasks = yaml.safe_load((REPO / "roles" / "vllm" / "tasks" / "configure.yml").read_text())
    return next(task for task in tasks if task.get("name") == TASK)


def changed(tmp_path: Path, files: list[str], units: list[str], api_key: bool = False) -> list[int]:
    task = _task()
    values = {"vllm_config_dir": "/etc/labctl/vllm", "__vllm_plan": PLAN,
              "__vllm_files": {"changed": bool(files), "changed_files": files},
              "__vllm_units": {"changed": bool(units), "changed_files": units},
              "__vllm_api_key_env": {"changed": api_key}}
    play = [{"name": "touched", "hosts": "localhost", "connection": "local", "gather_facts": False,
             "tasks": [task, {"name": "Show", "ansible.builtin.debug": {"msg": "RESULT {{ __vllm_changed | to_json }}"}}]}]
    (tmp_path / "play.yml").write_text(json.dumps(play))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_HOME=str(tmp_path / ".ansible"),
               ANSIBLE_LOCAL_TEMP=str(tmp_path / ".tmp"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default")
    out = subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", str(tmp_path / "play.yml"),
                          "-e", json.dumps(values)], capture_output=True, text=True, env=env, cwd=REPO,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    line = next(line for line in out.stdout.splitlines() if '"msg": "RESULT ' in line)
    return sorted(json.loads(json.loads("{" + line.strip() + "}")["msg"][len("RESULT "):]))


@pytest.mark.parametrize(("files", "units", "api_key", "want"), [
    ([], [], False, []),
    (["/etc/labctl/vllm/replica-1.env"], [], False, [1]),
    (["/etc/labctl/vllm/replica-3.yaml", "/etc/labctl/vllm/replica-3.env"], [], False, [3]),
    ([], ["/etc/systemd/system/vllm@2.service.d/labctl-numa.conf"], False, [2]),
    ([], ["/etc/systemd/system/vllm@0.service.d"], False, []),  # a new directory alone restarts nothing
    (["/etc/labctl/vllm/replica-1.yaml"], ["/etc/systemd/system/vllm@2.service.d/labctl-numa.conf"], False, [1, 2]),
    (["/etc/labctl/vllm/vllm.env"], [], False, [0, 1, 2, 3]),
    ([], ["/etc/systemd/system/vllm@.service"], False, [0, 1, 2, 3]),
    ([], [], True, [0, 1, 2, 3]),
])
def test_a_change_restarts_the_replicas_it_touches(tmp_path: Path, files: list[str], units: list[str], api_key: bool,
                                                   want: list[int]) -> None:
    assert changed(tmp_path, files, units, api_key) == want
