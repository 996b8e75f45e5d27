"""One host's memory plan from its inventory variables: ``labctl plan`` prints it, preflight's
``labctl_plan_refusals`` filter refuses a plan vLLM cannot start (``labctl.plan`` has the
arithmetic). Settings resolve as the topology resolves them (``labctl.topology.SETTINGS``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from labctl import models, topology
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
    # Several models (lab_models): where each replica runs and each GPU's shares (placement_lines).
    placement: list[dict[str, Any]] = field(default_factory=list)
    gpu_shares: dict[int, float] = field(default_factory=dict)

    def placement_lines(self) -> list[str]:
        """Per GPU the replicas on it and their shares of its memory, summed: the proof that they fit."""
        lines = []
        for gpu, used in sorted(self.gpu_shares.items()):
            on = [r for r in self.placement if str(gpu) in str(r["gpus"]).split(",")]
            if not on:
                continue
            size = self.plan.gpus[gpu].memory_mib / 1024 if gpu < len(self.plan.gpus) else 0.0
            parts = " + ".join(f"{r['gpu_memory_utilization']:.2f} {r['model']} (vllm@{r['index']}, port {r['port']})" for r in on)
            # Beside the shares, each engine's CUDA context (labctl.models.engine_reserve_mib).
            contexts = sum(models.engine_reserve_mib(int(r["tensor_parallel_size"])) for r in on) / 1024
            lines.append(f"GPU {gpu}: {parts} = {used:.2f} of 1.00 ({used * size:.1f} of {size:.1f} GiB), "
                         f"+ {len(on)} CUDA context{'s' if len(on) > 1 else ''} {contexts:.1f} GiB outside the shares")
        return lines

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
    listed = hostvars.get(topology.MODELS)
    # With lab_models, --model picks the model whose replicas are listed; the memory plan is lab_model_name's.
    name = (given.model if listed is None else None) or hostvars.get("lab_model_name") or topology.DEFAULT_MODEL
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
    if listed is not None:
        _place(report, host, hostvars, listed, len(gpus), given.model)
    expected = hostvars.get("lab_expected_gpu_count")
    if isinstance(expected, int) and expected > 0 and expected != len(gpus):
        report.notes.append(f"lab_expected_gpu_count is {expected}, the GPU facts show {len(gpus)} GPUs")
    return report


def _place(report: HostReport, host: str, hostvars: dict[str, Any], listed: Any, gpu_count: int, wanted: str | None) -> None:
    """lab_models placed on this host's GPUs (labctl.models, as the topology places them); ``wanted``
    (--model) keeps that model's replicas in the listing, the shares stay every model's."""
    base, _ = host_setting(host, hostvars, topology.SETTINGS["base_port"][0], int)
    try:
        replicas = models.place(models.parse(listed), host, gpu_count, int(base),
                                memory_mib=[g.memory_mib for g in report.plan.gpus])
    except models.ModelsError as exc:
        raise InputError(f"{host}: {exc}") from exc
    report.gpu_shares = models.memory_plan(replicas, gpu_count)
    if wanted:
        chosen = [r for r in replicas if wanted == r["model"] or wanted in r["public_names"]]
        if not chosen:
            served = sorted({r["model"] for r in replicas})
            raise InputError(f"{host}: --model {wanted}: lab_models places no replica of it here (models here: {', '.join(served)})")
        replicas = chosen
    report.placement = replicas
