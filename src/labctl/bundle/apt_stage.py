"""The ``apt`` component: closure from the profile's sources plus local .debs, into apt/pool."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labctl.bundle.aptclosure import Download, IsolatedApt, Planned, SourceSpec
from labctl.bundle.aptrepo import Deb, load_debs
from labctl.bundle.base import base_status
from labctl.bundle.errors import BuildError
from labctl.bundle.probe import probe, release_url
from labctl.bundle.staging import Staging
from labctl.bundle.updates import HostUpdates, host_updates, security_sources
from labctl.paths import private_dir
from labctl.profile import LoadedProfile

POOL = "apt/pool"


@dataclass
class BaseSpec:
    image: str | None = None
    status_file: Path | None = None
    # dpkg status files of installed lab hosts: their security updates are added (--updates-from).
    updates_from: tuple[Path, ...] = ()

    @property
    def given(self) -> bool:
        return self.image is not None or self.status_file is not None


@dataclass
class AptResult:
    debs: list[Deb] = field(default_factory=list)
    origins: dict[str, str] = field(default_factory=dict)  # pool file -> "apt" | "local"
    skipped: list[dict[str, Any]] = field(default_factory=list)
    base: str | None = None
    updates: list[HostUpdates] = field(default_factory=list)

    def component(self) -> dict[str, Any]:
        packages = [
            {
                "name": deb.name,
                "version": deb.version,
                "arch": deb.arch,
                "file": f"{POOL}/{deb.file}",
                "sha256": deb.hashes.sha256,
                "size": deb.hashes.size,
                "origin": self.origins[deb.file],
            }
            for deb in self.debs
        ]
        component: dict[str, Any] = {"packages": packages, "skipped": self.skipped}
        if self.base is not None:
            component["base"] = self.base
        if self.updates:
            component["updates"] = [host.record() for host in self.updates]
        return component


def deb_filename(planned: Planned) -> str:
    """The file name ``apt-get download`` gives a package (epoch colon escaped)."""
    return f"{planned.name}_{planned.version.replace(':', '%3a')}_{planned.arch}.deb"


def pool_filename(planned: Planned) -> str:
    """The name in apt/pool: like the Debian archive's, without the epoch (no '%' or ':' in URIs)."""
    return f"{planned.name}_{planned.version.split(':', 1)[-1]}_{planned.arch}.deb"


def _sources(profile: LoadedProfile, result: AptResult, staging: Staging) -> list[SourceSpec]:
    kept = []
    for index, source in enumerate(profile.spec.apt.sources):
        field_name = f"apt.sources[{index}] ({source.name})"
        keyring = profile.resolve(source.signed_by)
        reason = None if keyring.is_file() else f"signed_by keyring {keyring} not found"
        if reason is None and source.optional:
            for uri in source.uris:
                for suite in source.suites:
                    reason = reason or probe(release_url(uri, suite))
        if reason is not None:
            if not source.optional:
                users = [name for name, group in profile.spec.apt.groups.items() if source.name in group.sources]
                needed = f" (apt.groups {', '.join(users)} need it)" if users else ""
                raise BuildError(f"{field_name}: {reason}{needed}")
            staging.reporter.warn(f"optional apt source {source.name} skipped: {reason}")
            result.skipped.append({"source": source.name, "uris": source.uris, "reason": reason, "groups": []})
            continue
        kept.append(
            SourceSpec(source.name, tuple(source.uris), tuple(source.suites), tuple(source.components), keyring)
        )
    return kept


def _wanted(profile: LoadedProfile, result: AptResult, staging: Staging) -> tuple[list[str], dict[str, str]]:
    """Packages to resolve and, for error messages, the profile field listing each."""
    skipped_sources = {entry["source"]: entry for entry in result.skipped}
    wanted: list[str] = []
    where: dict[str, str] = {}
    for name in profile.spec.apt.packages:
        where.setdefault(name, "apt.packages")
        if name not in wanted:
            wanted.append(name)
    for group_name, group in profile.spec.apt.groups.items():
        missing = [s for s in group.sources if s in skipped_sources]
        if missing:
            for source in missing:
                skipped_sources[source]["groups"].append({"group": group_name, "packages": group.packages})
            staging.reporter.warn(f"apt group {group_name} skipped: source {', '.join(missing)} unavailable")
            continue
        for name in group.packages:
            where.setdefault(name, f"apt.groups.{group_name}.packages")
            if name not in wanted:
                wanted.append(name)
    return wanted, where


def _preferences(profile: LoadedProfile, result: AptResult) -> str:
    """The pins of the groups that are resolved (a skipped group's pin would steer the others), and
    the profile's exclusions."""
    skipped = {entry["source"] for entry in result.skipped}
    stanzas = [
        f"# apt.groups.{name}.pin\n" + group.pin.stanza()
        for name, group in profile.spec.apt.groups.items()
        if group.pin is not None and not any(source in skipped for source in group.sources)
    ]
    if profile.spec.apt.exclude:
        stanzas.append(profile.spec.apt.exclude_stanza())
    return "\n".join(stanzas)


def _fetch(apt: IsolatedApt, planned: list[Planned], staging: Staging) -> None:
    uris = {d.file: d for d in apt.print_uris(planned)}
    by_file: dict[str, tuple[Planned, Download]] = {}
    for item in planned:
        name = deb_filename(item)
        if name not in uris:
            raise BuildError(f"apt.packages: apt gives no download for {item.name}={item.version} ({name})")
        by_file[name] = (item, uris[name])

    def missing() -> list[Planned]:
        return [
            item
            for name, (item, download) in by_file.items()
            if not (apt.archives / name).is_file() or (apt.archives / name).stat().st_size != download.size
        ]

    todo = missing()
    for attempt in range(2):
        if todo:
            with staging.reporter.task(f"apt: download {len(todo)} packages", len(todo), unit="packages") as advance:
                apt.download(todo, advance)
        still = missing()
        if still:
            raise BuildError(f"apt.packages: {still[0].name}={still[0].version} was not downloaded")
        pool = {name: f"{POOL}/{pool_filename(item)}" for name, (item, _) in by_file.items()}
        copies = [(apt.archives / name, pool[name]) for name in sorted(by_file) if pool[name] not in staging.hashes]
        staging.add_all(copies, f"apt: copy {len(copies)} packages")
        bad = [
            name
            for name in sorted(by_file)
            if by_file[name][1].sha256 not in (None, staging.hashes[pool[name]].sha256)
        ]
        if not bad:
            return
        if attempt == 1:
            raise BuildError(f"apt.packages: {bad[0]} does not match the sha256 in the repository index")
        staging.reporter.warn(f"apt: {len(bad)} cached packages do not match the index, downloading again")
        for name in bad:
            (apt.archives / name).unlink()
            (staging.root / pool[name]).unlink()
            del staging.hashes[pool[name]]
        todo = [by_file[name][0] for name in bad]


def _local_debs(profile: LoadedProfile, staging: Staging) -> list[str]:
    items = []
    for index, entry in enumerate(profile.spec.apt.local_debs):
        directory = profile.resolve(entry)
        if not directory.is_dir():
            raise BuildError(f"apt.local_debs[{index}]: {directory} is not a directory (profile {profile.path})")
        items += [(path, f"{POOL}/{path.name}") for path in sorted(directory.glob("*.deb")) if path.is_file()]
    staging.add_all(items, f"apt: copy {len(items)} local packages")
    return [Path(rel).name for _, rel in items]


def _need_base(profile: LoadedProfile, field_name: str) -> BuildError:
    return BuildError(
        f"{field_name}: resolving apt packages for profile {profile.name} needs the pristine target's "
        "dpkg status: pass --base-image IMAGE or --base-status FILE"
    )


def check_base(profile: LoadedProfile, base: BaseSpec) -> None:
    """Fail early (before keys, staging or probes) when always-wanted packages lack a base, or a
    host status for --updates-from is missing."""
    if profile.spec.apt.packages and not base.given:
        raise _need_base(profile, "apt.packages")
    for status in base.updates_from:
        if not status.is_file():
            raise BuildError(f"--updates-from {status}: no such file (copy /var/lib/dpkg/status from the lab host)")


def _collect_updates(
    profile: LoadedProfile, cache: Path, sources: list[SourceSpec], base: BaseSpec, result: AptResult, staging: Staging
) -> None:
    """The security updates of every --updates-from status, fetched into the pool."""
    if not security_sources(sources):
        names = ", ".join(s.name for s in sources) or "none"
        raise BuildError(
            f"--updates-from: profile {profile.name} has no apt source with a '*-security' suite (sources: {names}), "
            "so there are no security updates to add"
        )
    state_dir = private_dir(cache / "apt" / f"{profile.name}.updates")
    for status in base.updates_from:
        copied = state_dir / "host.status.in"
        base_status(copied, None, status)
        apt = IsolatedApt(
            state_dir=state_dir,
            archives=cache / "apt" / "archives",
            base_status=copied,
            arch=profile.spec.target.arch,
            foreign_arches=profile.spec.target.foreign_arches,
            sources=sources,
            install_recommends=profile.spec.apt.install_recommends,
            preferences=_preferences(profile, result),
        )
        if not result.updates:
            staging.reporter.info(f"apt: update lists of {len(sources)} sources for the security updates")
            apt.update()
        host = host_updates(apt, status)
        result.updates.append(host)
        staging.reporter.info(
            f"apt: {status}: {len(host.security)} security updates, {len(host.closure)} packages to bundle"
        )
        _fetch(apt, host.closure, staging)
        for item in host.closure:
            result.origins.setdefault(pool_filename(item), "update")


def collect_apt(profile: LoadedProfile, cache: Path, base: BaseSpec, staging: Staging) -> AptResult:
    result = AptResult()
    check_base(profile, base)
    sources = _sources(profile, result, staging)
    wanted, where = _wanted(profile, result, staging)
    if wanted:
        if not base.given:
            raise _need_base(profile, where[wanted[0]])
        if not sources:
            raise BuildError(f"apt.sources: profile {profile.path} lists apt packages but no usable source")
        target = profile.spec.target
        state_dir = private_dir(cache / "apt" / profile.name)
        status = state_dir / "base.status.in"
        result.base = base_status(status, base.image, base.status_file)
        apt = IsolatedApt(
            state_dir=state_dir,
            archives=cache / "apt" / "archives",
            base_status=status,
            arch=target.arch,
            foreign_arches=target.foreign_arches,
            sources=sources,
            install_recommends=profile.spec.apt.install_recommends,
            preferences=_preferences(profile, result),
        )
        staging.reporter.info(f"apt: update lists of {len(sources)} sources")
        apt.update()
        planned = apt.simulate(wanted, lambda name: where.get(name, "apt.packages"))
        staging.reporter.info(f"apt: {len(wanted)} requested packages need {len(planned)} packages on the target")
        _fetch(apt, planned, staging)
        for item in planned:
            result.origins[pool_filename(item)] = "apt"
    if base.updates_from:
        _collect_updates(profile, cache, sources, base, result, staging)
    for name in _local_debs(profile, staging):
        result.origins[name] = "local"
    pool_hashes = {rel.split("/")[-1]: h for rel, h in staging.hashes.items() if rel.startswith(f"{POOL}/")}
    result.debs = load_debs(staging.root / POOL, pool_hashes)
    return result
