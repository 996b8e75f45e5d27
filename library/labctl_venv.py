#!/usr/bin/python
"""Ansible module: a virtualenv from a bundle wheel-set lock, named after the lock's hash."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: labctl_venv
short_description: Install a locked wheel set from the offline bundle into its own virtualenv
description:
  - Reads a wheel-set lock written by C(labctl bundle build) (C(wheels/sets/<name>.txt): one
    C(name==version --hash=sha256:...) line per project) and installs exactly it with
    C(pip install --no-index --find-links <wheels> --no-deps --require-hashes) into
    C(<root>/venv-<first 12 hex of the lock's sha256>). Nothing is resolved or downloaded.
  - A new lock means a new virtualenv beside the one the services run, so an upgrade installs
    while the old version keeps serving; the services switch when their unit points at it.
  - The lock is copied into the virtualenv last (C(labctl-lock.txt)), as the mark of a finished
    install; an interrupted install is redone from a fresh virtualenv on the next run. With the mark in place the module
    changes nothing (idempotent, no pip call).
  - O(link) (optional) is pointed at the virtualenv in use, for operators.
  - A set that carries NVIDIA's compiler as wheels (C(cuda-toolkit[nvcc,cccl]): C(nvidia-cuda-nvcc), in
    C(site-packages/nvidia/cu<major>/)) gets that tree made usable as a C(CUDA_HOME), as part of the
    install: FlashInfer's JIT links with C(-L$CUDA_HOME/lib64 -L$CUDA_HOME/lib64/stubs -lcudart -lcuda)
    (flashinfer/jit/cpp_ext.py) and nvcc's own profile reads C($(TOP)/lib64), but the wheels ship only
    C(lib/) and the versioned C(libcudart.so.<major>). So C(lib64 -> lib), C(lib/libcudart.so ->
    libcudart.so.<major>), and C(lib/stubs/libcuda.so) -> the driver's C(libcuda.so.1) (O(driver_library);
    the link may dangle until the GPU layer installs the driver). RV(cuda_home) names the tree.
  - Standard library only.
options:
  lock:
    description: The lock file (in the bundle).
    type: path
    required: true
  wheels:
    description: The bundle's wheel directory (pip --find-links).
    type: path
    required: true
  root:
    description: Parent directory of the virtualenvs.
    type: path
    required: true
  link:
    description: A symlink to point at the virtualenv (e.g. C(<root>/current)).
    type: path
  python:
    description: Interpreter that creates the virtualenv.
    type: str
    default: python3
  driver_library:
    description: The NVIDIA driver's CUDA library the bundled toolkit's C(lib/stubs/libcuda.so) points at.
    type: path
    default: /usr/lib/x86_64-linux-gnu/libcuda.so.1
author: labctl maintainers
"""

EXAMPLES = r"""
- name: Install vLLM's wheel set
  labctl_venv:
    lock: /srv/labctl/bundle/wheels/sets/vllm.txt
    wheels: /srv/labctl/bundle/wheels
    root: /opt/labctl/vllm
    link: /opt/labctl/vllm/current
  register: venv
"""

RETURN = r"""
venv:
  description: The virtualenv directory.
  returned: always
  type: str
lock_sha256:
  description: sha256 of the lock.
  returned: always
  type: str
packages:
  description: Number of projects the lock pins.
  returned: always
  type: int
projects:
  description: The (normalised) names of the projects the lock pins.
  returned: always
  type: list
  elements: str
cuda_home:
  description: >-
    The bundled CUDA toolkit (C(<venv>/lib/pythonX.Y/site-packages/nvidia/cu<major>)) when the set carries
    C(nvidia-cuda-nvcc); empty otherwise. In check mode before the install, where it will be.
  returned: always
  type: str
"""

import hashlib
import os
import shutil
import subprocess

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.labctl.cuda_home import DRIVER_LIBRARY, carries_compiler, make_cuda_home, toolkit_dir

MARK = "labctl-lock.txt"


def run(module: AnsibleModule, argv: list[str], what: str) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-15:]
        module.fail_json(msg=f"{what} failed (exit {proc.returncode}): " + " | ".join(tail), cmd=argv)


def python_version(python: str) -> str:
    proc = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                          capture_output=True, text=True, check=False)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "lock": {"type": "path", "required": True},
            "wheels": {"type": "path", "required": True},
            "root": {"type": "path", "required": True},
            "link": {"type": "path"},
            "python": {"type": "str", "default": "python3"},
            "driver_library": {"type": "path", "default": DRIVER_LIBRARY},
        },
        supports_check_mode=True,
    )
    params = module.params
    try:
        with open(params["lock"], "rb") as handle:
            data = handle.read()
    except OSError as exc:
        module.fail_json(msg=f"{params['lock']}: cannot read the wheel-set lock ({exc.strerror}); "
                             "the bundle's profile needs the matching wheels.sets entry")
    digest = hashlib.sha256(data).hexdigest()
    pins = [line for line in data.decode("utf-8").splitlines() if line.strip() and not line.startswith("#")]
    venv = os.path.join(params["root"], f"venv-{digest[:12]}")
    mark = os.path.join(venv, MARK)
    changed = False
    installed = os.path.isfile(mark)
    if not installed:
        changed = True
        if not module.check_mode:
            os.makedirs(params["root"], mode=0o755, exist_ok=True)
            # --clear: whatever an interrupted install left there starts over
            run(module, [params["python"], "-m", "venv", "--clear", venv], f"{params['python']} -m venv {venv}")
            # PIP_CONFIG_FILE: only what this call says (no index, the bundle's wheels, the lock).
            os.environ["PIP_CONFIG_FILE"] = os.devnull
            run(
                module,
                [os.path.join(venv, "bin", "pip"), "install", "--no-index", "--find-links", params["wheels"],
                 "--no-deps", "--require-hashes", "--disable-pip-version-check", "--progress-bar", "off",
                 "--quiet", "-r", params["lock"]],
                f"pip install -r {params['lock']}",
            )
            toolkit = toolkit_dir(venv, "", data.decode("utf-8"))
            if toolkit:
                make_cuda_home(toolkit, params["driver_library"])
            shutil.copyfile(params["lock"], mark)
    link = params.get("link")
    if link:
        current = os.readlink(link) if os.path.islink(link) else None
        if current != venv:
            if os.path.exists(link) and not os.path.islink(link):
                module.fail_json(msg=f"{link} exists and is not a symlink; move it away")
            changed = True
            if not module.check_mode:
                tmp = f"{link}.tmp-{os.getpid()}"
                os.symlink(venv, tmp)
                os.replace(tmp, link)
    lock_text = data.decode("utf-8")
    cuda_home = toolkit_dir(venv, "", lock_text) if installed or not module.check_mode else ""
    if not cuda_home and carries_compiler(lock_text):
        cuda_home = toolkit_dir(venv, python_version(params["python"]), lock_text)
    projects = sorted({line.split("==", 1)[0].strip().lower() for line in pins})
    module.exit_json(changed=changed, venv=venv, lock_sha256=digest, packages=len(pins), cuda_home=cuda_home,
                     projects=projects)


if __name__ == "__main__":
    main()
