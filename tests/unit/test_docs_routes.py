"""What docs/runbooks/access.md tells an application developer about routes is what the gateway lets a
key reach: every route of the litellm role's key routes (database mode's allowed_routes, the same list
as labctl_auth.py's _MODEL_ROUTES without a database) is named in the runbook's "Routes:" line, and
nothing it names as refused (403) is one of them (/v1/embeddings is a model route since lab_models)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def _routes_paragraph() -> str:
    text = (REPO / "docs" / "runbooks" / "access.md").read_text()
    start = text.index("- **Routes:**")
    end = text.index("\n- **", start + 1)
    return " ".join(text[start:end].split())


def test_the_access_runbook_names_the_routes_a_key_reaches() -> None:
    routes = yaml.safe_load((REPO / "roles" / "litellm" / "vars" / "main.yml").read_text())["__litellm_app_key_routes"]
    paragraph = _routes_paragraph()
    named = set(re.findall(r"`(/v1/[a-z_/]+)`", paragraph))
    assert {r for r in routes if r.startswith("/v1/")} <= named, paragraph
    # The sentence that lists what gets 403.
    cut = paragraph.index("get 403")
    refused = paragraph[paragraph.rindex(". ", 0, cut) + 2:cut].lower()
    for route in routes:
        kind = route.rstrip("/").rsplit("/", 1)[-1]  # completions, responses, embeddings, models, info
        assert kind not in refused, f"{route} is a model route, but access.md refuses: {refused!r}"
