#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module: read the UEFI Secure Boot state and whether a module-signing key is enrolled."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: labctl_secure_boot
short_description: Report UEFI Secure Boot and the enrolment of a kernel-module signing key
description:
  - Reads the C(SecureBoot) variable of the EFI global namespace from efivarfs (4 bytes of
    attributes, then the value; 1 means on). No EFI (a BIOS boot, a container) means no Secure Boot.
  - With O(key), asks C(mokutil --test-key KEY) whether that certificate is enrolled in the MOK
    list (DKMS signs the NVIDIA modules with it; the kernel then loads them with Secure Boot on).
  - Read-only, standard library only.
options:
  efivars_dir:
    description: Where efivarfs is mounted.
    type: path
    default: /sys/firmware/efi/efivars
  key:
    description: A DER certificate that should be enrolled (e.g. C(/var/lib/shim-signed/mok/MOK.der)).
    type: path
author: labctl maintainers
"""

RETURN = r"""
efi:
  description: Whether the host booted through UEFI (efivarfs has the SecureBoot variable).
  returned: always
  type: bool
secure_boot:
  description: Whether Secure Boot is on.
  returned: always
  type: bool
key_enrolled:
  description: Whether O(key) is enrolled (null without O(key), or when it cannot be told).
  returned: always
  type: bool
key_detail:
  description: What mokutil said, or why the key could not be checked.
  returned: always
  type: str
"""

import os

from ansible.module_utils.basic import AnsibleModule

# EFI_GLOBAL_VARIABLE's GUID (UEFI specification, "Globally Defined Variables").
SECURE_BOOT_VAR = "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"


def secure_boot_state(efivars_dir):
    """(efi, secure_boot) from the SecureBoot variable's file."""
    try:
        with open(os.path.join(efivars_dir, SECURE_BOOT_VAR), "rb") as handle:
            data = handle.read()
    except OSError:
        return False, False
    return True, len(data) >= 5 and data[4] == 1


def main():
    module = AnsibleModule(
        argument_spec={
            "efivars_dir": {"type": "path", "default": "/sys/firmware/efi/efivars"},
            "key": {"type": "path"},
        },
        supports_check_mode=True,
    )
    module.run_command_environ_update = {"LANG": "C", "LC_ALL": "C"}
    efi, secure_boot = secure_boot_state(module.params["efivars_dir"])
    enrolled, detail = None, ""
    key = module.params["key"]
    if key:
        mokutil = module.get_bin_path("mokutil")
        if not os.path.isfile(key):
            detail = "%s does not exist" % key
            enrolled = False
        elif not mokutil:
            detail = "mokutil is not installed"
        else:
            _rc, out, err = module.run_command([mokutil, "--test-key", key])
            detail = (out + err).strip()
            enrolled = "is already enrolled" in detail
    module.exit_json(changed=False, efi=efi, secure_boot=secure_boot, key_enrolled=enrolled, key_detail=detail)


if __name__ == "__main__":
    main()
