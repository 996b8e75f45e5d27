"""Artifacts layer from the test bundle (read-only mount): tiktoken files and tiny-llama r1, then
re-runs of playbooks/artifacts.yml against the same container: an interrupted copy resumed, a
corrupted file rejected, a rollback, a tampered tiktoken file refused.

The tests run in file order; each later one starts from the state the one before left."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[3]
MODEL = "/srv/models/tiny-llama"
BUNDLE_MODEL = "/mnt/labctl-bundle/models/tiny-llama/r1"
PROGRESS = "/run/labctl/model-stage-tiny-llama.json"
TIKTOKEN = {  # what openai-harmony hard-codes: sha256
    "o200k_base": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    "cl100k_base": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
}
MiB = 2**20


def _cmd(*extra: str) -> list[str]:
    return ["ansible-playbook", "-i", os.environ["MOLECULE_INVENTORY_FILE"], str(REPO / "playbooks" / "artifacts.yml"),
            *extra]


def _play(*extra: str, json_out: bool = False) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if json_out:
        env.update(ANSIBLE_STDOUT_CALLBACK="ansible.posix.json", ANSIBLE_LOAD_CALLBACK_PLUGINS="1")
    return subprocess.run(_cmd(*extra), capture_output=True, text=True, timeout=600, check=False, cwd=REPO, env=env)


def _tasks(result: subprocess.CompletedProcess[str]) -> dict[str, dict[str, Any]]:
    """Task name -> the host's result, from the json callback (other callbacks print lines before it)."""
    out = result.stdout
    data, _ = json.JSONDecoder().raw_decode(out[out.index("\n{") + 1:] if not out.startswith("{") else out)
    tasks: dict[str, dict[str, Any]] = {}
    for play in data["plays"]:
        for task in play["tasks"]:
            for host_result in task["hosts"].values():
                # "role : task name" -> "task name"
                tasks[task["task"]["name"].split(" : ", 1)[-1]] = host_result
    return tasks


def _stage_result(tasks: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return next(v for k, v in tasks.items() if k.startswith("Copy and verify"))


def _model_state(host) -> str:
    """What vLLM would see: where current points and the content behind it."""
    return host.check_output(f"readlink {MODEL}/current; cd {MODEL}/current/ && sha256sum $(find . -type f | sort)")


def _files(host, directory: str) -> str:
    return host.check_output(f"cd {directory} && find . -type f ! -name .labctl-verified.json -printf '%p %i %T@ %s\\n' | sort")


# --- the converged state ---------------------------------------------------------------------

@pytest.mark.parametrize("encoding", sorted(TIKTOKEN))
def test_tiktoken_files_where_harmony_reads_them(host, encoding):
    sha256 = TIKTOKEN[encoding]
    f = host.file(f"/opt/labctl/tiktoken/{encoding}.tiktoken")
    assert f.is_file and f.user == "root" and f.group == "root" and f.mode == 0o644
    assert f.sha256sum == sha256


def test_an_earlier_releases_sha1_named_copies_are_gone(host):
    """prepare.yml placed them as an earlier release did; nothing reads them (oss-harmony reads only
    TIKTOKEN_ENCODINGS_BASE), so the converge removed the directory."""
    assert not host.file("/opt/labctl/tiktoken/by-url-sha1").exists


def test_tiktoken_environment_file(host):
    env = host.file("/etc/labctl/tiktoken.env")
    assert env.user == "root" and env.mode == 0o644
    lines = [line for line in env.content_string.splitlines() if line and not line.startswith("#")]
    assert lines == ["TIKTOKEN_ENCODINGS_BASE=/opt/labctl/tiktoken"]


def test_model_revision_is_complete_and_current(host):
    assert host.file(f"{MODEL}/current").is_symlink
    assert host.file(f"{MODEL}/current").linked_to == f"{MODEL}/r1"
    assert host.check_output(f"readlink {MODEL}/current") == "r1"  # relative
    # Every file the bundle lists, with the bundle's sha256, and nothing else.
    assert host.file(f"{MODEL}/r1/SHA256SUMS").content_string == host.file(f"{BUNDLE_MODEL}/SHA256SUMS").content_string
    host.run_expect([0], f"cd {MODEL}/r1 && sha256sum --quiet -c SHA256SUMS")
    listed = sorted(line.split("  ", 1)[1] for line in host.file(f"{MODEL}/r1/SHA256SUMS").content_string.splitlines())
    present = sorted(host.check_output(f"cd {MODEL}/r1 && find . -type f -printf '%P\\n'").splitlines())
    assert present == sorted(listed + ["SHA256SUMS", ".labctl-verified.json"])
    assert not host.file(f"{MODEL}/.partial-r1").exists


def test_model_files_are_root_owned_and_read_only_for_others(host):
    for line in host.check_output(f"find {MODEL}/r1 -printf '%y %u %g %m %P\\n'").splitlines():
        kind, user, group, mode, _path = (line.split(" ", 4) + [""])[:5]
        assert (user, group) == ("root", "root"), line
        assert mode == ("755" if kind == "d" else "644"), line


def test_stamp_records_every_file_and_when_it_became_current(host):
    stamp = json.loads(host.file(f"{MODEL}/r1/.labctl-verified.json").content_string)
    sums = host.file(f"{MODEL}/r1/SHA256SUMS").content_string
    assert stamp["sums_sha256"] == host.check_output(f"sha256sum {MODEL}/r1/SHA256SUMS").split()[0]
    assert set(stamp["files"]) == {line.split("  ", 1)[1] for line in sums.splitlines()}
    size = int(host.check_output(f"stat -c %s {MODEL}/r1/model.safetensors"))
    assert stamp["files"]["model.safetensors"]["size"] == size
    assert stamp["current_since"] > 0


# --- re-runs ---------------------------------------------------------------------------------

def _prepare_r2(host) -> int:
    """/srv/src/r2: r1's files with config.json changed, plus two 4 MiB shards; its SHA256SUMS."""
    host.run_expect([0], f"""set -e
        rm -rf /srv/src/r2 && mkdir -p /srv/src/r2 && cp -a {BUNDLE_MODEL}/. /srv/src/r2/
        cd /srv/src/r2 && rm SHA256SUMS
        sed -i 's/"rms_norm_eps"/"labctl_revision": 2, "rms_norm_eps"/' config.json
        grep -q labctl_revision config.json
        head -c 4194304 /dev/urandom > extra-00001-of-00002.bin
        head -c 4194304 /dev/urandom > extra-00002-of-00002.bin
        find . -type f ! -name SHA256SUMS -printf '%P\\n' | sort | xargs sha256sum > SHA256SUMS""")
    return int(host.check_output("cd /srv/src/r2 && cat $(sed 's/^[0-9a-f]*  //' SHA256SUMS) | wc -c"))


def test_interrupted_copy_resumes_without_copying_completed_files_again(host):
    total = _prepare_r2(host)
    host.run_expect([0], f"rm -f {PROGRESS}")  # the converge's last word
    r2 = ["--tags", "model_weights", "-e", "model_weights_source=path", "-e", "model_weights_source_path=/srv/src/r2",
          "-e", "model_weights_revision=r2", "-e", "model_weights_workers=1"]
    # 1 MiB/s, one file at a time, largest first: the first 4 MiB shard, then the second.
    proc = subprocess.Popen(_cmd(*r2, "-e", "model_weights_bwlimit=1"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=REPO)
    try:
        state: dict[str, Any] = {}
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            got = host.run(f"cat {PROGRESS}")
            try:
                state = json.loads(got.stdout) if got.rc == 0 else {}
            except ValueError:
                state = {}
            if state.get("phase") in ("done", "failed") or (
                    state.get("files_done", 0) >= 1 and state.get("bytes_done", 0) >= 5 * MiB):
                break
            time.sleep(0.3)
        assert state.get("files_done") == 1 and state.get("phase") == "copy", json.dumps(state)
        # Interrupt: the staging process dies mid-file (as on a crash or a killed job).
        host.run_expect([0], f"kill -KILL {state['pid']}")
    finally:
        out, _ = proc.communicate(timeout=300)
    assert proc.returncode != 0, out[-3000:]
    assert "the job ended without a result" in out, out[-3000:]
    assert "MiB of" in out and "copied, 1 MiB/s" in out  # progress lines while it ran
    assert host.check_output(f"readlink {MODEL}/current") == "r1"
    assert not host.file(f"{MODEL}/r2").exists
    journal = host.file(f"{MODEL}/.partial-r2/.labctl-journal.jsonl").content_string.splitlines()
    assert [json.loads(line)["path"] for line in journal] == ["extra-00001-of-00002.bin"]
    cut = int(host.check_output(f"stat -c %s {MODEL}/.partial-r2/extra-00002-of-00002.bin"))
    assert 0 < cut < 4 * MiB
    first_inode = host.check_output(f"stat -c %i {MODEL}/.partial-r2/extra-00001-of-00002.bin")

    result = _play(*r2, json_out=True)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    stage = _stage_result(_tasks(result))
    assert stage["files_skipped"] == 1 and stage["bytes_skipped"] == 4 * MiB
    assert stage["files_resumed"] == 1 and stage["bytes_resumed"] == cut
    assert stage["bytes_copied"] == total - 4 * MiB - cut
    assert stage["bytes_hashed"] == cut  # only the kept prefix was read again
    assert host.check_output(f"readlink {MODEL}/current") == "r2"
    assert host.check_output(f"stat -c %i {MODEL}/r2/extra-00001-of-00002.bin") == first_inode
    host.run_expect([0], f"cd {MODEL}/r2 && sha256sum --quiet -c SHA256SUMS && cmp config.json /srv/src/r2/config.json")
    assert host.file(f"{MODEL}/r1").is_directory  # kept for rollback


def test_corrupted_file_is_rejected_and_current_is_untouched(host):
    host.run_expect([0], f"""set -e
        rm -rf /srv/src/r3 && mkdir -p /srv/src/r3 && cp -a {BUNDLE_MODEL}/. /srv/src/r3/
        printf 'corrupted' | dd of=/srv/src/r3/model.safetensors bs=1 seek=1000 conv=notrunc status=none""")
    expected = host.check_output("grep ' model.safetensors$' /srv/src/r3/SHA256SUMS").split()[0]
    found = host.check_output("sha256sum /srv/src/r3/model.safetensors").split()[0]
    assert expected != found
    before = _model_state(host)
    result = _play("--tags", "model_weights", "-e", "model_weights_source=path",
                   "-e", "model_weights_source_path=/srv/src/r3", "-e", "model_weights_revision=r3")
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert f"model.safetensors: sha256 mismatch: expected sha256 {expected}, found {found}" in output, output[-3000:]
    assert _model_state(host) == before  # same link, same content: what vLLM serves is unchanged
    assert not host.file(f"{MODEL}/r3").exists
    assert not host.file(f"{MODEL}/.partial-r3/model.safetensors").exists  # dropped: a re-run copies it again


def test_rollback_to_r1_changes_only_the_symlink(host):
    r1_files = _files(host, f"{MODEL}/r1")
    r2_files = _files(host, f"{MODEL}/r2")
    result = _play("--tags", "model_weights", "-e", "model_weights_revision=r1", json_out=True)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    tasks = _tasks(result)
    stage = _stage_result(tasks)
    assert stage["changed"] is False and stage["bytes_read"] == 0 and stage["verification"] == "quick"
    changed = sorted(name for name, res in tasks.items() if res.get("changed"))
    assert changed == ["Point a temporary link at r1", "Record the switch time in the stamp of r1",
                       "Switch current atomically (rename over the old link) to r1"], changed
    assert host.check_output(f"readlink {MODEL}/current") == "r1"
    assert _files(host, f"{MODEL}/r1") == r1_files and _files(host, f"{MODEL}/r2") == r2_files  # r2 kept
    assert "current -> r1 (was r2)." in tasks["Report tiny-llama r1"]["msg"]


def test_rerun_on_a_staged_revision_is_quick_and_changes_nothing(host):
    started = time.monotonic()
    result = _play("--tags", "model_weights", json_out=True)
    took = time.monotonic() - started
    assert result.returncode == 0, result.stdout[-3000:]
    tasks = _tasks(result)
    assert not [name for name, res in tasks.items() if res.get("changed")]
    stage = _stage_result(tasks)
    assert stage["bytes_read"] == 0 and stage["duration_s"] < 1
    assert took < 60, took


def test_wrong_tiktoken_file_is_refused_and_nothing_changes(host):
    host.run_expect([0], """set -e
        rm -rf /srv/src/tiktoken-bad && cp -a /mnt/labctl-bundle/tiktoken /srv/src/tiktoken-bad
        printf 'X' | dd of=/srv/src/tiktoken-bad/o200k_base.tiktoken bs=1 seek=100 conv=notrunc status=none""")
    found = host.check_output("sha256sum /srv/src/tiktoken-bad/o200k_base.tiktoken").split()[0]
    state = "find /opt/labctl/tiktoken /etc/labctl/tiktoken.env -printf '%p %i %T@ %m\\n' | sort; sha256sum /opt/labctl/tiktoken/*.tiktoken"
    before = host.check_output(state)
    result = _play("--tags", "tiktoken_cache", "-e", "tiktoken_cache_source_dir=/srv/src/tiktoken-bad")
    output = result.stdout + result.stderr
    assert result.returncode != 0
    expected = TIKTOKEN["o200k_base"]
    assert f"o200k_base.tiktoken has sha256 {found}, but harmony expects {expected}" in output, output[-3000:]
    assert host.check_output(state) == before
