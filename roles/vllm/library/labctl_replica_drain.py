#!/usr/bin/python
"""Ansible module: wait until a vLLM replica has no running or waiting request."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: labctl_replica_drain
short_description: Wait until a vLLM replica's requests have finished
description:
  - Reads the replica's C(/metrics) every O(interval) seconds and sums C(vllm:num_requests_running)
    and C(vllm:num_requests_waiting) (every label set) until the sum is 0 or O(timeout) has passed.
  - Meant to run once the gateways route around the replica (a drain marker): then nothing new
    arrives and what is there finishes.
  - Never fails on a busy replica: after O(timeout) it returns C(drained=false) and the count, and
    the caller restarts anyway. A replica that does not answer has nothing in flight.
  - Read-only: reports C(changed=false). Standard library only.
options:
  url:
    description: Base URL of the replica, e.g. C(http://127.0.0.1:8000).
    type: str
    required: true
  ca_file:
    description:
      - CA certificate that must have signed an https O(url)'s certificate (else the system's).
      - A certificate that does not chain to it fails the module (it is not a replica without requests).
    type: path
  timeout:
    description: Seconds to wait in all; 0 reads once.
    type: int
    default: 300
  grace:
    description: Seconds to wait before the first read.
    type: float
    default: 0
  interval:
    description: Seconds between reads.
    type: float
    default: 1
author: labctl maintainers
"""

EXAMPLES = r"""
- name: Let replica 0 finish its requests
  labctl_replica_drain:
    url: http://127.0.0.1:8000
    timeout: 300
"""

RETURN = r"""
drained:
  description: Whether the replica had no running or waiting request (or did not answer).
  returned: always
  type: bool
in_flight:
  description: Running plus waiting requests at the last read (0 when it did not answer).
  returned: always
  type: int
seconds:
  description: How long the wait took.
  returned: always
  type: float
"""

import ssl
import time
import urllib.error
import urllib.request

from ansible.module_utils.basic import AnsibleModule

GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")


def in_flight(text: str) -> int:
    """Sum of the running and waiting gauges in a Prometheus text exposition."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in GAUGES:
            total += float(line.rsplit(" ", 1)[-1])
    return int(total)


def read(url: str, context: ssl.SSLContext | None = None) -> int | None:
    """Requests in flight, or None when the replica does not answer. A certificate that does not
    chain to the CA raises ssl.SSLCertVerificationError: the replica answered, and what it holds
    is unknown."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=10, context=context) as response:
            return in_flight(response.read().decode(errors="replace"))
    except ssl.SSLCertVerificationError:
        raise
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, ssl.SSLCertVerificationError):
            raise exc.reason from exc
        return None
    except (OSError, ValueError):
        return None


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "required": True},
            "ca_file": {"type": "path"},
            "timeout": {"type": "int", "default": 300},
            "grace": {"type": "float", "default": 0},
            "interval": {"type": "float", "default": 1},
        },
        supports_check_mode=True,
    )
    params = module.params
    if module.check_mode:
        module.exit_json(changed=False, drained=True, in_flight=0, seconds=0.0, msg="check mode: not waiting")
    # https: the certificate must chain to ca_file and carry the URL's host name (or address).
    context = ssl.create_default_context(cafile=params["ca_file"]) if params["ca_file"] else None
    started = time.monotonic()
    time.sleep(params["grace"])
    while True:
        try:
            count = read(params["url"].rstrip("/"), context)
        except ssl.SSLCertVerificationError as exc:
            module.fail_json(msg=f"{params['url']}: its certificate is refused ({exc.verify_message}): it must chain to "
                             f"ca_file ({params['ca_file'] or 'the system CAs'}) and name the URL's address")
        if not count:
            module.exit_json(changed=False, drained=True, in_flight=0, seconds=round(time.monotonic() - started, 1),
                             answered=count is not None)
        if time.monotonic() - started >= params["grace"] + params["timeout"]:
            module.exit_json(changed=False, drained=False, in_flight=count, seconds=round(time.monotonic() - started, 1),
                             answered=True)
        time.sleep(params["interval"])


if __name__ == "__main__":
    main()
