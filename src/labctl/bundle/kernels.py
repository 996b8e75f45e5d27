"""FlashInfer's precompiled kernels in a locked wheel set: their versions must match flashinfer-python.

vLLM runs FlashInfer on CUDA (its sampler, attention and MoE backends). FlashInfer fetches what is
not installed when a kernel is first used: cubins from NVIDIA's artifactory (``get_artifact`` in
``flashinfer/jit/cubin_loader.py``) and, for JIT modules, a compilation with nvcc. Two wheels carry
them, published on FlashInfer's own index (https://flashinfer.ai/whl; PyPI has flashinfer-cubin
only up to 0.6.13 and never had flashinfer-jit-cache), so the lab's default set has neither and
compiles with the CUDA compiler it carries (docs/bundle.md, "The CUDA line"); the variant that adds
them (same section, "FlashInfer's kernel wheels") is checked here:

- ``flashinfer-cubin`` (the cubins); FlashInfer reads it only if its version equals its own
  (``_check_cubin_version`` in ``flashinfer/jit/env.py``), else it ignores it and downloads;
- ``flashinfer-jit-cache==<version>+cu<XY>`` (a shim) with one provider per GPU architecture,
  ``flashinfer-jit-cache-sm90a`` ... at exactly the shim's version; FlashInfer finds the providers
  through the shim and ignores a shim of another version (``_get_aot_providers``).

A lock that pairs them with another flashinfer-python version, or with another CUDA than torch's
(cuda_line.py reads torch's), bundles kernels that are never used: the host downloads and compiles
at start, and with no network it does not start. The check runs when a set is locked and when a
committed lock is read.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from labctl.bundle.cuda_line import cuda_label, torch_cuda

FLASHINFER = "flashinfer-python"
CUBIN = "flashinfer-cubin"
JIT_CACHE = "flashinfer-jit-cache"
_PROVIDER = re.compile(r"^flashinfer-jit-cache-(sm\d{2,3}[af]?)$")
_CUDA_LABEL = re.compile(r"^cu\d{3,}$")


def _split(version: str) -> tuple[str, str]:
    public, _, local = version.partition("+")
    return public, local


def _jit_cache_published(pins: Mapping[str, str]) -> bool:
    """FlashInfer publishes flashinfer-jit-cache from CUDA 12.9 (vllm/utils/flashinfer.py:
    has_flashinfer_jit_cache_wheels); torch's CUDA from cuda_line (a label, or its runtime wheel)."""
    cuda = torch_cuda(pins)
    return cuda is not None and tuple(int(part) for part in cuda.split(".")) >= (12, 9)


def providers(pins: Mapping[str, str]) -> dict[str, str]:
    """The jit-cache providers of a resolution: architecture tag (sm90a) -> version."""
    found = {}
    for name, version in pins.items():
        match = _PROVIDER.match(name)
        if match:
            found[match.group(1)] = version
    return found


def kernel_wheel_problems(pins: Mapping[str, str]) -> list[str]:
    """What is wrong with FlashInfer's kernel wheels in one resolution (normalised project name ->
    version); empty when the set has no flashinfer-python or its kernel wheels match it."""
    flashinfer = pins.get(FLASHINFER)
    cubin, shim, found = pins.get(CUBIN), pins.get(JIT_CACHE), providers(pins)
    if flashinfer is None:
        return [f"{name} {version} without {FLASHINFER}" for name, version in
                sorted({CUBIN: cubin, JIT_CACHE: shim}.items()) if version is not None]
    problems = []
    if cubin is not None and cubin != flashinfer:
        problems.append(f"{CUBIN} {cubin} does not match {FLASHINFER} {flashinfer} (FlashInfer ignores it and "
                        f"downloads its cubins at start): pin {CUBIN}=={flashinfer}")
    if shim is not None:
        public, label = _split(shim)
        if public != flashinfer or not _CUDA_LABEL.match(label):
            problems.append(f"{JIT_CACHE} {shim} does not match {FLASHINFER} {flashinfer}: pin "
                            f"{JIT_CACHE}=={flashinfer}+cu<XY>, the CUDA of torch")
        torch_version = torch_cuda(pins)
        torch_label = cuda_label(torch_version) if torch_version else ""
        if torch_label and label != torch_label:
            problems.append(f"{JIT_CACHE} {shim} is built for {label or 'no CUDA'}, torch {pins['torch']} for "
                            f"{torch_label}: pin {JIT_CACHE}=={flashinfer}+{torch_label}")
        if not found:
            problems.append(f"{JIT_CACHE} {shim} without a provider (flashinfer-jit-cache-sm90a ...): the shim holds "
                            "no kernel; do not exclude the provider of the lab's GPUs")
    elif found:
        problems.append(f"jit-cache providers ({', '.join(sorted(found))}) without the {JIT_CACHE} shim that "
                        "FlashInfer finds them through")
    elif cubin is not None and _jit_cache_published(pins):
        # With flashinfer-cubin installed vLLM takes FlashInfer as usable without checking for nvcc
        # and ninja (vllm/utils/flashinfer.py: has_flashinfer), then JIT-compiles its sampler.
        problems.append(f"{CUBIN} without {JIT_CACHE}: vLLM then compiles FlashInfer's modules at start; pin "
                        f"{JIT_CACHE}=={flashinfer}+{cuda_label(torch_cuda(pins) or '')}")
    for tag, version in sorted(found.items()):
        if shim is not None and version != shim:
            problems.append(f"flashinfer-jit-cache-{tag} {version} does not match {JIT_CACHE} {shim}")
    return problems
