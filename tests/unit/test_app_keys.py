"""Application keys without a database: the control node's store (labctl.keys), what the litellm
role sends (labctl_app_keys_doc) and the auth hook that enforces it (labctl_auth.py, LiteLLM
stood in for; its names are checked against the bundle's wheel below). The run through the real
proxy is molecule stack's test_stack_keys.py."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import stat
import subprocess
import sys
import time
import types
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from ansible.errors import AnsibleFilterError
from typer.testing import CliRunner

from labctl import keys_cli
from labctl.cli import app
from labctl.keys import AppKey, KeyRefused, KeyStore, hash_key

from .callback_loader import litellm_source, load_callback

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "roles" / "litellm" / "filter_plugins"))

from litellm_filters import labctl_app_keys_doc  # noqa: E402

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
CLASSES = [{"name": "m", "priority": 0, "key_class": "interactive"}, {"name": "m-batch", "priority": 10, "key_class": "batch"}]


# --- the store ------------------------------------------------------------------------------------

def test_add_stores_only_the_hash_in_a_private_file(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "secrets" / "app-keys.json")
    record, key = store.add("notebook", "interactive", rpm=60, now=NOW)
    text = store.path.read_text()
    assert key.startswith("sk-lab-") and len(key) > 40
    assert key not in text and hash_key(key) in text
    assert record.sha256 == hashlib.sha256(key.encode()).hexdigest()
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(store.path.parent.stat().st_mode) == 0o700
    assert [k.name for k in store.load()] == ["notebook"]
    assert json.loads(text)["keys"][0]["class"] == "interactive"


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"name": "Bad Name", "key_class": "batch"}, "key name 'Bad Name'"),
    ({"name": "app", "key_class": "urgent"}, "--class urgent: no such key class"),
    ({"name": "app", "key_class": "batch", "rpm": 0}, "--rpm 0"),
    ({"name": "app", "key_class": "batch", "max_parallel": 0}, "--max-parallel 0"),
    ({"name": "app", "key_class": "batch", "expires": "2026-12-01"}, "already past"),
    ({"name": "app", "key_class": "batch", "expires": "next week"}, "--expires next week: not a date"),
    ({"name": "app", "key_class": "batch", "expires": "2027-01-01T10:00"}, "needs its time zone"),
])
def test_bad_input_is_refused_and_changes_nothing(tmp_path: Path, kwargs: dict[str, Any], message: str) -> None:
    store = KeyStore(tmp_path / "app-keys.json")
    store.add("existing", "batch", now=NOW)
    before = store.path.read_bytes()
    with pytest.raises(KeyRefused, match=message):
        store.add(now=NOW, **kwargs)
    assert store.path.read_bytes() == before


def test_a_name_is_unique_until_revoked_and_revoking_keeps_the_record(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "app-keys.json")
    store.add("app", "batch", now=NOW)
    with pytest.raises(KeyRefused, match="key app exists"):
        store.add("app", "interactive", now=NOW)
    store.revoke("app", now=NOW)
    with pytest.raises(KeyRefused, match="no key named app"):
        store.revoke("app", now=NOW)
    store.add("app", "interactive", now=NOW)
    states = [(k.key_class, k.status(NOW)) for k in store.load()]
    assert states == [("batch", "revoked"), ("interactive", "active")]


def test_expiry_is_the_end_of_the_day_utc(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "app-keys.json")
    record, _ = store.add("app", "batch", expires="2026-12-31", now=NOW)
    assert record.expires == "2026-12-31T23:59:59+00:00"
    assert record.status(NOW) == "active"
    assert record.status(datetime(2027, 1, 1, tzinfo=UTC)) == "expired"


def test_an_unreadable_store_is_named(tmp_path: Path) -> None:
    path = tmp_path / "app-keys.json"
    path.write_text("{not json")
    with pytest.raises(KeyRefused, match=str(path)):
        KeyStore(path).add("app", "batch", now=NOW)
    assert path.read_text() == "{not json"


_RACER = """
import sys, time
from pathlib import Path
from labctl.keys import KeyStore
path, who, count, go = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
while not go.exists():
    time.sleep(0.001)
store = KeyStore(path)
for n in range(count):
    store.add(f"{who}-{n}", "batch")
"""


def test_concurrent_adds_lose_no_record(tmp_path: Path) -> None:
    """Issue 29, item 6b: two processes adding keys at once (two labctl keys add) each read the
    store, add one record and write it whole: without a lock across load and save one of them
    writes over the other's record. Each process adds 40 keys; all 80 are kept."""
    path = tmp_path / "secrets" / "app-keys.json"
    KeyStore(path).add("first", "batch", now=NOW)
    go = tmp_path / "go"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]))
    racers = [subprocess.Popen([sys.executable, "-c", _RACER, str(path), who, "40", str(go)], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for who in ("a", "b")]
    time.sleep(1.0)  # both started, waiting for the same moment
    go.touch()
    for racer in racers:
        _out, err = racer.communicate(timeout=120)
        assert racer.returncode == 0, err
    names = [k.name for k in KeyStore(path).load()]
    assert len(names) == len(set(names))
    assert sorted(names) == sorted(["first", *(f"{who}-{n}" for who in ("a", "b") for n in range(40))])


def test_a_looser_existing_directory_is_made_private_again(tmp_path: Path) -> None:
    """Issue 29, item 6b: a secrets directory that exists with looser permissions (copied with
    cp -r, made by hand) is 0700 again after the store's next change, the store 0600."""
    folder = tmp_path / "secrets"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    store = KeyStore(folder / "app-keys.json")
    store.add("app", "batch", now=NOW)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    folder.chmod(0o775)
    store.revoke("app", now=NOW)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600


# --- what the role sends ----------------------------------------------------------------------------

def _record(name: str = "app", key_class: str = "interactive", **extra: Any) -> dict[str, Any]:
    return {**AppKey(name=name, key_class=key_class, sha256=hash_key(name), created=NOW.isoformat()).record(), **extra}


def test_the_gateway_gets_hashes_of_live_keys_and_the_models_of_each_class() -> None:
    doc = labctl_app_keys_doc([_record("a", rpm=5), _record("b", "batch", revoked=NOW.isoformat())], CLASSES)
    assert doc["classes"] == {"interactive": ["m"], "batch": ["m-batch"]}
    assert doc["keys"] == {hash_key("a"): {"name": "a", "class": "interactive", "rpm": 5, "tpm": None, "max_parallel": None,
                                           "expires": None}}


@pytest.mark.parametrize(("record", "message"), [
    (_record(key_class="urgent"), "key app: class 'urgent' does not exist"),
    (_record(sha256="abc"), "key app: sha256 is not 64"),
    (_record(rpm=-1), "key app: rpm -1"),
    (_record(max_parallel=0), "key app: max_parallel 0"),
    (_record(expires="2027-01-01"), "key app: expires '2027-01-01' is not an ISO date-time with a zone"),
])
def test_the_role_refuses_a_bad_store_naming_the_key(record: dict[str, Any], message: str) -> None:
    with pytest.raises(AnsibleFilterError, match=message):
        labctl_app_keys_doc([record], CLASSES)


def test_a_key_given_twice_is_refused() -> None:
    with pytest.raises(AnsibleFilterError, match="given twice"):
        labctl_app_keys_doc([_record("a"), _record("a")], CLASSES)


# --- the hook ------------------------------------------------------------------------------------

class _HTTPException(Exception):
    def __init__(self, status_code: int, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status_code, self.detail = status_code, detail


class _Auth:
    def __init__(self, **kwargs: Any) -> None:
        self.__dict__.update(kwargs)


class _Request:
    def __init__(self, path: str, body: dict[str, Any] | None = None) -> None:
        self.url = types.SimpleNamespace(path=path)
        self.body = body or {}


async def _read_body(request: _Request) -> dict[str, Any]:
    return request.body


def _hook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Path]:
    keys_file = tmp_path / "app-keys.json"
    monkeypatch.setenv("LABCTL_METRICS_KEY", "sk-metrics-prometheus")
    proxy_server = types.SimpleNamespace(master_key="sk-master")
    module = load_callback("labctl_auth", tmp_path, monkeypatch, {
        "fastapi": {"HTTPException": _HTTPException, "Request": _Request},
        "litellm.constants": {"LITELLM_PROXY_MASTER_KEY_ALIAS": "litellm-proxy-master-key"},
        "litellm.proxy": {"proxy_server": proxy_server},
        "litellm.proxy._types": {"LitellmUserRoles": types.SimpleNamespace(PROXY_ADMIN="proxy_admin",
                                                                            INTERNAL_USER="internal_user",
                                                                            INTERNAL_USER_VIEW_ONLY="internal_user_viewer"),
                                 "UserAPIKeyAuth": _Auth},
        "litellm.proxy.common_utils": {},
        "litellm.proxy.common_utils.http_parsing_utils": {"read_request_body": _read_body},
    }, litellm_app_keys_path=str(keys_file), __litellm_app_key_max_parallel=8)
    return module, keys_file


def _write(path: Path, records: list[dict[str, Any]]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(labctl_app_keys_doc(records, CLASSES)))
    os.replace(tmp, path)  # as the role writes it: a rename


def _call(module: Any, key: str | None, path: str = "/v1/chat/completions", model: str = "m") -> Any:
    return asyncio.run(module.user_api_key_auth(_Request(path, {"model": model}), key))


def _status(module: Any, *args: Any, **kwargs: Any) -> int:
    try:
        _call(module, *args, **kwargs)
    except _HTTPException as exc:
        return exc.status_code
    return 200


def test_an_application_key_reaches_its_class_with_its_limits_and_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module, keys_file = _hook(tmp_path, monkeypatch)
    _write(keys_file, [_record("notebook", rpm=3, tpm=1000), _record("nightly", "batch", max_parallel=2)])
    auth = _call(module, "notebook")
    assert (auth.key_alias, auth.rpm_limit, auth.tpm_limit, auth.models) == ("notebook", 3, 1000, ["m"])
    # one key never holds every admission slot: the gateway's default, or the key's own
    assert auth.max_parallel_requests == 8
    assert _call(module, "nightly", model="m-batch").max_parallel_requests == 2
    assert auth.api_key == "labctl-app:notebook" and hash_key("notebook") not in repr(auth.__dict__)
    assert _status(module, "notebook", model="m-batch") == 403
    assert _status(module, "nightly", model="m-batch") == 200
    assert _status(module, "nightly", model="m") == 403
    assert _status(module, "nightly", path="/v1/models") == 200
    assert _status(module, "nightly", path="/key/generate") == 403
    assert _status(module, "nightly", path="/metrics") == 403


def test_unknown_missing_and_expired_keys_get_401_the_master_key_passes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module, keys_file = _hook(tmp_path, monkeypatch)
    past = (datetime.now(UTC) - timedelta(minutes=1)).isoformat()
    _write(keys_file, [_record("old", expires=past)])
    assert _status(module, "nobody") == 401
    assert _status(module, "") == 401
    assert _status(module, None) == 401
    assert _status(module, "old") == 401
    assert _call(module, "sk-master", path="/key/generate").user_role == "proxy_admin"


def test_a_key_change_takes_effect_with_the_next_request(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module, keys_file = _hook(tmp_path, monkeypatch)
    assert _status(module, "app") == 401  # no file yet: only the master key
    _write(keys_file, [_record("app")])
    assert _status(module, "app") == 200
    _write(keys_file, [_record("app", revoked=NOW.isoformat()), _record("other", "batch")])
    assert _status(module, "app") == 401
    keys_file.write_text("{broken")  # a hand edit gone wrong: the last good set stays
    assert _status(module, "other", model="m-batch") == 200
    keys_file.unlink()
    assert _status(module, "other", model="m-batch") == 401


def test_a_key_with_characters_outside_ascii_gets_401(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not a TypeError from compare_digest (str outside ASCII): the hook compares bytes."""
    module, keys_file = _hook(tmp_path, monkeypatch)
    _write(keys_file, [_record("app")])
    for presented in ("sk-lab-clé", "sk-master-é", "ключ", "sk-metrics-prometheus\u00e9"):
        assert _status(module, presented) == 401, presented
        assert _status(module, presented, path="/metrics/") == 401, presented


def test_the_metrics_key_opens_metrics_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module, _ = _hook(tmp_path, monkeypatch)
    assert _call(module, "sk-metrics-prometheus", path="/metrics/").user_role == "internal_user_viewer"
    assert _status(module, "sk-metrics-prometheus") == 403
    assert _status(module, "sk-metrics-wrong", path="/metrics/") == 401
    assert _call(module, "sk-master", path="/metrics/").user_role == "proxy_admin"


# --- the command ------------------------------------------------------------------------------------

def test_keys_add_prints_the_key_once_and_pushes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store_path = tmp_path / "secrets" / "app-keys.json"
    pushed: list[Path] = []
    monkeypatch.setattr(keys_cli, "locate", lambda inventory: (store_path, False))

    def push(inventory: Path, json_output: bool, new_key: str | None = None) -> int:
        pushed.append(inventory)
        return 0

    monkeypatch.setattr(keys_cli, "_push", push)
    inventory = tmp_path / "inv"
    inventory.mkdir()
    result = CliRunner().invoke(app, ["keys", "add", "notebook", "-i", str(inventory), "--class", "batch", "--rpm", "10",
                                      "--max-parallel", "4"])
    assert result.exit_code == 0, result.output
    key = result.stdout.strip().splitlines()[-1]
    assert key.startswith("sk-lab-") and hash_key(key) in store_path.read_text()
    assert pushed == [inventory]
    listed = CliRunner().invoke(app, ["keys", "list", "-i", str(inventory), "--json"])
    rows = json.loads(listed.stdout)
    assert rows[0]["name"] == "notebook" and rows[0]["status"] == "active" and "sha256" not in rows[0]
    assert rows[0]["max_parallel"] == 4 and json.loads(store_path.read_text())["keys"][0]["max_parallel"] == 4
    assert key not in listed.stdout and hash_key(key) not in listed.stdout
    bad = CliRunner().invoke(app, ["keys", "add", "x", "-i", str(inventory), "--class", "urgent"])
    assert bad.exit_code == 2 and "no such key class" in bad.output


# --- LiteLLM's names the hook uses --------------------------------------------------------------------

def test_the_hook_uses_names_the_bundled_litellm_has() -> None:
    parsing, types_src, constants, auth = litellm_source(
        "litellm/proxy/common_utils/http_parsing_utils.py", "litellm/proxy/_types.py", "litellm/constants.py",
        "litellm/proxy/auth/user_api_key_auth.py")
    assert "async def read_request_body(" in parsing
    assert "LITELLM_PROXY_MASTER_KEY_ALIAS" in constants
    assert 'INTERNAL_USER_VIEW_ONLY = "internal_user_viewer"' in types_src
    for field in ("key_alias", "key_name", "rpm_limit", "tpm_limit", "max_parallel_requests", "models", "metadata", "user_role"):
        assert f"    {field}:" in types_src, field
    assert "response = await user_custom_auth(request=request, api_key=api_key)" in auth


def test_preflight_accepts_every_field_the_store_writes() -> None:
    """site.yml's preflight validates lab_app_keys (the store's records) against the project's spec:
    a field `labctl keys` writes that the spec lacks stops every later run ("Supported parameters
    include ..."), as max_parallel did once a key was made with --max-parallel."""
    import dataclasses

    import yaml

    from labctl.keys import AppKey

    specs = yaml.safe_load((Path(__file__).resolve().parents[2] / "roles" / "preflight" / "files"
                            / "project_argument_specs.yml").read_text())
    options = next(spec["options"]["lab_app_keys"]["options"] for spec in specs["argument_specs"].values()
                   if "lab_app_keys" in spec.get("options", {}))
    record = AppKey(name="n", key_class="batch", sha256="0" * 64, created="2026-12-04T00:00:00+00:00", rpm=1, tpm=1,
                    max_parallel=1, expires="2027-01-01T00:00:00+00:00", revoked="2026-12-05T00:00:00+00:00").record()
    assert set(record) <= set(options), set(record) - set(options)
    assert {f.name for f in dataclasses.fields(AppKey)} - {"key_class"} <= set(options)


# --- several models (Issue 32) ----------------------------------------------------------------------

MODEL_CLASSES = [
    {"name": "chat", "priority": 0, "key_class": "interactive", "model": "chat-model"},
    {"name": "chat-batch", "priority": 10, "key_class": "batch", "model": "chat-model"},
    {"name": "embed", "priority": 0, "key_class": "interactive", "model": "embed-model"},
]


def test_a_key_limited_to_models_reaches_its_class_names_of_those_only() -> None:
    doc = labctl_app_keys_doc([_record("rag", models=["embed-model"]), _record("both", models=["chat", "embed"]),
                               _record("night", "batch", models=["chat-model"]), _record("any")], MODEL_CLASSES)
    assert doc["classes"] == {"interactive": ["chat", "embed"], "batch": ["chat-batch"]}
    by_name = {entry["name"]: entry for entry in doc["keys"].values()}
    # a model's name or one of its served names; the key's class still decides which of its names
    assert by_name["rag"]["models"] == ["embed"] and by_name["both"]["models"] == ["chat", "embed"]
    assert by_name["night"]["models"] == ["chat-batch"]
    assert "models" not in by_name["any"]


@pytest.mark.parametrize(("record", "classes", "message"), [
    (_record(models=["nope"]), MODEL_CLASSES, "key app: models: nope not served here .lab_models serves: chat-model, embed-model."),
    (_record("b", "batch", models=["embed-model"]), MODEL_CLASSES, "key b: class batch has no name of embed-model"),
    (_record(models=["m"]), CLASSES, "key app: models .'m'.: the lab serves one model"),
    (_record(models="chat"), MODEL_CLASSES, "key app: models must be a list"),
])
def test_a_bad_model_list_is_refused_naming_the_key(record: dict[str, Any], classes: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(AnsibleFilterError, match=message):
        labctl_app_keys_doc([record], classes)


def test_the_hook_holds_a_limited_key_to_its_models_on_every_body_route(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module, keys_file = _hook(tmp_path, monkeypatch)
    keys_file.write_text(json.dumps(labctl_app_keys_doc([_record("rag", models=["embed-model"]), _record("any")], MODEL_CLASSES)))
    assert _call(module, "rag", path="/v1/embeddings", model="embed").models == ["embed"]
    assert _status(module, "rag", path="/v1/chat/completions", model="chat") == 403
    assert _status(module, "rag", path="/v1/embeddings", model="chat") == 403
    assert _status(module, "rag", path="/v1/completions", model="chat-batch") == 403
    assert _status(module, "any", path="/v1/embeddings", model="embed") == 200
    assert _status(module, "any", path="/v1/chat/completions", model="chat") == 200


def test_a_keys_models_change_and_the_key_stays(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "app-keys.json")
    record, key = store.add("rag", "interactive", models=["old-embed"], now=NOW)
    assert record.record()["models"] == ["old-embed"]
    moved = store.set_models("rag", ["new-embed"])
    (again,) = store.load()
    assert moved.models == again.models == ["new-embed"] and again.sha256 == hash_key(key)
    store.set_models("rag", None)
    assert "models" not in store.load()[0].record()
    with pytest.raises(KeyRefused, match="no key named nobody"):
        store.set_models("nobody", ["x"])
    with pytest.raises(KeyRefused, match="--model"):
        store.set_models("rag", ["bad name"])
