"""A flat, signed apt repository written deterministically (no dpkg-scanpackages).

Layout under ``apt/``: ``pool/*.deb``, ``Packages``, ``Packages.gz``, ``Release``,
``InRelease`` and ``Release.gpg``. Targets use it with deb822 ``Suites: ./``.
"""

from __future__ import annotations

import gzip
import io
import subprocess
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from labctl.bundle.errors import BuildError
from labctl.bundle.fileops import Hashes, hash_bytes
from labctl.bundle.gpg import SigningKey

_GENERATED = {"filename", "size", "md5sum", "sha1", "sha256"}
_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


@dataclass(frozen=True)
class Deb:
    """A .deb in the pool with its control stanza."""

    file: str  # name inside pool/
    hashes: Hashes
    control: str  # the control paragraph without the generated fields, ends with "\n"
    name: str
    version: str
    arch: str


def read_control(path: Path) -> tuple[str, dict[str, str]]:
    """The control paragraph of a .deb (``dpkg-deb -f``) and its simple fields."""
    try:
        proc = subprocess.run(["dpkg-deb", "-f", str(path)], capture_output=True, check=False)
    except OSError as exc:
        raise BuildError(f"cannot run dpkg-deb: {exc.strerror}") from exc
    if proc.returncode != 0:
        reason = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        raise BuildError(f"{path}: not a valid .deb ({reason[-1] if reason else 'dpkg-deb failed'})")
    text = proc.stdout.decode("utf-8", "replace")
    kept: list[str] = []
    fields: dict[str, str] = {}
    skipping = False
    for line in text.splitlines():
        if not line.strip():
            continue
        if line[0] in " \t":
            if not skipping:
                kept.append(line)
            continue
        key, _, value = line.partition(":")
        skipping = key.strip().lower() in _GENERATED
        if not skipping:
            fields[key.strip()] = value.strip()
            kept.append(line)
    for needed in ("Package", "Version", "Architecture"):
        if needed not in fields:
            raise BuildError(f"{path}: control field {needed} missing")
    package_first = [line for line in kept if line.startswith("Package:")]
    rest = [line for line in kept if not line.startswith("Package:")]
    return "\n".join(package_first + rest) + "\n", fields


def load_debs(pool: Path, hashes: dict[str, Hashes]) -> list[Deb]:
    """Read the control data of every pool file named in ``hashes``."""
    names = sorted(hashes)

    def one(name: str) -> Deb:
        control, fields = read_control(pool / name)
        return Deb(
            file=name,
            hashes=hashes[name],
            control=control,
            name=fields["Package"],
            version=fields["Version"],
            arch=fields["Architecture"],
        )

    with ThreadPoolExecutor(max_workers=4) as executor:
        return list(executor.map(one, names))


def packages_text(debs: Iterable[Deb]) -> str:
    stanzas = []
    for deb in sorted(debs, key=lambda d: d.file):
        stanzas.append(
            deb.control
            + f"Filename: pool/{deb.file}\n"
            + f"Size: {deb.hashes.size}\n"
            + f"MD5sum: {deb.hashes.md5}\n"
            + f"SHA1: {deb.hashes.sha1}\n"
            + f"SHA256: {deb.hashes.sha256}\n"
        )
    return "\n".join(stanzas)


def gzip_deterministic(data: bytes) -> bytes:
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0, compresslevel=9) as handle:
        handle.write(data)
    return buffer.getvalue()


def rfc2822(epoch: int) -> str:
    """``Sat, 29 Nov 2025 10:00:00 UTC`` independent of the locale."""
    t = time.gmtime(epoch)
    return (
        f"{_DAYS[t.tm_wday]}, {t.tm_mday:02d} {_MONTHS[t.tm_mon - 1]} {t.tm_year} "
        f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} UTC"
    )


def release_text(profile: str, arch: str, date_epoch: int, indices: dict[str, Hashes]) -> str:
    lines = [
        "Origin: labctl",
        f"Label: labctl-{profile}",
        f"Suite: labctl-{profile}",
        f"Codename: labctl-{profile}",
        f"Date: {rfc2822(date_epoch)}",
        f"Architectures: {arch} all" if arch != "all" else "Architectures: all",
        f"Description: labctl offline bundle for profile {profile}",
    ]
    for title, attr in (("MD5Sum", "md5"), ("SHA1", "sha1"), ("SHA256", "sha256")):
        lines.append(f"{title}:")
        for name in sorted(indices):
            lines.append(f" {getattr(indices[name], attr)} {indices[name].size:>16} {name}")
    return "\n".join(lines) + "\n"


def write_repo(apt_dir: Path, debs: list[Deb], profile: str, arch: str, date_epoch: int, key: SigningKey) -> None:
    """Write Packages, Packages.gz, Release and sign it (InRelease, Release.gpg)."""
    packages = packages_text(debs).encode("utf-8")
    packages_gz = gzip_deterministic(packages)
    (apt_dir / "Packages").write_bytes(packages)
    (apt_dir / "Packages.gz").write_bytes(packages_gz)
    indices = {"Packages": hash_bytes(packages), "Packages.gz": hash_bytes(packages_gz)}
    release = apt_dir / "Release"
    release.write_text(release_text(profile, arch, date_epoch, indices), encoding="utf-8")
    key.clearsign(release, apt_dir / "InRelease")
    key.detach_sign(release, apt_dir / "Release.gpg", armor=True)
