"""The litellm role's filters."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from ansible.errors import AnsibleFilterError

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


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


def labctl_app_keys_doc(keys: list[dict[str, Any]], classes: list[dict[str, Any]]) -> dict[str, Any]:
    """What the gateway's auth hook reads (app-keys.json): the public model names of each key class
    (litellm_model_classes' key_class), and per sha256 the keys that are not revoked (lab_app_keys,
    the control node's store: `labctl keys`). Refuses, naming the key, a class no model class
    carries, a malformed hash, a name used twice, a limit that is not positive, an expiry that is
    not an ISO date-time with a zone."""
    by_class: dict[str, list[str]] = {}
    for entry in classes:
        if entry.get("key_class"):
            by_class.setdefault(str(entry["key_class"]), []).append(str(entry["name"]))
    doc: dict[str, Any] = {"classes": by_class, "keys": {}}
    names: set[str] = set()
    for number, key in enumerate(keys or [], 1):
        if not isinstance(key, dict):
            raise AnsibleFilterError(f"lab_app_keys: entry {number} is not a mapping")
        name = str(key.get("name", f"entry {number}"))
        where = f"lab_app_keys: key {name}"
        if key.get("revoked"):
            continue
        if key.get("class") not in by_class:
            raise AnsibleFilterError(f"{where}: class {key.get('class')!r} does not exist (litellm_model_classes give: "
                                     f"{', '.join(sorted(by_class)) or 'none'})")
        digest = str(key.get("sha256", ""))
        if not _SHA256.match(digest):
            raise AnsibleFilterError(f"{where}: sha256 is not 64 lowercase hex digits")
        if name in names or digest in doc["keys"]:
            raise AnsibleFilterError(f"{where}: given twice (revoke the old one first)")
        for limit in ("rpm", "tpm"):
            value = key.get(limit)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise AnsibleFilterError(f"{where}: {limit} {value!r} is not a positive number")
        expires = key.get("expires")
        if expires is not None:
            try:
                zone = datetime.fromisoformat(str(expires)).tzinfo
            except ValueError:
                zone = None
            if zone is None:
                raise AnsibleFilterError(f"{where}: expires {expires!r} is not an ISO date-time with a zone")
        names.add(name)
        doc["keys"][digest] = {"name": name, "class": key["class"], "rpm": key.get("rpm"), "tpm": key.get("tpm"),
                               "expires": expires}
    return doc


def labctl_new_key_problem(new: dict[str, Any], keys: list[dict[str, Any]]) -> str:
    """'' when the key `labctl keys add` handed over (new: name, key) is the store's live key of that
    name (its sha256 matches), else what is wrong (naming the key, never showing it)."""
    import hashlib

    name = str(new.get("name", "")) if isinstance(new, dict) else ""
    record = next((k for k in keys or [] if k.get("name") == name and not k.get("revoked")), None)
    if record is None:
        return f"lab_app_keys: no live key named {name!r} in the store for the new key"
    if hashlib.sha256(str(new.get("key", "")).encode()).hexdigest() != record.get("sha256"):
        return f"lab_app_keys: key {name}: the new key does not match the store's hash"
    return ""


def labctl_virtual_key_request(new: dict[str, Any], keys: list[dict[str, Any]], classes: list[dict[str, Any]],
                               now: str | None = None) -> dict[str, Any]:
    """The /key/generate body for a key `labctl keys add` just made (database mode): the key itself
    (new: name and key), its store record's class as the models it reaches, its limits, and its
    expiry as a duration from now. Refuses a key the store does not hold, or whose hash differs."""
    from datetime import timezone

    problem = labctl_new_key_problem(new, keys)
    if problem:
        raise AnsibleFilterError(problem)
    name = str(new["name"])
    record = next(k for k in keys if k.get("name") == name and not k.get("revoked"))
    doc = labctl_app_keys_doc([record], classes)
    body: dict[str, Any] = {"key": new["key"], "key_alias": name, "models": doc["classes"][record["class"]],
                            "metadata": {"labctl_key_class": record["class"]}}
    for limit in ("rpm", "tpm"):
        if record.get(limit) is not None:
            body[f"{limit}_limit"] = record[limit]
    if record.get("expires"):
        start = datetime.fromisoformat(now) if now else datetime.now(timezone.utc)
        seconds = int((datetime.fromisoformat(str(record["expires"])) - start).total_seconds())
        if seconds <= 0:
            raise AnsibleFilterError(f"lab_app_keys: key {name} expired at {record['expires']}")
        body["duration"] = f"{seconds}s"
    return body


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "labctl_app_keys_doc": labctl_app_keys_doc,
            "labctl_new_key_problem": labctl_new_key_problem,
            "labctl_virtual_key_request": labctl_virtual_key_request,
            "labctl_class_floors": labctl_class_floors,
        }
