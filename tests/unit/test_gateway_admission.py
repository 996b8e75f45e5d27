"""The gateway's priority admission (roles/litellm/files/.../labctl_admission.py): the order in which
waiting requests are admitted (class, arrival, floor), timeouts and cancellations, and the slot of
each request given back exactly once by whichever LiteLLM hook ends it, and only by the request
that holds it. LiteLLM itself is stood in for (its hook names and parameters are checked against
the bundle's wheel below); the runs through the real proxy are test_gateway_through_proxy.py (slots
and Retry-After) and molecule stack's test_a_batch_flood_does_not_hold_back_an_interactive_request."""

from __future__ import annotations

import asyncio
import inspect
import sys
import types
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "roles" / "litellm" / "filter_plugins"))

from litellm_filters import labctl_class_floors  # noqa: E402

from .callback_loader import litellm_source, load_callback  # noqa: E402

INTERACTIVE, BATCH = 0, 10


class _ProxyException(Exception):
    """Stand-in for litellm.proxy._types.ProxyException (same parameters; checked below)."""

    def __init__(self, message: str, type: str, param: str | None, code: int | str | None = None,  # noqa: A002
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message, self.type, self.param, self.code, self.headers = message, type, param, str(code), headers or {}


class _HTTPException(Exception):
    """Stand-in for fastapi's HTTPException (which LiteLLM drops the headers of on /v1/completions)."""

    def __init__(self, status_code: int, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status_code, self.detail, self.headers = status_code, detail, headers


def _load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slots: int = 4, timeout: float = 900,
          floors: dict[str, float] | None = None, reserve: float = 0.0) -> Any:
    return load_callback(
        "labctl_admission", tmp_path, monkeypatch, {"litellm.proxy": {}, "litellm.proxy._types": {"ProxyException": _ProxyException},
                                                    "fastapi": {"HTTPException": _HTTPException}},
        __litellm_admission_slots_per_worker=slots, __litellm_class_priorities={"m": INTERACTIVE, "m-batch": BATCH},
        __litellm_class_floors={str(BATCH): 0.2} if floors is None else floors,
        litellm_admission_queue_timeout=timeout, litellm_admission_retry_after=30, litellm_request_timeout=1800,
        litellm_admission_reserve=reserve)


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _queue(gate: Any, order: list[str], admitted: list[str]) -> list[asyncio.Task[None]]:
    """Requests named like 'i1' (interactive) or 'b1' (batch), arriving in this order."""
    async def one(name: str) -> None:
        await gate.acquire(INTERACTIVE if name.startswith("i") else BATCH)
        admitted.append(name)

    tasks = []
    for name in order:
        tasks.append(asyncio.create_task(one(name)))
        await asyncio.sleep(0)  # arrival order
    await asyncio.sleep(0)
    return tasks


def test_waiting_requests_go_by_class_then_arrival(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = _load(tmp_path, monkeypatch, floors={})

    async def scenario() -> list[str]:
        gate = module.Gate(1, {}, 900)
        await gate.acquire(BATCH)  # the one slot, taken by a batch request
        admitted: list[str] = []
        tasks = await _queue(gate, ["b1", "i1", "b2", "i2", "b3"], admitted)
        assert admitted == [] and gate.queued() == 5
        for count in range(1, 6):
            gate.release(INTERACTIVE if admitted and admitted[-1].startswith("i") else BATCH)
            for _ in range(100):  # until the admitted request has run
                if len(admitted) == count:
                    break
                await asyncio.sleep(0)
        await asyncio.gather(*tasks)
        return admitted

    # An interactive request is never admitted after a later batch one, nor waits while one is admitted.
    assert _run(scenario()) == ["i1", "i2", "b1", "b2", "b3"]


def test_free_slots_admit_at_once_whatever_the_class(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = _load(tmp_path, monkeypatch)

    async def scenario() -> tuple[int, int]:
        gate = module.Gate(3, {BATCH: 0.2}, 900)
        for priority in (BATCH, BATCH, INTERACTIVE):
            await asyncio.wait_for(gate.acquire(priority), 0.1)
        return gate.in_flight(), gate.queued()

    assert _run(scenario()) == (3, 0)


def test_batch_keeps_its_floor_while_it_waits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """10 slots, batch floor 20 %: under an interactive flood batch still holds 2 slots, never more
    while interactive requests wait."""
    module = _load(tmp_path, monkeypatch)

    async def scenario() -> list[int]:
        gate = module.Gate(10, {BATCH: 0.2}, 900)
        for _ in range(10):
            await gate.acquire(INTERACTIVE)
        admitted: list[str] = []
        tasks = await _queue(gate, [f"b{n}" for n in range(6)] + [f"i{n}" for n in range(30)], admitted)
        batch_running = []
        for _ in range(30):
            running = dict(gate.running)
            # end one interactive request (the flood's), keep every admitted batch request running
            if running.get(INTERACTIVE, 0):
                gate.release(INTERACTIVE)
            await asyncio.sleep(0)
            batch_running.append(gate.running.get(BATCH, 0))
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return batch_running

    shares = _run(scenario())
    assert shares[:2] == [1, 2] and max(shares) == 2 and shares[-1] == 2, shares


def test_the_reserve_stays_free_for_the_urgent_class(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """10 slots, 20 % reserve, 20 % batch floor: batch fills 8 slots and waits; an interactive
    request arriving then starts at once in the reserve; batch below its floor still gets in."""
    module = _load(tmp_path, monkeypatch, reserve=0.2)

    async def scenario() -> tuple[int, int, bool, int]:
        gate = module.Gate(10, {BATCH: 0.2}, 900, 0.2, INTERACTIVE)
        admitted: list[str] = []
        tasks = await _queue(gate, [f"b{n}" for n in range(12)], admitted)
        batch_in, batch_waiting = len(admitted), gate.queued(BATCH)
        await asyncio.wait_for(gate.acquire(INTERACTIVE), 0.1)  # no wait: the reserve
        await asyncio.wait_for(gate.acquire(INTERACTIVE), 0.1)
        third = asyncio.create_task(gate.acquire(INTERACTIVE))  # all 10 taken: it waits
        await asyncio.sleep(0.01)
        third_waits = not third.done()
        for task in [*tasks, third]:
            task.cancel()
        await asyncio.gather(*tasks, third, return_exceptions=True)
        return batch_in, batch_waiting, third_waits, gate.reserve

    assert _run(scenario()) == (8, 4, True, 2)


def test_timeout_and_cancellation_leave_the_queue(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = _load(tmp_path, monkeypatch)

    async def scenario() -> None:
        gate = module.Gate(1, {}, 0.05)
        await gate.acquire(INTERACTIVE)
        with pytest.raises(module.AdmissionTimeout):
            await gate.acquire(BATCH)
        assert gate.queued() == 0 and gate.in_flight() == 1
        waiter = asyncio.create_task(gate.acquire(INTERACTIVE))
        await asyncio.sleep(0.01)
        waiter.cancel()  # the client went away while it waited
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert gate.queued() == 0 and gate.in_flight() == 1
        gate.release(INTERACTIVE)
        assert gate.in_flight() == 0

    _run(scenario())


def test_a_full_gate_answers_503_with_retry_after(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ProxyException, whose headers LiteLLM keeps on every route (an HTTPException's it drops on
    /v1/completions)."""
    module = _load(tmp_path, monkeypatch, slots=1, timeout=0.05)

    async def scenario() -> None:
        admission = module.Admission()

        async def request() -> None:  # each request is its own task, as in the proxy
            await admission.async_pre_call_hook(types.SimpleNamespace(metadata={}), None, {"model": "m"}, "acompletion")

        holder = asyncio.create_task(request())
        await holder
        async def refused() -> None:
            with pytest.raises(_ProxyException) as info:
                await request()
            assert info.value.code == "503" and info.value.headers == {"Retry-After": "30"}
            # its own rejection reaches the failure hook: nothing is given back for it
            await admission.async_post_call_failure_hook({"model": "m", "metadata": {}}, info.value, None)

        await asyncio.create_task(refused())
        assert admission.gate.in_flight() == 1

    _run(scenario())


async def _request(admission: Any, data: dict[str, Any], *hooks: Any) -> dict[str, Any]:
    """One request as the proxy runs it: the pre-call hook, then ``hooks`` (each called with
    ``data``), all in the request's own task."""
    key = types.SimpleNamespace(metadata={})

    async def run() -> dict[str, Any]:
        await admission.async_pre_call_hook(key, None, data, "acompletion")
        for hook in hooks:
            await hook(data)
        return data

    return await asyncio.create_task(run())


def test_each_hook_gives_the_slot_back_exactly_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = _load(tmp_path, monkeypatch, slots=2)

    async def scenario() -> None:
        admission = module.Admission()
        gate = admission.gate
        seen: list[int] = []

        async def in_flight(data: dict[str, Any]) -> None:
            seen.append(gate.in_flight())

        async def success(data: dict[str, Any]) -> None:
            await admission.async_post_call_success_hook(data, None, object())

        async def failure(data: dict[str, Any]) -> None:
            await admission.async_post_call_failure_hook(data, RuntimeError(), None)

        data = await _request(admission, {"model": "m"}, in_flight, success, failure)  # both fired: one release
        assert seen == [1] and gate.in_flight() == 0
        assert data == {"model": "m"}  # nothing of the gate in the request (its metadata may reach vLLM)

        async def chunks() -> Any:
            yield "a"
            raise RuntimeError("upstream broke mid-stream")

        async def broken_stream(data: dict[str, Any]) -> None:
            stream = admission.async_post_call_streaming_iterator_hook(None, chunks(), data)
            assert await stream.__anext__() == "a"
            with pytest.raises(RuntimeError):
                await stream.__anext__()

        await _request(admission, {"model": "m"}, broken_stream, failure)
        assert gate.in_flight() == 0

        async def client_left(data: dict[str, Any]) -> None:
            stream = admission.async_post_call_streaming_iterator_hook(None, chunks(), data)
            await stream.__anext__()
            seen.append(gate.in_flight())
            await stream.aclose()  # the client left mid-stream

        await _request(admission, {"model": "m"}, client_left)
        assert seen[-1] == 1 and gate.in_flight() == 0 and admission.tickets == set()

        # the stream's first read in a task started from the request's (LiteLLM's first-chunk fetch)
        async def streamed_from_a_child_task(data: dict[str, Any]) -> None:
            stream = admission.async_post_call_streaming_iterator_hook(None, chunks(), data)
            assert await asyncio.ensure_future(stream.__anext__()) == "a"
            with pytest.raises(RuntimeError):
                await stream.__anext__()

        await _request(admission, {"model": "m"}, streamed_from_a_child_task)
        assert gate.in_flight() == 0

    _run(scenario())


def test_no_request_frees_a_slot_it_does_not_hold(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A request that fails before it was admitted (a refusal, an admission timeout), whatever its
    metadata names (even what the holder's request carried: on /v1/responses vLLM echoes its
    metadata to the client), gives nothing back: the slot of the request that holds it stays taken."""
    module = _load(tmp_path, monkeypatch, slots=1, timeout=0.05)

    async def scenario() -> None:
        admission = module.Admission()
        holder_seen: list[Any] = []

        async def keep(data: dict[str, Any]) -> None:
            holder_seen.append(dict(data))

        await _request(admission, {"model": "m"}, keep)
        assert admission.gate.in_flight() == 1

        async def forger() -> None:
            token = (holder_seen[0].get("metadata") or {}).get("labctl_admission", "anything")
            data = {"model": "m", "metadata": {"labctl_admission": token}, "litellm_metadata": {"labctl_admission": token}}
            with pytest.raises(Exception):  # noqa: B017,PT011 - the gate is full: it times out
                await admission.async_pre_call_hook(types.SimpleNamespace(metadata={}), None, data, "acompletion")
            await admission.async_post_call_failure_hook(data, RuntimeError(), None)
            await admission.async_post_call_success_hook(data, None, object())
            async for _ in admission.async_post_call_streaming_iterator_hook(None, _empty(), data):
                pass

        await asyncio.create_task(forger())
        assert admission.gate.in_flight() == 1 and holder_seen == [{"model": "m"}]

    _run(scenario())


async def _empty() -> Any:
    nothing: tuple[Any, ...] = ()
    for item in nothing:
        yield item


def test_a_rerun_of_the_pre_call_hooks_keeps_the_one_slot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """LiteLLM runs the pre-call hooks again on a rate-limit fallback, in the same request task."""
    module = _load(tmp_path, monkeypatch, slots=1, timeout=0.05)

    async def scenario() -> None:
        admission = module.Admission()

        async def again(data: dict[str, Any]) -> None:
            await admission.async_pre_call_hook(types.SimpleNamespace(metadata={}), None, {"model": "m"}, "acompletion")
            assert admission.gate.in_flight() == 1

        async def success(data: dict[str, Any]) -> None:
            await admission.async_post_call_success_hook(data, None, object())

        await _request(admission, {"model": "m"}, again, success)
        assert admission.gate.in_flight() == 0

    _run(scenario())


def test_a_key_with_a_priority_decides_its_queue(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = _load(tmp_path, monkeypatch)
    assert module.priority_of("m", {}) == INTERACTIVE
    assert module.priority_of("m-batch", None) == BATCH
    assert module.priority_of("m", {"priority": 10}) == BATCH  # a batch application's key
    assert module.priority_of("m-batch", {"priority": "0"}) == INTERACTIVE
    assert module.priority_of("unknown-name", {}) == BATCH  # the least urgent class


def test_a_lost_slot_is_taken_back_after_max_hold(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = _load(tmp_path, monkeypatch, slots=1)

    async def scenario() -> None:
        admission = module.Admission(max_hold=0.05)
        await asyncio.create_task(admission.async_pre_call_hook(types.SimpleNamespace(metadata={}), None,
                                                                {"model": "m"}, "acompletion"))
        await asyncio.sleep(0.1)  # no hook ever ends that request
        await asyncio.wait_for(asyncio.create_task(admission.async_pre_call_hook(
            types.SimpleNamespace(metadata={}), None, {"model": "m"}, "acompletion")), 1)
        assert admission.gate.in_flight() == 1

    _run(scenario())


def test_floors_from_the_classes() -> None:
    classes = [{"name": "m", "priority": 0}, {"name": "m-batch", "priority": 10}]
    assert labctl_class_floors(classes, 0.2) == {"10": 0.2}
    assert labctl_class_floors([*classes[:1], {"name": "m-batch", "priority": 10, "floor": 0.3}], 0.2) == {"10": 0.3}
    assert labctl_class_floors([{"name": "m", "priority": 0}], 0.2) == {}


def test_the_hooks_match_the_pinned_litellm() -> None:
    """Names and parameters of the hooks this callback overrides, and of the exception it raises, as
    LiteLLM 1.106.0 declares them."""
    source, types_src = litellm_source("litellm/integrations/custom_logger.py", "litellm/proxy/_types.py")
    exception = types_src[types_src.index("class ProxyException(Exception):"):]
    assert ("        message: str,\n        type: str,\n        param: str | None,\n"
            "        code: int | str | None = None,  # maps to status code\n"
            "        headers: dict[str, str] | None = None,") in exception[:600]
    for hook, params in {
        "async_pre_call_hook": "self, user_api_key_dict, cache, data, call_type",
        "async_post_call_success_hook": "self, data, user_api_key_dict, response",
        "async_post_call_failure_hook": "self, request_data, original_exception, user_api_key_dict, traceback_str",
        "async_post_call_streaming_iterator_hook": "self, user_api_key_dict, response, request_data",
    }.items():
        start = source.index(f"async def {hook}(")
        declared = source[start:source.index(")", start)]
        names = [p.split(":")[0].split("=")[0].strip() for p in declared.split("(", 1)[1].split(",") if p.strip()]
        assert ", ".join(names) == params, (hook, names)
    assert inspect.isfunction(labctl_class_floors)
