"""Resolve the apt closure a pristine target lacks, with the host's apt-get fully isolated.

apt reads only a private ``Dir::Etc`` (a deb822 sources file generated from the
profile, empty apt.conf.d and preferences.d, no trusted.gpg), the base status
file of the pristine target as ``Dir::State::status`` and keeps its lists and
binary caches in the labctl cache. The host's own apt configuration, sources,
keys and dpkg state are never read.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from labctl.bundle.errors import BuildError

_INST = re.compile(r"^Inst (?P<name>\S+) (?:\[(?P<old>[^\]]*)\] )?\((?P<version>\S+) .*?\[(?P<arch>[^\]\s]+)\]\)")
_URI = re.compile(r"^'(?P<uri>[^']+)' (?P<file>\S+) (?P<size>\d+) (?:(?P<algo>[A-Za-z0-9]+):(?P<hash>[0-9a-fA-F]+))?")
_NOT_FOUND = re.compile(r"^E: (?:Unable to locate package |Package '?)(?P<name>[^ ']+)")
_UNMET = re.compile(r"^\s*(?P<name>\S+) : (?:Pre)?Depends: ")


@dataclass(frozen=True)
class Planned:
    """One ``Inst`` line of ``apt-get -s install``."""

    name: str
    version: str
    arch: str
    upgrade_from: str | None = None


@dataclass(frozen=True)
class Download:
    """One line of ``apt-get download --print-uris``."""

    uri: str
    file: str
    size: int
    sha256: str | None


@dataclass(frozen=True)
class SourceSpec:
    """An apt source as written into the private sources file."""

    name: str
    uris: tuple[str, ...]
    suites: tuple[str, ...]
    components: tuple[str, ...]
    signed_by: Path


def parse_simulation(text: str) -> list[Planned]:
    """The packages ``apt-get -s install`` would unpack, in apt's order."""
    planned = []
    for line in text.splitlines():
        match = _INST.match(line)
        if match:
            name = match["name"].split(":", 1)[0]
            planned.append(Planned(name, match["version"], match["arch"], match["old"]))
    return planned


def parse_print_uris(text: str) -> list[Download]:
    downloads = []
    for line in text.splitlines():
        match = _URI.match(line)
        if match:
            digest = match["hash"].lower() if match["algo"] and match["algo"].upper() == "SHA256" else None
            downloads.append(Download(match["uri"], match["file"], int(match["size"]), digest))
    return downloads


def unresolved_names(text: str) -> list[str]:
    """Package names apt complained about (not found or with unmet dependencies)."""
    names: list[str] = []
    for line in text.splitlines():
        match = _NOT_FOUND.match(line) or _UNMET.match(line)
        if match and match["name"] not in names:
            names.append(match["name"])
    return names


def apt_errors(text: str) -> list[str]:
    return [line[3:].strip() for line in text.splitlines() if line.startswith(("E: ", "W: "))]


def sources_text(sources: Sequence[SourceSpec], arches: Sequence[str]) -> str:
    stanzas = []
    for source in sources:
        lines = [
            f"# {source.name}",
            "Types: deb",
            "URIs: " + " ".join(source.uris),
            "Suites: " + " ".join(source.suites),
        ]
        if source.components:
            lines.append("Components: " + " ".join(source.components))
        lines.append("Architectures: " + " ".join(arches))
        lines.append(f"Signed-By: {source.signed_by}")
        stanzas.append("\n".join(lines) + "\n")
    return "\n".join(stanzas)


def pin(planned: Planned, native_arch: str) -> str:
    """``name=version`` (``name:arch=version`` for a foreign architecture)."""
    if planned.arch in ("all", native_arch):
        return f"{planned.name}={planned.version}"
    return f"{planned.name}:{planned.arch}={planned.version}"


def _write_if_changed(path: Path, data: bytes) -> None:
    if not path.is_file() or path.read_bytes() != data:
        path.write_bytes(data)


class IsolatedApt:
    """apt-get with a private configuration under ``state_dir``."""

    def __init__(
        self,
        state_dir: Path,
        archives: Path,
        base_status: Path,
        arch: str,
        foreign_arches: Sequence[str],
        sources: Sequence[SourceSpec],
        install_recommends: bool,
        preferences: str = "",
    ) -> None:
        self.state_dir = state_dir
        self.archives = archives
        self.arch = arch
        self.arches = [arch, *[a for a in foreign_arches if a != arch]]
        etc = state_dir / "etc"
        if etc.exists():
            shutil.rmtree(etc)
        for sub in ("apt.conf.d", "preferences.d", "sources.list.d", "trusted.gpg.d", "auth.conf.d"):
            (etc / sub).mkdir(parents=True)
        for sub in ("lists/partial", "state", "cache", "log"):
            (state_dir / sub).mkdir(parents=True, exist_ok=True)
        (archives / "partial").mkdir(parents=True, exist_ok=True)
        status = state_dir / "state" / "base.status"
        # Unchanged inputs keep their mtime, so apt's binary caches stay valid between builds.
        _write_if_changed(status, base_status.read_bytes())
        (etc / "sources.list").write_text("# generated by labctl: see sources.list.d/\n", encoding="utf-8")
        (etc / "sources.list.d" / "labctl.sources").write_text(sources_text(sources, self.arches), encoding="utf-8")
        if preferences:  # the groups' pins (profile apt.groups.*.pin), as the targets will have them
            (etc / "preferences.d" / "labctl.pref").write_text(preferences, encoding="utf-8")
        user = pwd.getpwuid(os.getuid()).pw_name
        options = {
            "Dir": "/",
            "Dir::Etc": str(etc),
            "Dir::Etc::main": "apt.conf",
            "Dir::Etc::parts": "apt.conf.d",
            "Dir::Etc::sourcelist": "sources.list",
            "Dir::Etc::sourceparts": "sources.list.d",
            "Dir::Etc::preferences": "preferences",
            "Dir::Etc::preferencesparts": "preferences.d",
            "Dir::Etc::trusted": "trusted.gpg",
            "Dir::Etc::trustedparts": "trusted.gpg.d",
            "Dir::Etc::netrc": "auth.conf",
            "Dir::Etc::netrcparts": "auth.conf.d",
            "Dir::State": str(state_dir / "state"),
            "Dir::State::lists": str(state_dir / "lists"),
            "Dir::State::status": str(status),
            "Dir::State::extended_states": str(state_dir / "state" / "extended_states"),
            "Dir::Cache": str(state_dir / "cache"),
            "Dir::Cache::archives": str(archives),
            "Dir::Log": str(state_dir / "log"),
            "APT::Architecture": arch,
            "APT::Install-Recommends": "true" if install_recommends else "false",
            "APT::Install-Suggests": "false",
            "APT::Sandbox::User": user,
            "Acquire::Languages": "none",
            "Debug::NoLocking": "1",
        }
        lines = [f'{key} "{value}";' for key, value in options.items()]
        lines.append("APT::Architectures { " + " ".join(f'"{a}";' for a in self.arches) + " };")
        self.config = state_dir / "apt.conf"
        self.config.write_text("\n".join(lines) + "\n", encoding="utf-8")

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("APT_", "LC_", "LANG"))}
        env.update(APT_CONFIG=str(self.config), LC_ALL="C.UTF-8", DEBIAN_FRONTEND="noninteractive")
        return env

    def run(self, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(
                ["apt-get", "-q", *args],
                cwd=cwd,
                env=self._env(),
                capture_output=True,
                text=True,
                check=False,
            )
        except OSError as exc:
            raise BuildError(f"cannot run apt-get: {exc.strerror}") from exc

    def cache(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``apt-cache`` with the same private configuration."""
        try:
            return subprocess.run(
                ["apt-cache", *args], env=self._env(), capture_output=True, text=True, check=False
            )
        except OSError as exc:
            raise BuildError(f"cannot run apt-cache: {exc.strerror}") from exc

    def update(self) -> None:
        proc = self.run("update", "--error-on=any")
        if proc.returncode != 0:
            errors = apt_errors(proc.stdout + proc.stderr) or [f"exit {proc.returncode}"]
            raise BuildError("apt.sources: apt-get update failed: " + "; ".join(errors[:3]))

    def simulate(self, packages: Sequence[str], where: Callable[[str], str]) -> list[Planned]:
        """The closure of ``packages``; ``where(name)`` names the profile field listing a package."""
        proc = self.run("-s", "install", *packages)
        output = proc.stdout + proc.stderr
        if proc.returncode != 0:
            names = list(unresolved_names(output)) or list(packages)
            errors = apt_errors(output) or [f"exit {proc.returncode}"]
            first = names[0]
            raise BuildError(f"{where(first)}: cannot resolve {', '.join(names)}: {errors[0]}")
        return parse_simulation(proc.stdout)

    def print_uris(self, planned: Sequence[Planned]) -> list[Download]:
        if not planned:
            return []
        # apt leaves out files already present in its working dir: ask from an empty one.
        empty = self.state_dir / "print-uris"
        if empty.exists():
            shutil.rmtree(empty)
        empty.mkdir()
        proc = self.run("download", "--print-uris", *[pin(p, self.arch) for p in planned], cwd=empty)
        if proc.returncode != 0:
            errors = apt_errors(proc.stdout + proc.stderr) or [f"exit {proc.returncode}"]
            raise BuildError(f"apt.packages: apt-get download --print-uris failed: {errors[0]}")
        return parse_print_uris(proc.stdout)

    def download(self, planned: Sequence[Planned], advance: Callable[[int], None]) -> None:
        """``apt-get download`` into the archives dir, streaming progress per package."""
        if not planned:
            return
        cmd = ["apt-get", "-q", "download", *[pin(p, self.arch) for p in planned]]
        with subprocess.Popen(
            cmd,
            cwd=self.archives,
            env=self._env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        ) as proc:
            assert proc.stdout is not None
            lines = []
            for line in proc.stdout:
                lines.append(line.rstrip("\n"))
                if line.startswith("Get:"):
                    advance(1)
            rc = proc.wait()
        if rc != 0:
            errors = apt_errors("\n".join(lines)) or [f"exit {rc}"]
            raise BuildError(f"apt.packages: apt-get download failed: {errors[0]}")
