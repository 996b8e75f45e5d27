"""Small filters used by the roles, where plain Jinja would be unreadable."""

from __future__ import annotations

import difflib
from typing import Any


def labctl_replica_ports(base: int, count: int, variable: str = "lab_vllm_base_port") -> list[dict[str, Any]]:
    """The ports of `count` replicas numbered from `base`, named after the variable they come from."""
    return [{"port": int(base) + i, "name": f"vLLM replica {i} ({variable}+{i})"} for i in range(int(count))]


def labctl_port_clashes(ports: list[dict[str, Any]]) -> list[str]:
    """One message per port used by more than one service: 'port clash: a and b all use port 4000'."""
    users: dict[int, list[str]] = {}
    for entry in ports:
        users.setdefault(int(entry["port"]), []).append(str(entry["name"]))
    return [
        f"port clash: {' and '.join(names)} all use port {port}"
        for port, names in sorted(users.items())
        if len(names) > 1
    ]


def labctl_unknown_vars(names: list[str], prefix: str, options: dict[str, Any]) -> list[str]:
    """Variables that carry a role's prefix but are not among its options, with a likely fix."""
    known = sorted(options)
    problems = []
    for name in sorted(n for n in names if n.startswith(prefix) and n not in options):
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        problems.append(f"unknown variable {name}{hint}")
    return problems


def labctl_spec_optional(options: dict[str, Any]) -> dict[str, Any]:
    """An argument spec with `required` dropped: defaults fill those in when the role runs."""
    return {name: {k: v for k, v in spec.items() if k != "required"} for name, spec in options.items()}


class FilterModule:
    """Jinja2 filters for labctl."""

    def filters(self) -> dict[str, Any]:
        return {
            "labctl_replica_ports": labctl_replica_ports,
            "labctl_port_clashes": labctl_port_clashes,
            "labctl_unknown_vars": labctl_unknown_vars,
            "labctl_spec_optional": labctl_spec_optional,
        }
