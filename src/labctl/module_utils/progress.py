"""Progress of a staging run (labctl_model_stage): byte counters shared by the worker threads,
written to a JSON file about once a second for labctl_progress, and their human-readable forms
(``human_bytes`` is labctl's too). Part of ``labctl.module_utils``: standard library only."""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any, ClassVar

from .stage_files import DIR_MODE, write_json_atomic

# --- human-readable sizes, rates and times ---------------------------------------------------

def human_bytes(count: float) -> str:
    count = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if count < 1024 or unit == "TiB":
            return ("%.0f %s" if unit == "B" else "%.1f %s") % (count, unit)
        count /= 1024
    return f"{count:.1f} TiB"  # pragma: no cover


def human_rate(rate: float) -> str:
    return "%.0f MiB/s" % (rate / 2**20) if rate >= 2**20 else "%.0f KiB/s" % (rate / 1024)


def human_eta(seconds: float | None) -> str:
    if seconds is None:
        return "time left unknown"
    if seconds < 60:
        return "<1 min left"
    minutes = round(seconds / 60.0)
    if minutes < 60:
        return "%d min left" % minutes
    return "%d h %02d min left" % (minutes // 60, minutes % 60)


# --- progress --------------------------------------------------------------------------------

class Progress:
    """Byte counters shared by the worker threads, written to a JSON file about once a second."""

    def __init__(self, path: str, label: str, uid: int | None, gid: int | None) -> None:
        self.path = path
        self.label = label
        self.uid, self.gid = uid, gid
        self.lock = threading.Lock()
        self.phase = "starting"
        self.total = 0
        self.done = 0
        self.files_total = 0
        self.files_done = 0
        self.active: set[str] = set()
        self.note = ""
        self.started = time.time()
        self.samples: list[tuple[float, int]] = []  # (monotonic time, bytes processed this phase)
        self.processed = 0
        self.phase_started = time.monotonic()
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        self.limit = 0  # bytes/s over all workers; 0 = none
        self.limit_started = time.monotonic()
        self.limit_bytes = 0

    def start(self) -> None:
        if self.path:
            directory = os.path.dirname(self.path)
            if not os.path.isdir(directory):
                os.makedirs(directory, mode=DIR_MODE, exist_ok=True)
            self.write()
            self.thread = threading.Thread(target=self._loop, name="progress", daemon=True)
            self.thread.start()

    def _loop(self) -> None:
        while not self.stop.wait(1.0):
            self.write()

    def begin(self, phase: str, total: int, files_total: int, already: int = 0, files_already: int = 0) -> None:
        with self.lock:
            self.phase = phase
            self.total = total
            self.done = already
            self.files_total = files_total
            self.files_done = files_already
            self.processed = 0
            self.samples = []
            self.phase_started = time.monotonic()
        self.write()

    def add(self, count: int) -> None:
        with self.lock:
            self.done += count
            self.processed += count
            if self.limit:
                self.limit_bytes += count
        if self.limit:
            ahead = self.limit_bytes / float(self.limit) - (time.monotonic() - self.limit_started)
            if ahead > 0:
                time.sleep(ahead)

    def file_started(self, path: str) -> None:
        with self.lock:
            self.active.add(path)

    def file_done(self, path: str) -> None:
        with self.lock:
            self.active.discard(path)
            self.files_done += 1

    def rate(self) -> float | None:
        now = time.monotonic()
        with self.lock:
            self.samples.append((now, self.processed))
            while len(self.samples) > 2 and now - self.samples[0][0] > 10:
                self.samples.pop(0)
            first_time, first_bytes = self.samples[0]
            if now - first_time >= 0.5:
                return (self.processed - first_bytes) / (now - first_time)
            elapsed = now - self.phase_started
            return self.processed / elapsed if elapsed > 0.5 else None

    VERBS: ClassVar[dict[str, str]] = {"copy": "copied", "hash": "hashed", "verify": "verified", "sync": "copied", "starting": "done"}

    def line(self) -> tuple[str, float | None]:
        rate = self.rate()
        with self.lock:
            left = self.total - self.done
            text = f"{self.label}: {human_bytes(self.done)} of {human_bytes(self.total)} {self.VERBS.get(self.phase, self.phase)}"
            if self.phase in ("copy", "hash", "verify"):
                if rate:
                    text += f", {human_rate(rate)}, {human_eta(left / rate if rate > 0 else None)}"
                text += " (%d/%d files)" % (self.files_done, self.files_total)
            elif self.phase == "sync":
                text += "; flushing to disk"
            if self.note:
                text += "; " + self.note
            return text, rate

    def write(self, final: str | None = None) -> None:
        if not self.path:
            return
        line, rate = self.line()
        with self.lock:
            data: dict[str, Any] = {
                "label": self.label,
                "phase": final or self.phase,
                "bytes_done": self.done,
                "bytes_total": self.total,
                "files_done": self.files_done,
                "files_total": self.files_total,
                "active": sorted(self.active),
                "rate": rate or 0,
                "eta_s": ((self.total - self.done) / rate) if rate else None,
                "pid": os.getpid(),
                "started": self.started,
                "updated": time.time(),
                "msg": line,
            }
        try:
            write_json_atomic(self.path, data, self.uid, self.gid, durable=False)
        except OSError:
            pass  # progress is a courtesy; never fail the staging for it

    def finish(self, phase: str, msg: str) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout=5)
        self.note = ""
        with self.lock:
            self.phase = phase
        if self.path:
            self.write(final=phase)
            # The final message replaces the line.
            try:
                with open(self.path, encoding="utf-8") as handle:
                    data = json.load(handle)
                data["msg"] = msg
                write_json_atomic(self.path, data, self.uid, self.gid, durable=False)
            except (OSError, ValueError):
                pass
