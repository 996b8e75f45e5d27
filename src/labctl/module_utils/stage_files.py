"""Files of a staged model revision (labctl_model_stage): the names the stager keeps for itself,
atomic and durable writes. Part of ``labctl.module_utils``: standard library only, runs on the target."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from typing import Any

CURRENT = "current"
PARTIAL_PREFIX = ".partial-"
# In the revision directory, beside the files of its SHA256SUMS (sums.RESERVED_PREFIX).
STAMP = ".labctl-verified.json"
JOURNAL = ".labctl-journal.jsonl"
# In the model directory, beside the revisions.
LOCK = ".labctl-stage.lock"
STAMP_FORMAT = 1
FILE_MODE = 0o644
DIR_MODE = 0o755


class StageError(Exception):
    """A failure reported to the caller with ``msg`` and the problem list."""

    def __init__(self, msg: str, problems: list[dict[str, Any]] | None = None) -> None:
        super().__init__(msg)
        self.msg = msg
        self.problems = problems or []


def boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def write_json_atomic(path: str, data: Any, uid: int | None, gid: int | None, durable: bool = True) -> None:
    tmp = "%s.tmp-%d-%d" % (path, os.getpid(), threading.get_ident())
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=1, sort_keys=True)
        handle.write("\n")
        handle.flush()
        if durable:
            os.fsync(handle.fileno())
    os.chmod(tmp, FILE_MODE)
    if uid is not None and gid is not None:
        os.chown(tmp, uid, gid)
    os.replace(tmp, path)


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sums_digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
