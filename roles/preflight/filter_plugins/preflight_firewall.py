"""Preflight's check of the firewall's networks (lab_firewall_client_networks,
lab_firewall_admin_networks): each must be a network in CIDR notation, refused before anything
changes, naming the variable and the value; and the firewall must not stay wide open by default
(all of RFC 1918 as clients, SSH from every address) unless the inventory says so
(lab_firewall_accept_open)."""

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


# The project's default client networks (group_vars/all/project.yml): every private IPv4 address.
PRIVATE = tuple(ipaddress.IPv4Network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))
ACCEPTABLE = ("client_networks", "ssh")


def labctl_preflight_open_problems(client_networks: Any, admin_networks: Any, control_node: str, accept: Any) -> list[str]:
    """What would leave the host firewall open by default: client networks that hold a whole private
    range (the project's default is all three, RFC 1918) or every address, and SSH open to every
    address (no lab_firewall_admin_networks and no control-node address: the run is not over SSH,
    roles/firewall then keeps SSH open rather than lock anybody out). ``accept``
    (lab_firewall_accept_open) lists what a scenario knowingly keeps open: client_networks, ssh."""
    problems: list[str] = []
    if isinstance(accept, str) or not isinstance(accept, (list, tuple)) or any(a not in ACCEPTABLE for a in accept):
        return [f"lab_firewall_accept_open must be a list of {', '.join(ACCEPTABLE)}, got {accept!r}"]
    wide: list[str] = []
    for value in client_networks if isinstance(client_networks, (list, tuple)) else []:
        try:
            network = ipaddress.ip_network(str(value).strip(), strict=True)
        except ValueError:
            continue  # labctl_preflight_network_problems names it
        if network.prefixlen == 0 or (isinstance(network, ipaddress.IPv4Network) and any(p.subnet_of(network) for p in PRIVATE)):
            wide.append(str(network))
    if wide and "client_networks" not in accept:
        problems.append(
            f"lab_firewall_client_networks {wide} opens the gateway and Grafana to a whole private range"
            f"{' (the project default: all of RFC 1918)' if sorted(wide) == sorted(str(p) for p in PRIVATE) else ''}: set it to the "
            "subnets the lab's users and applications sit in (docs/runbooks/access.md), or add client_networks to "
            "lab_firewall_accept_open where that is meant (a test lab)")
    admins = admin_networks if isinstance(admin_networks, (list, tuple)) else []
    if not admins and not str(control_node or "").strip() and "ssh" not in accept:
        problems.append(
            "SSH would stay open to every address: this run does not come over SSH (no SSH_CLIENT, no "
            "firewall_control_node_address) and lab_firewall_admin_networks is empty. Set lab_firewall_admin_networks to the "
            "networks operators log in from, or add ssh to lab_firewall_accept_open where that is meant (a test lab)")
    return problems


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"labctl_preflight_network_problems": labctl_preflight_network_problems,
                "labctl_preflight_open_problems": labctl_preflight_open_problems}
