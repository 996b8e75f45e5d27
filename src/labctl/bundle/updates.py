"""Security updates for hosts already installed (``labctl bundle build --updates-from STATUS``).

A lab host's dpkg status (copied from ``/var/lib/dpkg/status``) stands in for the base: apt
simulates ``dist-upgrade`` over the profile's sources, and an upgrade is kept when a
``*-security`` suite offers a version newer than the installed one (the candidate is taken, so a
later stable update that carries the fix counts too). The kept upgrades are then resolved as
``install name=version`` so their new dependencies come along; holds in the status (the NVIDIA
driver's) and the profile's pins stay in force as on the host.
"""

from __future__ import annotations

import hashlib
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labctl.bundle.aptclosure import IsolatedApt, Planned, SourceSpec, apt_errors, parse_simulation, pin
from labctl.bundle.errors import BuildError

SECURITY_SUFFIX = "-security"


@dataclass(frozen=True)
class Offer:
    """One row of ``apt-cache madison``: a version and the suite that offers it."""

    name: str
    version: str
    suite: str

    @property
    def security(self) -> bool:
        return self.suite.endswith(SECURITY_SUFFIX)


@dataclass
class HostUpdates:
    """What one host's status needs: the security upgrades and their closure."""

    status: Path
    sha256: str
    security: list[Planned] = field(default_factory=list)
    closure: list[Planned] = field(default_factory=list)

    def record(self) -> dict[str, Any]:
        kept = {p.name for p in self.security}
        return {
            "status": self.status.name,
            "sha256": self.sha256,
            "packages": [
                {
                    "name": p.name,
                    "arch": p.arch,
                    "installed": p.upgrade_from,
                    "version": p.version,
                    "reason": "security" if p.name in kept else ("dependency" if p.upgrade_from is None else "needed"),
                }
                for p in self.closure
            ],
        }


def security_sources(sources: list[SourceSpec]) -> list[SourceSpec]:
    return [s for s in sources if any(suite.endswith(SECURITY_SUFFIX) for suite in s.suites)]


def parse_madison(text: str) -> list[Offer]:
    """`` name | version | URI suite/component arch Packages`` rows (flat repos: ``URI ./ Packages``)."""
    offers = []
    for line in text.splitlines():
        parts = [part.strip() for part in line.split("|")]
        if len(parts) != 3 or not parts[0] or not parts[1]:
            continue
        where = parts[2].split()
        if len(where) < 2:
            continue
        offers.append(Offer(parts[0], parts[1], where[1].split("/", 1)[0]))
    return offers


def version_newer(candidate: str, installed: str) -> bool:
    proc = subprocess.run(["dpkg", "--compare-versions", candidate, "gt", installed], check=False)
    return proc.returncode == 0


def status_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def host_updates(apt: IsolatedApt, status: Path) -> HostUpdates:
    """The security upgrades ``apt`` (set up with ``status`` as its dpkg status) finds."""
    result = HostUpdates(status=status, sha256=status_sha256(status))
    upgrade = apt.run("-s", "dist-upgrade")
    if upgrade.returncode != 0:
        errors = apt_errors(upgrade.stdout + upgrade.stderr) or [f"exit {upgrade.returncode}"]
        raise BuildError(f"--updates-from {status}: apt-get -s dist-upgrade failed: {errors[0]}")
    upgrades = [p for p in parse_simulation(upgrade.stdout) if p.upgrade_from]
    if not upgrades:
        return result
    madison = apt.cache("madison", *sorted({p.name for p in upgrades}))
    offers: dict[str, list[Offer]] = {}
    for offer in parse_madison(madison.stdout):
        offers.setdefault(offer.name, []).append(offer)
    for planned in upgrades:
        assert planned.upgrade_from is not None
        fixes = [o for o in offers.get(planned.name, []) if o.security]
        if any(version_newer(o.version, planned.upgrade_from) for o in fixes):
            result.security.append(planned)
    if result.security:
        names = [pin(p, apt.arch) for p in result.security]
        result.closure = apt.simulate(names, lambda _name: f"--updates-from {status}")
    return result
