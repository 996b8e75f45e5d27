"""The project's shared Jinja filters. A filter only one role uses lives in that role's
filter_plugins/ (roles/<role>/filter_plugins/)."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError


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


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "labctl_topology": labctl_topology,
        }
