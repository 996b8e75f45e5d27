"""Preflight's plan filter: labctl plan's memory refusals (the ports are the topology's: labctl.topology)."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

from labctl import plan as memory
from labctl import plan_hosts


def labctl_plan_refusals(gpus: list[dict[str, Any]], model: str, given: dict[str, Any]) -> list[str]:
    """Why the vLLM plan of a host cannot start, with `labctl plan`'s numbers (labctl.plan): ``gpus``
    as labctl_gpu_facts reports them, ``model`` lab_model_name, ``given`` the vllm_*/lab_vllm_* variables
    the host sets (the topology's plan_inputs; None or absent: not set, the vllm role's defaults apply). [] when the GPUs are not
    known yet (no driver) or the model has no memory profile."""
    if not gpus or model not in memory.MODEL_PROFILES:
        return []
    hostvars = {name: value for name, value in (given or {}).items() if value is not None}
    try:
        report = plan_hosts.plan_for_host(
            "this host", hostvars,
            [memory.Gpu(str(g.get("name")), int(g["memory_total_mib"])) for g in gpus],
            plan_hosts.Overrides(model, None, None, None, {}, memory.DEFAULT_REQUEST_TOKENS))
    except (plan_hosts.InputError, KeyError, TypeError, ValueError) as exc:
        raise AnsibleFilterError(f"memory plan: {exc}") from exc
    return memory.refusals(report.plan)


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "labctl_plan_refusals": labctl_plan_refusals,
        }
