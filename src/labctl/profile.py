"""Lab profiles: what goes into a bundle for one kind of target (``profiles/*.yml``)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from labctl.paths import profiles_dir
from labctl.targets import OsRelease, UnsupportedTarget, manylinux_tags, os_release

_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


class ProfileError(Exception):
    """A profile that cannot be found, read or validated; the message names file and field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Target(_Strict):
    os: str = Field(description="distribution id, e.g. debian or ubuntu")
    release: str = Field(description="VERSION_ID, e.g. '12' or '24.04'")
    codename: str = Field(description="VERSION_CODENAME; default: the supported OS table's (src/labctl/targets.py)")
    arch: str = "amd64"
    foreign_arches: list[str] = Field(default_factory=list, description="extra dpkg architectures")
    python: str = Field(description="the target's python3 X.Y; default: the supported OS table's")
    python_abi: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_table(cls, value: Any) -> Any:
        """codename and python default to what the supported OS ships."""
        if isinstance(value, dict) and isinstance(value.get("os"), str) and isinstance(value.get("release"), str):
            try:
                known = os_release(value["os"], value["release"])
            except UnsupportedTarget:
                return value
            value = {"codename": known.codename, "python": known.python, **value}
        return value

    @field_validator("release", mode="before")
    @classmethod
    def _release_text(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        if isinstance(value, float):
            raise ValueError("quote it, e.g. '24.04'")
        return value

    @field_validator("python", mode="before")
    @classmethod
    def _python_text(cls, value: Any) -> Any:
        if isinstance(value, float):
            raise ValueError("quote it, e.g. '3.11' (YAML reads 3.10 as the number 3.1)")
        return value

    @field_validator("python")
    @classmethod
    def _python_version(cls, value: str) -> str:
        if not re.fullmatch(r"3\.\d+", value):
            raise ValueError("must look like '3.11'")
        return value

    @model_validator(mode="after")
    def _supported(self) -> Target:
        try:
            known = os_release(self.os, self.release)
        except UnsupportedTarget as exc:
            raise ValueError(str(exc)) from None
        if self.codename != known.codename:
            raise ValueError(f"codename: {known.name} is {known.codename!r}, not {self.codename!r}")
        if self.python not in known.pythons:
            raise ValueError(f"python: {known.name} has Python {', '.join(known.pythons)}, not {self.python}")
        return self

    @property
    def abi(self) -> str:
        return self.python_abi or "cp" + self.python.replace(".", "")

    @property
    def glibc(self) -> str:
        return os_release(self.os, self.release).glibc

    @property
    def platforms(self) -> list[str]:
        """The wheel platform tags this target runs: every manylinux tag its glibc allows."""
        return manylinux_tags(self.glibc, self.arch)


class AptSource(_Strict):
    name: str = Field(description="short id, used by groups[].sources")
    uris: list[str] = Field(min_length=1)
    suites: list[str] = Field(min_length=1, description="'./' (or a path ending in '/') for a flat repo")
    components: list[str] = Field(default_factory=list, description="empty for a flat repo")
    signed_by: str = Field(description="keyring file; relative paths are relative to the profile")
    optional: bool = Field(default=False, description="skip (with a warning) when unreachable")

    @model_validator(mode="after")
    def _flat_or_not(self) -> AptSource:
        for suite in self.suites:
            if suite.endswith("/") and self.components:
                raise ValueError(f"flat suite {suite!r} takes no components")
            if not suite.endswith("/") and not self.components:
                raise ValueError(f"suite {suite!r} needs components (or end it with '/' for a flat repo)")
        return self


class AptPin(_Strict):
    """An apt preferences stanza (priority 1000) the resolver uses, as the target will."""

    packages: str = Field(min_length=1, description="the Package: field, e.g. 'src:*nvidia*:any'")
    version: str = Field(min_length=1, description="the version to prefer, e.g. '580.*' or '580.95.05-*'")

    def stanza(self) -> str:
        return f"Package: {self.packages}\nPin: version {self.version}\nPin-Priority: 1000\n"


class PackageGroup(_Strict):
    packages: list[str] = Field(min_length=1)
    sources: list[str] = Field(default_factory=list, description="sources this group needs")
    pin: AptPin | None = Field(
        default=None, description="resolve with this apt pin (the one the target's role writes), e.g. a driver release"
    )


class Apt(_Strict):
    sources: list[AptSource] = Field(default_factory=list)
    packages: list[str] = Field(default_factory=list, description="always resolved")
    groups: dict[str, PackageGroup] = Field(
        default_factory=dict, description="resolved unless one of their sources is skipped"
    )
    install_recommends: bool = True
    local_debs: list[str] = Field(default_factory=list, description="dirs of .deb added verbatim")
    exclude: list[str] = Field(
        default_factory=list,
        description="packages never taken from the sources (names or apt glob patterns): a Recommends of "
        "one is dropped, a Depends on one must be met by local_debs (else the build stops naming it)",
    )

    def exclude_stanza(self) -> str:
        """The apt preferences stanza that keeps the excluded packages out of the closure."""
        if not self.exclude:
            return ""
        return f"# apt.exclude\nPackage: {' '.join(self.exclude)}\nPin: version *\nPin-Priority: -1\n"

    @model_validator(mode="after")
    def _known_sources(self) -> Apt:
        for pattern in self.exclude:
            if not re.fullmatch(r"[a-z0-9*?][a-z0-9+.*?\[\]-]*", pattern):
                raise ValueError(f"exclude: {pattern!r} is not a package name or glob (lower case, no spaces)")
        names = [s.name for s in self.sources]
        if len(set(names)) != len(names):
            raise ValueError("source names must be unique")
        for group_name, group in self.groups.items():
            for source in group.sources:
                if source not in names:
                    raise ValueError(f"group {group_name!r} needs unknown source {source!r}")
        return self


def normalize_project(name: str) -> str:
    """PEP 503 project name normalisation (Torch_Vision -> torch-vision)."""
    return re.sub(r"[-_.]+", "-", name).lower()


class WheelSet(_Strict):
    """One service virtualenv: resolved on its own, locked into wheels/sets/<name>.txt."""

    requirements: list[str] = Field(min_length=1, description="top-level requirement lines, pinned")
    exclude: list[str] = Field(
        default_factory=list, description="projects of the resolution left out of the lock (installed --no-deps)"
    )
    extra_index_urls: list[str] = Field(default_factory=list, description="extra pip indexes (e.g. CUDA variant wheels)")
    find_links: list[str] = Field(default_factory=list, description="extra pip --find-links (URLs or dirs)")
    no_index: bool = Field(default=False, description="only find_links, no package index (mirrors, tests)")

    @field_validator("exclude")
    @classmethod
    def _normalized(cls, value: list[str]) -> list[str]:
        return [normalize_project(name) for name in value]


class Wheels(_Strict):
    requirements: list[str] = Field(default_factory=list, description="requirement lines")
    requirements_files: list[str] = Field(default_factory=list, description="relative to the profile")
    platforms: list[str] = Field(default_factory=list, description="not set: the tags come from target's glibc")
    local: list[str] = Field(default_factory=list, description="dirs of .whl added verbatim")
    sets: dict[str, WheelSet] = Field(default_factory=dict, description="locked virtualenv sets by name")

    @field_validator("platforms")
    @classmethod
    def _derived(cls, value: list[str]) -> list[str]:
        if value:
            raise ValueError("remove it: the manylinux tags are derived from the target's glibc (src/labctl/targets.py)")
        return value

    @field_validator("sets")
    @classmethod
    def _set_names(cls, value: dict[str, WheelSet]) -> dict[str, WheelSet]:
        for name in value:
            if not _NAME.match(name):
                raise ValueError(f"set name {name!r}: use lowercase letters, digits, '.', '_' and '-'")
        return value


TIKTOKEN_BASE_URL = "https://openaipublic.blob.core.windows.net/encodings/"
TiktokenEncoding = Literal["o200k_base", "cl100k_base"]


def _default_encodings() -> list[TiktokenEncoding]:
    return ["o200k_base", "cl100k_base"]


class Tiktoken(_Strict):
    """The tokenizer files openai-harmony loads for gpt-oss (checked against its hard-coded sha256)."""

    source: Literal["url", "path", "wheel"] = Field(description="where the .tiktoken files come from")
    url: str = Field(default=TIKTOKEN_BASE_URL, description="base URL (source: url); a mirror works too")
    path: str | None = Field(
        default=None,
        description="source: path: dir with o200k_base.tiktoken etc. or the sha1-named files; relative to the profile",
    )
    wheel: str | None = Field(
        default=None,
        description="source: wheel: a pip requirement (e.g. litellm==1.106.0) or a .whl file (relative to the profile)",
    )
    encodings: list[TiktokenEncoding] = Field(default_factory=_default_encodings, min_length=1)

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        if not re.match(r"^(https?|file)://", value):
            raise ValueError("must start with https://, http:// or file://")
        return value if value.endswith("/") else value + "/"

    @model_validator(mode="after")
    def _source_fields(self) -> Tiktoken:
        if len(set(self.encodings)) != len(self.encodings):
            raise ValueError("encodings must be unique")
        for option in ("path", "wheel"):
            given = getattr(self, option) is not None
            if self.source == option and not given:
                raise ValueError(f"source: {option} needs {option}: ...")
            if self.source != option and given:
                raise ValueError(f"{option} is only read with source: {option} (source is {self.source})")
        return self


_COMPONENT = re.compile(r"^[A-Za-z0-9._-]+$")


def _path_component(value: str) -> str:
    if not _COMPONENT.match(value) or value in (".", ".."):
        raise ValueError("must be a safe path component: letters, digits, '.', '_' and '-', not '.' or '..'")
    return value


class HuggingFaceSource(_Strict):
    repo_id: str = Field(description="e.g. openai/gpt-oss-120b")
    revision: str = Field(description="the commit sha on the hub (40 hex digits): a branch or tag can move")

    @field_validator("revision")
    @classmethod
    def _commit(cls, value: str) -> str:
        if not re.fullmatch(r"[0-9a-f]{40}", value):
            raise ValueError(
                f"{value!r} is not a commit: give the hub's 40-hex-digit commit sha (a branch or tag can move "
                "under the same name; huggingface_hub's model_info(repo).sha names the current one)"
            )
        return value


class Model(_Strict):
    """One model snapshot, bundled as models/<name>/<revision>/."""

    name: str = Field(description="directory name in the bundle (and on the targets)")
    revision: str = Field(description="the bundle's label for this snapshot, e.g. r1")
    path: str | None = Field(default=None, description="local snapshot dir; relative to the profile")
    huggingface: HuggingFaceSource | None = Field(default=None, description="download with huggingface_hub")
    exclude: list[str] = Field(
        default_factory=list, description="glob patterns of snapshot paths to leave out (e.g. 'original/*')"
    )
    create_with: str | None = Field(
        default=None, description="the command that creates `path`, shown when it is missing"
    )

    @field_validator("name", "revision")
    @classmethod
    def _safe(cls, value: str) -> str:
        return _path_component(value)

    @model_validator(mode="after")
    def _one_source(self) -> Model:
        if (self.path is None) == (self.huggingface is None):
            raise ValueError("give exactly one of path or huggingface")
        return self


# Prisma's Linux binary targets (prisma/prisma 5.17.0 packages/get-platform/src/binaryTargets.ts),
# the <platform> of binaries.prisma.sh/all_commits/<commit>/<platform>/<file>.gz.
PRISMA_PLATFORMS = (
    "debian-openssl-1.0.x", "debian-openssl-1.1.x", "debian-openssl-3.0.x",
    "rhel-openssl-1.0.x", "rhel-openssl-1.1.x", "rhel-openssl-3.0.x",
    "linux-arm64-openssl-1.0.x", "linux-arm64-openssl-1.1.x", "linux-arm64-openssl-3.0.x",
    "linux-arm-openssl-1.0.x", "linux-arm-openssl-1.1.x", "linux-arm-openssl-3.0.x",
    "linux-musl", "linux-musl-openssl-3.0.x", "linux-musl-arm64-openssl-1.1.x", "linux-musl-arm64-openssl-3.0.x",
    "linux-static-x64", "linux-static-arm64",
)
PRISMA_MIRROR = "https://binaries.prisma.sh"
# The Node.js Prisma 5.17's CLI runs on (prisma/prisma 5.17.0 package.json engines.node).
PRISMA_MIN_NODE = (16, 13)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:2])


def _default_prisma_platforms() -> list[str]:
    return ["debian-openssl-3.0.x"]


class Prisma(_Strict):
    """Prisma's CLI (npm) and native engines, for LiteLLM's database mode (prisma-client-py)."""

    cli_version: str = Field(description="the npm `prisma` CLI prisma-client-py pins (0.15.0: 5.17.0)")
    engine_commit: str = Field(description="the engines commit that CLI expects (40 hex digits)")
    platforms: list[str] = Field(
        default_factory=_default_prisma_platforms, min_length=1, description="Prisma binary targets of the targets"
    )
    mirror: str = Field(
        default=PRISMA_MIRROR,
        description="engines base URL (like PRISMA_ENGINES_MIRROR; http(s):// or file://) or a directory "
        "(relative to the profile) laid out as all_commits/<commit>/<platform>/<file>.gz",
    )
    optional: bool = Field(
        default=False, description="when the CLI or an engine cannot be fetched: record it as absent and build on"
    )

    @field_validator("cli_version")
    @classmethod
    def _cli_version(cls, value: str) -> str:
        if not re.fullmatch(r"\d+\.\d+\.\d+", value):
            raise ValueError("must be an exact npm version like '5.17.0'")
        return value

    @field_validator("engine_commit")
    @classmethod
    def _commit(cls, value: str) -> str:
        if not re.fullmatch(r"[0-9a-f]{40}", value):
            raise ValueError("must be the 40-hex-digit engines commit (prisma-client-py's PRISMA_EXPECTED_ENGINE_VERSION)")
        return value

    @field_validator("platforms")
    @classmethod
    def _platforms(cls, value: list[str]) -> list[str]:
        for platform in value:
            if platform not in PRISMA_PLATFORMS:
                raise ValueError(f"{platform!r} is not a Prisma binary target ({', '.join(PRISMA_PLATFORMS)})")
        if len(set(value)) != len(value):
            raise ValueError("platforms must be unique")
        return value

    @field_validator("mirror")
    @classmethod
    def _mirror(cls, value: str) -> str:
        if "://" in value and not re.match(r"^(https?|file)://", value):
            raise ValueError("a URL must start with https://, http:// or file://")
        return value.rstrip("/") or value


class Profile(_Strict):
    name: str | None = None
    description: str = ""
    target: Target
    apt: Apt = Field(default_factory=Apt)
    wheels: Wheels = Field(default_factory=Wheels)
    tiktoken: Tiktoken | None = Field(default=None, description="tokenizer files for gpt-oss (harmony)")
    models: list[Model] = Field(default_factory=list)
    prisma: Prisma | None = Field(default=None, description="Prisma CLI and engines (LiteLLM database mode)")
    locks: str | None = Field(
        default=None,
        description="directory of committed locks, relative to the profile, written by `labctl bundle lock`: "
        "<dir>/<os>/<set>.txt per wheel set (the build resolves nothing and fetches each wheel from its locked index "
        "only) and <dir>/<os>/prisma.json (the engines' sha256; the mirror's own .sha256 files are not read)",
    )

    @model_validator(mode="after")
    def _interpreter_bundled(self) -> Profile:
        """A Python other than the distribution's python3 comes from the bundle, with venv and headers."""
        known = os_release(self.target.os, self.target.release)
        if self.target.python != known.python:
            listed = set(self.apt.packages).union(*(group.packages for group in self.apt.groups.values()))
            needed = [f"python{self.target.python}{suffix}" for suffix in ("", "-venv", "-dev")]
            missing = [name for name in needed if name not in listed]
            if missing:
                raise ValueError(
                    f"target.python {self.target.python} is not {known.name}'s python3 ({known.python}): "
                    f"the bundle must carry {', '.join(missing)} (apt.packages or a group)"
                )
        return self

    @model_validator(mode="after")
    def _node_for_prisma(self) -> Profile:
        known = os_release(self.target.os, self.target.release)
        if self.prisma is not None and _version(known.nodejs) < PRISMA_MIN_NODE:
            raise ValueError(
                f"prisma: {known.name} ships Node.js {known.nodejs}; Prisma's CLI needs "
                f"{'.'.join(map(str, PRISMA_MIN_NODE))} or newer, so LiteLLM's database mode is not supported on "
                f"{known.name}: remove prisma: (the hosts run lab_litellm_database_mode: false)"
            )
        return self

    @field_validator("models")
    @classmethod
    def _unique_models(cls, value: list[Model]) -> list[Model]:
        seen = set()
        for model in value:
            key = (model.name, model.revision)
            if key in seen:
                raise ValueError(f"model {model.name} revision {model.revision} is listed twice")
            seen.add(key)
        return value

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str | None) -> str | None:
        if value is not None and not _NAME.match(value):
            raise ValueError("use lowercase letters, digits, '.', '_' and '-'")
        return value


class LoadedProfile(BaseModel):
    """A validated profile with where it came from."""

    model_config = ConfigDict(frozen=True)

    name: str
    path: Path
    spec: Profile
    os: str = Field(description="the OS it is for, e.g. debian-12")

    def resolve(self, relative: str) -> Path:
        """A path from the profile, relative to the profile's directory."""
        return (self.path.parent / Path(relative).expanduser()).resolve()


def find_profile(name_or_path: str) -> Path:
    candidate = Path(name_or_path).expanduser()
    if candidate.suffix in (".yml", ".yaml") or "/" in name_or_path:
        if candidate.is_file():
            return candidate.resolve()
        raise ProfileError(f"profile file {candidate} not found")
    for suffix in (".yml", ".yaml"):
        path = profiles_dir() / f"{name_or_path}{suffix}"
        if path.is_file():
            return path
    raise ProfileError(f"profile {name_or_path!r} not found (looked for {profiles_dir()}/{name_or_path}.yml)")


def _format_errors(path: Path, exc: ValidationError) -> str:
    parts = []
    for error in exc.errors():
        loc = ".".join(str(item) for item in error["loc"]) or "(top level)"
        if error["type"] == "extra_forbidden":
            parts.append(f"{loc}: unknown field")
        else:
            parts.append(f"{loc}: {error['msg']}")
    return f"profile {path}: " + "; ".join(parts)


def _named(items: Any) -> bool:
    return isinstance(items, list) and all(isinstance(item, dict) and "name" in item for item in items)


def _merged(base: Any, override: Any) -> Any:
    """override on top of base: mappings merged key by key (a null value removes the key), lists
    of named mappings (apt sources) merged by name, anything else replaced."""
    if isinstance(base, dict) and isinstance(override, dict):
        merged = dict(base)
        for key, value in override.items():
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = _merged(base.get(key), value) if key in base else value
        return merged
    if _named(base) and _named(override):
        by_name = {item["name"]: item for item in base}
        for item in override:
            by_name[item["name"]] = _merged(by_name.get(item["name"], {}), item)
        return list(by_name.values())
    return override


def _filled(value: Any, known: OsRelease) -> Any:
    """{codename} and {nvidia_repo} of the chosen OS in every string of a profile section."""
    if isinstance(value, str):
        return value.replace("{codename}", known.codename).replace("{nvidia_repo}", known.nvidia_repo)
    if isinstance(value, list):
        return [_filled(item, known) for item in value]
    if isinstance(value, dict):
        return {key: _filled(item, known) for key, item in value.items()}
    return value


def os_key(known: OsRelease) -> str:
    return f"{known.os}-{known.release}"


def _for_os(path: Path, raw: dict[str, Any], wanted: str | None) -> tuple[dict[str, Any], str | None]:
    """The profile for one OS: the `os:` entry of that OS merged over the rest (its target by
    default), placeholders filled. Returns the profile and the OS key (None: no `os:` section)."""
    variants = raw.pop("os", None)
    if variants is None:
        own = raw.get("target")
        own_key = f"{own.get('os')}-{own.get('release')}" if isinstance(own, dict) else None
        if wanted is not None and wanted != own_key:
            raise ProfileError(f"profile {path}: has no os: section, so --os {wanted} cannot be chosen")
        return raw, None
    if not isinstance(variants, dict) or not all(isinstance(v, dict) or v is None for v in variants.values()):
        raise ProfileError(f"profile {path}: os: must map an OS (e.g. debian-12) to the profile keys it changes")
    for key in variants:
        os_name, _, release = str(key).partition("-")
        try:
            os_release(os_name, release)
        except UnsupportedTarget as exc:
            raise ProfileError(f"profile {path}: os.{key}: {exc}") from None
    given = raw.get("target")
    target: dict[str, Any] = given if isinstance(given, dict) else {}
    default = f"{target.get('os')}-{target.get('release')}"
    chosen = wanted or default
    if chosen not in variants:
        os_name, _, release = chosen.partition("-")
        try:
            os_release(os_name, release)
        except UnsupportedTarget as exc:
            raise ProfileError(f"--os {chosen}: {exc}") from None
        raise ProfileError(
            f"profile {path} is not made for {chosen}: its os: section lists {', '.join(map(str, variants))}"
        )
    merged = _merged(raw, variants[chosen] or {})
    if isinstance(merged.get("target"), dict):
        target = merged["target"]
        if f"{target.get('os')}-{target.get('release')}" != chosen:
            raise ProfileError(f"profile {path}: os.{chosen}: its target must be {chosen} (give target.os and target.release)")
        known = os_release(target["os"], target["release"])
        merged = {key: (_filled(value, known) if key in ("apt", "description") else value) for key, value in merged.items()}
    return merged, chosen


def profile_oses(name_or_path: str) -> list[str]:
    """The OSes a profile is made for: the keys of its os: section, else its target's."""
    path = find_profile(name_or_path)
    try:
        raw: Any = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ProfileError(f"profile {path}: {exc}".replace("\n", " ")) from exc
    variants = raw.get("os") if isinstance(raw, dict) else None
    if isinstance(variants, dict) and variants:
        return [str(key) for key in variants]
    return [load_profile(name_or_path).os]


def load_profile(name_or_path: str, os: str | None = None) -> LoadedProfile:
    """A validated profile; with an `os:` section, for one of its OSes (default: its target's)."""
    path = find_profile(name_or_path)
    try:
        raw: Any = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ProfileError(f"profile {path}: {exc}".replace("\n", " ")) from exc
    if not isinstance(raw, dict):
        raise ProfileError(f"profile {path}: expected a mapping at the top level")
    raw, chosen = _for_os(path, raw, os)
    try:
        spec = Profile.model_validate(raw)
    except ValidationError as exc:
        raise ProfileError(_format_errors(path, exc)) from exc
    name = spec.name or path.stem
    if not _NAME.match(name):
        raise ProfileError(f"profile {path}: name: {name!r} is not a valid profile name")
    return LoadedProfile(name=name, path=path, spec=spec, os=chosen or os_key(os_release(spec.target.os, spec.target.release)))
