"""tests/rerun_budget.py: the stack's no-op re-run stays within the task budget the repository records
(Issue 31); the stack scenario applies it to its second run, this checks the rule and the file."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
_SPEC = importlib.util.spec_from_file_location("rerun_budget", REPO / "tests" / "rerun_budget.py")
assert _SPEC and _SPEC.loader
rerun_budget = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(rerun_budget)


def _committed() -> tuple[dict[str, Any], dict[str, dict[str, int]]]:
    budget = rerun_budget.load()
    return budget, {host: dict(counts) for host, counts in budget["hosts"].items()}


def test_the_committed_budget_names_the_stack_host_and_is_tight() -> None:
    budget, counts = _committed()
    assert set(counts) == {"labctl-stack"}
    # Tight enough that 40 more tasks (the example) can never hide in the slack.
    assert 0 < budget["slack"] <= 10
    assert all(c["ok"] > 100 for c in counts.values())
    # and a few module calls more (each 0.2 s over SSH) cannot hide either
    assert 0 < budget["call_slack"] <= 3 and all(0 < c["calls"] < c["ok"] for c in counts.values())


def test_a_rerun_at_its_budget_passes() -> None:
    budget, counts = _committed()
    assert rerun_budget.problems(counts, budget) == []
    within = {h: {"ok": c["ok"] - budget["slack"], "skipped": c["skipped"], "calls": c["calls"] - budget["call_slack"]}
              for h, c in counts.items()}
    assert rerun_budget.problems(within, budget) == []


def test_forty_more_tasks_fail() -> None:
    budget, counts = _committed()
    for key in ("ok", "skipped", "calls"):
        more = {h: {**c, key: c[key] + 40} for h, c in counts.items()}
        found = rerun_budget.problems(more, budget)
        assert len(found) == 1 and f"{key} tasks" in found[0] and "40 more" in found[0], found
    for key in ("ok", "calls"):
        one = {h: {**c, key: c[key] + 1} for h, c in counts.items()}
        assert rerun_budget.problems(one, budget), f"one {key} over the budget fails too"


def test_a_budget_far_above_the_run_asks_to_be_lowered() -> None:
    budget, counts = _committed()
    fewer = {h: {**c, "ok": c["ok"] - budget["slack"] - 1} for h, c in counts.items()}
    found = rerun_budget.problems(fewer, budget)
    assert len(found) == 1 and "lower the budget" in found[0], found


def test_a_host_without_budget_or_without_run_is_named() -> None:
    budget, counts = _committed()
    extra = {**counts, "labctl-other": {"ok": 1, "skipped": 0}}
    assert any("labctl-other" in p and "no budget" in p for p in rerun_budget.problems(extra, budget))
    assert any("did not run" in p for p in rerun_budget.problems({}, budget))


def test_a_malformed_budget_file_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "budget.yml"
    bad.write_text("hosts: {}\n")
    with pytest.raises(ValueError, match="slack"):
        rerun_budget.load(bad)
    bad.write_text("slack: 8\ncall_slack: 2\nhosts: {h: {ok: 1, skipped: 2}}\n")
    with pytest.raises(ValueError, match="host h needs ok, skipped, calls"):
        rerun_budget.load(bad)


def _event(kind: str, host: str, task: str, action: str) -> dict[str, Any]:
    return {"event": kind, "event_data": {"host": host, "task_uuid": task, "task_action": action}}


def test_module_calls_count_what_went_through_the_module_wrapper() -> None:
    events = [
        {"event": "playbook_on_start", "event_data": {}},
        _event("runner_on_ok", "h1", "t1", "ansible.builtin.set_fact"),          # the control node alone
        _event("runner_on_ok", "h1", "t2", "labctl_read"),                       # a light call
        _event("runner_on_ok", "h1", "t3", "labctl_template"),
        _event("runner_on_ok", "h1", "t4", "ansible.builtin.command"),           # through the wrapper
        _event("runner_on_ok", "h1", "t5", "community.postgresql.postgresql_user"),
        _event("runner_item_on_ok", "h1", "t6", "ansible.builtin.stat"),         # a loop: once per item
        _event("runner_item_on_ok", "h1", "t6", "ansible.builtin.stat"),
        _event("runner_item_on_ok", "h1", "t6", "ansible.builtin.stat"),
        _event("runner_on_ok", "h1", "t6", "ansible.builtin.stat"),
        _event("runner_on_skipped", "h1", "t7", "ansible.builtin.command"),      # skipped: no call
        _event("runner_on_ok", "h2", "t4", "ansible.legacy.command"),
        _event("runner_on_ok", "h2", "t8", "labctl_gpu_facts"),
    ]
    assert rerun_budget.module_calls(events) == {"h1": 5, "h2": 2}
    assert rerun_budget.module_calls([]) == {}
