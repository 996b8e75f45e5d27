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
"""
from __future__ import annotations

import logging
from typing import Any

from litellm.integrations.custom_logger import CustomLogger

# Fields a key may not send: they choose another model group, or set or remove the priority
# vLLM receives (roles/litellm/README.md, "What a client can and cannot do").
ROUTING_FIELDS = ("fallbacks", "context_window_fallbacks", "content_policy_fallbacks", "router_settings_override",
                  "specific_deployment", "model_list", "user_config")
PRIORITY_FIELDS = ("priority", "extra_body", "additional_drop_params", "allowed_openai_params")
REFUSED_FIELDS = ROUTING_FIELDS + PRIORITY_FIELDS

log = logging.getLogger("labctl.guard")


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


class Guard(CustomLogger):
    async def async_pre_call_hook(self, user_api_key_dict: Any, cache: Any, data: dict[str, Any], call_type: Any) -> dict[str, Any]:
        if _is_admin(user_api_key_dict):
            return data
        name = _key_name(user_api_key_dict)
        sent = [field for field in REFUSED_FIELDS if field in data]
        if sent:
            raise _refuse(400, f"API key {name}: the gateway decides the model group and the priority; "
                               f"remove {', '.join(sent)} from the request", sent[0])
        model = data.get("model")
        if model is not None and (not isinstance(model, str) or not await _may_use(user_api_key_dict, model)):
            raise _refuse(403, f"API key {name} may not use model {model!r} (the model is read from the body, "
                               "the URL's ?model= and the path alike)", "model")
        return data

    async def async_pre_call_deployment_hook(self, kwargs: dict[str, Any], call_type: Any) -> dict[str, Any] | None:
        extra = class_extra_body((kwargs.get("model_info") or {}).get("id"))
        if extra is not None:
            return impose(kwargs, extra)
        client_extra = kwargs.get("extra_body")
        if "priority" in kwargs or "additional_drop_params" in kwargs or (
                isinstance(client_extra, dict) and "priority" in client_extra):
            return impose(kwargs, {})  # a deployment without a class: still nothing the client sent decides
        return None


guard = Guard()
