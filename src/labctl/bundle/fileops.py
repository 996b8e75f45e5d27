"""Copying and hashing files with progress."""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from labctl.module_utils.sums import Sink, pump

_CHUNK = 1024 * 1024


@dataclass(frozen=True)
class Hashes:
    size: int
    sha256: str
    sha1: str
    md5: str


class _All:
    """Several digests fed as one."""

    def __init__(self, *digests: Sink) -> None:
        self.digests = digests

    def update(self, data: memoryview, /) -> None:
        for digest in self.digests:
            digest.update(data)


def copy_hashed(src: Path, dst: Path, advance: Callable[[int], None] | None = None) -> Hashes:
    """Copy ``src`` to ``dst`` (mode and mtime preserved, like shutil.copy2) hashing on the way."""
    sha256, sha1, md5 = hashlib.sha256(), hashlib.sha1(), hashlib.md5()
    with src.open("rb", buffering=0) as reader, dst.open("wb", buffering=0) as writer:
        size = pump(reader, _All(sha256, sha1, md5), writer.write, advance, size=_CHUNK)
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
    with src.open("rb", buffering=0) as reader, dst.open("wb", buffering=0) as writer:
        size = pump(reader, digest, writer.write, advance, size=BIG_CHUNK)
    shutil.copystat(src, dst)
    return size, digest.hexdigest()
