"""A vLLM stand-in for the gateway benchmark (bench/README.md): the OpenAI chat API, continuous
batching, a priority waiting queue, abort on disconnect, /health, /v1/models, /metrics with vLLM
V1's metric names, and fault switches. Standard library only; a test tool, never installed on a
lab host.

    python3 bench/standin.py --port 18100 --served-model-name gpt-oss-120b-bench-0 --max-num-seqs 32
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import heapq
import itertools
import json
import os
import socket
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

# Histogram buckets (seconds), a subset of vLLM's.
BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)


@dataclass
class Histogram:
    counts: list[int] = field(default_factory=lambda: [0] * len(BUCKETS))
    total: float = 0.0
    n: int = 0

    def observe(self, value: float) -> None:
        self.total += value
        self.n += 1
        for i, bound in enumerate(BUCKETS):
            if value <= bound:
                self.counts[i] += 1

    def lines(self, name: str, labels: str) -> list[str]:
        out = [f'{name}_bucket{{{labels},le="{b}"}} {c}' for b, c in zip(BUCKETS, self.counts, strict=True)]
        out += [f'{name}_bucket{{{labels},le="+Inf"}} {self.n}', f"{name}_sum{{{labels}}} {self.total}",
                f"{name}_count{{{labels}}} {self.n}"]
        return out


@dataclass
class Seq:
    """One request: queued, then one token per engine step until max_tokens."""

    request_id: str
    tag: str  # the client's marker (the bench puts one in the user message), for /bench/inflight
    priority: int
    prompt_tokens: int
    max_tokens: int
    stream: bool
    arrival: float
    generated: int = 0
    first_token_at: float | None = None
    scheduled_at: float | None = None
    finished: bool = False
    aborted: bool = False
    tokens: asyncio.Queue[int | None] = field(default_factory=asyncio.Queue)


class Engine:
    """Continuous batching: up to max_num_seqs running; the rest wait in (priority, arrival) order
    (vLLM --scheduling-policy priority: lower first; no preemption for slots). Each step costs
    step_base + step_per_seq * running seconds and gives every running sequence one token."""

    def __init__(self, name: str, max_num_seqs: int, step_base: float, step_per_seq: float) -> None:
        self.name = name
        self.max_num_seqs = max_num_seqs
        self.step_base = step_base
        self.step_per_seq = step_per_seq
        self.running: list[Seq] = []
        self.waiting: list[tuple[int, int, Seq]] = []
        self._order = itertools.count()
        self._wake = asyncio.Event()
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.received_total = 0
        self.aborted_total = 0
        self.success_total = 0
        self.ttft = Histogram()
        self.e2e = Histogram()
        self.queue_time = Histogram()
        self.fault_until = 0.0

    def faulty(self) -> bool:
        return time.monotonic() < self.fault_until

    def add(self, seq: Seq) -> None:
        self.received_total += 1
        heapq.heappush(self.waiting, (seq.priority, next(self._order), seq))
        self._wake.set()

    def abort(self, seq: Seq) -> None:
        """The client went away: free its slot (or its place in the queue), as vLLM does."""
        if seq.finished or seq.aborted:
            return
        seq.aborted = True
        self.aborted_total += 1
        if seq in self.running:
            self.running.remove(seq)
        self.waiting = [w for w in self.waiting if w[2] is not seq]
        heapq.heapify(self.waiting)
        seq.tokens.put_nowait(None)

    def schedule(self) -> None:
        now = time.monotonic()
        while self.waiting and len(self.running) < self.max_num_seqs:
            _, _, seq = heapq.heappop(self.waiting)
            seq.scheduled_at = now
            self.queue_time.observe(now - seq.arrival)
            self.prompt_tokens_total += seq.prompt_tokens
            self.running.append(seq)

    def step_seconds(self) -> float:
        return self.step_base + self.step_per_seq * len(self.running)

    def advance(self) -> None:
        """One decode step's results (called after its time has passed)."""
        now = time.monotonic()
        for seq in list(self.running):
            seq.generated += 1
            self.generation_tokens_total += 1
            if seq.first_token_at is None:
                seq.first_token_at = now
                self.ttft.observe(now - seq.arrival)
            done = seq.generated >= seq.max_tokens
            seq.tokens.put_nowait(seq.generated)
            if done:
                seq.finished = True
                self.success_total += 1
                self.e2e.observe(now - seq.arrival)
                self.running.remove(seq)
                seq.tokens.put_nowait(None)

    async def run(self) -> None:
        while True:
            self.schedule()
            if not self.running:
                self._wake.clear()
                await self._wake.wait()
                continue
            await asyncio.sleep(self.step_seconds())
            self.advance()

    def metrics(self) -> str:
        labels = f'model_name="{self.name}",engine="0"'
        lines = [
            "# TYPE vllm:num_requests_running gauge", f"vllm:num_requests_running{{{labels}}} {len(self.running)}",
            "# TYPE vllm:num_requests_waiting gauge", f"vllm:num_requests_waiting{{{labels}}} {len(self.waiting)}",
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f"vllm:kv_cache_usage_perc{{{labels}}} {len(self.running) / self.max_num_seqs}",
            "# TYPE vllm:prompt_tokens_total counter", f"vllm:prompt_tokens_total{{{labels}}} {self.prompt_tokens_total}",
            "# TYPE vllm:generation_tokens_total counter",
            f"vllm:generation_tokens_total{{{labels}}} {self.generation_tokens_total}",
            "# TYPE vllm:request_success_total counter",
            f'vllm:request_success_total{{{labels},finished_reason="length"}} {self.success_total}',
            "# TYPE vllm:num_preemptions_total counter", f"vllm:num_preemptions_total{{{labels}}} 0",
            "# TYPE vllm:time_to_first_token_seconds histogram",
            *self.ttft.lines("vllm:time_to_first_token_seconds", labels),
            "# TYPE vllm:e2e_request_latency_seconds histogram",
            *self.e2e.lines("vllm:e2e_request_latency_seconds", labels),
            "# TYPE vllm:request_queue_time_seconds histogram",
            *self.queue_time.lines("vllm:request_queue_time_seconds", labels),
            # Bench-only (not vLLM's): requests that reached this replica, and aborts.
            "# TYPE bench:requests_received_total counter", f"bench:requests_received_total{{{labels}}} {self.received_total}",
            "# TYPE bench:requests_aborted_total counter", f"bench:requests_aborted_total{{{labels}}} {self.aborted_total}",
        ]
        return "\n".join(lines) + "\n"


# --- HTTP/1.1 (keep-alive, chunked streaming), just enough for httpx/aiohttp clients -------------

REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 500: "Internal Server Error",
           503: "Service Unavailable"}


class Disconnected(Exception):
    pass


class Server:
    def __init__(self, engine: Engine, tokens_per_chunk: int, chars_per_prompt_token: int = 4) -> None:
        self.engine = engine
        self.tokens_per_chunk = tokens_per_chunk
        self.chars_per_prompt_token = chars_per_prompt_token

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
                body = await reader.readexactly(int(headers.get("content-length", "0") or 0))
                keep = headers.get("connection", "").lower() != "close"
                await self.route(method, path.split("?", 1)[0], body, reader, writer)
                if not keep:
                    break
        except (asyncio.IncompleteReadError, ConnectionError, Disconnected, asyncio.LimitOverrunError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def respond(self, writer: asyncio.StreamWriter, status: int, payload: Any, ctype: str = "application/json") -> None:
        data = payload if isinstance(payload, bytes) else (
            payload.encode() if isinstance(payload, str) else json.dumps(payload).encode())
        writer.write(f"HTTP/1.1 {status} {REASONS.get(status, 'OK')}\r\nContent-Type: {ctype}\r\n"
                     f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
        await writer.drain()

    async def route(self, method: str, path: str, body: bytes, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter) -> None:
        eng = self.engine
        if path == "/health":
            await self.respond(writer, 503 if eng.faulty() else 200, b"")
        elif path == "/v1/models":
            await self.respond(writer, 200, {"object": "list", "data": [
                {"id": eng.name, "object": "model", "owned_by": "vllm", "max_model_len": 128000}]})
        elif path == "/metrics":
            await self.respond(writer, 200, eng.metrics(), "text/plain; version=0.0.4")
        elif path == "/bench/fault" and method == "POST":
            req = json.loads(body or b"{}")
            if req.get("mode") == "exit":
                os._exit(int(req.get("code", 1)))
            eng.fault_until = time.monotonic() + float(req.get("seconds", 0))
            await self.respond(writer, 200, {"fault_seconds": float(req.get("seconds", 0))})
        elif path == "/bench/inflight":
            seqs = eng.running + [w[2] for w in eng.waiting]
            await self.respond(writer, 200, [{"tag": s.tag, "stream": s.stream, "running": s in eng.running}
                                             for s in seqs])
        elif path == "/v1/chat/completions" and method == "POST":
            await self.chat(json.loads(body or b"{}"), reader, writer)
        else:
            await self.respond(writer, 404, {"error": {"message": f"no route {path}"}})

    def new_seq(self, req: dict[str, Any]) -> Seq:
        text = " ".join(str(m.get("content", "")) for m in req.get("messages", []) if isinstance(m, dict))
        tag = text.split("[", 1)[1].split("]", 1)[0] if "[" in text and "]" in text else ""
        max_tokens = int(req.get("max_tokens") or req.get("max_completion_tokens") or 16)
        return Seq(request_id=f"chatcmpl-{uuid.uuid4().hex}", tag=tag, priority=int(req.get("priority", 0) or 0),
                   prompt_tokens=max(1, len(text) // self.chars_per_prompt_token), max_tokens=max(1, max_tokens),
                   stream=bool(req.get("stream")), arrival=time.monotonic())

    async def chat(self, req: dict[str, Any], reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        eng = self.engine
        if eng.faulty():
            await self.respond(writer, 500, {"error": {"message": "stand-in fault: internal error", "type": "InternalServerError",
                                                       "code": 500}})
            return
        if req.get("model") != eng.name:
            await self.respond(writer, 404, {"error": {"message": f"The model `{req.get('model')}` does not exist.",
                                                       "type": "NotFoundError", "code": 404}})
            return
        seq = self.new_seq(req)
        eng.add(seq)
        # The client closing its connection aborts the request (vLLM does the same).
        watcher = asyncio.create_task(reader.read(1))
        try:
            if seq.stream:
                await self.stream(seq, req, writer, watcher)
            else:
                await self.whole(seq, req, writer, watcher)
        finally:
            eng.abort(seq)
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                first = await watcher
                if first:  # the client's next request began as this one ended: give its byte back
                    reader._buffer[0:0] = first  # type: ignore[attr-defined]
                else:
                    raise Disconnected

    async def next_token(self, seq: Seq, watcher: asyncio.Task[bytes]) -> int | None:
        getter = asyncio.ensure_future(seq.tokens.get())
        done, _ = await asyncio.wait({getter, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if getter in done:
            return getter.result()
        getter.cancel()
        raise Disconnected

    def usage(self, seq: Seq) -> dict[str, int]:
        return {"prompt_tokens": seq.prompt_tokens, "completion_tokens": seq.generated,
                "total_tokens": seq.prompt_tokens + seq.generated}

    async def whole(self, seq: Seq, req: dict[str, Any], writer: asyncio.StreamWriter, watcher: asyncio.Task[bytes]) -> None:
        while (await self.next_token(seq, watcher)) is not None:
            pass
        if seq.aborted:
            raise Disconnected
        await self.respond(writer, 200, {
            "id": seq.request_id, "object": "chat.completion", "created": int(time.time()), "model": self.engine.name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "tok " * seq.generated},
                         "finish_reason": "length"}],
            "usage": self.usage(seq)})

    async def stream(self, seq: Seq, req: dict[str, Any], writer: asyncio.StreamWriter, watcher: asyncio.Task[bytes]) -> None:
        async def send(obj: dict[str, Any] | str) -> None:
            data = ("data: " + (obj if isinstance(obj, str) else json.dumps(obj)) + "\n\n").encode()
            writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            await writer.drain()

        def chunk(content: str | None, finish: str | None) -> dict[str, Any]:
            delta = {"role": "assistant", "content": content} if content is not None else {}
            return {"id": seq.request_id, "object": "chat.completion.chunk", "created": int(time.time()),
                    "model": self.engine.name, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

        pending = 0
        while True:
            token = await self.next_token(seq, watcher)
            if token is None:
                break
            if token == 1:  # like vLLM: the response (and the role) starts with the first token
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
                await send(chunk("", None))
            pending += 1
            if pending >= self.tokens_per_chunk or token == 1:
                await send(chunk("tok " * pending, None))
                pending = 0
        if seq.aborted:
            raise Disconnected
        if pending:
            await send(chunk("tok " * pending, None))
        final = chunk(None, "length")
        if (req.get("stream_options") or {}).get("include_usage"):
            await send(final)
            final = {**chunk(None, None), "choices": [], "usage": self.usage(seq)}
        await send(final)
        await send("[DONE]")
        writer.write(b"0\r\n\r\n")
        await writer.drain()


async def serve(args: argparse.Namespace) -> None:
    # As vLLM does (vllm/entrypoints/launchers/launcher.py, "bind the port before the engine is
    # set up"): the port listens during the model load, and a connection made then waits in the
    # backlog, unanswered, until the load is over.
    sock = socket.create_server((args.host, args.port), backlog=1024, reuse_port=False)
    await asyncio.sleep(args.startup_delay)  # model loading, scaled
    engine = Engine(args.served_model_name, args.max_num_seqs, args.step_base, args.step_per_seq)
    server = Server(engine, args.tokens_per_chunk)
    loop_task = asyncio.create_task(engine.run())
    srv = await asyncio.start_server(server.handle, sock=sock)
    async with srv:
        await asyncio.gather(srv.serve_forever(), loop_task)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--served-model-name", required=True)
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--step-base", type=float, default=0.020, help="seconds per decode step, empty batch")
    parser.add_argument("--step-per-seq", type=float, default=0.0005, help="extra seconds per step per running sequence")
    parser.add_argument("--tokens-per-chunk", type=int, default=8, help="tokens per SSE chunk (CPU of the proxy)")
    parser.add_argument("--startup-delay", type=float, default=0.0, help="seconds of model loading: the port listens but nothing answers")
    asyncio.run(serve(parser.parse_args()))


if __name__ == "__main__":
    main()
