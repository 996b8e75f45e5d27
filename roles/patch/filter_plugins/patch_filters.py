"""The patch role's filters: what an upgrade changed, whether a new kernel needs a reboot."""

from __future__ import annotations

import re
from typing import Any


def labctl_package_changes(before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, Any]]:
    """What an upgrade changed, from two ``package_facts`` results: name, from, to (None when the
    package was not there before or is gone after) and a printable line, sorted by name."""

    def versions(facts: dict[str, Any], name: str) -> str | None:
        found = sorted({entry["version"] for entry in facts.get(name, [])})
        return ", ".join(found) if found else None

    changes = []
    for name in sorted(set(before) | set(after)):
        old, new = versions(before, name), versions(after, name)
        if old != new:
            line = f"{name} {old or '(new)'} -> {new or '(removed)'}"
            changes.append({"name": name, "from": old, "to": new, "line": line})
    return changes


def _release_key(release: str) -> list[Any]:
    return [(0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", release) if part]


def labctl_kernel_reboot_needed(running: str, installed: list[str]) -> bool:
    """Whether the newest installed kernel (releases from /boot/vmlinuz-*) is not the running one.
    No kernel image installed (a container) needs no reboot."""
    releases = [r for r in installed if r]
    if not releases:
        return False
    return max(releases, key=_release_key) != running


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "labctl_package_changes": labctl_package_changes,
            "labctl_kernel_reboot_needed": labctl_kernel_reboot_needed,
        }
