#!/usr/bin/python
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
    description:
      - A DER certificate that should be enrolled. Default: the one the distribution's DKMS signs modules
        with (O(distribution)): Debian's dkms C(/var/lib/dkms/mok.pub) (made with C(mok.key) at its first
        build), Ubuntu's C(/var/lib/shim-signed/mok/MOK.der) (made by C(update-secureboot-policy --new-key)).
    type: path
  distribution:
    description: C(ansible_distribution) (Debian, Ubuntu): picks the default O(key) and the commands in C(enroll).
    type: str
    default: Debian
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
key:
  description: The certificate checked (O(key) or the distribution's DKMS certificate).
  returned: always
  type: str
enroll:
  description: How to make and enrol that key on this distribution (commands and packages), for messages.
  returned: always
  type: str
"""

import os

from ansible.module_utils.basic import AnsibleModule

# EFI_GLOBAL_VARIABLE's GUID (UEFI specification, "Globally Defined Variables").
SECURE_BOOT_VAR = "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"


def secure_boot_state(efivars_dir: str) -> tuple[bool, bool]:
    """(efi, secure_boot) from the SecureBoot variable's file."""
    try:
        with open(os.path.join(efivars_dir, SECURE_BOOT_VAR), "rb") as handle:
            data = handle.read()
    except OSError:
        return False, False
    return True, len(data) >= 5 and data[4] == 1


# The key each distribution's DKMS signs modules with, and how to have it enrolled (dkms 3.0.10
# prepare_signing on Debian 12; dkms with shim-signed's update-secureboot-policy on Ubuntu 22.04/24.04).
DKMS_KEYS = {
    "Debian": (
        "/var/lib/dkms/mok.pub",
        (
            "Debian's DKMS signs with /var/lib/dkms/mok.key and the DER certificate /var/lib/dkms/mok.pub, made at its first "
            "module build: make them first with the command dkms runs (openssl req -new -x509 -nodes -days 36500 -subj "
            "'/CN=DKMS module signing key' -newkey rsa:2048 -keyout /var/lib/dkms/mok.key -outform DER -out "
            "/var/lib/dkms/mok.pub), then mokutil --import /var/lib/dkms/mok.pub (packages mokutil and openssl, in the "
            "bundle), reboot and confirm the key in MokManager at the console"
        ),
    ),
    "Ubuntu": (
        "/var/lib/shim-signed/mok/MOK.der",
        (
            "Ubuntu's DKMS signs with /var/lib/shim-signed/mok/MOK.priv and MOK.der: make them if missing "
            "(update-secureboot-policy --new-key), then update-secureboot-policy --enroll-key (or mokutil --import "
            "/var/lib/shim-signed/mok/MOK.der; packages shim-signed and mokutil, in the bundle), reboot and confirm the "
            "key in MokManager at the console"
        ),
    ),
}


def dkms_key(distribution: str) -> tuple[str, str]:
    """(certificate, how to enrol it) of the distribution's DKMS (Debian's for unknown ones)."""
    return DKMS_KEYS.get(distribution, DKMS_KEYS["Debian"])


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "efivars_dir": {"type": "path", "default": "/sys/firmware/efi/efivars"},
            "key": {"type": "path"},
            "distribution": {"type": "str", "default": "Debian"},
        },
        supports_check_mode=True,
    )
    module.run_command_environ_update = {"LANG": "C", "LC_ALL": "C"}
    efi, secure_boot = secure_boot_state(module.params["efivars_dir"])
    enrolled: bool | None = None
    detail = ""
    default_key, enroll = dkms_key(module.params["distribution"])
    key = module.params["key"] or default_key
    if secure_boot:
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
    module.exit_json(changed=False, efi=efi, secure_boot=secure_boot, key_enrolled=enrolled, key_detail=detail,
                     key=key, enroll=enroll)


if __name__ == "__main__":
    main()
