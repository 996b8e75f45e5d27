"""The gateway benchmark's reading of LiteLLM's /metrics (bench/gatewaymetrics.py): deployment state
per series, cooldowns, admission gauges, and the "healthy replica never cooled down" check that must
not be fooled by the stale series a replica kill leaves behind."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
import gatewaymetrics as gm  # noqa: E402

A, B = "http://127.0.0.1:18100/v1", "http://127.0.0.1:18101/v1"


def state(base: str, name: str, value: float, pid: str = "1") -> str:
    served = "bench-0" if base == A else "bench-1"
    return (f'litellm_deployment_state{{api_base="{base}",api_provider="openai",litellm_model_name="{name}",'
            f'model_id="gpt-oss-120b@{served}",pid="{pid}"}} {value}')


def metrics(*lines: str, cooled_b: float = 0.0) -> str:
    return "\n".join([
        "# HELP litellm_deployment_state LLM Deployment state",
        "# TYPE litellm_deployment_state gauge",
        *lines,
        f'litellm_deployment_cooled_down_total{{api_base="{B}",exception_status="500",litellm_model_name="x",model_id="y"}} {cooled_b}',
        'litellm_admission_admitted_requests{pid="1"} 30.0',
        'litellm_admission_admitted_requests{pid="2"} 12.0',
        "litellm_admission_queued_requests 3.0",
    ])


def sample(t: float, text: str) -> dict[str, Any]:
    return {"t": t, "gateway": gm.gateway_row(text)}


def test_gateway_row_reads_state_cooldowns_and_admission() -> None:
    row = gm.gateway_row(metrics(state(A, "bench-0", 0.0), state(B, "gpt-oss-120b", 2.0), state(B, "bench-1", 0.0),
                                 cooled_b=5.0))
    assert row["state"] == {A: 0.0, B: 2.0}
    assert len(row["state_series"]) == 3
    assert row["cooled_down"] == {B: 5.0}
    assert (row["admitted"], row["queued"]) == (42.0, 3.0)


def test_a_stale_outage_series_left_by_the_kill_is_not_a_rise() -> None:
    # B was killed earlier: its failure series sits at 2 while its own-name series shows it healthy.
    before = metrics(state(B, "gpt-oss-120b", 2.0), state(B, "bench-1", 0.0), state(A, "bench-0", 0.0))
    during = metrics(state(B, "gpt-oss-120b", 2.0), state(B, "bench-1", 0.0), state(A, "gpt-oss-120b", 2.0))
    win = [sample(0, before), sample(1, during), sample(2, during)]
    assert gm.healthy_state_rise(win, B) == 0.0
    assert gm.healthy_state_rise(win, A) == 2.0  # the sick replica's new series counts from 0


def test_a_healthy_replica_put_into_outage_in_the_window_is_caught() -> None:
    before = metrics(state(B, "bench-1", 0.0))
    partial = metrics(state(B, "bench-1", 1.0))
    new_series = metrics(state(B, "bench-1", 0.0), state(B, "gpt-oss-120b", 2.0, pid="2"))
    assert gm.healthy_state_rise([sample(0, before), sample(1, partial)], B) == 1.0
    assert gm.healthy_state_rise([sample(0, before), sample(1, new_series)], B) == 2.0
    assert gm.healthy_state_rise([], B) is None


def test_parse_metrics_skips_comments_and_bad_values() -> None:
    text = '# HELP x y\nvllm:num_requests_running{model_name="m",engine="0"} 4\nbad_line{a="b"} NaNx\nplain 2.5\n'
    assert gm.parse_metrics(text) == [("vllm:num_requests_running", {"model_name": "m", "engine": "0"}, 4.0),
                                       ("plain", {}, 2.5)]
