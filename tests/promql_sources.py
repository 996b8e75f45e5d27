"""The PromQL the lab ships: every dashboard query and every rule expression, and their selectors.

Used by the unit tests (tests/unit/test_dashboards.py) and by the live stack test, which asks the
running Prometheus whether every selector returns a series. Importable on its own:

    sys.path.insert(0, str(REPO / "tests"))
    from promql_sources import dashboard_queries, rule_queries, selectors

Grafana variables are substituted so that each dashboard query runs as a plain instant query:
the interval macros become fixed durations, textbox/custom/constant variables their default
value, and query variables (multi-value, "All") the regex `.*` -- which is why the dashboards put
a variable only behind `=~`/`!~` in a matcher.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import promql_parser
import yaml

# Grafana's own macros, as an instant query sees them.
BUILTIN_VALUES: Mapping[str, str] = {
    "__rate_interval": "5m",
    "__interval": "1m",
    "__interval_ms": "60000",
    "__range": "1h",
    "__range_s": "3600",
    "__range_ms": "3600000",
}
# A query (or datasource) variable stands for "any value": All, or a multi-value selection.
ANY_VALUE = ".*"

# $name, ${name}, ${name:format}, [[name]], [[name:format]] -- Grafana's variable syntaxes.
_VARIABLE = re.compile(
    r"\$\{(?P<braced>\w+)(?::[^}]*)?\}"
    r"|\[\[(?P<bracketed>\w+)(?::[^\]]*)?\]\]"
    r"|\$(?P<plain>\w+)"
)
# label_values(<selector>, <label>): the selector part is PromQL.
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?P<selector>.+)\s*,\s*(?P<label>\w+)\s*\)\s*$", re.DOTALL)


class PromQLError(ValueError):
    """A query of the lab's sources that does not parse, or names an unknown Grafana variable."""


@dataclass(frozen=True)
class Query:
    """One PromQL expression and where it comes from ("labctl-vllm.json: KV-cache usage")."""

    source: str
    expr: str

    def parse(self) -> promql_parser.Expr:
        return parse(self.expr, source=self.source)

    def selectors(self) -> list[str]:
        return selectors(self.expr, source=self.source)


def parse(expr: str, source: str = "<expr>") -> promql_parser.Expr:
    """promql_parser.parse, its error naming the source and the expression."""
    try:
        return promql_parser.parse(expr)
    except Exception as err:  # the parser raises ValueError; a Rust panic surfaces as another type
        raise PromQLError(f"{source}: does not parse: {err}\n  expr: {expr}") from err


# --- AST walk --------------------------------------------------------------------------------


def vector_selectors(node: promql_parser.Expr) -> Iterator[promql_parser.VectorSelector]:
    """Every vector selector under node (those inside matrix selectors included), in order.

    Every node type of promql_parser is handled explicitly: a new one fails loudly instead of
    hiding the selectors below it.
    """
    if isinstance(node, promql_parser.VectorSelector):
        yield node
    elif isinstance(node, promql_parser.MatrixSelector):
        yield node.vector_selector
    elif isinstance(node, promql_parser.BinaryExpr):
        yield from vector_selectors(node.lhs)
        yield from vector_selectors(node.rhs)
    elif isinstance(node, promql_parser.AggregateExpr):
        if isinstance(node.param, promql_parser.Expr):  # topk(k, ...), quantile(q, ...), count_values("l", ...)
            yield from vector_selectors(node.param)
        yield from vector_selectors(node.expr)
    elif isinstance(node, promql_parser.Call):
        for arg in node.args:
            if arg is not None:
                yield from vector_selectors(arg)
    elif isinstance(node, (promql_parser.SubqueryExpr, promql_parser.ParenExpr, promql_parser.UnaryExpr)):
        yield from vector_selectors(node.expr)
    elif isinstance(node, (promql_parser.NumberLiteral, promql_parser.StringLiteral)):
        return
    else:
        raise TypeError(f"unknown PromQL node {type(node).__name__}: {node}")


def _quote(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


# MatchOp is a pyo3 enum: compared with ==, it has no .name.
_MATCH_OPS: tuple[tuple[promql_parser.MatchOp, str], ...] = (
    (promql_parser.MatchOp.Equal, "="),
    (promql_parser.MatchOp.NotEqual, "!="),
    (promql_parser.MatchOp.Re, "=~"),
    (promql_parser.MatchOp.NotRe, "!~"),
)


def match_op(matcher: promql_parser.Matcher) -> str:
    """The matcher's operator as PromQL: =, !=, =~ or !~."""
    for op, text in _MATCH_OPS:
        if matcher.op == op:
            return text
    raise TypeError(f"unknown match operator {matcher.op!r}")


def format_matcher(matcher: promql_parser.Matcher) -> str:
    return f"{matcher.name}{match_op(matcher)}{_quote(matcher.value)}"


def format_selector(selector: promql_parser.VectorSelector) -> str:
    """The selector as PromQL: metric name and label matchers; no range, offset or @."""
    groups = [selector.matchers.matchers] if selector.matchers.matchers else []
    groups += selector.matchers.or_matchers
    inner = " or ".join(",".join(format_matcher(m) for m in group) for group in groups)
    name = selector.name or ""
    return f"{name}{{{inner}}}" if inner or not name else name


def selectors(expr: str, source: str = "<expr>") -> list[str]:
    """Every vector/matrix selector in expr as PromQL, in the order they appear.

    rate(vllm:prompt_tokens_total{job="vllm"}[5m]) -> ['vllm:prompt_tokens_total{job="vllm"}']
    """
    return [format_selector(s) for s in vector_selectors(parse(expr, source=source))]


def metric_names(expr: str, source: str = "<expr>") -> list[str]:
    """The metric names expr reads (from the name or a __name__="..." matcher), in order."""
    names: list[str] = []
    for sel in vector_selectors(parse(expr, source=source)):
        name = sel.name or next(
            (m.value for m in sel.matchers.matchers if m.name == "__name__" and match_op(m) == "="), None
        )
        if name is not None and name not in names:
            names.append(name)
    return names


# --- Grafana dashboards ----------------------------------------------------------------------


def _current_value(variable: Mapping[str, Any]) -> str:
    current = variable.get("current") or {}
    value = current.get("value")
    if isinstance(value, list):
        value = value[0] if value else None
    if value is None or value == "$__all":
        if variable.get("type") == "custom":
            options = str(variable.get("query", "")).split(",")
            return options[0].strip()
        return str(variable.get("query", ""))
    return str(value)


def variable_values(dashboard: Mapping[str, Any]) -> dict[str, str]:
    """What each of the dashboard's variables stands for in an instant query."""
    values = dict(BUILTIN_VALUES)
    for variable in dashboard.get("templating", {}).get("list", []):
        name = variable["name"]
        if variable.get("type") in ("query", "datasource", "adhoc"):
            values[name] = ANY_VALUE
        elif variable.get("type") in ("custom", "textbox", "constant", "interval"):
            values[name] = _current_value(variable)
        else:
            raise PromQLError(f"{dashboard.get('uid')}: variable {name}: unknown type {variable.get('type')!r}")
    return values


def substitute(expr: str, values: Mapping[str, str], source: str = "<expr>") -> str:
    """expr with every Grafana variable replaced; an unknown name (a typo) raises PromQLError.

    `$1`-style references (label_replace replacements) are not variables and stay as they are.
    """

    def replace(match: re.Match[str]) -> str:
        name = match.group("braced") or match.group("bracketed") or match.group("plain")
        if name[0].isdigit():
            return match.group(0)
        if name not in values:
            raise PromQLError(f"{source}: unknown Grafana variable ${name} in: {expr}")
        return values[name]

    return _VARIABLE.sub(replace, expr)


def _walk_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _walk_panels(panel.get("panels", []))  # a collapsed row keeps its panels


def panels(dashboard: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every panel of the dashboard, those inside (collapsed) rows included, rows too."""
    return list(_walk_panels(dashboard.get("panels", [])))


def load_dashboards(dashboards_dir: Path) -> dict[str, dict[str, Any]]:
    """File name -> dashboard JSON, for every *.json in dashboards_dir, sorted by name."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(dashboards_dir.glob("*.json")):
        try:
            out[path.name] = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: not valid JSON: {err}") from err
    return out


def dashboard_queries(dashboards_dir: Path) -> list[Query]:
    """Every PromQL query of the dashboards in dashboards_dir, ready for an instant query.

    The panel targets (source "labctl-vllm.json: <panel title>", with " [refId]" added where a
    panel has more than one target) and the selector of every label_values(...) variable query
    (source "labctl-vllm.json: variable <name>"). Targets that are hidden or have no expr are
    skipped.
    """
    queries: list[Query] = []
    for file_name, dashboard in load_dashboards(dashboards_dir).items():
        values = variable_values(dashboard)
        for variable in dashboard.get("templating", {}).get("list", []):
            if variable.get("type") != "query":
                continue
            query = variable.get("query")
            text = query.get("query", "") if isinstance(query, dict) else str(query or "")
            source = f"{file_name}: variable {variable['name']}"
            match = _LABEL_VALUES.match(text)
            if match is None:
                raise PromQLError(f"{source}: only label_values(<selector>, <label>) is supported: {text!r}")
            queries.append(Query(source, substitute(match.group("selector").strip(), values, source)))
        for panel in panels(dashboard):
            targets = [t for t in panel.get("targets", []) if t.get("expr") and not t.get("hide")]
            for target in targets:
                source = f"{file_name}: {panel.get('title', '<untitled>')}"
                if len(targets) > 1:
                    source += f" [{target.get('refId', '?')}]"
                queries.append(Query(source, substitute(target["expr"], values, source)))
    return queries


# --- Prometheus rule files -------------------------------------------------------------------


def rule_queries(rules_dir: Path) -> list[Query]:
    """The expr of every rule in every *.yml/*.yaml rule file under rules_dir (recursively).

    Source: "<file name>: <alert or record name>".
    """
    queries: list[Query] = []
    files = sorted(p for p in rules_dir.rglob("*") if p.suffix in (".yml", ".yaml") and p.is_file())
    for path in files:
        name = str(path.relative_to(rules_dir))
        document = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        if not isinstance(document, dict) or not isinstance(document.get("groups", []), list):
            raise ValueError(f"{path}: not a Prometheus rule file (no groups list)")
        for group in document.get("groups") or []:
            for rule in group.get("rules") or []:
                rule_name = rule.get("alert") or rule.get("record") or "<unnamed>"
                if "expr" not in rule:
                    raise ValueError(f"{path}: rule {rule_name} has no expr")
                queries.append(Query(f"{name}: {rule_name}", str(rule["expr"]).strip()))
    return queries
