"""Wheel sets: each resolved on its own, locked with hashes, installable --no-deps offline."""

from __future__ import annotations

import hashlib
import subprocess
import venv
from pathlib import Path

import pytest

from labctl.bundle.builder import BuildResult
from labctl.bundle.errors import BuildError
from labctl.bundle.wheel_stage import lock_text
from labctl.bundle.wheels import WheelName
from labctl.profile import WheelSet

from .conftest import build, make_wheel, write_profile


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A find-links directory: app needs lib and pin; lib 2.0 is newest but pin wants lib<2,
    so the resolution backtracks to lib 1.0. heavy is a dependency the set excludes."""
    root = tmp_path_factory.mktemp("index")
    make_wheel(root, "app", "1.0", ("lib", "pin", "heavy"))
    make_wheel(root, "lib", "2.0")
    make_wheel(root, "lib", "1.0")
    make_wheel(root, "pin", "1.0", ("lib<2",))
    make_wheel(root, "heavy", "3.0")
    make_wheel(root, "other", "0.1")
    return root


def _profile(tmp_path: Path, index: Path, exclude: str = "[heavy]") -> Path:
    (tmp_path / "debs").mkdir(exist_ok=True)
    (tmp_path / "wheels").mkdir(exist_ok=True)
    sets = (
        "  sets:\n"
        f"    svc: {{requirements: [app==1.0], exclude: {exclude}, find_links: ['{index}'], no_index: true}}\n"
        f"    tool: {{requirements: [other==0.1], find_links: ['{index}'], no_index: true}}\n"
    )
    return write_profile(tmp_path / "sets.yml", extra=sets)


@pytest.fixture(scope="module")
def built_sets(tmp_path_factory: pytest.TempPathFactory, index: Path, key_dir: Path, cache_dir: Path) -> BuildResult:
    work = tmp_path_factory.mktemp("sets")
    return build(_profile(work, index), work / "bundle", key_dir, cache_dir)


def test_lock_holds_the_winning_resolution_minus_excluded(built_sets: BuildResult) -> None:
    lock = (built_sets.path / "wheels/sets/svc.txt").read_text()
    pins = [line.split(" ")[0] for line in lock.splitlines() if not line.startswith("#")]
    assert pins == ["app==1.0", "lib==1.0", "pin==1.0"]
    assert "# excluded from the resolution: heavy" in lock
    for line in lock.splitlines():
        if line.startswith("#"):
            continue
        name, version = line.split(" ")[0].split("==")
        digest = hashlib.sha256((built_sets.path / f"wheels/{name}-{version}-py3-none-any.whl").read_bytes()).hexdigest()
        assert line.endswith(f"--hash=sha256:{digest}")


def test_sets_are_in_the_manifest_and_the_wheelhouse(built_sets: BuildResult) -> None:
    sets = built_sets.manifest["components"]["wheels"]["sets"]
    assert sets["svc"]["lock"] == "wheels/sets/svc.txt"
    assert sets["svc"]["exclude"] == ["heavy"]
    assert [(p["name"], p["version"]) for p in sets["svc"]["packages"]] == [("app", "1.0"), ("lib", "1.0"), ("pin", "1.0")]
    assert [(p["name"], p["version"]) for p in sets["tool"]["packages"]] == [("other", "0.1")]
    files = {entry["path"] for entry in built_sets.manifest["files"]}
    assert {"wheels/sets/svc.txt", "wheels/sets/tool.txt", "wheels/app-1.0-py3-none-any.whl"} <= files
    # neither the excluded project nor the backtracked candidate is carried
    assert "wheels/heavy-3.0-py3-none-any.whl" not in files
    assert "wheels/lib-2.0-py3-none-any.whl" not in files


def test_lock_installs_offline_with_no_deps(built_sets: BuildResult, tmp_path: Path) -> None:
    env = tmp_path / "venv"
    venv.create(env, with_pip=True)
    result = subprocess.run(
        [str(env / "bin/pip"), "install", "--no-index", "--find-links", str(built_sets.path / "wheels"), "--no-deps",
         "--require-hashes", "-r", str(built_sets.path / "wheels/sets/svc.txt")],
        capture_output=True, text=True, check=False, env={"PIP_CONFIG_FILE": "/dev/null", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    out = subprocess.run([str(env / "bin/python"), "-c", "import app, lib, pin; print(lib.__version__)"],
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "1.0"


def test_excluding_a_project_outside_the_resolution_fails(tmp_path: Path, index: Path, key_dir: Path, cache_dir: Path) -> None:
    with pytest.raises(BuildError, match=r"wheels.sets.svc.exclude: torchvision not in the resolution of app==1.0"):
        build(_profile(tmp_path, index, exclude="[torchvision]"), tmp_path / "bundle", key_dir, cache_dir)


def test_unresolvable_set_names_the_set(tmp_path: Path, index: Path, key_dir: Path, cache_dir: Path) -> None:
    profile = _profile(tmp_path, index).read_text().replace("app==1.0", "app==9.9")
    (tmp_path / "bad.yml").write_text(profile)
    with pytest.raises(BuildError, match=r"wheels.sets.svc: pip"):
        build(tmp_path / "bad.yml", tmp_path / "bundle", key_dir, cache_dir)


def test_lock_text_normalizes_and_sorts() -> None:
    spec = WheelSet(requirements=["Zeta==1"], exclude=["Torch_Vision"])
    text = lock_text("x", spec, [(WheelName("Zeta_Pkg", "1"), "aa"), (WheelName("alpha", "2+cpu"), "bb")])
    assert text.splitlines()[-2:] == ["alpha==2+cpu --hash=sha256:bb", "zeta-pkg==1 --hash=sha256:aa"]
    assert "# excluded from the resolution: torch-vision" in text
