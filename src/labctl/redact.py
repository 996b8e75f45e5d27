"""Extra variables kept out of what labctl writes down: run records, the lock file, events, what is
kept of ansible-runner's artifacts (labctl.ansible_run). A value given with -e may be a password
(ansible-playbook -e 'x=secret'); only the variables' names stay, and an @file's path (the file is
the user's to protect). The process list still shows a -e value while the run lasts."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Sequence
from typing import Any

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


def extra_vars_values(args: Sequence[str]) -> list[str]:
    """The -e/--extra-vars values of an ansible-playbook argument list, in order, as given."""
    values: list[str] = []
    take = False
    for arg in args:
        if take:
            values.append(arg)
            take = False
        elif arg in _EXTRA:
            take = True
        elif arg.startswith("--extra-vars="):
            values.append(arg.split("=", 1)[1])
        elif arg.startswith("-e") and len(arg) > 2 and not arg.startswith("--"):
            values.append(arg[2:])
    return values


# ansible-core 2.19's default callback (which ansible-runner's awx_display extends) prints every
# CLI option at -vvvv, v2_playbook_on_start: "extra_vars: ('k=v', ...)", one line, the raw values.
_CLI_EXTRA_VARS = re.compile(r"^extra_vars: .*$", re.MULTILINE)


class Scrubber:
    """Takes the raw -e values of one ansible-playbook command line out of what it prints: the
    -vvvv dump of the CLI options (its extra_vars line, redacted as redact_argv does), and any
    -e value quoted whole (ansible-playbook's "Invalid extra vars data supplied. '...'"). An
    @file stays (a path). A variable a task prints is the task's to hide (no_log)."""

    def __init__(self, args: Sequence[str]) -> None:
        given = extra_vars_values(args)
        self.cli_line = "extra_vars: " + repr(tuple(redact_extra_vars(v) for v in given))
        raw = {v for v in given if v.strip() and not v.strip().startswith("@")}
        forms = raw | {repr(v)[1:-1] for v in raw} | {json.dumps(v)[1:-1] for v in raw}
        # Whole -e values only, not inside a longer word ("a=1" is no part of "data=10").
        self.forms = [(f, re.compile(r"(?<![A-Za-z0-9_])" + re.escape(f)))
                      for f in sorted((f for f in forms if f), key=len, reverse=True)]

    def text(self, text: str) -> str:
        if "extra_vars: " in text:
            text = _CLI_EXTRA_VARS.sub(lambda _m: self.cli_line, text)
        for form, pattern in self.forms:
            if form in text:
                text = pattern.sub(MASK, text)
        return text

    def data(self, value: Any) -> Any:
        """An event (any JSON-like value) with every string scrubbed."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {k: self.data(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.data(v) for v in value]
        return value


def kept_command(data: Any) -> dict[str, Any] | None:
    """What is kept of ansible-runner's artifacts/<id>/command (Runner.run writes the command line,
    cwd and the whole environment of labctl's process): the command with its -e values redacted
    and the cwd. Not the environment: it may hold tokens (None for a file that is not one)."""
    if not isinstance(data, dict) or not isinstance(data.get("command"), list):
        return None
    return {"command": redact_argv([str(a) for a in data["command"]]), "cwd": data.get("cwd")}
