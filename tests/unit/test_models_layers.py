"""Several models side by side (Issue 32) through the roles' own templates, rendered on this machine:

- a one-model inventory's topology, replica files, template unit and gateway config stay exactly what
  they were before lab_models existed (tests/fixtures/one-model/: rendered by commit 8dafbef, the
  last without it, with this same harness; `python3 tests/unit/test_models_layers.py --write DIR`);
- the same lab given as lab_models (its model as entry id 0, an embedding model beside it) renders
  the same files for the chat replicas, so converting and adding restart none of them, plus the
  embedding replica's (vLLM's pooling runner, its share of GPU 0, its port and unit index 100);
- the gateway publishes every served name and routes each to its own model's replicas only; a key
  limited to a model reaches that model's names only.

The stack scenario serves both models for real (molecule/stack/tests/test_stack_models.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
HARNESS = REPO / "tests" / "unit" / "render" / "serving.yml"
GOLDEN = REPO / "tests" / "fixtures" / "one-model"
BIN = Path(sys.executable).parent

# One-model labs of every shape the roles render differently: the benchmark's stand-in (one host, the
# CUDA build, loopback), the stack's (the CPU build, both GPUs on NUMA node 0) and a lab of two GPU hosts
# behind a gateway host (HTTPS replicas, TLS, two NUMA nodes).
CASES: dict[str, dict[str, Any]] = {
    "bench": {
        "hosts": {"bench": {"lab_expected_gpu_count": 2}},
        "groups": {"gpu_hosts": ["bench"], "gateway_hosts": ["bench"], "monitoring_hosts": ["bench"]},
        "vars": {"lab_vllm_base_port": 18100, "vllm_max_num_seqs": 32, "lab_litellm_database_mode": False,
                 "litellm_num_workers": 2},
        "facts": {},
    },
    "stack": {
        "hosts": {"instance": {"lab_expected_gpu_count": 2}},
        "groups": {"gpu_hosts": ["instance"], "gateway_hosts": ["instance"], "monitoring_hosts": ["instance"]},
        "vars": {"lab_model_name": "tiny-llama", "vllm_flavor": "cpu", "vllm_max_model_len": 512,
                 "vllm_max_num_batched_tokens": 2048, "vllm_max_num_seqs": 16, "vllm_extra_config": {"dtype": "bfloat16"},
                 "vllm_tool_call_parser": "hermes", "lab_litellm_database_mode": False},
        "facts": {"instance": {"processor_vcpus": 2, "gpu_numa_nodes": [0, 0], "numa_node_cpus": {"0": "0-1"}}},
    },
    "two-hosts": {
        "hosts": {"gpu01": {"lab_expected_gpu_count": 4, "ansible_host": "10.0.0.11"},
                  "gpu02": {"lab_expected_gpu_count": 4, "ansible_host": "10.0.0.12"},
                  "gw01": {"ansible_host": "10.0.0.5"}},
        "groups": {"gpu_hosts": ["gpu01", "gpu02"], "gateway_hosts": ["gw01"], "monitoring_hosts": ["gw01"]},
        "vars": {"lab_vllm_gpu_memory_utilization": 0.85, "vllm_tensor_parallel_size": 2},
        # H200s (labctl_gpu_facts' memory_total_mib): 0.85 of a tensor-parallel pair and 0.1 of an embedding model
        # leave room for their engines' CUDA contexts on them (labctl.models), not on an 80 GB GPU.
        "facts": {h: {"processor_vcpus": 64, "gpu_numa_nodes": [0, 0, 1, 1], "numa_node_cpus": {"0": "0-31", "1": "32-63"},
                      "gpus": [{"index": i, "memory_total_mib": 143771} for i in range(4)]}
                  for h in ("gpu01", "gpu02")},
    },
}


def _inventory(root: Path, case: dict[str, Any], extra: dict[str, Any] | None = None) -> Path:
    inv = root / "inventory"
    (inv / "group_vars" / "all").mkdir(parents=True)
    (inv / "group_vars" / "all" / "00-project.yml").symlink_to(REPO / "group_vars" / "all" / "project.yml")
    # The vllm role's defaults below the case's settings, as role defaults sit below an inventory's.
    (inv / "group_vars" / "all" / "01-vllm-defaults.yml").symlink_to(REPO / "roles" / "vllm" / "defaults" / "main.yml")
    (inv / "group_vars" / "all" / "site.yml").write_text(yaml.safe_dump({**case["vars"], **(extra or {})}, sort_keys=True))
    children = {group: {"hosts": {h: (case["hosts"][h] if group == "gpu_hosts" or h not in case["groups"]["gpu_hosts"] else {})
                                  for h in members}}
                for group, members in case["groups"].items()}
    (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {"lab": {"children": children}}}}, sort_keys=True))
    return inv


def _env() -> dict[str, str]:
    # The vllm role's own filters too (labctl_gpu_start_order), as they are when the role runs.
    return dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
                ANSIBLE_NOCOLOR="1",
                ANSIBLE_FILTER_PLUGINS=f"{REPO / 'filter_plugins'}{os.pathsep}{REPO / 'roles' / 'vllm' / 'filter_plugins'}")


def render(root: Path, case: dict[str, Any], extra: dict[str, Any] | None = None) -> dict[str, str]:
    """Every file the harness writes for the case, by relative path, and the gateway's config.yaml."""
    inv = _inventory(root, case, extra)
    out = root / "out"
    out.mkdir()
    facts = root / "facts.json"
    facts.write_text(json.dumps({"labctl_test_facts": case["facts"], "labctl_test_out": str(out)}))
    run = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inv), str(HARNESS), "-e", f"@{facts}"],
                         capture_output=True, text=True, cwd=REPO, env=_env(), check=False, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    files = {str(p.relative_to(out)): p.read_text() for p in sorted(out.rglob("*")) if p.is_file()}
    gateway = subprocess.run([str(BIN / "labctl"), "gateway-config", "-i", str(inv)], capture_output=True, text=True,
                             cwd=REPO, env=_env(), check=False, timeout=300)
    assert gateway.returncode == 0, gateway.stdout[-2000:] + gateway.stderr[-2000:]
    files["gateway/config.yaml"] = gateway.stdout
    return files


def _golden(name: str) -> dict[str, str]:
    base = GOLDEN / name
    return {str(p.relative_to(base)): p.read_text() for p in sorted(base.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_one_model_lab_renders_what_it_did_before_lab_models(tmp_path: Path, name: str) -> None:
    assert _golden(name) == render(tmp_path, CASES[name])


def _as_models(case: dict[str, Any], embed_share: float) -> list[dict[str, Any]]:
    """The case's one model as lab_models entry 0 (its settings as the one-model lab has them), and a
    small embedding model on one GPU of each host beside it."""
    share = float(case["vars"].get("lab_vllm_gpu_memory_utilization", 0.80))
    tp = int(case["vars"].get("vllm_tensor_parallel_size", 1))
    name = case["vars"].get("lab_model_name", "gpt-oss-120b")
    return [{"id": 0, "name": name, "revision": "r1", "classes": ["interactive", "batch"], "gpu_memory_utilization": share,
             "tensor_parallel_size": tp},
            {"id": 1, "name": "tiny-embed", "revision": "r1", "kind": "embed", "gpus": 1, "gpu_memory_utilization": embed_share}]


@pytest.fixture(scope="module")
def two_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    return {name: render(tmp_path_factory.mktemp(name), case, {"lab_models": _as_models(case, 0.1)})
            for name, case in CASES.items()}


@pytest.mark.parametrize("name", sorted(CASES))
def test_adding_a_model_leaves_every_file_of_the_other_models_replicas_as_it_was(
        two_models: dict[str, dict[str, str]], name: str) -> None:
    before, after = _golden(name), two_models[name]
    # The replicas' own files and the template unit: the same bytes, so neither converting the lab to
    # lab_models nor adding the embedding model restarts a chat replica.
    same = [path for path in before if path != "topology.json" and not path.startswith("gateway/")]
    assert same and {p: after.get(p) for p in same} == {p: before[p] for p in same}
    # The topology's chat replicas are what they were, with their model named.
    old = json.loads(before["topology.json"])["replicas"]
    new = [r for r in json.loads(after["topology.json"])["replicas"] if r["model_id"] == 0]
    assert [{k: r[k] for k in o} for r, o in zip(new, old, strict=True)] == old


def test_the_embedding_replica_runs_the_pooling_runner_in_its_share_of_gpu_0(two_models: dict[str, dict[str, str]]) -> None:
    bench = two_models["bench"]
    flags = yaml.safe_load(bench["bench/replica-100.yaml"])
    assert flags["model"] == "/srv/models/tiny-embed/current"
    assert flags["served-model-name"] == ["tiny-embed-bench-100", "tiny-embed"]
    assert (flags["port"], flags["runner"], flags["convert"], flags["gpu-memory-utilization"]) == (18200, "pooling", "embed", 0.1)
    assert "tool-call-parser" not in flags and "enable-auto-tool-choice" not in flags
    assert "CUDA_VISIBLE_DEVICES=0\n" in bench["bench/replica-100.env"]
    # The CPU build: the embedding replica shares GPU 0's cores (node 0's first half) with chat replica 0.
    stack = two_models["stack"]
    assert "VLLM_CPU_OMP_THREADS_BIND=0\n" in stack["instance/replica-100.env"]
    assert stack["instance/vllm@100-labctl-numa.conf"].count("CPUAffinity=0-1") == 1
    # Two hosts: one embedding replica per host, on HTTPS like the chat replicas.
    topology = json.loads(two_models["two-hosts"]["topology.json"])
    embed = [(r["host"], r["index"], r["gpus"], r["url"]) for r in topology["replicas"] if r["model"] == "tiny-embed"]
    assert embed == [("gpu01", 100, "0", "https://10.0.0.11:8100"), ("gpu02", 100, "0", "https://10.0.0.12:8100")]
    assert [m["name"] for m in topology["models"]] == ["gpt-oss-120b", "tiny-embed"]
    assert topology["problems"] == []


def test_the_replicas_of_a_shared_gpu_start_one_after_another_each_serving_first(two_models: dict[str, dict[str, str]]) -> None:
    """Issue 39: GPU 0 holds chat replica 0 and the embedding replica 100. Replica 0 counts as started only
    once it serves (ExecStartPost: the readiness wait on its own URL), replica 100 starts after it; chat
    replica 1, alone on GPU 1, gets no drop-in and starts with replica 0 (a one-model lab renders none:
    test_a_one_model_lab_renders_what_it_did_before_lab_models)."""
    bench = two_models["bench"]
    drop_ins = sorted(path for path in bench if path.endswith("labctl-gpu-order.conf"))
    assert drop_ins == ["bench/vllm@0-labctl-gpu-order.conf", "bench/vllm@100-labctl-gpu-order.conf"]
    first, second = (bench[path] for path in drop_ins)
    settings = [line for line in first.splitlines() if line and not line.startswith("#")]
    assert settings == ["[Service]",
                        "ExecStartPost=+/opt/labctl/vllm/venv-test/bin/python /opt/labctl/vllm/labctl-vllm-ready http://127.0.0.1:18100"]
    assert [line for line in second.splitlines() if line and not line.startswith("#")] == ["[Unit]", "After=vllm@0.service"]
    # HTTPS replicas: the wait verifies the replica's certificate against the lab's CA.
    two = two_models["two-hosts"]
    # As root ("+"): the firewall lets only root, the gateway and Prometheus reach a replica's port.
    assert ("ExecStartPost=+/opt/labctl/vllm/venv-test/bin/python /opt/labctl/vllm/labctl-vllm-ready https://10.0.0.11:8000 "
            "/etc/labctl/tls/ca.crt") in two["gpu01/vllm@0-labctl-gpu-order.conf"]
    assert "After=vllm@0.service" in two["gpu01/vllm@100-labctl-gpu-order.conf"]
    assert not any(path.endswith("labctl-gpu-order.conf") for path in _golden("two-hosts"))


def test_the_gateway_routes_each_name_to_its_own_models_replicas(two_models: dict[str, dict[str, str]]) -> None:
    config = yaml.safe_load(two_models["bench"]["gateway/config.yaml"])
    routes: dict[str, set[str]] = {}
    for deployment in config["model_list"]:
        routes.setdefault(deployment["model_name"], set()).add(deployment["litellm_params"]["api_base"])
    assert routes == {"gpt-oss-120b": {"http://127.0.0.1:18100/v1", "http://127.0.0.1:18101/v1"},
                      "gpt-oss-120b-batch": {"http://127.0.0.1:18100/v1", "http://127.0.0.1:18101/v1"},
                      "tiny-embed": {"http://127.0.0.1:18200/v1"}}
    two = yaml.safe_load(two_models["two-hosts"]["gateway/config.yaml"])
    embed = {d["litellm_params"]["api_base"] for d in two["model_list"] if d["model_name"] == "tiny-embed"}
    assert embed == {"https://10.0.0.11:8100/v1", "https://10.0.0.12:8100/v1"}


def test_a_one_entry_list_serves_the_one_model_lab_unchanged(tmp_path: Path) -> None:
    case = CASES["stack"]
    listed = render(tmp_path, case, {"lab_models": _as_models(case, 0.1)[:1]})
    before = _golden("stack")
    for path, text in before.items():
        if path == "topology.json":
            continue
        assert listed[path] == text, path


if __name__ == "__main__" and sys.argv[1:2] == ["--write"]:
    # Golden files: run by the commit whose one-model output they record (see the docstring).
    import tempfile

    target = Path(sys.argv[2])
    for case_name, case_value in CASES.items():
        with tempfile.TemporaryDirectory() as work:
            rendered = render(Path(work), case_value)
        shutil.rmtree(target / case_name, ignore_errors=True)
        for rel, text in rendered.items():
            (target / case_name / rel).parent.mkdir(parents=True, exist_ok=True)
            (target / case_name / rel).write_text(text)
        print(f"{case_name}: {len(rendered)} files")
