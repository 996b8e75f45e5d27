"""One host's memory plan from its inventory variables: ``labctl plan`` prints it, preflight's
``labctl_plan_refusals`` filter refuses a plan vLLM cannot start (``labctl.plan`` has the
arithmetic). Settings resolve as the topology resolves them (``labctl.topology.SETTINGS``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from labctl import topology
from labctl.plan import Gpu, HostPlan, PlanError, VllmSettings, model_profile, plan_host

# Inventory variable of each setting, as the vllm role reads it.
SETTING_VARS = {
    "gpu_memory_utilization": "vllm_gpu_memory_utilization",
    "max_model_len": "vllm_max_model_len",
    "max_num_seqs": "vllm_max_num_seqs",
    "tensor_parallel_size": "vllm_tensor_parallel_size",
    "replicas": "vllm_replicas",
}


class InputError(Exception):
    """Bad input (inventory, facts, variable, option); the message names it. Exit status 2."""


def _literal(host: str, name: str, value: Any, kind: type[int] | type[float], option: str) -> int | float:
    if isinstance(value, str) and "{{" in value:
        raise InputError(
            f"{host}: {name} is a template ({value!r}) that labctl plan does not evaluate; give {option}"
        )
    if isinstance(value, bool):
        raise InputError(f"{host}: {name} must be a number, not {value!r}")
    try:
        number = kind(value)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{host}: {name} must be a number, got {value!r}") from exc
    if kind is int and number != float(value):
        raise InputError(f"{host}: {name} must be a whole number, got {value!r}")
    return number


def host_setting(host: str, hostvars: dict[str, Any], name: str, kind: type[int] | type[float]) -> tuple[int | float, str]:
    """A vLLM setting's value for ``host`` and where it came from, resolved as the topology
    resolves it (labctl.topology.SETTINGS): the role variable the inventory sets, else the project
    variable (lab_vllm_*, group_vars/all/project.yml, which every inventory links), else the
    built-in default."""
    option = "--" + name.removeprefix("vllm_").replace("_", "-")
    key = next(k for k, (role, _, _) in topology.SETTINGS.items() if role == name)
    value, var = topology.setting(hostvars, key)
    origin = "inventory" if var in hostvars else "default"
    return _literal(host, var, value, kind, option), origin


@dataclass
class HostReport:
    host: str
    plan: HostPlan
    origins: dict[str, str]
    notes: list[str] = field(default_factory=list)

    def warnings(self) -> list[str]:
        """Host warnings, then each replica warning once with the replicas it concerns."""
        by_text: dict[str, list[str]] = {}
        for replica in self.plan.replicas:
            for warning in replica.warnings:
                by_text.setdefault(warning, []).append(str(replica.index))
        return self.notes + list(self.plan.warnings) + [
            f"{'replica' if len(ids) == 1 else 'replicas'} {', '.join(ids)}: {text}"
            for text, ids in by_text.items()
        ]


@dataclass(frozen=True)
class Overrides:
    model: str | None
    weights_gib: float | None
    kv_bytes_per_token: int | None
    overhead_gib: float | None
    settings: dict[str, int | float | None]
    request_tokens: int


def plan_for_host(host: str, hostvars: dict[str, Any], gpus: list[Gpu], given: Overrides) -> HostReport:
    values: dict[str, int | float] = {}
    origins: dict[str, str] = {}
    for key, var in SETTING_VARS.items():
        kind: type[int] | type[float] = float if key == "gpu_memory_utilization" else int
        option = given.settings.get(key)
        if option is not None:
            values[key], origins[key] = option, "option"
        else:
            values[key], origins[key] = host_setting(host, hostvars, var, kind)
    name = given.model or hostvars.get("lab_model_name") or topology.DEFAULT_MODEL
    if not isinstance(name, str) or "{{" in name:
        raise InputError(f"{host}: lab_model_name is {name!r}; give --model")
    try:
        model = model_profile(
            name,
            weights_gib=given.weights_gib,
            kv_bytes_per_token=given.kv_bytes_per_token,
            overhead_gib=given.overhead_gib,
        )
    except PlanError as exc:
        origin = "--model" if given.model else "lab_model_name"
        raise InputError(f"{host}: {origin}: {exc}") from exc
    settings = VllmSettings(
        gpu_memory_utilization=float(values["gpu_memory_utilization"]),
        max_model_len=int(values["max_model_len"]),
        max_num_seqs=int(values["max_num_seqs"]),
        tensor_parallel_size=int(values["tensor_parallel_size"]),
        replicas=int(values["replicas"]),
    )
    try:
        plan = plan_host(gpus, model, settings, given.request_tokens)
    except PlanError as exc:
        raise InputError(f"{host}: {exc}") from exc
    report = HostReport(host, plan, origins)
    expected = hostvars.get("lab_expected_gpu_count")
    if isinstance(expected, int) and expected > 0 and expected != len(gpus):
        report.notes.append(f"lab_expected_gpu_count is {expected}, the GPU facts show {len(gpus)} GPUs")
    return report
