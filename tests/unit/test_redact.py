"""Extra variables stay out of what labctl writes down (records, the lock, runner artifacts)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from labctl.redact import MASK, redact_argv, scrub_runner_artifacts
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


def test_runner_artifacts_lose_the_values(tmp_path: Path) -> None:
    command = tmp_path / "artifacts" / "abc" / "command"
    command.parent.mkdir(parents=True)
    command.write_text(json.dumps({"command": ["ansible-playbook", "-e", "pw=s3cret", "site.yml"], "cwd": "/x"}))
    scrub_runner_artifacts(tmp_path)
    assert "s3cret" not in command.read_text()
    assert json.loads(command.read_text())["command"] == ["ansible-playbook", "-e", f"pw={MASK}", "site.yml"]


def test_the_lock_file_is_private_also_when_it_existed(tmp_path: Path) -> None:
    path = tmp_path / "locks" / "lab.lock"
    path.parent.mkdir()
    path.write_text("")
    path.chmod(0o644)
    with InventoryLock(path, "labctl provision -e pw=<redacted>"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert "labctl provision" in path.read_text()
