#!/usr/bin/python
"""Ansible module: the kernels of a host, the one it boots next, their headers and NVIDIA modules."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: labctl_kernel_facts
short_description: Report the running kernel, the kernel the next boot runs, headers and NVIDIA modules
description:
  - Reads the running kernel's release (O(release_file)) and the installed kernel images
    (C(<boot_dir>/vmlinuz-<release>)). The kernel the host boots next is the newest of them, in
    version order, as GRUB's default entry on Debian and Ubuntu (C(GRUB_DEFAULT=0): the first entry
    of C(10_linux)'s version-sorted list).
  - For each of these kernels, whether its headers are installed (C(/lib/modules/<release>/build/include),
    the test DKMS makes before a build) and whether the NVIDIA module exists for it
    (C(modinfo -k <release> nvidia), the file DKMS installed, with its version and signer).
  - The installed kernel metapackages (C(linux-image-amd64), C(linux-image-generic-hwe-24.04), ...: every
    installed C(linux-image-*) package whose name carries no kernel release) and the headers metapackage
    of each (C(linux-headers-<same suffix>)), installed or not; and Canonical's C(*-server) NVIDIA driver
    packages found installed (they conflict with NVIDIA's packages the lab installs).
  - Read-only; runs in check mode. Standard library only, Python 3.8 and later.
options:
  release_file:
    description: The file holding the running kernel's release (a test double of a boot writes another).
    type: path
    default: /proc/sys/kernel/osrelease
  boot_dir:
    description: Where the kernel images are installed.
    type: path
    default: /boot
  modules_dir:
    description: Where each kernel's modules live (C(<modules_dir>/<release>)).
    type: path
    default: /lib/modules
  module:
    description: The kernel module to look for in each kernel.
    type: str
    default: nvidia
author: labctl maintainers
"""

RETURN = r"""
running:
  description: The running kernel's release.
  returned: always
  type: str
  sample: 6.1.0-50-amd64
boot:
  description: The release the next boot runs (the newest installed image; the running one without images).
  returned: always
  type: str
kernels:
  description:
    - One entry per installed kernel image and the running kernel, oldest first. Keys C(release),
      C(installed) (an image in O(boot_dir)), C(headers) (bool), C(module) (the module's file or ""),
      C(module_version), C(module_signer).
  returned: always
  type: list
  elements: dict
image_metas:
  description: Installed kernel image metapackages with their versions (name -> version).
  returned: always
  type: dict
headers_metas:
  description: The headers metapackage of each installed image metapackage (image meta -> headers meta).
  returned: always
  type: dict
installed_headers_metas:
  description: Headers metapackages that are installed (name -> version).
  returned: always
  type: dict
nvidia_server_packages:
  description: Canonical's C(*-server) NVIDIA driver packages that are installed.
  returned: always
  type: list
  elements: str
"""

import glob
import os
import re
from typing import Any

from ansible.module_utils.basic import AnsibleModule

# A kernel release inside a package name: linux-image-6.1.0-50-amd64, linux-image-unsigned-6.8.0-49-generic.
_RELEASE_IN_NAME = re.compile(r"^linux-(image|headers)-(unsigned-)?\d")
# Canonical's server driver stack (source nvidia-graphics-drivers-<branch>-server): nvidia-dkms-580-server-open,
# libnvidia-compute-580-server, nvidia-utils-580-server, nvidia-firmware-580-server-580.126.20, ...
_SERVER_PACKAGE = re.compile(r"nvidia.*-\d+-server(-open)?(-\d[\d.]*)?$")


def version_key(release: str) -> list[tuple[int, int, str]]:
    """Sort key of a kernel release, as `sort -V` (GRUB's version_sort): 6.1.0-9 before 6.1.0-50."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", release) if part]


def headers_meta(image_meta: str) -> str:
    """The headers metapackage of a kernel image metapackage (Debian and Ubuntu name them alike)."""
    return "linux-headers-" + image_meta[len("linux-image-"):]


def parse_dpkg(text: str) -> dict[str, str]:
    """{name: version} of the installed packages in `dpkg-query -W -f '${db:Status-Status} ${Package} ${Version}\\n'`."""
    installed: dict[str, str] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[0] == "installed":
            installed[fields[1]] = fields[2]
    return installed


def metas(installed: dict[str, str]) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """(image metas {name: version}, {image meta: headers meta}, installed headers metas {name: version})."""
    images = {n: v for n, v in installed.items() if n.startswith("linux-image-") and not _RELEASE_IN_NAME.match(n)}
    heads = {n: v for n, v in installed.items() if n.startswith("linux-headers-") and not _RELEASE_IN_NAME.match(n)}
    return images, {n: headers_meta(n) for n in images}, heads


def server_packages(installed: dict[str, str]) -> list[str]:
    return sorted(n for n in installed if _SERVER_PACKAGE.search(n))


def parse_modinfo(text: str) -> dict[str, str]:
    """{field: value} of `modinfo` output (the first value of a field that repeats)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if ":" not in line or line.startswith(("\t", " ")):
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "release_file": {"type": "path", "default": "/proc/sys/kernel/osrelease"},
            "boot_dir": {"type": "path", "default": "/boot"},
            "modules_dir": {"type": "path", "default": "/lib/modules"},
            "module": {"type": "str", "default": "nvidia"},
        },
        supports_check_mode=True,
    )
    module.run_command_environ_update = {"LANG": "C", "LC_ALL": "C"}
    params = module.params
    try:
        with open(params["release_file"], encoding="utf-8") as handle:
            running = handle.read().strip()
    except OSError as exc:
        module.fail_json(msg="cannot read the running kernel's release from %s: %s" % (params["release_file"], exc))
    prefix = os.path.join(params["boot_dir"], "vmlinuz-")
    images = [path[len(prefix):] for path in glob.glob(prefix + "*")]
    releases = sorted(set(images) | {running}, key=version_key)
    boot = max(images, key=version_key) if images else running

    modinfo = module.get_bin_path("modinfo", opt_dirs=["/sbin", "/usr/sbin"])
    kernels: list[dict[str, Any]] = []
    for release in releases:
        entry: dict[str, Any] = {
            "release": release,
            "installed": release in images,
            "headers": os.path.exists(os.path.join(params["modules_dir"], release, "build", "include")),
            "module": "", "module_version": "", "module_signer": "",
        }
        if modinfo and os.path.isdir(os.path.join(params["modules_dir"], release)):
            rc, out, _err = module.run_command([modinfo, "-k", release, params["module"]])
            fields = parse_modinfo(out) if rc == 0 else {}
            # A module built into the kernel reports "(builtin)": not one DKMS built.
            if fields.get("filename", "").startswith("/"):
                entry.update(module=fields["filename"], module_version=fields.get("version", ""),
                             module_signer=fields.get("signer", ""))
        kernels.append(entry)

    installed: dict[str, str] = {}
    dpkg_query = module.get_bin_path("dpkg-query")
    if dpkg_query:
        rc, out, err = module.run_command([
            dpkg_query, "-W", "-f", "${db:Status-Status} ${Package} ${Version}\\n",
            "linux-image-*", "linux-headers-*", "*nvidia*",
        ])
        if rc not in (0, 1):  # 1: a pattern matched nothing
            module.fail_json(msg="dpkg-query failed: %s" % (err or out).strip())
        installed = parse_dpkg(out)
    image_metas, headers_metas, installed_heads = metas(installed)
    module.exit_json(
        changed=False, running=running, boot=boot, kernels=kernels, image_metas=image_metas,
        headers_metas=headers_metas, installed_headers_metas=installed_heads,
        nvidia_server_packages=server_packages(installed),
    )


if __name__ == "__main__":
    main()
