"""Preflight's plan filter: labctl plan's memory refusals (the ports are the topology's: labctl.topology)."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

from labctl import plan as memory
from labctl import plan_hosts


def labctl_plan_refusals(gpus: list[dict[str, Any]], model: str, given: dict[str, Any],
                         replicas: list[dict[str, Any]] | None = None) -> list[str]:
    """Why the vLLM plan of a host cannot start, with `labctl plan`'s numbers (labctl.plan): ``gpus``
    as labctl_gpu_facts reports them, ``model`` lab_model_name, ``given`` the vllm_*/lab_vllm_* variables
    the host sets (the topology's plan_inputs; None or absent: not set, the vllm role's defaults apply). [] when the GPUs are not
    known yet (no driver) or the model has no memory profile.

    Several models (lab_models): ``replicas``, the host's replicas of lab_topology (each with its model,
    GPUs, share and flags); each model with a memory profile is planned on its own GPUs with its own
    share, tensor parallel size and flags, and its refusals are named after it."""
    if gpus and replicas and any("model" in r for r in replicas):
        return _models_refusals(gpus, given, replicas)
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


def _models_refusals(gpus: list[dict[str, Any]], given: dict[str, Any], replicas: list[dict[str, Any]]) -> list[str]:
    found: list[str] = []
    for name in sorted({str(r["model"]) for r in replicas}):
        mine = [r for r in replicas if r["model"] == name]
        if name not in memory.MODEL_PROFILES:
            continue
        flags = dict(mine[0].get("flags") or {})
        own = [int(g) for r in mine for g in str(r["gpus"]).split(",")]
        if any(g >= len(gpus) for g in own):
            continue  # the facts show other GPUs than the plan (preflight names the count)
        hostvars = {key: value for key, value in (given or {}).items() if value is not None}
        hostvars.update(vllm_gpu_memory_utilization=float(mine[0]["gpu_memory_utilization"]),
                        vllm_tensor_parallel_size=int(mine[0]["tensor_parallel_size"]), vllm_replicas=len(mine))
        for flag, var in (("max-model-len", "vllm_max_model_len"), ("max-num-seqs", "vllm_max_num_seqs")):
            if flag in flags:
                hostvars[var] = flags[flag]
        try:
            report = plan_hosts.plan_for_host(
                "this host", hostvars,
                [memory.Gpu(str(gpus[g].get("name")), int(gpus[g]["memory_total_mib"])) for g in own],
                plan_hosts.Overrides(name, None, None, None, {}, memory.DEFAULT_REQUEST_TOKENS))
        except (plan_hosts.InputError, KeyError, TypeError, ValueError) as exc:
            raise AnsibleFilterError(f"memory plan of {name} (lab_models): {exc}") from exc
        found += [f"{name} (lab_models): {text}" for text in memory.refusals(report.plan)]
    return found


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "labctl_plan_refusals": labctl_plan_refusals,
        }
