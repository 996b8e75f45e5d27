"""Readiness-aware routing for the LiteLLM proxy (litellm_settings.callbacks).

vLLM binds its port before it loads the model, so a replica that is (re)starting accepts a
connection and answers nothing until the load is over: minutes for the 120B. LiteLLM learns of
a replica only from failed requests (cooldown); a request it routes there in that window waits
in the listen backlog. This callback keeps, in each worker, the readiness of every replica -
its /health, polled every INTERVAL seconds - and the drain markers the rolling restart writes
(vllm role), and leaves only the ready replicas among a request's candidates. When none is
ready it leaves them all: a probe is never the cause of an outage.

One exception (issue 39): a replica whose GPU reports a fault that looks like a hang (Xid 48, 63,
79, 94, 119, uncorrectable ECC errors, row remapping pending or failed) is left out even when it is
the last one: its host's labctl-node-metrics latches the fault (labctl_gpu_fault, read every
GPU_HEALTH_INTERVAL seconds from the host's node_exporter) until an operator clears it with
`labctl gpu-clear`. A GPU host that cannot be read keeps the faults last read (none, after a restart).
"""
from __future__ import annotations

import asyncio
import functools
import logging
import os
import re
import ssl
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml
from litellm.integrations.custom_logger import CustomLogger

# Settings: labctl_readiness.yaml beside this file, rendered by the litellm role from its variables
# (roles/litellm/templates/etc/labctl/litellm/labctl_readiness.yaml.j2).
_SETTINGS: dict[str, Any] = yaml.safe_load(Path(__file__).with_suffix(".yaml").read_text(encoding="utf-8"))
INTERVAL = float(_SETTINGS["interval"])
TIMEOUT = float(_SETTINGS["timeout"])
DRAIN_DIR = str(_SETTINGS["drain_dir"])
# An https replica (on another host) must show a certificate of this CA, as for the requests
# (litellm_settings.ssl_verify).
CA_FILE = str(_SETTINGS["ca_file"])
# A replica that answered before is dropped after this many probes in a row without an answer
# (a busy event loop may miss one); a refused connection or a non-200 drops it at once.
SILENT_PROBES = 2
# Each replica's GPUs and where its host's GPU fault latch is read (api_base -> {"url", "gpus"}):
# node_exporter's textfile collector on the replica's host (the litellm role, from the topology).
GPU_HEALTH: dict[str, dict[str, Any]] = dict(_SETTINGS.get("gpu_health") or {})
GPU_HEALTH_INTERVAL = float(_SETTINGS.get("gpu_health_interval", 15))
_FAULT_LINE = re.compile(r'^labctl_gpu_fault\{(.*)\} (\S+)$')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

log = logging.getLogger("labctl.readiness")
if not log.handlers:  # the journal gets each change of a replica's readiness, once per worker
    _handler = logging.StreamHandler()
    _handler.setFormatter(logging.Formatter("labctl_readiness: %(message)s"))
    log.addHandler(_handler)
    log.setLevel(logging.INFO)
    log.propagate = False


def health_url(api_base: str) -> tuple[str, int, str]:
    """Host, port and /health path of the vLLM server behind an OpenAI api_base (.../v1)."""
    parts = urlsplit(api_base)
    path = parts.path.rstrip("/").removesuffix("/v1")
    return parts.hostname or "127.0.0.1", parts.port or (443 if parts.scheme == "https" else 80), path + "/health"


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The lab CA's context, made once (a probe a second must not read the file each time)."""
    return ssl.create_default_context(cafile=CA_FILE)


async def _status_line(host: str, port: int, path: str, tls: bool = False) -> bytes:
    # A certificate that does not chain to CA_FILE fails the handshake (ssl.SSLError, an OSError): down.
    reader, writer = await asyncio.open_connection(host, port, ssl=tls_context() if tls else None)
    try:
        writer.write(f"GET {path} HTTP/1.0\r\nHost: {host}:{port}\r\n\r\n".encode())
        await writer.drain()
        return await reader.readline()
    finally:
        writer.close()


async def probe(api_base: str, timeout: float = TIMEOUT) -> str:
    """'ok' (200), 'down' (refused, reset, another status) or 'silent' (no answer in time)."""
    try:
        # asyncio.wait_for, not asyncio.timeout: Ubuntu 22.04's Python is 3.10.
        status = await asyncio.wait_for(_status_line(*health_url(api_base), tls=urlsplit(api_base).scheme == "https"), timeout)
    except asyncio.TimeoutError:
        return "silent"
    except OSError:
        return "down"
    fields = status.split()
    return "ok" if len(fields) >= 2 and fields[1] == b"200" else "down"


def gpu_faults(text: str) -> dict[str, list[str]]:
    """GPU index -> latched faults, from the labctl_gpu_fault samples of a node_exporter answer."""
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        match = _FAULT_LINE.match(line.strip())
        if not match or match.group(2) in ("0", "0.0"):
            continue
        labels = dict(_LABEL.findall(match.group(1)))
        found.setdefault(labels.get("gpu", ""), []).append(labels.get("fault", "fault"))
    return {gpu: sorted(set(faults)) for gpu, faults in found.items()}


async def _get(url: str) -> bytes:
    """The body of a plain-HTTP GET (node_exporter), which must answer 200."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port or 80)
    try:
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        writer.write(f"GET {target} HTTP/1.0\r\nHost: {parts.netloc}\r\n\r\n".encode())
        await writer.drain()
        answer = await reader.read()
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    fields = head.split(b"\r\n", 1)[0].split()
    if len(fields) < 2 or fields[1] != b"200":
        raise OSError(f"{url}: {head.splitlines()[0] if head else b'no answer'!r}")
    return body


async def read_faults(url: str, timeout: float = TIMEOUT) -> dict[str, list[str]] | None:
    """The latched faults a GPU host's node_exporter shows, None when it cannot be read."""
    try:
        return gpu_faults((await asyncio.wait_for(_get(url), timeout)).decode(errors="replace"))
    except (asyncio.TimeoutError, OSError, ValueError):
        return None


def drained(served_name: str, now: float, drain_dir: str = DRAIN_DIR) -> bool:
    """A marker <drain_dir>/<served name> holding an expiry time (epoch seconds) still ahead."""
    try:
        with open(os.path.join(drain_dir, served_name), encoding="ascii") as handle:
            return float(handle.read().strip() or 0) > now
    except (OSError, ValueError):
        return False


class Readiness(CustomLogger):
    def __init__(self, interval: float = INTERVAL, timeout: float = TIMEOUT, drain_dir: str = DRAIN_DIR,
                 gpu_health: dict[str, dict[str, Any]] | None = None, gpu_health_interval: float = GPU_HEALTH_INTERVAL) -> None:
        super().__init__()
        self.interval, self.timeout, self.drain_dir = interval, timeout, drain_dir
        self.ready: dict[str, bool] = {}
        self.silent: dict[str, int] = {}
        self.task: asyncio.Task[None] | None = None
        self.gpu_health = GPU_HEALTH if gpu_health is None else gpu_health
        self.gpu_health_interval = gpu_health_interval
        # node_exporter URL -> GPU index -> latched faults (the last answer); when each was read.
        self.faults: dict[str, dict[str, list[str]]] = {}
        self.faults_read: float = 0.0
        self.out: dict[str, str] = {}  # api_base -> why it is out of the rotation (logged once)

    async def refresh_faults(self, urls: list[str]) -> None:
        results = await asyncio.gather(*(read_faults(url, self.timeout) for url in urls))
        for url, result in zip(urls, results, strict=True):
            if result is not None:
                self.faults[url] = result
            elif url not in self.faults:
                log.warning("GPU faults of %s cannot be read: its replicas are routed as if it had none", url)
                self.faults[url] = {}
        self.faults_read = time.monotonic()

    def gpu_fault(self, base: str) -> str:
        """Why a replica's GPU keeps it out ("GPU 1 reports xid79"), or "" when none does."""
        health = self.gpu_health.get(base)
        if not health:
            return ""
        latched = self.faults.get(str(health.get("url")), {})
        found = [f"GPU {gpu} reports {', '.join(latched[str(gpu)])}" for gpu in health.get("gpus") or [] if latched.get(str(gpu))]
        return "; ".join(found)

    async def refresh(self, bases: list[str]) -> None:
        results = await asyncio.gather(*(probe(base, self.timeout) for base in bases))
        for base, result in zip(bases, results, strict=True):
            was = self.ready.get(base)
            if result == "ok":
                self.ready[base], self.silent[base] = True, 0
            elif result == "down" or was is None:
                self.ready[base] = False
            else:
                self.silent[base] = self.silent.get(base, 0) + 1
                self.ready[base] = was and self.silent[base] < SILENT_PROBES
            if was is not None and was != self.ready[base]:
                log.warning("replica %s is %s", base, "ready" if self.ready[base] else f"not ready ({result})")

    async def poll(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.refresh(list(self.ready))
                if self.faults and time.monotonic() - self.faults_read >= self.gpu_health_interval:
                    await self.refresh_faults(list(self.faults))
            except Exception:  # keep polling whatever one round did
                log.exception("readiness probe round failed")

    def is_ready(self, deployment: dict[str, Any], now: float) -> bool:
        params = deployment.get("litellm_params") or {}
        base, model = params.get("api_base"), str(params.get("model", ""))
        if not base:
            return True
        return self.ready.get(base, True) and not drained(model.split("/", 1)[-1], now, self.drain_dir)

    async def async_filter_deployments(self, model: str, healthy_deployments: list[dict[str, Any]], messages: Any,
                                       request_kwargs: dict[str, Any] | None = None,
                                       parent_otel_span: Any = None) -> list[dict[str, Any]]:
        bases = {(d.get("litellm_params") or {}).get("api_base") for d in healthy_deployments}
        unknown = [base for base in bases if base and base not in self.ready]
        if unknown:
            await self.refresh(unknown)
        urls = sorted({str(self.gpu_health[b]["url"]) for b in bases if b in self.gpu_health} - set(self.faults))
        if urls:
            await self.refresh_faults(urls)
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self.poll())
        now = time.time()
        # A replica on a faulted GPU never gets a request, not even as the last one left.
        usable = []
        for d in healthy_deployments:
            base = str((d.get("litellm_params") or {}).get("api_base") or "")
            why = self.gpu_fault(base)
            if why != self.out.get(base, ""):
                if why:
                    log.warning("replica %s leaves the rotation until `labctl gpu-clear`: %s", base, why)
                else:
                    log.warning("replica %s: its GPU fault was cleared", base)
                self.out[base] = why
            if not why:
                usable.append(d)
        ready = [d for d in usable if self.is_ready(d, now)]
        return ready or usable


readiness = Readiness()
