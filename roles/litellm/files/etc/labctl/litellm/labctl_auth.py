"""Custom auth for the LiteLLM proxy without a database (general_settings.custom_auth).

Without a database LiteLLM alone accepts only the master key (and answers 400 "No connected db"
for any other). This hook accepts:
  - the master key, for administration (as LiteLLM's own check does);
  - Prometheus's bearer token (LABCTL_METRICS_KEY, litellm.env), on /metrics/ only;
  - the application keys of KEYS_FILE (labctl_auth.yaml): the sha256 of each key that is not revoked
    (`labctl keys add`; the key itself never reaches this host), its class, limits and expiry.
An application key reaches the model API only, and only its class's public model names (of the
models its record lists, when it lists some: several models, lab_models): the
class is its priority (labctl_admission.py). Its rpm/tpm limits and its max_parallel (by default
DEFAULT_MAX_PARALLEL: one key never holds every admission slot) go to LiteLLM's rate limiter
(429 with Retry-After, counted in Redis across workers), its name to /metrics (api_key_alias;
no hash of a key is published). Which model LiteLLM routes and the priority vLLM receives are
checked again after LiteLLM read the query and the path (labctl_guard.py).
Anything else is refused with 401 before any upstream is contacted; a known key on a model of
another class, or on a route that is not the model API, with 403.

The file is read again whenever it changes (one stat per request): an added or revoked key takes
effect with the next request, without a restart, and requests already running are not touched.
Health endpoints do not go through auth.
"""
import hashlib
import json
import logging
import os
import secrets
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml
from fastapi import HTTPException, Request
from litellm.constants import LITELLM_PROXY_MASTER_KEY_ALIAS
from litellm.proxy._types import LitellmUserRoles, UserAPIKeyAuth

# Settings: labctl_auth.yaml beside this file, rendered by the litellm role from its variables
# (roles/litellm/templates/etc/labctl/litellm/labctl_auth.yaml.j2).
_SETTINGS: dict[str, Any] = yaml.safe_load(Path(__file__).with_suffix(".yaml").read_text(encoding="utf-8"))
KEYS_FILE = str(_SETTINGS["keys_file"])
METRICS_KEY = os.environ.get("LABCTL_METRICS_KEY", "")
# Requests one application key may have in flight when its record sets none (litellm_app_key_max_parallel_share).
DEFAULT_MAX_PARALLEL = int(_SETTINGS["default_max_parallel"])
# The model API: what an application key may call (with or without /v1); not /model/info, which shows
# each replica's api_base.
_MODEL_ROUTES = ("/chat/completions", "/completions", "/responses", "/embeddings", "/models")
_BODY_ROUTES = ("/chat/completions", "/completions", "/responses", "/embeddings")
_log = logging.getLogger("labctl_auth")


class _Keys:
    """The gateway's copy of the application keys, read again when the file changes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._stamp: tuple[int, int, int] | None = None
        self._by_hash: dict[str, dict[str, Any]] = {}
        self._classes: dict[str, list[str]] = {}
        self._lock = threading.Lock()

    def current(self) -> tuple[dict[str, dict[str, Any]], dict[str, list[str]]]:
        try:
            st = os.stat(self.path)
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            stamp = None
        if stamp != self._stamp:
            with self._lock:
                if stamp != self._stamp:
                    self._load(stamp)
        return self._by_hash, self._classes

    def _load(self, stamp: tuple[int, int, int] | None) -> None:
        if stamp is None:
            self._by_hash, self._classes, self._stamp = {}, {}, None
            return
        try:
            with open(self.path, encoding="utf-8") as handle:
                data = json.load(handle)
            by_hash = {str(h): dict(v) for h, v in data["keys"].items()}
            classes = {str(c): list(models) for c, models in data["classes"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            # The role writes the file whole (a rename), so this is a hand edit gone wrong: keep the
            # last good set rather than let every application in or out.
            _log.error("labctl_auth: %s unreadable, keeping the previous keys: %s", self.path, exc)
            self._stamp = stamp
            return
        self._by_hash, self._classes, self._stamp = by_hash, classes, stamp
        _log.info("labctl_auth: %d application key(s) from %s", len(by_hash), self.path)


KEYS = _Keys(KEYS_FILE)


def _route(request: Request) -> str:
    path = request.url.path.rstrip("/") or "/"
    return path[3:] if path.startswith("/v1/") else path


async def _requested_model(request: Request) -> str | None:
    try:
        from litellm.proxy.common_utils.http_parsing_utils import read_request_body
    except ImportError:  # pragma: no cover - an older LiteLLM
        from litellm.proxy.common_utils.http_parsing_utils import _read_request_body as read_request_body
    body = await read_request_body(request=request)
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) else None


def _same(presented: bytes, secret: str) -> bool:
    """Constant time, on bytes: a key with characters outside ASCII is just a wrong key (compare_digest
    refuses such str with a TypeError)."""
    return bool(secret) and secrets.compare_digest(presented, secret.encode("utf-8"))


async def user_api_key_auth(request: Request, api_key: str) -> UserAPIKeyAuth:
    from litellm.proxy import proxy_server  # the master key, once the config is loaded

    master_key = proxy_server.master_key
    if not isinstance(api_key, str) or not api_key:
        raise HTTPException(status_code=401, detail="Missing API key")
    # A header's text is latin-1 (HTTP); surrogates from a bad client encode with "replace".
    presented = api_key.encode("utf-8", "replace")
    if isinstance(master_key, str) and _same(presented, master_key):
        return UserAPIKeyAuth(
            api_key=LITELLM_PROXY_MASTER_KEY_ALIAS,
            user_role=LitellmUserRoles.PROXY_ADMIN,
            user_id="litellm_proxy_admin",
        )
    route = _route(request)
    if _same(presented, METRICS_KEY):
        if route != "/metrics":
            raise HTTPException(status_code=403, detail="the metrics key reaches /metrics/ only")
        return UserAPIKeyAuth(api_key="labctl-metrics", user_role=LitellmUserRoles.INTERNAL_USER_VIEW_ONLY,
                              user_id="labctl-metrics")
    digest = hashlib.sha256(presented).hexdigest()
    by_hash, classes = KEYS.current()
    entry = by_hash.get(digest)
    if entry is None:
        raise HTTPException(status_code=401, detail="Invalid or revoked API key")
    name = entry["name"]
    expires = entry.get("expires")
    if expires and datetime.fromisoformat(expires) <= datetime.now(timezone.utc):
        raise HTTPException(status_code=401, detail=f"API key {name} expired at {expires}")
    if route not in _MODEL_ROUTES:
        raise HTTPException(status_code=403, detail=f"API key {name} reaches the model API only, not {route}")
    # Several models: a key that lists models reaches its class's names of those models only.
    models = entry.get("models") or classes.get(entry["class"], [])
    if route in _BODY_ROUTES:
        model = await _requested_model(request)
        if model not in models:
            raise HTTPException(
                status_code=403,
                detail=f"API key {name} is of class {entry['class']}: model {model!r} is not among {models}",
            )
    # api_key is what LiteLLM counts limits by: the key's name, not the key (config.yaml also keeps
    # the hashed_api_key label off /metrics: a refused request carries the presented key's hash).
    return UserAPIKeyAuth(
        api_key=f"labctl-app:{name}",
        key_alias=name,
        key_name=name,
        user_id=f"app:{name}",
        user_role=LitellmUserRoles.INTERNAL_USER,
        models=models,
        rpm_limit=entry.get("rpm"),
        tpm_limit=entry.get("tpm"),
        max_parallel_requests=entry.get("max_parallel") or DEFAULT_MAX_PARALLEL,
        metadata={"labctl_key_class": entry["class"]},
    )
