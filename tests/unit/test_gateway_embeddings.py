"""/v1/embeddings, the route lab_models opened for embedding models (kind embed), through the real
LiteLLM 1.106.0 proxy with the litellm role's config and callbacks (gateway_proxy.py), in front of a
replica stand-in that answers as vLLM's pooling runner does (recording_replica.py, kind embed): a
client with a valid key cannot choose the priority the replica receives whatever field carries it,
nor reach the model by a name outside the body or a -batch name it does not have (an embedding
model has no batch class), and the master key's requests carry the class's priority too."""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .gateway_proxy import MASTER, Gateway, install_keys, running_gateway
from .test_gateway_through_proxy import PRIORITY_FIELDS, _check, _probe

EMBED = "tiny-embed"
INTERACTIVE = 0
VARIABLES: dict[str, Any] = {
    "vllm_max_num_seqs": 4, "litellm_num_workers": 1, "litellm_admission_slots_factor": 1.0,
    "litellm_admission_queue_timeout": 3, "litellm_admission_retry_after": 7,
    "lab_models": [{"id": 0, "name": EMBED, "revision": "r1", "kind": "embed"}]}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with running_gateway(tmp_path_factory.mktemp("gateway"), VARIABLES) as gw:
        yield gw


@pytest.fixture(scope="module")
def keys(gateway: Gateway, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """An interactive key (the only class an embedding model has), sent as the role sends it (app-keys.json)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "roles" / "litellm" / "filter_plugins"))
    from litellm_filters import labctl_model_classes

    models = [{"name": EMBED, "served_names": [EMBED], "classes": ["interactive"], "kind": "embed"}]
    return install_keys(gateway, tmp_path_factory.mktemp("store"), {"retrieval": ("interactive", {})},
                        labctl_model_classes(models, []))


def test_the_gateway_serves_the_embedding_model_as_one_interactive_class(gateway: Gateway) -> None:
    """lab_models kind embed: one public name, priority 0, no -batch name (the gateway's config)."""
    assert sorted({(d["model_name"], d["litellm_params"]["extra_body"]["priority"]) for d in gateway.deployments()}) == [(EMBED, 0)]


def test_an_embedding_is_served_at_the_keys_class(gateway: Gateway, keys: dict[str, str]) -> None:
    """The baseline: the interactive key gets its embedding, the replica receives priority 0; a list input too."""
    assert _probe(gateway, keys["retrieval"], "/v1/embeddings", EMBED, {})[:2] == (200, [INTERACTIVE])
    marker = f"list-{uuid.uuid4().hex}"
    status, _, text = gateway.request("/v1/embeddings", keys["retrieval"], {"model": EMBED, "input": [f"a {marker}", "b"]})
    received = [r["body"].get("priority", 0) for r in gateway.recorder.marked(marker)]
    assert (status, received, len(json.loads(text)["data"])) == (200, [INTERACTIVE], 2), text


def test_a_client_cannot_set_or_remove_the_priority_of_an_embedding(gateway: Gateway, keys: dict[str, str]) -> None:
    """Every field that carries a priority elsewhere, on /v1/embeddings and /embeddings."""
    probes = [(f"{name} on {path}", path, EMBED, extra, "", False)
              for path in ("/v1/embeddings", "/embeddings") for name, extra in PRIORITY_FIELDS]
    _check(gateway, keys["retrieval"], INTERACTIVE, probes)


def test_no_other_name_reaches_the_embedding_model(gateway: Gateway, keys: dict[str, str]) -> None:
    """Names the gateway does not serve for it (no -batch name), or a model named outside the body."""
    probes: list[tuple[str, str, str | None, dict[str, Any], str, bool]] = [
        ("<name>-batch", "/v1/embeddings", f"{EMBED}-batch", {}, "", False),
        ("?model=<name>-batch", "/v1/embeddings", EMBED, {}, f"?model={EMBED}-batch", False),
        ("?model=<deployment id>", "/v1/embeddings", EMBED, {}, f"?model={gateway.deployment_id(EMBED)}", False),
        ("/engines/<name>-batch/", f"/engines/{EMBED}-batch/embeddings", EMBED, {}, "", False),
        ("body model <deployment name>", "/v1/embeddings", gateway.deployment_name(EMBED), {}, "", False),
    ]
    _check(gateway, keys["retrieval"], INTERACTIVE, probes)


def test_a_generation_request_for_the_embedding_model_gets_no_answer(gateway: Gateway, keys: dict[str, str]) -> None:
    """Chat, completions and responses for the embedding model: its replica has none of those routes
    (vLLM's pooling runner) and answers 404, which the client gets; nothing it sends sets the priority.
    Those six 404s leave the replica in service: LiteLLM's default cools a deployment down after three
    failures of a type its policy does not name, which took the model away for everyone until
    litellm_allowed_fails_policy named NotFoundError."""
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/responses"):
        for key, extra in ((keys["retrieval"], {}), (MASTER, {"priority": -9})):
            status, received, text = _probe(gateway, key, path, EMBED, extra)
            assert status == 404 and received == [INTERACTIVE], (path, extra, status, received, text)
    status, received, text = _probe(gateway, keys["retrieval"], "/v1/embeddings", EMBED, {})
    assert (status, received) == (200, [INTERACTIVE]), text


def test_the_master_keys_embeddings_carry_the_class_priority(gateway: Gateway) -> None:
    probes = [(f"master {name}", "/v1/embeddings", EMBED, extra, "", False) for name, extra in PRIORITY_FIELDS if "-9.5" not in name]
    _check(gateway, MASTER, INTERACTIVE, probes)
