"""Preflight's check of the firewall's networks (lab_firewall_client_networks,
lab_firewall_admin_networks): each must be a network in CIDR notation, refused before anything
changes, naming the variable and the value."""

from __future__ import annotations

import ipaddress
from typing import Any


def labctl_preflight_network_problems(values: Any, variable: str) -> list[str]:
    if values is None:
        return []
    if isinstance(values, str) or not isinstance(values, (list, tuple)):
        return [f"{variable} must be a list of networks such as [10.20.0.0/16], got {values!r}"]
    problems = []
    for value in values:
        try:
            ipaddress.ip_network(str(value).strip(), strict=True)
        except ValueError as exc:
            problems.append(f"{variable}: {value!r} is not a network in CIDR notation such as 10.20.0.0/16 ({exc})")
    return problems


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"labctl_preflight_network_problems": labctl_preflight_network_problems}
