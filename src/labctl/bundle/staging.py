"""The bundle under construction (``DIR.partial``) and its atomic-ish replacement of ``DIR``."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from labctl.bundle.errors import BuildError
from labctl.bundle.fileops import Hashes, copy_hashed, hash_bytes
from labctl.module_utils import verifycore
from labctl.module_utils.sums import sha256_file
from labctl.progress import Reporter


@dataclass
class Staging:
    out: Path
    root: Path
    reporter: Reporter
    hashes: dict[str, Hashes] = field(default_factory=dict)
    input_mtimes: list[float] = field(default_factory=list)
    # size and sha256 of files placed without Hashes (model files, hashed while copied or reused)
    sums: dict[str, tuple[int, str]] = field(default_factory=dict)
    # run after the staged bundle replaced ``out`` (e.g. recording what a next build may reuse)
    after_commit: list[Callable[[], None]] = field(default_factory=list)

    @classmethod
    def start(cls, out: Path, reporter: Reporter) -> Staging:
        out = out.expanduser().absolute()
        check_replaceable(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        root = out.with_name(out.name + ".partial")
        if root.exists():
            shutil.rmtree(root)
        for sub in ("apt/pool", "wheels", "keys"):
            (root / sub).mkdir(parents=True)
        return cls(out=out, root=root, reporter=reporter)

    def add_file(self, src: Path, rel: str, advance: Callable[[int], None] | None = None) -> Hashes:
        """Copy an input file into the bundle at ``rel`` (mtime kept) and remember its hashes."""
        dst = self.new_path(rel, str(src))
        hashes = copy_hashed(src, dst, advance)
        self.hashes[rel] = hashes
        self.input_mtimes.append(src.stat().st_mtime)
        return hashes

    def new_path(self, rel: str, origin: str) -> Path:
        """Where a new bundle file ``rel`` goes (parents created); refuses a second file at ``rel``."""
        dst = self.root / rel
        if dst.exists() or rel in self.sums:
            raise BuildError(f"{origin}: {rel} is already in the bundle (two inputs with the same file name)")
        dst.parent.mkdir(parents=True, exist_ok=True)
        return dst

    def add_bytes(self, data: bytes, rel: str, origin: str) -> Hashes:
        """Write generated or extracted content at ``rel``; it does not date the bundle."""
        dst = self.new_path(rel, origin)
        dst.write_bytes(data)
        hashes = hash_bytes(data)
        self.hashes[rel] = hashes
        return hashes

    def record(self, rel: str, size: int, sha256: str) -> None:
        """Remember the size and sha256 of a file placed at ``rel`` by the caller."""
        self.sums[rel] = (size, sha256)

    def add_all(self, sources: Iterable[tuple[Path, str]], description: str) -> dict[str, Hashes]:
        items = list(sources)
        total = sum(src.stat().st_size for src, _ in items)
        added: dict[str, Hashes] = {}
        with self.reporter.task(description, total) as advance:
            for src, rel in items:
                added[rel] = self.add_file(src, rel, advance)
        return added

    def file_entries(self) -> list[dict[str, object]]:
        """Every file but the manifest and its signature, sorted by path, with size and sha256."""
        entries = []
        for path in sorted(p for p in self.root.rglob("*") if p.is_file() or p.is_symlink()):
            rel = path.relative_to(self.root).as_posix()
            if rel in (verifycore.MANIFEST, verifycore.SIGNATURE):
                continue
            if path.is_symlink():
                raise BuildError(f"{rel}: symlinks are not allowed in a bundle")
            known = self.hashes.get(rel)
            summed = self.sums.get(rel)
            if known is not None:
                size, digest = known.size, known.sha256
            elif summed is not None:
                size, digest = summed
            else:
                size, digest = path.stat().st_size, sha256_file(str(path))
            entries.append({"path": rel, "size": size, "sha256": digest})
        return entries

    def abort(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def commit(self) -> None:
        """Replace ``out`` with the staged bundle: rename the old one away, rename in, delete old."""
        if self.out.exists():
            old = self.out.with_name(f"{self.out.name}.old-{os.getpid()}")
            self.out.rename(old)
            self.root.rename(self.out)
            shutil.rmtree(old)
        else:
            self.root.rename(self.out)
        for callback in self.after_commit:
            callback()


def check_replaceable(out: Path) -> None:
    if not out.exists():
        return
    if not out.is_dir():
        raise BuildError(f"--out {out}: exists and is not a directory")
    if any(out.iterdir()) and not (out / verifycore.MANIFEST).is_file():
        raise BuildError(f"--out {out}: exists, is not empty and is not a labctl bundle; refusing to replace it")
