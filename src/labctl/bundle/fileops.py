"""Copying and hashing files with progress."""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

_CHUNK = 1024 * 1024


@dataclass(frozen=True)
class Hashes:
    size: int
    sha256: str
    sha1: str
    md5: str


def copy_hashed(src: Path, dst: Path, advance: Callable[[int], None] | None = None) -> Hashes:
    """Copy ``src`` to ``dst`` (mode and mtime preserved, like shutil.copy2) hashing on the way."""
    sha256, sha1, md5 = hashlib.sha256(), hashlib.sha1(), hashlib.md5()
    size = 0
    with src.open("rb") as reader, dst.open("wb") as writer:
        while chunk := reader.read(_CHUNK):
            writer.write(chunk)
            for digest in (sha256, sha1, md5):
                digest.update(chunk)
            size += len(chunk)
            if advance is not None:
                advance(len(chunk))
    shutil.copystat(src, dst)
    return Hashes(size=size, sha256=sha256.hexdigest(), sha1=sha1.hexdigest(), md5=md5.hexdigest())


def hash_bytes(data: bytes) -> Hashes:
    return Hashes(
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        sha1=hashlib.sha1(data).hexdigest(),
        md5=hashlib.md5(data).hexdigest(),
    )


BIG_CHUNK = 8 * 1024 * 1024


def copy_sha256(src: Path, dst: Path, advance: Callable[[int], None] | None = None) -> tuple[int, str]:
    """Copy a (large) file reading it once: 8 MiB buffer, sha256 only; mode and mtime kept.

    Returns ``(size, sha256)``. For model weights: no sha1/md5 (apt needs those, models do not).
    """
    digest = hashlib.sha256()
    size = 0
    buffer = bytearray(BIG_CHUNK)
    view = memoryview(buffer)
    with src.open("rb", buffering=0) as reader, dst.open("wb", buffering=0) as writer:
        while count := reader.readinto(buffer):
            chunk = view[:count]
            digest.update(chunk)
            written = 0
            while written < count:
                written += writer.write(chunk[written:]) or 0
            size += count
            if advance is not None:
                advance(count)
    shutil.copystat(src, dst)
    return size, digest.hexdigest()
