"""The CUDA line of a wheel set: the CUDA its torch is built for, and the compiler that travels with it.

A CUDA build of torch names its CUDA in one of two ways: a local version label (``2.8.0+cu129``,
PyTorch's own indexes) or, for the unlabelled build PyPI serves (``2.13.0``), the CUDA runtime wheel
it requires (``nvidia-cuda-runtime==13.0.96`` through ``cuda-toolkit[cudart]==13.0.3``; ``-cu12``
names before CUDA 13). A set may carry NVIDIA's compiler as wheels too (``cuda-toolkit[nvcc]``:
``nvidia-cuda-nvcc``), for what compiles at start (FlashInfer's JIT: vLLM's sampler, the all-reduce at
TP > 1). That compiler must be of torch's major: FlashInfer links what it builds into the torch
process it runs in and checks no version (flashinfer/jit/cpp_ext.py), and torch's own
``cpp_extension._check_cuda_version`` raises on a toolkit of another major than ``torch.version.cuda``
(a minor difference only warns; BuildExtension only).

The bundle records the line (manifest: ``components.wheels.sets.<set>.cuda``) and preflight compares
it with the lab's settings (``lab_vllm_cuda_version``, the driver, ``vllm_cuda_home``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# CUDA runtime wheels, newest naming first (CUDA 13 dropped the -cuXX suffix).
RUNTIME = ("nvidia-cuda-runtime", "nvidia-cuda-runtime-cu12", "nvidia-cuda-runtime-cu11")
COMPILER = ("nvidia-cuda-nvcc", "nvidia-cuda-nvcc-cu12", "nvidia-cuda-nvcc-cu11")
_LABEL = re.compile(r"^cu(?P<major>\d{2})(?P<minor>\d)$")


def major_minor(version: str) -> str:
    """'13.0.96' -> '13.0'."""
    parts = version.split("+", 1)[0].split(".")
    return ".".join(parts[:2])


def major(cuda: str) -> str:
    return cuda.split(".", 1)[0]


def torch_cuda(pins: Mapping[str, str]) -> str | None:
    """The CUDA version ('13.0') the set's torch is built for; None for a set without torch or with a
    build of torch for no CUDA (+cpu, +rocm..., or no CUDA runtime wheel beside an unlabelled one)."""
    torch = pins.get("torch")
    if torch is None:
        return None
    label = torch.partition("+")[2]
    if label:
        match = _LABEL.match(label)
        return f"{match['major']}.{match['minor']}" if match else None
    for name in RUNTIME:
        if name in pins:
            return major_minor(pins[name])
    return None


def compiler(pins: Mapping[str, str]) -> tuple[str, str] | None:
    """(wheel name, CUDA version) of the NVIDIA compiler the set carries, if any."""
    for name in COMPILER:
        if name in pins:
            return name, major_minor(pins[name])
    return None


def cuda_label(cuda: str) -> str:
    """'13.0' -> 'cu130' (the label CUDA builds carry)."""
    return "cu" + cuda.replace(".", "")


def line(pins: Mapping[str, str]) -> dict[str, str]:
    """What the manifest records of a set: torch's CUDA and the compiler's, where there are."""
    out: dict[str, str] = {}
    found = torch_cuda(pins)
    if found:
        out["torch"] = found
    nvcc = compiler(pins)
    if nvcc:
        out["compiler"] = nvcc[1]
    return out


def cuda_line_problems(pins: Mapping[str, str]) -> list[str]:
    """What is wrong with a resolution's CUDA line; empty when it holds together."""
    torch = torch_cuda(pins)
    nvcc = compiler(pins)
    if nvcc is None:
        return []
    name, version = nvcc
    if torch is None:
        return [(f"{name} {pins[name]} (a CUDA {version} compiler) beside torch {pins.get('torch', '(none)')}, which "
                 "is built for no CUDA: nothing in the set compiles with it")]
    if major(version) != major(torch):
        return [(f"{name} {pins[name]} is a CUDA {version} compiler, torch {pins['torch']} is built for CUDA {torch}: "
                 "FlashInfer's JIT would build modules of another CUDA major into that torch's process (it does not "
                 "check; torch's BuildExtension refuses another major); pin the compiler of torch's CUDA "
                 f"(cuda-toolkit[nvcc,cccl] of CUDA {major(torch)})")]
    return []
