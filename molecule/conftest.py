"""Shared by every scenario's verify (pytest loads it for molecule/<scenario>/tests): when a
verify fails, save what an operator would look at before molecule destroys the containers
(tests/forensics.py) and print where, with the first lines, into the CI log.

Tests marked `extended` run only with LABCTL_TEST_EXTENDED=1 (`make test-extended` for the stack
scenario, `make test-scaleout` for the scaleout scenario): on the 2-core CI machine `make test` has
to end within its budget, so the slowest checks of behaviour that other tests already approach (a
power cut, the compile cache's gain, drift through a whole check-mode run, security updates across
three hosts, ...) are skipped there, with the reason in the log."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

import forensics  # noqa: E402

EXTENDED = os.environ.get("LABCTL_TEST_EXTENDED") == "1"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "extended: slow; runs with LABCTL_TEST_EXTENDED=1 (make test-extended), not in make test")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if EXTENDED:
        return
    skip = pytest.mark.skip(reason="extended: runs in make test-extended or make test-scaleout (LABCTL_TEST_EXTENDED=1), "
                            "not in make test")
    for item in items:
        if item.get_closest_marker("extended"):
            item.add_marker(skip)


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
