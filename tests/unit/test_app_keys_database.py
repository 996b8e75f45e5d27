"""Application keys in database mode: the litellm role's keys_database.yml against a stand-in of
LiteLLM's key API (/key/generate, /key/info, /key/update, /key/delete with the master key; request
shapes from litellm 1.106.0's GenerateKeyRequest, UpdateKeyRequest and KeyRequest, their field names
checked against the bundle's wheel below). Every live key reaches the model API only
(allowed_routes) with a per-key concurrency limit, and Prometheus's token is a virtual key for
/metrics only. Not run against a real database-mode proxy: the test bundle has no Prisma engines
(docs/verification.md, "application keys")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlparse

import pytest

from labctl.keys import KeyStore, hash_key

from .callback_loader import litellm_source
from .json_http import JSONHandler

REPO = Path(__file__).resolve().parents[2]
MASTER = "sk-master-test"
METRICS = "sk-metrics-test"
ROUTES = ["/v1/chat/completions", "/chat/completions", "/v1/completions", "/completions", "/v1/responses", "/responses",
          "/v1/models", "/models", "/v1/model/info", "/model/info"]
# LiteLLM 1.106.0's KeyRequestBase/GenerateKeyRequest/UpdateKeyRequest fields the role sends.
FIELDS = {"key", "key_alias", "models", "metadata", "rpm_limit", "tpm_limit", "max_parallel_requests", "allowed_routes",
          "duration"}


class _KeyAPI(JSONHandler):
    db: ClassVar[dict[str, dict[str, Any]]] = {}
    calls: ClassVar[list[tuple[str, str, Any]]] = []

    def _authorized(self) -> bool:
        if self.headers.get("Authorization") != f"Bearer {MASTER}":
            self._answer(401, {"error": "not the master key"})
            return False
        return True

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        url = urlparse(self.path)
        if not self._authorized():
            return
        token = parse_qs(url.query).get("key", [""])[0]
        self.calls.append(("GET", url.path, token))
        if url.path == "/key/info" and token in self.db:
            self._answer(200, {"key": token, "info": self.db[token]})
        else:
            self._answer(404, {"error": "key not found"})

    def do_POST(self) -> None:  # noqa: N802
        if not self._authorized():
            return
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        self.calls.append(("POST", self.path, body))
        unknown = set(body) - FIELDS - {"keys"}
        if unknown:
            self._answer(422, {"error": f"fields the role does not send: {sorted(unknown)}"})
        elif self.path == "/key/generate":
            self.db[hash_key(body["key"])] = {k: v for k, v in body.items() if k != "key"}
            self._answer(200, {"key": body["key"], "key_alias": body.get("key_alias")})
        elif self.path == "/key/update" and body.get("key") in self.db:  # a sha256 is LiteLLM's token
            self.db[body["key"]].update({k: v for k, v in body.items() if k != "key"})
            self._answer(200, {"key": body["key"]})
        elif self.path == "/key/delete":
            for token in body.get("keys", []):
                self.db.pop(token, None)
            self._answer(200, {"deleted_keys": body.get("keys", [])})
        else:
            self._answer(404, {"error": "no such route"})


@pytest.fixture
def api() -> Iterator[tuple[int, type[_KeyAPI]]]:
    handler = type("KeyAPI", (_KeyAPI,), {"db": {}, "calls": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], handler
    server.shutdown()


def _run(tmp_path: Path, port: int, keys: list[dict[str, Any]], new_file: str = "") -> subprocess.CompletedProcess[str]:
    config_dir = tmp_path / "config"
    config_dir.mkdir(exist_ok=True)
    # what configure.yml writes beside the proxy's config (the lab's topology is not loaded here)
    (config_dir / "app-key-defaults.json").write_text(json.dumps({"max_parallel": 24, "routes": ROUTES}))
    variables = {"litellm_database_mode": True, "litellm_tls_enabled": False, "litellm_port": port, "litellm_master_key": MASTER,
                 "litellm_metrics_key": METRICS, "litellm_config_dir": str(config_dir),
                 "litellm_app_keys": keys, "litellm_app_key_new_file": new_file,
                 "litellm_model_classes": [{"name": "m", "priority": 0, "key_class": "interactive"},
                                           {"name": "m-batch", "priority": 10, "key_class": "batch"}]}
    (tmp_path / "vars.json").write_text(json.dumps(variables))
    playbook = tmp_path / "play.yml"
    playbook.write_text("- hosts: localhost\n  gather_facts: false\n  tasks:\n"
                        "    - ansible.builtin.import_role: {name: litellm, tasks_from: keys_database}\n")
    env = dict(os.environ, ANSIBLE_ROLES_PATH=str(REPO / "roles"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_LOCALHOST_WARNING="False", ANSIBLE_INVENTORY_UNPARSED_WARNING="False")
    return subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-v", str(playbook), "-e", f"@{tmp_path / 'vars.json'}",
                           "-e", f"ansible_python_interpreter={sys.executable}"],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=300, check=False)


def test_a_new_key_becomes_a_virtual_key_and_revoked_ones_are_deleted(tmp_path: Path, api: tuple[int, Any]) -> None:
    port, handler = api
    store = KeyStore(tmp_path / "secrets" / "app-keys.json")
    old, old_key = store.add("old", "batch")
    store.revoke("old")
    handler.db[old.sha256] = {"key_alias": "old"}  # made earlier, now revoked
    expires = (datetime.now(UTC) + timedelta(days=10)).date().isoformat()
    record, key = store.add("notebook", "interactive", rpm=60, expires=expires)
    handoff = tmp_path / "new-key.json"
    handoff.write_text(json.dumps({"name": "notebook", "key": key}))
    keys = [k.record() for k in store.load()]

    first = _run(tmp_path, port, keys, str(handoff))
    assert first.returncode == 0, first.stdout[-3000:]
    generate = [c[2] for c in handler.calls if c[1] == "/key/generate" and c[2]["key"] != METRICS]
    assert len(generate) == 1
    body = generate[0]
    assert body["key"] == key and body["key_alias"] == "notebook" and body["models"] == ["m"]
    assert body["rpm_limit"] == 60 and "tpm_limit" not in body
    # the model API only (no files, batches, images, MCP...), and the default concurrency
    assert body["allowed_routes"] == ROUTES and body["max_parallel_requests"] == 24
    assert body["metadata"] == {"labctl_key_class": "interactive"}
    assert 9 * 86400 < int(body["duration"].rstrip("s")) <= 11 * 86400
    assert [c[2] for c in handler.calls if c[1] == "/key/delete"] == [{"keys": [old.sha256]}]
    # Prometheus's token: a virtual key for /metrics only, no model
    assert handler.db[hash_key(METRICS)] == {"key_alias": "labctl-prometheus", "models": ["no-default-models"],
                                             "allowed_routes": ["/metrics"]}
    assert set(handler.db) == {record.sha256, hash_key(METRICS)}
    assert "changed=3" in first.stdout
    # No key and no hash in -v output.
    assert key not in first.stdout + first.stderr and old_key not in first.stdout and METRICS not in first.stdout
    assert record.sha256 not in first.stdout and old.sha256 not in first.stdout

    handler.calls.clear()
    second = _run(tmp_path, port, keys)
    assert second.returncode == 0, second.stdout[-3000:]
    assert "changed=0" in second.stdout
    assert not [c for c in handler.calls if c[0] == "POST"]


def test_a_new_key_the_store_does_not_hold_is_refused(tmp_path: Path, api: tuple[int, Any]) -> None:
    port, handler = api
    store = KeyStore(tmp_path / "app-keys.json")
    store.add("notebook", "interactive")
    handoff = tmp_path / "new-key.json"
    handoff.write_text(json.dumps({"name": "notebook", "key": "sk-lab-something-else"}))
    run = _run(tmp_path, port, [k.record() for k in store.load()], str(handoff))
    assert run.returncode != 0
    assert "does not match the store's hash" in run.stdout + run.stderr
    assert not [c for c in handler.calls if c[0] == "POST"]


def test_a_bad_record_is_named_and_revocations_still_go_through(tmp_path: Path, api: tuple[int, Any]) -> None:
    """Issue 40, item 1, database mode: a bad record of the store (here limited to a model the
    one-model lab does not serve, as `labctl keys add --model no-such-model` saved it) used to
    raise inside the no_log tasks that build the /key/generate and /key/update bodies: the run
    failed with "output hidden", and a new key's run (generate comes before the deletes) deleted no
    revoked key. Now the bad record is neither made nor updated, the revoked key is deleted, the
    other keys are brought to their records, and the run fails naming the bad key (never a key or a
    hash)."""
    port, handler = api
    store = KeyStore(tmp_path / "secrets" / "app-keys.json")
    old, old_key = store.add("old", "batch")
    store.revoke("old")
    handler.db[old.sha256] = {"key_alias": "old"}
    plain, _ = store.add("plain", "batch")
    handler.db[plain.sha256] = {"key_alias": "plain", "models": ["m-batch"]}  # made before allowed_routes
    _, broken_key = store.add("broken", "batch")
    records = [k.record() for k in store.load()]
    records[-1]["models"] = ["no-such-model"]
    handoff = tmp_path / "new-key.json"
    handoff.write_text(json.dumps({"name": "broken", "key": broken_key}))

    run = _run(tmp_path, port, records, str(handoff))
    out = run.stdout + run.stderr
    assert run.returncode != 0
    assert [c[2] for c in handler.calls if c[1] == "/key/delete"] == [{"keys": [old.sha256]}]
    assert old.sha256 not in handler.db
    assert not [c for c in handler.calls if c[1] == "/key/generate" and c[2]["key"] == broken_key]
    assert handler.db[plain.sha256]["allowed_routes"] == ROUTES
    (fatal,) = [line for line in out.splitlines() if line.startswith("fatal:")]
    assert "key broken: models ['no-such-model']: the lab serves one model" in fatal, out[-3000:]
    for secret in (broken_key, old_key, old.sha256, plain.sha256, records[-1]["sha256"]):
        assert secret not in out


def test_keys_made_before_get_the_model_api_routes_and_a_concurrency_limit(tmp_path: Path, api: tuple[int, Any]) -> None:
    """A live key the database holds without allowed_routes (made by an earlier version, open to
    files, batches, images, MCP...) is updated to the store's record: its class's models, the model
    API's routes, its own or the default max_parallel. A second run changes nothing."""
    port, handler = api
    store = KeyStore(tmp_path / "secrets" / "app-keys.json")
    plain, _ = store.add("plain", "batch", rpm=5)
    capped, _ = store.add("capped", "interactive", max_parallel=3)
    handler.db[plain.sha256] = {"key_alias": "plain", "models": ["m-batch"], "rpm_limit": 5}
    handler.db[capped.sha256] = {"key_alias": "capped", "models": ["m"], "allowed_routes": ROUTES, "max_parallel_requests": 3}
    handler.db[hash_key(METRICS)] = {"key_alias": "labctl-prometheus", "models": [], "allowed_routes": []}
    keys = [k.record() for k in store.load()]
    first = _run(tmp_path, port, keys)
    assert first.returncode == 0, first.stdout[-3000:]
    updates = [c[2] for c in handler.calls if c[1] == "/key/update"]
    assert {"key": plain.sha256, "allowed_routes": ROUTES, "max_parallel_requests": 24} in updates
    assert not [u for u in updates if u["key"] == capped.sha256]
    assert handler.db[plain.sha256]["allowed_routes"] == ROUTES and handler.db[plain.sha256]["rpm_limit"] == 5
    assert handler.db[hash_key(METRICS)]["allowed_routes"] == ["/metrics"]
    assert handler.db[hash_key(METRICS)]["models"] == ["no-default-models"]
    handler.calls.clear()
    second = _run(tmp_path, port, keys)
    assert second.returncode == 0 and "changed=0" in second.stdout, second.stdout[-3000:]


def test_the_fields_the_role_sends_are_litellms() -> None:
    """Every field of FIELDS is one LiteLLM 1.106.0's key requests declare, and the names the role
    relies on exist: no-default-models, a route allow-list matched exactly or as a prefix."""
    types_src, routes_src = litellm_source("litellm/proxy/_types.py", "litellm/proxy/auth/route_checks.py")
    base = types_src[types_src.index("class GenerateRequestBase("):types_src.index("class LiteLLMKeyType(")]
    assert "class KeyRequestBase(GenerateRequestBase):" in base
    assert "class GenerateKeyRequest(KeyRequestBase):" in types_src and "class UpdateKeyRequest(KeyRequestBase):" in types_src
    for field in FIELDS:
        assert f"    {field}:" in base, field
    assert 'no_default_models = "no-default-models"' in types_src
    assert 'if route.startswith(allowed_route + "/"):' in routes_src
