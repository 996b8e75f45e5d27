"""Priority-aware admission for the LiteLLM proxy (litellm_settings.callbacks).

Every queue a request can wait in honours its class. LiteLLM's own admission queue
(general_settings.max_in_flight_requests_per_worker) is first come, first served; this gate sits
behind it (the proxy awaits async_pre_call_hook before it routes) and admits at most SLOTS
requests per worker to the replicas. The rest wait in one queue per class: the most urgent class
(lowest vLLM priority) first, first come first served within a class. A class with a floor (the
batch class: 20 % of the slots by default) that has requests waiting gets the next slot while it
holds fewer than its floor, so it is never starved. A request that waits longer than TIMEOUT
gets 503 with Retry-After. Behind the gate vLLM (--scheduling-policy priority) orders what it
holds by the same priority. A slot is given back exactly once: by the success hook
(non-streaming), the failure hook, or the end of the stream (the iterator hook's finally); a
slot held longer than MAX_HOLD is taken back (a request that vanished without any hook).

A request's slot is found by the request itself, never by anything it carries: the ticket lives
in a context variable of the request's task (every hook of one request runs in that task or a
task started from it), so no request can name, and free, another's slot, and nothing of the
gate reaches the request's metadata (on /v1/responses LiteLLM forwards `metadata` to vLLM, which
echoes it to the client).

The class: a key's metadata {"priority": N} (database mode: per application key) or, without
it, the requested model class's priority (model_list extra_body.priority).
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import logging
import math
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import yaml
from litellm.integrations.custom_logger import CustomLogger

# Settings: labctl_admission.yaml beside this file, rendered by the litellm role from its variables
# (roles/litellm/templates/etc/labctl/litellm/labctl_admission.yaml.j2).
_SETTINGS: dict[str, Any] = yaml.safe_load(Path(__file__).with_suffix(".yaml").read_text(encoding="utf-8"))
SLOTS = int(_SETTINGS["slots"])
CLASSES: dict[str, int] = {str(name): int(priority) for name, priority in _SETTINGS["classes"].items()}
FLOORS: dict[str, float] = {str(priority): float(share) for priority, share in _SETTINGS["floors"].items()}
RESERVE = float(_SETTINGS["reserve"])
TIMEOUT = float(_SETTINGS["timeout"])
RETRY_AFTER = int(_SETTINGS["retry_after"])
MAX_HOLD = float(_SETTINGS["max_hold"])
# The class of a model name no class lists (e.g. a deployment's own name): the least urgent.
DEFAULT_PRIORITY = max(CLASSES.values(), default=0)

log = logging.getLogger("labctl.admission")
if not log.handlers:
    _handler = logging.StreamHandler()
    _handler.setFormatter(logging.Formatter("labctl_admission: %(message)s"))
    log.addHandler(_handler)
    log.setLevel(logging.INFO)
    log.propagate = False


class AdmissionTimeout(Exception):
    """A request waited past the admission timeout."""


class Gate:
    """One worker's admission: at most SLOTS requests in flight; the rest wait in one queue per
    class, the most urgent class (lowest priority number) first, first come first served within
    a class. A class with a floor (a share of the slots) that has requests waiting gets the next
    slot while it holds fewer than its floor, so it is never starved. The last RESERVE share of
    the slots only the most urgent class takes (a less urgent one only below its floor)."""

    def __init__(self, slots: int, floors: dict[int, float] | None = None, timeout: float = 900.0,
                 reserve: float = 0.0, urgent: int = 0) -> None:
        if slots < 1:
            raise ValueError("slots must be at least 1")
        self.slots = slots
        self.timeout = timeout
        self.floors = {p: max(1, math.ceil(share * slots)) for p, share in (floors or {}).items() if share > 0}
        # Slots only the most urgent class (priority `urgent`) may take: kept free for it, so an
        # interactive request finds a replica's sequence free instead of waiting for one to end.
        self.reserve = min(slots - 1, math.ceil(reserve * slots)) if reserve > 0 else 0
        self.urgent = urgent
        self.running: dict[int, int] = {}
        self.waiting: dict[int, collections.deque[asyncio.Future[None]]] = {}
        self.admitted = 0

    def in_flight(self) -> int:
        return sum(self.running.values())

    def queued(self, priority: int | None = None) -> int:
        if priority is not None:
            return len(self.waiting.get(priority, ()))
        return sum(len(q) for q in self.waiting.values())

    def _below_floor(self, priority: int) -> bool:
        return priority in self.floors and self.running.get(priority, 0) < self.floors[priority]

    def _may_take(self, priority: int) -> bool:
        """Whether a request of this class may take a free slot now (the reserve is the urgent class's)."""
        limit = self.slots if priority <= self.urgent or self._below_floor(priority) else self.slots - self.reserve
        return self.in_flight() < limit

    def _next(self) -> int | None:
        """The class whose head is admitted next, or None when nothing waits."""
        waiting = sorted(p for p, q in self.waiting.items() if q)
        if not waiting:
            return None
        for priority in waiting:  # a class below its floor first (the most urgent of them)
            if self._below_floor(priority):
                return priority
        return waiting[0]

    def _dispatch(self) -> None:
        while self.in_flight() < self.slots:
            priority = self._next()
            if priority is None or not self._may_take(priority):
                return
            future = self.waiting[priority].popleft()
            if future.done():  # cancelled while it waited
                continue
            self.running[priority] = self.running.get(priority, 0) + 1
            self.admitted += 1
            future.set_result(None)

    async def acquire(self, priority: int) -> None:
        """Wait for a slot for a request of this class (AdmissionTimeout after the timeout)."""
        if self._next() is None and self._may_take(priority):
            self.running[priority] = self.running.get(priority, 0) + 1
            self.admitted += 1
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting.setdefault(priority, collections.deque()).append(future)
        self._dispatch()
        try:
            await asyncio.wait_for(asyncio.shield(future), self.timeout)
        except (asyncio.TimeoutError, asyncio.CancelledError) as exc:
            if future.done() and not future.cancelled():
                self.release(priority)  # granted in the same instant: give it back
            else:
                future.cancel()
                with contextlib.suppress(ValueError):
                    self.waiting[priority].remove(future)
            if isinstance(exc, asyncio.TimeoutError):
                raise AdmissionTimeout(f"waited {self.timeout:.0f} s for admission") from None
            raise

    def release(self, priority: int) -> None:
        if self.running.get(priority, 0) > 0:
            self.running[priority] -= 1
        self._dispatch()


_current: contextvars.ContextVar[Ticket | None] = contextvars.ContextVar("labctl_admission_ticket", default=None)


class Ticket:
    """One admitted request's slot; release() gives it back once, whatever calls it."""

    def __init__(self, gate: Gate, priority: int) -> None:
        self.gate, self.priority, self.started, self.done = gate, priority, time.monotonic(), False

    def release(self) -> None:
        if not self.done:
            self.done = True
            self.gate.release(self.priority)


def priority_of(model: str, key_metadata: Any) -> int:
    """The request's class: the key's {"priority": N} when it has one, else the model class's."""
    if isinstance(key_metadata, dict):
        value = key_metadata.get("priority")
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            return int(value)
    return int(CLASSES.get(model, DEFAULT_PRIORITY))


class Admission(CustomLogger):
    def __init__(self, slots: int = SLOTS, floors: dict[int, float] | None = None, timeout: float = TIMEOUT,
                 max_hold: float = MAX_HOLD, reserve: float | None = None) -> None:
        super().__init__()
        self.gate = Gate(slots, {int(p): float(s) for p, s in (FLOORS if floors is None else floors).items()}, timeout,
                         RESERVE if reserve is None else reserve, min(CLASSES.values(), default=0))
        self.max_hold = max_hold
        # The tickets held, for the reaper only: a hook finds its request's ticket in _current.
        self.tickets: set[Ticket] = set()

    def _reap(self) -> None:
        now = time.monotonic()
        for ticket in list(self.tickets):
            if now - ticket.started > self.max_hold:
                log.warning("took back a slot held %.0f s by a request no hook ended", now - ticket.started)
                self._end(ticket)

    def _end(self, ticket: Ticket | None) -> None:
        if ticket is not None:
            self.tickets.discard(ticket)
            ticket.release()

    async def async_pre_call_hook(self, user_api_key_dict: Any, cache: Any, data: dict[str, Any], call_type: Any) -> dict[str, Any]:
        held = _current.get()
        if held is not None and not held.done:  # LiteLLM ran the pre-call hooks again (rate-limit fallback)
            return data
        self._reap()
        priority = priority_of(str(data.get("model", "")), getattr(user_api_key_dict, "metadata", None))
        try:
            await self.gate.acquire(priority)
        except AdmissionTimeout as exc:
            # ProxyException, not fastapi's HTTPException: /v1/completions drops an HTTPException's
            # headers (LiteLLM 1.106.0's own except there), and Retry-After with them.
            from litellm.proxy._types import ProxyException

            raise ProxyException(message=f"labctl admission: {exc}; retry later", type="service_unavailable",
                                 param=None, code=503, headers={"Retry-After": str(RETRY_AFTER)}) from None
        ticket = Ticket(self.gate, priority)
        self.tickets.add(ticket)
        _current.set(ticket)
        task = asyncio.current_task()
        if task is not None:  # a request task cancelled before any hook ran gives its slot back
            task.add_done_callback(lambda done: self._end(ticket) if done.cancelled() else None)
        return data

    async def async_post_call_success_hook(self, data: dict[str, Any], user_api_key_dict: Any, response: Any) -> None:
        self._end(_current.get())

    async def async_post_call_failure_hook(self, request_data: dict[str, Any], original_exception: Exception,
                                           user_api_key_dict: Any, traceback_str: str | None = None) -> None:
        self._end(_current.get())

    async def async_post_call_streaming_iterator_hook(self, user_api_key_dict: Any, response: Any,
                                                      request_data: dict[str, Any]) -> AsyncIterator[Any]:
        ticket = _current.get()  # the stream's first read runs in the request's task: keep its ticket
        try:
            async for item in response:
                yield item
        finally:
            self._end(ticket)


admission = Admission()
