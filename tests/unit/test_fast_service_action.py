"""labctl_service (action) and labctl_unit_state (its probe): a unit that is enabled, running and
loaded from its current files is answered in one `systemctl show`; every other case goes to
ansible.builtin.systemd_service with the task's own arguments. The action runs for real in every
molecule scenario (systemd as PID 1); here the probe's reading and judgement, and the docs."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


state = _load("labctl_unit_state", REPO / "library" / "labctl_unit_state.py")
action = _load("labctl_service_action", REPO / "action_plugins" / "labctl_service.py")

# `systemctl show --property=Id,LoadState,ActiveState,SubState,UnitFileState,NeedDaemonReload,Triggers -- a b`
# on Debian 12's systemd 252: one block per unit, in the order asked, blank lines between.
SHOW = """Id=prometheus.service
LoadState=loaded
ActiveState=active
SubState=running
UnitFileState=enabled
NeedDaemonReload=no

Id=nope.service
LoadState=not-found
ActiveState=inactive
SubState=dead
UnitFileState=
NeedDaemonReload=no
"""
GOOD = {"Id": "x.service", "LoadState": "loaded", "ActiveState": "active", "SubState": "running",
        "UnitFileState": "enabled", "NeedDaemonReload": "no"}


def test_show_is_read_one_block_per_unit_in_order() -> None:
    blocks = state.parse_show(SHOW)
    assert [b["Id"] for b in blocks] == ["prometheus.service", "nope.service"]
    assert blocks[1]["UnitFileState"] == "" and blocks[0]["SubState"] == "running"


@pytest.mark.parametrize(("want", "status", "reason"), [
    ({"enabled": True, "started": True}, {}, ""),
    ({"started": True}, {"UnitFileState": "static"}, ""),  # enabled not asked: not judged
    ({"enabled": False}, {"UnitFileState": "disabled", "ActiveState": "inactive"}, ""),
    ({"enabled": True, "started": True}, {"LoadState": "not-found"}, "LoadState=not-found"),
    ({"enabled": True, "started": True}, {"NeedDaemonReload": "yes"}, "a daemon reload is pending"),
    ({"enabled": True, "started": True}, {"ActiveState": "activating"}, "ActiveState=activating"),
    ({"enabled": True, "started": True}, {"ActiveState": "failed"}, "ActiveState=failed"),
    ({"enabled": True}, {"UnitFileState": "disabled"}, "UnitFileState=disabled"),
    ({"enabled": True}, {"UnitFileState": "static"}, "UnitFileState=static"),
    ({"enabled": True}, {"UnitFileState": "masked"}, "UnitFileState=masked"),
    ({"enabled": False}, {"UnitFileState": "enabled"}, "UnitFileState=enabled"),
])
def test_a_unit_is_current_only_when_nothing_is_left_to_do(want: dict[str, Any], status: dict[str, str], reason: str) -> None:
    answer = state.judge({"name": "x.service", **want}, {**GOOD, **status})
    assert answer["reason"] == reason and answer["current"] is (reason == "")


def test_a_timer_whose_service_changed_on_disk_is_not_current() -> None:
    # The dump timer is current, but its service file was rewritten: without the daemon reload the
    # next run of the timer would start the old service.
    timer = {**GOOD, "Id": "labctl-pg-dump.timer", "Triggers": "labctl-pg-dump.service"}
    want = {"name": "labctl-pg-dump.timer", "enabled": True, "started": True}
    assert state.judge(want, timer, {"labctl-pg-dump.service": "no"})["current"] is True
    answer = state.judge(want, timer, {"labctl-pg-dump.service": "yes"})
    assert answer["reason"] == "a daemon reload is pending for labctl-pg-dump.service"
    assert state.judge(want, timer, {})["current"] is False, "an unread triggered unit is never assumed current"


def test_the_fast_path_takes_only_the_arguments_it_judges() -> None:
    # no_block (Issue 39: the replicas of a shared GPU started with --no-block, systemd ordering them) only
    # changes how a needed start is made: a running unit needs none, so it keeps the one-call answer.
    assert frozenset({"name", "enabled", "state", "daemon_reload", "no_block"}) == action.FAST_ARGS


def test_documentation_parses_for_ansible_doc(tmp_path: Path) -> None:
    env = dict(os.environ, ANSIBLE_HOME=str(tmp_path / ".ansible"))
    out = subprocess.run([str(BIN / "ansible-doc"), "-M", str(REPO / "library"), "-j", "labctl_service", "labctl_unit_state"],
                         capture_output=True, text=True, env=env, check=False)
    assert out.returncode == 0, out.stderr
    docs = json.loads(out.stdout)
    assert set(docs["labctl_service"]["doc"]["options"]) == set(action.FAST_ARGS)
    assert set(docs["labctl_unit_state"]["doc"]["options"]["units"]["suboptions"]) == {"name", "enabled", "started"}
