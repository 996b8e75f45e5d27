"""Import one of the litellm role's callbacks (roles/litellm/files/etc/labctl/litellm/*.py) beside its
settings, rendered from the role's template (templates/etc/labctl/litellm/<name>.yaml.j2) as the
role writes them, with LiteLLM stood in for: the project's venv has no LiteLLM (the hooks' names
and parameters are checked against the bundle's wheel in the tests that use this)."""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path
from typing import Any

import jinja2
import pytest

ROLE = Path(__file__).resolve().parents[2] / "roles" / "litellm"
CALLBACKS = ROLE / "files" / "etc" / "labctl" / "litellm"
TEMPLATES = ROLE / "templates" / "etc" / "labctl" / "litellm"
WHEELS = Path(__file__).resolve().parents[2] / "build" / "bundles" / "test" / "wheels"


def litellm_source(*members: str) -> list[str]:
    """Files of the test bundle's LiteLLM 1.106.0 wheel (the version the role installs), as text;
    the test is skipped when the bundle is not built."""
    import zipfile

    wheel = next(WHEELS.glob("litellm-1.106.0-*.whl"), None)
    if wheel is None:
        pytest.skip("the test bundle is not built (make bundle-test)")
    with zipfile.ZipFile(wheel) as archive:
        return [archive.read(member).decode() for member in members]


class CustomLogger:
    """Stand-in for litellm.integrations.custom_logger.CustomLogger."""

    def __init__(self) -> None:
        pass


def load_callback(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                  modules: dict[str, dict[str, Any]] | None = None, **variables: Any) -> Any:
    """Import CALLBACKS/<name>.py with its settings rendered from TEMPLATES/<name>.yaml.j2 with
    ``variables`` (a callback without settings takes none); ``modules`` adds stand-in modules
    (name -> attributes) next to litellm's."""
    for module_name in ("litellm", "litellm.integrations"):
        monkeypatch.setitem(sys.modules, module_name, types.ModuleType(module_name))
    stand_ins = {"litellm.integrations.custom_logger": {"CustomLogger": CustomLogger}, **(modules or {})}
    for module_name, attributes in stand_ins.items():
        module = types.ModuleType(module_name)
        for attribute, value in attributes.items():
            setattr(module, attribute, value)
        monkeypatch.setitem(sys.modules, module_name, module)
    settings = TEMPLATES / f"{name}.yaml.j2"
    if settings.exists():
        env = jinja2.Environment(undefined=jinja2.StrictUndefined)
        env.filters["to_json"] = json.dumps
        env.filters["comment"] = lambda text: "# " + text
        rendered = env.from_string(settings.read_text()).render(ansible_managed="Ansible managed", **variables)
        (tmp_path / f"{name}.yaml").write_text(rendered)
    else:
        assert not variables, f"{name} takes no settings"
    path = tmp_path / f"{name}.py"
    path.write_text((CALLBACKS / f"{name}.py").read_text())
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded
