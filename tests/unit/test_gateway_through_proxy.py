"""A client with a valid key, through the real LiteLLM 1.106.0 proxy with the litellm role's own
config and callbacks (gateway_proxy.py), in front of a replica stand-in that records what vLLM
would receive (recording_replica.py): every place LiteLLM 1.106.0 reads a model or a priority from
(the research for issue 29, from the pinned wheel's source: the URL's ?model=, path models,
deployment ids and names, comma lists, client fallbacks and router_settings_override; extra_body,
priority, additional_drop_params, allowed_openai_params) is either refused, with nothing sent to
the replica, or served at the key's class, the replica receiving that class's priority. Also the
per-key concurrency limit, the admission gate's slots (no request frees another's) and its
Retry-After on every route, a key with non-ASCII characters, and the UI sign-in. Issue 40: a key's own
api_key, logprobs beyond its class's limits (prompt logprobs at all), and the replica's address in
/v1/model/info and in the answers' headers."""

from __future__ import annotations

import concurrent.futures
import json
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from .gateway_proxy import MASTER, VLLM_KEY, Gateway, install_keys, running_gateway
from .recording_replica import vllm_priority

INTERACTIVE, BATCH = 0, 10
# One replica of 4 sequences; the gate admits 4 (factor 1.0, one worker) and lets a request wait 3 s,
# then 503 with Retry-After: 7. An application key holds at most 2 requests by default (0.5 x 4 slots).
SLOTS = 4
VARIABLES = {"vllm_max_num_seqs": SLOTS, "litellm_num_workers": 1, "litellm_admission_slots_factor": 1.0,
             "litellm_admission_queue_timeout": 3, "litellm_admission_retry_after": 7}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with running_gateway(tmp_path_factory.mktemp("gateway"), VARIABLES) as gw:
        yield gw


@pytest.fixture(scope="module")
def keys(gateway: Gateway, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Application keys made with labctl's store and sent as the role sends them (app-keys.json)."""
    classes = [{"name": gateway.model_of(INTERACTIVE), "priority": INTERACTIVE, "key_class": "interactive"},
               {"name": gateway.model_of(BATCH), "priority": BATCH, "key_class": "batch"}]
    return install_keys(gateway, tmp_path_factory.mktemp("store"), {
        "notebook": ("interactive", {}), "nightly": ("batch", {}), "wide": ("batch", {"max_parallel": 3})}, classes)


def _text(marker: str, path: str) -> dict[str, Any]:
    """The request's text field for ``path``, holding ``marker``."""
    if "embeddings" in path:
        return {"input": f"say ok {marker}"}
    if "responses" in path:
        return {"input": f"say ok {marker}", "max_output_tokens": 4}
    if path.endswith("/completions") and "chat" not in path:
        return {"prompt": f"say ok {marker}", "max_tokens": 4}
    return {"messages": [{"role": "user", "content": f"say ok {marker}"}], "max_tokens": 4}


def _probe(gw: Gateway, key: str, path: str, model: str | None, extra: dict[str, Any], query: str = "",
           stream: bool = False, hold: float = 0) -> tuple[int, list[int | None], str]:
    """Send one request (the replica answers it ``hold`` seconds later); returns its status, the
    priorities the replica received for it (vLLM's reading of each body: no field is 0), and the
    answer's start."""
    marker = f"probe-{uuid.uuid4().hex}" + (f" hold={hold}" if hold else "")
    body = {**({"model": model} if model is not None else {}), **_text(marker, path), **extra}
    if stream:
        body["stream"] = True
    status, _, text = gw.request(path + query, key, body)
    received = [vllm_priority(r["body"].get("priority", 0)) for r in gw.recorder.marked(marker)]
    return status, received, text[:300]


RUNTIME_FAULT = "bad argument to internal function"


def _log_tail(gw: Gateway, lines: int = 60) -> str:
    return "\n".join(gw.log.read_text(errors="replace").splitlines()[-lines:]) if gw.log.exists() else "(no log)"


def _check(gw: Gateway, key: str, priority: int,
           probes: Sequence[tuple[str, str, str | None, dict[str, Any], str, bool]]) -> None:
    """Each probe (name, path, body model, extra fields, query, stream) is refused (400/401/403/404,
    nothing reaches the replica) or served with every replica request at ``priority``."""
    escaped = []
    for name, path, model, extra, query, stream in probes:
        status, received, text = _probe(gw, key, path, model, extra, query, stream)
        if status == 500 and not received and RUNTIME_FAULT in text:
            # Once in many runs (CI, stop 37) the proxy's Python answered one request with a SystemError of
            # the interpreter itself (gcmodule.c: an object allocated with a negative size, inside a C
            # extension), before anything reached the replica. Not a way round the guard: the same probe
            # is sent again and judged; a guard that fails on this input fails again.
            status, received, text = _probe(gw, key, path, model, extra, query, stream)
        refused = status in (400, 401, 403, 404) and not received
        served = status == 200 and received and all(p == priority for p in received)
        if not (refused or served):
            escaped.append(f"{name}: neither refused nor served at its class: HTTP {status}, the replica received "
                           f"priorities {received} (class {priority}): {text}")
    assert not escaped, "\n".join(escaped) + "\n--- the gateway's log, last lines:\n" + _log_tail(gw)


def test_each_class_is_served_at_its_priority(gateway: Gateway, keys: dict[str, str]) -> None:
    """The baseline: a plain request of each key reaches the replica with its class's priority."""
    inter, batch = gateway.model_of(INTERACTIVE), gateway.model_of(BATCH)
    for key, model, priority in ((keys["notebook"], inter, INTERACTIVE), (keys["nightly"], batch, BATCH)):
        for path in ("/v1/chat/completions", "/v1/completions", "/v1/responses"):
            status, received, text = _probe(gateway, key, path, model, {})
            assert (status, received) == (200, [priority]), (path, text)
        status, received, text = _probe(gateway, key, "/v1/chat/completions", model, {}, stream=True)
        assert (status, received) == (200, [priority]), text


def test_a_model_named_outside_the_body_is_refused(gateway: Gateway, keys: dict[str, str]) -> None:
    """?model= beats the body's model in LiteLLM 1.106.0 (resolve_inference_model), and names a
    group, a deployment id, a deployment name or a comma list; a path names one too."""
    inter, batch = gateway.model_of(INTERACTIVE), gateway.model_of(BATCH)
    ident, name = gateway.deployment_id(inter), gateway.deployment_name(inter)
    chat, completions = "/v1/chat/completions", "/v1/completions"
    probes: list[tuple[str, str, str | None, dict[str, Any], str, bool]] = [
        ("?model=<interactive>", chat, batch, {}, f"?model={inter}", False),
        ("?model=<interactive>, streamed", chat, batch, {}, f"?model={inter}", True),
        ("?model=<deployment id>", chat, batch, {}, f"?model={ident}", False),
        ("?model=<deployment name>", chat, batch, {}, f"?model={name}", False),
        ("?model=<both classes>", chat, batch, {}, f"?model={inter},{batch}", False),
        ("?model= (empty)", chat, batch, {}, "?model=", False),
        ("/chat/completions?model=", "/chat/completions", batch, {}, f"?model={inter}", False),
        ("/v1/completions?model=", completions, batch, {}, f"?model={inter}", False),
        ("/completions?model=", "/completions", batch, {}, f"?model={inter}", False),
        ("/v1/responses?model=", "/v1/responses", batch, {}, f"?model={inter}", False),
        ("/engines/<interactive>/", f"/engines/{inter}/chat/completions", batch, {}, "", False),
        ("/openai/deployments/<interactive>/", f"/openai/deployments/{inter}/chat/completions", batch, {}, "", False),
        ("/v1/embeddings?model=", "/v1/embeddings", batch, {"input": "x"}, f"?model={inter}", False),
        ("body model <deployment id>", chat, ident, {}, "", False),
        ("body model <both classes>", chat, f"{inter},{batch}", {}, "", False),
    ]
    _check(gateway, keys["nightly"], BATCH, probes)


def test_client_fallbacks_cannot_reach_another_class(gateway: Gateway, keys: dict[str, str]) -> None:
    """A tiny timeout fails the batch request, and a client fallback then serves it from the
    interactive group (LiteLLM honours fallbacks and router_settings_override from any key)."""
    inter, batch = gateway.model_of(INTERACTIVE), gateway.model_of(BATCH)
    fail = {"timeout": 0.00001}
    probes: list[tuple[str, str, str | None, dict[str, Any], str, bool]] = [
        ("fallbacks [{model}]", "/v1/chat/completions", batch, {**fail, "fallbacks": [{"model": inter, "timeout": 30}]}, "", False),
        ("fallbacks [name]", "/v1/chat/completions", batch, {**fail, "fallbacks": [inter]}, "", False),
        ("context_window_fallbacks", "/v1/chat/completions", batch, {"context_window_fallbacks": [{batch: [inter]}]}, "", False),
        ("content_policy_fallbacks", "/v1/chat/completions", batch, {"content_policy_fallbacks": [{batch: [inter]}]}, "", False),
        ("router_settings_override", "/v1/chat/completions", batch,
         {**fail, "router_settings_override": {"fallbacks": [{batch: [inter]}], "timeout": 30}}, "", False),
        ("fallbacks on /v1/completions", "/v1/completions", batch, {**fail, "fallbacks": [{"model": inter, "timeout": 30}]}, "", False),
        ("fallbacks on /v1/responses", "/v1/responses", batch, {**fail, "fallbacks": [{"model": inter, "timeout": 30}]}, "", False),
        ("specific_deployment", "/v1/chat/completions", gateway.deployment_name(inter), {"specific_deployment": True}, "", False),
    ]
    _check(gateway, keys["nightly"], BATCH, probes)


PRIORITY_FIELDS: list[tuple[str, dict[str, Any]]] = [
    ("extra_body priority -9", {"extra_body": {"priority": -9}}),
    ("extra_body {}", {"extra_body": {}}),
    ("extra_body other field", {"extra_body": {"foo": 1}}),
    ("priority -9", {"priority": -9}),
    ("priority 0", {"priority": 0}),
    ("priority '-9'", {"priority": "-9"}),
    ("priority -9.0", {"priority": -9.0}),
    ("priority -9.5", {"priority": -9.5}),
    ("additional_drop_params priority", {"additional_drop_params": ["priority"]}),
    ("additional_drop_params extra_body", {"additional_drop_params": ["extra_body"]}),
    ("allowed_openai_params priority", {"allowed_openai_params": ["priority"], "priority": 0}),
    ("litellm_params extra_body", {"litellm_params": {"extra_body": {"priority": -9}}}),
    ("metadata priority", {"metadata": {"priority": -9}}),
]


def test_a_client_cannot_set_or_remove_the_priority(gateway: Gateway, keys: dict[str, str]) -> None:
    """Whatever field carries it, on chat (plain and streamed), completions and responses."""
    batch = gateway.model_of(BATCH)
    probes = [(f"{name} on {path}{' streamed' if stream else ''}", path, batch, extra, "", stream)
              for path, stream in (("/v1/chat/completions", False), ("/v1/chat/completions", True), ("/v1/completions", False),
                                   ("/v1/responses", False))
              for name, extra in PRIORITY_FIELDS]
    _check(gateway, keys["nightly"], BATCH, probes)
    inter = gateway.model_of(INTERACTIVE)
    _check(gateway, keys["notebook"], INTERACTIVE,
           [("interactive key, extra_body priority 10", "/v1/chat/completions", inter, {"extra_body": {"priority": 10}}, "", False)])


def test_an_embedding_request_for_the_chat_model_gets_no_embedding(gateway: Gateway, keys: dict[str, str]) -> None:
    """/v1/embeddings is a model route (lab_models' embedding models): for a model that generates, the
    replica has no such route (vLLM 0.32 registers its kind's only) and answers 404, which the client
    gets; what reached it carried the class's priority, whatever the key and its fields. Many such
    404s in a minute leave the replica in service (no cooldown: litellm_allowed_fails_policy)."""
    inter, batch = gateway.model_of(INTERACTIVE), gateway.model_of(BATCH)
    senders: list[tuple[str, str, int, dict[str, Any]]] = [
        (keys["notebook"], inter, INTERACTIVE, {}), (keys["nightly"], batch, BATCH, {}),
        (MASTER, batch, BATCH, {"priority": -9}), (MASTER, inter, INTERACTIVE, {"extra_body": {"priority": 9}})]
    for key, model, priority, extra in senders:
        for _ in range(3):
            status, received, text = _probe(gateway, key, "/v1/embeddings", model, extra)
            assert status == 404 and received == [priority], (model, extra, status, received, text)
    for key, model, priority in ((keys["notebook"], inter, INTERACTIVE), (keys["nightly"], batch, BATCH)):
        status, received, text = _probe(gateway, key, "/v1/chat/completions", model, {})
        assert (status, received) == (200, [priority]), text


def test_a_key_cannot_bring_its_own_upstream_key(gateway: Gateway, keys: dict[str, str]) -> None:
    """LiteLLM 1.106.0 takes a body's api_key as the replica's key and builds a deployment of its own for the
    request (a new model_info.id): the replica got the client's key, or, with the replicas' own key, a
    request without the class's priority. An application key is refused; the master key's request is served
    at its class's priority (the deployment hook reads model_info.original_model_id)."""
    batch = gateway.model_of(BATCH)
    chat = "/v1/chat/completions"
    _check(gateway, keys["nightly"], BATCH, [
        ("api_key of the client's", chat, batch, {"api_key": "sk-client-chosen"}, "", False),
        ("api_key of the replicas'", chat, batch, {"api_key": VLLM_KEY}, "", False),
        ("api_key of the replicas', streamed", chat, batch, {"api_key": VLLM_KEY}, "", True),
        ("api_key on /v1/completions", "/v1/completions", batch, {"api_key": VLLM_KEY}, "", False),
        ("api_key on /v1/responses", "/v1/responses", batch, {"api_key": VLLM_KEY}, "", False),
        ("api_key null", chat, batch, {"api_key": None}, "", False),
        ("?api_key=", chat, batch, {}, f"?api_key={VLLM_KEY}", False),
    ])
    status, received, text = _probe(gateway, keys["nightly"], chat, batch, {"api_key": VLLM_KEY})
    assert (status, received) == (400, []), (status, received, text)
    _check(gateway, MASTER, BATCH, [("master api_key of the replicas'", chat, batch, {"api_key": VLLM_KEY}, "", False)])


def _logprob_fields(body: dict[str, Any]) -> dict[str, Any]:
    return {k: body[k] for k in ("prompt_logprobs", "prompt_logprob_token_ids", "echo", "logprobs", "top_logprobs",
                                 "logprob_token_ids") if k in body}


def test_a_batch_key_sending_prompt_logprobs_gets_400_and_the_replica_never_sees_it(gateway: Gateway,
                                                                                    keys: dict[str, str]) -> None:
    """Issue 40, item 8: prompt logprobs (any number: vLLM computes the whole vocabulary's logits for every prompt
    token) and logprobs beyond the class's limit (litellm_logprobs_limits: 5) get 400 before any replica sees the
    request, on every route that asks for them, for an application key of either class and for the master key."""
    status, received, text = _probe(gateway, keys["nightly"], "/v1/chat/completions", gateway.model_of(BATCH), {"prompt_logprobs": 20})
    assert status == 400 and received == [], (status, received, text)
    assert "prompt logprobs" in text, text
    chat, completions, responses = "/v1/chat/completions", "/v1/completions", "/v1/responses"
    output = {"include": ["message.output_text.logprobs"]}
    refused: list[tuple[str, str, dict[str, Any], bool]] = [
        ("prompt_logprobs 20 on completions", completions, {"prompt_logprobs": 20}, False),
        ("prompt_logprobs 0", chat, {"prompt_logprobs": 0}, False),
        ("prompt_logprobs 0, streamed", chat, {"prompt_logprobs": 0}, True),
        ("prompt_logprobs -1", chat, {"prompt_logprobs": -1}, False),
        ("prompt_logprobs '20'", chat, {"prompt_logprobs": "20"}, False),
        ("chat echo", chat, {"echo": True}, False),
        ("completions echo with logprobs 0", completions, {"echo": True, "logprobs": 0}, False),
        ("top_logprobs 20", chat, {"logprobs": True, "top_logprobs": 20}, False),
        ("top_logprobs 6, streamed", chat, {"logprobs": True, "top_logprobs": 6}, True),
        ("top_logprobs -1", chat, {"logprobs": True, "top_logprobs": -1}, False),
        ("completions logprobs 20", completions, {"logprobs": 20}, False),
        ("responses top_logprobs 20", responses, {"top_logprobs": 20, **output}, False),
        ("100 logprob_token_ids", chat, {"logprobs": True, "logprob_token_ids": list(range(100))}, False),
    ]
    escaped = []
    for key, model in ((keys["nightly"], gateway.model_of(BATCH)), (keys["notebook"], gateway.model_of(INTERACTIVE)),
                       (MASTER, gateway.model_of(BATCH))):
        for name, path, extra, stream in refused:
            status, received, text = _probe(gateway, key, path, model, extra, stream=stream)
            if status != 400 or received:
                escaped.append(f"{name} ({model}): HTTP {status}, the replica received {len(received)} request(s): {text[:200]}")
    assert not escaped, "\n".join(escaped)


def test_logprobs_within_the_limits_are_served_and_nothing_nested_reaches_vllm(gateway: Gateway, keys: dict[str, str]) -> None:
    """Within the class's limit the fields reach the replica as sent. A field nested in another (LiteLLM forwards
    litellm_params, optional_params, kwargs, ... as they are) or in the URL's query is no field of vLLM's: the
    replica receives no logprobs field at its top level, which is all vLLM reads."""
    batch = gateway.model_of(BATCH)
    served: list[tuple[str, dict[str, Any]]] = [
        ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 5}), ("/v1/completions", {"logprobs": 5}),
        ("/v1/responses", {"top_logprobs": 5, "include": ["message.output_text.logprobs"]})]
    for path, extra in served:
        marker = f"probe-{uuid.uuid4().hex}"
        status, _, text = gateway.request(path, keys["nightly"], {"model": batch, **_text(marker, path), **extra})
        got = [_logprob_fields(r["body"]) for r in gateway.recorder.marked(marker)]
        assert status == 200 and got == [{k: v for k, v in extra.items() if k != "include"}], (path, status, got, text[:200])
    nested = {"prompt_logprobs": 20, "echo": True}
    carriers: list[tuple[str, dict[str, Any], str]] = [
        (name, {name: dict(nested)}, "") for name in ("litellm_params", "optional_params", "kwargs", "model_kwargs", "extra_query",
                                                      "provider_specific_fields", "metadata", "litellm_metadata")]
    carriers += [("?prompt_logprobs=20", {}, "?prompt_logprobs=20"), ("?echo=true", {}, "?echo=true&logprobs=true&top_logprobs=20")]
    reached = []
    for name, extra, query in carriers:
        marker = f"probe-{uuid.uuid4().hex}"
        body = {"model": batch, **_text(marker, "/v1/chat/completions"), **extra}
        status, _, text = gateway.request("/v1/chat/completions" + query, keys["nightly"], body)
        fields = [_logprob_fields(r["body"]) for r in gateway.recorder.marked(marker)]
        if status not in (200, 400, 403) or any(fields):
            reached.append(f"{name}: HTTP {status}, the replica's top-level logprobs fields {fields}: {text[:200]}")
    assert not reached, "\n".join(reached)


def test_an_application_key_learns_no_replica_address(gateway: Gateway, keys: dict[str, str]) -> None:
    """/v1/model/info (it lists each deployment's api_base) gets 403 for an application key, with or without
    /v1; the master key keeps it. No answer of an application key's names the replica in its headers or body:
    x-litellm-model-api-base, -id and -name are there but empty, plain, streamed and failed."""
    bases = {d["litellm_params"]["api_base"] for d in gateway.deployments()}
    hosts = {base.split("//", 1)[1].split("/", 1)[0] for base in bases}
    for path in ("/v1/model/info", "/model/info"):
        for key in (keys["nightly"], keys["notebook"]):
            status, _, text = gateway.request(path, key, None, method="GET")
            assert status == 403 and not any(h in text for h in hosts), (path, status, text[:300])
    status, _, text = gateway.request("/v1/model/info", MASTER, None, method="GET")
    assert status == 200 and any(h in text for h in hosts), (status, text[:300])
    batch = gateway.model_of(BATCH)
    leaks = []
    for name, path, extra in (("chat", "/v1/chat/completions", {}), ("chat streamed", "/v1/chat/completions", {"stream": True}),
                              ("completions", "/v1/completions", {}), ("responses", "/v1/responses", {}),
                              ("a replica's 404", "/v1/embeddings", {"input": "x"}),
                              ("a refused request", "/v1/chat/completions", {"prompt_logprobs": 1})):
        marker = f"probe-{uuid.uuid4().hex}"
        status, headers, text = gateway.request(path, keys["nightly"], {"model": batch, **_text(marker, path), **extra})
        shown = {k: v for k, v in headers.items() if any(h in v for h in hosts) or (k in (
            "x-litellm-model-api-base", "x-litellm-model-id", "x-litellm-model-name") and v)}
        if shown or any(h in text for h in hosts):
            leaks.append(f"{name}: HTTP {status}, headers {shown}, body {text[:200]}")
    assert not leaks, "\n".join(leaks)
    status, headers, _ = gateway.request("/v1/chat/completions", MASTER, {"model": batch, **_text("x", "/v1/chat/completions")})
    assert status == 200 and headers.get("x-litellm-model-api-base") in bases, headers


def test_the_gateway_decides_the_priority_for_the_master_key_too(gateway: Gateway) -> None:
    """The master key may name any model and send any field: the replica still receives the
    priority of the deployment that serves it (labctl_guard's deployment hook, every attempt)."""
    batch = gateway.model_of(BATCH)
    probes = [(f"master {name} on {path}{' streamed' if stream else ''}", path, batch, extra, "", stream)
              for path, stream in (("/v1/chat/completions", False), ("/v1/chat/completions", True), ("/v1/completions", False),
                                   ("/v1/responses", False))
              for name, extra in PRIORITY_FIELDS if "-9.5" not in name]
    _check(gateway, MASTER, BATCH, probes)


def test_one_key_holds_at_most_its_max_parallel(gateway: Gateway, keys: dict[str, str]) -> None:
    """nightly has the default (two requests at once here: half the gate's slots), wide its own 3
    (labctl keys add --max-parallel 3): LiteLLM answers 429 beyond, and the replica never sees the
    extra request."""
    batch = gateway.model_of(BATCH)

    def burst(key: str) -> list[tuple[int, list[int | None], str]]:
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            futures = [pool.submit(_probe, gateway, key, "/v1/chat/completions", batch, {}, hold=2) for _ in range(3)]
            return [f.result() for f in futures]

    nightly = burst(keys["nightly"])
    assert sorted(r[0] for r in nightly) == [200, 200, 429], nightly
    assert [r[1] for r in nightly if r[0] == 429] == [[]]
    wide = sorted(r[0] for r in burst(keys["wide"]))
    assert wide == [200, 200, 200], wide


def test_no_request_frees_another_requests_slot(gateway: Gateway) -> None:
    """Four requests hold the gate's four slots. LiteLLM forwards /v1/responses' metadata to vLLM, which
    echoes it: nothing of the gate may be there. A request that names a slot's token in its own
    metadata and then fails (here: it waits past the admission timeout, on /v1/completions) frees
    nothing, and gets its 503 with Retry-After there too (LiteLLM drops an HTTPException's headers on
    that route); a later request still waits for a slot."""
    inter = gateway.model_of(INTERACTIVE)
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(SLOTS + 1) as pool:
        first = pool.submit(_probe, gateway, MASTER, "/v1/responses", inter, {}, hold=8)
        others = [pool.submit(_probe, gateway, MASTER, "/v1/chat/completions", inter, {}, hold=8) for _ in range(SLOTS - 1)]
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # every slot taken (the replica holds them 8 s)
            held = [r for r in gateway.recorder.requests if "hold=8" in json.dumps(r["body"])]
            if len(held) == SLOTS:
                break
            time.sleep(0.1)
        assert len(held) == SLOTS, held
        responses_body = next(r["body"] for r in held if r["path"] == "/v1/responses")
        leaked = json.dumps(responses_body.get("metadata"))
        token = (responses_body.get("metadata") or {}).get("labctl_admission") or uuid.uuid4().hex
        status, headers, text = gateway.request("/v1/completions", MASTER, {
            "model": inter, "prompt": "say ok", "max_tokens": 4, "metadata": {"labctl_admission": token}})
        late_marker = f"late-{uuid.uuid4().hex}"
        late = pool.submit(gateway.request, "/v1/chat/completions", MASTER, {
            "model": inter, "messages": [{"role": "user", "content": late_marker}], "max_tokens": 4})
        time.sleep(1.0)
        reached_early = bool(gateway.recorder.marked(late_marker))
        late_status = late.result()[0]
        assert [f.result()[0] for f in (first, *others)] == [200] * SLOTS
    problems = []
    if "labctl_admission" in leaked:
        problems.append(f"the gate's token reached the replica: {leaked}")
    if (status, headers.get("retry-after")) != (503, "7"):
        problems.append(f"/v1/completions after the admission timeout: HTTP {status}, Retry-After "
                        f"{headers.get('retry-after')!r} (want 503, '7'): {text[:200]}")
    if reached_early or late_status not in (200, 503):
        problems.append(f"a later request was admitted while every slot was held ({late_status}): the failed "
                        "request freed a slot it did not hold")
    assert not problems, "\n".join(problems)
    assert time.monotonic() - started < 60


def test_every_slot_comes_back(gateway: Gateway, keys: dict[str, str]) -> None:
    """After every probe above (plain, streamed, refused, failed, timed out), every slot is free:
    as many requests as slots, each holding one for 2 s, are all admitted at once."""
    inter = gateway.model_of(INTERACTIVE)
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(SLOTS) as pool:
        results = list(pool.map(lambda _: _probe(gateway, MASTER, "/v1/chat/completions", inter, {}, hold=2)[0],
                                range(SLOTS)))
    assert results == [200] * SLOTS
    assert time.monotonic() - started < 2 + 2.5  # none waited for another (the gate would make it 4 s or a 503)


def test_a_key_with_characters_outside_ascii_gets_401(gateway: Gateway) -> None:
    inter = gateway.model_of(INTERACTIVE)
    status, _, text = gateway.request("/v1/chat/completions", "sk-lab-clé", {
        "model": inter, "messages": [{"role": "user", "content": "x"}]})
    assert status == 401, text
    assert "compare_digest" not in gateway.log.read_text()


def test_no_ui_sign_in_with_the_master_key(gateway: Gateway) -> None:
    """litellm_admin_ui: false (the default): LiteLLM's /login refuses the master key as a password
    before anything else (disable_env_credential_login; without it, here, the login goes on to make a
    UI session key and fails only for want of a database, which database mode has)."""
    status, _, text = gateway.request("/login", None, f"username=admin&password={MASTER}".encode(),
                                      headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 401 and "Invalid credentials" in text, (status, text[:300])
