"""Run records: one directory per run under ``<state>/runs/``.

``record.json``: command, argv, inventory, repository revision, start and end, outcome, exit
code, per-host stats, failed tasks with their messages, drifted tasks. ``events.jsonl``: the
ansible-runner events (no_log results are already censored by Ansible: "the output has been
hidden"). Records older than the retention are pruned when a new run starts.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from labctl.paths import repo_root


@dataclass
class HostStats:
    ok: int = 0
    changed: int = 0
    failed: int = 0
    unreachable: int = 0
    skipped: int = 0


@dataclass
class TaskNote:
    host: str
    task: str
    message: str = ""
    role: str = ""


@dataclass
class Record:
    id: str
    command: str
    argv: list[str]
    inventory: str
    revision: str
    started: float
    ended: float | None = None
    outcome: str = "running"
    exit_code: int | None = None
    check: bool = False
    hosts: dict[str, HostStats] = field(default_factory=dict)
    failures: list[TaskNote] = field(default_factory=list)
    changes: list[TaskNote] = field(default_factory=list)
    message: str = ""

    @property
    def duration(self) -> float:
        return (self.ended or time.time()) - self.started

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"duration": round(self.duration, 1)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Record:
        data = {k: v for k, v in data.items() if k != "duration"}
        data["hosts"] = {h: HostStats(**s) for h, s in data.get("hosts", {}).items()}
        data["failures"] = [TaskNote(**n) for n in data.get("failures", [])]
        data["changes"] = [TaskNote(**n) for n in data.get("changes", [])]
        return cls(**data)


def repo_revision(root: Path | None = None) -> str:
    """``git describe`` of the checkout labctl runs from, ``-dirty`` when it has local changes."""
    try:
        out = subprocess.run(["git", "-C", str(root or repo_root()), "describe", "--always", "--dirty", "--abbrev=12"],
                             capture_output=True, text=True, timeout=10, check=False)
    except OSError:
        return "unknown"
    return out.stdout.strip() or "unknown"


class RecordStore:
    """The records of one state directory."""

    def __init__(self, state_dir: Path, keep_days: float = 30) -> None:
        self.root = state_dir / "runs"
        self.keep_days = keep_days

    def create(self, command: str, argv: list[str], inventory: Path, check: bool) -> tuple[Record, Path]:
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        started = time.time()
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(started))
        run_id = f"{stamp}-{command}-{secrets.token_hex(3)}"
        path = self.root / run_id
        path.mkdir(mode=0o700)
        record = Record(id=run_id, command=command, argv=argv, inventory=str(inventory.resolve()),
                        revision=repo_revision(), started=started, check=check)
        self.save(record)
        return record, path

    def save(self, record: Record) -> None:
        path = self.root / record.id / "record.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record.to_json(), indent=2) + "\n", encoding="utf-8")
        tmp.replace(path)

    def load(self, run_id: str) -> Record:
        path = self.root / run_id / "record.json"
        if not path.is_file():
            matches = sorted(p.name for p in self.root.glob(f"*{run_id}*") if (p / "record.json").is_file())
            if len(matches) != 1:
                raise FileNotFoundError(f"no run {run_id!r} in {self.root}" + (f" (several match: {', '.join(matches)})"
                                                                               if matches else ""))
            path = self.root / matches[0] / "record.json"
        return Record.from_json(json.loads(path.read_text(encoding="utf-8")))

    def latest(self, count: int) -> list[Record]:
        if not self.root.is_dir():
            return []
        records = []
        for path in sorted(self.root.iterdir(), reverse=True):
            if (path / "record.json").is_file():
                try:
                    records.append(Record.from_json(json.loads((path / "record.json").read_text(encoding="utf-8"))))
                except (ValueError, TypeError):
                    continue
            if len(records) >= count:
                break
        return records

    def prune(self, now: float | None = None) -> list[str]:
        """Remove records whose run started more than keep_days ago; returns their ids."""
        if not self.root.is_dir():
            return []
        limit = (now or time.time()) - self.keep_days * 86400
        removed = []
        for path in self.root.iterdir():
            record = path / "record.json"
            if record.is_file() and record.stat().st_mtime < limit:
                shutil.rmtree(path)
                removed.append(path.name)
        return removed
