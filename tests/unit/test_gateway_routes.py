"""No route of the gateway answers without a key but its health checks (Issue 40, item 9).

Through the real LiteLLM 1.106.0 proxy with the litellm role's config and callbacks
(gateway_proxy.py): every HTTP route of the installed LiteLLM that does not depend on its key check,
listed from the application itself with every lazily registered feature (litellm_route_table.py, run
with the gateway venv's Python, so a LiteLLM upgrade that adds such a route fails here), is requested
without a key and must answer 401, 403 or 404; the routes LiteLLM's key check lets through without a
key in database mode (LiteLLMRoutes.public_routes) must get the route filter's own 404 (labctl_routes.py;
here the auth hook would answer 401 first); the health checks, /metrics/ with Prometheus's token and
the model API with a key still answer. Without the proxy: the filter's matching, and docs/security.md
against the role's list."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from .callback_loader import load_callback
from .gateway_proxy import MASTER, METRICS, Gateway, gateway_venv, running_gateway

REPO = Path(__file__).resolve().parents[2]
CLOSED: list[str] = yaml.safe_load((REPO / "roles" / "litellm" / "defaults" / "main.yml").read_text()).get("litellm_closed_routes", [])
# What answers without a key, on purpose: the health checks (the role's health gate, labctl, a load balancer).
OPEN = ("/health/liveliness", "/health/liveness", "/health/readiness")
# The routes the issue names.
NAMED = ("/openapi.json", "/ui/", "/get_image", "/.well-known/litellm-ui-config", "/public/litellm_model_cost_map")
REFUSED = (401, 403, 404)


@pytest.fixture(scope="module")
def surface(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The installed LiteLLM's routes without its key check, as requests (litellm_route_table.py)."""
    python = gateway_venv() / "bin" / "python"
    home = tmp_path_factory.mktemp("route-table")
    done = subprocess.run([str(python), str(Path(__file__).with_name("litellm_route_table.py"))], capture_output=True,
                          text=True, timeout=600, check=False, cwd=home,
                          env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LITELLM_LOG": "ERROR",
                               "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    assert done.returncode == 0, done.stderr[-3000:]
    table: dict[str, Any] = json.loads(done.stdout)
    paths = {p["path"] for p in table["probes"]}
    # The listing itself works: it finds the routes the issue names, and the lazily registered ones.
    assert len(paths) > 80 and set(NAMED) <= paths, sorted(paths)
    assert "/.well-known/oauth-protected-resource" in paths and "/lens/worker/claim" in paths
    return table


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with running_gateway(tmp_path_factory.mktemp("gateway"), {"vllm_max_num_seqs": 4, "litellm_num_workers": 1}) as gw:
        yield gw


def _ask(gw: Gateway, method: str, path: str, key: str | None = None) -> int:
    status, _, _ = gw.request(path, key, {} if method in ("POST", "PUT", "PATCH") else None, method=method, timeout=30)
    return status


def test_no_route_answers_without_a_key_but_the_health_checks(gateway: Gateway, surface: dict[str, Any]) -> None:
    answered: dict[str, int] = {}
    for probe in surface["probes"]:
        method, path = probe["method"], probe["path"]
        status = _ask(gateway, method, path)
        if path in OPEN:
            assert status == 200, (method, path, status)
        elif status not in REFUSED:
            answered[f"{method} {path}"] = status
    assert answered == {}, json.dumps(answered, indent=1)


def test_what_database_mode_lets_through_gets_the_filters_404(gateway: Gateway, surface: dict[str, Any]) -> None:
    """LiteLLM's own key check passes these without a key when it runs (database mode); here the auth
    hook runs first and answers 401, so a 404 is the route filter's, which runs in either mode."""
    public = [path for path in surface["public"] if path not in OPEN]
    assert {"/", "/routes", "/test", "/config/yaml", "/public/model_hub"} <= set(public), public
    statuses = {path: _ask(gateway, "GET", path) for path in public}
    assert statuses == dict.fromkeys(public, 404), statuses


def test_the_routes_the_issue_names_are_closed_with_a_key_too(gateway: Gateway) -> None:
    for path in NAMED:
        for key in (None, MASTER):
            assert _ask(gateway, "GET", path, key) == 404, (path, key is not None)


def test_the_routes_the_lab_uses_still_answer(gateway: Gateway) -> None:
    for path in OPEN:
        assert _ask(gateway, "GET", path) == 200, path
    assert _ask(gateway, "GET", "/metrics/", METRICS) == 200
    assert _ask(gateway, "GET", "/metrics/") == 401
    assert _ask(gateway, "GET", "/v1/models", MASTER) == 200
    model = gateway.deployments()[0]["model_name"]
    status, _, text = gateway.request("/v1/chat/completions", MASTER, {
        "model": model, "messages": [{"role": "user", "content": "say ok"}], "max_tokens": 4})
    assert status == 200, text[:300]


# --- the filter, without the proxy -------------------------------------------------------------------

class _App:
    """A Starlette application as the filter sees it: a built middleware stack (an ASGI app) or none yet."""

    def __init__(self, started: bool = True) -> None:
        self.middleware_stack: Any = self.inner if started else None
        self.added: list[tuple[Any, dict[str, Any]]] = []
        self.reached: list[str] = []

    async def inner(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.reached.append(scope.get("path", scope["type"]))

    def add_middleware(self, cls: Any, **options: Any) -> None:
        self.added.append((cls, options))


def _filter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, app: _App, closed: list[str] = CLOSED) -> Any:
    proxy_server = types.SimpleNamespace(app=app)
    return load_callback("labctl_routes", tmp_path, monkeypatch, {"litellm.proxy": {"proxy_server": proxy_server}},
                         litellm_closed_routes=closed)


def _call(app: Any, scope: dict[str, Any]) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent


@pytest.mark.parametrize(("path", "closed"), [
    ("/", True), ("/openapi.json", True), ("/openapi.json/", True), ("/docs/oauth2-redirect", True), ("/ui", True),
    ("/ui/", True), ("/ui/model_hub/index.html", True), ("/_next/static/x.js", True), ("/get_image", True),
    ("/.well-known/litellm-ui-config", True), ("/litellm/.well-known/litellm-ui-config", True),
    ("/public/litellm_model_cost_map", True), ("/public/v1/model_hub", True), ("/register", True),
    ("/github/register", True), ("/sso/cli/start", True), ("/routes", True), ("/config/yaml", True), ("//", True),
    ("/health/liveliness", False), ("/health/readiness", False), ("/health/liveness", False), ("/metrics", False),
    ("/metrics/", False), ("/v1/models", False), ("/v1/chat/completions", False), ("/v1/responses/resp_1", False),
    ("/v1/embeddings", False), ("/key/info", False), ("/key/generate", False), ("/login", False), ("/uix", False),
    ("/publicity", False), ("/v1/mcp/server/register", False), ("/config/update", False), ("/health", False),
])
def test_the_filter_closes_each_path_and_what_is_below_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          path: str, closed: bool) -> None:
    app = _App()
    module = _filter(tmp_path, monkeypatch, app)
    assert isinstance(app.middleware_stack, module.ClosedRoutes)
    sent = _call(app.middleware_stack, {"type": "http", "path": path, "root_path": "", "method": "GET"})
    if closed:
        assert app.reached == [] and sent[0]["status"] == 404 and sent[1]["body"] == b'{"detail":"Not Found"}'
    else:
        assert app.reached == [path] and sent == []


def test_the_filter_reads_the_path_the_application_routes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Behind a root path (LiteLLM's SERVER_ROOT_PATH) the filter takes it off, as Starlette does; a
    websocket to a closed path is refused; the lifespan passes; a second import wraps nothing twice."""
    app = _App()
    module = _filter(tmp_path, monkeypatch, app)
    stack = app.middleware_stack
    assert _call(stack, {"type": "http", "path": "/gw/get_image", "root_path": "/gw"})[0]["status"] == 404
    assert _call(stack, {"type": "http", "path": "/gw/v1/models", "root_path": "/gw"}) == []
    assert _call(stack, {"type": "websocket", "path": "/ui/socket", "root_path": ""}) == [{"type": "websocket.close", "code": 1008}]
    assert _call(stack, {"type": "lifespan"}) == [] and app.reached == ["/gw/v1/models", "lifespan"]
    module.install(app, module.pattern(CLOSED))
    assert app.middleware_stack is stack


def test_before_the_start_the_filter_is_an_ordinary_middleware(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    app = _App(started=False)
    module = _filter(tmp_path, monkeypatch, app)
    assert app.middleware_stack is None and [cls for cls, _ in app.added] == [module.ClosedRoutes]


def test_a_closed_route_must_be_a_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="'ui' is not a path"):
        _filter(tmp_path, monkeypatch, _App(), ["/", "ui"])
    empty = _App()
    _filter(tmp_path, monkeypatch, empty, [])
    assert _call(empty.middleware_stack, {"type": "http", "path": "/", "root_path": ""}) == [] and empty.reached == ["/"]


# --- written down ------------------------------------------------------------------------------------

def _section(text: str, title: str) -> str:
    start = text.index(f"\n## {title}")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def test_docs_security_lists_every_closed_route_and_every_open_one() -> None:
    """docs/security.md names each entry of litellm_closed_routes and each route that answers without a key."""
    text = (REPO / "docs" / "security.md").read_text()
    section = _section(text, "The gateway's routes without a key")
    named = set(re.findall(r"`(/[^`\s]*)`", section))
    assert set(CLOSED) <= named, sorted(set(CLOSED) - named)
    assert set(OPEN) <= named
    assert all(path.rstrip("/") in section for path in NAMED)
    assert "lab_tls_ca_passphrase" in text and "unencrypted" in text
    for port in ("9090", "9100"):
        assert port in text
