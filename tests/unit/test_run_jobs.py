"""scripts/run-jobs.py: `make test`'s jobs two at a time, each log printed whole, failures counted; every
molecule scenario is one of its jobs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "run-jobs.py"


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), "--logs", str(tmp_path / "logs"), *args],
                          capture_output=True, text=True, timeout=60, check=False)


def test_two_at_a_time_each_log_whole_and_a_failure_fails_the_run(tmp_path: Path) -> None:
    # slow runs alone in one worker while fast and broken run in the other: at most two at once.
    marker = tmp_path / "running"
    marker.mkdir()
    job = ("touch {d}/{n}; test $(ls {d} | wc -l) -le 2 || echo TOO-MANY; "
           "for i in 1 2 3; do echo {n}-line-$i; sleep {s}; done; rm {d}/{n}")
    result = _run(tmp_path, "--jobs", "2",
                  f"slow={job.format(d=marker, n='slow', s=0.4)}",
                  f"fast={job.format(d=marker, n='fast', s=0.05)}",
                  f"broken={job.format(d=marker, n='broken', s=0.05)}; exit 3",
                  f"last={job.format(d=marker, n='last', s=0.05)}")
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    assert not [log.name for log in (tmp_path / "logs").glob("*.log") if "TOO-MANY" in log.read_text()]
    # Every job ran to its end although one failed, and each log is printed in one piece.
    for name in ("slow", "fast", "broken", "last"):
        start = out.index(f"{name}-line-1")
        assert out[start:out.index(f"{name}-line-3")].count("-line-") == 2, out
    assert "broken: FAILED (exit 3)" in out and "failed: broken" in out
    assert out.index("fast: passed") < out.index("slow: passed")  # printed as they end
    durations = json.loads((tmp_path / "logs" / "durations.json").read_text())
    assert set(durations["results"]) == {"slow", "fast", "broken", "last"}
    assert durations["results"]["broken"]["rc"] == 3 and durations["results"]["slow"]["seconds"] >= 1.2
    assert (tmp_path / "logs" / "slow.log").read_text().splitlines() == [f"slow-line-{i}" for i in (1, 2, 3)]


def test_all_pass_exit_zero(tmp_path: Path) -> None:
    result = _run(tmp_path, "a=true", "b=echo hi")
    assert result.returncode == 0, result.stdout
    assert "failed:" not in result.stdout


def test_bad_job_spec_is_refused(tmp_path: Path) -> None:
    for args in (["no-equals-sign"], ["a=true", "a=false"], ["=true"]):
        result = _run(tmp_path, *args)
        assert result.returncode != 0 and "run-jobs:" in result.stderr, (args, result.stderr)


def _make_variable(name: str) -> list[str]:
    """The words of a `NAME ?= ...` or `NAME := ...` line of the Makefile."""
    text = (SCRIPT.parents[1] / "Makefile").read_text()
    match = re.search(rf"^{name}\s*[:?]?=\s*(.*)$", text, re.MULTILINE)
    assert match, f"Makefile has no {name}"
    return match.group(1).split()


def test_every_molecule_scenario_is_a_job_of_make_test() -> None:
    """What no job runs rots (Issue 39: the scaleout scenario broke twice after passing, run by hand
    only): every scenario under molecule/ is in SCENARIOS and in TEST_JOB_ORDER, which CI runs."""
    scenarios = sorted(p.parent.name for p in (SCRIPT.parents[1] / "molecule").glob("*/molecule.yml"))
    assert "scaleout" in scenarios and "stack" in scenarios, scenarios
    assert sorted(set(scenarios) - set(_make_variable("SCENARIOS"))) == []
    assert sorted(set(scenarios) - set(_make_variable("TEST_JOB_ORDER"))) == []
