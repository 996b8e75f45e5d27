"""The benchmark's load: a seeded open-loop schedule (bursts, streaming/non-streaming mix, two
priority classes, client timeouts), the client that plays it against the gateway, and the sampler
that reads every replica's /metrics (and the gateway's) once a second. Runs in build/bench-venv
(aiohttp)."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

try:  # the schedule (and its unit tests) needs no HTTP client; playing it does (build/bench-venv)
    import aiohttp
except ModuleNotFoundError:  # pragma: no cover - the project venv has no aiohttp
    aiohttp = None
from gatewaymetrics import gateway_row, parse_metrics


@dataclass(frozen=True)
class Phase:
    name: str
    start: float  # seconds from the run's start
    end: float
    load: float  # mean offered load, as a fraction of the replicas' decode capacity
    burst: bool = False  # cycles of (cycle - peak) s at `base` x capacity, then `peak` s above: mean `load`
    cycle: float = 20.0
    peak: float = 8.0
    base: float = 1.0

    @property
    def peak_load(self) -> float:
        return (self.cycle * self.load - (self.cycle - self.peak) * self.base) / self.peak


@dataclass(frozen=True)
class Planned:
    tag: str
    at: float
    phase: str
    stream: bool
    high: bool  # the interactive class (priority 0); else batch (priority 10)
    max_tokens: int
    prompt_chars: int
    timeout: float


@dataclass
class Result:
    tag: str
    at: float
    phase: str
    stream: bool
    high: bool
    max_tokens: int
    ok: bool = False
    status: int = 0
    error: str = ""
    kind: str = ""  # "", client_timeout, http_<code>, stream_broken, connection
    ttft: float | None = None
    latency: float | None = None
    tokens: int = 0
    ended: float | None = None


def rate_at(phase: Phase, t: float) -> float:
    """Offered load (x capacity) at t seconds into the run."""
    if not phase.burst:
        return phase.load
    cycle = (t - phase.start) % phase.cycle
    return phase.base if cycle < phase.cycle - phase.peak else phase.peak_load


def schedule(phases: Iterable[Phase], capacity_rps: float, seed: int, mean_tokens: float, *,
             stream_share: float = 0.7, high_share: float = 0.3, prompt_chars: int = 1200,
             timeout_high: float = 120.0, timeout_low: float = 300.0) -> list[Planned]:
    """Poisson arrivals (thinning) at rate_at x capacity; every draw from one seeded generator."""
    rng = random.Random(seed)
    plan: list[Planned] = []
    for phase in phases:
        peak = max(phase.load, phase.base if phase.burst else 0.0, phase.peak_load if phase.burst else 0.0) * capacity_rps
        t = phase.start
        while peak > 0:
            t += rng.expovariate(peak)
            if t >= phase.end:
                break
            if rng.random() > rate_at(phase, t) * capacity_rps / peak:
                continue
            high = rng.random() < high_share
            tokens = max(8, min(int(rng.lognormvariate(0, 0.6) * mean_tokens / 1.197), int(mean_tokens * 5)))
            plan.append(Planned(tag=f"r{len(plan):06d}", at=round(t, 4), phase=phase.name,
                                stream=rng.random() < stream_share, high=high, max_tokens=tokens,
                                prompt_chars=int(prompt_chars * rng.uniform(0.5, 1.5)),
                                timeout=timeout_high if high else timeout_low))
    return plan


@dataclass
class Target:
    """How a setting names the classes: by model name (the project) or by request priority (the lab)."""

    url: str
    key: str
    model_high: str
    model_low: str
    priority_in_body: bool


def body(p: Planned, target: Target) -> dict[str, Any]:
    req: dict[str, Any] = {
        "model": target.model_high if p.high else target.model_low,
        "messages": [{"role": "user", "content": f"[{p.tag}] " + "lorem ipsum " * (p.prompt_chars // 12)}],
        "max_tokens": p.max_tokens,
        "stream": p.stream,
    }
    if p.stream:
        req["stream_options"] = {"include_usage": True}
    if target.priority_in_body:
        req["priority"] = 0 if p.high else 10
    return req


async def one(session: aiohttp.ClientSession, target: Target, p: Planned, t0: float, out: Result) -> None:
    start = time.monotonic()
    try:
        async with asyncio.timeout(p.timeout):
            async with session.post(f"{target.url}/v1/chat/completions", json=body(p, target),
                                    headers={"Authorization": f"Bearer {target.key}"}) as resp:
                out.status = resp.status
                if resp.status != 200:
                    out.kind = f"http_{resp.status}"
                    out.error = (await resp.text())[:300]
                    return
                if not p.stream:
                    data = await resp.json()
                    out.tokens = int((data.get("usage") or {}).get("completion_tokens") or 0)
                    out.ok = out.tokens > 0
                    out.kind = "" if out.ok else "empty"
                    return
                finished = done = False
                async for raw in resp.content:
                    line = raw.decode(errors="replace").strip()
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        done = True
                        break
                    chunk = json.loads(payload)
                    if "error" in chunk:
                        out.error = json.dumps(chunk["error"])[:300]
                        break
                    usage = chunk.get("usage") or {}
                    out.tokens = int(usage.get("completion_tokens") or out.tokens)
                    for choice in chunk.get("choices") or []:
                        if (choice.get("delta") or {}).get("content") and out.ttft is None:
                            out.ttft = time.monotonic() - start
                        finished = finished or bool(choice.get("finish_reason"))
                out.ok = done and finished and not out.error
                out.kind = "" if out.ok else "stream_broken"
    except TimeoutError:
        out.kind, out.error = "client_timeout", f"no complete answer within {p.timeout} s"
    except (aiohttp.ClientError, json.JSONDecodeError, ConnectionError) as exc:
        out.kind, out.error = "connection", f"{type(exc).__name__}: {exc}"[:300]
    finally:
        out.ended = time.monotonic() - t0
        out.latency = time.monotonic() - start


async def play(plan: list[Planned], target: Target, t0: float, results: list[Result]) -> None:
    """Open loop: every request starts at its planned time, whatever the others do."""
    # A new connection per request: a reused keep-alive connection that the proxy closes as the
    # next request goes out reads as "connection reset", a failure of the client's, not the gateway's.
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
        tasks = []
        for p in plan:
            delay = t0 + p.at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            r = Result(tag=p.tag, at=p.at, phase=p.phase, stream=p.stream, high=p.high, max_tokens=p.max_tokens)
            results.append(r)
            tasks.append(asyncio.create_task(one(session, target, p, t0, r)))
        await asyncio.gather(*tasks)


@dataclass
class Sampler:
    """Once a second: every replica's running/waiting/tokens/received, and the gateway's deployment
    state (per api_base and per series), cooldown counters (per api_base) and admission gauges."""

    replicas: dict[str, str]  # name -> base URL
    gateway: str
    gateway_key: str = ""  # bearer for the gateway's /metrics/ (the role's proxy requires one)
    samples: list[dict[str, Any]] = field(default_factory=list)
    stop: bool = False

    async def run(self, t0: float, period: float = 1.0) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
            while not self.stop:
                tick = time.monotonic()
                row: dict[str, Any] = {"t": round(tick - t0, 2), "replicas": {}, "gateway": {}}
                for name, url in self.replicas.items():
                    row["replicas"][name] = await self._replica(session, url)
                row["gateway"] = await self._gateway(session)
                self.samples.append(row)
                await asyncio.sleep(max(0.0, period - (time.monotonic() - tick)))

    async def _get(self, session: aiohttp.ClientSession, url: str, key: str = "") -> tuple[int, str]:
        try:
            async with session.get(url, headers={"Authorization": f"Bearer {key}"} if key else None) as resp:
                return resp.status, await resp.text()
        except (aiohttp.ClientError, TimeoutError, ConnectionError):
            return 0, ""

    async def _replica(self, session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
        health, _ = await self._get(session, url + "/health")
        status, text = await self._get(session, url + "/metrics")
        row: dict[str, Any] = {"up": status == 200, "healthy": health == 200}
        names = {"vllm:num_requests_running": "running", "vllm:num_requests_waiting": "waiting",
                 "vllm:generation_tokens_total": "tokens", "bench:requests_received_total": "received"}
        for name, _labels, value in parse_metrics(text):
            if name in names:
                row[names[name]] = value
        return row

    async def _gateway(self, session: aiohttp.ClientSession) -> dict[str, Any]:
        _, text = await self._get(session, self.gateway + "/metrics/", self.gateway_key)  # the proxy redirects /metrics
        return gateway_row(text)


def to_json(results: list[Result]) -> list[dict[str, Any]]:
    return [asdict(r) for r in results]


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def failures(results: Iterable[Result], keep: Callable[[Result], bool] = lambda r: True) -> list[Result]:
    return [r for r in results if not r.ok and keep(r)]
