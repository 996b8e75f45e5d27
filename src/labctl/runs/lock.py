"""One playbook run per inventory at a time.

The lock is an flock(2) on a file named after the inventory: the kernel drops it when its holder
dies however it dies, so a lock left by a dead process is simply free again, and the file's
content (who held it) tells the next run whose run it replaces. The holder writes its PID, start
time and command line into the file for whoever is refused.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any


class LockHeld(Exception):
    """Another run holds the lock; ``holder`` says who."""

    def __init__(self, path: Path, holder: dict[str, Any]) -> None:
        self.path = path
        self.holder = holder
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("started", 0)))
        super().__init__(
            f"another labctl run holds {path}: PID {holder.get('pid', '?')} on {holder.get('host', '?')} "
            f"since {since}: {holder.get('command', '?')}"
        )


def lock_path(state_dir: Path, inventory: Path) -> Path:
    """The lock file of an inventory: its directory name plus a hash of its absolute path."""
    resolved = inventory.expanduser().resolve()
    digest = hashlib.sha256(str(resolved).encode()).hexdigest()[:12]
    name = resolved.name if resolved.is_dir() else resolved.parent.name
    return state_dir / "locks" / f"{name}-{digest}.lock"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class InventoryLock:
    """``with InventoryLock(path, command):`` holds the lock or raises LockHeld at once."""

    path: Path
    command: str
    previous: dict[str, Any] | None = None  # a dead holder's record, when the lock was taken over
    _handle: IO[str] | None = None

    def __enter__(self) -> InventoryLock:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # 0600: the holder's command line (extra variables redacted) is nobody else's business.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        os.fchmod(fd, 0o600)
        handle = open(fd, "a+", encoding="utf-8")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            try:
                holder = json.loads(handle.read() or "{}")
            except ValueError:
                holder = {}
            handle.close()
            raise LockHeld(self.path, holder) from None
        handle.seek(0)
        try:
            old = json.loads(handle.read() or "null")
        except ValueError:
            old = None
        if isinstance(old, dict) and old.get("pid") and not old.get("released"):
            # The kernel freed the lock, but the file says a run never finished: its process died.
            self.previous = old | {"alive": _pid_alive(int(old["pid"]))}
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
                                 "command": self.command}))
        handle.flush()
        os.fsync(handle.fileno())
        self._handle = handle
        return self

    def __exit__(self, *exc: object) -> None:
        handle = self._handle
        if handle is None:
            return
        handle.seek(0)
        holder = json.loads(handle.read() or "{}")
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps(holder | {"released": time.time()}))
        handle.flush()
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()
        self._handle = None
