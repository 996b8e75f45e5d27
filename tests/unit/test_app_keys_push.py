"""Issue 40, item 1: a revocation always reaches the gateway, whatever else the store holds.

The litellm role's `keys` entry point (what `labctl keys push` and `revoke` run: playbooks/keys.yml,
no database) is run with ansible-playbook on this machine against the key file of the real
LiteLLM 1.106.0 proxy with the role's config and callbacks (gateway_proxy.py), which reads it again
on the next request. On the sandbox, a key saved with a model the lab does not serve made every
later push fail inside the no_log task, so a key revoked after it kept getting 200."""

from __future__ import annotations

import grp
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from labctl.keys import AppKey, KeyStore, hash_key

from .gateway_proxy import Gateway, running_gateway

REPO = Path(__file__).resolve().parents[2]
VARIABLES = {"vllm_max_num_seqs": 4, "litellm_num_workers": 1}


def _push(tmp_path: Path, gw: Gateway, store: KeyStore) -> subprocess.CompletedProcess[str]:
    """The role's keys entry point for the store's records, writing the gateway's key file (its
    owner root, group this process's: make test runs as root)."""
    config_dir = tmp_path / "config"
    config_dir.mkdir(exist_ok=True)  # the proxy is installed (keys.yml checks)
    classes = [{"name": gw.model_of(0), "priority": 0, "key_class": "interactive"},
               {"name": gw.model_of(10), "priority": 10, "key_class": "batch"}]
    variables = {"litellm_app_keys": [k.record() for k in store.load()], "litellm_model_classes": classes,
                 "litellm_app_keys_path": str(gw.keys_file), "litellm_config_dir": str(config_dir),
                 "litellm_group": grp.getgrgid(os.getgid()).gr_name}
    (tmp_path / "vars.json").write_text(json.dumps(variables))
    playbook = tmp_path / "play.yml"
    playbook.write_text("- hosts: localhost\n  gather_facts: false\n  tasks:\n"
                        "    - ansible.builtin.import_role: {name: litellm, tasks_from: keys}\n")
    env = dict(os.environ, ANSIBLE_ROLES_PATH=str(REPO / "roles"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_LOCALHOST_WARNING="False", ANSIBLE_INVENTORY_UNPARSED_WARNING="False")
    return subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-v", str(playbook),
                           "-e", f"@{tmp_path / 'vars.json'}", "-e", f"ansible_python_interpreter={sys.executable}"],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=300, check=False)


def _status(gw: Gateway, key: str, model: str) -> int:
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": "say ok"}], "max_tokens": 4}
    return gw.request("/v1/chat/completions", key, body)[0]


@pytest.mark.skipif(os.geteuid() != 0, reason="the role writes the key file owned by root (make test runs as root)")
def test_a_revoked_key_gets_401_on_the_next_request_with_a_bad_record_in_the_store(tmp_path: Path) -> None:
    with running_gateway(tmp_path / "gw", VARIABLES) as gw:
        interactive, batch = gw.model_of(0), gw.model_of(10)
        store = KeyStore(tmp_path / "secrets" / "app-keys.json")
        _, app_key = store.add("app", "interactive")
        _, other_key = store.add("other", "batch")
        first = _push(tmp_path, gw, store)
        assert first.returncode == 0, first.stdout[-3000:]
        assert _status(gw, app_key, interactive) == 200 and _status(gw, other_key, batch) == 200

        # What `labctl keys add app2 --class batch --model no-such-model` saved on the one-model sandbox
        # before the model was checked (or a key limited to a model since removed from lab_models).
        bad_key = "sk-lab-bad-record-of-the-store"
        bad = AppKey(name="app2", key_class="batch", sha256=hash_key(bad_key), created="2026-12-07T00:00:00+00:00",
                     models=["no-such-model"])
        store.save([*store.load(), bad])
        store.revoke("app")
        run = _push(tmp_path, gw, store)

        # The test: the revoked key is refused from the next request on.
        assert _status(gw, app_key, interactive) == 401
        assert _status(gw, other_key, batch) == 200  # every good key is still sent
        assert _status(gw, bad_key, batch) == 401  # the bad record is left out: it fails closed
        out = run.stdout + run.stderr
        assert run.returncode != 0, out[-3000:]
        (fatal,) = [line for line in out.splitlines() if line.startswith("fatal:")]
        assert "key app2: models ['no-such-model']: the lab serves one model" in fatal, out[-3000:]
        assert "every other key and every revocation was sent" in fatal
        for secret in (app_key, other_key, bad_key, *(k.sha256 for k in store.load())):
            assert secret not in out

