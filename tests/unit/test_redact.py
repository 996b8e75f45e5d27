"""Extra variables stay out of what labctl writes down (records, the lock, runner artifacts)."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
import threading
import time
from pathlib import Path

import pytest

from labctl.ansible_run import PlaybookResult, run_playbook
from labctl.redact import MASK, Scrubber, kept_command, redact_argv
from labctl.runs.lock import InventoryLock


@pytest.mark.parametrize(("argv", "expected"), [
    (["-e", "token=s3cret"], ["-e", f"token={MASK}"]),
    (["-e", "a=1 'b=two words'"], ["-e", f"a={MASK} b={MASK}"]),
    (["--extra-vars", '{"password": "s3cret", "n": 2}'], ["--extra-vars", json.dumps({"password": MASK, "n": MASK})]),
    (["--extra-vars=pw=s3cret"], [f"--extra-vars=pw={MASK}"]),
    (["-epw=s3cret"], [f"-epw={MASK}"]),
    (["-e", "@vars/secret.yml"], ["-e", "@vars/secret.yml"]),
    (["-e", "not a pair s3cret"], ["-e", MASK]),
    (["-e", "[1, 's3cret']"], ["-e", MASK]),
    (["-i", "inv", "--limit", "gpu01", "-v"], ["-i", "inv", "--limit", "gpu01", "-v"]),
])
def test_extra_vars_values_are_masked_names_kept(argv: list[str], expected: list[str]) -> None:
    redacted = redact_argv(["labctl", "provision", *argv])
    assert redacted == ["labctl", "provision", *expected]
    assert not any("s3cret" in a for a in redacted)


def test_runner_artifacts_lose_the_values() -> None:
    """What is kept of ansible-runner's artifacts/<id>/command (Runner.run writes the command line,
    cwd and labctl's whole environment): the command redacted, the cwd, not the environment."""
    data = {"command": ["ansible-playbook", "-e", "pw=s3cret", "site.yml"], "cwd": "/x", "env": {"HF_TOKEN": "s3cret"}}
    kept = kept_command(data)
    assert kept == {"command": ["ansible-playbook", "-e", f"pw={MASK}", "site.yml"], "cwd": "/x"}
    assert "s3cret" not in json.dumps(kept)
    assert kept_command({"cmd": "x"}) is None


def test_the_lock_file_is_private_also_when_it_existed(tmp_path: Path) -> None:
    path = tmp_path / "locks" / "lab.lock"
    path.parent.mkdir()
    path.write_text("")
    path.chmod(0o644)
    with InventoryLock(path, "labctl provision -e pw=<redacted>"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert "labctl provision" in path.read_text()


def _cmdlines() -> list[list[str]]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                found.append([a.decode(errors="replace") for a in (proc / "cmdline").read_bytes().split(b"\0") if a])
            except OSError:
                continue
    return found


def test_labctls_own_variables_go_in_a_private_file_never_on_a_command_line_nor_kept(tmp_path: Path) -> None:
    """Issue 29, item 5: the variables labctl itself hands a run (run_playbook's extravars, e.g. a
    new key's hand-off file) reach the play through a 0600 file that is gone afterwards: never in
    ansible-playbook's command line (what ps shows while it runs: read from /proc here, during a
    real ansible-runner run) nor in the kept artifacts (ansible-runner 2.4.3 kept them in
    env/extravars, utils.dump_artifacts)."""
    secret = "sk-SECRET-own-" + os.urandom(8).hex()
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(json.dumps({"all": {"hosts": {"local1": {"ansible_connection": "local",
                                                                  "ansible_python_interpreter": sys.executable}}}}))
    playbook = tmp_path / "own.yml"
    playbook.write_text(f"""
- name: labctl's own variables
  hosts: all
  gather_facts: false
  tasks:
    - name: The variable arrived
      ansible.builtin.assert:
        that: labctl_own_token | hash('sha256') == '{hashlib.sha256(secret.encode()).hexdigest()}'
        quiet: true
    - name: Stay a while, to be seen in the process list
      ansible.builtin.command: sleep 4
      changed_when: false
""")
    kept = tmp_path / "kept"
    outcome: dict[str, PlaybookResult] = {}
    worker = threading.Thread(target=lambda: outcome.update(result=run_playbook(
        playbook, inventory, args=["-e", "lab_plain=1"], extravars={"labctl_own_token": secret}, private_dir=kept)))
    worker.start()
    seen: list[list[str]] = []
    modes: dict[str, int] = {}
    while worker.is_alive():
        for argv in _cmdlines():
            assert not any(secret in a for a in argv), argv
            if any(a.endswith("ansible-playbook") for a in argv[:2]) and str(playbook) in argv:
                seen.append(argv)
                for arg in argv:
                    if arg.startswith("@") and Path(arg[1:]).exists():
                        modes[arg[1:]] = stat.S_IMODE(Path(arg[1:]).stat().st_mode)
                        modes[str(Path(arg[1:]).parent)] = stat.S_IMODE(Path(arg[1:]).parent.stat().st_mode)
        time.sleep(0.2)
    worker.join()
    assert outcome["result"].status == "successful", outcome["result"].output_tail
    assert seen, "ansible-playbook was never seen running"
    own, folder = modes  # the one @file (labctl's own variables) and its directory
    assert modes[own] == 0o600 and modes[folder] == 0o700
    assert not Path(own).exists()  # removed with the run
    files = [p for p in kept.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"stdout", "command", "rc", "status"}
    for path in files:
        assert secret not in path.read_text(errors="replace"), path


def test_the_scrubber_masks_whole_extra_vars_values_and_the_vvvv_dump() -> None:
    """The two ways ansible-core 2.19 prints a raw -e value (default callback's -vvvv option dump,
    utils.vars.load_extra_vars' error), and no masking inside a longer word."""
    scrub = Scrubber(["-e", "a=1", "-e", "pw=s3cret x=2", "--extra-vars=@vars.yml", "-v"])
    dump = "verbosity: 4\nextra_vars: ('a=1', 'pw=s3cret x=2', '@vars.yml')\nforks: 10"
    assert scrub.text(dump) == f"verbosity: 4\nextra_vars: ('a={MASK}', 'pw={MASK} x={MASK}', '@vars.yml')\nforks: 10"
    assert scrub.text("Invalid extra vars data supplied. 'pw=s3cret x=2' could not") == \
        f"Invalid extra vars data supplied. '{MASK}' could not"
    assert scrub.text("data=10; a=1") == f"data=10; {MASK}"
    assert scrub.data({"stdout": "pw=s3cret x=2", "res": [{"msg": "'pw=s3cret x=2'"}], "n": 3}) == \
        {"stdout": MASK, "res": [{"msg": f"'{MASK}'"}], "n": 3}
