"""Files by content: the streaming sha256 of a file, the relative paths a checksum list may name,
and the SHA256SUMS format.

``labctl bundle build`` writes each model revision's SHA256SUMS with ``format_sums``; the
labctl_model_stage module reads it on the target with ``parse_sums``. Every sha256 of a file in
labctl, on the control node and on the targets, is read through ``pump``. Part of
``labctl.module_utils``: standard library only (see that package's docstring).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Callable, Optional, Protocol

if TYPE_CHECKING:
    from hashlib import _Hash

SUMS = "SHA256SUMS"
# The names a staged revision directory keeps for itself (stamp, journal, lock): never listed.
RESERVED_PREFIX = ".labctl-"
BUFFER = 4 * 1024 * 1024
_SUM_LINE = re.compile(r"^\\?([0-9a-fA-F]{64}) [ *](.+)$")

Advance = Callable[[int], None]
Write = Callable[[memoryview], Optional[int]]


class Reader(Protocol):
    """What ``pump`` reads: a file opened with ``buffering=0``, a gzip or an HTTP stream."""

    def readinto(self, buffer: memoryview, /) -> int | None: ...


class Sink(Protocol):
    """What ``pump`` feeds: a hashlib object, or several behind one ``update``."""

    def update(self, data: memoryview, /) -> None: ...


class SumsError(ValueError):
    """A checksum list that cannot be used; the message names the file and the line."""


# --- hashing -------------------------------------------------------------------------------------

def advise_sequential(fd: int) -> None:
    """Tell the kernel the file is read once from start to end (larger read-ahead)."""
    if hasattr(os, "posix_fadvise"):
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        except OSError:
            pass


def pump(reader: Reader, digest: Sink, write: Write | None = None, advance: Advance | None = None,
         limit: int | None = None, size: int = BUFFER) -> int:
    """Read ``reader`` to its end (or its first ``limit`` bytes) into ``digest``, and into ``write``
    when given (every byte written, short writes continued); ``advance(n)`` after each read.
    Returns the number of bytes read. One buffer of ``size`` bytes, no copy per read."""
    buffer = bytearray(size)
    view = memoryview(buffer)
    done = 0
    while limit is None or done < limit:
        want = size if limit is None else min(size, limit - done)
        count = reader.readinto(view[:want])
        if not count:
            break
        data = view[:count]
        digest.update(data)
        if write is not None:
            written = 0
            while written < count:
                written += write(data[written:]) or 0
        done += count
        if advance is not None:
            advance(count)
    return done


def hash_file(path: str, advance: Advance | None = None, limit: int | None = None) -> tuple[_Hash, int]:
    """The sha256 of the first ``limit`` bytes (all when None) of ``path``, and the bytes read."""
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as reader:
        advise_sequential(reader.fileno())
        done = pump(reader, digest, advance=advance, limit=limit)
    return digest, done


def sha256_file(path: str) -> str:
    """The sha256 of ``path`` (hex)."""
    return hash_file(path)[0].hexdigest()


# --- paths ---------------------------------------------------------------------------------------

def safe_relpath(path: object) -> bool:
    """A relative POSIX path that stays inside its directory: no leading '/', no backslash or
    newline, no empty, '.' or '..' part."""
    if not isinstance(path, str) or not path or path.startswith("/") or "\\" in path or "\n" in path:
        return False
    return all(part not in ("", ".", "..") for part in path.split("/"))


def listable(path: str) -> bool:
    """A path a SHA256SUMS may list: safe, not the list itself, not a name the stager reserves."""
    return safe_relpath(path) and path != SUMS and not path.split("/")[0].startswith(RESERVED_PREFIX)


# --- the SHA256SUMS format (sha256sum's output) ----------------------------------------------------

def format_sums(entries: Iterable[tuple[str, str]]) -> str:
    """SHA256SUMS text of ``(sha256, path)`` pairs, in the order given (sha256sum's text mode)."""
    return "".join(f"{digest}  {path}\n" for digest, path in entries)


def parse_sums(text: str, where: str) -> dict[str, str]:
    """``{path: sha256}`` from sha256sum output (either mode, a leading './' dropped, '#' comments);
    a malformed line, an unsafe or reserved path, a path listed twice or an empty list raise SumsError."""
    sums: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        match = _SUM_LINE.match(line)
        if not match:
            raise SumsError("%s line %d is not in sha256sum format: %r" % (where, number, line[:120]))
        digest, path = match.group(1).lower(), match.group(2)
        path = path.removeprefix("./")
        if not listable(path):
            raise SumsError("%s line %d: refusing the path %r (must be relative, without '..')" % (where, number, path))
        if path in sums:
            raise SumsError("%s line %d: %s is listed twice" % (where, number, path))
        sums[path] = digest
    if not sums:
        raise SumsError(f"{where} lists no files")
    return sums
