"""Memory plan of a GPU host's vLLM replicas: budget, KV-cache tokens, concurrency, advice.

Pure computation, no I/O (``labctl plan`` in ``plan_cli`` reads the inventory and GPU facts).
The method is source 004's (a vLLM deployment guide for GPT-OSS-120B, "VRAM 요구 사항 계획"):

    budget   = GPU memory x --gpu-memory-utilization        (80 GB x 0.95 = 76 GB)
    KV cache = budget - model weights - framework overhead  (76 - 61 - 2 = 13 GB)
    tokens   = KV cache / KV bytes per token                (13 GB / ~36 KB = ~370 K)
    requests = tokens / tokens per request                  (~370 K / 32 K = ~10)

With tensor parallel (TP) each GPU of a group holds 1/TP of the weights and 1/TP of every
token's KV heads, so a group of TP GPUs caches TP times the tokens one GPU's KV memory holds.
Memory is counted in GiB and the per-token size in bytes; the source's "GB"/"KB" are read as
GiB/KiB (vLLM logs memory in GiB, and 36 KiB is exactly gpt-oss's full-attention KV, see
``MODEL_PROFILES``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from labctl.topology import TopologyError, replica_plan

GIB = 1024**3
MIB_PER_GIB = 1024

# Tokens of an average request at the lab (source 000, "1リクエストあたりの平均トークン数 ~2,380":
# 6.57 B tokens over 2.76 M requests in ~6 days of production).
DEFAULT_REQUEST_TOKENS = 2380

# The smallest KV-cache share of the budget that makes a replica worth running. Below a tenth
# the cache holds only a few long requests and the engine spends its time preempting; source
# 004's single-H100 example, the smallest setup it runs on one GPU, keeps 13 of 76 GB (17 %).
MIN_KV_SHARE = 0.10

# Tensor-parallel group sizes tried by the recommendation: powers of two up to one 8-GPU node
# (gpt-oss has 8 KV heads, so each of these splits them evenly).
TP_CANDIDATES = (1, 2, 4, 8)


class PlanError(ValueError):
    """Input the plan cannot use; the message names the setting or model."""


@dataclass(frozen=True)
class ModelProfile:
    """What a model needs per GPU besides its KV cache, and what one cached token costs."""

    name: str
    weights_gib: float
    kv_bytes_per_token: int
    overhead_gib: float
    max_context: int | None
    source: str


MODEL_PROFILES: dict[str, ModelProfile] = {
    # Source 004 (seeds/004, the worked example "예시: 단일 H100 80 GB"):
    #   "76 GB usable ├── 61 GB model weights ← fixed ├── 2 GB framework overhead ← fixed
    #    └── 13 GB KV cache"
    #   "캐시된 토큰당 약 36 KB 이므로, 13 GB는 전체 어텐션 레이어에 걸쳐 약 370K 토큰의 컨텍스트를
    #    담습니다" (~36 KB per cached token, so 13 GB holds ~370 K tokens across the attention layers).
    # 36 KiB = 18 full-attention layers x 8 KV heads x 64 head dim x 2 (K and V) x 2 bytes (bf16):
    # gpt-oss-120b has 36 layers alternating full and 128-token sliding-window attention
    # (transformers' GptOssConfig), so the sliding half adds only a fixed ~4.5 MiB per sequence,
    # which is left out.
    # Context: 131072 (reference/facts.md, vLLM recipe "context_length 131072").
    # gpt-oss-20b is not here: the sources give no memory numbers for it.
    "gpt-oss-120b": ModelProfile(
        name="gpt-oss-120b",
        weights_gib=61.0,
        kv_bytes_per_token=36 * 1024,
        overhead_gib=2.0,
        max_context=131072,
        source="source 004: 61 GB weights, 2 GB overhead, ~36 KB KV per token",
    ),
}


def model_profile(
    name: str,
    *,
    weights_gib: float | None = None,
    kv_bytes_per_token: int | None = None,
    overhead_gib: float | None = None,
) -> ModelProfile:
    """The profile of ``name`` with any given number replacing the stored one.

    An unknown name is an error listing the known ones, unless both ``weights_gib`` and
    ``kv_bytes_per_token`` are given (a custom model; overhead then defaults to 2 GiB).
    """
    known = MODEL_PROFILES.get(name)
    if known is None:
        if weights_gib is None or kv_bytes_per_token is None:
            raise PlanError(
                f"unknown model {name!r}: known models are {', '.join(sorted(MODEL_PROFILES))} "
                "(or give --weights-gib and --kv-bytes-per-token for another model)"
            )
        known = ModelProfile(name, weights_gib, kv_bytes_per_token, 2.0, None, "given on the command line")
    overridden = any(v is not None for v in (weights_gib, kv_bytes_per_token, overhead_gib))
    profile = ModelProfile(
        name=known.name,
        weights_gib=known.weights_gib if weights_gib is None else weights_gib,
        kv_bytes_per_token=known.kv_bytes_per_token if kv_bytes_per_token is None else kv_bytes_per_token,
        overhead_gib=known.overhead_gib if overhead_gib is None else overhead_gib,
        max_context=known.max_context,
        source=f"{known.source}; overridden on the command line" if overridden and name in MODEL_PROFILES
        else known.source,
    )
    if profile.weights_gib <= 0 or profile.kv_bytes_per_token <= 0 or profile.overhead_gib < 0:
        raise PlanError(f"model {name}: weights and KV bytes per token must be > 0, overhead >= 0")
    return profile


@dataclass(frozen=True)
class Gpu:
    """One GPU as labctl_gpu_facts reports it: its name and ``memory_total_mib``."""

    name: str
    memory_mib: int


@dataclass(frozen=True)
class VllmSettings:
    """The vLLM role's serving settings (roles/vllm/defaults/main.yml) for one host."""

    gpu_memory_utilization: float
    max_model_len: int
    max_num_seqs: int
    tensor_parallel_size: int = 1
    replicas: int = 0  # 0: as many as the GPUs allow (labctl_replica_plan)

    def check(self) -> None:
        if not 0 < self.gpu_memory_utilization <= 1:
            raise PlanError(
                f"vllm_gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        for name, value, low in (
            ("vllm_max_model_len", self.max_model_len, 1),
            ("vllm_max_num_seqs", self.max_num_seqs, 1),
            ("vllm_tensor_parallel_size", self.tensor_parallel_size, 1),
            ("vllm_replicas", self.replicas, 0),
        ):
            if value < low:
                raise PlanError(f"{name} must be >= {low}, got {value}")


@dataclass(frozen=True)
class GpuMemory:
    """How one GPU of a TP group splits its budget, in GiB, and what the group caches."""

    memory_gib: float
    budget_gib: float
    weights_gib: float
    overhead_gib: float
    kv_cache_gib: float
    kv_tokens: int

    @property
    def kv_share(self) -> float:
        return self.kv_cache_gib / self.budget_gib


def gpu_memory(memory_mib: int, tp: int, model: ModelProfile, utilization: float) -> GpuMemory:
    """Source 004's split for one GPU of a ``tp``-GPU group; ``kv_tokens`` is the group's."""
    memory = memory_mib / MIB_PER_GIB
    budget = memory * utilization
    weights = model.weights_gib / tp
    kv = budget - weights - model.overhead_gib
    tokens = math.floor(kv * GIB * tp / model.kv_bytes_per_token) if kv > 0 else 0
    return GpuMemory(memory, budget, weights, model.overhead_gib, kv, tokens)


@dataclass(frozen=True)
class ReplicaPlan:
    """One vLLM replica: its GPUs (replica i uses [i*tp, (i+1)*tp)) and its memory split."""

    index: int
    gpus: tuple[int, ...]
    gpu_name: str
    memory: GpuMemory
    full_context_sequences: float  # KV tokens / max_model_len (vLLM's "Maximum concurrency")
    concurrency: int  # requests of request_tokens the KV cache holds at once
    warnings: tuple[str, ...]


@dataclass(frozen=True)
class Recommendation:
    tensor_parallel_size: int | None  # None: does not fit in TP_CANDIDATES[-1] GPUs
    replicas: int
    fits: bool  # runs on this host's GPUs
    reason: str


@dataclass(frozen=True)
class HostPlan:
    model: ModelProfile
    settings: VllmSettings
    request_tokens: int
    gpus: tuple[Gpu, ...]
    replicas: tuple[ReplicaPlan, ...]
    warnings: tuple[str, ...]
    recommendation: Recommendation


def _replica_warnings(mem: GpuMemory, settings: VllmSettings, request_tokens: int) -> list[str]:
    fixed = mem.weights_gib + mem.overhead_gib
    if mem.kv_cache_gib <= 0:
        need = fixed / mem.memory_gib
        fix = (
            f"raise vllm_gpu_memory_utilization above {need:.2f} or use tensor parallel "
            "(vllm_tensor_parallel_size)"
            if need < 1
            else "use tensor parallel (vllm_tensor_parallel_size): no utilization makes it fit"
        )
        return [
            (f"does not fit: weights {mem.weights_gib:.1f} GiB + overhead {mem.overhead_gib:.1f} GiB "
            f"exceed the budget of {mem.budget_gib:.1f} GiB ({mem.memory_gib:.1f} GiB x "
            f"{settings.gpu_memory_utilization:.2f}); {fix}")
        ]
    warnings = []
    if mem.kv_tokens < settings.max_model_len:
        warnings.append(
            f"KV cache holds {mem.kv_tokens:,} tokens, less than one vllm_max_model_len "
            f"({settings.max_model_len:,}) sequence: vLLM refuses to start; lower vllm_max_model_len "
            f"to {mem.kv_tokens:,} or raise vllm_gpu_memory_utilization"
        )
    demand = settings.max_num_seqs * request_tokens
    if demand > mem.kv_tokens:
        warnings.append(
            f"vllm_max_num_seqs {settings.max_num_seqs} x {request_tokens:,} tokens = {demand:,} "
            f"tokens exceed the KV cache ({mem.kv_tokens:,} tokens): a full batch preempts requests; "
            f"lower vllm_max_num_seqs to {max(mem.kv_tokens // request_tokens, 1)} or free memory "
            "for KV cache"
        )
    return warnings


def _settings_warnings(
    gpus: tuple[Gpu, ...], model: ModelProfile, settings: VllmSettings, count: int
) -> list[str]:
    tp = settings.tensor_parallel_size
    warnings = []
    if model.max_context is not None and settings.max_model_len > model.max_context:
        warnings.append(
            f"vllm_max_model_len {settings.max_model_len:,} is above {model.name}'s context "
            f"({model.max_context:,}): vLLM refuses it"
        )
    if settings.replicas and count < settings.replicas:
        warnings.append(
            f"does not fit: vllm_replicas {settings.replicas} x vllm_tensor_parallel_size {tp} needs "
            f"{settings.replicas * tp} GPUs, the host has {len(gpus)}: no replica planned"
        )
    elif not settings.replicas and count == 0:
        warnings.append(
            f"vllm_tensor_parallel_size {tp} needs {tp} GPUs per replica, the host has {len(gpus)}: "
            "no replica"
        )
    idle = len(gpus) - count * tp
    if count and idle:
        warnings.append(f"{idle} GPU(s) serve no replica ({len(gpus)} GPUs, {count} x {tp} used)")
    return warnings


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def utilization_needed(memory_mib: int, tp: int, model: ModelProfile, max_model_len: int) -> float:
    """The smallest vllm_gpu_memory_utilization at which a ``tp`` group of these GPUs keeps
    MIN_KV_SHARE of its budget and one max_model_len sequence for KV cache (may be > 1)."""
    memory = memory_mib / MIB_PER_GIB
    fixed = model.weights_gib / tp + model.overhead_gib
    one_sequence = max_model_len * model.kv_bytes_per_token / tp / GIB
    return max(fixed / (memory * (1 - MIN_KV_SHARE)), (fixed + one_sequence) / memory)


def _good(mem: GpuMemory, max_model_len: int) -> bool:
    return mem.kv_share >= MIN_KV_SHARE and mem.kv_tokens >= max_model_len


def _runs(mem: GpuMemory, max_model_len: int) -> bool:
    return mem.kv_tokens >= max_model_len


def recommend(gpus: tuple[Gpu, ...], model: ModelProfile, settings: VllmSettings) -> Recommendation:
    """One replica per GPU when the model fits one GPU with >= MIN_KV_SHARE of the budget left
    for KV cache (and room for one max_model_len sequence), else tensor parallel over the
    smallest power-of-two group that does; sized on the host's smallest GPU."""
    gpu = min(gpus, key=lambda g: g.memory_mib)
    util, length = settings.gpu_memory_utilization, settings.max_model_len
    splits = {tp: gpu_memory(gpu.memory_mib, tp, model, util) for tp in TP_CANDIDATES}
    one = splits[1]
    fixed = f"the weights ({model.weights_gib:.1f} GiB) and overhead ({model.overhead_gib:.1f} GiB)"
    if _good(one, length):
        return Recommendation(
            1,
            len(gpus),
            True,
            f"one replica per GPU ({_count(len(gpus), 'replica')}, tensor parallel 1): {fixed} fit one "
            f"{gpu.name} and leave {one.kv_cache_gib:.1f} GiB ({one.kv_share:.1%}) of its "
            f"{one.budget_gib:.1f} GiB budget for KV cache ({one.kv_tokens:,} tokens); independent "
            "replicas give more throughput than one tensor-parallel engine and need no NCCL "
            "traffic between the GPUs (the lab's 2 x H200 runs mxfp4 GPT-OSS-120B this way)",
        )
    why_not = (
        f"one {gpu.name}'s budget of {one.budget_gib:.1f} GiB cannot hold {fixed}"
        if one.kv_cache_gib <= 0
        else f"one {gpu.name} keeps only {one.kv_cache_gib:.1f} GiB ({one.kv_share:.1%}) of "
        f"its {one.budget_gib:.1f} GiB budget for KV cache after {fixed} "
        f"(wanted: {MIN_KV_SHARE:.0%} and one {length:,}-token sequence)"
    )
    usable = [tp for tp in TP_CANDIDATES if tp <= len(gpus)]
    for test, note in ((_good, ""), (_runs, f", below the {MIN_KV_SHARE:.0%} wanted")):
        for tp in usable:
            if tp > 1 and test(splits[tp], length):
                mem = splits[tp]
                return Recommendation(
                    tp,
                    len(gpus) // tp,
                    True,
                    f"tensor parallel {tp} ({_count(len(gpus) // tp, 'replica')} of {tp} GPUs): {why_not}; "
                    f"over {tp} GPUs each holds {mem.weights_gib:.1f} GiB of weights and keeps "
                    f"{mem.kv_cache_gib:.1f} GiB ({mem.kv_share:.1%}{note}) for KV cache "
                    f"({mem.kv_tokens:,} tokens per replica), the smallest power-of-two group "
                    "that fits",
                )
    largest = usable[-1]
    util_hint = utilization_needed(gpu.memory_mib, largest, model, length)
    fix = (
        f"tensor parallel {largest} at vllm_gpu_memory_utilization {math.ceil(util_hint * 100) / 100:.2f} "
        "or more would fit; or "
        if util_hint <= 1
        else ""
    )
    needed = next((tp for tp in TP_CANDIDATES if _good(splits[tp], length)), None)
    if needed is not None:
        return Recommendation(
            needed,
            0,
            False,
            f"does not fit this host: {why_not}; at vllm_gpu_memory_utilization {util:.2f} it needs "
            f"tensor parallel {needed} ({needed} GPUs of this size per replica), the host has "
            f"{len(gpus)}; {fix}add GPUs",
        )
    return Recommendation(
        None,
        0,
        False,
        f"does not fit: {why_not}, and even {TP_CANDIDATES[-1]} such GPUs at "
        f"vllm_gpu_memory_utilization {util:.2f} leave too little KV cache; {fix}use larger GPUs",
    )


def plan_host(
    gpus: list[Gpu] | tuple[Gpu, ...],
    model: ModelProfile,
    settings: VllmSettings,
    request_tokens: int = DEFAULT_REQUEST_TOKENS,
) -> HostPlan:
    """The replicas ``settings`` put on ``gpus`` (as labctl_replica_plan maps them), each one's
    memory split and warnings, and the recommended layout for these GPUs."""
    settings.check()
    if request_tokens < 1:
        raise PlanError(f"request tokens must be >= 1, got {request_tokens}")
    if not gpus:
        raise PlanError("no GPUs to plan for")
    for i, gpu in enumerate(gpus):
        if gpu.memory_mib <= 0:
            raise PlanError(f"GPU {i} ({gpu.name}) has no memory size ({gpu.memory_mib} MiB)")
    gpus = tuple(gpus)
    tp = settings.tensor_parallel_size
    # The same replicas the topology plans (labctl.topology): more than fit is no replica at all.
    try:
        groups = [tuple(int(g) for g in r["gpus"].split(",")) for r in replica_plan(len(gpus), tp, settings.replicas, 0, "", "")]
    except TopologyError:
        groups = []
    count = len(groups)
    replicas = []
    for i, group in enumerate(groups):
        smallest = min((gpus[g] for g in group), key=lambda g: g.memory_mib)
        mem = gpu_memory(smallest.memory_mib, tp, model, settings.gpu_memory_utilization)
        replicas.append(
            ReplicaPlan(
                index=i,
                gpus=group,
                gpu_name=smallest.name,
                memory=mem,
                full_context_sequences=mem.kv_tokens / settings.max_model_len,
                concurrency=mem.kv_tokens // request_tokens,
                warnings=tuple(_replica_warnings(mem, settings, request_tokens)),
            )
        )
    return HostPlan(
        model=model,
        settings=settings,
        request_tokens=request_tokens,
        gpus=gpus,
        replicas=tuple(replicas),
        warnings=tuple(_settings_warnings(gpus, model, settings, count)),
        recommendation=recommend(gpus, model, settings),
    )


# Warnings that mean a replica cannot start at all (vLLM refuses it); preflight refuses a plan
# with any of them, quoting the same text `labctl plan` prints.
_CANNOT_START = ("does not fit:", "vLLM refuses")


def refusals(plan: HostPlan) -> list[str]:
    """What stops a replica of ``plan`` from starting, one line per reason, worded as `labctl plan`
    prints it ("replicas 0, 1: KV cache holds ...")."""
    found = [w for w in plan.warnings if any(m in w for m in _CANNOT_START)]
    by_text: dict[str, list[str]] = {}
    for replica in plan.replicas:
        for warning in replica.warnings:
            if any(m in warning for m in _CANNOT_START):
                by_text.setdefault(warning, []).append(str(replica.index))
    return found + [f"{'replica' if len(ids) == 1 else 'replicas'} {', '.join(ids)}: {text}" for text, ids in by_text.items()]
