"""The project's Jinja filters (filter_plugins/labctl_filters.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location(
    "labctl_filters", Path(__file__).resolve().parents[2] / "filter_plugins" / "labctl_filters.py"
)
assert _SPEC and _SPEC.loader
filters = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(filters)


def test_port_clashes_name_every_user_of_a_port() -> None:
    ports = filters.labctl_replica_ports(8000, 2) + [
        {"port": 8001, "name": "lab_litellm_port"},
        {"port": 9100, "name": "lab_node_exporter_port"},
    ]
    assert filters.labctl_port_clashes(ports) == [
        "port clash: vLLM replica 1 (lab_vllm_base_port+1) and lab_litellm_port all use port 8001"
    ]
    assert filters.labctl_port_clashes(filters.labctl_replica_ports(8000, 2)) == []


def test_unknown_vars_suggest_the_intended_name() -> None:
    options = {"nvidia_driver_branch": {}, "nvidia_driver_version": {}}
    names = ["nvidia_driver_brnach", "nvidia_driver_version", "lab_bundle_dir"]
    assert filters.labctl_unknown_vars(names, "nvidia_driver_", options) == [
        "unknown variable nvidia_driver_brnach (did you mean nvidia_driver_branch?)"
    ]


def test_spec_optional_drops_required_only() -> None:
    spec = {"a": {"type": "str", "required": True, "choices": ["x"]}}
    assert filters.labctl_spec_optional(spec) == {"a": {"type": "str", "choices": ["x"]}}
