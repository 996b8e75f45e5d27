"""The host firewall's rules for one host, from the lab's topology (lab_topology.flows and
lab_topology.hosts, src/labctl/topology.py): who may reach which port. The template
(labctl.nft.j2) writes them as nftables rules; nothing here touches the host."""

from __future__ import annotations

import ipaddress
from typing import Any

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _networks(values: Any, variable: str, problems: list[str]) -> list[Network]:
    out: list[Network] = []
    if values is None:
        return out
    if isinstance(values, str) or not isinstance(values, (list, tuple)):
        problems.append(f"{variable} must be a list of networks in CIDR notation (10.20.0.0/16), got {values!r}")
        return out
    for value in values:
        try:
            out.append(ipaddress.ip_network(str(value).strip(), strict=True))
        except ValueError as exc:
            problems.append(f"{variable}: {value!r} is not a network in CIDR notation (10.20.0.0/16): {exc}")
    return out


def _split(networks: list[Network]) -> dict[str, list[str]]:
    unique = sorted(set(networks), key=lambda n: (n.version, n.network_address, n.prefixlen))
    collapsed_v4 = ipaddress.collapse_addresses([n for n in unique if n.version == 4])
    collapsed_v6 = ipaddress.collapse_addresses([n for n in unique if n.version == 6])

    def text(n: Network) -> str:
        return str(n.network_address) if n.prefixlen == n.max_prefixlen else str(n)

    return {"v4": [text(n) for n in collapsed_v4], "v6": [text(n) for n in collapsed_v6]}


def labctl_firewall_rules(flows: Any, hosts: Any, host: str, client_networks: Any, admin_networks: Any,
                          control_node: str = "", ssh_ports: Any = (22,)) -> dict[str, Any]:
    """The accept rules of ``host``'s inbound chain.

    ``flows``: lab_topology.flows (each: to, port, service, from = host names or "clients");
    ``hosts``: lab_topology.hosts (each with its address); ``control_node``: the address this
    run's SSH connection comes from ('' when not over SSH). Returns ``ssh`` (ports and sources;
    ``any`` when no source is known, so that nobody is locked out), ``rules`` (one per port:
    service, port, v4 and v6 sources) and ``problems`` (each naming its variable or host).
    Traffic of the host to itself passes the loopback interface and needs no rule.
    """
    problems: list[str] = []
    clients = _networks(client_networks, "lab_firewall_client_networks", problems)
    admins = _networks(admin_networks, "lab_firewall_admin_networks", problems)
    addresses = {str(name): str((entry or {}).get("address") or "") for name, entry in dict(hosts or {}).items()}
    unusable: set[str] = set()

    def peer(name: str) -> Network | None:
        """Another host's address, as a rule names it (only the hosts a rule names need one)."""
        try:
            return ipaddress.ip_network(addresses[name])
        except ValueError:
            if name not in unusable:
                unusable.add(name)
                problems.append(f"{name}: its address {addresses[name]!r} (lab_topology: no default IPv4 route) is not an IP "
                                f"address, so no rule of {host} can name it: set ansible_host to the IP address it reaches "
                                f"{host} from")
            return None
    ssh_sources = list(admins)
    if control_node:
        try:
            ssh_sources.append(ipaddress.ip_network(control_node))
        except ValueError:
            problems.append(f"the control node's address {control_node!r} (SSH_CLIENT) is not an IP address")
    ports = sorted({int(p) for p in (ssh_ports or [22])})
    ssh = {"ports": ports, "any": not ssh_sources, **_split(ssh_sources)}

    by_port: dict[int, dict[str, Any]] = {}
    for flow in flows or []:
        if str(flow.get("to")) != str(host):
            continue
        port = int(flow["port"])
        rule = by_port.setdefault(port, {"port": port, "services": [], "sources": []})
        if flow["service"] not in rule["services"]:
            rule["services"].append(str(flow["service"]))
        for source in flow.get("from") or []:
            if source == "clients":
                rule["sources"].extend(clients)
            elif source == host:
                continue
            elif source in addresses:
                address = peer(source)
                if address is not None:
                    rule["sources"].append(address)
            else:
                problems.append(f"{host}: flow to port {port} ({flow['service']}) names {source!r}, which is no host of the lab")
    rules = []
    for port in sorted(by_port):
        rule = by_port[port]
        if port in ports:
            problems.append(f"{host}: port {port} ({', '.join(rule['services'])}) is also an SSH port (firewall_ssh_ports)")
        rules.append({"port": port, "service": ", ".join(rule["services"]), **_split(rule["sources"])})
    return {"ssh": ssh, "rules": rules, "problems": problems}


def labctl_firewall_replica_guard(replicas: Any, host: str, client_users: Any, passwd: Any) -> dict[str, Any]:
    """Which local users of ``host`` may open a connection to a vLLM replica, this host's or another's.

    vLLM's --api-key guards /v1, /v2, /inference and /cohere only: /invocations (generation),
    /tokenize, /detokenize, /pooling, /score, /classify, /metrics... answer whoever connects. The
    inbound chain keeps other hosts away; this is the outbound side, for the users of the host.
    ``replicas``: lab_topology.replicas (host, address, port); ``client_users``: the user names
    allowed (firewall_replica_clients); ``passwd``: the host's user database as the getent
    module reads it (name -> [password, uid, ...]). Returns ``uids`` (with ``users``: name and
    uid, for the comment), ``local_ports`` (this host's replicas, whatever local address a
    client names), ``remote`` (per other host: nft family, address, ports) and ``problems``.
    """
    problems: list[str] = []
    if isinstance(client_users, str) or not isinstance(client_users, (list, tuple)):
        problems.append(f"firewall_replica_clients must be a list of user names, got {client_users!r}")
        client_users = []
    accounts = dict(passwd or {})
    users: list[dict[str, Any]] = []
    for name in client_users:
        entry = accounts.get(str(name))
        if not entry or len(entry) < 2 or not str(entry[1]).isdigit():
            problems.append(f"firewall_replica_clients: the user {name!r} does not exist on {host} (its role creates it: "
                            "playbooks/host.yml runs the accounts of the replicas' clients before the firewall)")
            continue
        users.append({"name": str(name), "uid": int(entry[1])})
    local: set[int] = set()
    remote: dict[str, dict[str, Any]] = {}
    for replica in replicas or []:
        port = int(replica["port"])
        if str(replica.get("host")) == str(host):
            local.add(port)
            continue
        address = str(replica.get("address") or "")
        try:
            ip = ipaddress.ip_address(address.strip("[]"))
        except ValueError:
            problems.append(f"{replica.get('host')}: replica {replica.get('index')} listens on {address!r}, not an IP address: "
                            f"no rule of {host} can name it (set vllm_listen_address to an address)")
            continue
        entry = remote.setdefault(str(ip), {"host": str(replica.get("host")), "family": "ip" if ip.version == 4 else "ip6",
                                             "address": str(ip), "ports": set()})
        entry["ports"].add(port)
    return {
        "users": users,
        "uids": sorted({u["uid"] for u in users}),
        "local_ports": sorted(local),
        "remote": [{**entry, "ports": sorted(entry["ports"])} for _, entry in sorted(remote.items())],
        "problems": problems,
    }


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "labctl_firewall_rules": labctl_firewall_rules,
            "labctl_firewall_replica_guard": labctl_firewall_replica_guard,
        }
