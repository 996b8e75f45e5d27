"""The lab bundle's parts against the real registries (make lab-parts, part of make test): the
apt part of the lab profile for Debian 12 built with the real builder against Debian's archive
and the strict NVIDIA double of NVIDIA's debian12 repository (tests/fixtures/nvidia-repo), and
the wheel part resolved for every supported OS (resolve-only: the indexes' metadata, no
multi-GB download). Needs the network (deb.debian.org, PyPI) and docker (the base image's dpkg
status); make test provides both."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from labctl.bundle.apt_stage import BaseSpec, collect_apt
from labctl.bundle.errors import BuildError
from labctl.bundle.locks import make_lock, parse, render
from labctl.bundle.staging import Staging
from labctl.bundle.wheel_stage import resolve_sets, set_args
from labctl.paths import default_cache_dir
from labctl.profile import load_profile
from labctl.progress import PlainReporter

REPO = Path(__file__).resolve().parents[2]
NVIDIA = REPO / "tests" / "fixtures" / "nvidia-repo"
LAB = yaml.safe_load((REPO / "profiles" / "lab.yml").read_text())
OSES = ["ubuntu-24.04", "ubuntu-22.04", "debian-12"]


def _profile(tmp_path: Path, change: Any) -> str:
    raw = yaml.safe_load((REPO / "profiles" / "lab.yml").read_text())
    change(raw)
    path = tmp_path / "lab.yml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return str(path)


@pytest.fixture(autouse=True)
def _isolated_pip(monkeypatch: pytest.MonkeyPatch) -> None:
    """pip as on a lab's build machine: none of this machine's local wheels or indexes (its find-links
    holds a CPU torch 2.13.0 that the lab's torch==2.13.0 would match, and the lock would refuse)."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)


def test_the_wheel_sets_resolve_for_every_supported_os_and_the_committed_locks_hold(tmp_path: Path) -> None:
    """Each set locked per OS as `labctl bundle lock` does (resolve-only). Every committed lock
    (profiles/locks/lab/<os>/<set>.txt, the vLLM set and the gateway's) must be one pip still resolves to
    as it stands: the profile's requirements under the committed pins as constraints give the committed
    file byte for byte (a changed profile, a pin that no longer fits, a wheel gone from PyPI or a changed
    hash fail). PyPI publishing newer versions does not: that is a re-lock to review (`labctl bundle lock
    --profile lab` shows it), not a broken lock."""
    path = str(REPO / "profiles" / "lab.yml")
    cache = default_cache_dir()

    def lock(os_key: str) -> tuple[dict[str, str], float]:
        started = time.monotonic()
        loaded = load_profile(path, os_key)
        under_the_pins = {}
        for name, spec in loaded.spec.wheels.sets.items():
            committed = REPO / "profiles" / "locks" / "lab" / os_key / f"{name}.txt"
            _, held = parse(committed.read_text(), str(committed))
            constraints = tmp_path / f"constraints-{os_key}-{name}.txt"
            constraints.write_text("".join(f"{pin.name}=={pin.version}\n" for pin in held))
            pinned = make_lock(loaded, cache, name, spec, [*set_args(loaded, spec), "-c", str(constraints)])
            under_the_pins[name] = render(loaded, name, spec, pinned)
        return under_the_pins, time.monotonic() - started

    with ThreadPoolExecutor(len(OSES)) as pool:
        results = dict(zip(OSES, pool.map(lock, OSES), strict=True))
    for os_key, (under_the_pins, seconds) in results.items():
        _, vllm = parse(under_the_pins["vllm"], "vllm")
        versions = {p.name: p.version for p in vllm}
        print(f"{os_key}: vllm set {len(vllm)} projects, {seconds:.1f} s")
        assert versions["vllm"] == "0.32.0" and versions["torch"] == "2.13.0", os_key
        for name, text in under_the_pins.items():
            committed = REPO / "profiles" / "locks" / "lab" / os_key / f"{name}.txt"
            assert text == committed.read_text(), (
                f"{committed} no longer resolves as committed: labctl bundle lock --profile lab --set {name}, review, commit")


def test_the_flashinfer_kernel_variant_is_refused_here_naming_its_index(tmp_path: Path) -> None:
    """FlashInfer's precompiled kernels (docs/bundle.md, "FlashInfer's kernel wheels") are published for
    0.7.x on FlashInfer's own index only (PyPI's flashinfer-cubin stops at 0.6.13; flashinfer-jit-cache
    was never there): a lock of that variant where the index does not answer says so, by name."""

    def kernels(raw: dict[str, Any]) -> None:
        vllm = raw["wheels"]["sets"]["vllm"]
        vllm["requirements"] += ["flashinfer-cubin==0.7.0.post1", "flashinfer-jit-cache==0.7.0.post1+cu130"]
        vllm["extra_index_urls"] = ["https://flashinfer.ai/whl", "https://flashinfer.ai/whl/cu130"]

    profile = load_profile(_profile(tmp_path, kernels), "debian-12")
    spec = profile.spec.wheels.sets["vllm"]
    with pytest.raises(BuildError) as raised:
        make_lock(profile, default_cache_dir(), "vllm", spec, set_args(profile, spec))
    text = str(raised.value)
    print(text)
    assert "https://flashinfer.ai/whl" in text and ("unreachable" in text or "does not serve" in text), text


def test_what_the_targets_python_needs_joins_the_set(tmp_path: Path) -> None:
    """redis 8 requires async-timeout on Python < 3.11.3 and vLLM requires six above 3.11; pip judges
    such markers by the Python it runs on (3.11 here), so without the locker's own check the lab
    gateway on Debian 12 (3.11.2) would lack async-timeout and fail on its first Redis call, and
    vLLM on Ubuntu 24.04 (3.12.3) would lack six. The locker evaluates every marker for the target
    and resolves again with what holds there."""

    def without(raw: dict[str, Any]) -> None:
        sets = raw["wheels"]["sets"]
        sets["litellm"]["requirements"] = [r for r in sets["litellm"]["requirements"] if not r.startswith("async-timeout")]

    path = _profile(tmp_path, without)
    cache = default_cache_dir()
    bookworm = load_profile(path, "debian-12")
    spec = bookworm.spec.wheels.sets["litellm"]
    assert "async-timeout" in {pin.name for pin in make_lock(bookworm, cache, "litellm", spec, set_args(bookworm, spec))}
    noble = load_profile(path, "ubuntu-24.04")
    assert "async-timeout" not in {pin.name for pin in make_lock(noble, cache, "litellm", spec, set_args(noble, spec))}
    vllm = noble.spec.wheels.sets["vllm"]
    assert "six" in {pin.name for pin in make_lock(noble, cache, "vllm", vllm, set_args(noble, vllm))}


def test_jammys_own_python_cannot_run_this_vllm(tmp_path: Path) -> None:
    """Why the Ubuntu 22.04 bundle carries python3.11: vLLM 0.32 and later require Python >= 3.11."""

    def jammy_python3(raw: dict[str, Any]) -> None:
        variant = raw["os"]["ubuntu-22.04"]
        variant["target"]["python"] = "3.10"
        del variant["apt"]["groups"]["python"]

    profile = load_profile(_profile(tmp_path, jammy_python3), "ubuntu-22.04")
    with pytest.raises(BuildError, match=re.escape("wheels.sets.vllm: pip could not resolve the set")):
        resolve_sets(profile, default_cache_dir())


def _base_image() -> str:
    image = os.environ.get("LABCTL_TEST_IMAGE")
    if not image:
        image = subprocess.run([str(REPO / "scripts" / "build-base-image.sh"), "--print-tag"],
                               capture_output=True, text=True, check=True).stdout.strip()
    return image


def test_the_apt_part_for_debian_12_builds_against_debians_archive_and_nvidias_debian12_repo(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(NVIDIA / "build.py")], check=True, capture_output=True)

    def stub_cuda(raw: dict[str, Any]) -> None:
        cuda = next(source for source in raw["apt"]["sources"] if source["name"] == "cuda")
        cuda["uris"] = [f"file:{NVIDIA / 'out'}"]
        cuda["signed_by"] = str(NVIDIA / "out" / "nvidia-stub-keyring.gpg")
        # Grafana's repository is out of reach here (optional in the profile anyway).
        raw["apt"]["sources"] = [s for s in raw["apt"]["sources"] if s["name"] != "grafana"]
        del raw["apt"]["groups"]["grafana"]

    profile = load_profile(_profile(tmp_path, stub_cuda), "debian-12")
    staging = Staging.start(tmp_path / "bundle", PlainReporter())
    started = time.monotonic()
    try:
        result = collect_apt(profile, default_cache_dir(), BaseSpec(image=_base_image()), staging)
    finally:
        shutil.rmtree(staging.root, ignore_errors=True)
    got = {deb.name: deb.version for deb in result.debs}
    print(f"debian-12 apt part: {len(got)} packages in {time.monotonic() - started:.1f} s")
    wanted = list(profile.spec.apt.packages) + [p for g in profile.spec.apt.groups.values() for p in g.packages]
    assert [name for name in wanted if name not in got] == []
    # NVIDIA's Debian packaging at exactly the pinned release, compute only.
    nvidia = {n: v for n, v in got.items() if n.startswith(("nvidia-", "libnvidia-", "libcuda")) and n != "nvidia-kernel-common"}
    assert set(nvidia.values()) == {"580.95.05-1"}, nvidia
    # What NVIDIA's debian12 kernel module packages need from Debian's contrib (nvidia-support's
    # nvidia-kernel-common): without contrib in the archive source the build stops.
    assert got["nvidia-kernel-common"] == "20220217+3~deb12u1"
    assert {"nvidia-driver-cuda", "nvidia-kernel-open-dkms", "libcuda1", "nvidia-smi", "nvidia-persistenced"} <= set(nvidia)
    assert not [n for n in got if n.startswith(("xserver-", "libnvidia-gl")) or n in ("nvidia-driver", "nvidia-open")]
    # The distribution's side, from Debian's archive: DKMS, headers for bookworm's kernel, a
    # Node.js new enough for Prisma's CLI.
    assert got["linux-headers-amd64"].startswith("6.1.")
    assert "dkms" in got and "build-essential" in got
    node = tuple(int(part) for part in got["nodejs"].split(".")[:2])
    assert node >= (16, 13), got["nodejs"]
