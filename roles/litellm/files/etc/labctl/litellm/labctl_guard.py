"""The class guard of the LiteLLM proxy (litellm_settings.callbacks, before the admission gate).

A key's class is the model names it may use, and each model class sends its own vLLM priority
(config.yaml: extra_body.priority). LiteLLM 1.106.0 reads the model from more places than the
body the auth checks (a ?model= query beats the body's model; a path model, a deployment id or
name, a comma list; client fallbacks and router_settings_override reach other groups) and lets a
client's own fields replace or remove a deployment's extra_body on its way to vLLM (extra_body,
priority, additional_drop_params, allowed_openai_params). So, for every key but the master key:

  - async_pre_call_hook (after LiteLLM merged the query, the path and the aliases into
    data["model"]): the model LiteLLM will route is one the key may use, else 403; a field that
    picks another model group or carries or removes the priority is refused with 400;
  - async_pre_call_deployment_hook (every attempt, retries and fallbacks included, once the
    router chose a deployment; the master key's requests too): the chosen deployment's extra_body
    is put back over whatever the request carried, and a top-level priority is dropped, so vLLM
    receives the priority of the class that serves the request.

Also (issue 40), for every key but the master key: the route must be one of the model API's, exactly
(LiteLLM's allowed_routes also let a virtual key through to what lies below one: /v1/responses/{id},
its /cancel and /input_items, Google's /models/{m}:generateContent), else 403; a client's own
api_key, api_base or base_url is refused (LiteLLM would send the request with it, to a deployment of
its own making); and the answer's headers name no replica (x-litellm-model-api-base, -id, -name). For
every key, the master key's too: logprobs within the limits of the model name's class (labctl_guard.yaml,
litellm_logprobs_limits), else 400 before any replica sees the request.
"""
from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Any

import yaml
from litellm.integrations.custom_logger import CustomLogger

# Settings: labctl_guard.yaml beside this file, rendered by the litellm role from its variables
# (roles/litellm/templates/etc/labctl/litellm/labctl_guard.yaml.j2).
_SETTINGS: dict[str, Any] = yaml.safe_load(Path(__file__).with_suffix(".yaml").read_text(encoding="utf-8"))

# Fields a key may not send: they choose another model group, or set or remove the priority
# vLLM receives (roles/litellm/README.md, "What a client can and cannot do").
ROUTING_FIELDS = ("fallbacks", "context_window_fallbacks", "content_policy_fallbacks", "router_settings_override",
                  "specific_deployment", "model_list", "user_config")
PRIORITY_FIELDS = ("priority", "extra_body", "additional_drop_params", "allowed_openai_params")
REFUSED_FIELDS = ROUTING_FIELDS + PRIORITY_FIELDS
# The upstream's credentials and address (LiteLLM 1.106.0 router_utils/clientside_credential_handler.py): the
# router would build a deployment of its own for the request, with the client's key as the replica's
# bearer and a model_info.id of its own, so no class's extra_body (priority) would reach vLLM.
CREDENTIAL_FIELDS = ("api_key", "api_base", "base_url")

# The model API, exactly: user_api_key_dict.request_route (LiteLLM's normalized route: /v1/responses/abc/cancel
# reads /v1/responses/{response_id}/cancel) and the call types of its routes.
ROUTES = frozenset(str(route) for route in _SETTINGS["routes"])
MODEL_CALLS = frozenset({"acompletion", "atext_completion", "aresponses", "aembedding"})

# Per public model name, the most logprobs a request may ask for (None: none at all): top_logprobs per
# generated token, prompt_logprobs per prompt token. A name of no class (a deployment id the master key
# names) allows none.
LOGPROB_LIMITS: dict[str, dict[str, int | None]] = {
    str(name): {field: (None if limits.get(field) is None else int(limits[field])) for field in ("top_logprobs", "prompt_logprobs")}
    for name, limits in (_SETTINGS.get("logprobs") or {}).items()}
_NO_LOGPROBS: dict[str, int | None] = {"top_logprobs": None, "prompt_logprobs": None}
# Output logprobs of /v1/responses (vLLM 0.32 responses/protocol.py, is_include_output_logprobs).
_OUTPUT_LOGPROBS = "message.output_text.logprobs"

# The replica a request went to: LiteLLM names it in every answer's headers (common_request_processing.py,
# get_custom_headers), which an application key gets back empty.
HIDDEN_HEADERS = ("x-litellm-model-api-base", "x-litellm-model-id", "x-litellm-model-name")

log = logging.getLogger("labctl.guard")


def settings_digest(directory: Path) -> str:
    """The sha256 of the settings a worker runs with: config.yaml and every labctl_*.py and labctl_*.yaml
    beside it (app-keys.json is read again per request). The same as library/labctl_gateway_workers.py's,
    which the role's check compares each worker's stamp with (issue 40)."""
    names = sorted(p.name for p in directory.iterdir()
                   if p.is_file() and (p.name == "config.yaml" or (p.name.startswith("labctl_") and p.suffix in (".py", ".yaml"))))
    lines = "".join(f"{hashlib.sha256((directory / name).read_bytes()).hexdigest()}  {name}\n" for name in names)
    return hashlib.sha256(lines.encode()).hexdigest()


def _stamp() -> None:
    """Each worker imports the callbacks in its start-up, before it serves: it writes the digest of the settings it
    loaded to <LABCTL_WORKER_STAMPS>/<pid> (/run/litellm/workers, emptied at every start), so the role can tell
    that every worker of the proxy runs the current settings after a reload or a restart (issue 40)."""
    stamps = os.environ.get("LABCTL_WORKER_STAMPS")
    if not stamps:
        return
    target = Path(stamps) / str(os.getpid())
    tmp = target.with_name(f".{target.name}.tmp")
    try:
        tmp.write_text(settings_digest(Path(__file__).resolve().parent) + "\n", encoding="utf-8")
        tmp.replace(target)
    except OSError as err:  # the worker serves; the role's check names the missing stamp
        log.warning("labctl guard: no settings stamp in %s: %s", stamps, err)


_stamp()


def _refuse(status: int, message: str, param: str | None) -> Exception:
    """What the proxy answers on every route with this status (LiteLLM's own exception type)."""
    from litellm.proxy._types import ProxyException

    kind = "invalid_request_error" if status == 400 else "auth_error"
    refused: Exception = ProxyException(message=f"labctl gateway: {message}", type=kind, param=param, code=status)
    return refused


def _is_admin(user_api_key_dict: Any) -> bool:
    from litellm.proxy._types import LitellmUserRoles

    role = getattr(user_api_key_dict, "user_role", None)
    return bool(role == LitellmUserRoles.PROXY_ADMIN or role == LitellmUserRoles.PROXY_ADMIN.value)


def _key_name(user_api_key_dict: Any) -> str:
    return str(getattr(user_api_key_dict, "key_alias", None) or getattr(user_api_key_dict, "key_name", None) or "this key")


async def _may_use(user_api_key_dict: Any, model: str) -> bool:
    """LiteLLM's own key-model check (models, access groups, aliases), on the model it will route."""
    from litellm.proxy import proxy_server
    from litellm.proxy._types import ProxyException
    from litellm.proxy.auth.auth_checks import can_key_call_model

    try:
        await can_key_call_model(model=model, llm_model_list=proxy_server.llm_model_list,
                                 valid_token=user_api_key_dict, llm_router=proxy_server.llm_router,
                                 prisma_client=proxy_server.prisma_client)
    except ProxyException:
        return False
    return True


def class_extra_body(model_id: Any) -> dict[str, Any] | None:
    """The extra_body of the deployment the router chose (model_info.id), or None."""
    from litellm.proxy import proxy_server

    router = proxy_server.llm_router
    if router is None or not isinstance(model_id, str):
        return None
    deployment = router.get_deployment(model_id=model_id)
    params = getattr(deployment, "litellm_params", None) if deployment is not None else None
    extra = getattr(params, "extra_body", None)
    return dict(extra) if isinstance(extra, dict) else None


def impose(kwargs: dict[str, Any], deployment_extra: dict[str, Any]) -> dict[str, Any]:
    """The request's kwargs with the deployment's extra_body over the client's, and no field left
    that sets or removes the priority."""
    out = dict(kwargs)
    client_extra = out.get("extra_body")
    merged = {k: v for k, v in client_extra.items() if k != "priority"} if isinstance(client_extra, dict) else {}
    merged.update(deployment_extra)
    out["extra_body"] = merged
    out.pop("priority", None)
    for name, dropped in (("additional_drop_params", ("priority", "extra_body")), ("allowed_openai_params", ("priority",))):
        value = out.get(name)
        if isinstance(value, list):
            kept = [item for item in value if item not in dropped]
            if kept:
                out[name] = kept
            else:
                out.pop(name)
        elif value is not None:
            out.pop(name)
    return out


class _Malformed(ValueError):
    """A logprobs field of a type vLLM would read differently than its JSON says (pydantic's lax mode: "20",
    20.0, true): refused rather than guessed."""

    def __init__(self, field: str, wanted: str, value: Any) -> None:
        super().__init__(f"{field} must be {wanted}, not {value!r}")
        self.field = field


def _count(data: dict[str, Any], field: str) -> int | None:
    """An integer field: None when absent or null, else a whole number from 0 (-1, vLLM's "the whole
    vocabulary", is refused)."""
    value = data.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _Malformed(field, "a whole number from 0", value)
    return value


def _switch(data: dict[str, Any], field: str) -> bool:
    value = data.get(field)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _Malformed(field, "true or false", value)
    return value


def _width(data: dict[str, Any], field: str) -> int | None:
    """The number of token ids a list (logprob_token_ids) or a list of rows (prompt_logprob_token_ids) asks for."""
    value = data.get(field)
    if value is None:
        return None
    if not isinstance(value, list):
        raise _Malformed(field, "a list", value)
    rows = [row for row in value if isinstance(row, list)]
    return max([len(value) if not rows else 0, *(len(row) for row in rows)])


def logprob_problem(data: dict[str, Any], call_type: Any, limits: dict[str, int | None]) -> tuple[str, str] | None:
    """(field, why) when the request asks for more logprobs than ``limits`` allow, else None.

    What vLLM 0.32.0 computes for each field (chat_completion/protocol.py, completion/protocol.py,
    responses/protocol.py, to_sampling_params):
      - sample logprobs, top-k per generated token: chat logprobs with top_logprobs, completions logprobs,
        responses top_logprobs with include message.output_text.logprobs, logprob_token_ids (k = their
        number); small (one row of the vocabulary per sequence of a step);
      - prompt logprobs: prompt_logprobs (0 too: vLLM's --max-logprobs never checks 0), chat echo (it sets
        prompt_logprobs to top_logprobs, 0 by default), completions echo with logprobs, and
        prompt_logprob_token_ids. Each computes the logits of the whole vocabulary (about 201k for gpt-oss)
        for every prompt token, chunk by chunk (v1/worker/gpu_model_runner.py, _get_prompt_logprobs_dict):
        gigabytes for one long prompt, which took the lab's replicas down (out of GPU memory).
    """
    completions = call_type == "atext_completion"
    top = _count(data, "top_logprobs")
    ids = _width(data, "logprob_token_ids")
    if completions:
        sampled = _count(data, "logprobs")
        asked = sampled is not None
    else:
        sampled = None
        asked = _switch(data, "logprobs")
    include = data.get("include")
    if isinstance(include, list) and _OUTPUT_LOGPROBS in include:
        asked = True
    k = max(value for value in (top, sampled, ids, 0) if value is not None)
    asked = asked or k > 0 or ids is not None
    cap = limits.get("top_logprobs")
    if asked and cap is None:
        return "logprobs", "this model's class allows no logprobs"
    if cap is not None and k > cap:
        field = "top_logprobs" if top == k else ("logprobs" if sampled == k else "logprob_token_ids")
        return field, f"at most {cap} logprobs per token on this model's class, not {k}"
    echo = _switch(data, "echo")
    prompt = _count(data, "prompt_logprobs")
    rows = _width(data, "prompt_logprob_token_ids")
    implied = (sampled if completions else (top or 0)) if echo else None
    prompt_k = max(value for value in (prompt, implied, rows, 0) if value is not None)
    if prompt is not None or rows is not None or implied is not None:
        prompt_cap = limits.get("prompt_logprobs")
        field = "prompt_logprobs" if prompt is not None else ("prompt_logprob_token_ids" if rows is not None else "echo")
        if prompt_cap is None:
            return field, ("this model's class allows no prompt logprobs (they compute the whole vocabulary's logits "
                           "for every prompt token)" + ("; chat echo asks for them" if field == "echo" else ""))
        if prompt_k > prompt_cap:
            return field, f"at most {prompt_cap} prompt logprobs per token on this model's class, not {prompt_k}"
    return None


def _route(user_api_key_dict: Any) -> str | None:
    route = getattr(user_api_key_dict, "request_route", None)
    if not isinstance(route, str):
        return None
    return route.rstrip("/") or "/"


class Guard(CustomLogger):
    async def async_pre_call_hook(self, user_api_key_dict: Any, cache: Any, data: dict[str, Any], call_type: Any) -> dict[str, Any]:
        if not _is_admin(user_api_key_dict):
            await self._key_checks(user_api_key_dict, data, call_type)
        model = data.get("model")
        limits = LOGPROB_LIMITS.get(model, _NO_LOGPROBS) if isinstance(model, str) else _NO_LOGPROBS
        try:
            problem = logprob_problem(data, call_type, limits)
        except _Malformed as bad:
            problem = (bad.field, str(bad))
        if problem is not None:
            raise _refuse(400, f"{problem[1]} (model {model!r}; remove or lower {problem[0]})", problem[0])
        return data

    async def _key_checks(self, user_api_key_dict: Any, data: dict[str, Any], call_type: Any) -> None:
        name = _key_name(user_api_key_dict)
        route = _route(user_api_key_dict)
        if route not in ROUTES or call_type not in MODEL_CALLS:
            raise _refuse(403, f"API key {name} reaches the model API only, not {route} ({call_type})", None)
        sent = [field for field in REFUSED_FIELDS if field in data]
        if sent:
            raise _refuse(400, f"API key {name}: the gateway decides the model group and the priority; "
                               f"remove {', '.join(sent)} from the request", sent[0])
        sent = [field for field in CREDENTIAL_FIELDS if field in data]
        if sent:
            raise _refuse(400, f"API key {name}: the gateway holds the replicas' address and key; "
                               f"remove {', '.join(sent)} from the request", sent[0])
        model = data.get("model")
        if model is not None and (not isinstance(model, str) or not await _may_use(user_api_key_dict, model)):
            raise _refuse(403, f"API key {name} may not use model {model!r} (the model is read from the body, "
                               "the URL's ?model= and the path alike)", "model")

    async def async_pre_call_deployment_hook(self, kwargs: dict[str, Any], call_type: Any) -> dict[str, Any] | None:
        info = kwargs.get("model_info") or {}
        # A request with its own api_key (the master key's: the pre-call hook refuses it of any other key) runs
        # on a deployment the router made for it, whose model_info names the configured one as original_model_id.
        extra = class_extra_body(info.get("id"))
        if extra is None:
            extra = class_extra_body(info.get("original_model_id"))
        if extra is not None:
            return impose(kwargs, extra)
        client_extra = kwargs.get("extra_body")
        if "priority" in kwargs or "additional_drop_params" in kwargs or (
                isinstance(client_extra, dict) and "priority" in client_extra):
            return impose(kwargs, {})  # a deployment without a class: still nothing the client sent decides
        return None

    async def async_post_call_response_headers_hook(self, data: dict[str, Any], user_api_key_dict: Any, response: Any,
                                                    request_headers: dict[str, str] | None = None) -> dict[str, str] | None:
        """Every answer (plain, streamed, failed): the replica's address, id and served name are left empty for
        an application key (LiteLLM applies these after its own headers)."""
        if _is_admin(user_api_key_dict):
            return None
        return dict.fromkeys(HIDDEN_HEADERS, "")


guard = Guard()
