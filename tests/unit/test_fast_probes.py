"""labctl_packages and labctl_account (actions) and their probes, labctl_package_state and
labctl_account_state: installed packages and existing accounts answered in one light call, every
other case handed to ansible.builtin.apt, group and user with the task's arguments. The actions run
for real in the molecule scenarios; here the probes' judgements on this machine, and the docs."""

from __future__ import annotations

import importlib.util
import json
import os
import pwd
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


packages = _load("labctl_package_state", REPO / "library" / "labctl_package_state.py")
accounts = _load("labctl_account_state", REPO / "library" / "labctl_account_state.py")

# dpkg-query -W -f='${Package}\t${Version}\t${db:Status-Abbrev}\n' on Debian 12: held packages are
# "hi ", a package removed with its configuration kept "rc ", a failed configuration "iF ".
QUERY = ("bash\t5.2.15-2+b7\tii \nnvidia-driver-cuda\t575.57.08-1\thi \nold-tool\t1.0\trc \n"
         "half\t2.0\tiF \nbroken\t3.0\tiiR\n")


@pytest.mark.parametrize(("spec", "current", "reason"), [
    ("bash", True, ""),
    ("bash:amd64", True, ""),
    ("nvidia-driver-cuda=575.57.08-1", True, ""),  # held, at exactly that version
    ("nvidia-driver-cuda=570.172.08-1", False, "version 575.57.08-1"),
    ("old-tool", False, "dpkg status rc"),
    ("half", False, "dpkg status iF"),
    ("broken", False, "dpkg status iiR"),
    ("missing", False, "not installed"),
    ("python3*", False, "not a plain package name"),
    ("bash>=5", False, "not a plain package name"),
])
def test_a_package_is_current_only_when_dpkg_has_it_installed_as_asked(spec: str, current: bool, reason: str) -> None:
    answer = packages.judge(spec, packages.installed(QUERY))
    assert (answer["current"], answer["reason"]) == (current, reason)


def test_an_account_is_current_only_as_asked() -> None:
    root = pwd.getpwnam("root")
    want = {"group": "root", "user": "root", "home": root.pw_dir, "shell": root.pw_shell}
    assert accounts.judge(want)["current"] is True
    assert accounts.judge({"group": "root"})["current"] is True
    assert accounts.judge({**want, "shell": "/usr/sbin/nologin"})["reason"] == f"shell {root.pw_shell}"
    assert accounts.judge({**want, "home": "/nonexistent"})["reason"] == f"home {root.pw_dir}"
    assert accounts.judge({**want, "group": "nogroup"})["reason"].startswith("primary group")
    assert accounts.judge({**want, "user": "no-such-user-x"})["reason"] == "no user no-such-user-x"
    assert accounts.judge({"group": "no-such-group-x"})["reason"] == "no group no-such-group-x"
    assert accounts.judge({**want, "groups": ["no-such-group-x"]})["reason"].startswith("other groups")


def test_documentation_parses_for_ansible_doc(tmp_path: Path) -> None:
    env = dict(os.environ, ANSIBLE_HOME=str(tmp_path / ".ansible"))
    names = ["labctl_packages", "labctl_package_state", "labctl_account", "labctl_account_state"]
    out = subprocess.run([str(BIN / "ansible-doc"), "-M", str(REPO / "library"), "-j", *names],
                         capture_output=True, text=True, env=env, check=False)
    assert out.returncode == 0, out.stderr
    docs = json.loads(out.stdout)
    action = _load("labctl_packages_action", REPO / "action_plugins" / "labctl_packages.py")
    assert set(docs["labctl_packages"]["doc"]["options"]) == set(action.FAST_ARGS)
    account = _load("labctl_account_action", REPO / "action_plugins" / "labctl_account.py")
    assert set(docs["labctl_account"]["doc"]["options"]) == set(account.ARGS)
    assert set(docs["labctl_account_state"]["doc"]["options"]) == set(account.ARGS)
