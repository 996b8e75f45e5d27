"""Small filters used by the roles, where plain Jinja would be unreadable."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from ansible.errors import AnsibleFilterError


def labctl_replica_ports(base: int, count: int, variable: str = "lab_vllm_base_port") -> list[dict[str, Any]]:
    """The ports of `count` replicas numbered from `base`, named after the variable they come from."""
    return [{"port": int(base) + i, "name": f"vLLM replica {i} ({variable}+{i})"} for i in range(int(count))]


def _topology_module() -> Any:
    """src/labctl/topology.py, loaded by path (stdlib only; shared with labctl)."""
    import importlib.util
    import sys
    from pathlib import Path

    name = "labctl_topology_shared"
    if name not in sys.modules:
        path = Path(__file__).resolve().parents[1] / "src" / "labctl" / "topology.py"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:  # pragma: no cover
            raise AnsibleFilterError(f"cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def labctl_topology(groups: Any, hostvars: Any, gpu_source: str = "facts", bundle_packages: Any = None) -> dict[str, Any]:
    """The lab's topology (src/labctl/topology.py) from the inventory's groups and every host's
    variables and facts."""
    topo = _topology_module()
    plain_groups = {str(k): list(v) for k, v in dict(groups).items()}
    names = set()
    for group in (topo.GPU_GROUP, topo.GATEWAY_GROUP, topo.MONITORING_GROUP, topo.LAB_GROUP):
        names.update(plain_groups.get(group) or [])
    given: dict[str, dict[str, Any]] = {}
    facts: dict[str, dict[str, Any]] = {}
    for host in sorted(names):
        hv = hostvars[host]
        given[host] = {n: hv[n] for n in topo.INPUT_VARIABLES if n in hv and hv[n] is not None}
        af = hv["ansible_facts"] if "ansible_facts" in hv else {}
        facts[host] = {n: af[n] for n in topo.INPUT_FACTS if n in af}
    try:
        return topo.lab_topology(plain_groups, given, facts, gpu_source=str(gpu_source),
                                 bundle_packages=[str(p) for p in bundle_packages or []])
    except topo.TopologyError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def labctl_restart_queue(replicas: list[dict[str, Any]], hosts: list[str], hostvars: Any) -> list[dict[str, Any]]:
    """The replicas to restart, host by host in play order: the topology's replicas (``replicas``,
    lab_topology.replicas) whose index each host's vllm role marked (its ``vllm_restart_pending``)."""
    queue = []
    for host in hosts:
        marked = set(hostvars[host].get("vllm_restart_pending") or [])
        queue += [dict(r) for r in replicas if r.get("host") == host and r["index"] in marked]
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


def labctl_upstream_version(version: str) -> str:
    """The upstream part of a Debian version: '1:580.95.05-0ubuntu1' -> '580.95.05'."""
    text = str(version).strip().split(":", 1)[-1]
    return text.rsplit("-", 1)[0] if "-" in text else text


def labctl_same_upstream(versions: list[str], version: str) -> list[str]:
    """The versions (in their order) whose upstream part is that of ``version``: NVIDIA packages of one
    driver release carry different Debian revisions (Ubuntu's driver 580.95.05-0ubuntu1, fabric
    manager 580.95.05-1)."""
    want = labctl_upstream_version(version)
    return [v for v in versions if labctl_upstream_version(v) == want]


def labctl_release_choice(offered: dict[str, list[str]], version: str) -> dict[str, list[str]]:
    """For each package (name -> the versions apt offers, newest first), the first version of the
    same upstream release as ``version``: {"install": ["name=version", ...], "missing": [names]}."""
    install, missing = [], []
    for name, versions in offered.items():
        same = labctl_same_upstream(list(versions), version)
        if same:
            install.append(f"{name}={same[0]}")
        else:
            missing.append(name)
    return {"install": install, "missing": missing}


def labctl_plan_refusals(gpus: list[dict[str, Any]], model: str, given: dict[str, Any]) -> list[str]:
    """Why the vLLM plan of a host cannot start, with `labctl plan`'s numbers (labctl.plan): ``gpus``
    as gpu_facts reports them, ``model`` lab_model_name, ``given`` the vllm_*/lab_vllm_* variables
    the host sets (None: not set; the vllm role's defaults then apply). [] when the GPUs are not
    known yet (no driver) or the model has no memory profile."""
    import sys
    from pathlib import Path

    src = str(Path(__file__).resolve().parents[1] / "src")
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


def labctl_package_changes(before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, Any]]:
    """What an upgrade changed, from two ``package_facts`` results: name, from, to (None when the
    package was not there before or is gone after) and a printable line, sorted by name."""

    def versions(facts: dict[str, Any], name: str) -> str | None:
        found = sorted({entry["version"] for entry in facts.get(name, [])})
        return ", ".join(found) if found else None

    changes = []
    for name in sorted(set(before) | set(after)):
        old, new = versions(before, name), versions(after, name)
        if old != new:
            line = f"{name} {old or '(new)'} -> {new or '(removed)'}"
            changes.append({"name": name, "from": old, "to": new, "line": line})
    return changes


def _release_key(release: str) -> list[Any]:
    return [(0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", release) if part]


def labctl_kernel_reboot_needed(running: str, installed: list[str]) -> bool:
    """Whether the newest installed kernel (releases from /boot/vmlinuz-*) is not the running one.
    No kernel image installed (a container) needs no reboot."""
    releases = [r for r in installed if r]
    if not releases:
        return False
    return max(releases, key=_release_key) != running


def labctl_class_floors(classes: list[dict[str, Any]], default_floor: float) -> dict[str, float]:
    """The admission floors by priority (as text, a JSON key): every class but the most urgent
    keeps its own ``floor`` or ``default_floor``; the most urgent class needs none."""
    if not classes:
        return {}
    top = min(int(c["priority"]) for c in classes)
    floors: dict[str, float] = {}
    for entry in classes:
        priority = int(entry["priority"])
        floor = float(entry.get("floor", 0.0 if priority == top else default_floor))
        if not 0.0 <= floor < 1.0:
            raise AnsibleFilterError(f"litellm_model_classes: {entry.get('name')}: floor {floor} is not in [0, 1)")
        if floor > 0:
            floors[str(priority)] = max(floor, floors.get(str(priority), 0.0))
    if sum(floors.values()) >= 1.0:
        raise AnsibleFilterError(f"litellm_model_classes: the floors add up to {sum(floors.values())}: keep them below 1")
    return floors


class FilterModule:
    """Jinja2 filters for labctl."""

    def filters(self) -> dict[str, Any]:
        return {
            "labctl_replica_ports": labctl_replica_ports,
            "labctl_topology": labctl_topology,
            "labctl_restart_queue": labctl_restart_queue,
            "labctl_port_clashes": labctl_port_clashes,
            "labctl_dashboard_defaults": labctl_dashboard_defaults,
            "labctl_upstream_version": labctl_upstream_version,
            "labctl_same_upstream": labctl_same_upstream,
            "labctl_release_choice": labctl_release_choice,
            "labctl_plan_refusals": labctl_plan_refusals,
            "labctl_package_changes": labctl_package_changes,
            "labctl_kernel_reboot_needed": labctl_kernel_reboot_needed,
            "labctl_class_floors": labctl_class_floors,
        }
