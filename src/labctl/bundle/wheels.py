"""The Python wheelhouse: ``pip download`` pinned to the target's interpreter ABI."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labctl.bundle.errors import BuildError
from labctl.profile import normalize_project

_SAVED = re.compile(r"^\s*(?:Saved|File was already downloaded) (?P<path>.+?)\s*$")
_WHEEL = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)(?:-\d[^-]*)?-[^-]+-[^-]+-[^-]+\.whl$")


@dataclass(frozen=True)
class WheelName:
    name: str
    version: str


def parse_wheel_name(filename: str) -> WheelName:
    match = _WHEEL.match(filename)
    if not match:
        raise BuildError(f"{filename}: not a wheel file name (name-version-python-abi-platform.whl)")
    return WheelName(match["name"], match["version"])


def parse_pip_output(text: str) -> list[str]:
    """File names (basenames) pip saved or found already downloaded, in order, without duplicates."""
    names: list[str] = []
    for line in text.splitlines():
        match = _SAVED.match(line)
        if match:
            name = match["path"].replace("\\", "/").rsplit("/", 1)[-1]
            if name not in names:
                names.append(name)
    return names


def pip_download_command(
    dest: Path,
    requirements: Path,
    python: str,
    abi: str,
    platforms: Sequence[str],
    extra_args: Sequence[str] = (),
) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--disable-pip-version-check",
        "--progress-bar",
        "off",
        "--only-binary=:all:",
        "--implementation",
        "cp",
        "--python-version",
        python,
        "--abi",
        abi,
    ]
    if not platforms:
        raise BuildError("no wheel platform tags for the target")
    for platform in platforms:
        cmd += ["--platform", platform]
    return [*cmd, *extra_args, "--dest", str(dest), "-r", str(requirements)]


def pip_download(
    dest: Path,
    requirements: Path,
    python: str,
    abi: str,
    platforms: Sequence[str],
    advance: Callable[[int], None],
    extra_args: Sequence[str] = (),
    what: str = "wheels.requirements",
) -> list[Path]:
    """Run pip (the user's pip configuration applies) and return the wheels of this resolution."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = pip_download_command(dest, requirements, python, abi, platforms, extra_args)
    lines: list[str] = []
    try:
        with subprocess.Popen(
            cmd, cwd=dest, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        ) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line.rstrip("\n"))
                if _SAVED.match(line):
                    advance(1)
            rc = proc.wait()
    except OSError as exc:
        raise BuildError(f"cannot run pip: {exc.strerror}") from exc
    output = "\n".join(lines)
    if rc != 0:
        errors = [line.strip() for line in lines if line.startswith("ERROR:")] or lines[-1:] or [f"exit {rc}"]
        raise BuildError(f"{what}: pip download failed: {errors[0]}")
    files = [dest / name for name in parse_pip_output(output)]
    for path in files:
        if path.suffix != ".whl":
            raise BuildError(f"{what}: pip returned {path.name}, which is not a wheel")
        if not path.is_file():
            raise BuildError(f"{what}: pip reported {path.name} but it is not in {dest}")
    return files


def _short_versions(error: str) -> str:
    """pip's "(from versions: a, b, ... z)" cut to its newest few."""
    def cut(match: re.Match[str]) -> str:
        versions = [v.strip() for v in match.group(1).split(",")]
        return f"(from versions: {'..., ' if len(versions) > 4 else ''}{', '.join(versions[-4:])})"

    return re.sub(r"\(from versions: ([^)]*)\)", cut, error)


def pip_report(
    requirements: Path,
    python: str,
    abi: str,
    platforms: Sequence[str],
    extra_args: Sequence[str] = (),
    what: str = "wheels.requirements",
) -> list[dict[str, Any]]:
    """The ``install`` items of pip's installation report for the target: what pip would install
    (metadata) and from where (download_info: URL and hashes), without downloading the wheels."""
    with tempfile.TemporaryDirectory(prefix="labctl-resolve-") as tmp:
        report = Path(tmp) / "report.json"
        cmd = pip_download_command(Path(tmp) / "target", requirements, python, abi, platforms, extra_args)
        # the same options, as an install dry run (pip allows platform options only with --target)
        at = cmd.index("download")
        dest = cmd.index("--dest")
        cmd = [*cmd[:at], "install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report),
               *cmd[at + 1 : dest], "--target", cmd[dest + 1], *cmd[dest + 2 :]]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            lines = (proc.stdout + proc.stderr).splitlines()
            errors = [line.strip() for line in lines if line.startswith("ERROR:")] or lines[-1:] or [f"exit {proc.returncode}"]
            # pip lists yanked versions it passed over as an error line first: the requirement it could
            # not satisfy is the one to name.
            errors = [e for e in errors if not e.startswith("ERROR: Ignored the following")] or errors
            raise BuildError(f"{what}: pip could not resolve the set: {_short_versions(errors[0])}")
        data = json.loads(report.read_text(encoding="utf-8"))
    items: list[dict[str, Any]] = data.get("install", [])
    return items


def pip_resolve(
    requirements: Path,
    python: str,
    abi: str,
    platforms: Sequence[str],
    extra_args: Sequence[str] = (),
    what: str = "wheels.requirements",
) -> dict[str, str]:
    """The final resolution (normalised project name -> version) pip would install on the target.

    ``pip download`` keeps every candidate it fetched while backtracking; this dry run names
    the set that won, so a lock holds exactly one version of each project.
    """
    return {
        normalize_project(item["metadata"]["name"]): str(item["metadata"]["version"])
        for item in pip_report(requirements, python, abi, platforms, extra_args, what)
    }
