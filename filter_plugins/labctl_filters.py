"""The project's shared Jinja filters. A filter only one role uses lives in that role's
filter_plugins/ (roles/<role>/filter_plugins/)."""

from __future__ import annotations

from typing import Any

import jinja2
from ansible.errors import AnsibleFilterError

from labctl import topology as topo


def labctl_topology(groups: Any, hostvars: Any, gpu_source: str = "facts", bundle_packages: Any = None) -> dict[str, Any]:
    """The lab's topology (src/labctl/topology.py) from the inventory's groups and every host's
    variables and facts."""
    plain_groups = {str(k): list(v) for k, v in dict(groups).items()}
    names = set()
    for group in (topo.GPU_GROUP, topo.GATEWAY_GROUP, topo.MONITORING_GROUP, topo.LAB_GROUP):
        names.update(plain_groups.get(group) or [])
    given: dict[str, dict[str, Any]] = {}
    facts: dict[str, dict[str, Any]] = {}
    for host in sorted(names):
        hv = hostvars[host]
        given[host] = {}
        for name in topo.INPUT_VARIABLES:
            if name not in hv:
                continue
            value = hv[name]
            # A value only checked here (labctl.topology_checks) that refers to its role's defaults
            # ("{{ prometheus_port }}") is undefined outside the role: the role resolves it, the rule leaves it.
            if isinstance(value, jinja2.Undefined) and name not in topo.SETTING_VARIABLES:
                continue
            if value is not None:
                given[host][name] = value
        af = hv.get("ansible_facts", {})
        facts[host] = {n: af[n] for n in topo.INPUT_FACTS if n in af}
    try:
        return topo.lab_topology(plain_groups, given, facts, gpu_source=str(gpu_source),
                                 bundle_packages=[str(p) for p in bundle_packages or []])
    except topo.TopologyError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def labctl_of_model(given: Any, model: Any, strict: bool = True) -> list[dict[str, Any]]:
    """The replicas (lab_topology.replicas) or models (lab_topology.models) of one model, by its name
    or one of its public names; all of them when ``model`` is empty (labctl smoke and rolling-restart's
    --model). With ``strict`` (the lab's whole list) a name nothing carries is refused, naming what
    there is; a host's replicas (not strict) may hold none of that model."""
    items: list[dict[str, Any]] = [dict(i) for i in given or []]
    wanted = str(model or "")
    if not wanted:
        return items

    def names(item: dict[str, Any]) -> set[str]:
        found = {str(item.get("model") or item.get("name") or "")}
        found.update(str(n) for n in item.get("public_names") or item.get("served_names") or [item.get("public_name") or ""])
        return found - {""}

    chosen = [i for i in items if wanted in names(i)]
    if not chosen and items and strict:
        known = sorted({n for i in items for n in names(i)})
        raise AnsibleFilterError(f"--model {wanted}: no such model here (the lab serves: {', '.join(known)})")
    return chosen


def labctl_host_models(topology: Any, host: str) -> list[dict[str, Any]]:
    """The entries of lab_topology.models that ``host`` runs a replica of (what the artifacts layer
    stages there and preflight checks the bundle and the disk for); [] without lab_models (and
    without a topology: playbooks/artifacts.yml run alone passes `lab_topology | default({})`)."""
    topology = topology or {}
    here = {str(r.get("model")) for r in topology.get("replicas") or [] if r.get("host") == host}
    return [dict(m) for m in topology.get("models") or [] if str(m.get("name")) in here]


def labctl_each(items: Any, var: str, contents: Any = None, **entry: Any) -> list[dict[str, Any]]:
    """labctl_template's files entries, one per item (what a loop over labctl_template would write, in
    one task): each gets the item as the template variable `var`, and `dest` and `src` are formatted
    with it (str.format: "replica-{item[index]}.yaml", or "{item}" for a plain item). With `contents`
    (a list as long as the items) entry i holds exactly contents[i] (a generated file, not a template)."""
    if not isinstance(var, str) or not var.isidentifier():
        raise AnsibleFilterError(f"labctl_each: the variable name {var!r} is not a valid name")
    dest = entry.get("dest")
    if not isinstance(dest, str):
        raise AnsibleFilterError("labctl_each: dest (a format string) is required")
    items = list(items or [])
    if contents is not None and (isinstance(contents, str) or len(list(contents)) != len(items)):
        raise AnsibleFilterError(f"labctl_each: contents must be a list of {len(items)} texts, one per item")
    out = []
    for number, item in enumerate(items):
        one = {**entry, "vars": {**entry.get("vars", {}), var: item}}
        if contents is not None:
            one["content"] = list(contents)[number]
        for key in ("dest", "src"):
            if isinstance(entry.get(key), str):
                try:
                    one[key] = entry[key].format(item=item)
                except (KeyError, IndexError, AttributeError, ValueError) as exc:
                    raise AnsibleFilterError(f"labctl_each: {key} {entry[key]!r} does not fit the item {item!r}: {exc}") from exc
        out.append(one)
    return out


def labctl_getent(text: Any) -> dict[str, list[str]]:
    """`getent passwd` or `getent group` output (a labctl_read) in ansible.builtin.getent's shape: each
    entry's name -> its other fields, as text (passwd: password, uid, gid, gecos, home, shell)."""
    entries: dict[str, list[str]] = {}
    for line in str(text or "").splitlines():
        name, sep, rest = line.partition(":")
        if sep and name and name not in entries:  # the first entry of a name wins, as in NSS
            entries[name] = rest.split(":")
    return entries


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "labctl_topology": labctl_topology,
            "labctl_each": labctl_each,
            "labctl_of_model": labctl_of_model,
            "labctl_host_models": labctl_host_models,
            "labctl_getent": labctl_getent,
        }
