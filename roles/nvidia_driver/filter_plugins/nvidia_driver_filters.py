"""The NVIDIA driver role's filters: Debian versions of one driver release."""

from __future__ import annotations

from typing import Any


def labctl_upstream_version(version: str) -> str:
    """The upstream part of a Debian version: '1:580.95.05-0ubuntu1' -> '580.95.05'."""
    text = str(version).strip().split(":", 1)[-1]
    return text.rsplit("-", 1)[0] if "-" in text else text


def labctl_same_upstream(versions: list[str], version: str) -> list[str]:
    """The versions (in their order) whose upstream part is that of ``version``: NVIDIA packages of one
    driver release carry different Debian revisions (Ubuntu's driver 580.95.05-0ubuntu1, fabric
    manager 580.95.05-1)."""
    want = labctl_upstream_version(version)
    return [v for v in versions if labctl_upstream_version(v) == want]


def labctl_release_choice(offered: dict[str, list[str]], version: str) -> dict[str, list[str]]:
    """For each package (name -> the versions apt offers, newest first), the first version of the
    same upstream release as ``version``: {"install": ["name=version", ...], "missing": [names]}."""
    install, missing = [], []
    for name, versions in offered.items():
        same = labctl_same_upstream(list(versions), version)
        if same:
            install.append(f"{name}={same[0]}")
        else:
            missing.append(name)
    return {"install": install, "missing": missing}


def labctl_madison(text: str, names: list[str]) -> dict[str, list[str]]:
    """`apt-cache madison NAME...` (" name | version | source" lines, newest first) as
    {name: [versions]} for each of ``names`` (an empty list for a name the repository lacks)."""
    offered: dict[str, list[str]] = {name: [] for name in names}
    for line in str(text).splitlines():
        fields = [field.strip() for field in line.split("|")]
        if len(fields) >= 2 and fields[0] in offered and fields[1] not in offered[fields[0]]:
            offered[fields[0]].append(fields[1])
    return offered


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "labctl_upstream_version": labctl_upstream_version,
            "labctl_same_upstream": labctl_same_upstream,
            "labctl_release_choice": labctl_release_choice,
            "labctl_madison": labctl_madison,
        }
