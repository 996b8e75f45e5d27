"""What a run shows while it runs: a live view on a terminal, plain lines otherwise, JSON lines
with --json. Fed with ansible-runner events."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any, ClassVar, Protocol

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from labctl.ansible_run import list_tasks


class Display(Protocol):
    def event(self, event: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def _data(event: dict[str, Any]) -> dict[str, Any]:
    data = event.get("event_data") or {}
    return data if isinstance(data, dict) else {}


class JsonDisplay:
    """One JSON object per play, task start and host result on stdout (machines)."""

    KEEP: ClassVar[set[str]] = {"playbook_on_play_start", "playbook_on_task_start", "runner_on_ok", "runner_on_failed",
            "runner_on_unreachable", "runner_on_skipped", "playbook_on_stats"}

    def event(self, event: dict[str, Any]) -> None:
        kind = event.get("event", "")
        if kind not in self.KEEP:
            return
        data = _data(event)
        line = {"event": kind, "play": data.get("play", ""), "task": data.get("task", ""), "host": data.get("host", "")}
        if kind.startswith("runner_on_"):
            result = data.get("res") or {}
            line["changed"] = bool(isinstance(result, dict) and result.get("changed"))
        if kind == "playbook_on_stats":
            line = {"event": kind} | {k: data.get(k, {}) for k in ("ok", "changed", "failures", "dark", "skipped")}
        print(json.dumps(line), flush=True)

    def close(self) -> None:
        pass


class PlainDisplay:
    """A line per play and task, and per host that changed, failed or was unreachable (logs)."""

    def __init__(self) -> None:
        self._console = Console(stderr=True, highlight=False, markup=False, soft_wrap=True)

    def event(self, event: dict[str, Any]) -> None:
        kind = event.get("event", "")
        data = _data(event)
        if kind == "playbook_on_play_start":
            self._console.print(f"play: {data.get('play', '')}")
        elif kind == "playbook_on_task_start":
            self._console.print(f"  task: {data.get('task', '')}")
        elif kind == "runner_on_failed" and not data.get("ignore_errors"):
            self._console.print(f"    {data.get('host')}: FAILED: {message_of(data)}")
        elif kind == "runner_on_unreachable":
            self._console.print(f"    {data.get('host')}: UNREACHABLE: {message_of(data)}")
        elif kind == "runner_on_ok" and (data.get("res") or {}).get("changed"):
            self._console.print(f"    {data.get('host')}: changed")

    def close(self) -> None:
        pass


def count_tasks(playbook: Path, inventory: Path, extra_args: list[str]) -> list[int]:
    """Tasks per play, from ansible-playbook --list-tasks (for the bars); [] when it fails."""
    counts: list[int] = []
    for line in list_tasks(playbook, inventory, extra_args).splitlines():
        if re.match(r"^\s+play #\d+", line):
            counts.append(0)
        elif counts and re.match(r"^\s{6,}\S.*TAGS:", line):
            counts[-1] += 1
    return counts


class RichDisplay:
    """A bar over the current play's tasks, and what each host is doing now."""

    def __init__(self, task_counts: list[int]) -> None:
        self._counts = task_counts
        self._play = -1
        self._hosts: dict[str, Any] = {}  # host -> its row: what it is doing now
        self._console = Console(stderr=True)
        self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                  MofNCompleteColumn(), TimeElapsedColumn(), console=self._console, transient=False)
        self._bar: Any = None
        self._progress.start()

    def event(self, event: dict[str, Any]) -> None:
        kind = event.get("event", "")
        data = _data(event)
        if kind == "playbook_on_play_start":
            self._play += 1
            total = self._counts[self._play] if self._play < len(self._counts) else None
            if self._bar is not None:
                self._progress.update(self._bar, completed=self._progress.tasks[self._bar].total or 0)
            self._bar = self._progress.add_task(str(data.get("play", "")), total=total)
        elif kind == "playbook_on_task_start" and self._bar is not None:
            self._progress.advance(self._bar)
            self._progress.update(self._bar, description=f"{data.get('play', '')} \u203a {data.get('task', '')}")
        elif kind == "runner_on_start":
            host = str(data.get("host", ""))
            text = f"  {host}: {data.get('task', '')}"
            if host not in self._hosts:
                self._hosts[host] = self._progress.add_task(text, total=None)
            else:
                self._progress.update(self._hosts[host], description=text)
        elif kind in ("runner_on_failed", "runner_on_unreachable") and not data.get("ignore_errors"):
            state = "FAILED" if kind == "runner_on_failed" else "UNREACHABLE"
            self._console.print(f"[red]{data.get('host')}: {state}[/red] {data.get('task', '')}: {message_of(data)}")

    def close(self) -> None:
        self._progress.stop()


def message_of(data: dict[str, Any]) -> str:
    result = data.get("res") or {}
    if not isinstance(result, dict):
        return str(result)[:500]
    if result.get("censored"):
        return str(result["censored"])
    for key in ("msg", "stderr", "reason"):
        if result.get(key):
            return str(result[key]).strip()[:2000]
    return ""


def choose(json_mode: bool, playbook: Path, inventory: Path, extra_args: list[str]) -> Display:
    if json_mode:
        return JsonDisplay()
    if sys.stderr.isatty():
        return RichDisplay(count_tasks(playbook, inventory, extra_args))
    return PlainDisplay()
