"""Kernel filters shared by the GPU layer (nvidia_driver), labctl patch (patch) and preflight: what to
install so that DKMS can build the NVIDIA modules for every kernel a host runs, and whether the
kernel the next boot runs has them. They read labctl_kernel_facts' result (library/)."""

from __future__ import annotations

from typing import Any


def _upstream(version: str) -> str:
    """The upstream part of a Debian version: '580.95.05-1' -> '580.95.05'."""
    text = str(version).strip().split(":", 1)[-1]
    return text.rsplit("-", 1)[0] if "-" in text else text


def labctl_apt_policy(text: str) -> dict[str, dict[str, str]]:
    """`apt-cache policy NAME...` as {name: {"installed": version or "", "candidate": version or ""}}
    (a package apt does not know is absent; "(none)" is "")."""
    policy: dict[str, dict[str, str]] = {}
    name = ""
    for line in str(text).splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            name = line[:-1]
            policy[name] = {"installed": "", "candidate": ""}
        elif name and line.strip().startswith(("Installed:", "Candidate:")):
            key, _, value = line.strip().partition(":")
            value = value.strip()
            policy[name][key.lower()] = "" if value == "(none)" else value
    return policy


def labctl_kernel_plan(kernels: dict[str, Any], policy_text: str, upgrade: bool) -> dict[str, Any]:
    """What the GPU layer installs so that DKMS can build the NVIDIA modules for the kernel the host
    runs and for every kernel it will run: from labctl_kernel_facts' result and `apt-cache policy` of
    linux-headers-<running>, linux-headers-<boot> and the host's kernel metapackages.

    - the headers metapackage of each installed image metapackage (linux-image-amd64 ->
      linux-headers-amd64, linux-image-generic-hwe-24.04 -> linux-headers-generic-hwe-24.04): every
      kernel a later upgrade brings comes with its headers;
    - the running kernel's headers where the repository has them;
    - where neither the running kernel nor the kernel the next boot runs has headers anywhere (a host
      installed from an older point release: Debian keeps only the current ABI's headers), the
      repository's kernel (image and headers metapackages at their candidate) when ``upgrade``:
      DKMS then builds the driver for it and the host reboots into it.
    Returns {"install": [apt names, name=version for the kernel], "kernel_upgrade": bool,
    "problems": [text], "notes": [text]}."""
    policy = labctl_apt_policy(policy_text)
    running, boot = kernels["running"], kernels["boot"]
    by_release = {k["release"]: k for k in kernels.get("kernels", [])}

    def available(release: str) -> bool:
        entry = policy.get(f"linux-headers-{release}", {})
        return bool(by_release.get(release, {}).get("headers")) or bool(entry.get("installed") or entry.get("candidate"))

    install: list[str] = []
    problems: list[str] = []
    notes: list[str] = []
    for release in dict.fromkeys([running, boot]):
        entry = policy.get(f"linux-headers-{release}", {})
        if not by_release.get(release, {}).get("headers") and entry.get("candidate") and not entry.get("installed"):
            install.append(f"linux-headers-{release}")
    image_metas: dict[str, str] = kernels.get("image_metas", {})
    for image_meta, headers_meta in sorted(kernels.get("headers_metas", {}).items()):
        entry = policy.get(headers_meta, {})
        if entry.get("installed"):
            continue
        if entry.get("candidate"):
            install.append(headers_meta)
        else:
            problems.append(
                f"the repository has no {headers_meta}, the headers of this host's kernels ({image_meta} "
                f"{image_metas.get(image_meta, '')}): every kernel an upgrade brings would lack the headers DKMS "
                f"builds the NVIDIA modules with. Add {headers_meta} to the bundle's kernel group (profile apt.groups.kernel)")
    kernel_upgrade = False
    if boot != running and not available(boot):
        problems.append(
            f"the kernel the host boots next, {boot}, has no headers (linux-headers-{boot} is neither installed nor in "
            "the repository): DKMS cannot build the NVIDIA modules for it, and the next boot would come up without GPUs. "
            f"Bring its headers (a bundle whose kernel group has the headers metapackage at that kernel's version), or "
            f"remove that kernel (apt-get purge linux-image-{boot}). Running: {running}")
    elif not available(running) and not (boot != running and available(boot)):
        newer = {meta: policy.get(meta, {}).get("candidate", "") for meta in image_metas}
        newer = {meta: version for meta, version in newer.items() if version and version != image_metas[meta]}
        if not image_metas:
            problems.append(
                f"the running kernel {running} has no headers (linux-headers-{running} is neither installed nor in "
                "the repository) and no kernel metapackage (linux-image-amd64, linux-image-generic, ...) is installed to "
                "move to a kernel with headers: install the headers of this kernel, or a distribution kernel")
        elif not newer:
            problems.append(
                f"the running kernel {running} has no headers (linux-headers-{running} is neither installed nor in the "
                f"repository) and the repository carries no newer {', '.join(sorted(image_metas))}: DKMS cannot build the "
                "NVIDIA modules. Build the bundle with the distribution's current kernel and its headers "
                "(profile apt.groups.kernel; docs/runbooks/airgap-install.md, \"Kernel and headers\")")
        elif not upgrade:
            problems.append(
                f"the running kernel {running} has no headers (linux-headers-{running} is neither installed nor in the "
                f"repository); the repository's kernel ({', '.join(f'{m} {v}' for m, v in sorted(newer.items()))}) has them, "
                "but nvidia_driver_kernel_upgrade is false: install it and reboot first, or set nvidia_driver_kernel_upgrade: true")
        else:
            kernel_upgrade = True
            for meta, version in sorted(newer.items()):
                install.append(f"{meta}={version}")
                headers_meta = kernels["headers_metas"][meta]
                candidate = policy.get(headers_meta, {}).get("candidate", "")
                if candidate == version:
                    install = [name for name in install if name != headers_meta] + [f"{headers_meta}={version}"]
            notes.append(
                f"the running kernel {running} has no headers anywhere: the repository's kernel "
                f"({', '.join(f'{m} {v}' for m, v in sorted(newer.items()))}) is installed with its headers first, DKMS "
                "builds the NVIDIA modules for it, and the host boots into it")
    return {"install": list(dict.fromkeys(install)), "kernel_upgrade": kernel_upgrade, "problems": problems, "notes": notes}


def labctl_boot_module_problem(kernels: dict[str, Any], version: str, module: str = "nvidia") -> str:
    """Why the kernel the host boots next would come up without the NVIDIA driver ``version``
    (upstream, e.g. 580.95.05), or "" when its module is there at that version."""
    boot = kernels["boot"]
    entry: dict[str, Any] = next((k for k in kernels.get("kernels", []) if k["release"] == boot), {})
    want = _upstream(version)
    if entry.get("module") and entry.get("module_version") == want:
        return ""
    if entry.get("module"):
        found = f"its {module} module is {entry.get('module_version') or 'of no version'} ({entry['module']}), not {want}"
    else:
        found = f"it has no {module} module (modinfo -k {boot} {module})"
    headers = ("its headers are installed: see `dkms status` and /var/lib/dkms/nvidia/*/build/make.log"
               if entry.get("headers") else f"its headers are missing: install linux-headers-{boot} (the headers metapackage "
               "of the bundle's kernel group brings them)")
    return (f"the kernel the host boots next, {boot}, would come up without GPUs: {found}; {headers}, then "
            f"`dkms autoinstall -k {boot}`. Running: {kernels['running']}")


def labctl_kernel_bundle_problems(kernels: dict[str, Any], bundle: dict[str, str], headers: bool = True) -> list[str]:
    """Preflight, before anything changes: what keeps DKMS from building the NVIDIA modules for the
    kernels this host runs, given the bundle's apt packages ({name: version}); and Canonical's server
    driver packages, which conflict with NVIDIA's (``headers`` false: only the latter)."""
    problems: list[str] = []
    server = kernels.get("nvidia_server_packages", [])
    if server:
        problems.append(
            f"Canonical's server driver packages are installed ({', '.join(server)}): they conflict with NVIDIA's packages "
            "the lab installs from the bundle (libnvidia-compute, nvidia-utils, nvidia-dkms ...). Remove them first "
            f"(apt-get purge {' '.join(server)}; then reboot if their driver is loaded)")
    if not headers:
        return problems
    running = kernels["running"]
    by_release = {k["release"]: k for k in kernels.get("kernels", [])}
    image_metas: dict[str, str] = kernels.get("image_metas", {})
    installed_heads: dict[str, str] = kernels.get("installed_headers_metas", {})
    for image_meta, headers_meta in sorted(kernels.get("headers_metas", {}).items()):
        if headers_meta not in bundle and headers_meta not in installed_heads:
            problems.append(
                f"the bundle lacks {headers_meta}, the headers of this host's kernel flavour ({image_meta}): a kernel an "
                f"upgrade brings would have no NVIDIA modules after its reboot. Add {headers_meta} to the profile's kernel "
                "group (profiles/lab.yml apt.groups.kernel) and rebuild the bundle")

    def has_headers(release: str) -> bool:
        return bool(by_release.get(release, {}).get("headers")) or f"linux-headers-{release}" in bundle

    boot = kernels.get("boot", running)
    if boot != running and not has_headers(boot):
        problems.append(
            f"the kernel this host boots next, {boot}, has no headers (linux-headers-{boot} is neither installed nor "
            "in the bundle): DKMS cannot build the NVIDIA modules for it and the next boot would come up without GPUs. "
            f"Bring its headers (a bundle whose kernel group has the headers metapackage at that kernel's version), or "
            f"remove that kernel (apt-get purge linux-image-{boot}). Running: {running}")
        return problems
    if has_headers(running) or (boot != running and has_headers(boot)):
        return problems
    newer = sorted(meta for meta in image_metas
                   if meta in bundle and bundle[meta] != image_metas[meta] and kernels["headers_metas"][meta] in bundle)
    if not newer:
        flavours = ", ".join(sorted(image_metas)) or "no kernel metapackage installed"
        problems.append(
            f"the running kernel {running} has no headers: linux-headers-{running} is neither installed nor in the bundle "
            f"(Debian keeps only the current kernel's headers), and the bundle carries no newer kernel of this host's "
            f"flavour ({flavours}) with its headers: DKMS could not build the NVIDIA modules. Build the bundle with the "
            "distribution's current kernel and headers (profile apt.groups.kernel: the image and headers metapackages); "
            "site.yml then installs that kernel first and reboots into it (docs/runbooks/airgap-install.md, "
            "\"Kernel and headers\")")
    return problems


def labctl_kernel_bundle_note(kernels: dict[str, Any], bundle: dict[str, str]) -> str:
    """What preflight reports when the running kernel has no headers anywhere but the bundle brings a
    newer kernel of the host's flavour with them (site.yml installs it first and boots into it)."""
    running = kernels["running"]
    entry: dict[str, Any] = next((k for k in kernels.get("kernels", []) if k["release"] == running), {})
    if entry.get("headers") or f"linux-headers-{running}" in bundle:
        return ""
    image_metas: dict[str, str] = kernels.get("image_metas", {})
    newer = sorted(f"{meta} {bundle[meta]}" for meta in image_metas
                   if meta in bundle and bundle[meta] != image_metas[meta] and kernels["headers_metas"][meta] in bundle)
    if not newer or (kernels.get("boot", running) != running):
        return ""
    return (f"the running kernel {running} has no headers anywhere (Debian keeps only the current kernel's): the GPU "
            f"layer installs the bundle's kernel ({', '.join(newer)}) with its headers first, DKMS builds the NVIDIA "
            "modules for it, and the host boots into it (a reboot: nvidia_driver_reboot_allowed)")


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "labctl_apt_policy": labctl_apt_policy,
            "labctl_kernel_plan": labctl_kernel_plan,
            "labctl_boot_module_problem": labctl_boot_module_problem,
            "labctl_kernel_bundle_problems": labctl_kernel_bundle_problems,
            "labctl_kernel_bundle_note": labctl_kernel_bundle_note,
        }
