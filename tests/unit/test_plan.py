"""``labctl plan``: the memory arithmetic (labctl.plan) and the command (labctl.plan_cli).

The arithmetic is checked against source 004's worked example (one H100 80 GB at 0.95) and the
lab's machine (2 x H200 at 0.80, tests/fixtures/nvidia-smi/h200x2.json); the command against
inventories/lab through the real ansible-inventory, and once against a live labctl_gpu_facts run over a
local connection with the nvidia-smi stub.
"""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from labctl.cli import app
from labctl.plan import (
    GIB,
    MIN_KV_SHARE,
    Gpu,
    PlanError,
    VllmSettings,
    model_profile,
    plan_host,
)
from labctl.plan_cli import render_plain, render_rich
from labctl.plan_hosts import HostReport

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "nvidia-smi"
H200X2 = FIXTURES / "h200x2.json"
LAB = REPO / "inventories" / "lab"
MODEL = model_profile("gpt-oss-120b")

H100 = Gpu("NVIDIA H100 80GB", 80 * 1024)  # source 004's nominal "80 GB"
H200 = Gpu("NVIDIA H200", 143771)  # the fixture's memory.total
A100_40 = Gpu("NVIDIA A100-SXM4-40GB", 40960)
LAB_SETTINGS = VllmSettings(gpu_memory_utilization=0.80, max_model_len=128000, max_num_seqs=128)


# --- the arithmetic ---------------------------------------------------------------------------


def test_source_004_worked_example() -> None:
    """76 GB usable = 61 GB weights + 2 GB overhead + 13 GB KV; ~36 KB/token -> ~370 K tokens ->
    ~10 concurrent 32 K-token requests (the source rounds: 378,652 tokens, 11 requests here)."""
    plan = plan_host([H100], MODEL, VllmSettings(0.95, 32768, 16), request_tokens=32768)
    (replica,) = plan.replicas
    mem = replica.memory
    assert mem.budget_gib == pytest.approx(76.0)
    assert (mem.weights_gib, mem.overhead_gib) == (61.0, 2.0)
    assert mem.kv_cache_gib == pytest.approx(13.0)
    assert mem.kv_tokens == pytest.approx(370_000, rel=0.05)
    assert 10 <= replica.concurrency <= 12
    assert replica.full_context_sequences == pytest.approx(mem.kv_tokens / 32768)
    # The source's single-H100 config (--max-num-seqs 16) oversubscribes the cache at 32 K each.
    assert any("vllm_max_num_seqs 16" in w and "preempts" in w for w in replica.warnings)
    assert plan.recommendation.tensor_parallel_size == 1


def test_lab_two_h200_one_replica_per_gpu() -> None:
    plan = plan_host([H200, H200], MODEL, LAB_SETTINGS)
    assert [r.gpus for r in plan.replicas] == [(0,), (1,)]
    for replica in plan.replicas:
        mem = replica.memory
        assert mem.memory_gib == pytest.approx(140.40, abs=0.01)
        assert mem.budget_gib == pytest.approx(112.32, abs=0.01)
        assert mem.kv_cache_gib == pytest.approx(49.32, abs=0.01)
        assert mem.kv_share == pytest.approx(0.439, abs=0.001)
        assert mem.kv_tokens == 1_436_580
        assert replica.full_context_sequences == pytest.approx(11.22, abs=0.01)
        assert replica.concurrency == 603  # at the lab's 2,380 tokens per request
        assert replica.warnings == ()  # 128 x 2,380 = 304,640 tokens fit the cache
    assert plan.warnings == ()
    rec = plan.recommendation
    assert (rec.tensor_parallel_size, rec.replicas, rec.fits) == (1, 2, True)
    assert rec.reason.startswith("one replica per GPU (2 replicas")
    assert "NCCL" in rec.reason and "49.3 GiB" in rec.reason


def test_40gb_gpu_recommends_tensor_parallel_2() -> None:
    settings = VllmSettings(0.95, 32768, 24)
    plan = plan_host([A100_40, A100_40], MODEL, settings)
    rec = plan.recommendation
    assert (rec.tensor_parallel_size, rec.replicas, rec.fits) == (2, 1, True)
    assert "cannot hold the weights (61.0 GiB)" in rec.reason
    assert "over 2 GPUs each holds 30.5 GiB" in rec.reason and "smallest power-of-two" in rec.reason
    # The configured layout (one replica per GPU) does not fit, and says what to change.
    for replica in plan.replicas:
        assert replica.memory.kv_tokens == 0
        (warning,) = replica.warnings
        assert warning.startswith("does not fit") and "vllm_tensor_parallel_size" in warning


def test_tensor_parallel_group_caches_tp_times_the_tokens() -> None:
    plan = plan_host([A100_40, A100_40], MODEL, VllmSettings(0.95, 32768, 8, tensor_parallel_size=2))
    (replica,) = plan.replicas
    assert replica.gpus == (0, 1)
    assert replica.memory.weights_gib == pytest.approx(30.5)
    assert replica.memory.kv_cache_gib == pytest.approx(5.5)
    assert replica.memory.kv_tokens == int(5.5 * GIB * 2 / (36 * 1024))


def test_small_kv_share_is_named_and_too_small_host_says_what_to_change() -> None:
    # At vLLM's default 0.90, TP 2 on 40 GB cards keeps 3.5 of 36 GiB (9.7 %): still the advice
    # for a 2-GPU host (source 004's 2 x A100 40 GB config), flagged as below the wanted share.
    rec = plan_host([A100_40] * 2, MODEL, VllmSettings(0.90, 32768, 24)).recommendation
    assert rec.tensor_parallel_size == 2 and rec.fits
    assert f"below the {MIN_KV_SHARE:.0%} wanted" in rec.reason
    # At the lab's 0.80 TP 2 leaves no KV cache: TP 4 would be needed, or a higher utilization.
    rec = plan_host([A100_40] * 2, MODEL, VllmSettings(0.80, 32768, 24)).recommendation
    assert (rec.tensor_parallel_size, rec.replicas, rec.fits) == (4, 0, False)
    assert "the host has 2" in rec.reason and "vllm_gpu_memory_utilization 0.91" in rec.reason


def test_warnings_preemption_short_cache_and_settings() -> None:
    replica = plan_host([H200], MODEL, LAB_SETTINGS, request_tokens=20000).replicas[0]
    (warning,) = replica.warnings
    assert "vllm_max_num_seqs 128 x 20,000" in warning and "lower vllm_max_num_seqs to 71" in warning
    # An 80 GB H100 at the lab's 0.80 keeps 0.7 GiB: less than one 128 K sequence.
    replica = plan_host([Gpu("NVIDIA H100 80GB HBM3", 81559)], MODEL, LAB_SETTINGS).replicas[0]
    assert any("vLLM refuses to start" in w and "vllm_max_model_len" in w for w in replica.warnings)
    # More replicas than fit: none at all, as the topology (and so the deployed units) plans them.
    plan = plan_host([H200, H200], MODEL, VllmSettings(0.80, 200000, 128, replicas=3))
    assert plan.replicas == ()
    assert any("above gpt-oss-120b's context (131,072)" in w for w in plan.warnings)
    assert any(w.startswith("does not fit: vllm_replicas 3") and "no replica planned" in w for w in plan.warnings)
    plan = plan_host([H200, H200], MODEL, VllmSettings(0.80, 128000, 128, tensor_parallel_size=4))
    assert plan.replicas == () and any("no replica" in w for w in plan.warnings)


def test_bad_input_errors() -> None:
    with pytest.raises(PlanError, match="unknown model 'gpt-oss-20b': known models are gpt-oss-120b"):
        model_profile("gpt-oss-20b")
    custom = model_profile("my-model", weights_gib=10, kv_bytes_per_token=1000)
    assert (custom.weights_gib, custom.overhead_gib, custom.max_context) == (10, 2.0, None)
    assert model_profile("gpt-oss-120b", weights_gib=65).source.endswith("overridden on the command line")
    with pytest.raises(PlanError, match="vllm_gpu_memory_utilization"):
        plan_host([H200], MODEL, VllmSettings(1.5, 128000, 128))
    with pytest.raises(PlanError, match="vllm_max_num_seqs must be >= 1"):
        plan_host([H200], MODEL, VllmSettings(0.8, 128000, 0))
    with pytest.raises(PlanError, match="no GPUs"):
        plan_host([], MODEL, LAB_SETTINGS)
    with pytest.raises(PlanError, match="request tokens"):
        plan_host([H200], MODEL, LAB_SETTINGS, request_tokens=0)


def test_rich_table_fits_80_columns() -> None:
    report = HostReport("gpu01", plan_host([H200, H200], MODEL, LAB_SETTINGS), {})
    out = io.StringIO()
    render_rich([report], Console(file=out, width=80, force_terminal=False))
    text = out.getvalue()
    assert "1,436,580" in text and "recommendation: one replica per GPU" in text
    assert "…" not in text
    assert "1,436,580" in render_plain([report])


# --- the command ----------------------------------------------------------------------------------

runner = CliRunner()


def _plan(*args: str) -> Any:
    return runner.invoke(app, ["plan", *args])


def _json(*args: str) -> dict[str, Any]:
    result = _plan(*args, "--json")
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def test_cli_plain_lab_inventory_and_fixture() -> None:
    result = _plan("-i", str(LAB), "--facts", str(H200X2))
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "gpu01: 2 x NVIDIA H200 (140.4 GiB)" in out
    assert "gpu_memory_utilization 0.80, max_model_len 128,000, max_num_seqs 128" in out
    assert out.count("1,436,580") >= 2 and "warnings: none" in out
    assert "recommendation: one replica per GPU (2 replicas, tensor parallel 1)" in out


def test_cli_json_lab_inventory_and_fixture() -> None:
    data = _json("-i", str(LAB), "--facts", str(H200X2))
    (host,) = data["hosts"]
    assert host["host"] == "gpu01" and host["model"]["name"] == "gpt-oss-120b"
    assert host["settings"] == {
        "gpu_memory_utilization": 0.8, "max_model_len": 128000, "max_num_seqs": 128,
        "tensor_parallel_size": 1, "replicas": 0,
    }
    assert host["settings_origin"]["max_model_len"] == "inventory"  # lab_vllm_max_model_len (project.yml)
    assert host["settings_origin"]["tensor_parallel_size"] == "inventory"  # lab_vllm_tensor_parallel_size
    assert [r["kv_tokens"] for r in host["replicas"]] == [1_436_580, 1_436_580]
    assert host["replicas"][0]["concurrency"] == 603 and host["warnings"] == []
    assert host["recommendation"]["tensor_parallel_size"] == 1 and host["recommendation"]["fits"]


def test_cli_options_override_and_gpu_option() -> None:
    data = _json("-i", str(LAB), "--gpu", "NVIDIA H100 80GB:81920", "--gpu", "NVIDIA H100 80GB:81920",
                 "--gpu-memory-utilization", "0.95", "--max-model-len", "32768", "--max-num-seqs", "16",
                 "--request-tokens", "32768")
    host = data["hosts"][0]
    assert data["gpu_source"] == "--gpu"
    assert host["settings_origin"]["gpu_memory_utilization"] == "option"
    assert host["replicas"][0]["kv_cache_gib"] == pytest.approx(13.0)
    assert host["replicas"][0]["concurrency"] == 11
    assert "lab_expected_gpu_count" not in " ".join(host["warnings"])  # 2 given, 2 expected
    data = _json("-i", str(LAB), "--facts", str(H200X2), "--tensor-parallel-size", "2")
    (replica,) = data["hosts"][0]["replicas"]
    assert replica["gpus"] == [0, 1] and replica["weights_gib"] == 30.5


def test_cli_facts_shapes(tmp_path: Path) -> None:
    table = json.loads(H200X2.read_text())
    gpus = [{"index": int(g["index"]), "name": g["name"], "memory_total_mib": int(g["memory.total"])}
            for g in table["gpus"]]
    result = {"ansible_facts": {"gpus": gpus, "gpu_count": 2}, "changed": False}
    shapes = {
        "list.json": json.dumps(gpus),
        "facts.json": json.dumps(result),
        # What `ansible -i INV gpu_hosts -m labctl_gpu_facts > FILE` saves (warnings go to stderr).
        "adhoc.txt": "gpu01 | SUCCESS => " + json.dumps(result, indent=4) + "\n",
    }
    for name, text in shapes.items():
        (tmp_path / name).write_text(text)
        data = _json("-i", str(LAB), "--facts", str(tmp_path / name))
        assert [r["kv_tokens"] for r in data["hosts"][0]["replicas"]] == [1_436_580] * 2, name
    (tmp_path / "other.txt").write_text("gpu99 | SUCCESS => " + json.dumps(result) + "\n")
    bad = _plan("-i", str(LAB), "--facts", str(tmp_path / "other.txt"))
    assert bad.exit_code == 2 and "no GPU facts for gpu01 (hosts there: gpu99)" in bad.output
    (tmp_path / "down.txt").write_text('gpu01 | UNREACHABLE! => {"msg": "ssh: no route", "unreachable": true}\n')
    bad = _plan("-i", str(LAB), "--facts", str(tmp_path / "down.txt"))
    assert bad.exit_code == 2 and "gpu01: UNREACHABLE! ssh: no route" in bad.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-i", "/nonexistent/inventory", "--facts", str(H200X2)], "inventory /nonexistent/inventory: no such file"),
        (["-i", str(LAB), "--facts", str(FIXTURES / "na-fields.json")], "GPU 0 (NVIDIA GB10) reports no memory size"),
        (["-i", str(LAB), "--facts", str(FIXTURES / "garbage.txt")], "neither JSON nor `ansible -m labctl_gpu_facts` output"),
        (["-i", str(LAB), "--facts", "/nonexistent/facts.json"], "--facts /nonexistent/facts.json"),
        (["-i", str(LAB), "--facts", str(H200X2), "--model", "gpt-oss-20b"],
         "gpu01: --model: unknown model 'gpt-oss-20b': known models are gpt-oss-120b"),
        (["-i", str(LAB), "--gpu", "H200"], "--gpu 'H200': expected \"NAME:MiB\""),
        (["-i", str(LAB), "--gpu", "H200:1", "--facts", str(H200X2)], "give --facts or --gpu, not both"),
        (["-i", str(LAB), "--facts", str(H200X2), "--gpu-memory-utilization", "1.2"],
         "vllm_gpu_memory_utilization must be in (0, 1]"),
    ],
)
def test_cli_bad_input_exits_2(args: list[str], message: str) -> None:
    result = _plan(*args)
    assert result.exit_code == 2
    assert message in result.output


def _inventory(tmp_path: Path, hostvars: str, site: str = "") -> Path:
    """An inventory laid out like inventories/lab: the project defaults linked in, a site file."""
    inv = tmp_path / "inv"
    (inv / "group_vars" / "all").mkdir(parents=True)
    (inv / "group_vars" / "all" / "00-project.yml").symlink_to(REPO / "group_vars" / "all" / "project.yml")
    (inv / "group_vars" / "all" / "site.yml").write_text(site or "{}\n")
    (inv / "hosts.yml").write_text(
        "all:\n  children:\n    gpu_hosts:\n      hosts:\n        gpu01:\n" + hostvars
    )
    return inv


def test_cli_inventory_values_and_site_precedence(tmp_path: Path) -> None:
    inv = _inventory(
        tmp_path,
        "          lab_expected_gpu_count: 4\n          vllm_max_num_seqs: 64\n",
        site="lab_vllm_tensor_parallel_size: 2\nlab_model_name: gpt-oss-120b\n",
    )
    data = _json("-i", str(inv), "--facts", str(H200X2))
    host = data["hosts"][0]
    # The site file beats the project defaults (the repository root's group_vars/ must not).
    assert host["settings"]["tensor_parallel_size"] == 2 and host["settings"]["max_num_seqs"] == 64
    assert "lab_expected_gpu_count is 4, the GPU facts show 2 GPUs" in host["warnings"]


def test_cli_template_variable_needs_option(tmp_path: Path) -> None:
    inv = _inventory(tmp_path, "          vllm_max_model_len: \"{{ lab_context }}\"\n")
    result = _plan("-i", str(inv), "--facts", str(H200X2))
    assert result.exit_code == 2
    assert "gpu01: vllm_max_model_len is a template" in result.output and "--max-model-len" in result.output
    assert _json("-i", str(inv), "--facts", str(H200X2), "--max-model-len", "65536")["hosts"][0]["settings"][
        "max_model_len"] == 65536


def test_cli_no_gpu_hosts(tmp_path: Path) -> None:
    (tmp_path / "hosts.yml").write_text("all:\n  hosts:\n    box:\n")
    result = _plan("-i", str(tmp_path / "hosts.yml"), "--facts", str(H200X2))
    assert result.exit_code == 2 and "has no hosts in group gpu_hosts" in result.output


def test_cli_live_gpu_facts_over_local_connection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No --facts/--gpu: `ansible gpu_hosts -m labctl_gpu_facts` with the repo's library/, here against
    the nvidia-smi stub (an 8 x H100 HGX) on PATH over a local connection."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").symlink_to(FIXTURES / "nvidia-smi-stub")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("NVIDIA_SMI_STUB_DATA", str(FIXTURES / "h100x8-hgx.json"))
    monkeypatch.setenv("NVIDIA_SMI_STUB_SHARE", "/nonexistent/share")
    monkeypatch.setenv("NVIDIA_SMI_STUB_RUN", "/nonexistent/run")
    inv = _inventory(
        tmp_path,
        f"          ansible_connection: local\n          ansible_python_interpreter: {sys.executable}\n",
    )
    data = _json("-i", str(inv))
    host = data["hosts"][0]
    assert data["gpu_source"] == "labctl_gpu_facts (live)"
    assert [g["memory_mib"] for g in host["gpus"]] == [81559] * 8
    # 80 GB H100s at the lab's 0.80 keep ~0.7 GiB each: the advice is TP 2 (4 replicas).
    rec = host["recommendation"]
    assert (rec["tensor_parallel_size"], rec["replicas"], rec["fits"]) == (2, 4, True)


def _refusals_filter() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("preflight_plan", REPO / "roles" / "preflight" / "filter_plugins" / "preflight_plan.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.labctl_plan_refusals


def test_preflight_refuses_what_labctl_plan_says_cannot_start() -> None:
    """8 x H100 80 GB with the defaults: labctl plan warns that a replica's KV cache holds less
    than one vllm_max_model_len sequence; preflight's filter gives the same line, same numbers."""
    h100 = REPO / "tests" / "fixtures" / "nvidia-smi" / "h100x8-hgx.json"
    data = _json("-i", str(LAB), "--facts", str(h100))
    warnings = data["hosts"][0]["warnings"]
    gpus = [{"name": g["name"], "memory_total_mib": g["memory.total"]} for g in json.loads(h100.read_text())["gpus"]]
    refusals = _refusals_filter()(gpus, "gpt-oss-120b", {"lab_vllm_tensor_parallel_size": 1})
    assert len(refusals) == 1 and "vLLM refuses to start" in refusals[0], refusals
    assert refusals[0] in warnings, (refusals, warnings)
    assert refusals[0].startswith("replicas 0, 1, 2, 3, 4, 5, 6, 7: KV cache holds ")
    # The lab's two H200s start; an unknown model or no GPU sizes yet (no driver): nothing to refuse.
    h200 = [{"name": "NVIDIA H200", "memory_total_mib": 143771}] * 2
    assert _refusals_filter()(h200, "gpt-oss-120b", {}) == []
    assert _refusals_filter()([], "gpt-oss-120b", {}) == []
    assert _refusals_filter()(h200, "tiny-llama", {"vllm_gpu_memory_utilization": 0.3}) == []
    # A setting the host gives wins over the role default, as in the vllm role.
    (line,) = _refusals_filter()(h200, "gpt-oss-120b", {"vllm_gpu_memory_utilization": "0.46"})
    assert "KV cache holds 46,155 tokens" in line and "lower vllm_max_model_len to 46,155" in line


LAB_MODELS_SITE = """\
lab_model_name: gpt-oss-120b
lab_models:
  - {id: 0, name: gpt-oss-120b, revision: r1, classes: [interactive, batch], gpu_memory_utilization: 0.8}
  - {id: 1, name: bge-small, revision: r1, kind: embed, gpus: 1, gpu_memory_utilization: 0.15}
"""


def test_cli_shows_each_gpus_shares_of_several_models_and_filters_by_model(tmp_path: Path) -> None:
    """Issue 32: labctl plan proves the shares on a GPU fit, and --model lists one model's replicas."""
    inv = _inventory(tmp_path, "          lab_expected_gpu_count: 2\n", site=LAB_MODELS_SITE)
    plain = _plan("-i", str(inv), "--facts", str(H200X2))
    assert plain.exit_code == 0, plain.output
    assert "GPU 0: 0.80 gpt-oss-120b (vllm@0, port 8000) + 0.15 bge-small (vllm@100, port 8100) = 0.95 of 1.00" in plain.output
    assert "GPU 1: 0.80 gpt-oss-120b (vllm@1, port 8001) = 0.80 of 1.00" in plain.output
    # Beside the shares, each engine's CUDA context (Issue 39: vLLM allocates it outside gpu_memory_utilization).
    assert "= 0.95 of 1.00 (133.4 of 140.4 GiB), + 2 CUDA contexts 3.9 GiB outside the shares" in " ".join(plain.output.split())
    placement = _json("-i", str(inv), "--facts", str(H200X2), "--model", "bge-small")["hosts"][0]["placement"]
    assert [(r["model"], r["index"], r["gpus"]) for r in placement["replicas"]] == [("bge-small", 100, "0")]
    assert placement["gpu_shares"] == {"0": 0.95, "1": 0.8}
    unknown = _plan("-i", str(inv), "--facts", str(H200X2), "--model", "nope")
    assert unknown.exit_code == 2 and "--model nope: lab_models places no replica of it here" in unknown.output
    beyond = _inventory(tmp_path / "b", "          lab_expected_gpu_count: 2\n",
                        site=LAB_MODELS_SITE.replace("gpus: 1, gpu_memory_utilization: 0.15", "gpus: [1], gpu_memory_utilization: 0.3")
                        .replace("gpu_memory_utilization: 0.8}", "gpus: [0, 1], gpu_memory_utilization: 0.8}"))
    refused = _plan("-i", str(beyond), "--facts", str(H200X2))
    assert refused.exit_code == 2, refused.output
    assert "lab_models[1] (bge-small): gpus: GPU 1 of gpu01 (143771 MiB) has 0.19 of its memory left" in " ".join(refused.output.split())


def test_preflight_plans_each_model_of_lab_models_in_its_own_share() -> None:
    """Issue 32: a model with a memory profile is planned on its own GPUs with its own share; 0.46 of an
    H200 leaves gpt-oss-120b's replica less KV cache than one max-len sequence, named after the model."""
    from labctl.topology import lab_topology

    h200 = [{"name": "NVIDIA H200", "memory_total_mib": 143771}] * 2
    groups = {"lab": ["g"], "gpu_hosts": ["g"], "gateway_hosts": ["g"], "monitoring_hosts": ["g"]}
    facts = {"g": {"default_ipv4": {"address": "10.0.0.1"}, "gpu_count": 2}}

    def refusals(entries: list[dict[str, Any]]) -> list[str]:
        replicas = lab_topology(groups, {"g": {"lab_models": entries}}, facts)["replicas"]
        return list(_refusals_filter()(h200, "gpt-oss-120b", {}, replicas))

    chat = {"id": 0, "name": "gpt-oss-120b", "revision": "r1", "gpus": [0, 1]}
    embed = {"id": 1, "name": "bge-small", "revision": "r1", "kind": "embed", "gpus": [0], "gpu_memory_utilization": 0.1}
    assert refusals([{**chat, "gpu_memory_utilization": 0.8}, embed]) == []
    (line,) = refusals([{**chat, "gpu_memory_utilization": 0.46}, embed])
    assert line.startswith("gpt-oss-120b (lab_models): replicas 0, 1: KV cache holds 46,155 tokens"), line
    # The model's own max-model-len flag is what it is held to.
    assert refusals([{**chat, "gpu_memory_utilization": 0.46, "flags": {"max-model-len": 32768}}, embed]) == []
