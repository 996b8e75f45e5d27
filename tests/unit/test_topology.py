"""The lab's topology (src/labctl/topology.py): one computation for the roles, preflight and labctl."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from labctl import topology
from labctl.topology import TopologyError, lab_topology, replica_plan

REPO = Path(__file__).resolve().parents[2]
_SPEC = importlib.util.spec_from_file_location("labctl_filters_topology", REPO / "filter_plugins" / "labctl_filters.py")
assert _SPEC and _SPEC.loader
filters = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(filters)

PROJECT = {"lab_vllm_tensor_parallel_size": 1, "lab_vllm_replicas": 0, "lab_vllm_base_port": 8000, "lab_vllm_max_num_seqs": 128,
           "lab_model_name": "gpt-oss-120b", "lab_litellm_port": 4000, "lab_node_exporter_port": 9100,
           "lab_prometheus_port": 9090, "lab_grafana_port": 3000}


def _facts(address: str, gpus: int = 0) -> dict[str, Any]:
    return {"default_ipv4": {"address": address}, "gpu_count": gpus, "gpu_pci_count": gpus, "processor_vcpus": 8}


def test_replica_plan_one_per_gpu_with_distinct_names() -> None:
    plan = replica_plan(2, 1, 0, 8000, "gpt-oss-120b", "gpu01.lab.example")
    assert [(r["index"], r["port"], r["gpus"], r["served_model_name"], r["url"]) for r in plan] == [
        (0, 8000, "0", "gpt-oss-120b-gpu01-0", "http://127.0.0.1:8000"),
        (1, 8001, "1", "gpt-oss-120b-gpu01-1", "http://127.0.0.1:8001"),
    ]


def test_replica_plan_tensor_parallel_groups_cpu_split_and_no_silent_cap() -> None:
    plan = replica_plan(8, 4, 0, 9000, "m", "h", cpus=16, address="fd00::5")
    assert [(r["gpus"], r["cpus"]) for r in plan] == [("0,1,2,3", "0-7"), ("4,5,6,7", "8-15")]
    assert plan[1]["url"] == "http://[fd00::5]:9001"
    assert [r["cpus"] for r in replica_plan(2, 1, 2, 8000, "m", "h", cpus=2)] == ["0", "1"]
    assert replica_plan(0, 1, 0, 8000, "m", "h") == []
    # labctl plan once planned 2 of 3 here while the role planned 3: now both refuse.
    with pytest.raises(TopologyError, match="3 replicas x tensor parallel 1 need 3 GPUs, the host has 2"):
        replica_plan(2, 1, 3, 8000, "m", "h")


def test_all_in_one_host_listens_on_loopback() -> None:
    groups = {"lab": ["gpu01"], "gpu_hosts": ["gpu01"], "gateway_hosts": ["gpu01"], "monitoring_hosts": ["gpu01"]}
    topo = lab_topology(groups, {"gpu01": PROJECT}, {"gpu01": _facts("10.0.0.5", 2)})
    assert topo["problems"] == []
    assert [(r["host"], r["index"], r["url"], r["max_num_seqs"], r["public_name"]) for r in topo["replicas"]] == [
        ("gpu01", 0, "http://127.0.0.1:8000", 128, "gpt-oss-120b"), ("gpu01", 1, "http://127.0.0.1:8001", 128, "gpt-oss-120b")]
    host = topo["hosts"]["gpu01"]
    assert host["roles"] == ["gpu", "gateway", "monitoring"] and host["exporters"]["listen"] == "127.0.0.1"
    assert host["exporters"]["gpu_metrics"] == "textfile"
    assert topo["scrape"]["vllm"] == [{"host": "gpu01", "replica": "0", "target": "127.0.0.1:8000", "scheme": "http"},
                                      {"host": "gpu01", "replica": "1", "target": "127.0.0.1:8001", "scheme": "http"}]
    # Loopback: the replicas' traffic never leaves the host, no TLS.
    assert [r["tls"] for r in topo["replicas"]] == [False, False]
    assert topo["scrape"]["litellm"] == [{"host": "gpu01", "address": "10.0.0.5", "port": 4000}]


def test_three_hosts_flows_and_addresses() -> None:
    groups = {"lab": ["gw", "gpu1", "gpu2"], "gpu_hosts": ["gpu1", "gpu2"], "gateway_hosts": ["gw"], "monitoring_hosts": ["gw"]}
    hosts = {"gw": PROJECT, "gpu1": {**PROJECT, "vllm_max_num_seqs": 32}, "gpu2": {**PROJECT, "vllm_replicas": 1}}
    # Two HGX boards (NVSwitches): DCGM exporter, the bundle carrying it.
    facts = {"gw": _facts("10.0.0.1"), "gpu1": {**_facts("10.0.0.2", 2), "gpu_nvswitch": True},
             "gpu2": {**_facts("10.0.0.3", 2), "gpu_nvswitch": True}}
    topo = lab_topology(groups, hosts, facts, bundle_packages=list(topology.DCGM_PACKAGES))
    assert topo["problems"] == []
    assert [(r["host"], r["address"], r["port"], r["max_num_seqs"]) for r in topo["replicas"]] == [
        ("gpu1", "10.0.0.2", 8000, 32), ("gpu1", "10.0.0.2", 8001, 32), ("gpu2", "10.0.0.3", 8000, 128)]
    assert topo["hosts"]["gpu2"]["exporters"] == {"listen": "10.0.0.3", "node_port": 9100, "dcgm_port": 9400, "gpu_metrics": "dcgm"}
    assert topo["hosts"]["gw"]["exporters"]["listen"] == "127.0.0.1" and topo["hosts"]["gw"]["exporters"]["gpu_metrics"] == "off"
    flows = {(f["to"], f["port"]): f for f in topo["flows"]}
    assert flows[("gpu1", 8001)]["from"] == ["gw"] and flows[("gpu1", 8001)]["service"] == "vllm@1"
    assert flows[("gpu2", 9400)]["service"] == "dcgm-exporter" and flows[("gpu2", 9100)]["from"] == ["gw"]
    assert flows[("gw", 4000)]["from"] == ["clients", "gw"] and flows[("gw", 3000)]["from"] == ["clients"]
    assert topo["scrape"]["dcgm"] == [{"host": "gpu1", "target": "10.0.0.2:9400"}, {"host": "gpu2", "target": "10.0.0.3:9400"}]


def test_dcgm_runs_where_the_gpus_sit_on_nvswitches_and_the_bundle_carries_it() -> None:
    """Issue 39: auto picks DCGM exporter on an HGX board (NVSwitches: NVLink, NVSwitch and fabric
    readings only DCGM gives) when the bundle carries DCGM 4 for CUDA 13 and its exporter; a PCIe
    host (the lab's 2 x H200) keeps the nvidia-smi collector; the inventory forces either."""
    groups = {"lab": ["gw", "hgx", "pcie"], "gpu_hosts": ["hgx", "pcie"], "gateway_hosts": ["gw"], "monitoring_hosts": ["gw"]}
    facts = {"gw": _facts("10.0.0.1"), "hgx": {**_facts("10.0.0.2", 8), "gpu_nvswitch": True},
             "pcie": {**_facts("10.0.0.3", 2), "gpu_nvswitch": False}}

    def metrics(bundle: list[str] | None, **pcie: Any) -> dict[str, str]:
        topo = lab_topology(groups, {"gw": PROJECT, "hgx": PROJECT, "pcie": {**PROJECT, **pcie}}, facts, bundle_packages=bundle)
        assert topo["problems"] == [], topo["problems"]
        return {h: e["exporters"]["gpu_metrics"] for h, e in topo["hosts"].items()}

    assert metrics(list(topology.DCGM_PACKAGES)) == {"gw": "off", "hgx": "dcgm", "pcie": "textfile"}
    # A bundle without DCGM for CUDA 13 (the core and the exporter only) does not run it.
    assert metrics(["datacenter-gpu-manager-4-core", "datacenter-gpu-manager-exporter"])["hgx"] == "textfile"
    assert metrics(None)["hgx"] == "textfile"
    assert metrics(list(topology.DCGM_PACKAGES), node_exporter_gpu_source="dcgm")["pcie"] == "dcgm"
    # The gateways read every GPU host's node_exporter (its GPU faults), the DCGM exporter only Prometheus.
    topo = lab_topology(groups, {"gw": PROJECT, "hgx": PROJECT, "pcie": PROJECT}, facts, bundle_packages=list(topology.DCGM_PACKAGES))
    flows = {(f["to"], f["service"]): f["from"] for f in topo["flows"]}
    assert flows[("hgx", "node_exporter")] == ["gw"] and flows[("hgx", "dcgm-exporter")] == ["gw"]


def test_a_gpu_hosts_node_exporter_is_reachable_from_the_gateways() -> None:
    """The gateways read a GPU host's GPU faults from its node_exporter: with no monitoring host (or
    Prometheus on the GPU host itself) it still listens beyond loopback when a gateway is elsewhere,
    and the firewall's flows let that gateway in."""
    facts = {"gw": _facts("10.0.0.1"), "gpu1": _facts("10.0.0.2", 2)}
    for monitors in ([], ["gpu1"]):
        groups = {"lab": ["gw", "gpu1"], "gpu_hosts": ["gpu1"], "gateway_hosts": ["gw"], "monitoring_hosts": monitors}
        topo = lab_topology(groups, {"gw": PROJECT, "gpu1": PROJECT}, facts)
        assert topo["problems"] == [], topo["problems"]
        assert topo["hosts"]["gpu1"]["exporters"]["listen"] == "10.0.0.2"
        assert topo["hosts"]["gw"]["exporters"]["listen"] == "127.0.0.1" if monitors == [] else True
        node = next(f for f in topo["flows"] if f["to"] == "gpu1" and f["service"] == "node_exporter")
        assert node["from"] == [*monitors, "gw"]
    loopback = lab_topology({"lab": ["gw", "gpu1"], "gpu_hosts": ["gpu1"], "gateway_hosts": ["gw"], "monitoring_hosts": []},
                            {"gw": PROJECT, "gpu1": {**PROJECT, "node_exporter_listen_address": "127.0.0.1"}}, facts)
    assert loopback["problems"] == [("gpu1: its node_exporter listens on loopback only, out of reach of the gateway on gw, "
                                     "which reads its GPU faults there: set node_exporter_listen_address")]


def test_replicas_another_host_reaches_serve_https() -> None:
    """The gateway on another host: its requests and the replicas' key cross the network, so the
    replicas serve HTTPS (lab_tls_enabled) and the gateway's URLs and Prometheus's targets say so."""
    groups = {"lab": ["gw", "gpu1"], "gpu_hosts": ["gpu1"], "gateway_hosts": ["gw"], "monitoring_hosts": ["gw"]}
    facts = {"gw": _facts("10.0.0.1"), "gpu1": _facts("10.0.0.2", 2)}

    def replicas(**given: Any) -> dict[str, Any]:
        return lab_topology(groups, {"gw": PROJECT, "gpu1": {**PROJECT, **given}}, facts)

    topo = replicas()
    assert [(r["url"], r["tls"]) for r in topo["replicas"]] == [("https://10.0.0.2:8000", True), ("https://10.0.0.2:8001", True)]
    assert [t["scheme"] for t in topo["scrape"]["vllm"]] == ["https", "https"]
    # The lab's switch, a role variable over it (as an inventory or -e writes it), and a bad value.
    assert [r["url"] for r in replicas(lab_tls_enabled=False)["replicas"]] == ["http://10.0.0.2:8000", "http://10.0.0.2:8001"]
    assert [r["tls"] for r in replicas(lab_tls_enabled=False, vllm_tls_enabled="yes")["replicas"]] == [True, True]
    assert [r["tls"] for r in replicas(vllm_tls_enabled="false")["replicas"]] == [False, False]
    assert replicas(vllm_tls_enabled="maybe")["problems"] == ["gpu1: vllm_tls_enabled must be true or false, got 'maybe'"]
    # A GPU host that is also a gateway, with another gateway elsewhere: its replicas listen on its
    # address, so both gateways reach them over HTTPS.
    both = lab_topology({**groups, "gateway_hosts": ["gw", "gpu1"]}, {"gw": PROJECT, "gpu1": PROJECT}, facts)
    assert [r["url"] for r in both["replicas"]] == ["https://10.0.0.2:8000", "https://10.0.0.2:8001"]


def test_problems_name_the_variable_and_the_host() -> None:
    groups = {"lab": ["gw", "gpu1"], "gpu_hosts": ["gpu1"], "gateway_hosts": ["gw"], "monitoring_hosts": ["gw"]}
    facts = {"gw": _facts("10.0.0.1"), "gpu1": _facts("10.0.0.2", 2)}

    def problems(**given: Any) -> list[str]:
        found: list[str] = lab_topology(groups, {"gw": PROJECT, "gpu1": {**PROJECT, **given}}, facts)["problems"]
        return found

    assert problems(lab_vllm_replicas=3) == [
        "gpu1: lab_vllm_replicas=3 x lab_vllm_tensor_parallel_size=1 needs 3 GPUs, but the host has 2 (labctl_gpu_facts)"]
    assert problems(vllm_tensor_parallel_size=4) == [
        "gpu1: vllm_tensor_parallel_size=4 does not divide the GPU count 2 (labctl_gpu_facts)"]
    assert problems(vllm_base_port="80x") == ["gpu1: vllm_base_port must be a whole number, got '80x'"]
    assert problems(vllm_listen_address="127.0.0.1") == [
        "gpu1: replica 0 listens on loopback only, out of reach of the gateway on gw: set vllm_listen_address",
        "gpu1: replica 1 listens on loopback only, out of reach of the gateway on gw: set vllm_listen_address"]
    assert problems(node_exporter_listen_address="127.0.0.1") == [
        "gpu1: its exporters listen on loopback only, out of reach of Prometheus on gw: set node_exporter_listen_address"]
    assert problems(node_exporter_gpu_source="nvml") == ["gpu1: node_exporter_gpu_source='nvml' is not one of auto, dcgm, textfile, off"]
    left_out = lab_topology(groups, {"gw": PROJECT, "gpu1": PROJECT}, {"gw": _facts("10.0.0.1")})
    assert left_out["problems"] == ["gpu1: no facts: the topology needs every host of the lab in the run (left out by --limit?)"]
    no_gpus = lab_topology(groups, {"gw": PROJECT, "gpu1": PROJECT}, {"gw": _facts("10.0.0.1"), "gpu1": _facts("10.0.0.2")})
    assert no_gpus["problems"] == ["gpu1: no GPU is visible and lab_expected_gpu_count is not set for this host"]


def test_gpu_count_before_the_driver_and_on_the_control_node() -> None:
    groups = {"lab": ["gpu1"], "gpu_hosts": ["gpu1"], "gateway_hosts": ["gpu1"]}
    given = {"gpu1": {**PROJECT, "lab_expected_gpu_count": 2, "ansible_host": "192.0.2.7"}}
    # No driver yet: the PCI devices count; none either: lab_expected_gpu_count.
    pci = lab_topology(groups, given, {"gpu1": {"gpu_count": 0, "gpu_pci_count": 4, "default_ipv4": {}}})
    assert pci["hosts"]["gpu1"]["gpu_count"] == 4 and pci["hosts"]["gpu1"]["gpu_count_from"] == "labctl_gpu_facts (PCI)"
    planned = lab_topology(groups, given, {}, gpu_source="inventory")
    assert planned["hosts"]["gpu1"]["gpu_count_from"] == "lab_expected_gpu_count" and len(planned["replicas"]) == 2
    assert planned["hosts"]["gpu1"]["address"] == "192.0.2.7"


def test_the_filter_reads_hostvars_and_agrees_with_the_function() -> None:
    groups = {"lab": ["gpu1"], "gpu_hosts": ["gpu1"], "gateway_hosts": ["gpu1"], "monitoring_hosts": ["gpu1"], "all": ["gpu1"]}
    hostvars = {"gpu1": {**PROJECT, "ansible_facts": _facts("10.0.0.9", 2), "unrelated": 1}}
    via_filter = filters.labctl_topology(groups, hostvars, "facts", [])
    assert via_filter == lab_topology(groups, {"gpu1": PROJECT}, {"gpu1": _facts("10.0.0.9", 2)})


def test_setting_precedence_role_then_project_then_default() -> None:
    assert topology.setting({"vllm_base_port": 9000, "lab_vllm_base_port": 8000}, "base_port") == (9000, "vllm_base_port")
    assert topology.setting({"lab_vllm_base_port": 8100}, "base_port") == (8100, "lab_vllm_base_port")
    assert topology.setting({}, "base_port") == (8000, "vllm_base_port")
