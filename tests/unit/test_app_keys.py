"""Application keys without a database: the control node's store (labctl.keys), what the litellm
role sends (labctl_app_keys_doc) and the auth hook that enforces it (labctl_auth.py, LiteLLM
stood in for; its names are checked against the bundle's wheel below). The run through the real
proxy is molecule stack's test_stack_keys.py; the role's push with a bad record in the store,
against the real proxy, is test_app_keys_push.py."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import stat
import subprocess
import sys
import time
import types
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from labctl import keys as keys_mod
from labctl import keys_cli
from labctl import models as lab_models_mod
from labctl.ansible_run import PlaybookResult
from labctl.cli import app
from labctl.keys import AppKey, KeyRefused, KeyStore, hash_key

from .callback_loader import litellm_source, load_callback

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "roles" / "litellm" / "filter_plugins"))

import litellm_filters  # noqa: E402
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


BAD_RECORDS = [
    (_record("bad", key_class="urgent"), "key bad: class 'urgent' does not exist"),
    (_record("bad", sha256="abc"), "key bad: sha256 is not 64"),
    (_record("bad", rpm=-1), "key bad: rpm -1"),
    (_record("bad", max_parallel=0), "key bad: max_parallel 0"),
    (_record("bad", expires="2027-01-01"), "key bad: expires '2027-01-01' is not an ISO date-time with a zone"),
    # what the issue's `labctl keys add app2 --class batch --model no-such-model` saved on a one-model lab
    (_record("bad", "batch", models=["no-such-model"]), r"key bad: models \['no-such-model'\]: the lab serves one model"),
]


@pytest.mark.parametrize(("record", "message"), BAD_RECORDS, ids=[m.split(": ", 1)[1][:24] for _, m in BAD_RECORDS])
def test_a_bad_record_is_left_out_and_named_the_others_are_sent(record: dict[str, Any], message: str) -> None:
    """Issue 40, item 1: one bad record no longer stops the whole file (before, the filter raised
    and no push wrote app-keys.json again, revocations included): the good live keys are sent,
    revoked ones are not, the bad one is left out (its key gets 401) and named with the reason,
    never with its hash."""
    records = [_record("good", rpm=5), record, _record("gone", "batch", revoked=NOW.isoformat())]
    doc = labctl_app_keys_doc(records, CLASSES)
    assert doc["keys"] == {hash_key("good"): {"name": "good", "class": "interactive", "rpm": 5, "tpm": None,
                                              "max_parallel": None, "expires": None}}
    problems = litellm_filters.labctl_app_keys_problems(records, CLASSES)
    assert [p["name"] for p in problems] == ["bad"], problems
    assert re.search(message, problems[0]["problem"]), problems
    assert str(record["sha256"]) not in json.dumps(problems)
    assert litellm_filters.labctl_app_keys_problems([_record("good"), _record("gone", revoked=NOW.isoformat())], CLASSES) == []


def test_a_key_given_twice_is_left_out_whichever_was_meant() -> None:
    records: list[Any] = [_record("a"), _record("b", "batch"), _record("a"), "junk"]
    doc = labctl_app_keys_doc(records, CLASSES)
    assert set(doc["keys"]) == {hash_key("b")}
    problems = [p["problem"] for p in litellm_filters.labctl_app_keys_problems(records, CLASSES)]
    assert problems == ["lab_app_keys: entry 4 is not a mapping", "lab_app_keys: key a: given twice (revoke the old one first)",
                        "lab_app_keys: key a: given twice (revoke the old one first)"]


def test_a_bad_key_fails_site_yml_only_after_the_proxy_runs_with_the_others() -> None:
    """The role sends the keys before it starts the proxy (tasks/main.yml): a bad record names
    itself at the end of the role, so a fresh gateway still starts with every good key, and the run
    fails then; `labctl keys push` (tasks_from: keys) and database mode fail at the end of theirs."""
    tasks = REPO / "roles" / "litellm" / "tasks"
    main = [next(v for k, v in t.items() if k.endswith("import_tasks")) for t in yaml.safe_load((tasks / "main.yml").read_text())]
    assert main.index("keys_file.yml") < main.index("service.yml") < main.index("keys_problems.yml") == len(main) - 1
    for entry in ("keys.yml", "keys_database.yml"):
        last = yaml.safe_load((tasks / entry).read_text())[-1]
        assert last.get("ansible.builtin.import_tasks") == "keys_problems.yml", entry
    (report,) = yaml.safe_load((tasks / "keys_problems.yml").read_text())
    assert "ansible.builtin.fail" in report and "no_log" not in report


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
    monkeypatch.setattr(keys_cli, "locate", lambda inventory: keys_cli.Located(store_path, False))

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
    (_record(models=["nope"]), MODEL_CLASSES, "key app: models: nope not served here .lab_models serves: chat-model, embed-model;"),
    (_record("b", "batch", models=["embed-model"]), MODEL_CLASSES, "key b: class batch has no name of embed-model"),
    (_record(models=["m"]), CLASSES, "key app: models .'m'.: the lab serves one model"),
    (_record(models="chat"), MODEL_CLASSES, "key app: models must be a list"),
])
def test_a_bad_model_list_leaves_the_key_out_naming_it(record: dict[str, Any], classes: list[dict[str, Any]], message: str) -> None:
    """A key limited to a model the lab does not serve (removed from lab_models since): left out, named."""
    assert labctl_app_keys_doc([record, _record("any")], classes)["keys"].keys() == {hash_key("any")}
    (problem,) = litellm_filters.labctl_app_keys_problems([record, _record("any")], classes)
    assert re.search(message, problem["problem"]), problem


def test_the_hook_holds_a_limited_key_to_its_models_on_every_body_route(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module, keys_file = _hook(tmp_path, monkeypatch)
    keys_file.write_text(json.dumps(labctl_app_keys_doc([_record("rag", models=["embed-model"]), _record("any")], MODEL_CLASSES)))
    assert _call(module, "rag", path="/v1/embeddings", model="embed").models == ["embed"]
    assert _status(module, "rag", path="/v1/chat/completions", model="chat") == 403
    assert _status(module, "rag", path="/v1/embeddings", model="chat") == 403
    assert _status(module, "rag", path="/v1/completions", model="chat-batch") == 403
    assert _status(module, "any", path="/v1/embeddings", model="embed") == 200
    assert _status(module, "any", path="/v1/chat/completions", model="chat") == 200


# lab_models as labctl.models.parse gives them; the gateway's names of them are MODEL_CLASSES.
LAB_MODELS = [{"id": 0, "name": "chat-model", "revision": "r1", "served_names": ["chat"], "classes": ["interactive", "batch"]},
              {"id": 1, "name": "embed-model", "revision": "r1", "served_names": ["embed"], "kind": "embed"}]


def test_labctl_checks_a_keys_models_against_the_names_the_gateway_publishes() -> None:
    """`labctl keys add --model` and the litellm role apply one rule (labctl.keys.key_models) to the
    same names: labctl.keys.public_names of lab_models is litellm_model_classes' default."""
    parsed = lab_models_mod.parse(LAB_MODELS)
    assert [{k: v for k, v in c.items() if k != "priority"} for c in MODEL_CLASSES] == keys_mod.public_names(parsed)
    assert litellm_filters.labctl_model_classes(parsed, []) == MODEL_CLASSES


@pytest.mark.parametrize(("listed", "key_class", "models", "message"), [
    (LAB_MODELS, "batch", ["no-such-model"],
     (r"models: no-such-model not served here \(lab_models serves: chat-model, embed-model; by their public names: chat, "
      r"chat-batch, embed\)")),
    (LAB_MODELS, "batch", ["embed-model"], r"class batch has no name of embed-model \(its names: chat-batch\)"),
    (None, "batch", ["no-such-model"], r"models \['no-such-model'\]: the lab serves one model \(lab_models is not set\)"),
])
def test_a_model_the_lab_does_not_serve_is_refused_before_the_store_changes(
        tmp_path: Path, listed: list[dict[str, Any]] | None, key_class: str, models: list[str], message: str) -> None:
    """Issue 40, item 1: `labctl keys add app2 --class batch --model no-such-model` was saved (only
    the characters were checked) and every later push failed. add and models now check the model
    against the lab's models, naming it and those the lab serves, and change nothing."""
    parsed = lab_models_mod.parse(listed) if listed else None
    store = KeyStore(tmp_path / "app-keys.json")
    store.add("existing", key_class, now=NOW)
    before = store.path.read_bytes()
    with pytest.raises(KeyRefused, match="key app2: " + message):
        store.add("app2", key_class, models=models, lab_models=parsed, now=NOW)
    with pytest.raises(KeyRefused, match="key existing: " + message):
        store.set_models("existing", models, parsed)
    assert store.path.read_bytes() == before


def test_a_class_no_model_has_is_refused(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "app-keys.json")
    with pytest.raises(KeyRefused, match=r"--class batch: no model of lab_models has this class \(their classes: interactive\)"):
        store.add("app", "batch", lab_models=lab_models_mod.parse(LAB_MODELS[1:]), now=NOW)
    assert not store.path.exists()


def _located(monkeypatch: pytest.MonkeyPatch, store_path: Path, listed: Any) -> list[tuple[Any, ...]]:
    """labctl keys with the locate play's answer (playbooks/keys.yml's set_stats) and no push."""
    data = {"labctl_keys_file": str(store_path), "labctl_keys_database_mode": False, "labctl_keys_lab_models": listed}
    monkeypatch.setattr(keys_cli, "run_playbook", lambda *args, **kwargs: PlaybookResult(status="successful", rc=0, data=data))
    pushed: list[tuple[Any, ...]] = []

    def push(*args: Any) -> int:
        pushed.append(args)
        return 0

    monkeypatch.setattr(keys_cli, "_push", push)
    return pushed


def test_keys_add_checks_the_model_against_the_inventorys_lab_models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 40, item 1, as reproduced on the sandbox: the command refuses a model the inventory's
    lab_models does not serve (exit 2, naming it and those served), saves nothing, pushes nothing."""
    store_path = tmp_path / "secrets" / "app-keys.json"
    inventory = tmp_path / "inv"
    inventory.mkdir()
    pushed = _located(monkeypatch, store_path, LAB_MODELS)
    refused = CliRunner().invoke(app, ["keys", "add", "app2", "-i", str(inventory), "--class", "batch", "--model", "no-such-model"])
    assert refused.exit_code == 2, refused.output
    assert "key app2: models: no-such-model not served here (lab_models serves: chat-model, embed-model" in refused.output
    assert not store_path.exists() and pushed == []
    made = CliRunner().invoke(app, ["keys", "add", "app2", "-i", str(inventory), "--class", "batch", "--model", "chat"])
    assert made.exit_code == 0, made.output
    assert json.loads(store_path.read_text())["keys"][0]["models"] == ["chat"] and len(pushed) == 1
    before = store_path.read_bytes()
    moved = CliRunner().invoke(app, ["keys", "models", "app2", "-i", str(inventory), "--model", "embed-model"])
    assert moved.exit_code == 2 and "class batch has no name of embed-model" in moved.output, moved.output
    assert store_path.read_bytes() == before and len(pushed) == 1
    # A one-model lab (no lab_models: the play hands over []): no --model at all.
    _located(monkeypatch, store_path, [])
    one = CliRunner().invoke(app, ["keys", "add", "app3", "-i", str(inventory), "--class", "batch", "--model", "no-such-model"])
    assert one.exit_code == 2 and "the lab serves one model" in one.output, one.output
    assert store_path.read_bytes() == before


def test_a_keys_models_change_and_the_key_stays(tmp_path: Path) -> None:
    listed = lab_models_mod.parse([{"id": 0, "name": "old-embed", "revision": "r1", "kind": "embed"},
                                   {"id": 1, "name": "new-embed", "revision": "r1", "kind": "embed"}])
    store = KeyStore(tmp_path / "app-keys.json")
    record, key = store.add("rag", "interactive", models=["old-embed"], lab_models=listed, now=NOW)
    assert record.record()["models"] == ["old-embed"]
    moved = store.set_models("rag", ["new-embed"], listed)
    (again,) = store.load()
    assert moved.models == again.models == ["new-embed"] and again.sha256 == hash_key(key)
    store.set_models("rag", None)
    assert "models" not in store.load()[0].record()
    with pytest.raises(KeyRefused, match="no key named nobody"):
        store.set_models("nobody", ["x"], listed)
    with pytest.raises(KeyRefused, match="--model"):
        store.set_models("rag", ["bad name"], listed)
