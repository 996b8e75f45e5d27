"""Verification of a labctl offline bundle: ``labctl bundle verify`` on the control node, the
labctl_bundle_verify module on the targets (``labctl.module_utils``: standard library only).

A bundle is a directory with ``manifest.json`` (listing every other file with
its size and sha256), ``manifest.json.sig`` (a binary detached OpenPGP
signature of the manifest) and ``keys/bundle.gpg`` (the signing public key).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

from .sums import safe_relpath, sha256_file

MANIFEST = "manifest.json"
SIGNATURE = "manifest.json.sig"
KEYRING = "keys/bundle.gpg"
SIGNATURE_ARTEFACTS = ("apt/InRelease", "apt/Release.gpg")
FORMAT_VERSION = 1

# Problem kinds. "target" is reserved for callers that compare the manifest's
# target with the host (the Ansible module does).
KINDS = ("missing", "extra", "modified", "size", "signature", "fingerprint", "manifest", "target")


@dataclass
class Problem:
    kind: str
    path: str
    detail: str = ""

    def message(self) -> str:
        text = f"{self.kind}: {self.path}"
        if self.detail:
            text += f" ({self.detail})"
        return text

    def as_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "path": self.path, "detail": self.detail}


@dataclass
class Report:
    root: str
    problems: list[Problem] = field(default_factory=list)
    manifest: dict[str, Any] | None = None
    fingerprint: str | None = None
    files_checked: int = 0
    bytes_checked: int = 0
    # Files whose content was hashed in this run (the others matched the stamp of an earlier good run).
    files_hashed: int = 0
    # path -> [sha256, size, mtime_ns, ctime_ns, inode, device] of every listed file that verified.
    verified: dict[str, list[Any]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems and self.manifest is not None and self.fingerprint is not None

    def as_dict(self) -> dict[str, Any]:
        manifest = self.manifest or {}
        return {
            "root": self.root,
            "ok": self.ok,
            "problems": [p.as_dict() for p in self.problems],
            "fingerprint": self.fingerprint,
            "profile": manifest.get("profile"),
            "content_digest": manifest.get("content_digest"),
            "files_checked": self.files_checked,
            "bytes_checked": self.bytes_checked,
            "files_hashed": self.files_hashed,
        }


def content_digest(files: Iterable[dict[str, Any]]) -> str:
    """sha256 over the sorted ``path sha256 size`` lines, signature artefacts excluded."""
    lines = sorted(
        "%s %s %d\n" % (f["path"], f["sha256"], int(f["size"]))
        for f in files
        if f["path"] not in SIGNATURE_ARTEFACTS
    )
    return hashlib.sha256("".join(lines).encode("utf-8")).hexdigest()


def normalize_fingerprint(value: str) -> str:
    return "".join(value.split()).upper()


def check_signature(root: str, gpgv: str = "gpgv") -> tuple[str | None, str | None]:
    """Verify manifest.json.sig with keys/bundle.gpg.

    Returns ``(fingerprint, None)`` on success and ``(None, reason)`` otherwise.
    The fingerprint is the primary key's, uppercase hex.
    """
    keyring = os.path.abspath(os.path.join(root, KEYRING))
    sig = os.path.join(root, SIGNATURE)
    manifest = os.path.join(root, MANIFEST)
    failure = f"does not verify {MANIFEST} with {KEYRING}"
    for needed in (sig, keyring):
        if not os.path.isfile(needed):
            return None, f"{failure}: {os.path.relpath(needed, root)} is missing"
    try:
        proc = subprocess.run(
            [gpgv, "--status-fd", "1", "--keyring", keyring, sig, manifest],
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError as exc:
        return None, f"{failure}: cannot run {gpgv}: {exc.strerror}"
    fingerprint = None
    statuses = []
    for line in proc.stdout.splitlines():
        fields = line.split()
        if len(fields) < 2 or fields[0] != "[GNUPG:]":
            continue
        if fields[1] == "VALIDSIG" and len(fields) >= 3:
            # VALIDSIG <fpr> <date> <ts> <expire> <ver> <rsvd> <pkalgo> <hashalgo> <class> <primary-fpr>
            fingerprint = fields[11] if len(fields) >= 12 else fields[2]
        elif fields[1] in ("BADSIG", "ERRSIG", "NO_PUBKEY", "NODATA", "EXPKEYSIG", "REVKEYSIG"):
            statuses.append(fields[1])
    if proc.returncode != 0 or fingerprint is None:
        if statuses:
            return None, "{}: {}".format(failure, ", ".join(sorted(set(statuses))))
        return None, failure
    return normalize_fingerprint(fingerprint), None


def _listed_files(manifest: dict[str, Any], problems: list[Problem]) -> list[dict[str, Any]]:
    files = manifest.get("files")
    if not isinstance(files, list):
        problems.append(Problem("manifest", MANIFEST, "'files' is not a list"))
        return []
    good: list[dict[str, Any]] = []
    seen = set()
    for entry in files:
        if not isinstance(entry, dict):
            problems.append(Problem("manifest", MANIFEST, "file entry is not an object"))
            continue
        raw_path = entry.get("path")
        size = entry.get("size")
        digest = entry.get("sha256")
        if not isinstance(raw_path, str) or not safe_relpath(raw_path) or raw_path in (MANIFEST, SIGNATURE):
            problems.append(Problem("manifest", str(raw_path), "unsafe or reserved path in manifest"))
            continue
        path = raw_path
        if path in seen:
            problems.append(Problem("manifest", path, "listed twice"))
            continue
        if not isinstance(size, int) or isinstance(size, bool) or size < 0 or not isinstance(digest, str) or len(digest) != 64:
            problems.append(Problem("manifest", path, "entry needs an integer size and a sha256"))
            continue
        seen.add(path)
        good.append(entry)
    return good


def _stat_key(full: str) -> list[int]:
    """What changes whenever a file's content is written through the file system: size and mtime, and
    ctime and inode, which no user-level tool can set back (touch -r restores mtime, not ctime)."""
    st = os.stat(full)
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def _check_file(
    root: str, entry: dict[str, Any], known: dict[str, list[Any]]
) -> tuple[Problem | None, int, list[Any] | None, bool]:
    """(problem, size, the file's [sha256, *stat key] when it verified, whether it was hashed)."""
    path = entry["path"]
    full = os.path.join(root, *path.split("/"))
    try:
        if os.path.islink(full) or not os.path.isfile(full):
            if os.path.lexists(full):
                return Problem("modified", path, "not a regular file"), 0, None, False
            return Problem("missing", path, ""), 0, None, False
        key = _stat_key(full)
        size = key[0]
        if size != entry["size"]:
            return Problem("size", path, "expected %d bytes, found %d" % (entry["size"], size)), 0, None, False
        expected = entry["sha256"].lower()
        if known.get(path) == [expected] + key:
            return None, size, [expected] + key, False
        found = sha256_file(full)
    except OSError as exc:
        return Problem("missing", path, f"unreadable: {exc.strerror}"), 0, None, False
    if found != expected:
        return Problem("modified", path, "sha256 expected {}, found {}".format(entry["sha256"], found)), size, None, True
    return None, size, [expected] + key, True


def stamp_file(stamp_dir: str, digest: str) -> str:
    return os.path.join(stamp_dir, f"bundle-{digest}.json")


def read_stamp(stamp_dir: str, digest: Any, fingerprint: str | None) -> dict[str, list[Any]]:
    """The files of an earlier good verification of the bundle with this content digest and signing key
    (see write_stamp); empty when there is none or it does not parse."""
    if not isinstance(digest, str) or len(digest) != 64 or not fingerprint:
        return {}
    try:
        with open(stamp_file(stamp_dir, digest), "rb") as handle:
            data = json.loads(handle.read().decode("utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("content_digest") != digest or data.get("fingerprint") != fingerprint:
        return {}
    files = data.get("files")
    return files if isinstance(files, dict) else {}


def write_stamp(stamp_dir: str, report: Report) -> str:
    """Record a good verification: for each file, its sha256 with its size, mtime, ctime, inode and
    device. A later verify_bundle(stamp_dir=...) hashes only the files whose record no longer matches.
    Written atomically, 0600 in a 0700 directory. Returns the file written."""
    if not report.ok or report.manifest is None:
        raise ValueError("only a bundle that verified gets a stamp")
    digest = str(report.manifest.get("content_digest"))
    os.makedirs(stamp_dir, mode=0o700, exist_ok=True)
    final = stamp_file(stamp_dir, digest)
    tmp = "%s.%d.tmp" % (final, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump({"content_digest": digest, "fingerprint": report.fingerprint, "root": report.root,
                   "files": report.verified}, handle, sort_keys=True)
    os.replace(tmp, final)
    return final


def _present_files(root: str) -> list[str]:
    present = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        rel_dir = os.path.relpath(dirpath, root)
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            rel = name if rel_dir == "." else "/".join(rel_dir.split(os.sep) + [name])
            present.append(rel)
    return present


def verify_bundle(
    root: str,
    trusted_fingerprint: str | None = None,
    check_extra: bool = True,
    workers: int = 4,
    on_file: Callable[[str, int], None] | None = None,
    gpgv: str = "gpgv",
    stamp_dir: str | None = None,
) -> Report:
    """Check a bundle's signature, fingerprint and every file.

    ``on_file(path, size)`` is called once per listed file after it was checked
    (from the calling thread). The report is ok only when there is no problem
    and the manifest signature verified.

    With ``stamp_dir``, a file whose sha256, size, mtime, ctime, inode and device
    are those a good earlier run recorded there (write_stamp) for the same
    content digest and signing key is not hashed again. The signature, the
    manifest, sizes, missing and extra files are checked every time.
    """
    report = Report(root=root)
    manifest_path = os.path.join(root, MANIFEST)
    try:
        with open(manifest_path, "rb") as handle:
            manifest = json.loads(handle.read().decode("utf-8"))
    except (OSError, ValueError) as exc:
        if not os.path.exists(manifest_path):
            report.problems.append(Problem("missing", MANIFEST, ""))
        else:
            report.problems.append(Problem("manifest", MANIFEST, f"unreadable: {exc}"))
        return report
    if not isinstance(manifest, dict):
        report.problems.append(Problem("manifest", MANIFEST, "not a JSON object"))
        return report
    report.manifest = manifest
    if manifest.get("format_version") != FORMAT_VERSION:
        report.problems.append(
            Problem("manifest", MANIFEST, "format_version %r, expected %d" % (manifest.get("format_version"), FORMAT_VERSION))
        )

    fingerprint, reason = check_signature(root, gpgv=gpgv)
    if fingerprint is None:
        report.problems.append(Problem("signature", SIGNATURE, reason or ""))
    else:
        report.fingerprint = fingerprint
        declared = (manifest.get("signing_key") or {}).get("fingerprint")
        if not isinstance(declared, str) or normalize_fingerprint(declared) != fingerprint:
            report.problems.append(
                Problem("fingerprint", SIGNATURE, f"signed by {fingerprint}, manifest declares {declared}")
            )
        if trusted_fingerprint and normalize_fingerprint(trusted_fingerprint) != fingerprint:
            report.problems.append(
                Problem(
                    "fingerprint",
                    SIGNATURE,
                    f"signed by {fingerprint}, expected {normalize_fingerprint(trusted_fingerprint)}",
                )
            )

    files = _listed_files(manifest, report.problems)
    expected_digest = manifest.get("content_digest")
    if expected_digest != content_digest(files):
        report.problems.append(
            Problem("manifest", MANIFEST, f"content_digest {expected_digest} does not match the listed files")
        )

    known = read_stamp(stamp_dir, expected_digest, report.fingerprint) if stamp_dir else {}
    file_problems: list[Problem] = []
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for entry, (problem, size, record, hashed) in zip(files, pool.map(lambda e: _check_file(root, e, known), files)):
            report.files_checked += 1
            report.bytes_checked += size
            report.files_hashed += int(hashed)
            if record is not None:
                report.verified[entry["path"]] = record
            if problem is not None:
                file_problems.append(problem)
            if on_file is not None:
                on_file(entry["path"], int(entry["size"]))

    if check_extra:
        listed = {entry["path"] for entry in files} | {MANIFEST, SIGNATURE}
        for path in _present_files(root):
            if path not in listed:
                file_problems.append(Problem("extra", path, f"not listed in {MANIFEST}"))
    report.problems.extend(sorted(file_problems, key=lambda p: (p.path, p.kind)))
    return report
