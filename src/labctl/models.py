"""Several models side by side (Issue 32): the ``lab_models`` list, checked, and its placement on a
host's GPUs.

labctl.topology plans a lab that sets ``lab_models`` with it (its replicas carry their model), and
publishes the list as ``lab_topology.models``. Keep it **stdlib only** and compatible with Python
3.9, like labctl.topology.

An entry of ``lab_models``::

    - id: 0                       # 0-99, fixed for the model's life: its ports and units follow from it
      name: gpt-oss-120b          # the model in the bundle (bundle/models/<name>/<revision>)
      revision: main
      served_names: [gpt-oss-120b]            # default: [name]; each published by the gateway
      classes: [interactive, batch]           # default: [interactive]
      kind: generate              # or embed (vLLM's pooling runner)
      gpus: 2                     # a count per host, a list of GPU indices ([1]), or omitted: every GPU left
      gpu_memory_utilization: 0.85            # the share of each of its GPUs' memory (vLLM's flag)
      tensor_parallel_size: 1
      flags: {max-model-len: 8192}            # more vLLM flags

Placement on a host, per model in id order (explicit lists first, then counts, then "every GPU
left"): a replica takes ``tensor_parallel_size`` GPUs that each still have its share of memory
free, and room for its engine's CUDA context beside the shares (``engine_reserve_mib``); GPUs of
one NUMA node together where the facts give the nodes. Model ``id`` k's replica i is index
100*k + i, port base + 100*k + i, unit vllm@<index>: model 0 keeps the one-model lab's indices,
ports and names, and adding or removing a model moves no other model's replica.

What a replica takes of a GPU beyond its share, read in vLLM 0.32.0:

- ``vllm/v1/worker/gpu_worker.py``, ``Worker.init_device``: the CUDA context exists, and the
  distributed environment is initialized ("This ensures NCCL buffers are allocated before we
  measure available memory"), before the worker's memory snapshot (``MemorySnapshot``,
  ``vllm/utils/mem_utils.py``). ``request_memory`` (``vllm/v1/worker/utils.py``) then asks that
  snapshot for ``gpu_memory_utilization x total`` free and raises "Free memory on device ... on
  startup is less than desired GPU memory utilization" otherwise; ``determine_available_memory``
  sizes the KV cache as that share minus what the process took since the snapshot. So everything
  the engine allocated before the snapshot, its CUDA context first, lies outside its share: the
  shares on a GPU may add up to at most what the contexts of every engine on it leave.
- The size: vLLM 0.32.0 gives one measured figure for a CUDA context, 1.8 GiB, "Per-API-server CUDA
  context and driver allocation, measured with PyNvVideoCodec 2.0.4 on H100"
  (``vllm/multimodal/video_decoders/pynvvideocodec.py``, ``PYNVVIDEOCODEC_CUDA_CONTEXT_BYTES``),
  which it reserves per process itself "so gpu_memory_utilization bounds total GPU usage across
  them" (``vllm/multimodal/gpu_ipc_memory.py``, ``reserve_mm_ipc_gpu_memory``). Each replica keeps
  it, plus the 150 MiB ``Worker.compile_or_warm_up_model`` leaves because "memory profiling may
  slightly underestimate the memory consumption" (``redundancy_buffer_memory``): 1,844 + 150 =
  1,994 MiB per engine process on each of its GPUs (``CONTEXT_RESERVE_MIB``).
- Tensor parallel (``tensor_parallel_size`` > 1) adds NCCL's buffers before the snapshot; vLLM
  gives no measured figure, only its worked example in ``memory_profiling``'s docstring ("0.5 GiB
  (memory used by NCCL)"), which is taken: 512 MiB more (``NCCL_RESERVE_MIB``).

Two shares that add up to 1.0 leave nothing for the contexts: the second engine on the GPU fails
at start. Where the facts do not give a GPU's memory (planning from the inventory, a host before
its driver), an H100 80GB's 81,559 MiB is assumed, the smallest GPU the lab plans for
(``FALLBACK_GPU_MEMORY_MIB``): on an H200 the same reserve is a smaller share.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

KINDS = ("generate", "embed")
CLASSES = ("interactive", "batch")
MAX_ID = 99
ID_STRIDE = 100
DEFAULT_UTILIZATION = 0.80
# vLLM refuses a start when less memory is free than its share; the shares on one GPU and the engines'
# CUDA contexts beside them must add up to at most the whole GPU (the module's docstring: the figures
# and where vLLM 0.32.0 gives them).
GPU_CAPACITY = 1.0
# vLLM 0.32.0's measured CUDA context and driver allocation on an H100 (1.8 GiB, rounded up to MiB) and
# the 150 MiB by which its memory profiling may fall short: per engine process, on each of its GPUs.
CONTEXT_RESERVE_MIB = 1844 + 150
# NCCL's buffers of a tensor-parallel engine, allocated before vLLM's memory snapshot (its example figure).
NCCL_RESERVE_MIB = 512
# An H100 80GB's memory.total (nvidia-smi), for a GPU whose size the facts do not give.
FALLBACK_GPU_MEMORY_MIB = 81559
ENTRY_KEYS = frozenset(("id", "name", "revision", "served_names", "classes", "kind", "gpus", "gpu_memory_utilization",
                        "tensor_parallel_size", "flags"))
# What the topology publishes of each model (lab_topology.models): the gateway's model list, the keys'
# models, the artifacts layer's staging.
PUBLIC_KEYS = ("id", "name", "revision", "served_names", "classes", "kind")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class ModelsError(ValueError):
    """lab_models cannot be used; the message names the entry and the field."""


def _where(number: int, entry: Mapping[str, Any]) -> str:
    name = entry.get("name") if isinstance(entry, Mapping) else None
    return f"lab_models[{number}]" + (f" ({name})" if isinstance(name, str) and name else "")


def _whole(value: Any, where: str, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ModelsError(f"{where} must be a whole number, got {value!r}")
    if value < low or (high is not None and value > high):
        raise ModelsError(f"{where}={value} is out of range ({low}-{high if high is not None else 'any'})")
    return value


def _names(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and NAME.match(v) for v in value):
        raise ModelsError(f"{where} must be a non-empty list of names (letters, digits, '.', '_', '-'), got {value!r}")
    return list(value)


def parse(value: Any, bundle_models: Mapping[str, Sequence[str]] | None = None) -> list[dict[str, Any]]:
    """The entries of ``lab_models``, checked and completed with their defaults, in id order.

    ``bundle_models``: the bundle's models and their revisions (name: [revision, ...]); when given,
    an entry the bundle lacks is refused. Raises ModelsError naming the entry and the field."""
    if not isinstance(value, list) or not value:
        raise ModelsError(f"lab_models must be a non-empty list of models, got {value!r}")
    models: list[dict[str, Any]] = []
    for number, entry in enumerate(value):
        where = _where(number, entry)
        if not isinstance(entry, Mapping):
            raise ModelsError(f"{where} must be a mapping, got {entry!r}")
        unknown = sorted(set(entry) - ENTRY_KEYS)
        if unknown:
            raise ModelsError(f"{where}: unknown field(s) {', '.join(unknown)} (known: {', '.join(sorted(ENTRY_KEYS))})")
        for key in ("id", "name", "revision"):
            if key not in entry:
                raise ModelsError(f"{where}: {key} is required")
        model_id = _whole(entry["id"], f"{where}: id", 0, MAX_ID)
        name = _names([entry["name"]], f"{where}: name")[0]
        revision = entry["revision"]
        if not isinstance(revision, str) or not revision:
            raise ModelsError(f"{where}: revision must be the bundle's revision of {name}, got {revision!r}")
        kind = entry.get("kind", "generate")
        if kind not in KINDS:
            raise ModelsError(f"{where}: kind={kind!r} is not one of {', '.join(KINDS)}")
        served = _names(entry.get("served_names", [name]), f"{where}: served_names")
        classes = entry.get("classes", ["interactive"])
        if not isinstance(classes, list) or not classes or any(c not in CLASSES for c in classes):
            raise ModelsError(f"{where}: classes must be a non-empty list of {', '.join(CLASSES)}, got {classes!r}")
        if kind == "embed" and "batch" in classes:
            raise ModelsError(f"{where}: classes: an embedding model has no batch class (its requests are not generations)")
        tp = _whole(entry.get("tensor_parallel_size", 1), f"{where}: tensor_parallel_size", 1, 64)
        share = entry.get("gpu_memory_utilization", DEFAULT_UTILIZATION)
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < float(share) <= GPU_CAPACITY:
            raise ModelsError(f"{where}: gpu_memory_utilization must be a share of a GPU's memory in (0, 1], got {share!r}")
        gpus = entry.get("gpus")
        if isinstance(gpus, list):
            if not gpus or len(set(gpus)) != len(gpus) or any(isinstance(g, bool) or not isinstance(g, int) or g < 0 for g in gpus):
                raise ModelsError(f"{where}: gpus must be a count, a list of distinct GPU indices, or omitted; got {gpus!r}")
            if len(gpus) % tp:
                raise ModelsError(f"{where}: gpus lists {len(gpus)} GPU(s), not a multiple of tensor_parallel_size={tp}")
        elif gpus is not None:
            _whole(gpus, f"{where}: gpus", 1)
            if gpus % tp:
                raise ModelsError(f"{where}: gpus={gpus} is not a multiple of tensor_parallel_size={tp}")
        flags = entry.get("flags", {})
        if not isinstance(flags, Mapping) or not all(isinstance(k, str) and k for k in flags):
            raise ModelsError(f"{where}: flags must be a mapping of vLLM flag names to values, got {flags!r}")
        if bundle_models is not None and revision not in list(bundle_models.get(name) or []):
            have = ", ".join(f"{n}@{r}" for n in sorted(bundle_models) for r in bundle_models[n]) or "none"
            raise ModelsError(f"{where}: {name}@{revision} is not in the bundle (it carries: {have}); add it to the "
                              "bundle's models and rebuild it")
        models.append({"id": model_id, "name": name, "revision": revision, "served_names": served, "classes": list(classes),
                       "kind": kind, "gpus": list(gpus) if isinstance(gpus, list) else gpus,
                       "gpu_memory_utilization": float(share), "tensor_parallel_size": tp, "flags": dict(flags),
                       "entry": number})
    _unique(models)
    return sorted(models, key=lambda m: m["id"])


def _unique(models: list[dict[str, Any]]) -> None:
    ids: dict[int, dict[str, Any]] = {}
    served: dict[str, dict[str, Any]] = {}
    for m in models:
        where = _where(m["entry"], m)
        if m["id"] in ids:
            raise ModelsError(f"{where}: id {m['id']} is also {_where(ids[m['id']]['entry'], ids[m['id']])}'s: "
                              "each model needs its own (its ports and units follow from it)")
        ids[m["id"]] = m
        for name in m["served_names"]:
            for public in (name, f"{name}-batch"):
                other = served.get(public)
                if other is not None and other is not m:
                    raise ModelsError(f"{where}: served_names: {public!r} is already served by "
                                      f"{_where(other['entry'], other)}")
            served[name] = m
            if "batch" in m["classes"]:
                served[f"{name}-batch"] = m


def _node_order(gpu_count: int, numa_nodes: Sequence[int] | None) -> list[list[int]]:
    """The host's GPUs grouped by NUMA node (one group when the nodes are unknown), in index order."""
    nodes = list(numa_nodes or [])
    if len(nodes) != gpu_count or any(not isinstance(n, int) or n < 0 for n in nodes):
        return [list(range(gpu_count))]
    groups: dict[int, list[int]] = {}
    for gpu, node in enumerate(nodes):
        groups.setdefault(node, []).append(gpu)
    return [groups[n] for n in sorted(groups)]


def engine_reserve_mib(tensor_parallel_size: int) -> int:
    """What one engine process of a replica takes on each of its GPUs outside its share (MiB): its CUDA
    context, and NCCL's buffers with tensor parallel (the module's docstring)."""
    return CONTEXT_RESERVE_MIB + (NCCL_RESERVE_MIB if int(tensor_parallel_size) > 1 else 0)


def gpu_sizes(gpu_count: int, memory_mib: Sequence[Any] | None = None) -> dict[int, int]:
    """Each GPU's memory in MiB: the facts' ``memory_total_mib`` (labctl_gpu_facts, in index order)
    where they give it, else FALLBACK_GPU_MEMORY_MIB."""
    given = list(memory_mib or [])
    sizes = {}
    for gpu in range(gpu_count):
        value = given[gpu] if gpu < len(given) else None
        sizes[gpu] = value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else FALLBACK_GPU_MEMORY_MIB
    return sizes


def place(models: list[dict[str, Any]], host: str, gpu_count: int, base_port: int,
          numa_nodes: Sequence[int] | None = None, memory_mib: Sequence[Any] | None = None) -> list[dict[str, Any]]:
    """The replicas of every model on one host: model, index, port, GPUs and their memory share.

    ``memory_mib``: each GPU's memory (``gpu_sizes``). Raises ModelsError naming the entry and the
    field when a model does not fit: a GPU index the host lacks, a GPU whose shares and engines'
    CUDA contexts add up to more than its memory (naming the models already on it), fewer GPUs with
    room than a count asks for."""
    sizes = gpu_sizes(gpu_count, memory_mib)
    free = dict.fromkeys(range(gpu_count), GPU_CAPACITY)
    users: dict[int, list[str]] = {gpu: [] for gpu in range(gpu_count)}
    groups = _node_order(gpu_count, numa_nodes)
    short = str(host).split(".")[0]
    order = sorted(models, key=lambda m: (0 if isinstance(m["gpus"], list) else 1 if m["gpus"] else 2, m["id"]))
    placed: dict[int, list[list[int]]] = {}
    for m in order:
        where = _where(m["entry"], m)
        tp, share = m["tensor_parallel_size"], m["gpu_memory_utilization"]
        reserve = engine_reserve_mib(tp)

        def need(gpu: int, share: float = share, reserve: int = reserve) -> float:
            return share + reserve / sizes[gpu]

        if isinstance(m["gpus"], list):
            missing = [g for g in m["gpus"] if g >= gpu_count]
            if missing:
                raise ModelsError(f"{where}: gpus: {host} has {gpu_count} GPU(s), no GPU {', '.join(map(str, missing))}")
            chosen = [m["gpus"][i:i + tp] for i in range(0, len(m["gpus"]), tp)]
            for gpus in chosen:
                for g in gpus:
                    if free[g] + 1e-9 < need(g):
                        beside = f" beside {', '.join(users[g])}" if users[g] else ""
                        raise ModelsError(
                            f"{where}: gpus: GPU {g} of {host} ({sizes[g]} MiB) has {max(free[g], 0.0):.2f} of its memory "
                            f"left{beside}, not the {share:.2f} gpu_memory_utilization asks for and {reserve / sizes[g]:.3f} "
                            f"({reserve} MiB) for its engine's CUDA context: vLLM allocates each engine's context outside "
                            f"its share, so the shares on one GPU add up to at most {GPU_CAPACITY} less a context per engine")
        else:
            wanted = None if m["gpus"] is None else m["gpus"] // tp
            chosen = _fit(groups, free, tp, need, wanted)
            if wanted is not None and len(chosen) < wanted:
                raise ModelsError(
                    f"{where}: gpus={m['gpus']}: {host} has room for {len(chosen) * tp} GPU(s) of {share:.2f} memory "
                    f"and a {reserve} MiB CUDA context in groups of tensor_parallel_size={tp} ({_room(free, users)})")
            if not chosen:
                raise ModelsError(f"{where}: no GPU of {host} has {share:.2f} of its memory and {reserve} MiB for a "
                                  f"CUDA context left ({_room(free, users)})")
        for gpus in chosen:
            for g in gpus:
                free[g] -= need(g)
                users[g].append(f"{m['name']} ({share:.2f})")
        placed[m["id"]] = chosen
    replicas: list[dict[str, Any]] = []
    for m in sorted(models, key=lambda m: m["id"]):
        for i, gpus in enumerate(placed[m["id"]]):
            index = ID_STRIDE * m["id"] + i
            if i >= ID_STRIDE:
                raise ModelsError(f"{_where(m['entry'], m)}: more than {ID_STRIDE} replicas on {host}")
            replicas.append({"model_id": m["id"], "model": m["name"], "revision": m["revision"], "kind": m["kind"],
                             "index": index, "port": int(base_port) + index, "gpus": ",".join(map(str, gpus)),
                             "gpu_memory_utilization": m["gpu_memory_utilization"], "tensor_parallel_size": m["tensor_parallel_size"],
                             "served_model_name": f"{m['served_names'][0]}-{short}-{index}",
                             "public_names": list(m["served_names"]), "classes": list(m["classes"])})
    return replicas


def _fit(groups: list[list[int]], free: dict[int, float], tp: int, need: Callable[[int], float],
         wanted: int | None) -> list[list[int]]:
    """Groups of ``tp`` GPUs with ``need(gpu)`` free each (the share and the engine's context), within
    one NUMA node first, then across nodes; GPUs already shared are filled before empty ones (a small
    model beside a big one leaves whole GPUs for the next big one)."""
    chosen: list[list[int]] = []
    taken: set[int] = set()

    def room(gpu: int) -> bool:
        return gpu not in taken and free[gpu] + 1e-9 >= need(gpu)

    def pick(pool: list[int]) -> None:
        while wanted is None or len(chosen) < wanted:
            fits = sorted((g for g in pool if room(g)), key=lambda g: (free[g] >= GPU_CAPACITY - 1e-9, g))
            if len(fits) < tp:
                return
            chosen.append(sorted(fits[:tp]))
            taken.update(fits[:tp])

    for group in groups:
        pick(group)
    if len(groups) > 1:
        pick([g for group in groups for g in group])
    return chosen


def _room(free: dict[int, float], users: dict[int, list[str]]) -> str:
    return "; ".join(f"GPU {g}: {max(free[g], 0.0):.2f} free" + (f" beside {', '.join(users[g])}" if users[g] else "")
                     for g in sorted(free))


def engines_per_gpu(replicas: list[dict[str, Any]], gpu_count: int) -> dict[int, list[dict[str, Any]]]:
    """The replicas on each GPU, in index order: one engine process each on every GPU it uses."""
    on: dict[int, list[dict[str, Any]]] = {g: [] for g in range(gpu_count)}
    for r in sorted(replicas, key=lambda r: int(r["index"])):
        for g in str(r["gpus"]).split(","):
            if g != "" and int(g) in on:
                on[int(g)].append(r)
    return on


def reserve_problems(replicas: list[dict[str, Any]], host: str, gpu_count: int, memory_mib: Sequence[Any] | None = None,
                     share_from: str = "gpu_memory_utilization") -> list[str]:
    """One problem per GPU of ``host`` whose replicas' shares (``gpu_memory_utilization``) leave less
    than a CUDA context per engine on it (``engine_reserve_mib``), naming the GPU and the models on it;
    ``share_from``: the variable the shares come from. ``place`` never plans such a GPU; a one-model
    lab's share (vllm_gpu_memory_utilization) is checked with this."""
    sizes = gpu_sizes(gpu_count, memory_mib)
    found = []
    for gpu, on in engines_per_gpu(replicas, gpu_count).items():
        if not on:
            continue
        shares = sum(float(r["gpu_memory_utilization"]) for r in on)
        reserve = sum(engine_reserve_mib(int(r.get("tensor_parallel_size") or 1)) for r in on)
        left = (1.0 - shares) * sizes[gpu]
        if left + 1e-6 < reserve:
            names = " + ".join(f"{r['model']} vllm@{r['index']} ({float(r['gpu_memory_utilization']):.2f})" for r in on)
            engines = "its engine" if len(on) == 1 else f"its {len(on)} engines"
            found.append(f"GPU {gpu} of {host} ({sizes[gpu]} MiB): {names} leave {max(left, 0.0):.0f} MiB beside the "
                         f"shares, less than the {reserve} MiB the CUDA context of {engines} takes outside them (vLLM "
                         f"allocates it before its memory snapshot): lower {share_from}")
    return found


def memory_plan(replicas: list[dict[str, Any]], gpu_count: int) -> dict[int, float]:
    """The share of each GPU's memory the replicas take (labctl plan shows it; at most 1.0 each)."""
    used = dict.fromkeys(range(gpu_count), 0.0)
    for r in replicas:
        for g in str(r["gpus"]).split(","):
            used[int(g)] = round(used[int(g)] + float(r["gpu_memory_utilization"]), 6)
    return used
