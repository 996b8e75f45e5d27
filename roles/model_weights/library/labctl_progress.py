#!/usr/bin/python
"""Documentation of the labctl_progress action plugin (action_plugins/labctl_progress.py), which alone
runs and checks the arguments."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: labctl_progress
short_description: Report the progress of a running async job, one line per call
description:
  - An action plugin (runs on the control node). Each call waits up to O(wait) seconds for the
    async job O(jid) (C(async_status) on the target, checked every second); when the job finished
    it returns the job's own result (C(failed), C(msg) and every value the module returned) with
    C(finished=true) and removes the job's results file (O(cleanup)).
  - "While the job runs it returns C(finished=false) and C(msg), the progress line the job last
    wrote to O(path) on the target (read with C(slurp)), e.g.
    C(gpt-oss-120b r1: 12.3 GiB of 61.0 GiB copied, 410 MiB/s, 2 min left) and the files done."
  - Use it with C(until) on C(finished), C(retries) and C(delay=0). The result carries
    C(_ansible_verbose_always), so the default callback prints every retry's line without C(-v).
  - This file only documents the arguments (for ansible-doc and ansible-lint); the action plugin
    validates them. Running it as a module fails.
options:
  jid:
    description: The async job id (C(ansible_job_id) of the task started with C(async) and C(poll=0)).
    type: str
    required: true
  path:
    description: The JSON progress file the job writes on the target (with a C(msg) key).
    type: str
    default: ""
  label:
    description: Name of the job in messages before its first progress line.
    type: str
    default: ""
  wait:
    description: Seconds to wait for the job in one call before reporting progress.
    type: int
    default: 5
  cleanup:
    description: Remove the job's results file once it finished.
    type: bool
    default: true
author:
  - labctl maintainers
"""

EXAMPLES = r"""
- name: Stage the weights in the background
  labctl_model_stage:
    src: /srv/labctl/bundle/models/gpt-oss-120b/r1
    dest: /srv/models/gpt-oss-120b/r1
    progress_file: /run/labctl/model-stage-gpt-oss-120b.json
  async: 14400
  poll: 0
  register: stage_job

- name: Stage gpt-oss-120b r1 (one progress line every 10 s)
  labctl_progress:
    jid: "{{ stage_job.ansible_job_id }}"
    path: /run/labctl/model-stage-gpt-oss-120b.json
    wait: 10
  register: stage
  until: stage.finished
  retries: 1440
  delay: 0
"""

RETURN = r"""
finished:
  description: Whether the job finished (its own result is merged in then).
  returned: always
  type: bool
msg:
  description: The progress line while running; the job's message once finished.
  returned: always
  type: str
ansible_job_id:
  description: The job id.
  returned: always
  type: str
"""

if __name__ == "__main__":
    import json
    import sys

    print(json.dumps({"failed": True, "msg": "labctl_progress is an action plugin (action_plugins/labctl_progress.py); "
                                              "add action_plugins to the Ansible configuration"}))
    sys.exit(1)
