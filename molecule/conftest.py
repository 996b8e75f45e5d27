"""Shared by every scenario's verify (pytest loads it for molecule/<scenario>/tests): when a
verify fails, save what an operator would look at before molecule destroys the containers
(tests/forensics.py) and print where, with the first lines, into the CI log."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

import forensics  # noqa: E402


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int) -> None:
    inventory = os.environ.get("MOLECULE_INVENTORY_FILE")
    if exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED) or not inventory:
        return
    scenario = os.environ.get("MOLECULE_SCENARIO_NAME", "scenario")
    out_dir = REPO / "build" / "forensics" / scenario
    result = forensics.collect(forensics.inventory_hosts(inventory), out_dir)
    terminalreporter.section("forensics (saved before destroy)")
    for line in forensics.summary(result, out_dir):
        terminalreporter.write_line(line)
