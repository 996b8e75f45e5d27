"""The ``models`` component: model snapshots into models/<name>/<revision>/ with a SHA256SUMS.

Every file is read once: copied with an 8 MiB buffer and hashed on the way, with a progress bar
(bytes, rate, ETA). Weights are tens of GiB, so a rebuild reuses the previous bundle's copy
instead of reading it again, but only when that is provably the same file:

* the source file's device, inode, size, mtime **and ctime** are exactly those recorded when it
  was last copied and hashed (ctime changes on every write and cannot be set back, so a file
  rewritten with its old size and mtime is still copied again);
* the previous bundle at ``--out`` still has the file as the same inode with the size and mtime
  that build gave it, and its manifest lists the recorded sha256.

Then the previous bundle's file is hard-linked into the new one (no data is read or written) and
the recorded sha256 is used. Anything else (no record, another filesystem, a link that fails) is
copied and hashed again. The records live in ``<cache>/models/reuse.json`` and are written only
after a build replaced ``--out``. What remains unchecked is an in-place edit of the previous
bundle's copy that also resets its mtime; ``labctl bundle verify`` reports such a file.
"""

from __future__ import annotations

import fnmatch
import importlib
import json
import os
import stat
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labctl.bundle.errors import BuildError
from labctl.bundle.fileops import copy_sha256
from labctl.bundle.staging import Staging
from labctl.module_utils import verifycore
from labctl.module_utils.progress import human_bytes
from labctl.module_utils.sums import SUMS, format_sums, safe_relpath
from labctl.paths import private_dir
from labctl.profile import LoadedProfile, Model

MODELS = "models"
REUSE_FILE = "reuse.json"
# Left out of a local snapshot: VCS data (git-lfs clones keep a second copy of every weight
# there) and huggingface_hub's download metadata of `--local-dir` downloads.
SKIPPED_DIRS = (".git", ".cache/huggingface")


@dataclass
class ModelResult:
    entries: list[dict[str, Any]] = field(default_factory=list)

    def component(self) -> list[dict[str, Any]]:
        return self.entries


def _label(index: int, model: Model) -> str:
    return f"models[{index}] ({model.name} {model.revision})"


def _local_snapshot(profile: LoadedProfile, index: int, model: Model) -> Path:
    assert model.path is not None
    directory = profile.resolve(model.path)
    if directory.is_dir():
        return directory
    what = "does not exist" if not directory.exists() else "is not a directory"
    hint = f"; create it with: {model.create_with}" if model.create_with else ""
    raise BuildError(f"{_label(index, model)}.path: {directory} {what} (profile {profile.path}){hint}")


def _hub_snapshot(index: int, model: Model, cache: Path) -> Path:
    source = model.huggingface
    assert source is not None
    where = f"{_label(index, model)}.huggingface: {source.repo_id}@{source.revision}"
    try:
        hub: Any = importlib.import_module("huggingface_hub")
    except ImportError as exc:
        raise BuildError(
            f"{where}: the huggingface_hub package is not installed for {sys.executable} "
            "(pip install huggingface_hub), or download the snapshot elsewhere and give its directory as path:"
        ) from exc
    try:
        snapshot = hub.snapshot_download(
            repo_id=source.repo_id,
            revision=source.revision,
            cache_dir=str(private_dir(cache / "huggingface")),
            ignore_patterns=list(model.exclude) or None,
        )
    except Exception as exc:  # the hub raises many kinds (HTTP, offline, auth, missing revision)
        text = " ".join(str(exc).split()) or type(exc).__name__
        raise BuildError(f"{where}: cannot download it from the Hugging Face hub: {text}") from exc
    path = Path(snapshot)
    if not path.is_dir():
        raise BuildError(f"{where}: huggingface_hub returned {path}, which is not a directory")
    return path


def snapshot_files(root: Path, exclude: list[str], where: str) -> list[tuple[Path, str]]:
    """Every file under ``root`` (symlinks to files followed) as ``(path, relative posix path)``, sorted."""
    found: list[tuple[Path, str]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath)
        rel_dir = base.relative_to(root).as_posix()
        kept = []
        for name in sorted(dirnames):
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            if rel in SKIPPED_DIRS:
                continue
            if (base / name).is_symlink():
                raise BuildError(f"{where}: {root / rel} is a symlink to a directory; copy the snapshot without it")
            kept.append(name)
        dirnames[:] = kept
        for name in filenames:
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            path = base / name
            if any(fnmatch.fnmatchcase(rel, pattern) for pattern in exclude):
                continue
            if not safe_relpath(rel):
                raise BuildError(f"{where}: {path}: file names with a backslash or newline are not supported")
            if rel == SUMS:
                raise BuildError(f"{where}: {path}: the snapshot has its own {SUMS}; the bundle writes that file")
            if not path.is_file():
                raise BuildError(f"{where}: {path} is not a regular file (or a symlink to one)")
            found.append((path, rel))
    if not found:
        raise BuildError(f"{where}: {root} has no files")
    return sorted(found, key=lambda item: item[1])


def _stat_key(st: os.stat_result) -> list[int]:
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _out_key(st: os.stat_result) -> list[int]:
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns]


class ReuseIndex:
    """What earlier builds copied, per output dir and bundle path (see the module docstring)."""

    def __init__(self, cache: Path, out: Path) -> None:
        self.path = private_dir(cache / MODELS) / REUSE_FILE
        self.out = str(out)
        self.previous: dict[str, Any] = self._load().get(self.out, {})
        self.current: dict[str, Any] = {}
        self.manifest = self._previous_manifest(out)

    def _load(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    @staticmethod
    def _previous_manifest(out: Path) -> dict[str, tuple[int, str]]:
        try:
            manifest = json.loads((out / verifycore.MANIFEST).read_text(encoding="utf-8"))
            return {f["path"]: (int(f["size"]), str(f["sha256"])) for f in manifest["files"]}
        except (OSError, ValueError, KeyError, TypeError):
            return {}

    def reusable(self, src: Path, src_stat: os.stat_result, rel: str) -> tuple[Path, str] | None:
        """The previous bundle's copy of ``rel`` and its sha256, when it may be linked (else None)."""
        record = self.previous.get(rel)
        if not isinstance(record, dict) or record.get("src") != str(src):
            return None
        if record.get("src_stat") != _stat_key(src_stat):
            return None
        sha256 = record.get("sha256")
        if self.manifest.get(rel) != (src_stat.st_size, sha256) or not isinstance(sha256, str):
            return None
        old = Path(self.out) / rel
        try:
            old_stat = os.stat(old, follow_symlinks=False)
        except OSError:
            return None
        if not stat.S_ISREG(old_stat.st_mode) or record.get("out_stat") != _out_key(old_stat):
            return None
        if old_stat.st_mtime_ns != src_stat.st_mtime_ns:
            return None
        return old, sha256

    def remember(self, rel: str, src: Path, src_stat: os.stat_result, sha256: str, dst: Path) -> None:
        self.current[rel] = {
            "src": str(src),
            "src_stat": _stat_key(src_stat),
            "sha256": sha256,
            "out_stat": _out_key(os.stat(dst, follow_symlinks=False)),
        }

    def save(self) -> None:
        """Replace this output dir's records (called once the new bundle is in place)."""
        data = self._load()
        if self.current:
            data[self.out] = self.current
        else:
            data.pop(self.out, None)
        handle, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".reuse-")
        with os.fdopen(handle, "w", encoding="utf-8") as writer:
            json.dump(data, writer, indent=1, sort_keys=True)
        os.replace(tmp, self.path)


def _stage_file(
    staging: Staging, reuse: ReuseIndex, src: Path, rel: str, advance: Callable[[int], None]
) -> tuple[int, str, bool]:
    """Place ``src`` at ``rel``: returns (size, sha256, reused)."""
    dst = staging.new_path(rel, str(src))
    before = src.stat()
    staging.input_mtimes.append(before.st_mtime)
    previous = reuse.reusable(src, before, rel)
    if previous is not None:
        old, sha256 = previous
        try:
            os.link(old, dst)
        except OSError:
            pass  # another filesystem, no hard links: copy instead
        else:
            advance(before.st_size)
            reuse.remember(rel, src, before, sha256, dst)
            return before.st_size, sha256, True
    size, sha256 = copy_sha256(src, dst, advance)
    after = src.stat()
    if _stat_key(after) == _stat_key(before) and size == before.st_size:
        reuse.remember(rel, src, before, sha256, dst)
    # else: the source changed while it was read; the bundle lists what was copied, nothing is reused
    return size, sha256, False


def collect_models(profile: LoadedProfile, cache: Path, staging: Staging) -> ModelResult:
    result = ModelResult()
    models = profile.spec.models
    if not models:
        return result
    reuse = ReuseIndex(cache, staging.out)
    for index, model in enumerate(models):
        if model.path is not None:
            root = _local_snapshot(profile, index, model)
            source = f"path {model.path}"
        else:
            assert model.huggingface is not None
            staging.reporter.info(f"{_label(index, model)}: downloading {model.huggingface.repo_id}@{model.huggingface.revision}")
            root = _hub_snapshot(index, model, cache)
            source = f"huggingface {model.huggingface.repo_id}@{model.huggingface.revision}"
        files = snapshot_files(root, list(model.exclude), _label(index, model))
        prefix = f"{MODELS}/{model.name}/{model.revision}"
        total = sum(path.stat().st_size for path, _ in files)
        sums: list[tuple[str, str]] = []
        reused = 0
        copied_bytes = 0
        total_bytes = 0
        with staging.reporter.task(f"models: {model.name} {model.revision}", total) as advance:
            for path, rel in files:
                size, sha256, was_reused = _stage_file(staging, reuse, path, f"{prefix}/{rel}", advance)
                staging.record(f"{prefix}/{rel}", size, sha256)
                sums.append((sha256, rel))
                reused += was_reused
                total_bytes += size
                copied_bytes += 0 if was_reused else size
        sums_rel = f"{prefix}/{SUMS}"
        staging.add_bytes(format_sums(sums).encode("utf-8"), sums_rel, f"{_label(index, model)}")
        if reused:
            staging.reporter.info(
                f"models: {model.name} {model.revision}: {reused} of {len(files)} files linked from the previous "
                f"bundle, {human_bytes(copied_bytes)} copied"
            )
        result.entries.append(
            {
                "name": model.name,
                "revision": model.revision,
                "files": len(files),
                "bytes": total_bytes,
                "sha256sums": sums_rel,
                "source": source,
            }
        )

    def save() -> None:
        try:
            reuse.save()
        except OSError as exc:
            staging.reporter.warn(f"models: cannot record reusable files in {reuse.path}: {exc}")

    staging.after_commit.append(save)
    return result
