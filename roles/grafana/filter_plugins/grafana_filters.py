"""Grafana's filters."""

from __future__ import annotations

import copy
import json
from typing import Any

from ansible.errors import AnsibleFilterError


def labctl_dashboard_defaults(dashboard: dict[str, Any] | str, values: dict[str, Any]) -> dict[str, Any]:
    """A copy of a Grafana dashboard (a dict, or its JSON text) whose textbox/constant/custom
    variables named in `values` default to those values (e.g. the gateway dashboard's US$ per
    million tokens).

    A name the dashboard lacks is an error: a renamed variable must not be ignored silently.
    The role passes the JSON text: parsing it here is fast, while a deep copy of a parsed dashboard
    handed over by Ansible's templating costs about a second per dashboard.
    """
    result = json.loads(dashboard) if isinstance(dashboard, str) else copy.deepcopy(dashboard)
    variables = {v.get("name"): v for v in result.get("templating", {}).get("list", [])}
    missing = sorted(set(values) - set(variables))
    if missing:
        raise AnsibleFilterError(
            f"dashboard {result.get('uid')!r} has no variable(s) {', '.join(missing)}; it has {', '.join(sorted(map(str, variables)))}")
    for name, value in values.items():
        text = str(value)
        variable = variables[name]
        variable["query"] = text
        variable["current"] = {"selected": False, "text": text, "value": text}
        if variable.get("type") in ("custom", "textbox"):
            variable["options"] = [{"selected": True, "text": text, "value": text}]
    return result


def labctl_dashboards_defaults(dashboards: list[str], names: list[str], values: dict[str, Any]) -> list[dict[str, Any]]:
    """labctl_dashboard_defaults for several dashboards (their JSON texts) at once, each with the
    values given for its file name in `values` (none: as it is)."""
    if len(dashboards) != len(names):
        raise AnsibleFilterError(f"{len(dashboards)} dashboard texts for {len(names)} file names")
    return [labctl_dashboard_defaults(text, dict(values.get(name, {}))) for text, name in zip(dashboards, names, strict=True)]


def labctl_dashboard_uid(dashboard: str) -> str:
    """The uid of a dashboard's JSON text (the role checks Grafana serves each one by it). A file
    without one is an error: Grafana would give it a random uid, which nothing can refer to."""
    uid = json.loads(dashboard).get("uid")
    if not isinstance(uid, str) or not uid:
        raise AnsibleFilterError("a dashboard file has no uid: Grafana would generate a random one")
    return uid


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "labctl_dashboard_defaults": labctl_dashboard_defaults,
            "labctl_dashboard_uid": labctl_dashboard_uid,
            "labctl_dashboards_defaults": labctl_dashboards_defaults,
        }
