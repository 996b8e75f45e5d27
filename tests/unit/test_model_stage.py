"""The labctl_model_stage module, run by ansible itself (`ansible localhost -m labctl_model_stage`) on small tmp trees."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
MiB = 2**20


def _env(tmp_path: Path) -> dict[str, str]:
    config = tmp_path / "ansible.cfg"
    config.write_text("[defaults]\n")
    return dict(
        os.environ,
        ANSIBLE_CONFIG=str(config),
        ANSIBLE_LIBRARY=str(REPO / "roles" / "model_weights" / "library"),
        ANSIBLE_MODULE_UTILS=str(REPO / "roles" / "model_weights" / "module_utils"),
        ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
        ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
        ANSIBLE_LOCALHOST_WARNING="False",
        ANSIBLE_INVENTORY_UNPARSED_WARNING="False",
        ANSIBLE_PYTHON_INTERPRETER=sys.executable,
        ANSIBLE_LOCAL_TEMP=str(tmp_path / ".ansible-tmp"),
    )


def _cmd(args: dict[str, Any], check: bool) -> list[str]:
    cmd = [str(BIN / "ansible"), "localhost", "-c", "local", "-m", "labctl_model_stage", "-a", json.dumps(args)]
    return cmd + (["--check"] if check else [])


def _result(stdout: str) -> dict[str, Any]:
    data = json.loads(stdout[stdout.index("{"):])
    return data["plays"][0]["tasks"][0]["hosts"]["localhost"]  # type: ignore[no-any-return]


def stage(tmp_path: Path, check: bool = False, **args: Any) -> dict[str, Any]:
    out = subprocess.run(_cmd(args, check), capture_output=True, text=True, env=_env(tmp_path), check=False,
                         cwd=tmp_path, timeout=300)
    assert "{" in out.stdout, out.stdout + out.stderr
    return _result(out.stdout)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_source(root: Path, files: dict[str, int | bytes], seed: int = 1) -> Path:
    """A revision directory: the files (random bytes of the given size, or given bytes) and SHA256SUMS."""
    root.mkdir(parents=True)
    lines = []
    for name, spec in sorted(files.items()):
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        data = spec if isinstance(spec, bytes) else _random_bytes(spec, f"{seed}:{name}")
        path.write_bytes(data)
        lines.append(f"{sha(path)}  {name}\n")
    (root / "SHA256SUMS").write_text("".join(lines))
    return root


def _random_bytes(size: int, key: str) -> bytes:
    out = bytearray()
    block = hashlib.sha256(key.encode()).digest()
    while len(out) < size:
        block = hashlib.sha256(block).digest()
        out += block * 64
    return bytes(out[:size])


FILES: dict[str, int | bytes] = {
    "config.json": b'{"model_type": "llama"}\n',
    "model-00001-of-00002.safetensors": 3 * MiB + 17,
    "model-00002-of-00002.safetensors": 2 * MiB,
    "original/params.json": b'{"dim": 128}\n',
}
TOTAL = sum(len(v) if isinstance(v, bytes) else v for v in FILES.values())


@pytest.fixture
def src(tmp_path: Path) -> Path:
    return make_source(tmp_path / "src" / "r1", FILES)


@pytest.fixture
def dest(tmp_path: Path) -> Path:
    return tmp_path / "models" / "tiny" / "r1"


def partial_of(dest: Path) -> Path:
    return dest.parent / f".partial-{dest.name}"


def journal_entry(path: Path, rel: str, boot: str | None = None) -> str:
    st = path.stat()
    boot = boot if boot is not None else Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return json.dumps({"path": rel, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino,
                       "sha256": sha(path), "boot_id": boot}) + "\n"


def test_fresh_stage_copies_verifies_stamps_and_renames(tmp_path: Path, src: Path, dest: Path) -> None:
    progress = tmp_path / "run" / "progress.json"
    result = stage(tmp_path, src=str(src), dest=str(dest), progress_file=str(progress), workers=2)
    assert result["changed"] is True and result.get("failed") is not True, result["msg"]
    assert result["staged"] is True and result["verification"] == "copy"
    assert (result["bytes_copied"], result["bytes_skipped"], result["bytes_resumed"]) == (TOTAL, 0, 0)
    assert result["bytes_hashed"] == 0  # hashed while copying: no second read
    assert result["files"] == len(FILES) and result["files_copied"] == len(FILES)
    assert not partial_of(dest).exists()
    for name in FILES:
        assert sha(dest / name) == sha(src / name)
        st = (dest / name).stat()
        assert oct(st.st_mode & 0o7777) == "0o644" and (st.st_uid, st.st_gid) == (0, 0)
        assert st.st_mtime_ns == (src / name).stat().st_mtime_ns  # like rsync -a
    assert oct((dest / "original").stat().st_mode & 0o7777) == "0o755"
    assert oct(dest.stat().st_mode & 0o7777) == "0o755"
    assert (dest / "SHA256SUMS").read_bytes() == (src / "SHA256SUMS").read_bytes()
    assert not (dest / ".labctl-journal.jsonl").exists()
    stamp = json.loads((dest / ".labctl-verified.json").read_text())
    assert stamp["sums_sha256"] == sha(src / "SHA256SUMS")
    assert set(stamp["files"]) == set(FILES)
    entry = stamp["files"]["model-00002-of-00002.safetensors"]
    st = (dest / "model-00002-of-00002.safetensors").stat()
    assert (entry["size"], entry["mtime_ns"], entry["ino"]) == (st.st_size, st.st_mtime_ns, st.st_ino)
    assert stamp["current_since"] is None and stamp["verified_at"] > 0
    final = json.loads(progress.read_text())
    assert final["phase"] == "done" and final["bytes_done"] == TOTAL == final["bytes_total"]
    assert [r["revision"] for r in result["revisions"]] == ["r1"]


def test_quick_rerun_reads_no_file(tmp_path: Path, src: Path, dest: Path) -> None:
    stage(tmp_path, src=str(src), dest=str(dest))
    started = time.monotonic()
    again = stage(tmp_path, src=str(src), dest=str(dest))
    assert again["changed"] is False and again["staged"] is False
    assert again["verification"] == "quick" and again["bytes_read"] == 0
    assert again["duration_s"] < 1 and time.monotonic() - started < 15
    assert "stamp matches, no file read" in again["msg"]


def test_full_verify_catches_a_changed_file_quick_does_not(tmp_path: Path, src: Path, dest: Path) -> None:
    stage(tmp_path, src=str(src), dest=str(dest))
    victim = dest / "model-00001-of-00002.safetensors"
    before = victim.stat()
    expected = sha(victim)
    with victim.open("r+b") as handle:  # same size, same inode, mtime put back: only the content differs
        handle.seek(MiB)
        handle.write(b"\x00" * 16)
    os.utime(victim, ns=(before.st_atime_ns, before.st_mtime_ns))
    quick = stage(tmp_path, src=str(src), dest=str(dest))
    assert quick["changed"] is False and quick["bytes_read"] == 0  # the stamp alone cannot see it
    full = stage(tmp_path, src=str(src), dest=str(dest), verify="full")
    assert full["failed"] is True
    assert "model-00001-of-00002.safetensors: content changed" in full["msg"]
    assert f"expected sha256 {expected}, found {sha(victim)}" in full["msg"]
    assert full["problems"] == [{"path": "model-00001-of-00002.safetensors", "problem": "content changed",
                                 "expected": expected, "found": sha(victim)}]


def test_full_verify_of_a_good_revision_hashes_everything(tmp_path: Path, src: Path, dest: Path) -> None:
    stage(tmp_path, src=str(src), dest=str(dest))
    full = stage(tmp_path, src=str(src), dest=str(dest), verify="full", workers=3)
    assert full["changed"] is False and full["verification"] == "full"
    assert full["bytes_hashed"] == TOTAL == full["bytes_read"] and full["bytes_copied"] == 0


def test_touched_file_is_rehashed_and_the_stamp_refreshed(tmp_path: Path, src: Path, dest: Path) -> None:
    stage(tmp_path, src=str(src), dest=str(dest))
    os.utime(dest / "config.json", ns=(1, 1_700_000_000_000_000_000))
    first = stage(tmp_path, src=str(src), dest=str(dest))
    assert first["changed"] is True and first["bytes_hashed"] == len(FILES["config.json"])  # type: ignore[arg-type]
    assert any("stamp was refreshed" in w for w in first.get("warnings", []))
    second = stage(tmp_path, src=str(src), dest=str(dest))
    assert second["changed"] is False and second["bytes_read"] == 0


def test_quick_check_fails_on_a_missing_or_extra_file(tmp_path: Path, src: Path, dest: Path) -> None:
    stage(tmp_path, src=str(src), dest=str(dest))
    (dest / "original" / "params.json").unlink()
    (dest / "stray.bin").write_bytes(b"x")
    result = stage(tmp_path, src=str(src), dest=str(dest))
    assert result["failed"] is True
    assert "original/params.json: missing" in result["msg"] and "stray.bin: not listed in SHA256SUMS" in result["msg"]


def test_modes_and_owner_drift_is_repaired(tmp_path: Path, src: Path, dest: Path) -> None:
    stage(tmp_path, src=str(src), dest=str(dest))
    os.chmod(dest / "config.json", 0o666)
    result = stage(tmp_path, src=str(src), dest=str(dest))
    assert result["changed"] is True and result["bytes_read"] == 0
    assert oct((dest / "config.json").stat().st_mode & 0o7777) == "0o644"


def test_resume_skips_completed_files_and_continues_a_cut_off_one(tmp_path: Path, src: Path, dest: Path) -> None:
    """The state an interruption leaves: one file done (journaled), one cut off mid-copy, one not started."""
    partial = partial_of(dest)
    partial.mkdir(parents=True)
    done, cut = "model-00002-of-00002.safetensors", "model-00001-of-00002.safetensors"
    (partial / done).write_bytes((src / done).read_bytes())
    os.utime(partial / done, ns=((src / done).stat().st_atime_ns, (src / done).stat().st_mtime_ns))
    kept = MiB + 5
    (partial / cut).write_bytes((src / cut).read_bytes()[:kept])
    (partial / ".labctl-journal.jsonl").write_text(journal_entry(partial / done, done) + '{"path": "trunc')
    inode = (partial / done).stat().st_ino
    result = stage(tmp_path, src=str(src), dest=str(dest), workers=1)
    assert result["changed"] is True and result.get("failed") is not True, result["msg"]
    size_done = (src / done).stat().st_size
    assert result["bytes_skipped"] == size_done and result["files_skipped"] == 1
    assert result["bytes_resumed"] == kept and result["files_resumed"] == 1
    assert result["bytes_copied"] == TOTAL - size_done - kept
    assert result["bytes_hashed"] == kept  # only the kept prefix is read again
    assert (dest / done).stat().st_ino == inode  # not copied again
    for name in FILES:
        assert sha(dest / name) == sha(src / name)


def test_journal_entries_from_before_a_reboot_are_rehashed_not_recopied(tmp_path: Path, src: Path, dest: Path) -> None:
    partial = partial_of(dest)
    partial.mkdir(parents=True)
    name = "model-00002-of-00002.safetensors"
    (partial / name).write_bytes((src / name).read_bytes())
    (partial / ".labctl-journal.jsonl").write_text(journal_entry(partial / name, name, boot="another-boot"))
    inode = (partial / name).stat().st_ino
    result = stage(tmp_path, src=str(src), dest=str(dest))
    size = (src / name).stat().st_size
    assert result["bytes_skipped"] == size and result["bytes_hashed"] == size
    assert result["bytes_copied"] == TOTAL - size
    assert (dest / name).stat().st_ino == inode


def test_a_journaled_file_lost_in_a_reboot_is_copied_again(tmp_path: Path, src: Path, dest: Path) -> None:
    partial = partial_of(dest)
    partial.mkdir(parents=True)
    name = "model-00002-of-00002.safetensors"
    (partial / name).write_bytes(b"\0" * (src / name).stat().st_size)  # what a crash can leave: right size, no data
    st = (partial / name).stat()  # journaled as complete with the right sha256, before the reboot
    (partial / ".labctl-journal.jsonl").write_text(json.dumps({
        "path": name, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino, "sha256": sha(src / name),
        "boot_id": "another-boot"}) + "\n")
    result = stage(tmp_path, src=str(src), dest=str(dest))
    assert result.get("failed") is not True, result["msg"]
    assert result["bytes_copied"] == TOTAL and result["bytes_skipped"] == 0
    assert sha(dest / name) == sha(src / name)


def test_too_little_space_is_refused_before_copying(tmp_path: Path, dest: Path) -> None:
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    source = tmp_path / "sparse"
    source.mkdir()
    # Sparse: costs no space in the source. A whole TiB beyond what is free now, so that space freed by
    # other jobs meanwhile (make test runs two at a time) cannot let the copy start: with 1 GiB beyond,
    # a scenario's teardown once did, and the copy of zeros filled the machine's disk.
    with (source / "huge.bin").open("wb") as handle:
        handle.truncate(free + 2**40)
    (source / "SHA256SUMS").write_text("0" * 64 + "  huge.bin\n")
    result = stage(tmp_path, src=str(source), dest=str(dest))
    assert result["failed"] is True and "more are needed in" in result["msg"] and "free" in result["msg"]
    assert not (partial_of(dest) / "huge.bin").exists()


def test_interrupted_run_resumes_without_recopying(tmp_path: Path, dest: Path) -> None:
    """A real interruption: the running module is killed (SIGKILL) mid-copy, then run again."""
    files: dict[str, int | bytes] = {"a.bin": 2 * MiB, "b.bin": 2 * MiB, "c.bin": 2 * MiB}
    source = make_source(tmp_path / "slow", files)
    progress = tmp_path / "progress.json"
    args = {"src": str(source), "dest": str(dest), "progress_file": str(progress), "workers": 1, "bwlimit": 2}
    proc = subprocess.Popen(_cmd(args, False), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(tmp_path),
                            cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        state: dict[str, Any] = {}
        while time.monotonic() < deadline:
            try:
                state = json.loads(progress.read_text())
            except (OSError, ValueError):
                state = {}
            # One file finished, the next one half-way.
            if state.get("files_done", 0) >= 1 and state.get("bytes_done", 0) >= 3 * MiB:
                break
            time.sleep(0.1)
        assert state.get("files_done", 0) >= 1, state
        assert "copied" in state["msg"] and "MiB/s" in state["msg"], state["msg"]
        os.kill(state["pid"], signal.SIGKILL)
    finally:
        proc.communicate(timeout=60)
    assert not dest.exists()
    journal = (partial_of(dest) / ".labctl-journal.jsonl").read_text().splitlines()
    completed = {json.loads(line)["path"] for line in journal}
    assert len(completed) >= 1
    result = stage(tmp_path, src=str(source), dest=str(dest), workers=1)
    assert result.get("failed") is not True, result["msg"]
    assert result["files_skipped"] == len(completed) and result["bytes_skipped"] == 2 * MiB * len(completed)
    assert result["files_resumed"] == 1 and 0 < result["bytes_resumed"] < 2 * MiB
    assert result["bytes_skipped"] + result["bytes_resumed"] + result["bytes_copied"] == 6 * MiB
    for name in files:
        assert sha(dest / name) == sha(source / name)


def test_corrupted_source_file_fails_naming_it_and_nothing_is_renamed(tmp_path: Path, src: Path, dest: Path) -> None:
    bad = "model-00001-of-00002.safetensors"
    expected = sha(src / bad)
    data = bytearray((src / bad).read_bytes())
    data[12345] ^= 0xFF
    (src / bad).write_bytes(bytes(data))
    found = sha(src / bad)
    result = stage(tmp_path, src=str(src), dest=str(dest), workers=2)
    assert result["failed"] is True
    assert f"{bad}: sha256 mismatch: expected sha256 {expected}, found {found}" in result["msg"]
    assert "`current` is unchanged" in result["msg"]
    assert not dest.exists()
    partial = partial_of(dest)
    assert not (partial / bad).exists()  # dropped: a re-run copies it again
    journaled = {json.loads(line)["path"] for line in (partial / ".labctl-journal.jsonl").read_text().splitlines()
                 if not json.loads(line).get("drop")}
    assert journaled == set(FILES) - {bad}
    # The source is repaired: only the bad file travels again.
    data[12345] ^= 0xFF
    (src / bad).write_bytes(bytes(data))
    again = stage(tmp_path, src=str(src), dest=str(dest), workers=2)
    assert again.get("failed") is not True, again["msg"]
    assert again["bytes_copied"] == len(data) and again["files_copied"] == 1
    assert again["bytes_skipped"] == TOTAL - len(data)
    assert sha(dest / bad) == expected


def test_missing_source_file_fails_naming_it(tmp_path: Path, src: Path, dest: Path) -> None:
    (src / "original" / "params.json").unlink()
    result = stage(tmp_path, src=str(src), dest=str(dest))
    assert result["failed"] is True and "original/params.json: missing in the source" in result["msg"]
    assert not dest.exists() and not partial_of(dest).exists()


@pytest.mark.parametrize("line", ["{}  ../escape.bin", "{}  /etc/passwd", "{}  .labctl-verified.json", "not a sum line"])
def test_unsafe_or_malformed_sums_are_refused(tmp_path: Path, src: Path, dest: Path, line: str) -> None:
    (src / "SHA256SUMS").write_text(line.format("0" * 64) + "\n")
    result = stage(tmp_path, src=str(src), dest=str(dest))
    assert result["failed"] is True and "SHA256SUMS line 1" in result["msg"], result["msg"]
    assert not dest.exists()


def test_a_reused_revision_label_with_other_content_is_refused(tmp_path: Path, src: Path, dest: Path) -> None:
    stage(tmp_path, src=str(src), dest=str(dest))
    other = make_source(tmp_path / "other" / "r1", {"config.json": b"{}\n"})
    result = stage(tmp_path, src=str(other), dest=str(dest))
    assert result["failed"] is True and "names two different snapshots" in result["msg"]


def test_check_mode_changes_nothing_and_describes_the_plan(tmp_path: Path, src: Path, dest: Path) -> None:
    result = stage(tmp_path, check=True, src=str(src), dest=str(dest))
    assert result["changed"] is True and "would stage" in result["msg"] and "copy 4 file(s)" in result["msg"]
    assert not dest.parent.exists()
    partial = partial_of(dest)
    partial.mkdir(parents=True)
    cut = "model-00001-of-00002.safetensors"
    (partial / cut).write_bytes((src / cut).read_bytes()[:MiB])
    before = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in partial.iterdir())
    result = stage(tmp_path, check=True, src=str(src), dest=str(dest))
    assert "resume 1 file(s)" in result["msg"] and "copy 3 file(s)" in result["msg"]
    assert sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in partial.iterdir()) == before
    assert not dest.exists()


def test_state_current_records_the_time_and_orders_the_revisions(tmp_path: Path, src: Path, dest: Path) -> None:
    r2 = make_source(tmp_path / "src" / "r2", {"config.json": b'{"v": 2}\n'})
    stage(tmp_path, src=str(src), dest=str(dest))
    stage(tmp_path, src=str(r2), dest=str(dest.parent / "r2"))
    first = stage(tmp_path, dest=str(dest), state="current")
    assert first["changed"] is True
    assert json.loads((dest / ".labctl-verified.json").read_text())["current_since"] > 0
    second = stage(tmp_path, dest=str(dest.parent / "r2"), state="current")
    assert [r["revision"] for r in second["revisions"]] == ["r2", "r1"]
    # Rolling back to r1 makes it the most recently current one.
    third = stage(tmp_path, dest=str(dest), state="current")
    assert [r["revision"] for r in third["revisions"]] == ["r1", "r2"]
    # Marking does not disturb the quick check.
    assert stage(tmp_path, src=str(src), dest=str(dest))["changed"] is False


def test_a_second_run_waits_for_the_first(tmp_path: Path, src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True)
    lock = (dest.parent / ".labctl-stage.lock").open("a+")
    fcntl.flock(lock, fcntl.LOCK_EX)
    inode = os.fstat(lock.fileno()).st_ino
    # Released 2 s after the run is seen blocked on the lock (/proc/locks lists waiters with "->"),
    # not after a fixed time: a loaded machine may take seconds just to start the module.
    run = subprocess.Popen(_cmd({"src": str(src), "dest": str(dest)}, False), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=_env(tmp_path), cwd=tmp_path)
    try:
        deadline = time.monotonic() + 120
        while not any("->" in line and f":{inode} " in line for line in Path("/proc/locks").read_text().splitlines()):
            assert run.poll() is None and time.monotonic() < deadline, "the run never waited for the lock"
            time.sleep(0.05)
        time.sleep(2.0)
    finally:
        lock.close()
    out, err = run.communicate(timeout=300)
    result = _result(out)
    assert result.get("failed") is not True, result["msg"]
    assert result["waited_s"] >= 1.5 and "waited" in result["msg"], (result, err[-500:])


def test_in_place_mode_hashes_a_pushed_tree(tmp_path: Path, src: Path, dest: Path) -> None:
    """What the role does after an rsync push from the control node: src is the partial directory."""
    partial = partial_of(dest)
    partial.parent.mkdir(parents=True)
    subprocess.run(["cp", "-a", str(src), str(partial)], check=True)
    bad = "config.json"
    (partial / bad).write_bytes(b'{"model_type": "evil"}\n')
    failed = stage(tmp_path, src=str(partial), dest=str(dest))
    assert failed["failed"] is True and f"{bad}: sha256 mismatch" in failed["msg"]
    assert not (partial / bad).exists()  # the next push sends it again
    (partial / bad).write_bytes((src / bad).read_bytes())
    result = stage(tmp_path, src=str(partial), dest=str(dest))
    assert result.get("failed") is not True, result["msg"]
    assert result["bytes_copied"] == 0 and result["files_skipped"] == len(FILES) - 1
    assert result["bytes_hashed"] == len(FILES[bad])  # type: ignore[arg-type]
    assert not partial.exists() and sha(dest / bad) == sha(src / bad)


def test_documentation_parses_for_ansible_doc(tmp_path: Path) -> None:
    out = subprocess.run([str(BIN / "ansible-doc"), "-M", str(REPO / "roles" / "model_weights" / "library"), "-j",
                          "labctl_model_stage", "labctl_progress"],
                         capture_output=True, text=True, env=_env(tmp_path), check=False)
    assert out.returncode == 0, out.stderr
    docs = json.loads(out.stdout)
    assert set(docs["labctl_model_stage"]["doc"]["options"]) == {"src", "dest", "state", "verify", "workers", "owner", "group",
                                                          "progress_file", "label", "bwlimit"}
    assert "bytes_read" in docs["labctl_model_stage"]["return"]
    assert set(docs["labctl_progress"]["doc"]["options"]) == {"jid", "path", "label", "wait", "cleanup"}
