"""The rules the roles' inputs must follow beyond what an argument spec can say.

A role's ``meta/argument_specs.yml`` states types, choices and what is required; Ansible checks
them when the role starts and preflight checks every role's up front. What a spec cannot state
(a port's range, a duration's form, an absolute path, a lower bound) is here, once: the topology
(``labctl.topology.lab_topology``) runs these rules over what each host of the lab is given and
lists what breaks them among its problems, which preflight reports before anything changes and
every layer playbook refuses (playbooks/topology.yml). No role asserts them again.

Each rule applies where its role runs: the hosts of a topology role (``gpu``, ``gateway``,
``monitoring``) or ``any`` host of the lab. A rule reads the role variable the inventory sets, else
the project variable it defaults to (``lab_*``); a value the inventory does not give is the role's
default, which a unit test holds to these rules. Secrets are not read here: reading one generates
it (group_vars/all/project.yml), so the roles that use them check them.

Stdlib only, like labctl.topology.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

# None when the value is good, else what it must be ("a Prometheus duration like 30d").
Check = Callable[[Any], str | None]


def matches(pattern: str, what: str) -> Check:
    """The value, as a string, matches ``pattern`` from its start (Jinja's ``match`` test)."""
    compiled = re.compile(pattern)

    def check(value: Any) -> str | None:
        return None if compiled.match(str(value)) else what

    return check


def at_least(low: float, kind: type = int) -> Check:
    """A number (``kind``) of at least ``low``."""
    what = f"a {'whole number' if kind is int else 'number'} of at least {low}"

    def check(value: Any) -> str | None:
        try:
            if isinstance(value, bool):
                raise ValueError
            number = kind(str(value).strip())
        except ValueError:
            return what
        return None if number >= low else what

    return check


def not_empty(what: str) -> Check:
    def check(value: Any) -> str | None:
        return None if value is not None and len(value) > 0 else what

    return check


def each(inner: Check, what: str) -> Check:
    """A list whose every entry passes ``inner``."""

    def check(value: Any) -> str | None:
        if not isinstance(value, (list, tuple)):
            return what
        return None if all(inner(v) is None for v in value) else what

    return check


PROMETHEUS_DURATION = matches(r"^([0-9]+(ms|s|m|h|d|w|y))+$", "a Prometheus duration like 30d or 5m")
PROMETHEUS_INTERVAL = matches(r"^([0-9]+(ms|s|m|h))+$", "a Prometheus duration like 15s or 1m")
ABSOLUTE = matches(r"^/.+", "an absolute path")

# variable: (where it applies, the project variable it defaults to or None, its checks)
RULES: dict[str, tuple[str, str | None, tuple[Check, ...]]] = {
    # node_exporter (every host)
    "node_exporter_collector_interval": ("any", None, (matches(r"^[0-9]+(s|min|m|h)?$", "a systemd time span like 15s"),)),
    "node_exporter_model_stores": ("any", None, (each(ABSOLUTE, "a list of absolute paths"),)),
    # prometheus (monitoring hosts)
    "prometheus_retention_time": ("monitoring", None, (PROMETHEUS_DURATION,)),
    "prometheus_scrape_interval": ("monitoring", None, (PROMETHEUS_INTERVAL,)),
    "prometheus_vllm_scrape_interval": ("monitoring", None, (PROMETHEUS_INTERVAL,)),
    "prometheus_evaluation_interval": ("monitoring", None, (PROMETHEUS_INTERVAL,)),
    "prometheus_alert_replica_down_for": ("monitoring", None, (PROMETHEUS_DURATION,)),
    "prometheus_alert_waiting_for": ("monitoring", None, (PROMETHEUS_DURATION,)),
    "prometheus_alert_kv_cache_for": ("monitoring", None, (PROMETHEUS_DURATION,)),
    "prometheus_alert_gpu_temp_for": ("monitoring", None, (PROMETHEUS_DURATION,)),
    "prometheus_alert_litellm_failure_for": ("monitoring", None, (PROMETHEUS_DURATION,)),
    "prometheus_alert_provision_stale_after": ("monitoring", None, (PROMETHEUS_DURATION,)),
    # grafana (monitoring hosts)
    "grafana_admin_user": ("monitoring", None, (not_empty("a user name (not empty)"),)),
    "grafana_spend_usd_per_mtok_input": ("monitoring", "lab_spend_usd_per_mtok_input", (at_least(0, float),)),
    "grafana_spend_usd_per_mtok_output": ("monitoring", "lab_spend_usd_per_mtok_output", (at_least(0, float),)),
    "grafana_prometheus_url": ("monitoring", None, (matches(r"^https?://", "an http:// or https:// URL"),)),
    # postgresql (gateway hosts)
    "postgresql_listen_addresses": ("gateway", None, (not_empty("a list of at least one address"),)),
    "postgresql_version": ("gateway", None, (matches(r"^([0-9]+)?$", "empty or a major version such as 16"),)),
    "postgresql_backup_retention_days": ("gateway", None, (at_least(1),)),
    "postgresql_backup_dir": ("gateway", None, (ABSOLUTE,)),
    # redis (gateway hosts)
    "redis_bind": ("gateway", None, (not_empty("a list of at least one address"),)),
    "redis_maxmemory": ("gateway", None, (matches(r"^[0-9]+([kKmMgG][bB]?)?$", "a size such as 2gb or 512mb"),)),
    "redis_save": ("gateway", None, (each(matches(r"^[0-9]+ [0-9]+$", ""), 'a list of "<seconds> <changes>" entries'),)),
    # cuda_toolkit (GPU hosts). model_weights checks its own inputs: playbooks/artifacts.yml runs it
    # without the topology.
    "cuda_toolkit_version": ("gpu", "lab_cuda_toolkit_version", (matches(r"^[0-9]+\.[0-9]+$", "a CUDA version such as 12.9"),)),
}


def _truthy(value: Any) -> bool:
    return value is True or str(value).strip().lower() in ("true", "yes", "on", "1")


def _together(given: Mapping[str, Any], roles: list[str]) -> list[str]:
    """The rules over two variables of one role."""
    problems = []
    if "gateway" in roles and given.get("postgresql_backup_databases") is not None:
        enabled = given.get("postgresql_backup_enabled", True)
        if _truthy(enabled) and len(given["postgresql_backup_databases"]) == 0:
            problems.append("postgresql_backup_databases is empty while postgresql_backup_enabled is true: name the databases to dump")
    return problems


# Every variable the rules read, for the topology's filter to pick out of hostvars.
INPUT_VARIABLES = sorted(
    set(RULES) | {project for _, project, _ in RULES.values() if project}
    | {"postgresql_backup_databases", "postgresql_backup_enabled"}
)


def problems(given: Mapping[str, Any], roles: list[str]) -> list[str]:
    """What breaks the rules among the variables one host is ``given``, for the rules of its
    topology ``roles`` (gpu, gateway, monitoring) and those of every host."""
    found = []
    for name, (where, project, checks) in RULES.items():
        if where != "any" and where not in roles:
            continue
        source = name if given.get(name) is not None else project
        if source is None or given.get(source) is None:
            continue
        value = given[source]
        for check in checks:
            what = check(value)
            if what:
                found.append(f"{source} ({value}) must be {what}")
                break
    return found + _together(given, roles)
