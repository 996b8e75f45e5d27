"""Every HTTP route of the installed LiteLLM proxy that could answer without a key, as requests to
make: run with the gateway venv's Python (build/gateway-venv), it prints JSON.

It imports the proxy's application with every lazily registered feature (LiteLLM registers most
optional routers on their first request) and lists, for each HTTP route that does not depend on
LiteLLM's key check (user_api_key_auth), one request: the route's method (GET when it takes one), its
path with "x" for each parameter, "{}" as the body of a POST, PUT or PATCH. A mounted directory of
static files gets one of its files ("/" where it serves index.html). Beside them, "public": the routes
LiteLLM's key check itself lets through without a key (LiteLLMRoutes.public_routes; database mode)."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

KEY_CHECK = "user_api_key_auth"


def _dependencies(route: Any) -> set[str]:
    found: set[str] = set()

    def walk(dependant: Any) -> None:
        for sub in dependant.dependencies:
            found.add(getattr(sub.call, "__name__", type(sub.call).__name__))
            walk(sub)

    if getattr(route, "dependant", None) is not None:
        walk(route.dependant)
    return found


def _probe(route: Any) -> dict[str, str] | None:
    kind = type(route).__name__
    if "WebSocket" in kind or not getattr(route, "path", None):
        return None
    if KEY_CHECK in _dependencies(route):
        return None
    path = re.sub(r"\{[^}]*\}", "x", route.path)
    if kind == "Mount":
        directory = getattr(route.app, "directory", None)
        if directory is not None and not getattr(route.app, "html", False):
            first = min(p for p in Path(directory).rglob("*") if p.is_file())
            path = f"{path}/{first.relative_to(directory)}"
        else:
            path += "/"
        return {"method": "GET", "path": path}
    methods = sorted(getattr(route, "methods", None) or ["GET"])
    return {"method": "GET" if "GET" in methods else methods[0], "path": path}


def main() -> None:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    from fastapi.routing import _iter_included_route_candidates
    from litellm.proxy._lazy_features import register_all_features
    from litellm.proxy._types import LiteLLMRoutes
    from litellm.proxy.proxy_server import app

    register_all_features(app)
    probes = [p for p in (_probe(r) for r in _iter_included_route_candidates(app.routes)) if p is not None]
    unique = list({(p["method"], p["path"]): p for p in probes}.values())
    json.dump({"probes": unique, "public": sorted(LiteLLMRoutes.public_routes.value)}, sys.stdout)


if __name__ == "__main__":
    main()
