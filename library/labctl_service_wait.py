#!/usr/bin/python
"""Ansible module: wait until a systemd service answers over HTTP; fail early if it dies."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: labctl_service_wait
short_description: Wait until a systemd service answers its health URLs, failing early when it dies
description:
  - Polls O(url) + each of O(paths) until every one answers 200 and, with O(model_name), until
    C(/v1/models) lists that name (an OpenAI-compatible server such as vLLM).
  - Watches the unit while it waits. When the unit fails, stops, or restarts itself (systemd's
    C(NRestarts) grows), the module fails at once with the error lines of the unit's journal and
    its last lines, instead of waiting out O(timeout) (a cold start of a large model takes
    15 minutes; a typo in a flag should not).
  - A unit that is inactive with a start job queued (systemd's C(Job); the job waits for a unit it is
    ordered C(After=), such as the replica before it on a shared GPU) is still starting: waited for.
  - Read-only: reports C(changed=false). Standard library only.
options:
  unit:
    description: The systemd unit, e.g. C(vllm@0.service).
    type: str
    required: true
  url:
    description: Base URL, e.g. C(http://127.0.0.1:8000).
    type: str
    required: true
  ca_file:
    description: CA certificate that must have signed an https O(url)'s certificate (else the system's).
    type: path
  paths:
    description: Paths that must answer 200, in order.
    type: list
    elements: str
    default: [/health]
  model_name:
    description: A name C(/v1/models) must list.
    type: str
  api_key:
    description:
      - Bearer token for C(/v1/models) (a vLLM replica started with an API key guards C(/v1); its
        C(/health) and C(/metrics) stay open). Never logged.
    type: str
  timeout:
    description: Seconds to wait in all.
    type: int
    default: 1200
  interval:
    description: Seconds between polls.
    type: float
    default: 5
author: labctl maintainers
"""

EXAMPLES = r"""
- name: Wait until replica 0 serves
  labctl_service_wait:
    unit: vllm@0.service
    url: http://127.0.0.1:8000
    model_name: gpt-oss-120b-gpu01-0
"""

RETURN = r"""
seconds:
  description: How long the wait took.
  returned: success
  type: float
pid:
  description: The unit's main PID once healthy.
  returned: success
  type: int
"""

import json
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from typing import Any

from ansible.module_utils.basic import AnsibleModule


def unit_state(unit: str) -> tuple[str, int, int, bool]:
    """ActiveState, NRestarts, MainPID, and whether a job (a queued start) is pending for the unit."""
    out = subprocess.run(
        ["systemctl", "show", "-p", "ActiveState", "-p", "NRestarts", "-p", "MainPID", "-p", "Job", unit],
        capture_output=True, text=True, check=False,
    ).stdout
    props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return (props.get("ActiveState", "unknown"), int(props.get("NRestarts") or 0), int(props.get("MainPID") or 0),
            bool(props.get("Job", "").strip()))


def gave_up(state: str, queued: bool, restarts_before: int, restarts_now: int) -> bool:
    """Whether the unit stopped trying: failed, restarted itself, or inactive with no start queued (an
    inactive unit whose start job waits for a unit it is ordered after is still starting)."""
    return state == "failed" or (state == "inactive" and not queued) or restarts_now > restarts_before


def journal(unit: str) -> tuple[list[str], list[str]]:
    """The errors of the unit's recent log (the root cause is rarely the last line), then its end."""
    lines = subprocess.run(
        ["journalctl", "-u", unit, "-n", "400", "--no-pager", "-o", "cat"], capture_output=True, text=True, check=False
    ).stdout.splitlines()
    errors = [line for line in lines if "Error:" in line or " ERROR " in line]
    errors = list(dict.fromkeys(line.split("] ", 1)[-1] for line in errors))[-6:]
    return errors, lines[-8:]


def get(url: str, timeout: float, context: ssl.SSLContext | None = None, api_key: str | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url)
    if api_key:  # to this URL only: urllib carries a header added otherwise to any redirect's target (Issue 40)
        request.add_unredirected_header("Authorization", f"Bearer {api_key}")
    with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
        return response.status, response.read()


def probe(params: dict[str, Any], context: ssl.SSLContext | None = None) -> str | None:
    """None when healthy, else what is missing."""
    for path in params["paths"]:
        status, _ = get(params["url"] + path, 10, context)
        if status != 200:
            return f"{path} answered {status}"
    if params["model_name"]:
        _, body = get(params["url"] + "/v1/models", 10, context, params["api_key"])
        names = [model.get("id") for model in json.loads(body).get("data", [])]
        if params["model_name"] not in names:
            return f"/v1/models lists {names}, not {params['model_name']}"
    return None


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "unit": {"type": "str", "required": True},
            "url": {"type": "str", "required": True},
            "paths": {"type": "list", "elements": "str", "default": ["/health"]},
            "ca_file": {"type": "path"},
            "model_name": {"type": "str"},
            "api_key": {"type": "str", "no_log": True},
            "timeout": {"type": "int", "default": 1200},
            "interval": {"type": "float", "default": 5},
        },
        supports_check_mode=True,
    )
    params = module.params
    unit = params["unit"]
    if module.check_mode:
        module.exit_json(changed=False, skipped=True, msg="check mode: not waiting")
    # https: the certificate must chain to ca_file and carry the URL's host name (or address).
    context = ssl.create_default_context(cafile=params["ca_file"]) if params["ca_file"] else None
    started = time.monotonic()
    _, restarts, _, _ = unit_state(unit)
    last = "no answer yet"
    while time.monotonic() - started < params["timeout"]:
        state, now_restarts, pid, queued = unit_state(unit)
        if gave_up(state, queued, restarts, now_restarts):
            errors, tail = journal(unit)
            module.fail_json(
                msg=f"{unit} is {state} (it restarted itself {now_restarts - restarts} time(s)) while starting: "
                + (" | ".join(errors) or "see its journal"),
                journal_errors=errors, journal_tail=tail,
            )
        try:
            missing = probe(params, context)
        except urllib.error.HTTPError as exc:
            if exc.code in (401, 403):  # waiting does not change the key: say so now
                module.fail_json(msg=f"{unit}: {exc.url} answered {exc.code}: the service refuses "
                                 + ("the API key it was given" if params["api_key"] else "requests without an API key"))
            missing = str(exc)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            missing = str(exc)
        if missing is None:
            module.exit_json(changed=False, seconds=round(time.monotonic() - started, 1), pid=pid)
        last = missing
        time.sleep(params["interval"])
    errors, tail = journal(unit)
    module.fail_json(msg=f"{unit}: not healthy after {params['timeout']} s ({last})", journal_errors=errors, journal_tail=tail)


if __name__ == "__main__":
    main()
