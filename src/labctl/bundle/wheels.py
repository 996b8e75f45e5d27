"""The Python wheelhouse: ``pip download`` pinned to the target's interpreter ABI."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from labctl.bundle.errors import BuildError

DEFAULT_PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64")

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
    dest: Path, requirements: Path, python: str, abi: str, platforms: Sequence[str]
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
    for platform in [*DEFAULT_PLATFORMS, *[p for p in platforms if p not in DEFAULT_PLATFORMS]]:
        cmd += ["--platform", platform]
    return [*cmd, "--dest", str(dest), "-r", str(requirements)]


def pip_download(
    dest: Path,
    requirements: Path,
    python: str,
    abi: str,
    platforms: Sequence[str],
    advance: Callable[[int], None],
) -> list[Path]:
    """Run pip (the user's pip configuration applies) and return the wheels of this resolution."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = pip_download_command(dest, requirements, python, abi, platforms)
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
        raise BuildError(f"wheels.requirements: pip download failed: {errors[0]}")
    files = [dest / name for name in parse_pip_output(output)]
    for path in files:
        if path.suffix != ".whl":
            raise BuildError(f"wheels.requirements: pip returned {path.name}, which is not a wheel")
        if not path.is_file():
            raise BuildError(f"wheels.requirements: pip reported {path.name} but it is not in {dest}")
    return files
