"""Issue 40, item 5: a security change takes effect on every worker of the gateway.

A reload (SIGHUP) replaces uvicorn's workers one at a time, and an old worker serves with the old callbacks
until its requests end (up to litellm_request_timeout each). So a change of what decides security restarts the
proxy (tasks/configure.yml, litellm-security.sha1; labctl_litellm_security_key), while a model added keeps the
cheaper reload; and each worker writes the digest of the settings it loaded (labctl_guard.py), which the role
compares with the settings on disk for every live worker (library/labctl_gateway_workers.py, tasks/service.yml)."""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml
from typer.testing import CliRunner

from labctl.cli import app

from .gateway_proxy import MASTER, running_gateway

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "litellm"
BENCH_INVENTORY = REPO / "bench" / "inventory"

_SPEC = importlib.util.spec_from_file_location("labctl_gateway_workers", REPO / "library" / "labctl_gateway_workers.py")
assert _SPEC and _SPEC.loader
workers = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(workers)


def _filters() -> Any:
    sys.path.insert(0, str(ROLE / "filter_plugins"))
    import litellm_filters

    return litellm_filters


def _rendered(tmp_path: Path) -> dict[str, str]:
    """The files the role writes for the bench inventory: config.yaml and the callbacks with their settings."""
    out = tmp_path / "callbacks"
    result = CliRunner().invoke(app, ["gateway-config", "-i", str(BENCH_INVENTORY), "--callbacks-out", str(out)])
    assert result.exit_code == 0, result.output
    return {"config.yaml": result.stdout, **{p.name: p.read_text() for p in out.iterdir()}}


def _classes(files: dict[str, str]) -> list[dict[str, Any]]:
    config = yaml.safe_load(files["config.yaml"])
    names = {d["model_name"]: d["litellm_params"]["extra_body"]["priority"] for d in config["model_list"]}
    return [{"name": n, "priority": p, "key_class": "batch" if n.endswith("-batch") else "interactive"} for n, p in names.items()]


def _edit(files: dict[str, str], name: str, change: Any) -> dict[str, str]:
    loaded = yaml.safe_load(files[name])
    change(loaded)
    return {**files, name: yaml.safe_dump(loaded)}


def _add_model(files: dict[str, str]) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """What a model added (lab_models) changes: its two names, with the classes' priorities and limits, in
    config.yaml, the gate's classes and the guard's limits; the capacity (slots, LiteLLM's queue, the keys'
    default concurrency)."""
    config = yaml.safe_load(files["config.yaml"])
    for deployment in list(config["model_list"]):
        added = json.loads(json.dumps(deployment))
        added["model_name"] = "tiny-embed" + ("-batch" if deployment["model_name"].endswith("-batch") else "")
        added["litellm_params"]["api_base"] = "http://127.0.0.1:18200/v1"
        added["model_info"]["id"] = added["model_name"] + "@tiny-embed"
        config["model_list"].append(added)
    config["general_settings"]["max_in_flight_requests_per_worker"] += 32
    changed = {**files, "config.yaml": yaml.safe_dump(config)}

    def gate(settings: dict[str, Any]) -> None:
        settings["slots"] += 16
        settings["classes"].update({"tiny-embed": 0, "tiny-embed-batch": 10})

    def guard(settings: dict[str, Any]) -> None:
        settings["logprobs"].update({"tiny-embed": {"top_logprobs": 5, "prompt_logprobs": None},
                                     "tiny-embed-batch": {"top_logprobs": 5, "prompt_logprobs": None}})

    def auth(settings: dict[str, Any]) -> None:
        settings["default_max_parallel"] += 8

    changed = _edit(_edit(_edit(changed, "labctl_admission.yaml", gate), "labctl_guard.yaml", guard), "labctl_auth.yaml", auth)
    classes = _classes(changed)
    return changed, classes


def test_a_security_change_changes_the_key_and_a_model_added_does_not(tmp_path: Path) -> None:
    key = _filters().labctl_litellm_security_key
    files = _rendered(tmp_path)
    classes = _classes(files)
    before = key(files, classes)
    assert key(dict(files), classes) == before
    # A model added (a reload: molecule/stack/tests/test_stack_models.py asserts the reload handler and the MainPID).
    assert key(*_add_model(files)) == before

    def priorities(config: dict[str, Any]) -> None:
        for deployment in config["model_list"]:
            if deployment["model_name"].endswith("-batch"):
                deployment["litellm_params"]["extra_body"] = {"priority": 5}

    def limits(guard: dict[str, Any]) -> None:
        for name in guard["logprobs"]:
            guard["logprobs"][name]["top_logprobs"] = 20

    changes = {
        "class priority (config.yaml)": _edit(files, "config.yaml", priorities),
        "gate priority": _edit(files, "labctl_admission.yaml", lambda g: g["classes"].update(dict.fromkeys(g["classes"], 1))),
        "gate floors": _edit(files, "labctl_admission.yaml", lambda g: g.update(floors={"10": 0.3})),
        "guard routes": _edit(files, "labctl_guard.yaml", lambda g: g["routes"].append("/v1/files")),
        "logprobs limits": _edit(files, "labctl_guard.yaml", limits),
        "closed routes": _edit(files, "labctl_routes.yaml", lambda r: r["closed"].remove(r["closed"][0])),
        "keys file": _edit(files, "labctl_auth.yaml", lambda a: a.update(keys_file="/tmp/other.json")),
        "auth (config.yaml)": _edit(files, "config.yaml", lambda c: c["general_settings"].pop("custom_auth")),
        "metrics auth": _edit(files, "config.yaml", lambda c: c["litellm_settings"].update(require_auth_for_metrics_endpoint=False)),
        "callbacks": _edit(files, "config.yaml", lambda c: c["litellm_settings"]["callbacks"].remove("labctl_guard.guard")),
        "guard code": {**files, "labctl_guard.py": files["labctl_guard.py"] + "\n# changed\n"},
        "auth code": {**files, "labctl_auth.py": files["labctl_auth.py"] + "\n# changed\n"},
        "route filter code": {**files, "labctl_routes.py": files["labctl_routes.py"] + "\n# changed\n"},
    }
    for what, changed in changes.items():
        assert key(changed, classes) != before, what
    # A class's priorities swapped: the same set of numbers, each key class another.
    swapped = [{**c, "key_class": "batch" if c["key_class"] == "interactive" else "interactive"} for c in classes]
    assert key(files, swapped) != before


def _notify(changed_files: list[str], num_workers: int = 4) -> str:
    """The restart-or-reload task's notify expression of tasks/configure.yml, for these changed files."""
    tasks = yaml.safe_load((ROLE / "tasks" / "configure.yml").read_text())
    task = next(t for t in tasks if t["name"] == "Restart or reload the proxy for what changed")
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters["int"] = int
    return env.from_string(task["notify"]).render(
        litellm_config_dir="/etc/labctl/litellm", litellm_num_workers=num_workers,
        __litellm_files={"changed_files": changed_files}).strip()


def test_the_security_key_restarts_the_proxy_and_other_settings_reload_it() -> None:
    tasks = yaml.safe_load((ROLE / "tasks" / "configure.yml").read_text())
    written = next(t for t in tasks if t["name"].startswith("Write the callbacks and their settings"))
    assert "litellm-security.sha1" in written["labctl_template"]["files"]
    assert "labctl_litellm_security_key" in written["vars"]["__litellm_security_key"]
    d = "/etc/labctl/litellm/"
    assert _notify([d + "labctl_guard.yaml", d + "config.yaml", d + "litellm-security.sha1"]) == "litellm restart needed"
    assert _notify([d + "litellm-service.sha1"]) == "litellm restart needed"
    assert _notify([d + "config.yaml", d + "labctl_admission.yaml", d + "labctl_guard.yaml"]) == "litellm reload needed"
    assert _notify([d + "config.yaml"], num_workers=1) == "litellm restart needed"


def test_the_workers_digest_is_the_checks(tmp_path: Path) -> None:
    """labctl_guard.py's settings_digest (the worker's side: the guard imports LiteLLM, so its function alone)
    and the module's give the same digest, over config.yaml, labctl_*.py and labctl_*.yaml only."""
    tree = ast.parse((ROLE / "files" / "etc" / "labctl" / "litellm" / "labctl_guard.py").read_text())
    function = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "settings_digest")
    namespace: dict[str, Any] = {"hashlib": hashlib, "Path": Path}
    exec(compile(ast.Module(body=[function], type_ignores=[]), "labctl_guard.py", "exec"), namespace)
    for name, text in {"config.yaml": "a", "labctl_guard.py": "b", "labctl_guard.yaml": "c", "labctl_auth.yaml": "d"}.items():
        (tmp_path / name).write_text(text)
    digest = workers.settings_digest(tmp_path)
    assert namespace["settings_digest"](tmp_path) == digest
    (tmp_path / "app-keys.json").write_text("{}")
    (tmp_path / "litellm-security.sha1").write_text("x")
    assert workers.settings_digest(tmp_path) == digest
    (tmp_path / "labctl_guard.yaml").write_text("changed")
    assert workers.settings_digest(tmp_path) != digest


def _check(gw: Any, count: int, timeout: int) -> tuple[bool, str, list[str]]:
    ok, digest, found = workers.check({"main_pid": gw.pid, "unit": None, "config_dir": str(gw.rundir),
                                       "stamps": str(gw.rundir / "workers"), "workers": count, "timeout": timeout})
    return bool(ok), str(digest), list(found)


def test_every_worker_runs_the_new_settings_after_the_proxys_workers_are_replaced(tmp_path: Path) -> None:
    """The real proxy with two workers: each writes its stamp; a settings change shows in every worker's only
    once each was replaced; during a reload, an old worker still runs the old settings, and the check names it."""
    with running_gateway(tmp_path, {"vllm_max_num_seqs": 4}, num_workers=2) as gw:
        ok, first, found = _check(gw, 2, 120)
        assert ok, found
        guard = gw.rundir / "labctl_guard.yaml"
        settings = yaml.safe_load(guard.read_text())
        settings["routes"] = [r for r in settings["routes"] if r != "/v1/embeddings"]
        guard.write_text(yaml.safe_dump(settings))
        ok, second, found = _check(gw, 2, 0)
        assert not ok and second != first
        assert len(found) == 2 and all("runs other settings" in f for f in found), found

        # SIGHUP (the handler's reload): uvicorn starts a new worker, stops an old one once the new one serves,
        # then the next. While an old worker is left (up to litellm_request_timeout per worker with requests in
        # flight), it runs the old settings, and the check names it: hence a restart for a security change.
        old = set(workers.workers_of(gw.pid))
        os.kill(gw.pid, signal.SIGHUP)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not set(workers.workers_of(gw.pid)) - old:
            time.sleep(0.2)
        mixed = workers.problems(gw.pid, gw.rundir / "workers", second, 2)
        assert set(workers.workers_of(gw.pid)) - old, "no new worker after SIGHUP"
        assert any("runs other settings" in f for f in mixed), mixed
        # Once each is replaced, every worker is a new one running the new settings.
        ok, digest, found = _check(gw, 2, 300)
        assert ok and digest == second, found
        assert not old & set(workers.workers_of(gw.pid))
        body = {"model": gw.model_of(0), "messages": [{"role": "user", "content": "hi"}]}
        status, _, _ = gw.request("/v1/chat/completions", MASTER, body)
        assert status == 200


@pytest.mark.parametrize("count", [1])
def test_one_worker_is_the_main_process(tmp_path: Path, count: int) -> None:
    with running_gateway(tmp_path, {"vllm_max_num_seqs": 4}, num_workers=count) as gw:
        ok, _, found = _check(gw, count, 120)
        assert ok, found
        assert workers.workers_of(gw.pid) == [gw.pid]
