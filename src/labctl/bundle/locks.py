"""Committed, hash-locked wheel sets and Prisma engine hashes (``locks`` in a profile; ``labctl bundle lock``).

A lock is a pip requirements file, one per OS and set (``<locks>/<os>/<set>.txt``): every project
of the set's resolution for that OS's Python and platform tags as ``name==version
--hash=sha256:...``, grouped under ``# index <where>`` lines. ``<where>`` is the one place the
build fetches that project from: ``pypi`` (pip's configured index), an index URL of the set's
``extra_index_urls``, or ``find-links:<dir>``. A build from a lock resolves nothing: each group
is downloaded with ``--no-deps --require-hashes`` from its own index only, so a project of the
same name on another index (PyPI shadowing a CUDA index's package) can never be taken.

``labctl bundle lock`` writes the files from pip's installation report (resolve-only: URLs and
hashes from the indexes' metadata); review the diff and commit them. A lock records a digest of
its inputs (the set's requirements, exclusions, indexes, the OS's Python, ABI and platform
tags); a build whose profile changed any of them refuses the stale lock.

``<locks>/<os>/prisma.json`` pins the sha256 of each Prisma engine (the .gz and the file) of the
profile's engines commit and platforms; the build checks the downloads against it and never reads
the mirror's ``.sha256`` files, so the server that serves an engine cannot also vouch for it.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.markers import InvalidMarker, default_environment
from packaging.requirements import InvalidRequirement, Requirement

from labctl.bundle.cuda_line import cuda_line_problems
from labctl.bundle.errors import BuildError
from labctl.bundle.kernels import kernel_wheel_problems
from labctl.bundle.wheels import parse_wheel_name, pip_download, pip_report
from labctl.module_utils.sums import sha256_file
from labctl.paths import private_dir
from labctl.profile import LoadedProfile, WheelSet
from labctl.profile import normalize_project as normalize
from labctl.targets import python_full_version

PYPI = "pypi"
FIND_LINKS = "find-links:"
_PIN = re.compile(r"^(?P<name>[A-Za-z0-9._-]+)==(?P<version>\S+) --hash=sha256:(?P<sha256>[0-9a-f]{64})$")


@dataclass(frozen=True)
class Pin:
    name: str
    version: str
    sha256: str
    index: str  # PYPI, an index URL, or FIND_LINKS + the profile's find_links entry


def inputs_digest(profile: LoadedProfile, spec: WheelSet) -> str:
    target = profile.spec.target
    data = {
        "requirements": spec.requirements,
        "exclude": spec.exclude,
        "extra_index_urls": spec.extra_index_urls,
        "find_links": spec.find_links,
        "no_index": spec.no_index,
        "python": target.python,
        "abi": target.abi,
        "platforms": target.platforms,
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode("utf-8")).hexdigest()[:16]


def lock_path(profile: LoadedProfile, name: str) -> Path | None:
    if profile.spec.locks is None:
        return None
    return profile.resolve(profile.spec.locks) / profile.os / f"{name}.txt"


def render(profile: LoadedProfile, name: str, spec: WheelSet, pins: list[Pin]) -> str:
    target = profile.spec.target
    lines = [
        f"# wheel set {name} of profile {profile.name} for {profile.os} (python {target.python}, {target.abi}):",
        "# written by `labctl bundle lock`; review the diff and commit it. The build fetches each group",
        "# below from its own index only (--no-deps --require-hashes).",
        f"# inputs: {inputs_digest(profile, spec)}",
        f"# requirements: {' '.join(spec.requirements)}",
    ]
    if spec.exclude:
        lines.append(f"# excluded from the resolution: {' '.join(spec.exclude)}")
    order = [PYPI, *spec.extra_index_urls, *[FIND_LINKS + link for link in spec.find_links]]
    for index in sorted({pin.index for pin in pins}, key=lambda i: order.index(i) if i in order else len(order)):
        lines.append(f"# index {index}")
        lines += [f"{p.name}=={p.version} --hash=sha256:{p.sha256}" for p in sorted(pins, key=lambda p: p.name)
                  if p.index == index]
    return "\n".join(lines) + "\n"


def parse(text: str, where: str) -> tuple[str | None, list[Pin]]:
    """The inputs digest and the pins of a lock file; ``where`` names it in errors."""
    inputs, index, pins = None, None, []
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("# inputs: "):
            inputs = line.split(": ", 1)[1].strip()
        elif line.startswith("# index "):
            index = line[len("# index "):].strip()
        elif line.strip() and not line.startswith("#"):
            match = _PIN.match(line.strip())
            if match is None or index is None:
                raise BuildError(f"{where}:{number}: expected 'name==version --hash=sha256:<hex>' under '# index ...'")
            pins.append(Pin(normalize(match["name"]), match["version"], match["sha256"], index))
    return inputs, pins


_HREF = re.compile(r"""<a\s[^>]*href=["']([^"']+)["']""", re.IGNORECASE)


def index_page(index: str, project: str, timeout: float = 30) -> dict[str, tuple[str, str | None]] | None:
    """The files a PEP 503 index offers for ``project``: file name -> (URL, sha256 from the
    link's ``#sha256=`` fragment or None); None when the index does not carry the project."""
    url = f"{index.rstrip('/')}/{project}/"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body = response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise BuildError(f"{index}: {url} answered {exc.code}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise BuildError(f"{index}: cannot read {url}: {getattr(exc, 'reason', exc)}") from exc
    files: dict[str, tuple[str, str | None]] = {}
    for href in _HREF.findall(body):
        absolute, _, fragment = urllib.parse.urljoin(url, href.replace("&amp;", "&")).partition("#")
        name = urllib.parse.unquote(urllib.parse.urlparse(absolute).path.rsplit("/", 1)[-1])
        digest = fragment.split("=", 1)[1] if fragment.startswith("sha256=") else None
        files[name] = (absolute, digest)
    return files or None


_MEMO: dict[tuple[str, int, int], str] = {}
_MEMO_LOCK = threading.Lock()


def file_sha256(path: Path) -> str:
    """sha256 of a local wheel (a file: index or find-links), remembered per path, size and mtime
    for the process: locking every OS of a profile reads each multi-GB CUDA wheel once."""
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    with _MEMO_LOCK:
        known = _MEMO.get(key)
    if known is not None:
        return known
    digest = sha256_file(str(path))
    with _MEMO_LOCK:
        _MEMO[key] = digest
    return digest


def _sha256_of(item: dict[str, Any], path: Path | None) -> str:
    archive = (item.get("download_info") or {}).get("archive_info") or {}
    digest = (archive.get("hashes") or {}).get("sha256")
    if not digest and str(archive.get("hash", "")).startswith("sha256="):
        digest = archive["hash"].split("=", 1)[1]
    if not digest and path is not None and path.is_file():
        digest = file_sha256(path)
    if not digest:
        raise BuildError(f"pip gave no sha256 for {item['metadata']['name']} {item['metadata']['version']}")
    return str(digest)


PageReader = Callable[[str, str], "dict[str, tuple[str, str | None]] | None"]


def _pin_of(profile: LoadedProfile, spec: WheelSet, item: dict[str, Any], read_page: PageReader) -> Pin:
    """Where a resolved wheel is fetched from, with its sha256. A wheel an extra index offers (the
    same file name: project, version, tags) comes from that index only, the first that offers it,
    whichever file pip picked: a file of the same name on PyPI cannot stand in for it. Projects
    the extra indexes do not offer at that version come from pip's configured index."""
    project = normalize(item["metadata"]["name"])
    version = str(item["metadata"]["version"])
    url = (item.get("download_info") or {}).get("url", "")
    parsed = urllib.parse.urlparse(url)
    filename = urllib.parse.unquote(parsed.path.rsplit("/", 1)[-1])
    path = Path(urllib.parse.unquote(parsed.path)) if parsed.scheme == "file" else None
    if path is not None:
        for link in spec.find_links:
            directory = Path(link) if "://" in link else profile.resolve(link)
            if path.parent == directory.resolve():
                return Pin(project, version, _sha256_of(item, path), FIND_LINKS + link)
    if spec.no_index:
        raise BuildError(f"{url}: not from the set's find_links (no_index is set)")
    for index in spec.extra_index_urls:
        files = read_page(index, project)
        if files is None or filename not in files:
            continue
        link, digest = files[filename]
        if digest is None:
            if link.split("#")[0] != url.split("#")[0]:
                raise BuildError(f"{index} gives no sha256 for {filename} and pip took it from {url}")
            digest = _sha256_of(item, path)
        return Pin(project, version, digest, index)
    # pip's configured index (PyPI, or the mirror pip.conf names, local or not)
    return Pin(project, version, _sha256_of(item, path), PYPI)


_MACHINE = {"amd64": "x86_64", "arm64": "aarch64"}


def target_environment(profile: LoadedProfile) -> dict[str, str]:
    """PEP 508 marker values of the target's interpreter (pip evaluates markers with its own)."""
    target = profile.spec.target
    full = python_full_version(target.os, target.release, target.python)
    env: dict[str, str] = {key: str(value) for key, value in default_environment().items()}
    env.update(python_version=target.python, python_full_version=full, implementation_version=full,
               implementation_name="cpython", platform_python_implementation="CPython", os_name="posix",
               sys_platform="linux", platform_system="Linux", platform_machine=_MACHINE.get(target.arch, target.arch))
    return env


def unmet_on_target(profile: LoadedProfile, items: list[dict[str, Any]]) -> dict[str, str]:
    """Requirements of the resolved projects that hold on the target's Python but are not in the
    resolution (pip judges markers such as python_full_version < "3.11.3" by the interpreter it runs
    on): project -> the requirement without its marker, to resolve again with."""
    env = target_environment(profile)
    names = {normalize(item["metadata"]["name"]) for item in items}
    unmet: dict[str, str] = {}
    for item in items:
        extras = item.get("requested_extras") or []
        for line in item["metadata"].get("requires_dist") or []:
            try:
                req = Requirement(line)
            except InvalidRequirement:
                continue
            if req.marker is None or normalize(req.name) in names:
                continue
            try:
                needed = any(req.marker.evaluate({**env, "extra": extra}) for extra in ["", *extras])
            except InvalidMarker:
                continue
            if needed:
                extra_part = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
                unmet.setdefault(normalize(req.name), f"{req.name}{extra_part}{req.specifier}")
    return unmet


def make_lock(profile: LoadedProfile, cache: Path, name: str, spec: WheelSet, set_args: list[str],
              read_page: PageReader = index_page) -> list[Pin]:
    """The pins of one set, from pip's report: resolve-only, nothing downloaded."""
    target = profile.spec.target
    req = private_dir(cache / "wheels") / f"lock-{profile.name}-{profile.os}-{name}.txt"
    what = f"wheels.sets.{name}"
    # pip judges environment markers by its own interpreter: what the target's Python needs besides
    # (redis -> async-timeout below 3.11.3, vllm -> six above 3.11) is added and resolved again.
    added: dict[str, str] = {}
    for _ in range(5):
        req.write_text("\n".join([*spec.requirements, *added.values()]) + "\n", encoding="utf-8")
        try:
            items = pip_report(req, target.python, target.abi, target.platforms, set_args, what=what)
        except BuildError as exc:
            raise BuildError(f"{exc}{_unserved(spec, str(exc), read_page)}") from exc
        unmet = {project: line for project, line in unmet_on_target(profile, items).items() if project not in spec.exclude}
        if not unmet:
            break
        added.update(unmet)
    else:
        full = python_full_version(target.os, target.release, target.python)
        raise BuildError(f"{what}: the resolution for the target's python {target.python} ({full}) still lacks "
                         f"{', '.join(sorted(unmet))} after adding {', '.join(added.values())}: add them to {what}.requirements")
    names = {normalize(item["metadata"]["name"]) for item in items}
    unknown = [project for project in spec.exclude if project not in names]
    if unknown:
        raise BuildError(f"{what}.exclude: {', '.join(unknown)} not in the resolution of {' '.join(spec.requirements)}")
    check_public_pins(what, spec, items)
    pins = []
    for item in items:
        project = normalize(item["metadata"]["name"])
        if project in spec.exclude:
            continue
        try:
            pins.append(_pin_of(profile, spec, item, read_page))
        except BuildError as exc:
            raise BuildError(f"{what}: {project}: {exc}") from exc
    check_kernel_wheels(what, pins)
    return sorted(pins, key=lambda p: p.name)


_NOT_FOUND = re.compile(r"(?:satisfies the requirement|distribution found for) (?P<req>\S+)")


def _unserved(spec: WheelSet, error: str, read_page: PageReader) -> str:
    """Why a pinned requirement pip found nowhere is missing, per extra index of the set: unreachable
    (a variant whose index this machine cannot reach), or reachable without that file."""
    match = _NOT_FOUND.search(error)
    if not match or not spec.extra_index_urls:
        return ""
    try:
        req = Requirement(match["req"])
    except InvalidRequirement:
        return ""
    pinned = [s.version for s in req.specifier if s.operator == "=="]
    why = []
    for index in spec.extra_index_urls:
        try:
            files = read_page(index, normalize(req.name))
        except BuildError as exc:
            why.append(f"{index} is unreachable ({exc})")
            continue
        versions = {parse_wheel_name(name).version for name in files or {} if name.endswith(".whl")}
        if not files or (pinned and pinned[0] not in versions):
            why.append(f"{index} does not serve {req.name}{req.specifier}")
    return f" ({match['req']}: {'; '.join(why)})" if why else ""


def check_public_pins(what: str, spec: WheelSet, items: list[dict[str, Any]]) -> None:
    """A requirement pinned to a public version (torch==2.13.0) takes exactly that build. PEP 440 lets
    ``==2.13.0`` match a local build (2.13.0+cpu), so a CPU build in a find-links directory of the
    machine's pip configuration would otherwise be locked for a GPU lab."""
    resolved = {normalize(item["metadata"]["name"]): item for item in items}
    for line in spec.requirements:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        specs = list(req.specifier)
        if len(specs) != 1 or specs[0].operator != "==" or "+" in specs[0].version or "*" in specs[0].version:
            continue
        item = resolved.get(normalize(req.name))
        version = str(item["metadata"]["version"]) if item else ""
        if "+" in version:
            where = (item or {}).get("download_info", {}).get("url", "?")
            raise BuildError(
                f"{what}: {line} resolved to the local build {req.name} {version} ({where}), not the public {specs[0].version}: "
                f"pin the build you mean ({req.name}=={version}), or keep that file out of pip's configuration "
                "(find-links, extra indexes) while locking")


def check_kernel_wheels(what: str, pins: list[Pin]) -> None:
    """Refuse FlashInfer kernel wheels of another version than its flashinfer-python (kernels.py), and a
    compiler of another CUDA major than torch's (cuda_line.py)."""
    versions = {pin.name: pin.version for pin in pins}
    problems = kernel_wheel_problems(versions) + cuda_line_problems(versions)
    if problems:
        raise BuildError(f"{what}: {'; '.join(problems)}")


def write_lock(profile: LoadedProfile, cache: Path, name: str, spec: WheelSet, set_args: list[str]) -> tuple[Path, list[Pin]]:
    path = lock_path(profile, name)
    if path is None:
        raise BuildError(f"locks: profile {profile.path} names no locks directory")
    pins = make_lock(profile, cache, name, spec, set_args)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(profile, name, spec, pins), encoding="utf-8")
    return path, pins


def read_lock(profile: LoadedProfile, name: str, spec: WheelSet) -> list[Pin]:
    """The committed pins of a set for the profile's OS; refuses a missing or stale lock."""
    path = lock_path(profile, name)
    assert path is not None
    fix = f"`labctl bundle lock --profile {profile.name} --os {profile.os} --set {name}`"
    reach = f" on a machine that reaches {', '.join(['PyPI', *spec.extra_index_urls])}" if spec.extra_index_urls else ""
    if not path.is_file():
        raise BuildError(f"wheels.sets.{name}: no lock {path} for {profile.os}: run {fix}{reach}, review and commit it")
    inputs, pins = parse(path.read_text(encoding="utf-8"), str(path))
    if inputs != inputs_digest(profile, spec):
        raise BuildError(
            f"wheels.sets.{name}: {path} was locked for other inputs (requirements, indexes, Python or platform tags "
            f"changed since): run {fix}{reach}, review and commit it"
        )
    allowed = {PYPI, *spec.extra_index_urls, *[FIND_LINKS + link for link in spec.find_links]}
    stray = sorted({p.index for p in pins} - allowed)
    if stray:
        raise BuildError(f"wheels.sets.{name}: {path} names index {stray[0]}, which the set does not list")
    check_kernel_wheels(f"wheels.sets.{name}: {path}", pins)
    return pins


def download_locked(profile: LoadedProfile, cache: Path, name: str, pins: list[Pin],
                    advance: Callable[[int], None]) -> list[Path]:
    """Each group of pins from its own index only, --no-deps --require-hashes; the wheels in pin order."""
    target = profile.spec.target
    what = f"wheels.sets.{name}"
    found: dict[str, Path] = {}
    for index in sorted({p.index for p in pins}):
        group = [p for p in pins if p.index == index]
        req = private_dir(cache / "wheels") / f"locked-{profile.name}-{profile.os}-{name}-{len(found)}.txt"
        req.write_text("".join(f"{p.name}=={p.version} --hash=sha256:{p.sha256}\n" for p in group), encoding="utf-8")
        if index == PYPI:
            args: list[str] = []
        elif index.startswith(FIND_LINKS):
            link = index[len(FIND_LINKS):]
            args = ["--no-index", "--find-links", link if "://" in link else str(profile.resolve(link))]
        else:
            args = ["--index-url", index]
        files = pip_download(cache / "wheels" / "files", req, target.python, target.abi, target.platforms, advance,
                             [*args, "--no-deps", "--require-hashes"], what=f"{what} (index {index})")
        by_project = {(normalize(parse_wheel_name(f.name).name), parse_wheel_name(f.name).version): f for f in files}
        for pin in group:
            path = by_project.get((pin.name, pin.version))
            if path is None:
                raise BuildError(f"{what}: index {index} gave no wheel for {pin.name}=={pin.version}")
            found[pin.name] = path
    return [found[p.name] for p in pins]
