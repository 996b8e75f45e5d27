"""What the roles take from one another through the topology (src/labctl/topology.py): every port,
the drain directory, the accounts, the hosts of a role's groups, the settings preflight checks, and
the rules of the inputs beyond the argument specs (src/labctl/topology_checks.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from labctl import topology, topology_checks
from labctl.topology import lab_topology

REPO = Path(__file__).resolve().parents[2]
PROJECT = {"lab_vllm_base_port": 8000, "lab_litellm_port": 4000, "lab_postgres_port": 5432, "lab_redis_port": 6379,
           "lab_prometheus_port": 9090, "lab_grafana_port": 3000, "lab_node_exporter_port": 9100, "lab_model_name": "gpt-oss-120b",
           "lab_model_revision": "r1", "lab_model_root": "/srv/models"}
SPLIT = {"lab": ["gw", "gpu1", "gpu2"], "gpu_hosts": ["gpu1", "gpu2"], "gateway_hosts": ["gw"], "monitoring_hosts": ["gw"]}


def _facts(address: str, gpus: int = 0) -> dict[str, Any]:
    return {"default_ipv4": {"address": address}, "gpu_count": gpus, "processor_vcpus": 8}


FACTS = {"gw": _facts("10.0.0.10"), "gpu1": _facts("10.0.0.11", 2), "gpu2": _facts("10.0.0.12", 2)}


def _topology(groups: dict[str, list[str]] = SPLIT, **host_vars: dict[str, Any]) -> dict[str, Any]:
    hosts = {h: {**PROJECT, **host_vars.get(h, {})} for h in FACTS}
    return lab_topology(groups, hosts, FACTS)


def test_postgresql_and_redis_ports_are_the_gateways_and_the_role_variable_wins() -> None:
    topo = _topology()
    assert topo["problems"] == []
    gw = topo["hosts"]["gw"]
    assert (gw["litellm_port"], gw["postgresql_port"], gw["redis_port"]) == (4000, 5432, 6379)
    assert "postgresql_port" not in topo["hosts"]["gpu1"]
    assert [(p["service"], p["port"], p["name"]) for p in gw["ports"]] == [
        ("litellm", 4000, "lab_litellm_port"), ("postgresql", 5432, "lab_postgres_port"), ("redis", 6379, "lab_redis_port"),
        ("prometheus", 9090, "lab_prometheus_port"), ("grafana", 3000, "lab_grafana_port"),
        ("node_exporter", 9100, "lab_node_exporter_port")]
    moved = _topology(gw={"postgresql_port": 5433, "redis_port": "6380"})["hosts"]["gw"]
    assert (moved["postgresql_port"], moved["redis_port"]) == (5433, 6380)
    bad = _topology(gw={"redis_port": 70000})
    assert "gw: redis_port=70000 is out of range (1-65535)" in bad["problems"]


def test_two_services_on_one_port_are_a_problem_of_that_host() -> None:
    topo = _topology(gw={"redis_port": 5432}, gpu1={"lab_node_exporter_port": 8001})
    assert "gw: port clash: lab_postgres_port and redis_port all use port 5432" in topo["problems"]
    assert "gpu1: port clash: vLLM replica 1 (lab_vllm_base_port+1) and lab_node_exporter_port all use port 8001" in topo["problems"]
    # The replicas' ports as asked, even when the plan is refused (3 replicas on 2 GPUs).
    refused = _topology(gpu2={"vllm_replicas": 3, "lab_node_exporter_port": 8002})
    assert "gpu2: port clash: vLLM replica 2 (lab_vllm_base_port+2) and lab_node_exporter_port all use port 8002" in refused["problems"]
    # DCGM exporter's port counts where it runs.
    hgx = {h: {**f, "gpu_nvswitch": True} if h != "gw" else f for h, f in FACTS.items()}  # DCGM runs on NVSwitch boards
    dcgm = lab_topology(SPLIT, {h: {**PROJECT, "node_exporter_dcgm_port": 9100} for h in FACTS}, hgx,
                        bundle_packages=list(topology.DCGM_PACKAGES))
    assert "gpu1: port clash: lab_node_exporter_port and node_exporter_dcgm_port all use port 9100" in dcgm["problems"]
    assert not any(p.startswith("gw: port clash") for p in dcgm["problems"])  # no GPU metrics there


def test_the_drain_directory_and_the_replicas_clients_come_from_the_topology() -> None:
    topo = _topology(gw={"litellm_user": "proxy"})
    assert topo["drain_dir"] == topology.DRAIN_DIR == "/run/labctl/drain"
    assert topo["hosts"]["gw"]["replica_clients"] == ["root", "proxy", "prometheus"]
    assert topo["hosts"]["gpu1"]["replica_clients"] == ["root"]
    assert topo["groups"] == {"gpu": ["gpu1", "gpu2"], "gateway": ["gw"], "monitoring": ["gw"], "lab": ["gw", "gpu1", "gpu2"]}


def test_the_groups_a_role_takes_its_peers_from_resolve_in_the_topology() -> None:
    groups = {**SPLIT, "gpu_a": ["gpu1"]}
    topo = _topology(groups, gw={"litellm_upstream_group": "gpu_a", "prometheus_vllm_group": "gpu_a", "prometheus_node_group": "nothing"})
    gw = topo["hosts"]["gw"]
    assert gw["upstream_hosts"] == ["gpu1"]
    assert gw["scrape_hosts"] == {"vllm": ["gpu1"], "litellm": ["gw"], "node": []}
    assert [h["gpu_checks"] for h in topo["hosts"].values()] == [False, True, True]
    default = _topology()["hosts"]["gw"]
    assert default["upstream_hosts"] == ["gpu1", "gpu2"]
    assert default["scrape_hosts"] == {"vllm": ["gpu1", "gpu2"], "litellm": ["gw"], "node": ["gw", "gpu1", "gpu2"]}
    # A gateway whose group holds no replica: the litellm role's old refusal, now the topology's.
    none = _topology(groups, gw={"litellm_upstream_group": "monitoring_hosts"})
    assert none["problems"] == [
        "gw: No replica behind the gateway: no host of monitoring_hosts (litellm_upstream_group) has a vLLM replica"]


def test_the_settings_preflight_checks_are_resolved_once() -> None:
    topo = _topology(gpu1={"model_weights_revision": "r2", "tiktoken_cache_source_dir": "/srv/src",
                           "nvidia_driver_kernel_module_managed": False, "vllm_max_model_len": 4096,
                           "lab_vllm_gpu_memory_utilization": 0.5, "firewall_control_node_address": "10.0.0.1",
                           "nvidia_driver_version": "580.95.05-1", "vllm_cuda_home": "/usr/local/cuda-13.0"})
    gpu1, gpu2 = topo["hosts"]["gpu1"], topo["hosts"]["gpu2"]
    assert gpu1["artifacts"] == {"model_name": "gpt-oss-120b", "model_revision": "r2", "model_root": "/srv/models",
                                 "model_source": "bundle", "tiktoken_encodings": ["o200k_base", "cl100k_base"],
                                 "tiktoken_source_dir": "/srv/src"}
    assert gpu2["artifacts"]["model_revision"] == "r1" and gpu2["artifacts"]["tiktoken_source_dir"] is None
    assert gpu1["driver"] == {"kernel_module_managed": False, "install_kernel_headers": True, "secure_boot_key": "",
                              "driver_version": "580.95.05-1"}
    # What preflight checks of the replicas' CUDA line (roles/preflight/filter_plugins/preflight_cuda.py).
    assert gpu1["serving"] == {"flavor": "cuda", "cuda_home": "/usr/local/cuda-13.0"}
    assert gpu2["serving"] == {"flavor": "cuda", "cuda_home": ""} and gpu2["driver"]["driver_version"] == ""
    assert gpu1["plan_inputs"] == {"vllm_max_model_len": 4096, "lab_vllm_gpu_memory_utilization": 0.5}
    assert (gpu1["control_node_address"], gpu2["control_node_address"]) == ("10.0.0.1", "")


BAD = [
    ("gw", "prometheus_retention_time", "30days", "prometheus_retention_time (30days) must be a Prometheus duration like 30d or 5m"),
    ("gw", "prometheus_alert_kv_cache_for", "10x", "prometheus_alert_kv_cache_for (10x) must be a Prometheus duration"),
    ("gw", "prometheus_scrape_interval", "1d", "prometheus_scrape_interval (1d) must be a Prometheus duration like 15s or 1m"),
    ("gw", "grafana_admin_user", "", "grafana_admin_user () must be a user name (not empty)"),
    ("gw", "grafana_prometheus_url", "127.0.0.1:9090", "grafana_prometheus_url (127.0.0.1:9090) must be an http:// or https:// URL"),
    ("gw", "lab_spend_usd_per_mtok_input", -1, "lab_spend_usd_per_mtok_input (-1) must be a number of at least 0"),
    ("gw", "postgresql_version", "16.2", "postgresql_version (16.2) must be empty or a major version such as 16"),
    ("gw", "postgresql_backup_retention_days", 0, "postgresql_backup_retention_days (0) must be a whole number of at least 1"),
    ("gw", "postgresql_backup_dir", "backups", "postgresql_backup_dir (backups) must be an absolute path"),
    ("gw", "postgresql_listen_addresses", [], "postgresql_listen_addresses ([]) must be a list of at least one address"),
    ("gw", "redis_maxmemory", "2 GB", "redis_maxmemory (2 GB) must be a size such as 2gb or 512mb"),
    ("gw", "redis_save", ["3600"], "redis_save (['3600']) must be a list of \"<seconds> <changes>\" entries"),
    ("gw", "redis_bind", [], "redis_bind ([]) must be a list of at least one address"),
    ("gpu1", "node_exporter_collector_interval", "15 s", "node_exporter_collector_interval (15 s) must be a systemd time span like 15s"),
    ("gw", "node_exporter_model_stores", ["srv/models"], "node_exporter_model_stores (['srv/models']) must be a list of absolute paths"),
    ("gpu1", "cuda_toolkit_version", "12", "cuda_toolkit_version (12) must be a CUDA version such as 12.9"),
    ("gpu1", "lab_cuda_toolkit_version", "twelve", "lab_cuda_toolkit_version (twelve) must be a CUDA version such as 12.9"),
]


@pytest.mark.parametrize(("host", "name", "value", "message"), BAD, ids=[b[1] for b in BAD])
def test_a_value_that_breaks_a_rule_is_a_problem_naming_the_variable(host: str, name: str, value: Any, message: str) -> None:
    problems = _topology(**{host: {name: value}})["problems"]
    assert any(p.startswith(f"{host}: {message}") for p in problems), problems


def test_a_rule_applies_where_its_role_runs_and_the_role_variable_wins() -> None:
    # Prometheus runs on the monitoring host only; cuda_toolkit on the GPU hosts.
    assert _topology(gpu1={"prometheus_retention_time": "30days"}, gw={"cuda_toolkit_version": "x"})["problems"] == []
    # The role variable wins over the project variable it defaults to: only its value is checked.
    assert _topology(gpu1={"lab_cuda_toolkit_version": "twelve", "cuda_toolkit_version": "12.9"})["problems"] == []
    assert _topology(gw={"postgresql_backup_databases": []})["problems"] == [
        "gw: postgresql_backup_databases is empty while postgresql_backup_enabled is true: name the databases to dump"]
    assert _topology(gw={"postgresql_backup_databases": [], "postgresql_backup_enabled": "false"})["problems"] == []


def _role_defaults() -> dict[str, Any]:
    found: dict[str, Any] = {}
    for path in sorted((REPO / "roles").glob("*/defaults/main.yml")):
        found.update(yaml.safe_load(path.read_text()) or {})
    return found


def _role_specs() -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for path in sorted((REPO / "roles").glob("*/meta/argument_specs.yml")):
        found.update(yaml.safe_load(path.read_text())["argument_specs"]["main"]["options"])
    return found


def test_the_roles_defaults_follow_the_rules() -> None:
    """A value the inventory does not give is the role's default: the rules hold it too."""
    defaults = _role_defaults()
    for name, (_, _, checks) in topology_checks.RULES.items():
        value = defaults.get(name)
        if value is None or "{{" in str(value):
            continue
        assert all(check(value) is None for check in checks), f"{name}: the role's default {value!r} breaks its rule"


def test_every_variable_the_topology_reads_is_a_declared_role_or_project_variable() -> None:
    specs = _role_specs()
    project = yaml.safe_load((REPO / "roles" / "preflight" / "files" / "project_argument_specs.yml").read_text())
    declared = set(specs) | set(project["argument_specs"]["main"]["options"]) | {"ansible_host"}
    assert set(topology.INPUT_VARIABLES) - declared == set()


def test_a_built_in_default_is_the_role_default() -> None:
    """The topology's default for a role variable is the role's (its defaults/main.yml, else, for a
    topology input the role does not default itself, its argument spec)."""
    import re

    defaults, specs = _role_defaults(), _role_specs()
    compared = 0
    for key, (role_var, project_var, default) in topology.SETTINGS.items():
        role_default = defaults.get(role_var, specs.get(role_var, {}).get("default"))
        if role_default is None or default in (None, ""):
            continue
        # "{{ lab_litellm_port | default(4000) }}": the same project variable, then the same literal.
        chained = re.fullmatch(r"\{\{ (lab_\w+) \| default\(([^()]+)\) \}\}", str(role_default))
        if chained:
            assert chained.group(1) == project_var, \
                f"{key}: the role defaults {role_var} to {chained.group(1)}, the topology to {project_var}"
            role_default = yaml.safe_load(chained.group(2))
        elif "{{" in str(role_default):
            continue
        assert str(role_default) == str(default), f"{key}: the topology defaults {role_var} to {default!r}, the role to {role_default!r}"
        compared += 1
    assert compared >= 20


def test_the_play_reads_the_rules_inputs_and_leaves_a_value_only_its_role_resolves(tmp_path: Path) -> None:
    """Through playbooks/topology.yml and the labctl_topology filter: a bad value in the inventory
    is a problem of the published topology; a value that refers to its role's defaults (undefined
    outside the role) is left to the role."""
    import json
    import os
    import subprocess
    import sys

    inventory = tmp_path / "inventory"
    (inventory / "group_vars" / "all").mkdir(parents=True)
    (inventory / "group_vars" / "all" / "00-project.yml").symlink_to(REPO / "group_vars" / "all" / "project.yml")
    (inventory / "group_vars" / "all" / "site.yml").write_text(yaml.safe_dump({
        "lab_expected_gpu_count": 2, "prometheus_retention_time": "30days",
        "grafana_prometheus_url": "http://127.0.0.1:{{ prometheus_port }}"}))
    (inventory / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {"lab": {"children": {
        group: {"hosts": {"gpu01": None}} for group in ("gpu_hosts", "gateway_hosts", "monitoring_hosts")}}}}}))
    play = tmp_path / "play.yml"
    play.write_text(
        f"- name: The topology\n  ansible.builtin.import_playbook: {REPO / 'playbooks' / 'topology.yml'}\n"
        "  vars: {lab_topology_gpu_source: inventory, lab_topology_report: preflight, ansible_connection: local}\n"
        "- name: Write it\n  hosts: lab\n  gather_facts: false\n  connection: local\n  tasks:\n"
        "    - {name: Write, ansible.builtin.copy: {content: '{{ lab_topology | to_json }}', "
        f"dest: {tmp_path}/t.json, mode: '0644'}}}}\n")
    bin_dir = Path(sys.executable).parent
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), HOME=str(tmp_path), ANSIBLE_NOCOLOR="1")
    command = [str(bin_dir / "ansible-playbook"), "-i", str(inventory), str(play), "-e", f"ansible_python_interpreter={sys.executable}"]
    run = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, timeout=300, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    topo = json.loads((tmp_path / "t.json").read_text())
    assert topo["problems"] == ["gpu01: prometheus_retention_time (30days) must be a Prometheus duration like 30d or 5m"]
    assert topo["hosts"]["gpu01"]["postgresql_port"] == 5432 and topo["drain_dir"] == "/run/labctl/drain"
