"""Extra variables kept out of what labctl writes down: run records, the lock file, ansible-runner's
artifacts. A value given with -e may be a password (ansible-playbook -e 'x=secret'); only the
variables' names stay, and an @file's path (the file is the user's to protect)."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Sequence
from pathlib import Path

MASK = "<redacted>"
_EXTRA = ("-e", "--extra-vars")


def redact_extra_vars(value: str) -> str:
    """One -e value with every value masked: key=value pairs keep their keys, JSON/YAML mappings
    their top-level keys; @file stays as given."""
    text = value.strip()
    if text.startswith("@"):
        return value
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except ValueError:
            return MASK
        return json.dumps({str(k): MASK for k in data}) if isinstance(data, dict) else MASK
    try:
        words = shlex.split(text)
    except ValueError:
        return MASK
    pairs = [w.split("=", 1)[0] for w in words if "=" in w]
    if pairs and len(pairs) == len(words) and all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) for k in pairs):
        return " ".join(f"{k}={MASK}" for k in pairs)
    return MASK


def redact_argv(argv: Sequence[str]) -> list[str]:
    """argv with every -e/--extra-vars value (either spelling, separate or joined) redacted."""
    out: list[str] = []
    take = False
    for arg in argv:
        if take:
            out.append(redact_extra_vars(arg))
            take = False
        elif arg in _EXTRA:
            out.append(arg)
            take = True
        elif arg.startswith("--extra-vars="):
            out.append("--extra-vars=" + redact_extra_vars(arg.split("=", 1)[1]))
        elif arg.startswith("-e") and len(arg) > 2 and not arg.startswith("--"):
            out.append("-e" + redact_extra_vars(arg[2:]))
        else:
            out.append(arg)
    return out


def scrub_runner_artifacts(private_dir: Path) -> None:
    """ansible-runner writes the whole command line to artifacts/<id>/command: redact it there."""
    for path in private_dir.glob("artifacts/*/command"):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            path.unlink(missing_ok=True)
            continue
        if isinstance(data, dict) and isinstance(data.get("command"), list):
            data["command"] = redact_argv([str(a) for a in data["command"]])
            path.write_text(json.dumps(data), encoding="utf-8")
        else:
            path.unlink(missing_ok=True)
