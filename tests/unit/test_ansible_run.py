"""labctl runs the repository's playbooks with the repository's ansible.cfg, whatever ANSIBLE_CONFIG
the caller's environment names (an operator's shell, molecule's verifier): its pipelining, its fact
gathering once per run and its fact cache in memory are what the site is built and measured with
(Issue 31: under molecule's ansible.cfg every play of a labctl run gathered facts again)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from labctl.ansible_run import run_playbook


def test_the_repositorys_ansible_cfg_applies_whatever_the_environment_says(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    other = tmp_path / "other.cfg"
    other.write_text("[defaults]\ngathering = implicit\nfact_caching = jsonfile\n[connection]\npipelining = false\n")
    monkeypatch.setenv("ANSIBLE_CONFIG", str(other))
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(json.dumps({"all": {"hosts": {"local1": {"ansible_connection": "local",
                                                                  "ansible_python_interpreter": sys.executable}}}}))
    playbook = tmp_path / "settings.yml"
    playbook.write_text("""
- name: The settings a labctl run has
  hosts: all
  gather_facts: false
  tasks:
    - name: The repository's
      ansible.builtin.assert:
        that:
          - lookup('ansible.builtin.config', 'DEFAULT_GATHERING') == 'smart'
          - lookup('ansible.builtin.config', 'CACHE_PLUGIN') == 'memory'
          - lookup('ansible.builtin.config', 'ANSIBLE_PIPELINING') | bool
          - lookup('ansible.builtin.config', 'CONFIG_FILE') is search('/ansible.cfg$')
""")
    result = run_playbook(playbook, inventory)
    assert result.rc == 0, result.failures or result.output_tail
