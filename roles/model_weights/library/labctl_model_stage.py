#!/usr/bin/python
"""Ansible module: stage one model revision (resumable copy, sha256 verification, verified stamp)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: labctl_model_stage
short_description: Stage a model revision resumably and verify it against its SHA256SUMS
description:
  - Copies the files a C(SHA256SUMS) lists (sha256sum format, paths relative to the revision
    directory) from O(src) into a partial directory beside O(dest) (C(.partial-<revision>)),
    hashing every byte while it is copied, and renames the partial directory to O(dest) only when
    every file matches. Files are copied in parallel (O(workers)).
  - B(Resumable.) Each completed file is recorded in a journal inside the partial directory (size,
    mtime, inode and the sha256 computed while copying). A re-run after an interruption skips
    recorded files whose size, mtime and inode are unchanged, and continues a file that was cut
    off mid-copy from its current size (the existing prefix is hashed, the rest appended).
    Journal entries written before a reboot are hashed again before they are trusted (data that
    was only in the page cache may not have reached the disk).
  - B(Verified.) A file that does not match C(SHA256SUMS) fails the run naming the file with the
    expected and the found sha256; it is deleted from the partial directory and left out of the
    journal, so a re-run copies only that file again. Nothing is renamed into place.
  - B(Stamped.) Before the rename, every file is flushed to disk and C(.labctl-verified.json) is
    written into the revision (size, mtime and inode of every file, the sha256 of the
    C(SHA256SUMS) it was verified against, and when it was verified). A re-run on a staged
    revision compares only that (no file is read) with O(verify=quick); O(verify=full) hashes
    every file again and fails naming any file that changed.
  - With O(state=current) the module only records in the stamp that the revision just became
    current (the caller switched the C(current) link); callers prune older revisions by that time.
  - Long runs write their progress (bytes done, rate, time left) to O(progress_file) about once a
    second, for a poller (the C(labctl_progress) action) while the module runs with C(async).
  - One staging run per model directory at a time (C(flock) on C(.labctl-stage.lock)); a second
    run waits for the first and then finds its work done or resumes it.
  - Standard library only; Python 3.8 or later on the target.
options:
  src:
    description:
      - Source revision directory (with C(SHA256SUMS)) on the host the module runs on. May be the
        partial directory itself (files pushed there by rsync); then the files are hashed in place.
      - Not needed when O(dest) is already staged.
    type: path
  dest:
    description: The revision directory to create, C(<root>/<name>/<revision>).
    type: path
    required: true
  state:
    description: C(staged) stages and verifies; C(current) records that O(dest) just became current.
    type: str
    choices: [staged, current]
    default: staged
  verify:
    description: For a staged revision, C(quick) compares the stamp with the files' metadata; C(full) hashes every file.
    type: str
    choices: [quick, full]
    default: quick
  workers:
    description: Files copied or hashed in parallel.
    type: int
    default: 4
  owner:
    description: Owner of the staged files and directories.
    type: str
    default: root
  group:
    description: Group of the staged files and directories.
    type: str
    default: root
  progress_file:
    description: JSON file the progress is written to about once a second (empty for none).
    type: path
    default: ""
  label:
    description: Name of the revision in messages (default C(<name> <revision>) from O(dest)).
    type: str
    default: ""
  bwlimit:
    description: Copy at most this many MiB/s in total (0 = no limit), e.g. to spare a shared NFS server.
    type: int
    default: 0
author:
  - labctl maintainers
"""

EXAMPLES = r"""
- name: Stage gpt-oss-120b r1 from the bundle
  labctl_model_stage:
    src: /srv/labctl/bundle/models/gpt-oss-120b/r1
    dest: /srv/models/gpt-oss-120b/r1
    progress_file: /run/labctl/model-stage-gpt-oss-120b.json
  async: 14400
  poll: 0
  register: stage_job
"""

RETURN = r"""
revision_dir:
  description: The revision directory.
  returned: always
  type: str
staged:
  description: This run copied or completed the revision and renamed it into place.
  returned: always
  type: bool
verification:
  description: How the files were checked this run (copy = hashed while copied, quick = stamp, full = hashed again).
  returned: success
  type: str
files:
  description: Files in the revision.
  returned: success
  type: int
bytes_total:
  description: Size of the revision.
  returned: success
  type: int
bytes_copied:
  description: Bytes copied this run.
  returned: success
  type: int
bytes_resumed:
  description: Bytes of cut-off files kept from an earlier run (hashed, not copied again).
  returned: success
  type: int
bytes_skipped:
  description: Bytes of files completed by an earlier run (not copied again).
  returned: success
  type: int
bytes_hashed:
  description: Bytes read only to hash them (kept prefixes, files from before a reboot, full verification).
  returned: success
  type: int
bytes_read:
  description: Every byte this run read from a model file (bytes_copied + bytes_hashed); 0 for a quick re-run.
  returned: success
  type: int
problems:
  description: Files that failed (path, problem, expected, found).
  returned: always
  type: list
revisions:
  description: Revisions in the model directory, most recently current first (revision, path, stamped, verified_at, current_since, bytes).
  returned: success
  type: list
partials:
  description: Unfinished partial directories in the model directory.
  returned: success
  type: list
"""

import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.labctl.progress import human_bytes, human_rate
from ansible.module_utils.labctl.stage_files import StageError
from ansible.module_utils.labctl.stager import Stager


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "src": {"type": "path"},
            "dest": {"type": "path", "required": True},
            "state": {"type": "str", "choices": ["staged", "current"], "default": "staged"},
            "verify": {"type": "str", "choices": ["quick", "full"], "default": "quick"},
            "workers": {"type": "int", "default": 4},
            "owner": {"type": "str", "default": "root"},
            "group": {"type": "str", "default": "root"},
            "progress_file": {"type": "path", "default": ""},
            "label": {"type": "str", "default": ""},
            "bwlimit": {"type": "int", "default": 0},
        },
        supports_check_mode=True,
    )
    started = time.monotonic()
    stager = None
    try:
        stager = Stager(module)
        stager.progress.start()
        if module.params["state"] == "current":
            msg = stager.mark_current()
            revisions, partials = stager.listing()
            stager.progress.stop.set()
            module.exit_json(changed=stager.changed, msg=msg, revision_dir=stager.dest, staged=False, problems=[],
                             revisions=revisions, partials=partials)
        msg = stager.run()
    except StageError as exc:
        if stager is not None:
            stager.progress.finish("failed", exc.msg)
        module.fail_json(msg=exc.msg, problems=exc.problems, revision_dir=module.params["dest"], staged=False,
                         **(stager.counts if stager else {}))
    except OSError as exc:
        text = "%s: %s" % (exc.filename, exc.strerror) if exc.filename else str(exc)
        msg = "%s: staging failed: %s" % (stager.label if stager else module.params["dest"], text)
        if stager is not None:
            stager.progress.finish("failed", msg)
        module.fail_json(msg=msg, problems=[], revision_dir=module.params["dest"], staged=False)
    took = time.monotonic() - started
    counts = stager.counts
    bytes_read = counts["bytes_copied"] + counts["bytes_hashed"]
    if bytes_read and took > 0:
        msg += "; %s read in %.1f s (%s)" % (human_bytes(bytes_read), took, human_rate(bytes_read / took))
    if stager.waited > 1:
        msg += "; waited %.0f s for another staging run" % stager.waited
    stager.progress.finish("done", msg)
    for warning in stager.warnings:
        module.warn(warning)
    revisions, partials = stager.listing()
    module.exit_json(
        changed=stager.changed,
        msg=msg,
        revision_dir=stager.dest,
        staged=stager.staged and not module.check_mode,
        verification=stager.verification,
        files=stager.files,
        bytes_total=stager.bytes_total,
        bytes_read=bytes_read,
        duration_s=round(took, 3),
        waited_s=round(stager.waited, 3),
        problems=[],
        revisions=revisions,
        partials=[p for p in partials if p != stager.partial or module.check_mode],
        **counts
    )


if __name__ == "__main__":
    main()
