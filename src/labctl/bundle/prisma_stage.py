"""The ``prisma`` component: Prisma's CLI and native engines for LiteLLM's database mode, into prisma/.

LiteLLM's database mode runs prisma-client-py (``prisma==0.15.0``), which at run time installs
the npm CLI ``prisma@5.17.0`` into its binary cache dir and lets that CLI download the native
engines of one engines commit from ``binaries.prisma.sh``. Neither works offline, so the bundle
carries both:

- ``prisma/cli/prisma-<cli_version>.tar.gz``: the tree ``npm install prisma@<cli_version>``
  leaves in prisma-client-py's binary cache dir (``package.json``, ``node_modules/prisma``,
  ``node_modules/@prisma/*``, ``node_modules/.bin/prisma``), installed with ``--ignore-scripts``
  so no engine download is attempted. Unpacked into ``$PRISMA_BINARY_CACHE_DIR`` it is what
  ``prisma.cli.prisma.ensure_cached()`` looks for (``node_modules/prisma/build/index.js``).
- ``prisma/engines/<commit>/<platform>/{query-engine,schema-engine,libquery_engine.so.node}``:
  the engines, fetched as Prisma's fetch-engine does (``<mirror>/all_commits/<commit>/<platform>/
  <file>.gz``, ``<file>.gz.sha256`` = sha256 of the .gz, ``<file>.sha256`` = sha256 of the
  decompressed file; both checked) and stored decompressed.

The target-side contract (paths, PRISMA_* variables, commands) is docs/prisma-offline.md.
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from labctl.bundle.errors import BuildError
from labctl.bundle.staging import Staging
from labctl.module_utils.sums import pump, sha256_file
from labctl.paths import private_dir
from labctl.profile import PRISMA_MIRROR, LoadedProfile, Prisma

PRISMA = "prisma"
NO_SECTION = "profile has no prisma section"
CLI_ENTRYPOINT = "node_modules/prisma/build/index.js"

# prisma-client-py 0.15.0 src/prisma/cli/prisma.py DEFAULT_PACKAGE_JSON: the package.json it
# writes into its binary cache dir before `npm install prisma@<version>` there.
CACHE_PACKAGE_JSON: dict[str, Any] = {
    "name": "prisma-binaries",
    "version": "1.0.0",
    "private": True,
    "description": "Cache directory created by Prisma Client Python to store Prisma Engines",
    "main": "node_modules/prisma/build/index.js",
    "author": "RobertCraigie",
    "license": "Apache-2.0",
}

_TIMEOUT_S = 60
_CHUNK = 1024 * 1024
_SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")


@dataclass(frozen=True)
class Engine:
    """One engine file (prisma/prisma 5.17.0 packages/fetch-engine/src/BinaryType.ts)."""

    kind: str  # Prisma's BinaryType
    url_name: str  # its name on the mirror, without .gz (getDownloadUrl)
    env: str  # the variable Prisma takes its path from (fetch-engine/src/env.ts)

    def installed_name(self, platform: str) -> str:
        """Its name in node_modules/@prisma/engines (fetch-engine getBinaryName, Linux)."""
        if self.kind == "libquery-engine":
            return f"libquery_engine-{platform}.so.node"
        return f"{self.kind}-{platform}"


ENGINES = (
    Engine("query-engine", "query-engine", "PRISMA_QUERY_ENGINE_BINARY"),
    Engine("schema-engine", "schema-engine", "PRISMA_SCHEMA_ENGINE_BINARY"),
    Engine("libquery-engine", "libquery_engine.so.node", "PRISMA_QUERY_ENGINE_LIBRARY"),
)


class Unavailable(Exception):
    """Something could not be fetched (network, HTTP status, missing file, no npm): maybe optional."""

    def __init__(self, location: str, reason: object) -> None:
        super().__init__(f"cannot fetch {location}: {reason}")
        self.location = location


def engine_path(commit: str, platform: str, engine: Engine) -> str:
    """``all_commits/<commit>/<platform>/<file>.gz`` below a mirror (fetch-engine getDownloadUrl)."""
    return f"all_commits/{commit}/{platform}/{engine.url_name}.gz"


def cli_archive(version: str) -> str:
    return f"{PRISMA}/cli/prisma-{version}.tar.gz"


def engine_file(commit: str, platform: str, engine: Engine) -> str:
    return f"{PRISMA}/engines/{commit}/{platform}/{engine.url_name}"


@dataclass
class PrismaResult:
    spec: Prisma | None = None
    available: bool = False
    reason: str | None = NO_SECTION
    files: list[dict[str, Any]] = field(default_factory=list)

    def component(self) -> dict[str, Any]:
        spec = self.spec
        return {
            "available": self.available,
            "reason": self.reason,
            "cli_version": spec.cli_version if spec else None,
            "engine_commit": spec.engine_commit if spec else None,
            "platforms": list(spec.platforms) if spec else [],
            "mirror": spec.mirror if spec else None,
            "files": self.files,
        }


# --- fetching -------------------------------------------------------------------------------------


def _open(location: str) -> IO[bytes]:
    """A URL (http, https, file) or a local path, opened for reading; Unavailable when it cannot be."""
    try:
        if "://" in location:
            response: IO[bytes] = urllib.request.urlopen(location, timeout=_TIMEOUT_S)
            return response
        return open(location, "rb")
    except urllib.error.HTTPError as exc:
        raise Unavailable(location, f"HTTP {exc.code} {exc.reason}") from exc
    except urllib.error.URLError as exc:
        raise Unavailable(location, exc.reason) from exc
    except (OSError, ValueError) as exc:
        raise Unavailable(location, getattr(exc, "strerror", None) or exc) from exc


def _read(reader: IO[bytes], location: str, size: int = _CHUNK) -> bytes:
    try:
        return reader.read(size)
    except (OSError, http.client.HTTPException) as exc:  # a connection dropped mid-way
        raise Unavailable(location, exc) from exc


class _Download:
    """``reader`` as ``pump`` reads it: a connection dropped mid-way is Unavailable (``_read``)."""

    def __init__(self, reader: IO[bytes], location: str) -> None:
        self.reader = reader
        self.location = location

    def readinto(self, buffer: memoryview, /) -> int:
        chunk = _read(self.reader, self.location, len(buffer))
        buffer[: len(chunk)] = chunk
        return len(chunk)


def _checksum(location: str) -> str:
    """The hash of a ``.sha256`` file: ``<hex>  <name>`` (fetch-engine downloadZip fetchChecksum)."""
    with _open(location) as reader:
        body = _read(reader, location, 4096).decode("utf-8", "replace")
    words = body.split()
    if not words or not _SHA256.match(words[0]):
        raise BuildError(f"prisma: {location} is not a sha256 checksum file (starts {body[:60]!r})")
    return words[0].lower()


def _tmp(directory: Path) -> Path:
    handle, name = tempfile.mkstemp(dir=directory, prefix=".part-")
    os.close(handle)
    return Path(name)


@dataclass(frozen=True)
class _Fetched:
    path: Path  # the decompressed engine in the cache
    sha256: str
    gz_sha256: str


def _download_engine(location: str, gz_expected: str, expected: str, final: Path, pinned_in: str | None = None) -> None:
    """``location`` (.gz) -> ``final`` (decompressed, 0755), both checksums checked (``pinned_in``:
    the lock file they come from; None: the mirror's .sha256 files)."""
    gz_said = f"{pinned_in} pins" if pinned_in else f"{location}.sha256 says"
    said = f"{pinned_in} pins" if pinned_in else f"{location.removesuffix('.gz')}.sha256 says"
    gz_tmp, out_tmp = _tmp(final.parent), _tmp(final.parent)
    try:
        gz_digest = hashlib.sha256()
        with _open(location) as reader, gz_tmp.open("wb") as writer:
            pump(_Download(reader, location), gz_digest, writer.write, size=_CHUNK)
        if gz_digest.hexdigest() != gz_expected:
            raise BuildError(
                f"prisma: {location} has sha256 {gz_digest.hexdigest()}, but {gz_said} {gz_expected}; refusing it"
            )
        digest = hashlib.sha256()
        try:
            with gzip.open(gz_tmp, "rb") as reader, out_tmp.open("wb") as writer:
                pump(reader, digest, writer.write, size=_CHUNK)
        except (OSError, EOFError) as exc:
            raise BuildError(f"prisma: {location}: not a valid gzip file: {exc}") from exc
        if digest.hexdigest() != expected:
            raise BuildError(
                f"prisma: {location} decompressed has sha256 {digest.hexdigest()}, but {said} {expected}; refusing it"
            )
        out_tmp.chmod(0o755)
        os.replace(out_tmp, final)
    finally:
        gz_tmp.unlink(missing_ok=True)
        out_tmp.unlink(missing_ok=True)


Pins = dict[tuple[str, str], tuple[str, str]]  # (platform, url_name) -> (sha256, gz_sha256)


def _engine(base: str, cache: Path, commit: str, platform: str, engine: Engine,
            pins: Pins | None = None, pinned_in: str | None = None) -> _Fetched:
    """One engine, from the cache when its checksum still matches, else from the mirror. With
    ``pins`` the checksums are the lock's and the mirror's .sha256 files are not read."""
    directory = private_dir(cache / "engines" / commit / platform)
    final = directory / engine.url_name
    record, gz_record = directory / f"{engine.url_name}.sha256", directory / f"{engine.url_name}.gz.sha256"
    pinned = pins.get((platform, engine.url_name)) if pins is not None else None
    if final.is_file() and record.is_file() and gz_record.is_file():
        expected = record.read_text(encoding="utf-8").strip()
        gz_known = gz_record.read_text(encoding="utf-8").strip()
        if (pinned is None or pinned == (expected, gz_known)) and sha256_file(str(final)) == expected:
            return _Fetched(final, expected, gz_known)
    location = f"{base}/{engine_path(commit, platform, engine)}"
    if pinned is not None:
        expected, gz_expected = pinned
    else:
        gz_expected = _checksum(f"{location}.sha256")
        expected = _checksum(f"{location.removesuffix('.gz')}.sha256")
    _download_engine(location, gz_expected, expected, final, pinned_in)
    record.write_text(expected, encoding="utf-8")
    gz_record.write_text(gz_expected, encoding="utf-8")
    return _Fetched(final, expected, gz_expected)


def prisma_lock_path(profile: LoadedProfile) -> Path | None:
    return profile.resolve(profile.spec.locks) / profile.os / "prisma.json" if profile.spec.locks else None


def write_prisma_lock(profile: LoadedProfile) -> tuple[Path, int]:
    """``<locks>/<os>/prisma.json`` from the mirror's .sha256 files as they are now (`labctl bundle
    lock`): reviewed and committed, it is what later builds check the engines against."""
    spec = profile.spec.prisma
    path = prisma_lock_path(profile)
    assert spec is not None and path is not None
    engines: dict[str, dict[str, dict[str, str]]] = {}
    try:
        base = _base(spec, profile)
        for platform in spec.platforms:
            for engine in ENGINES:
                location = f"{base}/{engine_path(spec.engine_commit, platform, engine)}"
                engines.setdefault(platform, {})[engine.url_name] = {
                    "sha256": _checksum(f"{location.removesuffix('.gz')}.sha256"),
                    "gz_sha256": _checksum(f"{location}.sha256"),
                }
    except Unavailable as exc:
        raise BuildError(f"prisma: {exc}: lock where prisma.mirror ({spec.mirror}) is reachable") from exc
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"engine_commit": spec.engine_commit, "mirror": spec.mirror, "engines": engines}
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path, sum(len(files) for files in engines.values())


def read_prisma_lock(profile: LoadedProfile) -> Pins:
    spec = profile.spec.prisma
    path = prisma_lock_path(profile)
    assert spec is not None and path is not None
    fix = f"run `labctl bundle lock --profile {profile.name} --os {profile.os}` where {spec.mirror} is reachable, review and commit it"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BuildError(f"prisma: no engine lock {path}: {fix}") from None
    except (OSError, ValueError) as exc:
        raise BuildError(f"prisma: {path}: {exc}") from exc
    if not isinstance(data, dict) or data.get("engine_commit") != spec.engine_commit:
        raise BuildError(f"prisma: {path} pins engines commit {data.get('engine_commit') if isinstance(data, dict) else None}, "
                         f"the profile asks for {spec.engine_commit}: {fix}")
    pins: Pins = {}
    for platform in spec.platforms:
        for engine in ENGINES:
            entry = (data.get("engines") or {}).get(platform, {}).get(engine.url_name) or {}
            sha, gz = entry.get("sha256", ""), entry.get("gz_sha256", "")
            if not (_SHA256.match(str(sha)) and _SHA256.match(str(gz))):
                raise BuildError(f"prisma: {path} pins no sha256 for {platform}/{engine.url_name}: {fix}")
            pins[(platform, engine.url_name)] = (str(sha).lower(), str(gz).lower())
    return pins


def _base(spec: Prisma, profile: LoadedProfile) -> str:
    if "://" in spec.mirror:
        return spec.mirror
    directory = profile.resolve(spec.mirror)
    if not directory.is_dir():
        raise Unavailable(str(directory), "not a directory (prisma.mirror)")
    return str(directory)


# --- the CLI --------------------------------------------------------------------------------------


def _package_field(read: Callable[[str], bytes | None], origin: str, name: str, *keys: str) -> object:
    raw = read(name)
    if raw is None:
        return None
    try:
        value: object = json.loads(raw)
    except ValueError as exc:
        raise BuildError(f"prisma: {origin}: {name} is not JSON: {exc}") from exc
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _check_cli(read: Callable[[str], bytes | None], spec: Prisma, origin: str) -> None:
    """The tree holds prisma@cli_version, its entrypoint, and expects the profile's engines commit."""
    if read(CLI_ENTRYPOINT) is None:
        raise BuildError(f"prisma: {origin} has no {CLI_ENTRYPOINT}")
    version = _package_field(read, origin, "node_modules/prisma/package.json", "version")
    if version != spec.cli_version:
        raise BuildError(f"prisma: {origin} holds prisma {version}, the profile asks for {spec.cli_version}")
    engines = _package_field(read, origin, "node_modules/@prisma/engines-version/package.json", "prisma", "enginesVersion")
    if engines != spec.engine_commit:
        raise BuildError(
            f"prisma: the prisma@{spec.cli_version} CLI expects engines {engines} (@prisma/engines-version), "
            f"but prisma.engine_commit is {spec.engine_commit}"
        )


def _npm_error(output: str, returncode: int) -> str:
    errors = [line.strip() for line in output.splitlines() if line.startswith(("npm error", "npm ERR!"))]
    errors = [line for line in errors if not line.endswith(("A complete log of this run can be found in:",))]
    return "; ".join(errors[:3]) or (output.strip().splitlines() or [f"exit {returncode}"])[-1]


def _npm_install(root: Path, version: str) -> None:
    """``npm install prisma@<version>`` into ``root`` (the user's npm configuration applies)."""
    what = f"npm install prisma@{version}"
    npm = shutil.which("npm")
    if npm is None:
        raise Unavailable(what, "npm is not on PATH (apt-get install npm)")
    cmd = [
        npm, "install", "--prefix", str(root), "--no-audit", "--no-fund", "--ignore-scripts", "--save-exact",
        f"prisma@{version}",
    ]
    env = dict(os.environ, npm_config_update_notifier="false")
    try:
        proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, check=False, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Unavailable(what, exc) from exc
    if proc.returncode != 0:
        raise Unavailable(what, _npm_error(proc.stdout + "\n" + proc.stderr, proc.returncode))


def _walk(root: Path) -> list[Path]:
    """Every path below ``root`` (symlinks not followed), sorted."""
    paths: list[Path] = []
    for directory, dirs, files in os.walk(root):
        base = Path(directory)
        paths += [base / name for name in dirs + files]
    return sorted(paths, key=lambda path: path.relative_to(root).as_posix())


def write_archive(root: Path, dest: Path) -> None:
    """A reproducible .tar.gz of ``root``: sorted, mtime 0, owner 0:0, modes 0755/0644, symlinks kept."""
    tmp = _tmp(dest.parent)
    try:
        with (tmp.open("wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as compressed,
              tarfile.open(fileobj=compressed, mode="w", format=tarfile.PAX_FORMAT) as archive):
            for path in _walk(root):
                info = archive.gettarinfo(str(path), arcname=path.relative_to(root).as_posix())
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mtime = 0
                if info.isdir():
                    info.mode = 0o755
                    archive.addfile(info)
                elif info.issym():
                    info.mode = 0o777
                    archive.addfile(info)
                elif info.isfile():
                    info.mode = 0o755 if info.mode & 0o111 else 0o644
                    with path.open("rb") as reader:
                        archive.addfile(info, reader)
                else:
                    raise BuildError(f"prisma: {path}: not a file, directory or symlink")
        tmp.chmod(0o644)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def _archive_reader(archive: tarfile.TarFile) -> Callable[[str], bytes | None]:
    def read(name: str) -> bytes | None:
        try:
            member = archive.extractfile(name)
        except KeyError:
            return None
        return member.read() if member is not None else None

    return read


def _cached_cli(path: Path, spec: Prisma) -> bool:
    """Whether a cached archive is whole and holds the CLI the profile asks for."""
    try:
        with tarfile.open(path, "r:gz") as archive:
            _check_cli(_archive_reader(archive), spec, str(path))
            for _ in archive:  # read to the end: a truncated archive raises here
                pass
    except (OSError, tarfile.TarError, EOFError, ValueError, BuildError):
        return False
    return True


def _cli(spec: Prisma, cache: Path) -> Path:
    directory = private_dir(cache / "cli")
    archive = directory / f"prisma-{spec.cli_version}.tar.gz"
    if archive.is_file() and _cached_cli(archive, spec):
        return archive
    with tempfile.TemporaryDirectory(dir=directory, prefix=".npm-") as tmp:
        root = Path(tmp) / "tree"
        root.mkdir()
        (root / "package.json").write_text(json.dumps(CACHE_PACKAGE_JSON), encoding="utf-8")
        _npm_install(root, spec.cli_version)

        def read(name: str) -> bytes | None:
            path = root / name
            return path.read_bytes() if path.is_file() else None

        _check_cli(read, spec, f"npm install prisma@{spec.cli_version}")
        write_archive(root, archive)
    return archive


# --- the component --------------------------------------------------------------------------------


def collect_prisma(profile: LoadedProfile, cache: Path, staging: Staging) -> PrismaResult:
    spec = profile.spec.prisma
    if spec is None:
        return PrismaResult()
    reporter = staging.reporter
    root = private_dir(cache / PRISMA)
    commit = spec.engine_commit
    fetched: list[tuple[str, Engine, _Fetched]] = []
    lock = prisma_lock_path(profile)
    if lock is not None and spec.optional and not lock.exists():
        # A locked profile fetches nothing unpinned: without an engine lock, optional Prisma stays out.
        reason = f"no engine lock {lock} (`labctl bundle lock --profile {profile.name}` where {spec.mirror} is reachable)"
        reporter.warn(f"prisma: {reason}; building without Prisma (prisma.optional: true): LiteLLM database mode will not work")
        return PrismaResult(spec=spec, reason=reason)
    pins = read_prisma_lock(profile) if lock is not None else None
    pinned_in = str(lock) if pins is not None else None
    try:
        base = _base(spec, profile)
        count = len(spec.platforms) * len(ENGINES)
        with reporter.task(f"prisma: engines {commit[:12]} for {', '.join(spec.platforms)}", count, unit="files") as advance:
            for platform in spec.platforms:
                for engine in ENGINES:
                    fetched.append((platform, engine, _engine(base, root, commit, platform, engine, pins, pinned_in)))
                    advance(1)
        with reporter.task(f"prisma: npm install prisma@{spec.cli_version}", None, unit="packages") as advance:
            cli = _cli(spec, root)
            advance(1)
    except Unavailable as exc:
        if not spec.optional:
            raise BuildError(f"prisma: {exc} (prisma.optional: true builds without Prisma)") from exc
        reporter.warn(f"prisma: {exc}; building without Prisma (prisma.optional: true): LiteLLM database mode will not work")
        return PrismaResult(spec=spec, reason=str(exc))
    items = [(cli, cli_archive(spec.cli_version))]
    items += [(found.path, engine_file(commit, platform, engine)) for platform, engine, found in fetched]
    added = staging.add_all(items, f"prisma: copy {len(items)} files")
    cli_hashes = added[cli_archive(spec.cli_version)]
    files: list[dict[str, Any]] = [
        {
            "kind": "cli",
            "file": cli_archive(spec.cli_version),
            "sha256": cli_hashes.sha256,
            "size": cli_hashes.size,
            "package": f"prisma@{spec.cli_version}",
            "entrypoint": CLI_ENTRYPOINT,
        }
    ]
    for platform, engine, found in fetched:
        rel = engine_file(commit, platform, engine)
        files.append(
            {
                "kind": engine.kind,
                "platform": platform,
                "file": rel,
                "sha256": added[rel].sha256,
                "size": added[rel].size,
                "gz_sha256": found.gz_sha256,
                "url": f"{PRISMA_MIRROR}/{engine_path(commit, platform, engine)}",
                "installed_name": engine.installed_name(platform),
                "env": engine.env,
            }
        )
    return PrismaResult(spec=spec, available=True, reason=None, files=files)
