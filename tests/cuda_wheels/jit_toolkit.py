#!/usr/bin/python3
"""Runs inside the network-less target container with the venv's python (tests/bundle/test_lab_vllm_offline.py):
which CUDA toolkit what compiles at a replica's start takes, and that one of another CUDA major is refused.

Read from the pinned sources (docs/bundle.md, "The CUDA line"):
- torch 2.13.0 torch/utils/cpp_extension.py: CUDA_HOME from $CUDA_HOME, $CUDA_PATH, the directory of
  `nvcc` on PATH, else /usr/local/cuda (computed once, at import); _check_cuda_version (BuildExtension)
  raises on a toolkit of another major than torch.version.cuda, and only warns on another minor.
- FlashInfer 0.7.0.post1 flashinfer/jit/cpp_ext.py get_cuda_path: the same order; it compares no version
  (the toolkit it finds builds the modules that are then loaded into the CUDA 13 torch).
So without the replicas' CUDA_HOME both would take /usr/local/cuda: on a lab host the CUDA 12.9 toolkit
of the cuda_toolkit role (here its double: NVIDIA's nvcc 12.9 wheel laid out at /usr/local/cuda-12.9).

Each probe runs in a fresh interpreter (both resolve at import). Prints one JSON object.
usage: jit_toolkit.py --env FILE [--env FILE] --prebuild SCRIPT"""

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import offline_paths

PROBE = r"""
import json, re, subprocess, torch, torch.utils.cpp_extension as ext
from flashinfer.jit import cpp_ext
out = {"torch_cuda": torch.version.cuda, "torch_cuda_home": ext.CUDA_HOME, "flashinfer_cuda_path": cpp_ext.get_cuda_path()}
nvcc = subprocess.run([out["flashinfer_cuda_path"] + "/bin/nvcc", "--version"], capture_output=True, text=True)
found = re.search(r"release (\d+\.\d+)", nvcc.stdout)
out["nvcc_release"] = found.group(1) if found else None
try:
    ext._check_cuda_version("c++", ext.get_compiler_abi_compatibility_and_version("c++")[1])
    out["torch_check"] = "accepted"
except RuntimeError as exc:
    out["torch_check"] = "refused: " + " ".join(map(str, exc.args))
print(json.dumps(out))
"""


def probe(env: dict[str, str]) -> dict[str, object]:
    proc = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip()[-1500:]}
    found: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return found


def main() -> int:
    cli = argparse.ArgumentParser()
    cli.add_argument("--env", action="append", default=[])
    cli.add_argument("--prebuild", required=True, help="the vllm role's files/labctl-flashinfer-prebuild")
    opts = cli.parse_args()
    replica = dict(os.environ)
    for path in opts.env:
        replica.update(offline_paths.load_env_file(path))
    result = {"replica_env": probe(replica)}
    # The same unit without the replicas' CUDA_HOME: what the earlier releases' lab would have compiled with.
    bare = {k: v for k, v in replica.items() if k not in ("CUDA_HOME", "CUDA_PATH", "CUDA_LIB_PATH")}
    result["without_cuda_home"] = probe(bare)
    # vllm_cuda_home pointed at the host's toolkit: the role's prebuild script refuses it before building.
    wrong = dict(replica, CUDA_HOME="/usr/local/cuda-12.9")
    env_file = "/tmp/wrong-cuda-home.env"
    with open(env_file, "w", encoding="utf-8") as handle:
        handle.write("CUDA_HOME=/usr/local/cuda-12.9\n")
    env_args = [arg for path in opts.env for arg in ("--env", path)]
    proc = subprocess.run([sys.executable, opts.prebuild, *env_args, "--env", env_file],
                          env=wrong, capture_output=True, text=True, check=False)
    result["prebuild_with_host_toolkit"] = {"rc": proc.returncode, "out": (proc.stdout + proc.stderr).strip()[-800:]}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
