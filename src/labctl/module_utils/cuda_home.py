"""A CUDA toolkit installed as NVIDIA's wheels, made usable as a CUDA_HOME.

The lab's vLLM set carries NVIDIA's CUDA compiler as wheels (``cuda-toolkit[nvcc,cccl]``): they put
a toolkit tree at ``site-packages/nvidia/cu<major>/`` (``bin/nvcc``, ``include/``, ``lib/``). What
compiles at a replica's start takes it as its CUDA_HOME. FlashInfer's JIT links a module with
``-L$CUDA_HOME/lib64 -L$CUDA_HOME/lib64/stubs -lcudart -lcuda`` (flashinfer/jit/cpp_ext.py) and nvcc's
own profile reads ``$(TOP)/lib64``; the wheels ship ``lib/`` only, and ``libcudart.so.<major>``
without its unversioned name. Three links close the gap: ``lib64 -> lib``, ``lib/libcudart.so ->
libcudart.so.<major>``, and ``lib/stubs/libcuda.so`` -> the driver's ``libcuda.so.1``.

``labctl_venv`` runs this once, when it installs a set (the virtualenv is root's and not changed
afterwards); ``tests/bundle/test_lab_vllm_offline.py`` runs the same code in the network-less
container before it builds FlashInfer's module there. Standard library only (this package's rule).
"""

from __future__ import annotations

import glob
import os
import re

# nvidia-cuda-nvcc (CUDA 13 and later lay out nvidia/cu<major>/bin/nvcc) in a wheel-set lock.
_NVCC_PIN = re.compile(r"^nvidia-cuda-nvcc==(?P<major>\d+)\.", re.MULTILINE)
DRIVER_LIBRARY = "/usr/lib/x86_64-linux-gnu/libcuda.so.1"


def toolkit_dir(venv: str, python_version: str, lock_text: str) -> str:
    """Where a set's compiler wheels put their toolkit in ``venv``, or "" for a set without one. Before
    the install (check mode) it is computed from the lock's nvcc pin and the interpreter's X.Y."""
    found = sorted(glob.glob(os.path.join(venv, "lib", "python*", "site-packages", "nvidia", "cu*", "bin", "nvcc")))
    if found:
        return os.path.dirname(os.path.dirname(found[0]))
    match = _NVCC_PIN.search(lock_text)
    if not match or not python_version:
        return ""
    return os.path.join(venv, "lib", f"python{python_version}", "site-packages", "nvidia", f"cu{match['major']}")


def carries_compiler(lock_text: str) -> bool:
    return _NVCC_PIN.search(lock_text) is not None


def make_cuda_home(toolkit: str, driver_library: str = DRIVER_LIBRARY) -> list[str]:
    """The links FlashInfer's and nvcc's link lines need in a wheel-installed toolkit (idempotent; what
    the wheels ship themselves is kept). Returns the links it made."""
    lib = os.path.join(toolkit, "lib")
    runtime = sorted(os.path.basename(p) for p in glob.glob(os.path.join(lib, "libcudart.so.[0-9]*")))
    links = {os.path.join(toolkit, "lib64"): "lib", os.path.join(lib, "stubs", "libcuda.so"): driver_library}
    if runtime:
        links[os.path.join(lib, "libcudart.so")] = runtime[0]
    os.makedirs(os.path.join(lib, "stubs"), mode=0o755, exist_ok=True)
    made = []
    for path, target in links.items():
        if os.path.islink(path) and os.readlink(path) == target:
            continue
        if os.path.lexists(path) and not os.path.islink(path):
            continue  # the wheels ship it themselves: theirs stays
        if os.path.islink(path):
            os.unlink(path)
        os.symlink(target, path)
        made.append(path)
    return made
