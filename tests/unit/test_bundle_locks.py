"""Committed wheel-set locks (src/labctl/bundle/locks.py): `labctl bundle lock` writes them from
pip's report, the build fetches each group from its own index only, with hashes, and refuses a
missing or stale lock. Two local PEP 503 indexes over HTTP stand for PyPI and a CUDA index; the
"CUDA" index's `kernel-dep 2.0` has a twin of the same file name on "PyPI" with other content
(a name squatted on PyPI), which must never reach the bundle."""

from __future__ import annotations

import hashlib
import http.server
import os
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from labctl.bundle.errors import BuildError
from labctl.bundle.locks import FIND_LINKS, PYPI, index_page, parse, read_lock
from labctl.cli import app
from labctl.profile import load_profile

from .conftest import build


def _wheel(dest: Path, name: str, version: str, requires: tuple[str, ...] = (), marker: str = "") -> Path:
    dist = f"{name.replace('-', '_')}-{version}"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    path = dest / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(zipfile.ZipInfo(f"{name.replace('-', '_')}/__init__.py", (2024, 1, 1, 0, 0, 0)),
                         f"MARK = {marker!r}\n")
        archive.writestr(zipfile.ZipInfo(f"{dist}.dist-info/METADATA", (2024, 1, 1, 0, 0, 0)), meta)
        archive.writestr(zipfile.ZipInfo(f"{dist}.dist-info/WHEEL", (2024, 1, 1, 0, 0, 0)),
                         "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr(zipfile.ZipInfo(f"{dist}.dist-info/RECORD", (2024, 1, 1, 0, 0, 0)), "")
    return path


def _index(root: Path, wheels: list[Path]) -> None:
    """A PEP 503 index at root/simple with the files in root/files (#sha256= fragments)."""
    files = root / "files"
    for wheel in wheels:
        project = wheel.name.split("-")[0].replace("_", "-").lower()
        page = root / "simple" / project
        page.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        with (page / "index.html").open("a") as out:
            out.write(f'<a href="../../files/{wheel.name}#sha256={digest}">{wheel.name}</a>\n')
    assert files.is_dir()


@pytest.fixture(scope="module")
def indexes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    root = tmp_path_factory.mktemp("indexes")
    pypi, cuda = root / "pypi", root / "cuda"
    (pypi / "files").mkdir(parents=True)
    (cuda / "files").mkdir(parents=True)
    good = _wheel(cuda / "files", "kernel-dep", "2.0", marker="cuda")
    evil = _wheel(pypi / "files", "kernel-dep", "2.0", marker="squatted")
    assert good.name == evil.name and good.read_bytes() != evil.read_bytes()
    _index(cuda, [good, _wheel(cuda / "files", "kernel", "1.0", ("kernel-dep==2.0",))])
    _index(pypi, [evil, _wheel(pypi / "files", "app", "1.0", ("kernel==1.0", "helper>=1")),
                  _wheel(pypi / "files", "helper", "1.5")])

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: Quiet(*a, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    yield {"pypi": f"{base}/pypi/simple", "cuda": f"{base}/cuda/simple", "good": good, "evil": evil}
    server.shutdown()


@pytest.fixture(autouse=True)
def _pip_sees_only_the_test_indexes(monkeypatch: pytest.MonkeyPatch, indexes: dict[str, object]) -> None:
    for name in list(os.environ):
        if name.startswith("PIP_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", str(indexes["pypi"]))


def _profile(tmp_path: Path, indexes: dict[str, object], requirements: str = "app==1.0") -> Path:
    (tmp_path / "wheels").mkdir(exist_ok=True)
    path = tmp_path / "locked.yml"
    path.write_text(
        "name: locked\n"
        "target: {os: debian, release: '12', codename: bookworm, arch: amd64, python: '3.11'}\n"
        "locks: locks\n"
        "wheels:\n"
        "  sets:\n"
        "    svc:\n"
        f"      requirements: [{requirements}]\n"
        f"      extra_index_urls: [{indexes['cuda']}]\n"
    )
    return path


def _lock(path: Path) -> None:
    result = CliRunner().invoke(app, ["bundle", "lock", "--profile", str(path)])
    assert result.exit_code == 0, result.output
    assert "debian-12 svc: 4 wheels from" in result.output


def test_lock_names_one_index_per_project_and_the_cuda_indexs_hash(tmp_path: Path, indexes: dict[str, object]) -> None:
    path = _profile(tmp_path, indexes)
    _lock(path)
    lock = tmp_path / "locks" / "debian-12" / "svc.txt"
    text = lock.read_text()
    _, pins = parse(text, str(lock))
    by_name = {p.name: p for p in pins}
    assert {n: p.index for n, p in by_name.items()} == {
        "app": PYPI, "helper": PYPI, "kernel": str(indexes["cuda"]), "kernel-dep": str(indexes["cuda"])}
    good = hashlib.sha256(Path(str(indexes["good"])).read_bytes()).hexdigest()
    assert by_name["kernel-dep"].sha256 == good
    assert "# inputs: " in text and "# requirements: app==1.0" in text
    # Locking again changes nothing (a reviewable, stable diff).
    _lock(path)
    assert lock.read_text() == text


def test_the_build_takes_each_wheel_from_its_locked_index_only(tmp_path: Path, indexes: dict[str, object],
                                                               key_dir: Path, cache_dir: Path) -> None:
    path = _profile(tmp_path, indexes)
    _lock(path)
    result = build(path, tmp_path / "bundle", key_dir, cache_dir / "own")
    bundled = tmp_path / "bundle" / "wheels" / Path(str(indexes["good"])).name
    assert bundled.read_bytes() == Path(str(indexes["good"])).read_bytes()
    sets = result.manifest["components"]["wheels"]["sets"]["svc"]
    assert sets["locked_from"] == "locks/debian-12/svc.txt"
    assert [p["name"] for p in sets["packages"]] == ["app", "helper", "kernel", "kernel-dep"]


def test_a_missing_lock_is_refused_with_the_command_to_make_it(tmp_path: Path, indexes: dict[str, object]) -> None:
    profile = load_profile(str(_profile(tmp_path, indexes)))
    with pytest.raises(BuildError, match=r"wheels.sets.svc: no lock .*locks/debian-12/svc.txt for debian-12: run "
                                         r"`labctl bundle lock --profile locked --os debian-12 --set svc` on a machine"):
        read_lock(profile, "svc", profile.spec.wheels.sets["svc"])


def test_a_stale_lock_is_refused(tmp_path: Path, indexes: dict[str, object]) -> None:
    _lock(_profile(tmp_path, indexes))
    profile = load_profile(str(_profile(tmp_path, indexes, requirements="app==1.0, helper==1.5")))
    with pytest.raises(BuildError, match=r"svc.txt was locked for other inputs"):
        read_lock(profile, "svc", profile.spec.wheels.sets["svc"])


def test_a_tampered_lock_hash_fails_the_download(tmp_path: Path, indexes: dict[str, object], key_dir: Path,
                                                 cache_dir: Path) -> None:
    path = _profile(tmp_path, indexes)
    _lock(path)
    lock = tmp_path / "locks" / "debian-12" / "svc.txt"
    evil = hashlib.sha256(Path(str(indexes["evil"])).read_bytes()).hexdigest()
    good = hashlib.sha256(Path(str(indexes["good"])).read_bytes()).hexdigest()
    lock.write_text(lock.read_text().replace(good, evil))
    with pytest.raises(BuildError, match=r"wheels.sets.svc \(index http://127.0.0.1:\d+/cuda/simple\): pip download failed"):
        build(path, tmp_path / "bundle", key_dir, cache_dir / "tampered")


def test_index_pages_and_find_links(tmp_path: Path, indexes: dict[str, object]) -> None:
    page = index_page(str(indexes["cuda"]), "kernel-dep")
    assert page is not None and list(page) == [Path(str(indexes["good"])).name]
    assert index_page(str(indexes["cuda"]), "app") is None
    assert FIND_LINKS == "find-links:"


def test_the_tests_gateway_is_the_labs_debian_12_gateway() -> None:
    """CI builds the test bundle from committed locks, and its gateway set is the lab's Debian 12 one
    pin for pin: re-locking one without the other fails here (what CI runs is what a lab installs)."""
    repo = Path(__file__).resolve().parents[2]
    lab = repo / "profiles" / "locks" / "lab" / "debian-12" / "litellm.txt"
    test = repo / "profiles" / "locks" / "test" / "debian-12" / "litellm.txt"
    assert parse(lab.read_text(), str(lab)) == parse(test.read_text(), str(test))
