"""The litellm role's filters."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError

def labctl_class_floors(classes: list[dict[str, Any]], default_floor: float) -> dict[str, float]:
    """The admission floors by priority (as text, a JSON key): every class but the most urgent
    keeps its own ``floor`` or ``default_floor``; the most urgent class needs none."""
    if not classes:
        return {}
    top = min(int(c["priority"]) for c in classes)
    floors: dict[str, float] = {}
    for entry in classes:
        priority = int(entry["priority"])
        floor = float(entry.get("floor", 0.0 if priority == top else default_floor))
        if not 0.0 <= floor < 1.0:
            raise AnsibleFilterError(f"litellm_model_classes: {entry.get('name')}: floor {floor} is not in [0, 1)")
        if floor > 0:
            floors[str(priority)] = max(floor, floors.get(str(priority), 0.0))
    if sum(floors.values()) >= 1.0:
        raise AnsibleFilterError(f"litellm_model_classes: the floors add up to {sum(floors.values())}: keep them below 1")
    return floors


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "labctl_class_floors": labctl_class_floors,
        }
