"""The litellm role's filters."""

from __future__ import annotations

import hashlib
import json
import re
from datetime import UTC, datetime
from typing import Any

import yaml
from ansible.errors import AnsibleFilterError

from labctl.keys import key_models, public_names

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
# A key record's limits (labctl.keys.AppKey): requests and tokens per minute, requests in flight.
LIMITS = ("rpm", "tpm", "max_parallel")
_LIMIT_FIELDS = {"rpm": "rpm_limit", "tpm": "tpm_limit", "max_parallel": "max_parallel_requests"}
# With lab_models: the priority of each key class's public names (lower first).
_CLASS_PRIORITY = {"interactive": 0, "batch": 10}


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


def _app_keys(keys: list[Any], classes: list[dict[str, Any]]) -> tuple[dict[str, Any], list[dict[str, str]]]:
    """The auth hook's document of the good live records, and a problem per record left out."""
    by_class: dict[str, list[str]] = {}
    for entry in classes:
        if entry.get("key_class"):
            by_class.setdefault(str(entry["key_class"]), []).append(str(entry["name"]))
    good: list[tuple[str, str, dict[str, Any]]] = []
    problems: list[dict[str, str]] = []
    for number, key in enumerate(keys or [], 1):
        if not isinstance(key, dict):
            problems.append({"name": f"entry {number}", "problem": f"lab_app_keys: entry {number} is not a mapping"})
            continue
        if key.get("revoked"):
            continue
        name = str(key.get("name", f"entry {number}"))
        entry, problem = _key_entry(key, name, by_class, classes)
        if problem:
            problems.append({"name": name, "problem": f"lab_app_keys: key {name}: {problem}"})
        else:
            good.append((name, str(key["sha256"]), entry))
    # A name or a hash given twice (a hand edit): none of them is sent, whichever was meant.
    names = [name for name, _, _ in good]
    digests = [digest for _, digest, _ in good]
    doc: dict[str, Any] = {"classes": by_class, "keys": {}}
    for name, digest, entry in good:
        if names.count(name) > 1 or digests.count(digest) > 1:
            problems.append({"name": name, "problem": f"lab_app_keys: key {name}: given twice (revoke the old one first)"})
        else:
            doc["keys"][digest] = entry
    return doc, problems


def _key_entry(key: dict[str, Any], name: str, by_class: dict[str, list[str]],
               classes: list[dict[str, Any]]) -> tuple[dict[str, Any], str]:
    """A live record's entry in app-keys.json, or what is wrong with it ('' when nothing)."""
    if key.get("class") not in by_class:
        return {}, f"class {key.get('class')!r} does not exist (litellm_model_classes give: {', '.join(sorted(by_class)) or 'none'})"
    if not _SHA256.match(str(key.get("sha256", ""))):
        return {}, "sha256 is not 64 lowercase hex digits"
    for limit in LIMITS:
        value = key.get(limit)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            return {}, f"{limit} {value!r} is not a positive number"
    expires = key.get("expires")
    if expires is not None:
        try:
            zone = datetime.fromisoformat(str(expires)).tzinfo
        except ValueError:
            zone = None
        if zone is None:
            return {}, f"expires {expires!r} is not an ISO date-time with a zone"
    entry = {"name": name, "class": key["class"], "rpm": key.get("rpm"), "tpm": key.get("tpm"),
             "max_parallel": key.get("max_parallel"), "expires": expires}
    if key.get("models"):
        # Several models (lab_models): the rule `labctl keys add --model` applies too.
        reached, problem = key_models(key["models"], key["class"], classes)
        if problem:
            return {}, problem
        entry["models"] = reached
    return entry, ""


def labctl_app_keys_doc(keys: list[dict[str, Any]], classes: list[dict[str, Any]]) -> dict[str, Any]:
    """What the gateway's auth hook reads (app-keys.json): the public model names of each key class
    (litellm_model_classes' key_class), and per sha256 the keys that are not revoked (lab_app_keys,
    the control node's store: `labctl keys`). A bad record is left out, never the whole document
    (labctl_app_keys_problems names it): a class no model class carries, a malformed hash, a name
    or hash used twice, a limit (rpm, tpm, max_parallel) that is not positive, an expiry that is not
    an ISO date-time with a zone, models the lab does not serve (keys.key_models). A key left out
    gets 401, as a revoked one."""
    return _app_keys(keys, classes)[0]


def labctl_app_keys_problems(keys: list[dict[str, Any]], classes: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The live records labctl_app_keys_doc leaves out: per record its name and the problem, naming
    the key and never showing its hash (safe outside no_log)."""
    return _app_keys(keys, classes)[1]


def labctl_model_classes(models: list[dict[str, Any]], one_model: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """litellm_model_classes' default: ``one_model`` (the served name and its -batch) without
    lab_models; with it (lab_topology.models), per model and served name its interactive name at
    priority 0 and, when it has the batch class, <name>-batch at 10, each naming its model (the
    gateway routes a name to that model's replicas only): labctl.keys.public_names, which
    `labctl keys add --model` checks against too."""
    if not models:
        return list(one_model)
    return [{"name": n["name"], "priority": _CLASS_PRIORITY[n["key_class"]], "key_class": n["key_class"], "model": n["model"]}
            for n in public_names(models)]


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


def _virtual_key_settings(record: dict[str, Any], classes: list[dict[str, Any]], routes: list[str],
                          max_parallel: int) -> dict[str, Any]:
    """What a live store record decides of its virtual key: the models of its class, the model API's
    routes only, its limits (max_parallel: the record's or the gateway's default). Refuses a bad
    record (the role sends none: labctl_app_keys_problems names it)."""
    doc, problems = _app_keys([record], classes)
    if problems:
        raise AnsibleFilterError(problems[0]["problem"])
    entry: dict[str, Any] = next(iter(doc["keys"].values()))
    reached = entry.get("models") or doc["classes"][record["class"]]
    settings: dict[str, Any] = {"models": reached, "allowed_routes": list(routes),
                                "max_parallel_requests": record.get("max_parallel") or int(max_parallel)}
    for limit in ("rpm", "tpm"):
        if record.get(limit) is not None:
            settings[_LIMIT_FIELDS[limit]] = record[limit]
    return settings


def labctl_virtual_key_request(new: dict[str, Any], keys: list[dict[str, Any]], classes: list[dict[str, Any]],
                               now: str | None = None, *, routes: list[str] | None = None,
                               max_parallel: int = 1) -> dict[str, Any]:
    """The /key/generate body for a key `labctl keys add` just made (database mode): the key itself
    (new: name and key), its store record's class as the models it reaches, the model API's
    ``routes`` only (allowed_routes), its limits, and its expiry as a duration from now. Refuses a
    key the store does not hold, or whose hash differs."""

    problem = labctl_new_key_problem(new, keys)
    if problem:
        raise AnsibleFilterError(problem)
    name = str(new["name"])
    record = next(k for k in keys if k.get("name") == name and not k.get("revoked"))
    body: dict[str, Any] = {"key": new["key"], "key_alias": name, "metadata": {"labctl_key_class": record["class"]},
                            **_virtual_key_settings(record, classes, routes or [], max_parallel)}
    if record.get("expires"):
        start = datetime.fromisoformat(now) if now else datetime.now(UTC)
        seconds = int((datetime.fromisoformat(str(record["expires"])) - start).total_seconds())
        if seconds <= 0:
            raise AnsibleFilterError(f"lab_app_keys: key {name} expired at {record['expires']}")
        body["duration"] = f"{seconds}s"
    return body


def labctl_virtual_key_updates(lookups: list[dict[str, Any]], classes: list[dict[str, Any]], routes: list[str],
                               max_parallel: int) -> list[dict[str, Any]]:
    """The /key/update bodies that bring the live virtual keys to their store records (database mode):
    ``lookups`` are the /key/info answers (ansible.builtin.uri results looped over the live records,
    ``item`` the record); a key the database does not hold, or that already has its class's models,
    the model API's routes and its limits, needs none. Keys made before allowed_routes and
    max_parallel existed get them here. A bad record is left as the database has it
    (labctl_app_keys_problems names it)."""
    updates = []
    for lookup in lookups or []:
        if lookup.get("status") != 200:
            continue
        record = lookup["item"]
        if _app_keys([record], classes)[1]:
            continue
        info = ((lookup.get("json") or {}).get("info")) or {}
        wanted = _virtual_key_settings(record, classes, routes, max_parallel)
        differs = {field: value for field, value in wanted.items()
                   if (sorted(info.get(field) or []) if isinstance(value, list) else info.get(field))
                   != (sorted(value) if isinstance(value, list) else value)}
        if differs:
            updates.append({"key": record["sha256"], **differs})
    return updates


def labctl_gpu_health(endpoints: list[dict[str, Any]], topology: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each replica's GPUs and where its host's GPU fault latch is read (issue 39), by api_base (the
    deployment's, config.yaml): the host's node_exporter, textfile collector only (labctl_gpu_fault,
    labctl-node-metrics). A host without an exporter port is left out (its faults cannot be read)."""
    out: dict[str, dict[str, Any]] = {}
    for ep in endpoints:
        exporters = ((topology.get("hosts") or {}).get(ep.get("host")) or {}).get("exporters") or {}
        listen, port = str(exporters.get("listen") or ""), int(exporters.get("node_port") or 0)
        if not listen or not port:
            continue
        netloc = f"[{listen}]:{port}" if ":" in listen else f"{listen}:{port}"
        out[f"{ep['url']}/v1"] = {"url": f"http://{netloc}/metrics?collect%5B%5D=textfile",
                                  "gpus": [g.strip() for g in str(ep.get("gpus", "")).split(",") if g.strip()],
                                  "host": str(ep.get("host", ""))}
    return out


# The callbacks whose code decides who reaches what (labctl_readiness.py only routes).
_SECURITY_CODE = ("labctl_auth.py", "labctl_guard.py", "labctl_routes.py", "labctl_admission.py")
# Settings derived from the capacity or the queue, not from who may do what: a model added or removed changes them.
_NOT_SECURITY = {"labctl_auth.yaml": ("default_max_parallel",),
                 "labctl_admission.yaml": ("slots", "classes", "timeout", "retry_after", "max_hold"),
                 "labctl_guard.yaml": ("logprobs",),
                 "general_settings": ("max_in_flight_requests_per_worker", "max_queued_requests_per_worker",
                                      "admission_queue_timeout_seconds")}


def labctl_litellm_security_key(files: dict[str, str], classes: list[dict[str, Any]]) -> str:
    """The sha1 of what decides the gateway's security (issue 40): the auth, guard, route filter and gate code;
    their settings but those the capacity sets; config.yaml's general_settings (auth) but the queue sizes, its
    callbacks and /metrics auth; per key class, the priorities its names carry (config.yaml, labctl_admission.yaml)
    and their logprobs limits (labctl_guard.yaml); the admission floors and reserve. A change restarts the proxy
    (tasks/configure.yml), so no old worker serves with the old ones; a model added or removed, with the key
    classes it had, leaves it as it was (a reload)."""
    key_class = {str(c["name"]): str(c.get("key_class", "")) for c in classes}

    def settings(name: str) -> dict[str, Any]:
        loaded = yaml.safe_load(files[name]) or {}
        return {k: v for k, v in loaded.items() if k not in _NOT_SECURITY.get(name, ())}

    def per_class(pairs: list[tuple[str, Any]]) -> dict[str, list[str]]:
        out: dict[str, set[str]] = {}
        for name, value in pairs:
            out.setdefault(key_class.get(name, ""), set()).add(json.dumps(value, sort_keys=True))
        return {k: sorted(v) for k, v in out.items()}

    config = yaml.safe_load(files["config.yaml"])
    guard = yaml.safe_load(files["labctl_guard.yaml"]) or {}
    admission = yaml.safe_load(files["labctl_admission.yaml"]) or {}
    document = {
        "code": {name: files[name] for name in _SECURITY_CODE},
        "auth": settings("labctl_auth.yaml"),
        "guard": settings("labctl_guard.yaml"),
        "logprobs": per_class(list((guard.get("logprobs") or {}).items())),
        "routes": settings("labctl_routes.yaml"),
        "admission": settings("labctl_admission.yaml"),
        "gate_priorities": per_class(list((admission.get("classes") or {}).items())),
        "general_settings": {k: v for k, v in (config.get("general_settings") or {}).items()
                             if k not in _NOT_SECURITY["general_settings"]},
        "litellm_settings": {k: (config.get("litellm_settings") or {}).get(k)
                             for k in ("callbacks", "require_auth_for_metrics_endpoint")},
        "priorities": per_class([(str(d["model_name"]), (d.get("litellm_params") or {}).get("extra_body"))
                                 for d in config.get("model_list") or []]),
    }
    return hashlib.sha1(json.dumps(document, sort_keys=True).encode()).hexdigest()


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "labctl_gpu_health": labctl_gpu_health,
            "labctl_app_keys_doc": labctl_app_keys_doc,
            "labctl_app_keys_problems": labctl_app_keys_problems,
            "labctl_new_key_problem": labctl_new_key_problem,
            "labctl_virtual_key_request": labctl_virtual_key_request,
            "labctl_virtual_key_updates": labctl_virtual_key_updates,
            "labctl_class_floors": labctl_class_floors,
            "labctl_model_classes": labctl_model_classes,
            "labctl_litellm_security_key": labctl_litellm_security_key,
        }
