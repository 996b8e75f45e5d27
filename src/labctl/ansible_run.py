"""The one way labctl runs Ansible: a playbook through ansible-runner, results back as data.

A playbook hands results to labctl with ``ansible.builtin.set_stats`` (``aggregate: true``, not
per host): lists from several hosts are concatenated, mappings merged. They arrive here as
``PlaybookResult.data``, never found by a task's name. ``labctl provision``/``drift``/``patch``/
``smoke``/``rolling-restart`` (labctl.runs.playbook), ``gateway-config`` and ``plan`` (live GPU
facts) all come through ``run_playbook``.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ansible_runner  # type: ignore[import-untyped]

from labctl.paths import repo_root
from labctl.redact import Scrubber, kept_command

EventHandler = Callable[[dict[str, Any]], bool]


@dataclass
class PlaybookResult:
    status: str  # ansible-runner's: successful, failed, timeout, canceled
    rc: int
    data: dict[str, Any] = field(default_factory=dict)  # what the playbook's set_stats gave
    failures: list[str] = field(default_factory=list)  # "host: task: message" per failed/unreachable task
    output_tail: str = ""  # the end of ansible-playbook's output, for a run that failed without a failed task


def ansible_path() -> str:
    """PATH for ansible-playbook: labctl's own venv (where ansible-core is installed) first."""
    here = str(Path(sys.executable).parent)
    rest = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != here]
    return os.pathsep.join([here, *rest])


def stats_data(event: dict[str, Any]) -> dict[str, Any] | None:
    """The set_stats data of a playbook_on_stats event (None for any other event)."""
    if event.get("event") != "playbook_on_stats":
        return None
    data = (event.get("event_data") or {}).get("artifact_data") or {}
    return dict(data) if isinstance(data, dict) else {}


def run_playbook(
    playbook: Path,
    inventory: Path,
    *,
    args: Sequence[str] = (),
    extravars: dict[str, Any] | None = None,
    private_dir: Path | None = None,
    event_handler: EventHandler | None = None,
    cancel: Callable[[], bool] | None = None,
) -> PlaybookResult:
    """Run ``playbook`` (from the repository, so its ansible.cfg applies) against ``inventory``.
    ``args`` are ansible-playbook options as given (``-e``, ``--limit``, ``-v`` ...); ``extravars``
    labctl's own variables. Every event goes to ``event_handler`` too.

    Secrets stay out of what is kept. ansible-runner runs in a scratch directory (0700, removed
    afterwards): without env/ files (``suppress_env_files``: no env/cmdline, env/extravars),
    labctl's own variables in a 0600 file there (``-e @file``, never on a command line).
    ``private_dir``, when given, receives a scrubbed copy of its artifacts (stdout, command
    without the environment, rc, status). Events reach ``event_handler`` scrubbed too (the -e
    values a -vvvv run prints: labctl.redact.Scrubber)."""
    found: dict[str, Any] = {}
    failures: list[str] = []
    scrubber = Scrubber(args)

    def handler(raw_event: dict[str, Any]) -> bool:
        event: dict[str, Any] = scrubber.data(raw_event)
        data = stats_data(event)
        if data is not None:
            found.update(data)
        if event.get("event") in ("runner_on_failed", "runner_on_unreachable"):
            ev = event.get("event_data") or {}
            raw = ev.get("res")
            res: dict[str, Any] = raw if isinstance(raw, dict) else {}
            failures.append(f"{ev.get('host', '')}: {ev.get('task', '')}: {res.get('msg', res)}")
        return event_handler(event) if event_handler is not None else True

    with tempfile.TemporaryDirectory(prefix="labctl-ansible-") as scratch:
        work = Path(scratch) / "runner"
        work.mkdir(mode=0o700)
        command = list(args)
        if extravars:
            own = Path(scratch) / "labctl-vars.json"
            with os.fdopen(os.open(own, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w", encoding="utf-8") as handle:
                json.dump(extravars, handle)
            command += ["-e", f"@{own}"]  # after the user's -e: labctl's own win, as ansible-runner's env/extravars did
        result = ansible_runner.run(
            private_data_dir=str(work),
            project_dir=str(repo_root()),
            playbook=str(playbook),
            inventory=str(inventory.resolve()),
            cmdline=" ".join(shlex.quote(a) for a in command) or None,
            suppress_env_files=True,
            event_handler=handler,
            cancel_callback=cancel,
            quiet=True,
            # The repository's ansible.cfg whatever the caller's environment names (an operator's
            # ANSIBLE_CONFIG, molecule's): its pipelining, its gathering once per run and its plugin
            # paths are what the site is built and measured with. Facts in memory, as it says
            # (ansible-runner would otherwise put a JSON file cache in its place).
            fact_cache_type="memory",
            envvars={"ANSIBLE_FORCE_COLOR": "0", "ANSIBLE_NOCOLOR": "1", "PATH": ansible_path(),
                     "ANSIBLE_CONFIG": str(repo_root() / "ansible.cfg")},
        )
        tail = _keep_artifacts(work, private_dir, scrubber)
    return PlaybookResult(status=str(result.status), rc=int(result.rc or 0), data=found, failures=failures, output_tail=tail)


def _keep_artifacts(work: Path, keep: Path | None, scrubber: Scrubber) -> str:
    """Copy ansible-runner's artifacts from ``work`` into ``keep`` (when given), scrubbed; returns
    the end of ansible-playbook's output (scrubbed)."""
    tail = ""
    if keep is not None:
        keep.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(keep, 0o700)
    for run in sorted(work.glob("artifacts/*/")):
        stdout = run / "stdout"
        text = scrubber.text(stdout.read_text(encoding="utf-8", errors="replace")) if stdout.is_file() else ""
        tail = "\n".join(text.strip().splitlines()[-15:])
        if keep is None:
            continue
        (keep / "artifacts").mkdir(mode=0o700, exist_ok=True)
        dest = keep / "artifacts" / run.name
        dest.mkdir(mode=0o700, exist_ok=True)
        files = {"stdout": text}
        for name in ("rc", "status"):
            if (run / name).is_file():
                files[name] = (run / name).read_text(encoding="utf-8", errors="replace")
        if (run / "command").is_file():
            try:
                kept = kept_command(json.loads((run / "command").read_text(encoding="utf-8")))
            except ValueError:
                kept = None
            if kept is not None:
                files["command"] = json.dumps(kept)
        for name, content in files.items():
            with os.fdopen(os.open(dest / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w",
                           encoding="utf-8") as handle:
                handle.write(content)
    return tail


class InventoryError(Exception):
    """ansible-inventory could not read an inventory; the message says why."""


def list_inventory(inventory: Path) -> dict[str, Any]:
    """``ansible-inventory --list`` of ``inventory``: groups and ``_meta.hostvars``, group_vars
    merged as the plays in playbooks/ see them (``--playbook-dir playbooks``: run from the
    repository root, ansible-inventory would also read the root's group_vars/ as playbook vars)."""
    import shutil
    import subprocess

    beside = Path(sys.executable).parent / "ansible-inventory"
    tool = str(beside) if beside.exists() else shutil.which("ansible-inventory")
    if not tool:
        raise InventoryError("ansible-inventory not found (install the dev extra: pip install -e '.[dev]')")
    env = dict(os.environ, ANSIBLE_NOCOLOR="1")
    result = subprocess.run([tool, "-i", str(inventory.absolute()), "--list", "--playbook-dir", str(repo_root() / "playbooks")],
                            cwd=repo_root(), env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise InventoryError(f"ansible-inventory -i {inventory} failed: {result.stderr.strip()[-800:]}")
    try:
        data = json.loads(result.stdout)
    except json.JSONDecodeError as exc:
        raise InventoryError(f"ansible-inventory -i {inventory} printed no JSON: {exc}") from exc
    return dict(data)


def list_tasks(playbook: Path, inventory: Path, args: Sequence[str] = ()) -> str:
    """``ansible-playbook --list-tasks`` output ('' when it fails): the live display's bars."""
    import subprocess

    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "--list-tasks", "-i", str(inventory), str(playbook), *args]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=repo_root(), check=False,
                             env=dict(os.environ, ANSIBLE_NOCOLOR="1", PATH=ansible_path()))
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout
