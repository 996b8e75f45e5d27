"""The no-op re-run's task budget (Issue 31): a deterministic guard that times nothing.

The stack scenario's second run (`labctl provision` of site.yml on a converged lab) reports, per
host, the tasks that ran (ok) and those skipped, and its events say which of the tasks that ran
called a module through ansible's wrapper (`calls`: about 0.2 s each over SSH, against 0.05 s for a
light call and nothing for a task the control node answers alone). molecule/stack/rerun-budget.yml
records all three;
test_stack.py::test_second_run_changes_nothing_and_restarts_nothing fails when a count rises above
its budget (each task costs a re-run time over SSH, most of them a call on the target), or falls
more than `slack` below it (then the budget is lowered, so that the next rise shows). A budget is
raised only on purpose, in the commit that adds the tasks, with the reason in its message."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

BUDGET_FILE = Path(__file__).resolve().parents[1] / "molecule" / "stack" / "rerun-budget.yml"
COUNTS = ("ok", "skipped", "calls")

# Tasks the control node answers alone: no call on a host.
CONTROLLER_ONLY = frozenset(("set_fact", "assert", "debug", "fail", "meta", "include_tasks", "import_tasks", "include_role",
                             "import_role", "validate_argument_spec", "include_vars", "set_stats", "add_host", "group_by"))
# Tasks answered in one light call when nothing is to change (action_plugins/labctl_read.py).
LIGHT = frozenset(("labctl_read", "labctl_stat", "labctl_http", "labctl_template", "labctl_directories", "labctl_service",
                   "labctl_packages", "labctl_account"))


def module_calls(events: Iterable[dict[str, Any]]) -> dict[str, int]:
    """Per host, the module calls through ansible's wrapper in a run's events (ansible-runner's
    events.jsonl): every task that ran, neither answered on the control node nor by a light call;
    a loop's task once per item."""
    items: Counter[tuple[str, str]] = Counter()
    tasks: dict[tuple[str, str], str] = {}
    for event in events:
        kind, data = event.get("event"), event.get("event_data") or {}
        if kind not in ("runner_on_ok", "runner_item_on_ok") or not data.get("host"):
            continue
        action = str(data.get("task_action") or "").removeprefix("ansible.builtin.").removeprefix("ansible.legacy.")
        if action in CONTROLLER_ONLY or action in LIGHT:
            continue
        key = (str(data["host"]), str(data.get("task_uuid")))
        if kind == "runner_item_on_ok":
            items[key] += 1
        else:
            tasks[key] = action
    calls: Counter[str] = Counter()
    for key in tasks:
        calls[key[0]] += items[key] or 1
    return dict(calls)


def load(path: Path = BUDGET_FILE) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict) or not isinstance(data.get("hosts"), dict) or not isinstance(data.get("slack"), int) \
            or not isinstance(data.get("call_slack"), int):
        raise ValueError(f"{path}: needs 'slack' and 'call_slack' (integers) and 'hosts' (host: {{ok: N, skipped: N, calls: N}})")
    for host, counts in data["hosts"].items():
        if not isinstance(counts, dict) or not all(isinstance(counts.get(key), int) for key in COUNTS):
            raise ValueError(f"{path}: host {host} needs {', '.join(COUNTS)} (integers)")
    return data


def problems(counts: dict[str, dict[str, int]], budget: dict[str, Any], where: str = "molecule/stack/rerun-budget.yml") -> list[str]:
    """What is wrong with a re-run's per-host counts against the budget; empty when it holds."""
    found: list[str] = []
    hosts = budget["hosts"]
    for host in sorted(set(counts) | set(hosts)):
        if host not in hosts:
            found.append(f"{host}: ran in the re-run but has no budget in {where}")
            continue
        if host not in counts:
            found.append(f"{host}: has a budget in {where} but did not run")
            continue
        for key in COUNTS:
            slack = int(budget["call_slack"] if key == "calls" else budget["slack"])
            have, allowed = int(counts[host].get(key, 0)), int(hosts[host][key])
            if have > allowed:
                more = ("Fold them into existing tasks" if key != "calls" else
                        "Read with labctl_read, labctl_stat or labctl_http, or answer on the control node")
                found.append(f"{host}: {have} {key} tasks in the no-op re-run, budget {allowed} ({where}): "
                             f"{have - allowed} more. {more}, or raise the budget on purpose")
            elif have < allowed - slack:
                found.append(f"{host}: {have} {key} tasks in the no-op re-run, budget {allowed}: lower the budget "
                             f"to {have} in {where}, so that the next rise shows")
    return found
