"""Prometheus text parsing and the gateway-side readings of the benchmark (standard library only,
so the unit tests can import it without the bench venv)."""

from __future__ import annotations

import re
from typing import Any

_SAMPLE = re.compile(r'^(?P<name>[\w:]+)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)$')
_LABEL = re.compile(r'(\w+)="([^"]*)"')
_SERIES_LABELS = ("api_base", "model_id", "litellm_model_name", "pid")


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    out = []
    for line in text.splitlines():
        m = _SAMPLE.match(line.strip())
        if m and not line.startswith("#"):
            try:
                out.append((m["name"], dict(_LABEL.findall(m["labels"] or "")), float(m["value"])))
            except ValueError:
                continue
    return out


def gateway_row(text: str) -> dict[str, Any]:
    """One sample of LiteLLM's /metrics: deployment state per api_base (the worst series) and per
    series, cooldowns per api_base, and the admission gauges summed over workers."""
    state: dict[str, float] = {}
    series: dict[str, float] = {}
    cooled: dict[str, float] = {}
    admission = {"admitted": 0.0, "queued": 0.0}
    for name, labels, value in parse_metrics(text):
        base = labels.get("api_base", "")
        if name == "litellm_deployment_state":
            state[base] = max(state.get(base, 0.0), value)
            # LiteLLM 1.106 records a failure under the model group's name and the recovery under the
            # deployment's own model name, so a failure's series keeps its last value for good. Each
            # series is kept, so that a rise can be told from a stale value.
            series["|".join(labels.get(k, "") for k in _SERIES_LABELS)] = value
        elif name == "litellm_deployment_cooled_down_total":
            cooled[base] = cooled.get(base, 0.0) + value
        elif name == "litellm_admission_admitted_requests":
            admission["admitted"] += value
        elif name == "litellm_admission_queued_requests":
            admission["queued"] += value
    return {"state": state, "state_series": series, "cooled_down": cooled, **admission}


def healthy_state_rise(win: list[dict[str, Any]], base: str) -> float | None:
    """The largest rise of any of one replica's deployment-state series (0 healthy, 1 partial,
    2 complete outage) over the samples of a window. A series already high at the window's start
    (left by an earlier failure) is not a rise; a series that first appears counts from 0."""
    if not win:
        return None
    prefix = base + "|"
    first = {k: v for k, v in win[0]["gateway"].get("state_series", {}).items() if k.startswith(prefix)}
    rise = 0.0
    for s in win[1:]:
        for k, v in s["gateway"].get("state_series", {}).items():
            if k.startswith(prefix):
                rise = max(rise, v - first.get(k, 0.0))
    return rise
