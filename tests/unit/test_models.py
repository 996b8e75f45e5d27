"""Several models side by side (Issue 32): lab_models checked (bad input names the
entry and the field) and placed on a host's GPUs (src/labctl/models.py): shared GPUs within their
memory, refusal beyond it, stable indices and ports when a model is added, NUMA-following groups."""

from __future__ import annotations

from typing import Any

import pytest

from labctl import models
from labctl.models import ModelsError
from labctl.topology import replica_plan

CHAT = {"id": 0, "name": "gpt-oss-120b", "revision": "main", "classes": ["interactive", "batch"],
        "gpu_memory_utilization": 0.8}
EMBED = {"id": 1, "name": "bge-small", "revision": "r1", "kind": "embed", "gpus": 1, "gpu_memory_utilization": 0.15}
BUNDLE = {"gpt-oss-120b": ["main"], "bge-small": ["r1"], "qwen3-235b": ["r"]}


def placed(entries: list[dict[str, Any]], gpus: int = 2, nodes: list[int] | None = None) -> list[dict[str, Any]]:
    return models.place(models.parse(entries, BUNDLE), "gpu01.lab.example", gpus, 8000, nodes)


def test_an_entry_gets_its_defaults() -> None:
    (m,) = models.parse([{"id": 3, "name": "qwen3-0.6b", "revision": "abc"}])
    assert m["served_names"] == ["qwen3-0.6b"] and m["classes"] == ["interactive"] and m["kind"] == "generate"
    assert m["tensor_parallel_size"] == 1 and m["gpus"] is None and m["gpu_memory_utilization"] == models.DEFAULT_UTILIZATION


def test_model_zero_keeps_the_one_model_labs_indices_ports_and_names() -> None:
    one = replica_plan(2, 1, 0, 8000, "gpt-oss-120b", "gpu01.lab.example")
    chat = placed([CHAT])
    keys = ("index", "port", "gpus", "served_model_name")
    assert [{k: r[k] for k in keys} for r in chat] == [{k: r[k] for k in keys} for r in one]


def test_a_small_model_shares_a_gpu_within_its_memory() -> None:
    replicas = placed([CHAT, EMBED])
    chat = [r for r in replicas if r["model"] == "gpt-oss-120b"]
    embed = [r for r in replicas if r["model"] == "bge-small"]
    assert [r["gpus"] for r in chat] == ["0", "1"]
    assert [(r["index"], r["port"], r["gpus"], r["kind"]) for r in embed] == [(100, 8100, "0", "embed")]
    assert embed[0]["served_model_name"] == "bge-small-gpu01-100"
    assert models.memory_plan(replicas, 2) == {0: 0.95, 1: 0.8}


def test_adding_a_model_moves_no_replica_of_another() -> None:
    before = placed([CHAT])
    after = [r for r in placed([CHAT, EMBED]) if r["model_id"] == 0]
    assert after == before
    # and removing it again gives back the same replicas
    assert placed([CHAT]) == before


@pytest.mark.parametrize(("second", "message"), [
    ({**EMBED, "gpus": [1], "gpu_memory_utilization": 0.3},
     ("lab_models[1] (bge-small): gpus: GPU 1 of gpu01.lab.example (81559 MiB) has 0.18 of its memory left beside "
      "gpt-oss-120b (0.80), not the 0.30 gpu_memory_utilization asks for and 0.024 (1994 MiB) for its engine's CUDA context")),
    ({**EMBED, "gpus": 2, "gpu_memory_utilization": 0.3},
     "lab_models[1] (bge-small): gpus=2: gpu01.lab.example has room for 0 GPU(s) of 0.30 memory and a 1994 MiB CUDA context"),
    ({**EMBED, "gpus": [2]}, "lab_models[1] (bge-small): gpus: gpu01.lab.example has 2 GPU(s), no GPU 2"),
])
def test_a_gpu_is_never_shared_beyond_its_memory(second: dict[str, Any], message: str) -> None:
    with pytest.raises(ModelsError) as caught:
        placed([{**CHAT, "gpus": [0, 1]}, second])
    assert message in str(caught.value)


def test_placement_follows_the_numa_nodes() -> None:
    # GPUs 0 and 2 on node 0, 1 and 3 on node 1: a tensor-parallel pair stays on one node.
    pairs = placed([{**CHAT, "tensor_parallel_size": 2}], gpus=4, nodes=[0, 1, 0, 1])
    assert [r["gpus"] for r in pairs] == ["0,2", "1,3"]
    # A two-socket host with eight GPUs: a four-GPU model fills node 0, the next four-GPU model node 1.
    big = {"id": 2, "name": "qwen3-235b", "revision": "r", "tensor_parallel_size": 4, "gpus": 4}
    both = placed([{**CHAT, "tensor_parallel_size": 2, "gpus": 4}, big], gpus=8, nodes=[0, 0, 0, 0, 1, 1, 1, 1])
    assert [(r["model_id"], r["gpus"]) for r in both] == [(0, "0,1"), (0, "2,3"), (2, "4,5,6,7")]
    # Without the nodes (a VM): index order.
    assert [r["gpus"] for r in placed([{**CHAT, "tensor_parallel_size": 2}], gpus=4)] == ["0,1", "2,3"]


@pytest.mark.parametrize(("entries", "message"), [
    ([CHAT, {**EMBED, "served_names": ["gpt-oss-120b"]}],
     "lab_models[1] (bge-small): served_names: 'gpt-oss-120b' is already served by lab_models[0] (gpt-oss-120b)"),
    ([CHAT, {**EMBED, "kind": "generate", "served_names": ["gpt-oss-120b-batch"]}],
     "served_names: 'gpt-oss-120b-batch' is already served by lab_models[0] (gpt-oss-120b)"),
    ([CHAT, {**EMBED, "id": 0}], "lab_models[1] (bge-small): id 0 is also lab_models[0] (gpt-oss-120b)'s"),
    ([CHAT, {**EMBED, "revision": "r2"}],
     "lab_models[1] (bge-small): bge-small@r2 is not in the bundle (it carries: bge-small@r1, gpt-oss-120b@main, qwen3-235b@r)"),
    ([{**CHAT, "gpu": 1}], "lab_models[0] (gpt-oss-120b): unknown field(s) gpu"),
    ([{**EMBED, "kind": "pooling"}], "lab_models[0] (bge-small): kind='pooling' is not one of generate, embed"),
    ([{**EMBED, "classes": ["batch"]}], "lab_models[0] (bge-small): classes: an embedding model has no batch class"),
    ([{**CHAT, "gpus": 3, "tensor_parallel_size": 2}], "gpus=3 is not a multiple of tensor_parallel_size=2"),
    ([{**CHAT, "gpus": [0, 0]}], "gpus must be a count, a list of distinct GPU indices, or omitted"),
    ([{**CHAT, "gpu_memory_utilization": 1.2}], "gpu_memory_utilization must be a share of a GPU's memory in (0, 1]"),
    ([{**CHAT, "id": 100}], "lab_models[0] (gpt-oss-120b): id=100 is out of range (0-99)"),
    ([{"name": "x", "revision": "r"}], "lab_models[0] (x): id is required"),
    ([], "lab_models must be a non-empty list"),
])
def test_bad_input_names_the_entry_and_the_field(entries: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(ModelsError) as caught:
        models.parse(entries, BUNDLE)
    assert message in str(caught.value)


def test_the_topology_serves_the_list_and_names_a_bad_entry() -> None:
    from labctl.topology import lab_topology

    groups = {"lab": ["gpu1"], "gpu_hosts": ["gpu1"], "gateway_hosts": ["gpu1"], "monitoring_hosts": ["gpu1"]}
    facts = {"gpu1": {"default_ipv4": {"address": "10.0.0.11"}, "gpu_count": 2, "processor_vcpus": 8}}
    plain = lab_topology(groups, {"gpu1": {"lab_model_name": "gpt-oss-120b"}}, facts)
    assert plain["problems"] == []
    listed = lab_topology(groups, {"gpu1": {"lab_model_name": "gpt-oss-120b", "lab_models": [CHAT, EMBED]}}, facts)
    assert listed["problems"] == []
    assert [(r["model"], r["index"], r["port"], r["gpus"]) for r in listed["replicas"]] == [
        ("gpt-oss-120b", 0, 8000, "0"), ("gpt-oss-120b", 1, 8001, "1"), ("bge-small", 100, 8100, "0")]
    assert [m["name"] for m in listed["models"]] == ["gpt-oss-120b", "bge-small"]
    assert [p["service"] for p in listed["hosts"]["gpu1"]["ports"][:3]] == ["vllm@0", "vllm@1", "vllm@100"]
    bad = lab_topology(groups, {"gpu1": {"lab_models": [CHAT, {**EMBED, "served_names": ["gpt-oss-120b"]}]}}, facts)
    assert ("gpu1: lab_models[1] (bge-small): served_names: 'gpt-oss-120b' is already served by "
            "lab_models[0] (gpt-oss-120b)") in bad["problems"]
    # without lab_models the topology is what it was, key for key (tests/unit/test_models_layers.py: byte for byte)
    assert "models" not in plain and "model" not in plain["replicas"][0]


def test_two_hosts_giving_different_lists_is_a_problem() -> None:
    from labctl.topology import lab_topology

    groups = {"lab": ["gpu1", "gpu2"], "gpu_hosts": ["gpu1", "gpu2"], "gateway_hosts": ["gpu1"], "monitoring_hosts": ["gpu1"]}
    facts = {h: {"default_ipv4": {"address": f"10.0.0.{n}"}, "gpu_count": 2} for n, h in ((11, "gpu1"), (12, "gpu2"))}
    out = lab_topology(groups, {"gpu1": {"lab_models": [CHAT, EMBED]}, "gpu2": {"lab_models": [CHAT]}}, facts)
    assert out["problems"][0] == ("gpu1: lab_models differs on gpu2: set it once for the whole lab (group_vars/all), "
                                  "the gateways route every model by it")


def test_a_model_beyond_the_gpus_memory_is_refused_by_the_topology_naming_the_gpu() -> None:
    from labctl.topology import lab_topology

    groups = {"lab": ["gpu1"], "gpu_hosts": ["gpu1"], "gateway_hosts": ["gpu1"], "monitoring_hosts": ["gpu1"]}
    facts = {"gpu1": {"default_ipv4": {"address": "10.0.0.11"}, "gpu_count": 2}}
    out = lab_topology(groups, {"gpu1": {"lab_models": [{**CHAT, "gpus": [0, 1]}, {**EMBED, "gpus": [1], "gpu_memory_utilization": 0.3}]}},
                       facts)
    assert out["problems"] == [
        ("gpu1: lab_models[1] (bge-small): gpus: GPU 1 of gpu1 (81559 MiB) has 0.18 of its memory left beside gpt-oss-120b "
         "(0.80), not the 0.30 gpu_memory_utilization asks for and 0.024 (1994 MiB) for its engine's CUDA context: vLLM "
         "allocates each engine's context outside its share, so the shares on one GPU add up to at most 1.0 less a context "
         "per engine")]
    # A model that asks for every GPU left takes those with room: the chat model on GPU 0 only, named in the plan.
    fewer = lab_topology(groups, {"gpu1": {"lab_models": [CHAT, {**EMBED, "gpus": [1], "gpu_memory_utilization": 0.3}]}}, facts)
    assert [(r["model"], r["gpus"]) for r in fewer["replicas"]] == [("gpt-oss-120b", "0"), ("bge-small", "1")]


def test_a_key_limited_to_a_model_the_lab_does_not_serve_stops_the_run_first() -> None:
    """Removing a model while keys still name it is found by the topology (preflight reports it)
    before any replica is stopped; a revoked key or one without models is no problem."""
    from labctl.topology import lab_topology

    groups = {"lab": ["gpu1"], "gpu_hosts": ["gpu1"], "gateway_hosts": ["gpu1"], "monitoring_hosts": ["gpu1"]}
    facts = {"gpu1": {"default_ipv4": {"address": "10.0.0.11"}, "gpu_count": 2}}
    keys = [{"name": "rag", "class": "interactive", "models": ["bge-small"]},
            {"name": "old", "class": "interactive", "models": ["gone"], "revoked": "2026-12-01T00:00:00+00:00"},
            {"name": "any", "class": "batch"}]
    assert lab_topology(groups, {"gpu1": {"lab_models": [CHAT, EMBED], "lab_app_keys": keys}}, facts)["problems"] == []
    without = lab_topology(groups, {"gpu1": {"lab_models": [CHAT], "lab_app_keys": keys}}, facts)["problems"]
    assert without == [("gpu1: lab_app_keys: key rag is limited to bge-small, which lab_models does not serve (it serves: "
                        "gpt-oss-120b): move it first with `labctl keys models rag --model <model>`, or revoke it")]
    one = lab_topology(groups, {"gpu1": {"lab_model_name": "gpt-oss-120b", "lab_app_keys": keys}}, facts)["problems"]
    assert one == [("gpu1: lab_app_keys: key rag is limited to models bge-small, but lab_models is not set: "
                    "`labctl keys models rag` (no --model) gives it every model of its class, or revoke it")]


# Issue 39, part 2: what a vLLM engine takes of a GPU outside its gpu_memory_utilization share (its CUDA
# context, before vLLM 0.32.0's memory snapshot: labctl.models' docstring), and the plans it rules out.
H200 = [143771, 143771]  # nvidia-smi's memory.total of an H200 (tests/fixtures/nvidia-smi)


def test_the_reserve_is_vllms_measured_context_and_profiling_margin() -> None:
    # 1.8 GiB (vllm/multimodal/video_decoders/pynvvideocodec.py) rounded up to MiB, and 150 MiB
    # (gpu_worker.py's redundancy_buffer_memory); tensor parallel adds the docstring's 0.5 GiB for NCCL.
    assert models.CONTEXT_RESERVE_MIB == -(-18 * 1024 // 10) + 150 == 1994
    assert models.engine_reserve_mib(1) == 1994 and models.engine_reserve_mib(2) == 1994 + 512
    assert models.gpu_sizes(3, [143771, None]) == {0: 143771, 1: 81559, 2: 81559}


def test_shares_adding_up_to_the_whole_gpu_are_refused_naming_the_gpu_and_its_models() -> None:
    """Today's rule (shares up to 1.0) let 0.85 + 0.15 onto one GPU: the second engine finds less than its
    share free once the first's context is there, and vLLM refuses it ("Free memory on device ... on
    startup is less than desired GPU memory utilization")."""
    with pytest.raises(ModelsError) as caught:
        models.place(models.parse([{**CHAT, "gpus": [0, 1], "gpu_memory_utilization": 0.85}, {**EMBED, "gpus": [1]}], BUNDLE),
                     "gpu01", 2, 8000, memory_mib=H200)
    assert str(caught.value).startswith(
        "lab_models[1] (bge-small): gpus: GPU 1 of gpu01 (143771 MiB) has 0.14 of its memory left beside gpt-oss-120b (0.85), "
        "not the 0.15 gpu_memory_utilization asks for and 0.014 (1994 MiB) for its engine's CUDA context")
    # With room for both contexts it fits: 0.80 + 0.15 of an H200 leaves 7.0 GiB for two of 1.9 GiB.
    fits = models.place(models.parse([{**CHAT, "gpus": [0, 1]}, {**EMBED, "gpus": [1]}], BUNDLE), "gpu01", 2, 8000, memory_mib=H200)
    assert [(r["index"], r["gpus"]) for r in fits] == [(0, "0"), (1, "1"), (100, "1")]


def test_a_model_asking_for_every_gpu_left_skips_one_without_room_for_its_context() -> None:
    # An 80 GB GPU holding 0.90 of bge-small... has 0.10 left, less than 0.08 + a context (0.024).
    small = {**EMBED, "gpus": [0], "gpu_memory_utilization": 0.9}
    chat = {**CHAT, "gpu_memory_utilization": 0.08}
    replicas = models.place(models.parse([chat, small], BUNDLE), "gpu01", 2, 8000)
    assert [(r["model"], r["gpus"]) for r in replicas] == [("gpt-oss-120b", "1"), ("bge-small", "0")]


def test_a_one_model_lab_whose_share_leaves_no_room_for_the_context_is_refused_by_the_topology() -> None:
    from labctl.topology import lab_topology

    groups = {"lab": ["gpu1"], "gpu_hosts": ["gpu1"], "gateway_hosts": ["gpu1"], "monitoring_hosts": ["gpu1"]}
    facts = {"gpu1": {"default_ipv4": {"address": "10.0.0.11"}, "gpu_count": 2,
                      "gpus": [{"index": i, "memory_total_mib": 143771} for i in range(2)]}}
    full = lab_topology(groups, {"gpu1": {"lab_model_name": "gpt-oss-120b", "vllm_gpu_memory_utilization": 1.0}}, facts)
    assert full["problems"] == [(
        "gpu1: GPU 0 of gpu1 (143771 MiB): gpt-oss-120b vllm@0 (1.00) leave 0 MiB beside the shares, less than the 1994 MiB "
        "the CUDA context of its engine takes outside them (vLLM allocates it before its memory snapshot): lower "
        "vllm_gpu_memory_utilization; GPU 1 of gpu1 (143771 MiB): gpt-oss-120b vllm@1 (1.00) leave 0 MiB beside the shares, "
        "less than the 1994 MiB the CUDA context of its engine takes outside them (vLLM allocates it before its memory "
        "snapshot): lower vllm_gpu_memory_utilization")]
    # 0.98 of an H200 leaves 2.8 GiB: room; of an 80 GB GPU (no memory facts: the fallback) 1.6 GiB: none.
    assert lab_topology(groups, {"gpu1": {"lab_vllm_gpu_memory_utilization": 0.98}}, facts)["problems"] == []
    bare = {"gpu1": {"default_ipv4": {"address": "10.0.0.11"}, "gpu_count": 2}}
    assert "lower lab_vllm_gpu_memory_utilization" in lab_topology(groups, {"gpu1": {"lab_vllm_gpu_memory_utilization": 0.98}},
                                                                     bare)["problems"][0]
    # The CPU build allocates no CUDA context: not checked.
    assert lab_topology(groups, {"gpu1": {"vllm_gpu_memory_utilization": 1.0, "vllm_flavor": "cpu"}}, facts)["problems"] == []
