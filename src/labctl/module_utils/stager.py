"""The staging run of one model revision (labctl_model_stage): copy or check every file of the
checksum list into a partial directory, verify, and switch it into place; resumable, locked,
journalled. Part of ``labctl.module_utils``: standard library only, runs on the target."""

from __future__ import annotations

import errno
import fcntl
import grp
import hashlib
import json
import os
import pwd
import stat
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import IO, TYPE_CHECKING, Any

from .progress import Progress, human_bytes
from .stage_files import (
    CURRENT,
    DIR_MODE,
    FILE_MODE,
    JOURNAL,
    LOCK,
    PARTIAL_PREFIX,
    STAMP,
    STAMP_FORMAT,
    StageError,
    boot_id,
    fsync_dir,
    sums_digest,
    write_json_atomic,
)
from .sums import BUFFER, RESERVED_PREFIX, SUMS, SumsError, advise_sequential, hash_file, parse_sums, pump

if TYPE_CHECKING:
    from hashlib import _Hash

Problem = dict[str, Any]
# One file of the plan: (path, action, offset, size), action copy, resume, skip, rehash or hash.
Item = tuple[str, str, int, int]


# --- the staging run -------------------------------------------------------------------------

class Stager:
    def __init__(self, module: Any) -> None:
        self.module = module
        params = module.params
        self.check = module.check_mode
        self.dest = os.path.normpath(params["dest"])
        self.parent = os.path.dirname(self.dest)
        self.revision = os.path.basename(self.dest)
        self.partial = os.path.join(self.parent, PARTIAL_PREFIX + self.revision)
        self.src: str | None = os.path.normpath(params["src"]) if params["src"] else None
        self.verify = params["verify"]
        self.workers = max(1, params["workers"])
        self.label = params["label"] or f"{os.path.basename(self.parent)} {self.revision}"
        self.uid, self.gid = self._ids(params["owner"], params["group"])
        self.progress = Progress(params["progress_file"], self.label, self.uid, self.gid)
        self.progress.limit = max(0, params["bwlimit"]) * 2**20
        self.boot = boot_id()
        self.changed = False
        self.counts = {"bytes_copied": 0, "bytes_resumed": 0, "bytes_skipped": 0, "bytes_hashed": 0,
                           "files_copied": 0, "files_resumed": 0, "files_skipped": 0, "files_hashed": 0}
        self.count_lock = threading.Lock()
        self.journal_lock = threading.Lock()
        self.waited = 0.0
        self.in_place = False
        self.warnings: list[str] = []
        # What the run did (set by check_staged or stage).
        self.staged = False
        self.verification = ""
        self.files = 0
        self.bytes_total = 0

    def _ids(self, owner: str, group: str) -> tuple[int, int]:
        try:
            uid = int(owner) if owner.isdigit() else pwd.getpwnam(owner).pw_uid
            gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
        except KeyError as exc:
            raise StageError(f"unknown owner or group: {exc}") from None
        return uid, gid

    def count(self, **kwargs: int) -> None:
        with self.count_lock:
            for key, value in kwargs.items():
                self.counts[key] += value

    # -- ownership and modes -----------------------------------------------------------------

    def own(self, path: str, mode: int, st: os.stat_result | None = None) -> bool:
        """Give ``path`` the owner, group and mode; True when something changed."""
        st = st or os.lstat(path)
        changed = False
        if (st.st_uid, st.st_gid) != (self.uid, self.gid):
            os.chown(path, self.uid, self.gid)
            changed = True
        if stat.S_IMODE(st.st_mode) != mode:
            os.chmod(path, mode)
            changed = True
        return changed

    def makedirs(self, path: str) -> None:
        missing = []
        while not os.path.isdir(path):
            missing.append(path)
            path = os.path.dirname(path)
        for directory in reversed(missing):
            try:
                os.mkdir(directory, DIR_MODE)
            except FileExistsError:
                pass
            self.own(directory, DIR_MODE)

    # -- locking -------------------------------------------------------------------------------

    def lock(self) -> IO[str] | None:
        """Hold the model directory's staging lock (waiting for another run to finish)."""
        path = os.path.join(self.parent, LOCK)
        if self.check:
            if not os.path.exists(path):
                return None
            handle = open(path, "a", encoding="utf-8")  # noqa: SIM115 - held open as the lock, returned to the caller
            try:
                fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError:
                self.warnings.append(f"another staging run holds {path}; this check describes the state before it ends")
            return handle
        self.makedirs(self.parent)
        handle = open(path, "a+", encoding="utf-8")  # noqa: SIM115 - held open as the lock, returned to the caller
        self.own(path, FILE_MODE)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            handle.seek(0)
            holder = handle.read().strip() or "?"
            started = time.monotonic()
            self.progress.note = f"waiting for the staging run {holder} that is still going"
            fcntl.flock(handle, fcntl.LOCK_EX)
            self.waited = time.monotonic() - started
            self.progress.note = ""
        handle.seek(0)
        handle.truncate()
        handle.write("pid %d\n" % os.getpid())
        handle.flush()
        return handle

    # -- stamp and listing ---------------------------------------------------------------------

    def load_stamp(self, directory: str) -> dict[str, Any] | None:
        try:
            with open(os.path.join(directory, STAMP), encoding="utf-8") as handle:
                stamp = json.load(handle)
        except (OSError, ValueError):
            return None
        if not isinstance(stamp, dict) or stamp.get("format") != STAMP_FORMAT or not isinstance(stamp.get("files"), dict):
            return None
        return stamp

    def listing(self) -> tuple[list[dict[str, Any]], list[str]]:
        revisions: list[dict[str, Any]] = []
        partials: list[str] = []
        if not os.path.isdir(self.parent):
            return revisions, partials
        for name in sorted(os.listdir(self.parent)):
            path = os.path.join(self.parent, name)
            if name.startswith(PARTIAL_PREFIX):
                partials.append(path)
                continue
            if name.startswith(".") or name == CURRENT or os.path.islink(path) or not os.path.isdir(path):
                continue
            stamp = self.load_stamp(path)
            revisions.append({
                "revision": name,
                "path": path,
                "stamped": stamp is not None,
                "verified_at": (stamp or {}).get("verified_at", 0),
                "current_since": (stamp or {}).get("current_since") or 0,
                "bytes": (stamp or {}).get("bytes", 0),
            })
        revisions.sort(key=lambda r: (r["current_since"], r["verified_at"], r["revision"]), reverse=True)
        return revisions, partials

    # -- reading SHA256SUMS --------------------------------------------------------------------

    def read_sums(self, directory: str) -> tuple[str, dict[str, str]]:
        found = self.find_sums(directory)
        if found is None:
            raise StageError(f"{self.label}: {os.path.join(directory, SUMS)} not found "
                             "(every model revision carries one, in sha256sum format)")
        return found

    def find_sums(self, directory: str) -> tuple[str, dict[str, str]] | None:
        """The text of ``directory``'s SHA256SUMS and what it lists; None when there is none."""
        path = os.path.join(directory, SUMS)
        try:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
        except FileNotFoundError:
            return None
        try:
            return text, parse_sums(text, path)
        except SumsError as exc:
            raise StageError(str(exc)) from None

    # -- state=current -------------------------------------------------------------------------

    def mark_current(self) -> str:
        stamp = self.load_stamp(self.dest)
        if stamp is None:
            if self.check and not os.path.exists(self.dest):
                # Check mode: the revision would have been staged by the task before.
                self.changed = True
                return f"{self.label}: would record as current once staged"
            raise StageError(f"{self.label}: {self.dest} is not a staged revision (no valid {STAMP})")
        handle = self.lock()
        try:
            if not self.check:
                stamp["current_since"] = time.time()
                write_json_atomic(os.path.join(self.dest, STAMP), stamp, self.uid, self.gid)
        finally:
            if handle:
                handle.close()
        self.changed = True
        return f"{self.label}: recorded as current"

    # -- state=staged --------------------------------------------------------------------------

    def run(self) -> str:
        handle = self.lock()
        try:
            if os.path.isdir(self.dest):
                return self.check_staged()
            if os.path.lexists(self.dest):
                raise StageError(f"{self.label}: {self.dest} exists and is not a directory")
            return self.stage()
        finally:
            if handle:
                handle.close()

    def check_staged(self) -> str:
        stamp = self.load_stamp(self.dest)
        if stamp is None:
            raise StageError(
                f"{self.label}: {self.dest} exists but carries no valid {STAMP}: it was not staged by this role (or staging was "
                "interrupted by hand); move it away and run again")
        dest_text, dest_sums = self.read_sums(self.dest)
        if sums_digest(dest_text) != stamp.get("sums_sha256"):
            raise StageError("{}: {}/{} changed since the revision was verified (sha256 {}, stamp says {})".format(
                self.label, self.dest, SUMS, sums_digest(dest_text), stamp.get("sums_sha256")))
        if self.src and os.path.isdir(self.src) and os.path.realpath(self.src) != os.path.realpath(self.partial):
            src_sums = self.find_sums(self.src)
            if src_sums is not None and sums_digest(src_sums[0]) != stamp.get("sums_sha256"):
                raise StageError(
                    f"{self.label}: the source's {SUMS} differs from the one {self.dest} was verified against: "
                    f"the revision label {self.revision} "
                    "names two different snapshots. Give the new snapshot a new revision label (bundle profile "
                    f"models: revision), or remove {self.dest} to stage it again.")
        entries = stamp["files"]
        if set(entries) != set(dest_sums):
            raise StageError(f"{self.label}: the stamp and {self.dest}/{SUMS} list different files")
        problems: list[Problem] = []
        drifted: list[str] = []
        fixed = 0
        for path in sorted(entries):
            full = os.path.join(self.dest, path)
            try:
                st = os.lstat(full)
            except FileNotFoundError:
                problems.append({"path": path, "problem": "missing", "expected": dest_sums[path], "found": None})
                continue
            if not stat.S_ISREG(st.st_mode):
                problems.append({"path": path, "problem": "not a regular file", "expected": dest_sums[path], "found": None})
                continue
            entry = entries[path]
            if (st.st_size, st.st_mtime_ns, st.st_ino) != (entry.get("size"), entry.get("mtime_ns"), entry.get("ino")):
                drifted.append(path)
            wrong = (st.st_uid, st.st_gid) != (self.uid, self.gid) or stat.S_IMODE(st.st_mode) != FILE_MODE
            if (not self.check and self.own(full, FILE_MODE, st)) or (self.check and wrong):
                fixed += 1
        extra = self.extra_files(self.dest, set(entries) | {SUMS, STAMP})
        for path in extra:
            problems.append({"path": path, "problem": f"not listed in {SUMS}", "expected": None, "found": None})
        if problems:
            raise StageError(self.problem_message(f"staged revision {self.dest}", problems, staged=True), problems)
        to_hash = sorted(entries) if self.verify == "full" else drifted
        if to_hash:
            total = sum(entries[p]["size"] for p in to_hash)
            self.progress.begin("verify", total, len(to_hash))
            found = self.hash_many([(p, os.path.join(self.dest, p)) for p in to_hash])
            for path in to_hash:
                digest, _size = found[path]
                if digest != dest_sums[path]:
                    problems.append({"path": path, "problem": "content changed", "expected": dest_sums[path], "found": digest})
            if problems:
                raise StageError(self.problem_message(f"staged revision {self.dest}", problems, staged=True), problems)
        if drifted:
            # Same content, new metadata (touched, copied back): refresh the stamp.
            for path in drifted:
                st = os.stat(os.path.join(self.dest, path))
                entries[path].update(size=st.st_size, mtime_ns=st.st_mtime_ns, ino=st.st_ino)
            if not self.check:
                write_json_atomic(os.path.join(self.dest, STAMP), stamp, self.uid, self.gid)
            self.changed = True
            self.warnings.append("%s: %d file(s) changed metadata but not content (%s); the stamp was refreshed" % (
                self.label, len(drifted), ", ".join(drifted[:5])))
        if fixed:
            self.changed = True
        for directory in self.dirs_of(self.dest, entries):
            if self.check:
                st = os.lstat(directory)
                if (st.st_uid, st.st_gid) != (self.uid, self.gid) or stat.S_IMODE(st.st_mode) != DIR_MODE:
                    self.changed = True
            elif self.own(directory, DIR_MODE):
                self.changed = True
        self.verification = "full" if self.verify == "full" else "quick"
        self.bytes_total = sum(e["size"] for e in entries.values())
        self.files = len(entries)
        self.staged = False
        what = "hashed every file again" if self.verify == "full" else (
            "re-hashed %d file(s) with new metadata" % len(drifted) if drifted else "stamp matches, no file read")
        return "%s: already staged and verified (%s); %d files, %s" % (self.label, what, self.files, human_bytes(self.bytes_total))

    def dirs_of(self, root: str, paths: Iterable[str]) -> list[str]:
        dirs = {root}
        for path in paths:
            parts = path.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                dirs.add(os.path.join(root, *parts[:i]))
        return sorted(dirs)

    def extra_files(self, root: str, expected: set[str]) -> list[str]:
        extra = []
        for dirpath, dirnames, filenames in os.walk(root):
            rel_dir = os.path.relpath(dirpath, root)
            for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
                rel = name if rel_dir == "." else f"{rel_dir}/{name}"
                if rel not in expected and not (rel_dir == "." and name.startswith(RESERVED_PREFIX)):
                    extra.append(rel)
        return sorted(extra)

    def problem_message(self, where: str, problems: list[Problem], staged: bool = False) -> str:
        lines = []
        for p in problems:
            if p["problem"] in ("sha256 mismatch", "content changed"):
                lines.append("{}: {}: expected sha256 {}, found {}".format(p["path"], p["problem"], p["expected"], p["found"]))
            else:
                lines.append("{}: {}".format(p["path"], p["problem"]))
        if staged:
            tail = ("the revision on disk does not match what was verified; `current` was not changed by this run. "
                    f"Remove {self.dest} and stage it again (or roll back to another revision)")
        else:
            tail = (f"nothing was renamed into place and `current` is unchanged; the good files stay in {self.partial} and a "
                    "re-run copies only the failed ones. Check the source (bundle) with `labctl bundle verify`")
        return "%s: %d file(s) in %s failed verification against %s: %s. %s." % (
            self.label, len(problems), where, SUMS, "; ".join(lines), tail)

    # -- journal -------------------------------------------------------------------------------

    def load_journal(self) -> dict[str, dict[str, Any]]:
        entries: dict[str, dict[str, Any]] = {}
        try:
            with open(os.path.join(self.partial, JOURNAL), encoding="utf-8") as handle:
                for line in handle:
                    try:
                        entry = json.loads(line)
                    except ValueError:
                        continue  # a line cut off by the interruption
                    if not isinstance(entry, dict) or "path" not in entry:
                        continue
                    if entry.get("drop"):
                        entries.pop(entry["path"], None)
                    else:
                        entries[entry["path"]] = entry
        except FileNotFoundError:
            pass
        return entries

    def journal(self, entry: dict[str, Any]) -> None:
        with self.journal_lock, open(os.path.join(self.partial, JOURNAL), "a", encoding="utf-8") as handle:
            handle.write(json.dumps(entry, sort_keys=True) + "\n")

    # -- staging -------------------------------------------------------------------------------

    def plan(self, sums: dict[str, str], in_place: bool) -> tuple[list[Item], list[Problem]]:
        """Per file: (path, action, offset) with action skip, rehash, resume, copy or hash."""
        journal = self.load_journal() if os.path.isdir(self.partial) else {}
        plan: list[Item] = []
        problems: list[Problem] = []
        for path in sorted(sums):
            src = os.path.join(self.source(), path)
            dst = os.path.join(self.partial, path)
            try:
                src_st = os.stat(src)
            except FileNotFoundError:
                problems.append({"path": path, "problem": f"missing in the source {self.src}", "expected": sums[path], "found": None})
                continue
            if not stat.S_ISREG(src_st.st_mode):
                problems.append({"path": path, "problem": "not a regular file in the source", "expected": sums[path], "found": None})
                continue
            try:
                dst_st = os.lstat(dst)
            except FileNotFoundError:
                dst_st = None
            entry = journal.get(path)
            if (entry and dst_st is not None and stat.S_ISREG(dst_st.st_mode) and entry.get("sha256") == sums[path]
                    and (dst_st.st_size, dst_st.st_mtime_ns, dst_st.st_ino) == (entry.get("size"), entry.get("mtime_ns"), entry.get("ino"))
                    and (in_place or dst_st.st_size == src_st.st_size)):
                trusted = entry.get("boot_id") == self.boot and self.verify != "full"
                plan.append((path, "skip" if trusted else "rehash", 0, dst_st.st_size))
            elif in_place:
                plan.append((path, "hash", 0, src_st.st_size))
            elif dst_st is not None and stat.S_ISREG(dst_st.st_mode) and 0 < dst_st.st_size < src_st.st_size:
                plan.append((path, "resume", dst_st.st_size, src_st.st_size))
            else:
                plan.append((path, "copy", 0, src_st.st_size))
        return plan, problems

    def source(self) -> str:
        """The source directory: staging needs one."""
        if not self.src:
            raise StageError(f"{self.label}: {self.dest} is not staged and no source was given")
        return self.src

    def stage(self) -> str:
        src = self.source()
        if not os.path.isdir(src):
            if self.check:
                # Nothing was pushed or copied in check mode (bundle, rsync push): say what would happen.
                self.changed, self.staged, self.verification = True, True, "copy"
                self.files, self.bytes_total = 0, 0
                self.warnings.append(f"{self.label}: the source {src} is not there yet; in a real run it must be "
                                     "(check mode does not copy the bundle or push files)")
                return f"{self.label}: would stage from {src} into {self.dest}"
            raise StageError(f"{self.label}: the source {src} does not exist (is the bundle, mount or push there?)")
        in_place = self.in_place = os.path.realpath(src) == os.path.realpath(self.partial)
        sums_text, sums = self.read_sums(src)
        plan, problems = self.plan(sums, in_place)
        if problems:
            raise StageError(self.problem_message("the source", problems), problems)
        self.files = len(plan)
        self.bytes_total = sum(item[3] for item in plan)
        self.staged = True
        self.verification = "copy"
        if self.check:
            self.changed = True
            return self.describe_plan(plan, would=True)
        self.changed = True
        self.makedirs(self.partial)
        self.own(self.partial, DIR_MODE)
        self.check_space(plan)
        already = sum(item[3] for item in plan if item[1] == "skip")
        self.progress.begin("copy" if not in_place else "hash", self.bytes_total, len(plan), already,
                            sum(1 for item in plan if item[1] == "skip"))
        for _path, action, _offset, size in plan:
            if action == "skip":
                self.count(bytes_skipped=size, files_skipped=1)
        work = [item for item in plan if item[1] != "skip"]
        # Largest first, so the parallel workers finish together.
        work.sort(key=lambda item: (-item[3], item[0]))
        results: dict[str, Problem | None] = {}
        if work:
            with ThreadPoolExecutor(max_workers=min(self.workers, len(work))) as pool:
                for path, outcome in zip([w[0] for w in work], pool.map(lambda item: self.place(item, sums), work)):
                    results[path] = outcome
        for path in sorted(results):
            problem = results[path]
            if problem is not None:
                problems.append(problem)
        if problems:
            raise StageError(self.problem_message("the copy", problems), problems)
        self.finish_partial(sums_text, sums, plan)
        return self.describe_plan(plan, would=False)

    def check_space(self, plan: list[Item]) -> None:
        """Refuse to start a copy that cannot fit (preflight checks the whole plan; this is the last word)."""
        need = sum(size - offset for _path, action, offset, size in plan if action in ("copy", "resume"))
        fs = os.statvfs(self.partial)
        free = fs.f_bavail * fs.f_frsize
        if need > free:
            raise StageError(f"{self.label}: {human_bytes(need)} more are needed in {self.parent}, "
                             f"but only {human_bytes(free)} are free there; free space (older revisions, "
                             "stale .partial-* directories) and run again")

    def place(self, item: Item, sums: dict[str, str]) -> Problem | None:
        """Copy, resume or hash one file into the partial directory; a problem dict or None."""
        path, action, offset, _size = item
        src = os.path.join(self.source(), path)
        dst = os.path.join(self.partial, path)
        self.progress.file_started(path)
        try:
            self.makedirs(os.path.dirname(dst))
            if action in ("rehash", "hash"):
                digest, done = hash_file(dst, self.progress.add)
                self.count(bytes_hashed=done, files_hashed=1)
                if action == "rehash" and digest.hexdigest() != sums[path] and not self.in_place:
                    # Journaled before a reboot, but the data did not survive it: copy it again.
                    self.progress.add(-done)
                    digest = self.copy(src, dst, 0)
                    self.count(files_copied=1)
                elif action == "rehash":
                    self.count(bytes_skipped=done, files_skipped=1)
            else:
                digest = self.copy(src, dst, offset)
                if action == "resume":
                    self.count(files_resumed=1)
                else:
                    self.count(files_copied=1)
            found = digest.hexdigest()
            st = os.lstat(dst)
            if found != sums[path]:
                # Deleted and left out of the journal: a re-run copies (or rsync pushes) it again.
                os.unlink(dst)
                self.journal({"path": path, "drop": True})
                return {"path": path, "problem": "sha256 mismatch", "expected": sums[path], "found": found}
            self.own(dst, FILE_MODE, st)
            st = os.lstat(dst)
            self.journal({"path": path, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino,
                          "sha256": found, "boot_id": self.boot})
            return None
        finally:
            self.progress.file_done(path)

    def copy(self, src: str, dst: str, offset: int) -> _Hash:
        """Copy ``src`` to ``dst`` from ``offset`` (the prefix already there is hashed), hashing every byte."""
        digest = hashlib.sha256()
        if offset:
            digest, done = hash_file(dst, self.progress.add, limit=offset)
            if done != offset:
                raise StageError(f"{self.label}: {dst} shrank while it was read")
            self.count(bytes_resumed=offset, bytes_hashed=offset)
        chunk = BUFFER
        if self.progress.limit:
            chunk = max(64 * 1024, min(BUFFER, self.progress.limit // 8))
        flags = os.O_WRONLY | os.O_CREAT | (0 if offset else os.O_TRUNC)
        out = os.open(dst, flags, FILE_MODE)
        try:
            if offset:
                os.ftruncate(out, offset)
                os.lseek(out, offset, os.SEEK_SET)
            with open(src, "rb", buffering=0) as reader:
                advise_sequential(reader.fileno())
                reader.seek(offset)

                def copied(count: int) -> None:
                    self.count(bytes_copied=count)
                    self.progress.add(count)

                pump(reader, digest, lambda data: os.write(out, data), copied, size=chunk)
                src_st = os.fstat(reader.fileno())
        finally:
            os.close(out)
        # Keep the source's mtime (like rsync -a); the journal records the result.
        os.utime(dst, ns=(src_st.st_atime_ns, src_st.st_mtime_ns))
        return digest

    def finish_partial(self, sums_text: str, sums: dict[str, str], plan: list[Item]) -> None:
        """Remove strays, flush everything to disk, write SHA256SUMS and the stamp, rename into place."""
        for path in self.extra_files(self.partial, set(sums) | {SUMS}):
            os.unlink(os.path.join(self.partial, path))
        for dirpath, dirnames, _files in os.walk(self.partial, topdown=False):
            for name in dirnames:
                full = os.path.join(dirpath, name)
                if not os.listdir(full):
                    os.rmdir(full)
        sums_path = os.path.join(self.partial, SUMS)
        if os.path.realpath(self.source()) != os.path.realpath(self.partial):
            with open(sums_path, "w", encoding="utf-8") as handle:
                handle.write(sums_text)
        self.own(sums_path, FILE_MODE)
        for directory in self.dirs_of(self.partial, sums):
            self.own(directory, DIR_MODE)
        # Durable before it is called verified: flush every file (in parallel), then the directories.
        self.progress.begin("sync", self.bytes_total, len(sums), self.bytes_total, len(sums))
        paths = [os.path.join(self.partial, p) for p in sorted(sums)] + [sums_path]

        def flush(path: str) -> None:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            list(pool.map(flush, paths))
        for directory in self.dirs_of(self.partial, sums):
            fsync_dir(directory)
        files: dict[str, dict[str, Any]] = {}
        for path in sorted(sums):
            st = os.lstat(os.path.join(self.partial, path))
            files[path] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino, "sha256": sums[path]}
        now = time.time()
        stamp = {
            "format": STAMP_FORMAT,
            "label": self.label,
            "revision": self.revision,
            "sums_sha256": sums_digest(sums_text),
            "verified_at": now,
            "verified_at_iso": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
            "current_since": None,
            "bytes": sum(f["size"] for f in files.values()),
            "files": files,
        }
        write_json_atomic(os.path.join(self.partial, STAMP), stamp, self.uid, self.gid)
        try:
            os.unlink(os.path.join(self.partial, JOURNAL))
        except FileNotFoundError:
            pass
        fsync_dir(self.partial)
        os.rename(self.partial, self.dest)
        fsync_dir(self.parent)

    def describe_plan(self, plan: list[Item], would: bool) -> str:
        groups: dict[str, tuple[int, int]] = {}
        for _path, action, offset, size in plan:
            count, nbytes = groups.get(action, (0, 0))
            groups[action] = (count + 1, nbytes + (size - offset if action == "resume" else size))
        names = {"copy": "copy", "resume": "resume", "skip": "keep (done earlier)", "rehash": "re-hash (from an earlier boot)",
                 "hash": "hash in place"}
        parts = ["%s %d file(s) (%s)" % (names[a], groups[a][0], human_bytes(groups[a][1]))
                 for a in ("copy", "resume", "skip", "rehash", "hash") if a in groups]
        if would:
            return "{}: would stage into {}: {}; then verify against {}, rename to {}".format(
                self.label, self.partial, ", ".join(parts), SUMS, self.dest)
        return "%s: staged and verified %d files (%s): %s" % (
            self.label, self.files, human_bytes(self.bytes_total), ", ".join(parts))

    def hash_many(self, items: list[tuple[str, str]]) -> dict[str, tuple[str, int]]:
        """``{path: (sha256 hex, size)}`` for ``[(path, full path)]``, hashed in parallel."""
        def one(item: tuple[str, str]) -> tuple[str, tuple[str, int]]:
            path, full = item
            self.progress.file_started(path)
            try:
                digest, size = hash_file(full, self.progress.add)
            finally:
                self.progress.file_done(path)
            self.count(bytes_hashed=size, files_hashed=1)
            return path, (digest.hexdigest(), size)

        items = sorted(items, key=lambda item: -os.path.getsize(item[1]))
        with ThreadPoolExecutor(max_workers=min(self.workers, max(1, len(items)))) as pool:
            return dict(pool.map(one, items))
