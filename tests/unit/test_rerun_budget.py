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


def test_a_rerun_at_its_budget_passes() -> None:
    budget, counts = _committed()
    assert rerun_budget.problems(counts, budget) == []
    within = {h: {"ok": c["ok"] - budget["slack"], "skipped": c["skipped"]} for h, c in counts.items()}
    assert rerun_budget.problems(within, budget) == []


def test_forty_more_tasks_fail() -> None:
    budget, counts = _committed()
    for key in ("ok", "skipped"):
        more = {h: {**c, key: c[key] + 40} for h, c in counts.items()}
        found = rerun_budget.problems(more, budget)
        assert len(found) == 1 and f"{key} tasks" in found[0] and "40 more" in found[0], found
    one = {h: {**c, "ok": c["ok"] + 1} for h, c in counts.items()}
    assert rerun_budget.problems(one, budget), "one task over the budget fails too"


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
