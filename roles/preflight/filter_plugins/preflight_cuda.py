"""Preflight's check of the CUDA line of a GPU host's replicas, before anything changes.

The bundle's vLLM set names its CUDA (labctl.bundle.cuda_line: torch's CUDA, and the compiler the set
carries; the manifest records both). Three things must agree with it on a host that runs CUDA replicas:

* ``lab_vllm_cuda_version``: the lab's declared line is the set's;
* the driver the run leaves on the host (``nvidia_driver_version``, else the release the bundle
  carries, else the installed one) is at least the set's CUDA needs (``lab_cuda_min_driver``: CUDA
  13.0 userspace needs R580, 580.65.06 or newer; a CUDA 13 process on an older driver fails its first
  CUDA call);
* the toolkit what compiles at the replicas' start takes (``vllm_cuda_home``; empty: the set's own
  compiler) is of torch's CUDA major. FlashInfer's JIT (vLLM's sampler, the all-reduce at tensor
  parallel > 1) checks no version: with the host's CUDA 12.9 toolkit it builds CUDA 12 modules into the
  CUDA 13 torch (flashinfer/jit/cpp_ext.py), and torch's BuildExtension refuses another major.

Each problem names the variable to change.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from labctl.bundle import cuda_line

# The driver's own package in the bundle's apt part: Ubuntu's name (branch-suffixed up to 580) or
# NVIDIA's Debian name (roles/nvidia_driver/vars/main.yml, the anchor package).
_DRIVER_PACKAGE = re.compile(r"^(libnvidia-compute(-\d+)?|nvidia-driver-cuda)$")
_TOOLKIT_PATH = re.compile(r"cuda-(\d+\.\d+)/*$")
_WHEEL_TOOLKIT = re.compile(r"/nvidia/cu(\d+)/*$")


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version.split("-", 1)[0]))


def _set_line(manifest: Mapping[str, Any], name: str) -> tuple[dict[str, str], dict[str, str]] | None:
    sets = ((manifest.get("components") or {}).get("wheels") or {}).get("sets") or {}
    entry = sets.get(name)
    if not isinstance(entry, Mapping):
        return None
    packages = {str(p.get("name")): str(p.get("version")) for p in entry.get("packages") or [] if isinstance(p, Mapping)}
    line = dict(entry.get("cuda") or cuda_line.line(packages))
    return line, packages


def _bundle_driver(manifest: Mapping[str, Any]) -> str:
    for package in ((manifest.get("components") or {}).get("apt") or {}).get("packages") or []:
        if isinstance(package, Mapping) and _DRIVER_PACKAGE.match(str(package.get("name", ""))):
            return str(package.get("version", "")).split("-", 1)[0]
    return ""


def _toolkit_cuda(path: str, host_toolkit: str) -> str | None:
    """The CUDA version (or major) of a CUDA_HOME path, where the path tells it."""
    match = _TOOLKIT_PATH.search(path)
    if match:
        return match.group(1)
    if path.rstrip("/") == "/usr/local/cuda":
        return host_toolkit or None  # the alternative the cuda_toolkit role's toolkit owns
    match = _WHEEL_TOOLKIT.search(path)
    return match.group(1) if match else None


def labctl_preflight_cuda_problems(manifest: Mapping[str, Any], serving: Mapping[str, Any], cuda_version: str,
                                   min_driver: Mapping[str, str], driver: Mapping[str, Any], installed_driver: str,
                                   host_toolkit: str, set_name: str = "vllm") -> list[str]:
    if str((serving or {}).get("flavor", "cuda")) != "cuda":
        return []
    found = _set_line(manifest or {}, set_name)
    if found is None:
        return []  # no vLLM set in the bundle: the airgap and serving layers say so
    line, packages = found
    torch = line.get("torch")
    where = f"the bundle's {set_name} set (torch {packages.get('torch', '?')})"
    if not torch:
        return [(f"{where} is built for no CUDA, but vllm_flavor is cuda here: build the bundle from the lab profile "
                "(docs/bundle.md, \"The CUDA line\")")]
    problems = []
    if str(cuda_version) != torch:
        problems.append(f"lab_vllm_cuda_version={cuda_version}, but {where} is built for CUDA {torch}: set "
                        f"lab_vllm_cuda_version: \"{torch}\", or build the bundle for CUDA {cuda_version}")
    need = (min_driver or {}).get(torch)
    if need is None:
        problems.append(f"CUDA {torch} ({where}) is not in lab_cuda_min_driver: add the oldest driver it runs on "
                        "(CUDA toolkit release notes, \"CUDA Toolkit and Corresponding Driver Versions\")")
    else:
        pinned = str((driver or {}).get("driver_version") or "")
        carried = _bundle_driver(manifest or {})
        if pinned:
            version, what = pinned, f"nvidia_driver_version={pinned}"
        elif carried:
            version, what = carried, f"the driver the bundle carries is {carried} (lab_nvidia_driver_branch, the profile's nvidia pin)"
        else:
            version, what = str(installed_driver or ""), f"the installed driver is {installed_driver}"
        if version and _version_tuple(version) < _version_tuple(need):
            problems.append(f"{where} is CUDA {torch} and needs driver {need} or newer (lab_cuda_min_driver), but {what}: "
                            "a CUDA 13 process fails its first CUDA call on an older driver; move the driver first "
                            "(docs/runbooks/driver-upgrade.md) or build the bundle for the driver's CUDA")
    cuda_home = str((serving or {}).get("cuda_home") or "")
    compiler = line.get("compiler")
    if not cuda_home:
        if not compiler:
            problems.append(f"vllm_cuda_home is empty (the compiler of the bundle's {set_name} set), but {where} carries no "
                            "CUDA compiler (cuda-toolkit[nvcc,cccl]): FlashInfer's JIT would take /usr/local/cuda; build the "
                            f"bundle from the lab profile, or set vllm_cuda_home to a CUDA {cuda_line.major(torch)} toolkit")
        elif cuda_line.major(compiler) != cuda_line.major(torch):
            problems.append(f"{where} carries a CUDA {compiler} compiler for a CUDA {torch} torch: rebuild it from the lab "
                            "profile (`labctl bundle lock` refuses such a set)")
        return problems
    toolkit = _toolkit_cuda(cuda_home, str(host_toolkit or ""))
    if toolkit is None:
        problems.append(f"vllm_cuda_home={cuda_home}: preflight cannot tell which CUDA that toolkit is (name it "
                        f"/usr/local/cuda-X.Y), and a toolkit of another major than torch's CUDA {torch} must not compile "
                        "for the replicas; leave vllm_cuda_home empty for the bundle's own compiler")
    elif cuda_line.major(toolkit) != cuda_line.major(torch):
        problems.append(f"vllm_cuda_home={cuda_home} is a CUDA {toolkit} toolkit, but {where} is CUDA {torch}: FlashInfer's "
                        "JIT (vLLM's sampler, the all-reduce at tensor parallel > 1) would build CUDA "
                        f"{cuda_line.major(toolkit)} modules into the replicas without a word; leave vllm_cuda_home empty "
                        f"(the set's own CUDA {compiler or cuda_line.major(torch)} compiler)")
    return problems


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"labctl_preflight_cuda_problems": labctl_preflight_cuda_problems}
