"""The ``wheels`` component: the target-ABI wheelhouse plus local wheels, into wheels/."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labctl.bundle.errors import BuildError
from labctl.bundle.staging import Staging
from labctl.bundle.wheels import parse_wheel_name, pip_download
from labctl.paths import private_dir
from labctl.profile import LoadedProfile

WHEELS = "wheels"


@dataclass
class WheelResult:
    files: list[dict[str, Any]] = field(default_factory=list)

    def component(self) -> dict[str, Any]:
        return {"files": self.files}


def _requirements(profile: LoadedProfile, cache: Path) -> Path | None:
    wheels = profile.spec.wheels
    lines = list(wheels.requirements)
    for index, entry in enumerate(wheels.requirements_files):
        path = profile.resolve(entry)
        if not path.is_file():
            raise BuildError(f"wheels.requirements_files[{index}]: {path} not found (profile {profile.path})")
        lines.append(f"-r {path}")
    if not lines:
        return None
    req = cache / f"requirements-{profile.name}.txt"
    req.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return req


def collect_wheels(profile: LoadedProfile, cache: Path, staging: Staging) -> WheelResult:
    result = WheelResult()
    target = profile.spec.target
    items: list[tuple[Path, str]] = []
    requirements = _requirements(profile, private_dir(cache / "wheels"))
    if requirements is not None:
        with staging.reporter.task(f"wheels: pip download for {target.abi}", None, unit="wheels") as advance:
            downloaded = pip_download(
                cache / "wheels" / "files", requirements, target.python, target.abi, profile.spec.wheels.platforms, advance
            )
        items += [(path, f"{WHEELS}/{path.name}") for path in downloaded]
    for index, entry in enumerate(profile.spec.wheels.local):
        directory = profile.resolve(entry)
        if not directory.is_dir():
            raise BuildError(f"wheels.local[{index}]: {directory} is not a directory (profile {profile.path})")
        items += [(path, f"{WHEELS}/{path.name}") for path in sorted(directory.glob("*.whl")) if path.is_file()]
    for path, _ in items:
        parse_wheel_name(path.name)
    added = staging.add_all(items, f"wheels: copy {len(items)} wheels")
    for rel in sorted(added):
        wheel = parse_wheel_name(Path(rel).name)
        hashes = added[rel]
        result.files.append(
            {"name": wheel.name, "version": wheel.version, "file": rel, "sha256": hashes.sha256, "size": hashes.size}
        )
    return result
