"""Preflight's filters: the variables the inventory gives against every role's argument spec (in one
pass: one task, not three per role), variable names that are typos of declared ones, and the bundle manifest
(is the served model there, are the tiktoken files the ones openai-harmony pins, how many bytes
of the model the target still has to receive).

The manifest is not verified yet when preflight reads it: the airgap layer then checks every file
against it and its signature, so what preflight concludes from the manifest holds for the files.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from typing import Any

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator


def _files(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    files = manifest.get("files") if isinstance(manifest, dict) else None
    return [f for f in files or [] if isinstance(f, dict) and isinstance(f.get("path"), str)]


def _model_files(manifest: dict[str, Any], name: str, revision: str) -> list[dict[str, Any]]:
    prefix = f"models/{name}/{revision}/"
    return [f for f in _files(manifest) if f["path"].startswith(prefix)]


def labctl_preflight_bundle_models(manifest: dict[str, Any]) -> list[str]:
    """'name revision' of every model revision the bundle carries files for."""
    found = {tuple(f["path"].split("/")[1:3]) for f in _files(manifest) if f["path"].count("/") >= 3 and f["path"].startswith("models/")}
    return [f"{name} {revision}" for name, revision in sorted(found)]


def labctl_preflight_model_problems(manifest: dict[str, Any], name: str, revision: str, bundle: str,
                                    source: str = "lab_model_name, lab_model_revision") -> list[str]:
    """A problem when the bundle has no file of models/<name>/<revision>/ (``source``: the variables
    that asked for it)."""
    if not name or _model_files(manifest, name, revision):
        return []
    carried = ", ".join(labctl_preflight_bundle_models(manifest)) or "no model at all"
    return [
        (f"the bundle {bundle} has no model {name} revision {revision} ({source}):"
        f" it carries {carried}; rebuild the bundle with this model (profile section models:) or serve one it carries")
    ]


def labctl_preflight_tiktoken_problems(manifest: dict[str, Any], encodings: list[str], known: dict[str, Any], bundle: str) -> list[str]:
    """A problem per encoding the bundle lacks, or carries with other content than harmony pins."""
    by_path = {f["path"]: f for f in _files(manifest)}
    problems = []
    for encoding in encodings:
        path = f"tiktoken/{encoding}.tiktoken"
        entry = by_path.get(path)
        if encoding not in known:
            problems.append(f"tiktoken_cache_encodings: {encoding} is not an encoding harmony knows ({', '.join(sorted(known))})")
        elif entry is None:
            problems.append(f"the bundle {bundle} has no {path} (tiktoken_cache_encodings): rebuild it with the tiktoken section")
        elif str(entry.get("sha256", "")).lower() != str(known[encoding]["sha256"]).lower():
            problems.append(
                f"the bundle {bundle} has a wrong {path}: sha256 {entry.get('sha256')}, but openai-harmony expects"
                f" {known[encoding]['sha256']}; rebuild the bundle from a good source"
            )
    return problems


def labctl_preflight_model_bytes(manifest: dict[str, Any], name: str, revision: str, present: list[str]) -> int:
    """Bytes of models/<name>/<revision>/ the target still lacks. `present` holds 'relative/path size'
    lines for the files already in the revision directory (find -printf '%P %s'); a file there
    with the manifest's size counts as staged."""
    have = {line.strip() for line in present}
    prefix = len(f"models/{name}/{revision}/")
    return sum(int(f.get("size", 0)) for f in _model_files(manifest, name, revision) if f"{f['path'][prefix:]} {f.get('size')}" not in have)


def labctl_preflight_models_bytes(manifest: dict[str, Any], models: list[dict[str, Any]], present: list[str]) -> int:
    """labctl_preflight_model_bytes summed over ``models`` (name, revision), ``present`` holding
    '<name>/<revision>/<relative path> <size>' lines for the files already staged."""
    total = 0
    for model in models:
        prefix = f"{model['name']}/{model['revision']}/"
        mine = [line.strip()[len(prefix):] for line in present if line.strip().startswith(prefix)]
        total += labctl_preflight_model_bytes(manifest, str(model["name"]), str(model["revision"]), mine)
    return total


_NAME = re.compile(r"^[a-z][a-z0-9]*(?:_[a-z0-9]+)+$")
# Ansible's own and the magic variables are nobody's typo.
_NOT_OURS = ("ansible_", "inventory_", "playbook_", "group_", "role_", "molecule_", "omit")


def labctl_preflight_misspelled(names: list[str], known: list[str], prefixes: list[str]) -> list[str]:
    """Variables that carry none of the checked prefixes (lab_ and each role's) but are so close to
    a declared variable that they are a typo of it: 'vlm_replicas' for 'vllm_replicas'. (A name with
    a known prefix is checked against that role's argument spec instead.)"""
    problems = []
    for name in sorted(set(names)):
        if not _NAME.match(name) or name.startswith(_NOT_OURS) or name.startswith(tuple(prefixes)) or name in known:
            continue
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.85)
        if close:
            problems.append(f"unknown variable {name} (did you mean {close[0]}?)")
    return problems


def _plain(value: Any) -> Any:
    """A value as plain dicts and lists: the validator deep-copies what it checks, and a deep copy of
    ansible-core 2.19's lazily templated containers cost about 5 s in site.yml (lab_topology)."""
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def labctl_preflight_variable_problems(given: dict[str, Any], specs: dict[str, dict[str, Any]], names: list[str]) -> list[str]:
    """Every problem with the variables the inventory and extra vars give (`given`: name -> value), for
    each prefix in `specs` ("lab" and each role, mapped to its argument spec's options):
      - the values checked against the spec (types, choices, elements), as validate_argument_spec does,
        with `required` dropped (the role's defaults fill those in when it runs);
      - names with the prefix that the spec lacks, with the closest declared name;
    and, over all of `names` (every host variable), names that miss every prefix but are a typo of a
    declared name (labctl_preflight_misspelled)."""
    problems: list[str] = []
    known: list[str] = []
    for role, options in specs.items():
        prefix = role + "_"
        mine = {k: _plain(v) for k, v in given.items() if k.startswith(prefix)}
        optional = {name: {k: v for k, v in spec.items() if k != "required"} for name, spec in options.items()}
        problems += ArgumentSpecValidator(optional).validate(mine, validate_role_argument_spec=True).error_messages
        declared = sorted(options)
        for name in sorted(n for n in mine if n not in options):
            close = difflib.get_close_matches(name, declared, n=1)
            problems.append(f"unknown variable {name}" + (f" (did you mean {close[0]}?)" if close else ""))
        known += declared
    return problems + labctl_preflight_misspelled(names, known, [role + "_" for role in specs])


class FilterModule:
    """Preflight's bundle filters."""

    def filters(self) -> dict[str, Any]:
        return {
            "labctl_preflight_bundle_models": labctl_preflight_bundle_models,
            "labctl_preflight_models_bytes": labctl_preflight_models_bytes,
            "labctl_preflight_model_problems": labctl_preflight_model_problems,
            "labctl_preflight_tiktoken_problems": labctl_preflight_tiktoken_problems,
            "labctl_preflight_model_bytes": labctl_preflight_model_bytes,
            "labctl_preflight_misspelled": labctl_preflight_misspelled,
            "labctl_preflight_variable_problems": labctl_preflight_variable_problems,
        }
