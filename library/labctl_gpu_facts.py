#!/usr/bin/python
"""Ansible module: read the NVIDIA GPUs of a host with nvidia-smi and set them as facts."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: labctl_gpu_facts
short_description: Gather NVIDIA GPU facts with nvidia-smi
description:
  - Runs C(nvidia-smi --query-gpu=<QUERY_FIELDS> --format=csv,noheader,nounits) and sets
    C(ansible_facts.gpus) (one entry per GPU) and the summary facts C(gpu_count),
    C(gpu_driver_version), C(gpu_driver_branch), C(gpu_nvswitch) and C(gpu_facts_reason).
  - The GPUs' NUMA nodes come from sysfs (C(<sysfs_root>/bus/pci/devices/<address>/numa_node)) and the
    nodes' CPUs from C(<sysfs_root>/devices/system/node/node<N>/cpulist), in C(gpu_numa_nodes) and
    C(numa_node_cpus). C(gpu_numa_nodes) is in PCI bus order, the order CUDA numbers the GPUs in under
    C(CUDA_DEVICE_ORDER=PCI_BUS_ID); the module warns when C(nvidia-smi) numbers them otherwise.
  - A host without a usable NVIDIA driver is not a failure - no C(nvidia-smi), C(No devices were found)
    and a driver that is not loaded all give C(gpu_count=0) with the reason in C(gpu_facts_reason),
    so a play can decide to install the driver.
  - Output that cannot be read (a wrong number of fields, a non-numeric index or memory size) and an
    unknown C(nvidia-smi) error (for example a GPU that has fallen off the bus) fail the task, quoting
    the offending line.
  - NVSwitch systems (HGX/DGX 8-GPU baseboards, which need nvidia-fabricmanager) are recognised from the
    PCI devices in sysfs (vendor C(0x10de), class C(0x0680xx) "other bridge": the NVSwitch), from an
    NVIDIA device of PCI class C(Bridge) in C(lspci -d 10de:) (optional) or from the C(Fabric) section of
    C(nvidia-smi -q) (a C(State) other than C(N/A)/C(Not Supported)). The PCI checks need no driver, so a
    fresh HGX host is recognised before its first driver install.
  - Never changes anything; runs in check mode.
  - Runs on target Pythons from 3.8 on.
options:
  nvidia_smi:
    description:
      - Path of C(nvidia-smi). By default it is looked up on C(PATH) (and the sbin directories).
    type: path
  detect_nvswitch:
    description:
      - Read the PCI devices and run C(lspci -d 10de:) and C(nvidia-smi -q) to set C(gpu_nvswitch). When
        false, C(gpu_nvswitch) is always false.
    type: bool
    default: true
  sysfs_root:
    description:
      - Where sysfs is mounted (the PCI devices are read from C(<sysfs_root>/bus/pci/devices)).
    type: path
    default: /sys
author:
  - labctl maintainers
"""

EXAMPLES = r"""
- name: Read the GPUs
  labctl_gpu_facts:

- name: The lab box must have its two H200s on the 580 driver
  ansible.builtin.assert:
    that:
      - ansible_facts.gpu_count == 2
      - ansible_facts.gpu_driver_branch == "580"
    fail_msg: "{{ ansible_facts.gpu_facts_reason or ansible_facts.gpus }}"

- name: Install fabric manager only where there are NVSwitches
  ansible.builtin.apt:
    name: "nvidia-fabricmanager-{{ ansible_facts.gpu_driver_branch }}"
  when: ansible_facts.gpu_nvswitch
"""

RETURN = r"""
ansible_facts:
  description: The facts this module sets.
  returned: always
  type: dict
  contains:
    gpus:
      description:
        - One entry per GPU, in C(nvidia-smi) index order. Fields C(nvidia-smi) reports as C([N/A]) or
          C([Not Supported]) are null (C(persistence_mode) is then false).
        - Keys are C(index) (int), C(name), C(uuid), C(serial), C(pci_bus_id), C(memory_total_mib) (int),
          C(driver_version), C(vbios_version), C(persistence_mode) (bool), C(compute_cap) (str, C(9.0)),
          C(compute_mode), C(mig_mode) (C(Enabled)/C(Disabled)), C(ecc_mode) (C(Enabled)/C(Disabled)) and
          C(power_limit_w) (float).
      type: list
      elements: dict
      sample:
        - index: 0
          name: NVIDIA H200
          uuid: GPU-cb3dfa52-e2f3-9ca4-a399-7d16041c3732
          serial: "1753724031847"
          pci_bus_id: "00000000:18:00.0"
          memory_total_mib: 143771
          driver_version: 580.95.05
          vbios_version: 96.00.A5.00.03
          persistence_mode: true
          compute_cap: "9.0"
          compute_mode: Default
          mig_mode: Disabled
          ecc_mode: Enabled
          power_limit_w: 700.0
    gpu_count:
      description: Number of GPUs read (0 when there is no usable driver or no GPU).
      type: int
    gpu_driver_version:
      description: Driver version of the first GPU, or empty.
      type: str
      sample: 580.95.05
    gpu_driver_branch:
      description: Major part of the driver version (the packaging branch), or empty.
      type: str
      sample: "580"
    gpu_nvswitch:
      description: Whether the GPUs sit on an NVSwitch fabric (fabric manager needed).
      type: bool
    gpu_pci_count:
      description:
        - NVIDIA GPUs on the PCI bus (vendor C(0x10de), class C(0x0300xx) or C(0x0302xx)), driver or not.
      type: int
    gpu_facts_reason:
      description: Empty when the GPUs were read; otherwise why there are no GPU facts.
      type: str
      sample: nvidia-smi not found (no NVIDIA driver installed)
    gpu_numa_nodes:
      description:
        - The NUMA node of each GPU in PCI bus order (entry I is CUDA device I under
          C(CUDA_DEVICE_ORDER=PCI_BUS_ID)), from sysfs. C(-1) where the kernel knows none (VMs,
          single-socket hosts) or sysfs has no such device.
        - The GPUs C(nvidia-smi) listed; without them, the NVIDIA GPUs on the PCI bus.
      type: list
      elements: int
      sample: [0, 0, 0, 0, 1, 1, 1, 1]
    numa_node_cpus:
      description: The CPUs of every NUMA node sysfs lists (node number as a string -> C(cpulist)).
      type: dict
      sample: {"0": "0-55,112-167", "1": "56-111,168-223"}
"""

import os
import re
from typing import Any

from ansible.module_utils.basic import AnsibleModule

# What is asked of nvidia-smi, in this order; parse_query_output relies on it.
QUERY_FIELDS = (
    "index",
    "name",
    "uuid",
    "serial",
    "pci.bus_id",
    "memory.total",
    "driver_version",
    "vbios_version",
    "persistence_mode",
    "compute_cap",
    "compute_mode",
    "mig.mode.current",
    "ecc.mode.current",
    "power.limit",
)
QUERY_ARGS = ["--query-gpu=" + ",".join(QUERY_FIELDS), "--format=csv,noheader,nounits"]

# What nvidia-smi prints in a CSV cell for a value it cannot give.
UNAVAILABLE = ("[N/A]", "[Not Supported]", "N/A", "Not Supported", "")

NO_DEVICES = "No devices were found"
# nvidia-smi exits 14 when a GPU's infoROM is corrupted, still printing the rows after a
# "WARNING: infoROM is corrupted at gpu ..." line (on stdout or stderr).
RC_INFOROM_CORRUPTED = 14
NOT_FOUND_REASON = "nvidia-smi not found (no NVIDIA driver installed)"
# Messages of an nvidia-smi that runs but has no working driver behind it (exit 9, 12, 18, 255...).
DRIVER_TROUBLE = (
    "couldn't communicate with the NVIDIA driver",
    "Failed to initialize NVML",
    "NVML Shared Library Not Found",
    "Unable to determine the number of GPUs",
)
# Fabric states that mean "no fabric here" (PCIe cards, A100 4-GPU boards without NVSwitch).
NO_FABRIC_STATES = ("N/A", "Not Supported", "[N/A]", "[Not Supported]", "")
# `lspci -d 10de:` class "Bridge" (0680, "other bridge") is the NVSwitch; "PCI bridge" (0604) and
# "Host bridge" (0600) are root ports and CPU bridges, which NVIDIA-built boards may also list.
_LSPCI_BRIDGE = re.compile(r"^\S+\s+Bridge(?:\s+\[0680\])?:")
NVIDIA_VENDOR = "0x10de"
# PCI classes (sysfs `class`, 0xCCSSPP): 0x0680 other bridge (NVSwitch), 0x0300 VGA, 0x0302 3D controller.
NVSWITCH_CLASS = "0x0680"
GPU_CLASSES = ("0x0300", "0x0302")
# nvidia-smi's pci.bus_id: 8 hex digits of domain (sysfs names use 4), bus:device.function in capitals.
_BUS_ID = re.compile(r"^([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])$")
_NODE_DIR = re.compile(r"^node([0-9]+)$")


class ParseError(ValueError):
    """nvidia-smi said something this module cannot read."""


def _value(text: str) -> str | None:
    """A CSV cell, or None when nvidia-smi marks it unavailable."""
    text = text.strip()
    return None if text in UNAVAILABLE else text


def _integer(text: str, what: str, line: str) -> int | None:
    value = _value(text)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise ParseError("nvidia-smi gave a non-integer %s %r in line: %r" % (what, value, line)) from None


def _number(text: str, what: str, line: str) -> float | None:
    value = _value(text)
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        raise ParseError("nvidia-smi gave a non-numeric %s %r in line: %r" % (what, value, line)) from None


def parse_query_output(text: str) -> list[dict[str, Any]]:
    """The GPUs in `nvidia-smi --query-gpu=<QUERY_FIELDS> --format=csv,noheader,nounits` output.

    Raises ParseError, quoting the line, for anything that is not one row per GPU.
    """
    gpus: list[dict[str, Any]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != len(QUERY_FIELDS):
            raise ParseError(
                "nvidia-smi gave %d fields where %d were asked for (%s) in line: %r"
                % (len(cells), len(QUERY_FIELDS), ",".join(QUERY_FIELDS), line)
            )
        row = dict(zip(QUERY_FIELDS, cells, strict=True))
        index = _integer(row["index"], "index", line)
        if index is None:
            raise ParseError("nvidia-smi gave no GPU index in line: %r" % (line,))
        gpus.append({
            "index": index,
            "name": _value(row["name"]),
            "uuid": _value(row["uuid"]),
            "serial": _value(row["serial"]),
            "pci_bus_id": _value(row["pci.bus_id"]),
            # [N/A] on unified-memory GPUs (DGX Spark GB10); anything else non-numeric is an error.
            "memory_total_mib": _integer(row["memory.total"], "memory.total", line),
            "driver_version": _value(row["driver_version"]),
            "vbios_version": _value(row["vbios_version"]),
            "persistence_mode": _value(row["persistence_mode"]) == "Enabled",
            "compute_cap": _value(row["compute_cap"]),
            "compute_mode": _value(row["compute_mode"]),
            "mig_mode": _value(row["mig.mode.current"]),
            "ecc_mode": _value(row["ecc.mode.current"]),
            "power_limit_w": _number(row["power.limit"], "power.limit", line),
        })
    return gpus


def _fabric_states(q_text: str) -> list[str]:
    """The State values of every Fabric section in `nvidia-smi -q` text."""
    states: list[str] = []
    fabric_indent: int | None = None
    for line in q_text.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if fabric_indent is not None and indent <= fabric_indent:
            fabric_indent = None
        key, _sep, value = line.strip().partition(":")
        if fabric_indent is None:
            if key.strip() == "Fabric" and not _sep:
                fabric_indent = indent
            continue
        if key.strip() == "State":
            states.append(value.strip())
    return states


def parse_nvswitch(q_text: str | None, lspci_text: str | None) -> bool:
    """Whether the host has NVSwitches: a Fabric state in `nvidia-smi -q`, or a Bridge in lspci.

    Fabric states `Not Started`/`In Progress` count too: that is an NVSwitch board whose fabric
    manager is not (yet) up, which is precisely when the caller needs to know.
    """
    for state in _fabric_states(q_text or ""):
        if state not in NO_FABRIC_STATES:
            return True
    return any(_LSPCI_BRIDGE.match(line.strip()) for line in (lspci_text or "").splitlines())


def pci_devices(sysfs_root: str) -> list[tuple[str, str, str]]:
    """(address, class, device) of every NVIDIA PCI function in sysfs; [] when unreadable."""
    base = os.path.join(sysfs_root, "bus", "pci", "devices")
    found: list[tuple[str, str, str]] = []
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return found
    for name in names:
        try:
            with open(os.path.join(base, name, "vendor")) as handle:
                vendor = handle.read().strip().lower()
            if vendor != NVIDIA_VENDOR:
                continue
            with open(os.path.join(base, name, "class")) as handle:
                pci_class = handle.read().strip().lower()
            with open(os.path.join(base, name, "device")) as handle:
                device = handle.read().strip().lower()
        except OSError:
            continue
        found.append((name, pci_class, device))
    return found


def pci_summary(devices: list[tuple[str, str, str]]) -> tuple[bool, int]:
    """(NVSwitch present, GPU count) from pci_devices()."""
    nvswitch = any(pci_class.startswith(NVSWITCH_CLASS) for _name, pci_class, _device in devices)
    gpus = sum(1 for _name, pci_class, _device in devices if pci_class[:6] in GPU_CLASSES)
    return nvswitch, gpus


def sysfs_address(bus_id: str | None) -> str | None:
    """nvidia-smi's bus id ('00000000:9A:00.0', 8-digit domain) -> sysfs's name ('0000:9a:00.0');
    None for a value that is no PCI address."""
    match = _BUS_ID.match((bus_id or "").strip())
    if not match:
        return None
    domain, rest = match.groups()
    return "%04x:%s" % (int(domain, 16), rest.lower())


def _read(path: str) -> str | None:
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError:
        return None


def numa_node(sysfs_root: str, address: str | None) -> int:
    """The NUMA node of one PCI function: sysfs's numa_node, -1 when it says none or is missing."""
    text = _read(os.path.join(sysfs_root, "bus", "pci", "devices", address, "numa_node")) if address else None
    try:
        return int(text) if text is not None else -1
    except ValueError:
        return -1


def node_cpus(sysfs_root: str) -> dict[str, str]:
    """{"0": "0-55,112-167", ...}: the cpulist of every node<N> directory; {} without NUMA in sysfs."""
    base = os.path.join(sysfs_root, "devices", "system", "node")
    try:
        names = os.listdir(base)
    except OSError:
        return {}
    found: dict[str, str] = {}
    for name in names:
        match = _NODE_DIR.match(name)
        if match:
            cpus = _read(os.path.join(base, name, "cpulist"))
            if cpus is not None:
                found[match.group(1)] = cpus
    return dict(sorted(found.items(), key=lambda item: int(item[0])))


def gpu_numa_nodes(
    sysfs_root: str, gpus: list[dict[str, Any]], devices: list[tuple[str, str, str]]
) -> tuple[list[int], bool]:
    """The NUMA node of each GPU in PCI bus order (CUDA's order under CUDA_DEVICE_ORDER=PCI_BUS_ID),
    and whether nvidia-smi's index order is that order too. From nvidia-smi's GPUs when there are
    any, else from the NVIDIA GPUs on the PCI bus (pci_devices())."""
    if gpus:
        addresses = [sysfs_address(gpu["pci_bus_id"]) for gpu in gpus]
        ordered: list[str | None] = sorted(addresses, key=lambda a: (a is None, a or ""))
        same_order = addresses == ordered
    else:
        ordered = [name for name, pci_class, _device in devices if pci_class[:6] in GPU_CLASSES]
        same_order = True
    return [numa_node(sysfs_root, address) for address in ordered], same_order


def driver_branch(version: str | None) -> str:
    """'580.95.05' -> '580'; '' for no version."""
    if not version:
        return ""
    return version.split(".", 1)[0]


def _facts(gpus: list[dict[str, Any]], reason: str, nvswitch: bool = False, pci_count: int = 0,
           numa_nodes: list[int] | None = None, numa_cpus: dict[str, str] | None = None) -> dict[str, Any]:
    version = ""
    for gpu in gpus:
        if gpu["driver_version"]:
            version = gpu["driver_version"]
            break
    return {
        "gpus": gpus,
        "gpu_count": len(gpus),
        "gpu_driver_version": version,
        "gpu_driver_branch": driver_branch(version),
        "gpu_nvswitch": nvswitch,
        "gpu_pci_count": pci_count,
        "gpu_facts_reason": reason,
        "gpu_numa_nodes": list(numa_nodes or []),
        "numa_node_cpus": dict(numa_cpus or {}),
    }


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "nvidia_smi": {"type": "path"},
            "detect_nvswitch": {"type": "bool", "default": True},
            "sysfs_root": {"type": "path", "default": "/sys"},
        },
        supports_check_mode=True,
    )
    # Untranslated output from nvidia-smi and lspci.
    module.run_command_environ_update = {"LANG": "C", "LC_ALL": "C"}
    detect = module.params["detect_nvswitch"]

    # The PCI bus first: it needs no driver (a fresh host, a driver that does not load).
    sysfs_root = module.params["sysfs_root"]
    devices = pci_devices(sysfs_root)
    pci_nvswitch, pci_count = pci_summary(devices)
    numa_cpus = node_cpus(sysfs_root)
    lspci_out = ""
    if detect:
        lspci = module.get_bin_path("lspci")
        if lspci:
            l_rc, l_out, _l_err = module.run_command([lspci, "-d", "10de:"])
            lspci_out = l_out if l_rc == 0 else ""
    bus_nvswitch = detect and (pci_nvswitch or parse_nvswitch("", lspci_out))

    def done(gpus: list[dict[str, Any]], reason: str, nvswitch: bool = bus_nvswitch) -> None:
        numa_nodes, same_order = gpu_numa_nodes(sysfs_root, gpus, devices)
        if not same_order:
            module.warn("nvidia-smi numbers the GPUs in another order than their PCI bus ids (%s): CUDA under "
                        "CUDA_DEVICE_ORDER=PCI_BUS_ID (the replicas) numbers them by bus id"
                        % ", ".join(gpu["pci_bus_id"] or "?" for gpu in gpus))
        module.exit_json(changed=False, ansible_facts=_facts(gpus, reason, nvswitch, pci_count, numa_nodes, numa_cpus))

    smi = module.params["nvidia_smi"]
    if smi:
        if not (os.path.isfile(smi) and os.access(smi, os.X_OK)):
            done([], "nvidia-smi not found at %s (no NVIDIA driver installed)" % smi)
    else:
        smi = module.get_bin_path("nvidia-smi")
        if not smi:
            done([], NOT_FOUND_REASON)

    rc, out, err = module.run_command([smi] + QUERY_ARGS)
    said = (out + "\n" + err).strip()
    if NO_DEVICES in said:
        done([], NO_DEVICES)
    warnings = [line.strip() for line in said.splitlines() if line.strip().startswith("WARNING:")]
    for warning in warnings:
        module.warn("nvidia-smi: " + warning)
    out = "\n".join(line for line in out.splitlines() if not line.strip().startswith("WARNING:"))
    if rc != 0 and not (rc == RC_INFOROM_CORRUPTED and warnings):
        if any(marker in said for marker in DRIVER_TROUBLE):
            reason = " ".join(line.strip() for line in said.splitlines() if line.strip())
            done([], reason)
        module.fail_json(msg="nvidia-smi failed (rc %d): %s" % (rc, said), rc=rc, stdout=out, stderr=err)

    try:
        gpus = parse_query_output(out)
    except ParseError as exc:
        module.fail_json(msg=str(exc), rc=rc, stdout=out, stderr=err)
    if not gpus:
        done([], "nvidia-smi listed no GPU")

    nvswitch = bus_nvswitch
    if detect and not nvswitch:
        # -q output is read whatever the exit status (14 with a corrupted infoROM still lists all)
        _q_rc, q_out, _q_err = module.run_command([smi, "-q"])
        nvswitch = parse_nvswitch(q_out, lspci_out)
    done(gpus, "", nvswitch)


if __name__ == "__main__":
    main()
