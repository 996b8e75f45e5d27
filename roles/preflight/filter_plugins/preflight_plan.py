"""Preflight's plan filters: ports and labctl plan's memory refusals."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

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


def labctl_plan_refusals(gpus: list[dict[str, Any]], model: str, given: dict[str, Any]) -> list[str]:
    """Why the vLLM plan of a host cannot start, with `labctl plan`'s numbers (labctl.plan): ``gpus``
    as labctl_gpu_facts reports them, ``model`` lab_model_name, ``given`` the vllm_*/lab_vllm_* variables
    the host sets (None: not set; the vllm role's defaults then apply). [] when the GPUs are not
    known yet (no driver) or the model has no memory profile."""
    import sys
    from pathlib import Path

    src = str(Path(__file__).resolve().parents[3] / "src")  # roles/preflight/filter_plugins -> the repository
    if src not in sys.path:
        sys.path.insert(0, src)
    try:
        from labctl import plan as memory
        from labctl import plan_cli
    except ImportError as exc:  # pragma: no cover - the project's venv has them
        raise AnsibleFilterError(f"labctl_plan_refusals needs the labctl package (the project's venv): {exc}") from exc
    if not gpus or model not in memory.MODEL_PROFILES:
        return []
    hostvars = {name: value for name, value in (given or {}).items() if value is not None}
    try:
        report = plan_cli.plan_for_host(
            "this host", hostvars,
            [memory.Gpu(str(g.get("name")), int(g["memory_total_mib"])) for g in gpus],
            plan_cli.Overrides(model, None, None, None, {}, memory.DEFAULT_REQUEST_TOKENS))
    except (plan_cli.InputError, KeyError, TypeError, ValueError) as exc:
        raise AnsibleFilterError(f"memory plan: {exc}") from exc
    return memory.refusals(report.plan)


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "labctl_replica_ports": labctl_replica_ports,
            "labctl_port_clashes": labctl_port_clashes,
            "labctl_plan_refusals": labctl_plan_refusals,
        }
