"""Run a playbook the labctl way: under the inventory's lock, through ansible-runner, with a
record, a live display, a Prometheus textfile on every host reached, and a documented exit code."""

from __future__ import annotations

import json
import shlex
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any

from rich.console import Console

from labctl.ansible_run import PlaybookResult, run_playbook
from labctl.paths import repo_root
from labctl.runs import display as displays
from labctl.runs import textfile
from labctl.runs.exitcodes import OUTCOME_EXIT, Exit
from labctl.runs.lock import InventoryLock, LockHeld, lock_path
from labctl.runs.records import HostStats, Record, RecordStore, TaskNote

PREFLIGHT_ROLE = "preflight"


@dataclass
class RunRequest:
    command: str  # provision | drift | rolling-restart: the record's and the textfile's name
    playbook: Path
    inventory: Path
    state_dir: Path
    argv: list[str]
    limit: str | None = None
    tags: str | None = None
    check: bool = False
    diff: bool = False
    extra_vars: dict[str, Any] = field(default_factory=dict)  # labctl's own (labctl_restart_replicas)
    passthrough: list[str] = field(default_factory=list)  # the user's -e, --vault-password-file, -v, as given
    json_output: bool = False
    keep_days: float = 30
    record_hosts: bool = True  # write the textfile on the hosts reached

    def ansible_args(self) -> list[str]:
        args = []
        if self.limit:
            args += ["--limit", self.limit]
        if self.tags:
            args += ["--tags", self.tags]
        if self.check:
            args.append("--check")
        if self.diff:
            args.append("--diff")
        return args + self.passthrough


def inventory_name(inventory: Path) -> str:
    """The inventory's directory name (``lab`` for inventories/lab or inventories/lab/hosts.yml)."""
    resolved = inventory.resolve()
    return resolved.name if resolved.is_dir() else resolved.parent.name


class _Collector:
    """Keeps what the record needs from the event stream, and writes every event to events.jsonl."""

    def __init__(self, record: Record, events: IO[str], show: displays.Display) -> None:
        self.record = record
        self.events = events
        self.show = show

    def __call__(self, event: dict[str, Any]) -> bool:
        self.events.write(json.dumps(event, default=str) + "\n")
        data = event.get("event_data") or {}
        kind = event.get("event", "")
        host = str(data.get("host", ""))
        task = str(data.get("task", ""))
        role = str(data.get("role", ""))
        self._count(kind, host, data)
        if kind == "runner_on_failed" and not data.get("ignore_errors"):
            self.record.failures.append(TaskNote(host, task, displays.message_of(data), role))
        elif kind == "runner_on_unreachable":
            self.record.failures.append(TaskNote(host, task, "unreachable: " + displays.message_of(data), role))
        elif kind == "runner_on_ok" and isinstance(data.get("res"), dict) and data["res"].get("changed"):
            # a task writing several files (labctl_template's files) names those it changed
            files = data["res"].get("changed_files")
            written = ", ".join(map(str, files)) if isinstance(files, list) else ""
            self.record.changes.append(TaskNote(host, task, written, role))
        elif kind == "playbook_on_stats":
            names = set().union(*(data.get(k) or {} for k in ("ok", "changed", "failures", "dark", "skipped")))
            self.record.hosts = {
                name: HostStats(ok=(data.get("ok") or {}).get(name, 0), changed=(data.get("changed") or {}).get(name, 0),
                                failed=(data.get("failures") or {}).get(name, 0),
                                unreachable=(data.get("dark") or {}).get(name, 0),
                                skipped=(data.get("skipped") or {}).get(name, 0))
                for name in sorted(names)
            }
        self.show.event(event)
        return False  # ansible-runner need not keep its own copy of the event

    def _count(self, kind: str, host: str, data: dict[str, Any]) -> None:
        """Running per-host counts, so a run stopped before its recap still knows which hosts it reached
        (playbook_on_stats replaces them with ansible's own)."""
        if not host or not kind.startswith("runner_on_") or kind == "runner_on_start":
            return
        stats = self.record.hosts.setdefault(host, HostStats())
        if kind == "runner_on_ok":
            stats.ok += 1
            res = data.get("res")
            stats.changed += int(isinstance(res, dict) and bool(res.get("changed")))
        elif kind == "runner_on_failed":
            stats.failed += int(not data.get("ignore_errors"))
        elif kind == "runner_on_skipped":
            stats.skipped += 1
        elif kind == "runner_on_unreachable":
            stats.unreachable += 1


def _outcome(record: Record, status: str, canceled: bool) -> str:
    if canceled or status == "canceled":
        return "interrupted"
    real = [f for f in record.failures if not f.message.startswith("unreachable: ")]
    if real:
        return "refused" if all(f.role == PREFLIGHT_ROLE for f in real) else "failed"
    if any(s.unreachable for s in record.hosts.values()) or record.failures:
        return "unreachable"
    if status in ("failed", "timeout"):
        return "failed"  # no task failed: a syntax error, a missing playbook, an inventory ansible cannot read
    if record.command == "drift" and record.changes:
        return "drift"
    return "ok"


def _run(request: RunRequest, private_dir: Path, playbook: Path, extra_vars: dict[str, Any], args: list[str],
         handler: Callable[[dict[str, Any]], bool], cancel: Callable[[], bool]) -> PlaybookResult:
    return run_playbook(playbook, request.inventory, args=args, extravars=extra_vars, private_dir=private_dir,
                        event_handler=handler, cancel=cancel)


def _write_textfiles(request: RunRequest, record: Record, rundir: Path, console: Console) -> None:
    reached = [h for h, s in record.hosts.items() if not s.unreachable]
    if not reached:
        return
    files = {h: textfile.render(record.command, inventory_name(request.inventory), record.hosts[h],
                                record.ended or time.time(), record.duration, record.outcome == "interrupted")
             for h in reached}
    extra = {"labctl_run_hosts": reached, "labctl_run_file": textfile.file_name(record.command),
             "labctl_run_textfiles": files}
    with open(rundir / "record-events.jsonl", "w", encoding="utf-8") as events:
        result = _run(request, rundir / "record-runner", repo_root() / "playbooks" / "run-record.yml", extra, [],
                      lambda e: bool(events.write(json.dumps(e, default=str) + "\n")) and False, lambda: False)
    if result.status != "successful":
        console.print(f"warning: could not write {textfile.file_name(record.command)} on every host "
                      f"(status {result.status}; see {rundir / 'record-events.jsonl'})")


def execute(request: RunRequest) -> tuple[int, Record | None]:
    """Run it; returns the exit code and the record (None when refused before a record exists)."""
    console = Console(stderr=True, highlight=False, soft_wrap=True)
    store = RecordStore(request.state_dir, request.keep_days)
    store.prune()
    command_line = " ".join(shlex.quote(a) for a in request.argv)
    try:
        lock = InventoryLock(lock_path(request.state_dir, request.inventory), command_line)
        lock.__enter__()
    except LockHeld as exc:
        console.print(f"refused: {exc}")
        return Exit.REFUSED, None
    canceled = {"flag": False}

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        canceled["flag"] = True

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    # A parent may have started us with these blocked (the mask survives exec): then a stop
    # request would wait, pending, until the run ends by itself.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
    try:
        if lock.previous:
            console.print(f"note: took over the lock of an earlier run that did not finish (PID {lock.previous.get('pid')}, "
                          f"{'still running?' if lock.previous.get('alive') else 'no longer running'}: "
                          f"{lock.previous.get('command', '?')})")
        record, rundir = store.create(request.command, request.argv, request.inventory, request.check)
        show = displays.choose(request.json_output, request.playbook, request.inventory, request.ansible_args())
        try:
            with open(rundir / "events.jsonl", "w", encoding="utf-8", buffering=1) as events:
                result = _run(request, rundir / "runner", request.playbook, request.extra_vars, request.ansible_args(),
                              _Collector(record, events, show), lambda: canceled["flag"])
        finally:
            show.close()
        record.ended = time.time()
        record.outcome = _outcome(record, str(result.status), canceled["flag"])
        record.exit_code = int(OUTCOME_EXIT[record.outcome])
        if record.outcome == "refused":
            record.message = "; ".join(f"{f.host}: {f.message}" for f in record.failures)[:4000]
        elif record.outcome == "failed" and not record.failures:
            record.message = result.output_tail[:4000]
        store.save(record)
        if request.record_hosts and record.outcome != "refused":
            _write_textfiles(request, record, rundir, console)
        return record.exit_code, record
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        lock.__exit__(None, None, None)


def summary_lines(record: Record) -> list[str]:
    """The end-of-run summary: outcome, per-host counts, failed tasks, drift per host."""
    lines = [f"labctl {record.command}: {record.outcome} in {record.duration:.0f} s (exit {record.exit_code}, run {record.id})"]
    if record.message:
        lines += ["  " + line for line in record.message.splitlines()]
    for host, s in record.hosts.items():
        lines.append(f"  {host}: ok={s.ok} changed={s.changed} failed={s.failed} unreachable={s.unreachable} "
                     f"skipped={s.skipped}")
    for failure in record.failures:
        lines.append(f"  FAILED {failure.host}: {failure.task}: {failure.message}")
    if record.command == "drift":
        by_host: dict[str, list[str]] = {}
        for change in record.changes:
            by_host.setdefault(change.host, []).append(change.task + (f" ({change.message})" if change.message else ""))
        for host, tasks in by_host.items():
            lines.append(f"  {host} would change ({len(tasks)}):")
            lines += [f"    - {task}" for task in tasks]
    return lines


def print_summary(record: Record, json_output: bool) -> None:
    if json_output:
        print(json.dumps({"event": "summary"} | record.to_json()), flush=True)
    else:
        out = Console(file=sys.stdout, highlight=False, soft_wrap=True)
        for line in summary_lines(record):
            out.print(line, markup=False)
