"""The prisma component: Prisma's CLI (npm) and engines (binaries.prisma.sh layout), checked by sha256.

No network: the engines come from a fake mirror (a directory, or that directory served by
http.server on 127.0.0.1) holding stand-in bytes; `npm` is a fake on PATH that lays out the tree
``npm install prisma@X`` leaves (including @prisma/engines-version naming the engines commit).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import stat
import sys
import tarfile
import threading
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from labctl.bundle import prisma_stage
from labctl.bundle.builder import BuildResult
from labctl.bundle.errors import BuildError
from labctl.cli import app
from labctl.module_utils import verifycore
from labctl.profile import ProfileError, load_profile

from .conftest import Inputs, build, invoke, manifest_of, write_profile

# prisma-client-py 0.15.0 src/prisma/_config.py: PRISMA_VERSION and PRISMA_EXPECTED_ENGINE_VERSION.
CLI_VERSION = "5.17.0"
COMMIT = "393aa359c9ad4a4bb28630fb5613f9c281cde053"
PLATFORM = "debian-openssl-3.0.x"
ENGINES = {  # file name on the mirror (without .gz) -> stand-in content
    "query-engine": b"\x7fELF fake query engine\n" * 300,
    "schema-engine": b"\x7fELF fake schema engine\n" * 200,
    "libquery_engine.so.node": b"\x7fELF fake node-api library\n" * 100,
}

FAKE_NPM = """\
#!{python}
# A stand-in for `npm install --prefix DIR ... prisma@VERSION`: writes the tree npm would.
import json, os, sys
from pathlib import Path

args = sys.argv[1:]
with open(os.environ["FAKE_NPM_LOG"], "a") as log:
    log.write(json.dumps(args) + "\\n")
mode = os.environ.get("FAKE_NPM_MODE", "ok")
if mode == "fail":
    print("npm error code ENOTFOUND", file=sys.stderr)
    print("npm error request to https://registry.npmjs.org/prisma failed, reason: getaddrinfo ENOTFOUND", file=sys.stderr)
    sys.exit(1)
prefix = Path(args[args.index("--prefix") + 1])
version = next(a for a in args if a.startswith("prisma@")).split("@", 1)[1]
commit = os.environ.get("FAKE_NPM_COMMIT", "{commit}")
modules = prefix / "node_modules"
(modules / "prisma" / "build").mkdir(parents=True)
(modules / "prisma" / "package.json").write_text(json.dumps({{"name": "prisma", "version": version}}))
(modules / "prisma" / "build" / "index.js").write_text("#!/usr/bin/env node\\n")
(modules / "prisma" / "build" / "index.js").chmod(0o755)
(modules / "@prisma" / "engines-version").mkdir(parents=True)
(modules / "@prisma" / "engines-version" / "package.json").write_text(
    json.dumps({{"version": version + "-31." + commit, "prisma": {{"enginesVersion": commit}}}})
)
(modules / ".bin").mkdir()
os.symlink("../prisma/build/index.js", modules / ".bin" / "prisma")
(prefix / "package-lock.json").write_text(json.dumps({{"packages": {{"node_modules/prisma": {{"version": version}}}}}}))
"""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_mirror(root: Path, engines: dict[str, bytes] = ENGINES, platform: str = PLATFORM) -> Path:
    """binaries.prisma.sh's layout: <file>.gz, <file>.gz.sha256 (of the .gz), <file>.sha256 (of the file)."""
    directory = root / "all_commits" / COMMIT / platform
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in engines.items():
        packed = gzip.compress(data, mtime=0)
        (directory / f"{name}.gz").write_bytes(packed)
        (directory / f"{name}.gz.sha256").write_text(f"{sha256(packed)}  {name}.gz\n")
        (directory / f"{name}.sha256").write_text(f"{sha256(data)}  {name}\n")
    return root


@pytest.fixture
def npm_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake `npm` first on PATH; returns the file its invocations are logged to (JSON lines)."""
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    npm = bin_dir / "npm"
    npm.write_text(FAKE_NPM.format(python=sys.executable, commit=COMMIT))
    npm.chmod(0o755)
    log = tmp_path / "npm.log"
    log.write_text("")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_NPM_LOG", str(log))
    monkeypatch.delenv("FAKE_NPM_MODE", raising=False)
    monkeypatch.delenv("FAKE_NPM_COMMIT", raising=False)
    return log


def npm_calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    """A cache of this test's own: the session cache would carry engines between tests."""
    return tmp_path / "cache"


def prisma_profile(inputs: Inputs, tmp_path: Path, mirror: str, optional: bool = False, **extra: str) -> Path:
    lines = [
        "prisma:",
        f"  cli_version: '{CLI_VERSION}'",
        f"  engine_commit: {COMMIT}",
        f"  platforms: [{PLATFORM}]",
        f"  mirror: '{mirror}'",
        f"  optional: {'true' if optional else 'false'}",
        *[f"  {key}: {value}" for key, value in extra.items()],
    ]
    # next to the shared inputs (debs/, wheels/), so their relative paths resolve
    return write_profile(inputs.root / f"prisma-{tmp_path.name}.yml", extra="\n".join(lines) + "\n")


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - BaseHTTPRequestHandler's name
        pass


@pytest.fixture
def http_mirror(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    root = make_mirror(tmp_path / "served")
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", root
    finally:
        server.shutdown()
        server.server_close()


# --- facts ------------------------------------------------------------------------------------------


def test_prisma_facts() -> None:
    """Names from prisma/prisma 5.17.0 packages/fetch-engine (getDownloadUrl, getBinaryName, env.ts)."""
    by_kind = {engine.kind: engine for engine in prisma_stage.ENGINES}
    assert prisma_stage.engine_path(COMMIT, PLATFORM, by_kind["libquery-engine"]) == (
        f"all_commits/{COMMIT}/{PLATFORM}/libquery_engine.so.node.gz"
    )
    assert prisma_stage.engine_path(COMMIT, PLATFORM, by_kind["query-engine"]) == f"all_commits/{COMMIT}/{PLATFORM}/query-engine.gz"
    assert [by_kind[k].installed_name(PLATFORM) for k in ("query-engine", "schema-engine", "libquery-engine")] == [
        "query-engine-debian-openssl-3.0.x",
        "schema-engine-debian-openssl-3.0.x",
        "libquery_engine-debian-openssl-3.0.x.so.node",
    ]
    assert {e.kind: e.env for e in prisma_stage.ENGINES} == {
        "query-engine": "PRISMA_QUERY_ENGINE_BINARY",
        "schema-engine": "PRISMA_SCHEMA_ENGINE_BINARY",
        "libquery-engine": "PRISMA_QUERY_ENGINE_LIBRARY",
    }


def test_shipped_lab_profile() -> None:
    lab = load_profile("lab").spec
    assert lab.prisma is not None
    assert (lab.prisma.cli_version, lab.prisma.engine_commit) == (CLI_VERSION, COMMIT)
    assert lab.prisma.platforms == [PLATFORM]  # Ubuntu 24.04: OpenSSL 3.0
    assert lab.prisma.mirror == "https://binaries.prisma.sh"
    # Optional (issue 39): no registry reachable where the repository's locks are made serves the 5.17
    # engines, so no prisma.json is committed; the profile says why, and the build records Prisma absent.
    assert lab.prisma.optional is True
    assert not (Path(__file__).parents[2] / "profiles/locks/lab/ubuntu-24.04/prisma.json").exists()
    assert lab.apt.groups["database"].packages == ["nodejs"]
    litellm = lab.wheels.sets["litellm"].requirements
    assert "prisma==0.15.0" in litellm and "litellm[proxy]==1.106.0" in litellm
    assert lab.wheels.sets["vllm"].requirements[0].startswith("vllm==")
    test_prisma = load_profile("test").spec.prisma
    assert test_prisma is not None and test_prisma.optional is True  # unreachable here: recorded as absent


# --- builds -----------------------------------------------------------------------------------------


def test_no_section(built: BuildResult) -> None:
    component = manifest_of(built.path)["components"]["prisma"]
    assert component == {
        "available": False,
        "reason": "profile has no prisma section",
        "cli_version": None,
        "engine_commit": None,
        "platforms": [],
        "mirror": None,
        "files": [],
    }
    assert built.summary()["prisma"] == {"available": False, "reason": "profile has no prisma section", "files": 0}
    assert not (built.path / "prisma").exists()


def test_directory_mirror(runner: CliRunner, npm_log: Path, inputs: Inputs, cache: Path, tmp_path: Path) -> None:
    mirror = make_mirror(tmp_path / "mirror")
    profile = prisma_profile(inputs, tmp_path, str(mirror))
    out = tmp_path / "b"
    result = invoke(runner, "bundle", "build", "--profile", str(profile), "--out", str(out), "--cache-dir", str(cache))
    assert result.exit_code == 0, result.output
    assert "prisma: CLI and engines, 4 files" in result.stdout

    manifest = manifest_of(out)
    component = manifest["components"]["prisma"]
    assert {k: component[k] for k in ("available", "reason", "cli_version", "engine_commit", "platforms", "mirror")} == {
        "available": True,
        "reason": None,
        "cli_version": CLI_VERSION,
        "engine_commit": COMMIT,
        "platforms": [PLATFORM],
        "mirror": str(mirror),
    }
    cli, *engines = component["files"]
    assert cli["kind"] == "cli" and cli["file"] == "prisma/cli/prisma-5.17.0.tar.gz"
    assert cli["package"] == "prisma@5.17.0" and cli["entrypoint"] == "node_modules/prisma/build/index.js"
    assert [(e["kind"], e["file"]) for e in engines] == [
        ("query-engine", f"prisma/engines/{COMMIT}/{PLATFORM}/query-engine"),
        ("schema-engine", f"prisma/engines/{COMMIT}/{PLATFORM}/schema-engine"),
        ("libquery-engine", f"prisma/engines/{COMMIT}/{PLATFORM}/libquery_engine.so.node"),
    ]
    listed = {f["path"]: f for f in manifest["files"]}
    for entry, (name, data) in zip(engines, ENGINES.items(), strict=True):
        path = out / entry["file"]
        assert path.read_bytes() == data  # stored decompressed
        assert path.stat().st_mode & stat.S_IXUSR
        assert entry["sha256"] == sha256(data) == listed[entry["file"]]["sha256"]
        assert entry["size"] == len(data) == listed[entry["file"]]["size"]
        assert entry["gz_sha256"] == sha256(gzip.compress(data, mtime=0))
        assert entry["url"] == f"https://binaries.prisma.sh/all_commits/{COMMIT}/{PLATFORM}/{name}.gz"
        assert entry["platform"] == PLATFORM
    assert engines[0]["installed_name"] == "query-engine-debian-openssl-3.0.x"
    assert engines[0]["env"] == "PRISMA_QUERY_ENGINE_BINARY"
    assert listed[cli["file"]]["sha256"] == cli["sha256"]

    # The CLI tree, as prisma-client-py's binary cache dir wants it; npm ran without scripts.
    with tarfile.open(out / cli["file"]) as archive:
        names = archive.getnames()
        assert {"package.json", "package-lock.json", "node_modules/prisma/build/index.js"} <= set(names)
        link = archive.getmember("node_modules/.bin/prisma")
        assert link.issym() and link.linkname == "../prisma/build/index.js"
        assert archive.getmember("node_modules/prisma/build/index.js").mode == 0o755
        assert all(m.mtime == 0 and m.uid == 0 and m.gid == 0 for m in archive.getmembers())
        package = archive.extractfile("package.json")
        assert package is not None and json.loads(package.read()) == prisma_stage.CACHE_PACKAGE_JSON
    (call,) = npm_calls(npm_log)
    assert call[0] == "install" and "--ignore-scripts" in call and call[-1] == "prisma@5.17.0"

    assert invoke(runner, "bundle", "verify", str(out)).exit_code == 0


def test_http_mirror_cache_and_reproducible(
    npm_log: Path, http_mirror: tuple[str, Path], inputs: Inputs, key_dir: Path, cache: Path, tmp_path: Path
) -> None:
    url, served = http_mirror
    profile = prisma_profile(inputs, tmp_path, url + "/")  # a trailing slash is dropped
    first = build(profile, tmp_path / "b", key_dir, cache)
    component = first.manifest["components"]["prisma"]
    assert component["available"] is True and component["mirror"] == url
    assert first.summary()["prisma"] == {"available": True, "reason": None, "files": 4}
    assert first.summary()["sizes"]["prisma"] == sum(f["size"] for f in component["files"])

    # The next build needs neither the mirror nor npm: both come from the cache.
    for path in served.rglob("*.gz"):
        path.unlink()
    second = build(profile, tmp_path / "b", key_dir, cache)
    assert second.manifest["content_digest"] == first.manifest["content_digest"]
    assert len(npm_calls(npm_log)) == 1

    # The CLI archive is reproducible: a fresh npm install gives the same bytes.
    (cache / "prisma" / "cli" / "prisma-5.17.0.tar.gz").unlink()
    third = build(profile, tmp_path / "b", key_dir, cache)
    assert len(npm_calls(npm_log)) == 2
    assert third.manifest["components"]["prisma"]["files"][0] == component["files"][0]

    # A damaged cached engine is fetched again (the mirror has it back).
    make_mirror(served)
    engine = cache / "prisma" / "engines" / COMMIT / PLATFORM / "schema-engine"
    engine.write_bytes(b"damaged")
    fourth = build(profile, tmp_path / "b", key_dir, cache)
    assert fourth.manifest["components"]["prisma"] == component
    assert engine.read_bytes() == ENGINES["schema-engine"]


@pytest.mark.parametrize("which", ["decompressed", "gz"])
def test_wrong_sha256_is_refused(
    which: str, npm_log: Path, inputs: Inputs, key_dir: Path, cache: Path, tmp_path: Path
) -> None:
    mirror = make_mirror(tmp_path / "mirror")
    directory = mirror / "all_commits" / COMMIT / PLATFORM
    checksum = directory / ("schema-engine.sha256" if which == "decompressed" else "schema-engine.gz.sha256")
    checksum.write_text(f"{'0' * 64}  {checksum.name.removesuffix('.sha256')}\n")
    # optional does not matter: a file that does not match its checksum is never "unavailable"
    profile = prisma_profile(inputs, tmp_path, str(mirror), optional=True)
    location = f"{directory}/schema-engine.gz"
    with pytest.raises(BuildError) as info:
        build(profile, tmp_path / "b", key_dir, cache)
    message = str(info.value)
    assert message.startswith(f"prisma: {location} ")
    assert f"says {'0' * 64}; refusing it" in message
    packed = gzip.compress(ENGINES["schema-engine"], mtime=0)
    assert (sha256(ENGINES["schema-engine"]) if which == "decompressed" else sha256(packed)) in message
    cached = cache / "prisma" / "engines" / COMMIT / PLATFORM
    assert sorted(p.name for p in cached.iterdir() if p.name.startswith("schema")) == []  # nothing kept
    assert not (tmp_path / "b").exists() and not (tmp_path / "b.partial").exists()


def test_not_a_checksum_file(npm_log: Path, inputs: Inputs, key_dir: Path, cache: Path, tmp_path: Path) -> None:
    mirror = make_mirror(tmp_path / "mirror")
    (mirror / "all_commits" / COMMIT / PLATFORM / "query-engine.gz.sha256").write_text("<html>captive portal</html>\n")
    profile = prisma_profile(inputs, tmp_path, str(mirror))
    with pytest.raises(BuildError, match=r"query-engine\.gz\.sha256 is not a sha256 checksum file \(starts '<html>"):
        build(profile, tmp_path / "b", key_dir, cache)


def test_unreachable_optional_builds_without(runner: CliRunner, npm_log: Path, inputs: Inputs, cache: Path, tmp_path: Path) -> None:
    mirror = "http://127.0.0.1:9"  # nothing listens on the discard port
    profile = prisma_profile(inputs, tmp_path, mirror, optional=True)
    out = tmp_path / "b"
    result = invoke(runner, "bundle", "build", "--profile", str(profile), "--out", str(out), "--cache-dir", str(cache), "--json")
    assert result.exit_code == 0, result.output
    url = f"{mirror}/all_commits/{COMMIT}/{PLATFORM}/query-engine.gz.sha256"
    assert f"warning: prisma: cannot fetch {url}: " in result.stderr
    assert "LiteLLM database mode will not work" in result.stderr
    component = manifest_of(out)["components"]["prisma"]
    assert component["available"] is False and component["files"] == []
    assert component["reason"].startswith(f"cannot fetch {url}: ")
    assert component["cli_version"] == CLI_VERSION and component["engine_commit"] == COMMIT
    summary = json.loads(result.stdout)["prisma"]
    assert summary == {"available": False, "reason": component["reason"], "files": 0}
    assert not (out / "prisma").exists()
    assert npm_calls(npm_log) == []  # stopped at the first thing it could not fetch
    assert verifycore.verify_bundle(str(out)).ok

    human = invoke(runner, "bundle", "build", "--profile", str(profile), "--out", str(out), "--cache-dir", str(cache))
    assert f"  prisma: absent (cannot fetch {url}: " in human.stdout


def test_unreachable_fails_the_build(runner: CliRunner, npm_log: Path, inputs: Inputs, cache: Path, tmp_path: Path) -> None:
    profile = prisma_profile(inputs, tmp_path, "http://127.0.0.1:9")
    out = tmp_path / "b"
    result = invoke(runner, "bundle", "build", "--profile", str(profile), "--out", str(out), "--cache-dir", str(cache))
    assert result.exit_code == 1
    url = f"http://127.0.0.1:9/all_commits/{COMMIT}/{PLATFORM}/query-engine.gz.sha256"
    assert f"error: prisma: cannot fetch {url}: " in result.stderr
    assert "prisma.optional: true builds without Prisma" in result.stderr
    assert not out.exists() and not (tmp_path / "b.partial").exists()


def test_missing_engine_in_directory_mirror(npm_log: Path, inputs: Inputs, key_dir: Path, cache: Path, tmp_path: Path) -> None:
    mirror = make_mirror(tmp_path / "mirror", {"query-engine": ENGINES["query-engine"]})
    profile = prisma_profile(inputs, tmp_path, str(mirror))
    location = f"{mirror}/all_commits/{COMMIT}/{PLATFORM}/schema-engine.gz.sha256"
    with pytest.raises(BuildError, match=rf"^prisma: cannot fetch {location}: No such file or directory"):
        build(profile, tmp_path / "b", key_dir, cache)


@pytest.mark.parametrize("optional", [True, False])
def test_npm_failure(
    optional: bool, monkeypatch: pytest.MonkeyPatch, npm_log: Path, inputs: Inputs, key_dir: Path, cache: Path, tmp_path: Path
) -> None:
    monkeypatch.setenv("FAKE_NPM_MODE", "fail")
    profile = prisma_profile(inputs, tmp_path, str(make_mirror(tmp_path / "mirror")), optional=optional)
    reason = "cannot fetch npm install prisma@5.17.0: npm error code ENOTFOUND; npm error request to https://registry"
    if optional:
        component = build(profile, tmp_path / "b", key_dir, cache).manifest["components"]["prisma"]
        assert component["available"] is False and component["reason"].startswith(reason)
    else:
        with pytest.raises(BuildError, match=f"^prisma: {reason}"):
            build(profile, tmp_path / "b", key_dir, cache)


def test_no_npm(monkeypatch: pytest.MonkeyPatch, inputs: Inputs, key_dir: Path, cache: Path, tmp_path: Path) -> None:
    which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name: None if name == "npm" else which(name))
    profile = prisma_profile(inputs, tmp_path, str(make_mirror(tmp_path / "mirror")))
    with pytest.raises(BuildError, match=r"^prisma: cannot fetch npm install prisma@5\.17\.0: npm is not on PATH"):
        build(profile, tmp_path / "b", key_dir, cache)


def test_cli_expects_other_engines(
    monkeypatch: pytest.MonkeyPatch, npm_log: Path, inputs: Inputs, key_dir: Path, cache: Path, tmp_path: Path
) -> None:
    monkeypatch.setenv("FAKE_NPM_COMMIT", "f" * 40)
    profile = prisma_profile(inputs, tmp_path, str(make_mirror(tmp_path / "mirror")), optional=True)
    with pytest.raises(BuildError, match=rf"expects engines {'f' * 40} \(@prisma/engines-version\), but prisma.engine_commit is {COMMIT}"):
        build(profile, tmp_path / "b", key_dir, cache)
    assert not (cache / "prisma" / "cli" / "prisma-5.17.0.tar.gz").exists()


def test_write_archive_is_reproducible(tmp_path: Path) -> None:
    archives = []
    for index in range(2):
        root = tmp_path / f"tree{index}"
        (root / "d").mkdir(parents=True)
        (root / "d" / "x").write_text("x")
        (root / "d" / "run").write_text("#!/bin/sh\n")
        (root / "d" / "run").chmod(0o700)
        os.symlink("d/run", root / "link")
        os.utime(root / "d" / "x", (index * 1000, index * 1000))
        dest = tmp_path / f"a{index}.tar.gz"
        prisma_stage.write_archive(root, dest)
        archives.append(dest.read_bytes())
    assert archives[0] == archives[1]
    with tarfile.open(tmp_path / "a0.tar.gz") as archive:
        assert archive.getnames() == ["d", "d/run", "d/x", "link"]
        assert [m.mode for m in archive.getmembers()] == [0o755, 0o755, 0o644, 0o777]


@pytest.mark.parametrize(
    ("section", "field"),
    [
        ("prisma: {engine_commit: " + COMMIT + "}\n", "prisma.cli_version: Field required"),
        ("prisma: {cli_version: '5.17', engine_commit: " + COMMIT + "}\n", "prisma.cli_version: Value error, must be an exact"),
        ("prisma: {cli_version: '5.17.0', engine_commit: 393aa359}\n", "prisma.engine_commit: Value error, must be the 40-hex"),
        (
            "prisma: {cli_version: '5.17.0', engine_commit: " + COMMIT + ", platforms: [debian-openssl-3.0]}\n",
            "prisma.platforms: Value error, 'debian-openssl-3.0' is not a Prisma binary target",
        ),
        ("prisma: {cli_version: '5.17.0', engine_commit: " + COMMIT + ", platforms: []}\n", "prisma.platforms: List should have"),
        (
            "prisma: {cli_version: '5.17.0', engine_commit: " + COMMIT + ", mirror: 'ftp://x'}\n",
            "prisma.mirror: Value error, a URL must start with",
        ),
        ("prisma: {cli_version: '5.17.0', engine_commit: " + COMMIT + ", engines: []}\n", "prisma.engines: unknown field"),
    ],
)
def test_bad_section_is_named(tmp_path: Path, section: str, field: str) -> None:
    path = write_profile(tmp_path / "bad.yml", extra=section)
    with pytest.raises(ProfileError) as info:
        load_profile(str(path))
    assert field in str(info.value)


# --- engine hashes pinned in the repository (profile `locks:`) --------------------------------------


def _locked_profile(inputs: Inputs, tmp_path: Path, mirror: str) -> tuple[Path, Path]:
    profile = prisma_profile(inputs, tmp_path, mirror)
    locks = tmp_path / "locks"
    profile.write_text(profile.read_text() + f"locks: {locks}\n")
    return profile, locks / "debian-12" / "prisma.json"


def _compromise(mirror: Path, name: str = "query-engine") -> bytes:
    """The mirror serves other bytes, with .sha256 files that agree with them."""
    evil = b"\x7fELF not prisma's engine\n" * 50
    make_mirror(mirror, {**ENGINES, name: evil})
    return evil


def test_lock_pins_the_engines_and_the_build_ignores_the_mirrors_checksums(
    runner: CliRunner, npm_log: Path, inputs: Inputs, key_dir: Path, cache: Path, tmp_path: Path
) -> None:
    mirror = make_mirror(tmp_path / "mirror")
    profile, lock = _locked_profile(inputs, tmp_path, str(mirror))
    result = runner.invoke(app, ["bundle", "lock", "--profile", str(profile)])
    assert result.exit_code == 0, result.output
    assert f"debian-12 prisma: 3 engine files of {COMMIT[:12]} -> {lock}" in result.output
    pinned = json.loads(lock.read_text())
    assert pinned["engine_commit"] == COMMIT
    packed = gzip.compress(ENGINES["query-engine"], mtime=0)
    assert pinned["engines"][PLATFORM]["query-engine"] == {"sha256": sha256(ENGINES["query-engine"]),
                                                            "gz_sha256": sha256(packed)}
    build(profile, tmp_path / "good", key_dir, cache)
    # The mirror is compromised later: its engines and its checksums agree with each other.
    evil = _compromise(mirror)
    with pytest.raises(BuildError, match=rf"prisma: .*query-engine.gz has sha256 {sha256(gzip.compress(evil, mtime=0))}, "
                                         rf"but {lock} pins {sha256(packed)}; refusing it"):
        build(profile, tmp_path / "pinned", key_dir, tmp_path / "cache2")
    # Without the pins the mirror vouches for itself, and the other bytes go into the bundle.
    unpinned = prisma_profile(inputs, tmp_path, str(mirror))
    result_unpinned = build(unpinned, tmp_path / "unpinned", key_dir, tmp_path / "cache3")
    engine = tmp_path / "unpinned" / prisma_stage.engine_file(COMMIT, PLATFORM, prisma_stage.ENGINES[0])
    assert engine.read_bytes() == evil and result_unpinned is not None


def test_a_missing_or_stale_engine_lock_is_refused(npm_log: Path, inputs: Inputs, key_dir: Path, cache: Path,
                                                   tmp_path: Path) -> None:
    mirror = make_mirror(tmp_path / "mirror")
    profile, lock = _locked_profile(inputs, tmp_path, str(mirror))
    with pytest.raises(BuildError, match=rf"prisma: no engine lock {lock}: run `labctl bundle lock --profile unit --os debian-12`"):
        build(profile, tmp_path / "b", key_dir, cache)
    lock.parent.mkdir(parents=True)
    lock.write_text(json.dumps({"engine_commit": "0" * 40, "engines": {}}))
    with pytest.raises(BuildError, match=rf"prisma: {lock} pins engines commit {'0' * 40}, the profile asks for {COMMIT}"):
        build(profile, tmp_path / "b", key_dir, cache)


def test_optional_prisma_without_an_engine_lock_stays_out_and_fetches_nothing(
    runner: CliRunner, npm_log: Path, inputs: Inputs, key_dir: Path, cache: Path, tmp_path: Path
) -> None:
    """A locked profile fetches nothing unpinned: with prisma.optional and no engine lock the build
    leaves Prisma out and says why (even where the mirror is reachable), and `bundle lock` with the
    mirror out of reach writes the wheel locks, warns, and exits 0."""
    mirror = make_mirror(tmp_path / "mirror")
    profile = prisma_profile(inputs, tmp_path, str(mirror), optional=True)
    locks = tmp_path / "locks"
    profile.write_text(profile.read_text() + f"locks: {locks}\n")
    lock = locks / "debian-12" / "prisma.json"
    result = build(profile, tmp_path / "b", key_dir, cache)
    component = result.summary()["prisma"]
    assert component["available"] is False and component["reason"].startswith(f"no engine lock {lock}")
    assert not npm_log.exists() or "prisma@" not in npm_log.read_text()
    down = prisma_profile(inputs, tmp_path / "down", "http://127.0.0.1:9", optional=True)
    down.write_text(down.read_text() + f"locks: {locks}\n")
    locked = runner.invoke(app, ["bundle", "lock", "--profile", str(down)])
    assert locked.exit_code == 0, locked.output
    assert "prisma.optional: true; no engine lock written" in locked.output and not lock.exists()
