#!/usr/bin/python
"""Ansible module: verify a labctl offline bundle (signature, hashes, extra files)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: labctl_bundle_verify
short_description: Verify a labctl offline bundle before it is used
description:
  - Checks the detached signature of C(manifest.json) with the bundle's public key (gpgv),
    optionally against a pinned key fingerprint, then the size and sha256 of every file the
    manifest lists, and reports files that are missing, modified or not listed.
  - Read-only. Fails with one line per problem, each naming the file.
  - The checks are the ones C(labctl bundle verify) runs (shared code: labctl.module_utils.verifycore).
options:
  path:
    description: Bundle directory on the host the module runs on.
    type: path
    required: true
  fingerprint:
    description: Expected signing key fingerprint (40 hex digits). Empty accepts the bundle's own key.
    type: str
    default: ""
  check_extra:
    description: Report files present in the bundle but absent from the manifest.
    type: bool
    default: true
  workers:
    description: Files hashed in parallel.
    type: int
    default: 4
  stamp_dir:
    description:
      - Directory for the record of the last good verification of each bundle (one file per content
        digest, 0600 in a 0700 directory). A file whose size, mtime, ctime, inode and device are the
        recorded ones is not hashed again; the signature, the manifest, sizes, missing and extra
        files are checked every time. Empty hashes every file and records nothing.
      - Not written in check mode.
    type: path
    default: ""
  rehash:
    description: Hash every file even when it matches the record in I(stamp_dir) (which is then renewed).
    type: bool
    default: false
author:
  - labctl maintainers
"""

EXAMPLES = r"""
- name: Verify the bundle on the target
  labctl_bundle_verify:
    path: /srv/labctl/bundle
    fingerprint: "{{ lab_bundle_fingerprint }}"
"""

RETURN = r"""
target:
  description: The manifest's target platform (os, release, codename, arch, python).
  returned: success
  type: dict
content_digest:
  description: Digest over the bundle's content files.
  returned: success
  type: str
fingerprint:
  description: Fingerprint of the key that signed the manifest.
  returned: success
  type: str
files:
  description: Number of files verified.
  returned: success
  type: int
hashed:
  description: Number of files whose content was hashed in this run (the others matched the stamp).
  returned: success
  type: int
problems:
  description: Every problem found (kind, path, detail).
  returned: always
  type: list
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.labctl.verifycore import verify_bundle, write_stamp


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "fingerprint": {"type": "str", "default": ""},
            "check_extra": {"type": "bool", "default": True},
            "workers": {"type": "int", "default": 4},
            "stamp_dir": {"type": "path", "default": ""},
            "rehash": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    path = module.params["path"]
    if not os.path.isdir(path):
        module.fail_json(msg=f"bundle directory {path} does not exist", problems=[])
    gpgv = module.get_bin_path("gpgv", required=True)
    report = verify_bundle(
        path,
        trusted_fingerprint=module.params["fingerprint"] or None,
        check_extra=module.params["check_extra"],
        workers=module.params["workers"],
        gpgv=gpgv,
        stamp_dir=None if module.params["rehash"] else (module.params["stamp_dir"] or None),
    )
    problems = [p.message() for p in report.problems]
    if not report.ok:
        module.fail_json(
            msg=f"bundle {path} failed verification ({len(problems)} problem(s)): " + "; ".join(problems),
            problems=[vars(p) for p in report.problems],
        )
    # Nothing hashed: every file matched the record, which stays as it is.
    if module.params["stamp_dir"] and not module.check_mode and (report.files_hashed or module.params["rehash"]):
        try:
            write_stamp(module.params["stamp_dir"], report)
        except OSError as exc:
            module.warn(f"could not record the verification in {module.params['stamp_dir']}: {exc}; "
                        "the next run hashes every file again")
    manifest = report.manifest or {}
    module.exit_json(
        changed=False,
        target=manifest.get("target", {}),
        content_digest=manifest.get("content_digest", ""),
        fingerprint=report.fingerprint,
        files=len(manifest.get("files", [])),
        hashed=report.files_hashed,
        profile=manifest.get("profile", ""),
        components=sorted(manifest.get("components", {})),
        problems=[],
    )


if __name__ == "__main__":
    main()
