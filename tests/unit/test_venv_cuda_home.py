"""The lab's vLLM set carries NVIDIA's CUDA 13 compiler as wheels (cuda-toolkit[nvcc,cccl]): labctl_venv
(src/labctl/module_utils/cuda_home.py) makes that tree a CUDA_HOME that FlashInfer's JIT can link with, and names it for the replicas' unit.

FlashInfer 0.7.0.post1 links a JIT module with ``-L$CUDA_HOME/lib64 -L$CUDA_HOME/lib64/stubs -lcudart
-lcuda`` (flashinfer/jit/cpp_ext.py); NVIDIA's wheels ship ``lib/`` only and ``libcudart.so.13`` with
no unversioned name. Measured on this machine (docs/bundle.md, "The CUDA line"): the sampling module
compiles against such a tree and fails to link ("cannot find -lcudart", "cannot find -lcuda") until
the three links below exist."""

from __future__ import annotations

import os
from pathlib import Path

from labctl.module_utils import cuda_home as mod

LOCK = "cuda-toolkit==13.0.3.0 --hash=sha256:00\nnvidia-cuda-nvcc==13.0.88 --hash=sha256:00\n"


def _toolkit(venv: Path) -> Path:
    root = venv / "lib" / "python3.12" / "site-packages" / "nvidia" / "cu13"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "nvcc").write_text("#!/bin/sh\n")
    (root / "lib").mkdir()
    (root / "lib" / "libcudart.so.13").write_text("ELF")
    return root


def test_the_bundled_compiler_becomes_a_cuda_home_flashinfer_can_link_with(tmp_path: Path) -> None:
    root = _toolkit(tmp_path / "venv")
    assert mod.toolkit_dir(str(tmp_path / "venv"), "", LOCK) == str(root)
    mod.make_cuda_home(str(root), "/usr/lib/x86_64-linux-gnu/libcuda.so.1")
    assert os.readlink(root / "lib64") == "lib"
    assert os.readlink(root / "lib" / "libcudart.so") == "libcudart.so.13"
    # -L$CUDA_HOME/lib64/stubs -lcuda: the driver's library (the link dangles until the driver is there)
    assert os.readlink(root / "lib64" / "stubs" / "libcuda.so") == "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
    assert (root / "lib64" / "libcudart.so").read_text() == "ELF"
    before = sorted((str(p), os.readlink(p)) for p in root.rglob("*") if p.is_symlink())
    mod.make_cuda_home(str(root), "/usr/lib/x86_64-linux-gnu/libcuda.so.1")
    assert sorted((str(p), os.readlink(p)) for p in root.rglob("*") if p.is_symlink()) == before


def test_what_the_wheels_ship_themselves_is_kept(tmp_path: Path) -> None:
    root = _toolkit(tmp_path / "venv")
    (root / "lib64").mkdir()
    (root / "lib64" / "marker").write_text("theirs")
    mod.make_cuda_home(str(root), "/usr/lib/x86_64-linux-gnu/libcuda.so.1")
    assert not (root / "lib64").is_symlink() and (root / "lib64" / "marker").read_text() == "theirs"


def test_a_set_without_a_compiler_has_no_cuda_home_and_check_mode_names_where_it_will_be(tmp_path: Path) -> None:
    assert mod.toolkit_dir(str(tmp_path / "venv"), "3.12", "torch==2.13.0+cpu --hash=sha256:00\n") == ""
    # Not installed yet (check mode on a fresh host): from the lock's nvcc pin and the interpreter's version.
    assert mod.toolkit_dir(str(tmp_path / "venv"), "3.12", LOCK) == str(
        tmp_path / "venv" / "lib" / "python3.12" / "site-packages" / "nvidia" / "cu13")
