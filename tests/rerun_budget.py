"""The no-op re-run's task budget (Issue 31): a deterministic guard that times nothing.

The stack scenario's second run (`labctl provision` of site.yml on a converged lab) reports, per
host, the tasks that ran (ok) and those skipped. molecule/stack/rerun-budget.yml records both;
test_stack.py::test_second_run_changes_nothing_and_restarts_nothing fails when a count rises above
its budget (each task costs a re-run time over SSH, most of them a call on the target), or falls
more than `slack` below it (then the budget is lowered, so that the next rise shows). A budget is
raised only on purpose, in the commit that adds the tasks, with the reason in its message."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

BUDGET_FILE = Path(__file__).resolve().parents[1] / "molecule" / "stack" / "rerun-budget.yml"
COUNTS = ("ok", "skipped")


def load(path: Path = BUDGET_FILE) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict) or not isinstance(data.get("hosts"), dict) or not isinstance(data.get("slack"), int):
        raise ValueError(f"{path}: needs 'slack' (an integer) and 'hosts' (host: {{ok: N, skipped: N}})")
    return data


def problems(counts: dict[str, dict[str, int]], budget: dict[str, Any], where: str = "molecule/stack/rerun-budget.yml") -> list[str]:
    """What is wrong with a re-run's per-host counts against the budget; empty when it holds."""
    found: list[str] = []
    slack = int(budget["slack"])
    hosts = budget["hosts"]
    for host in sorted(set(counts) | set(hosts)):
        if host not in hosts:
            found.append(f"{host}: ran in the re-run but has no budget in {where}")
            continue
        if host not in counts:
            found.append(f"{host}: has a budget in {where} but did not run")
            continue
        for key in COUNTS:
            have, allowed = int(counts[host].get(key, 0)), int(hosts[host][key])
            if have > allowed:
                found.append(f"{host}: {have} {key} tasks in the no-op re-run, budget {allowed} ({where}): "
                             f"{have - allowed} more. Fold them into existing tasks, or raise the budget on purpose")
            elif have < allowed - slack:
                found.append(f"{host}: {have} {key} tasks in the no-op re-run, budget {allowed}: lower the budget "
                             f"to {have} in {where}, so that the next rise shows")
    return found
