"""Files of a staged model revision (labctl_model_stage): the checksum list, hashing, atomic and
durable writes, the names the stager reserves. Standard library only; runs on the target."""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading


SUMS = "SHA256SUMS"
STAMP = ".labctl-verified.json"
JOURNAL = ".labctl-journal.jsonl"
LOCK = ".labctl-stage.lock"
PARTIAL_PREFIX = ".partial-"
CURRENT = "current"
STAMP_FORMAT = 1
BUFFER = 4 * 1024 * 1024
FILE_MODE = 0o644
DIR_MODE = 0o755
_SUM_LINE = re.compile(r"^\\?([0-9a-fA-F]{64}) [ *](.+)$")


class StageError(Exception):
    """A failure reported to the caller with ``msg`` and the problem list."""

    def __init__(self, msg, problems=None):
        super().__init__(msg)
        self.msg = msg
        self.problems = problems or []


# --- small helpers ---------------------------------------------------------------------------

def boot_id():
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def safe_relpath(path):
    return (
        path
        and not path.startswith("/")
        and "\\" not in path
        and "\n" not in path
        and all(part not in ("", ".", "..") for part in path.split("/"))
        and path != SUMS
        and not path.split("/")[0].startswith(".labctl-")
    )


def parse_sums(text, where):
    """``{path: sha256}`` from sha256sum output; unsafe or duplicate paths are refused."""
    sums = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        match = _SUM_LINE.match(line)
        if not match:
            raise StageError("%s line %d is not in sha256sum format: %r" % (where, number, line[:120]))
        digest, path = match.group(1).lower(), match.group(2)
        if path.startswith("./"):
            path = path[2:]
        if not safe_relpath(path):
            raise StageError("%s line %d: refusing the path %r (must be relative, without '..')" % (where, number, path))
        if path in sums:
            raise StageError("%s line %d: %s is listed twice" % (where, number, path))
        sums[path] = digest
    if not sums:
        raise StageError("%s lists no files" % where)
    return sums


def hash_file(path, progress=None, limit=None):
    """sha256 of the first ``limit`` bytes (all when None) of ``path``, and the bytes read."""
    digest = hashlib.sha256()
    buffer = bytearray(BUFFER)
    view = memoryview(buffer)
    done = 0
    with open(path, "rb", buffering=0) as reader:
        advise_sequential(reader.fileno())
        while limit is None or done < limit:
            want = BUFFER if limit is None else min(BUFFER, limit - done)
            count = reader.readinto(view[:want])
            if not count:
                break
            digest.update(view[:count])
            done += count
            if progress is not None:
                progress.add(count)
    return digest, done


def advise_sequential(fd):
    if hasattr(os, "posix_fadvise"):
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        except OSError:
            pass


def write_json_atomic(path, data, uid, gid, durable=True):
    tmp = "%s.tmp-%d-%d" % (path, os.getpid(), threading.get_ident())
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=1, sort_keys=True)
        handle.write("\n")
        handle.flush()
        if durable:
            os.fsync(handle.fileno())
    os.chmod(tmp, FILE_MODE)
    if uid is not None:
        os.chown(tmp, uid, gid)
    os.replace(tmp, path)


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sums_digest(text):
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
