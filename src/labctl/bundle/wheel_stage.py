"""The ``wheels`` component: the target-ABI wheelhouse plus local wheels, into wheels/.

Each ``wheels.sets`` entry is one service virtualenv. It is resolved on its own (so the set is
coherent by construction) and locked into ``wheels/sets/<name>.txt``: every project of the
resolution as ``name==version --hash=sha256:...`` minus the set's ``exclude``. The target
installs a set with ``pip install --no-index --no-deps --require-hashes -r <lock>``: nothing is
resolved there, and nothing the lock does not name can come in.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labctl.bundle import cuda_line
from labctl.bundle.errors import BuildError
from labctl.bundle.locks import download_locked, lock_path, read_lock
from labctl.bundle.staging import Staging
from labctl.bundle.wheels import WheelName, parse_wheel_name, pip_download, pip_resolve
from labctl.paths import private_dir
from labctl.profile import LoadedProfile, WheelSet
from labctl.profile import normalize_project as normalize

WHEELS = "wheels"
SETS = f"{WHEELS}/sets"


@dataclass
class WheelResult:
    files: list[dict[str, Any]] = field(default_factory=list)
    sets: dict[str, dict[str, Any]] = field(default_factory=dict)

    def component(self) -> dict[str, Any]:
        return {"files": self.files, "sets": self.sets}


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


def set_args(profile: LoadedProfile, spec: WheelSet) -> list[str]:
    args: list[str] = ["--no-index"] if spec.no_index else []
    for url in spec.extra_index_urls:
        args += ["--extra-index-url", url]
    for link in spec.find_links:
        args += ["--find-links", link if "://" in link else str(profile.resolve(link))]
    return args


def lock_text(name: str, spec: WheelSet, wheels: list[tuple[WheelName, str]]) -> str:
    """The lock of one set: header comments, then one hashed pin per project, sorted by name."""
    lines = [
        f"# wheel set {name}: written by labctl bundle build; install with",
        "#   pip install --no-index --find-links <bundle>/wheels --no-deps --require-hashes -r <this file>",
        f"# requirements: {' '.join(spec.requirements)}",
    ]
    if spec.exclude:
        lines.append(f"# excluded from the resolution: {' '.join(spec.exclude)}")
    for wheel, sha256 in sorted(wheels, key=lambda item: normalize(item[0].name)):
        lines.append(f"{normalize(wheel.name)}=={wheel.version} --hash=sha256:{sha256}")
    return "\n".join(lines) + "\n"


def _resolve_set(
    profile: LoadedProfile, cache: Path, staging: Staging, name: str, spec: WheelSet
) -> list[Path]:
    target = profile.spec.target
    req = private_dir(cache / "wheels") / f"set-{profile.name}-{name}.txt"
    req.write_text("\n".join(spec.requirements) + "\n", encoding="utf-8")
    with staging.reporter.task(f"wheels: resolve set {name} for {target.abi}", None, unit="wheels") as advance:
        downloaded = pip_download(
            cache / "wheels" / "files",
            req,
            target.python,
            target.abi,
            target.platforms,
            advance,
            set_args(profile, spec),
            what=f"wheels.sets.{name}",
        )
    resolution = pip_resolve(
        req, target.python, target.abi, target.platforms, set_args(profile, spec), what=f"wheels.sets.{name}"
    )
    unknown = [project for project in spec.exclude if project not in resolution]
    if unknown:
        raise BuildError(
            f"wheels.sets.{name}.exclude: {', '.join(unknown)} not in the resolution of {' '.join(spec.requirements)}"
        )
    # pip download also keeps the candidates it fetched while backtracking: keep the winners.
    chosen: dict[str, Path] = {}
    for path in downloaded:
        wheel = parse_wheel_name(path.name)
        project = normalize(wheel.name)
        if resolution.get(project) == wheel.version and project not in spec.exclude:
            chosen[project] = path
    missing = sorted(set(resolution) - set(chosen) - set(spec.exclude))
    if missing:
        raise BuildError(
            f"wheels.sets.{name}: pip resolved {', '.join(f'{p}=={resolution[p]}' for p in missing)} but downloaded no such wheel"
        )
    return [chosen[project] for project in sorted(chosen)]


def resolve_sets(profile: LoadedProfile, cache: Path) -> dict[str, dict[str, str]]:
    """Resolve-only: what each wheel set would lock for the profile's target (name -> project ->
    version), from the indexes' metadata, without downloading the wheels."""
    target = profile.spec.target
    resolved: dict[str, dict[str, str]] = {}
    for name, spec in profile.spec.wheels.sets.items():
        req = private_dir(cache / "wheels") / f"resolve-{profile.name}-{profile.os}-{name}.txt"
        req.write_text("\n".join(spec.requirements) + "\n", encoding="utf-8")
        resolution = pip_resolve(
            req, target.python, target.abi, target.platforms, set_args(profile, spec), what=f"wheels.sets.{name}"
        )
        resolved[name] = {project: version for project, version in sorted(resolution.items()) if project not in spec.exclude}
    return resolved


def collect_wheels(profile: LoadedProfile, cache: Path, staging: Staging) -> WheelResult:
    result = WheelResult()
    target = profile.spec.target
    items: dict[str, Path] = {}
    requirements = _requirements(profile, private_dir(cache / "wheels"))
    if requirements is not None:
        with staging.reporter.task(f"wheels: pip download for {target.abi}", None, unit="wheels") as advance:
            downloaded = pip_download(
                cache / "wheels" / "files", requirements, target.python, target.abi, target.platforms, advance
            )
        items.update({f"{WHEELS}/{path.name}": path for path in downloaded})
    set_files: dict[str, list[str]] = {}
    locked: dict[str, dict[str, str]] = {}
    for name, spec in profile.spec.wheels.sets.items():
        if profile.spec.locks is not None:
            pins = read_lock(profile, name, spec)
            locked[name] = {pin.name: pin.sha256 for pin in pins}
            with staging.reporter.task(f"wheels: fetch locked set {name} ({len(pins)} wheels)", len(pins),
                                       unit="wheels") as advance:
                chosen = download_locked(profile, cache, name, pins, advance)
        else:
            chosen = _resolve_set(profile, cache, staging, name, spec)
        set_files[name] = [f"{WHEELS}/{path.name}" for path in chosen]
        items.update({f"{WHEELS}/{path.name}": path for path in chosen})
    for index, entry in enumerate(profile.spec.wheels.local):
        directory = profile.resolve(entry)
        if not directory.is_dir():
            raise BuildError(f"wheels.local[{index}]: {directory} is not a directory (profile {profile.path})")
        for path in sorted(directory.glob("*.whl")):
            if path.is_file():
                items.setdefault(f"{WHEELS}/{path.name}", path)
    for rel in items:
        parse_wheel_name(Path(rel).name)
    added = staging.add_all([(path, rel) for rel, path in sorted(items.items())], f"wheels: copy {len(items)} wheels")
    for rel in sorted(added):
        wheel = parse_wheel_name(Path(rel).name)
        hashes = added[rel]
        result.files.append(
            {"name": wheel.name, "version": wheel.version, "file": rel, "sha256": hashes.sha256, "size": hashes.size}
        )
    for name, spec in profile.spec.wheels.sets.items():
        pinned = [(parse_wheel_name(Path(rel).name), added[rel].sha256) for rel in set_files[name]]
        for wheel, sha256 in pinned:
            want = locked.get(name, {}).get(normalize(wheel.name))
            if name in locked and want != sha256:
                raise BuildError(f"wheels.sets.{name}: {wheel.name} {wheel.version} has sha256 {sha256}, its lock says {want}")
        lock = f"{SETS}/{name}.txt"
        staging.add_bytes(lock_text(name, spec, pinned).encode("utf-8"), lock, f"wheels.sets.{name}")
        committed = lock_path(profile, name)
        result.sets[name] = {
            "locked_from": os.path.relpath(committed, profile.path.parent) if committed is not None else None,
            "requirements": list(spec.requirements),
            "exclude": list(spec.exclude),
            "lock": lock,
            "packages": [
                {"name": normalize(wheel.name), "version": wheel.version}
                for wheel, _ in sorted(pinned, key=lambda item: normalize(item[0].name))
            ],
            # torch's CUDA and the compiler's (cuda_line.py): what preflight compares with the lab.
            "cuda": cuda_line.line({normalize(wheel.name): wheel.version for wheel, _ in pinned}),
        }
    return result
