"""The gateway's route filter (litellm_settings.callbacks, when litellm_admin_ui is false).

LiteLLM 1.106.0 answers many routes without a key: its API documentation (/, /openapi.json, /redoc,
/swagger), the admin UI's pages, assets and helpers (/ui, /_next, /get_image, /.well-known/...), a
public catalogue (/public/...: the model cost map, the model hub, LiteLLM's version), OAuth and MCP
discovery and client registration, sign-in flows (/sso/...), telemetry sinks. No setting of LiteLLM
removes most of them, and in database mode LiteLLM lets a few more through its own key check
(LiteLLMRoutes.public_routes: /routes, /test, /config/yaml). docs/security.md lists them all.

This callback puts an ASGI filter in front of the whole application, LiteLLM's own middleware
included: a request for a closed path gets 404 before LiteLLM reads it, with a key or without. The
closed paths come from labctl_routes.yaml beside this file (litellm_closed_routes): each entry closes
that path and every path below it, a segment "*" stands for any one segment, and "/" closes only "/".
The health routes and /metrics are not in it.

How: Starlette refuses app.add_middleware once the application has started, and LiteLLM imports the
callbacks while it starts (its lifespan), after Starlette built the middleware stack. LiteLLM never
rebuilds that stack, so the filter wraps it, for the life of the worker; each worker imports the
callbacks, so each worker has the filter.
"""
from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

import yaml
from litellm.integrations.custom_logger import CustomLogger

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

log = logging.getLogger("labctl.routes")
if not log.handlers:  # one line in the journal at each worker's start, whatever LiteLLM's log level
    _handler = logging.StreamHandler()
    _handler.setFormatter(logging.Formatter("labctl_routes: %(message)s"))
    log.addHandler(_handler)
    log.setLevel(logging.INFO)
    log.propagate = False

# Settings: labctl_routes.yaml beside this file, rendered by the litellm role from its variables
# (roles/litellm/templates/etc/labctl/litellm/labctl_routes.yaml.j2).
_SETTINGS: dict[str, Any] = yaml.safe_load(Path(__file__).with_suffix(".yaml").read_text(encoding="utf-8"))
CLOSED: list[str] = [str(entry) for entry in _SETTINGS.get("closed") or []]

_NOT_FOUND = b'{"detail":"Not Found"}'


def pattern(closed: list[str]) -> re.Pattern[str]:
    """The closed paths as one expression for re.fullmatch: "/a/b" matches /a/b and every /a/b/...,
    a segment "*" any one segment, "/" only "/"."""
    alternatives = []
    for entry in closed:
        if not entry.startswith("/"):
            raise ValueError(f"labctl_routes: {entry!r} is not a path (it must start with /)")
        segments = [segment for segment in entry.split("/") if segment]
        if not segments:
            alternatives.append("/")
            continue
        alternatives.append("".join("/" + ("[^/]+" if s == "*" else re.escape(s)) for s in segments) + "(?:/.*)?")
    return re.compile("|".join(alternatives) if alternatives else "(?!)")


def route_path(scope: Scope) -> str:
    """The path the application routes on (the root path taken off, as Starlette does), without a
    trailing slash ("/" stays "/")."""
    path = str(scope.get("path") or "/")
    root = str(scope.get("root_path") or "")
    if root and path.startswith(root) and path[len(root):len(root) + 1] in ("", "/"):
        path = path[len(root):]
    return path.rstrip("/") or "/"


class ClosedRoutes:
    """ASGI: 404 for a closed path (a websocket is refused), anything else to the application."""

    def __init__(self, app: ASGIApp, closed: re.Pattern[str]) -> None:
        self.app = app
        self.closed = closed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket") and self.closed.fullmatch(route_path(scope)):
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
                return
            await send({"type": "http.response.start", "status": 404,
                        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(_NOT_FOUND)).encode())]})
            await send({"type": "http.response.body", "body": _NOT_FOUND})
            return
        await self.app(scope, receive, send)


def install(app: Any, closed: re.Pattern[str]) -> None:
    """Put the filter in front of ``app`` (a Starlette application): around its built middleware stack,
    or, before its start, as its outermost middleware."""
    if app.middleware_stack is None:
        app.add_middleware(ClosedRoutes, closed=closed)
    elif not isinstance(app.middleware_stack, ClosedRoutes):
        app.middleware_stack = ClosedRoutes(app.middleware_stack, closed)


class Routes(CustomLogger):
    """No hooks: the filter is installed when LiteLLM imports this file (below); LiteLLM loads a
    callback as an instance."""


def _install() -> None:
    from litellm.proxy import proxy_server

    install(proxy_server.app, pattern(CLOSED))
    log.info("404 for %d route(s) and what is below them: %s", len(CLOSED), " ".join(CLOSED))


_install()
routes = Routes()
