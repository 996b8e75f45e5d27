"""``labctl bundle build|verify``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from labctl.bundle.apt_stage import BaseSpec
from labctl.bundle.builder import BuildOptions, build_bundle
from labctl.bundle.errors import BuildError
from labctl.bundle.locks import write_lock
from labctl.bundle.prisma_stage import NO_SECTION, write_prisma_lock
from labctl.bundle.wheel_stage import resolve_sets, set_args
from labctl.module_utils import verifycore
from labctl.module_utils.progress import human_bytes
from labctl.paths import CACHE_DIR_ENV, KEY_DIR_ENV, default_cache_dir, default_key_dir
from labctl.profile import ProfileError, load_profile, profile_oses
from labctl.progress import make_reporter

app = typer.Typer(help="Build and verify the signed offline bundle.", no_args_is_help=True)


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(1)


def _print_json(data: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")


@app.command()
def build(
    profile: Annotated[str, typer.Option(help="Profile name (profiles/NAME.yml) or path to a .yml file.")],
    out: Annotated[Path, typer.Option(help="Bundle directory to create or replace.")],
    base_image: Annotated[
        str | None, typer.Option(help="Docker image of the pristine target (its dpkg status is read).")
    ] = None,
    base_status: Annotated[
        Path | None, typer.Option(help="dpkg status file copied from a fresh target host.")
    ] = None,
    key_dir: Annotated[
        Path | None,
        typer.Option(envvar=KEY_DIR_ENV, help="GnuPG home of the signing key.", show_default="~/.local/share/labctl/bundle-key"),
    ] = None,
    cache_dir: Annotated[
        Path | None,
        typer.Option(envvar=CACHE_DIR_ENV, help="Download cache.", show_default="~/.cache/labctl/bundle"),
    ] = None,
    updates_from: Annotated[
        list[Path] | None,
        typer.Option(
            "--updates-from",
            help="dpkg status (/var/lib/dpkg/status) copied from an installed lab host: the distribution's security "
            "updates for what it has installed are added (repeatable, one per host).",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON summary on stdout.")] = False,
    target_os: Annotated[
        str | None,
        typer.Option("--os", help="The OS to build for, from the profile's os: section (e.g. debian-12); default: its target."),
    ] = None,
) -> None:
    """Build the bundle for PROFILE into OUT (atomically replaced)."""
    if base_image is not None and base_status is not None:
        _fail("give either --base-image or --base-status, not both")
    try:
        loaded = load_profile(profile, target_os)
        options = BuildOptions(
            profile=loaded,
            out=out,
            key_dir=key_dir or default_key_dir(),
            cache_dir=cache_dir or default_cache_dir(),
            base=BaseSpec(image=base_image, status_file=base_status, updates_from=tuple(updates_from or ())),
        )
        result = build_bundle(options, make_reporter())
    except (BuildError, ProfileError) as exc:
        _fail(str(exc))
    except OSError as exc:
        _fail(f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": "))
    summary = result.summary()
    if as_json:
        _print_json(summary)
        return
    counts, sizes = summary["counts"], summary["sizes"]
    typer.echo(f"bundle {summary['profile']}: {summary['path']}")
    typer.echo(f"  apt packages: {counts['apt_packages']} ({human_bytes(sizes['apt'])})")
    typer.echo(f"  wheels: {counts['wheels']} ({human_bytes(sizes['wheels'])})")
    if counts["tiktoken"]:
        typer.echo(f"  tiktoken: {counts['tiktoken']} files ({human_bytes(sizes['tiktoken'])})")
    for model in summary["models"]:
        typer.echo(f"  model: {model['name']} {model['revision']}: {model['files']} files ({human_bytes(model['bytes'])})")
    prisma = summary["prisma"]
    if prisma["available"]:
        typer.echo(f"  prisma: CLI and engines, {prisma['files']} files ({human_bytes(sizes['prisma'])})")
    elif prisma["reason"] != NO_SECTION:
        typer.echo(f"  prisma: absent ({prisma['reason']})")
    for host in summary["updates"]:
        typer.echo(f"  security updates for {host['status']}: {host['security']} ({host['packages']} packages)")
    typer.echo(f"  files: {counts['files']} ({human_bytes(sizes['total'])})")
    for skipped in summary["skipped"]:
        typer.echo(f"  skipped: apt source {skipped['source']} ({skipped['reason']})")
    typer.echo(f"  signing key: {summary['fingerprint']}")
    typer.echo(f"  content_digest: {summary['content_digest']}")
    typer.echo(f"  took {summary['duration_s']:.1f}s")


@app.command()
def resolve(
    profile: Annotated[str, typer.Option(help="Profile name (profiles/NAME.yml) or path to a .yml file.")],
    target_os: Annotated[
        str | None,
        typer.Option("--os", help="The OS to resolve for, from the profile's os: section; default: its target."),
    ] = None,
    cache_dir: Annotated[
        Path | None,
        typer.Option(envvar=CACHE_DIR_ENV, help="Download cache.", show_default="~/.cache/labctl/bundle"),
    ] = None,
) -> None:
    """Resolve-only: print (JSON) what each wheel set of PROFILE would lock for the OS, from the
    indexes' metadata; nothing is downloaded or built."""
    try:
        loaded = load_profile(profile, target_os)
        sets = resolve_sets(loaded, cache_dir or default_cache_dir())
    except (BuildError, ProfileError) as exc:
        _fail(str(exc))
    target = loaded.spec.target
    _print_json({"profile": loaded.name, "os": loaded.os, "python": target.python, "platforms": target.platforms,
                 "sets": sets})


@app.command()
def lock(
    profile: Annotated[str, typer.Option(help="Profile name (profiles/NAME.yml) or path to a .yml file.")],
    target_os: Annotated[
        list[str] | None,
        typer.Option("--os", help="An OS of the profile's os: section (repeatable); default: every one it lists."),
    ] = None,
    only: Annotated[list[str] | None, typer.Option("--set", help="Only this wheel set (repeatable).")] = None,
    cache_dir: Annotated[
        Path | None,
        typer.Option(envvar=CACHE_DIR_ENV, help="Download cache.", show_default="~/.cache/labctl/bundle"),
    ] = None,
) -> None:
    """Resolve PROFILE's wheel sets per OS and write its locks (<locks>/<os>/<set>.txt, and
    <locks>/<os>/prisma.json with the engines' hashes as the mirror publishes them today):
    review the diff and commit them; the build then uses only them."""
    try:
        oses = list(target_os or profile_oses(profile))
        for os_key in oses:
            loaded = load_profile(profile, os_key)
            sets = loaded.spec.wheels.sets
            unknown = [name for name in only or [] if name not in sets]
            if unknown:
                raise BuildError(f"--set {unknown[0]}: profile {loaded.name} has no such wheel set ({', '.join(sets)})")
            for name, spec in sets.items():
                if only and name not in only:
                    continue
                path, pins = write_lock(loaded, cache_dir or default_cache_dir(), name, spec, set_args(loaded, spec))
                indexes = sorted({pin.index for pin in pins})
                typer.echo(f"{os_key} {name}: {len(pins)} wheels from {', '.join(indexes)} -> {path}")
            if loaded.spec.prisma is not None and not only:
                try:
                    path, count = write_prisma_lock(loaded)
                except BuildError as exc:
                    if not loaded.spec.prisma.optional:
                        raise
                    typer.echo(f"{os_key} prisma: {exc} (prisma.optional: true; no engine lock written, "
                               "the build leaves Prisma out)", err=True)
                else:
                    typer.echo(f"{os_key} prisma: {count} engine files of {loaded.spec.prisma.engine_commit[:12]} -> {path}")
    except (BuildError, ProfileError) as exc:
        _fail(str(exc))


@app.command()
def verify(
    directory: Annotated[Path, typer.Argument(metavar="DIR", help="Bundle directory.")],
    fingerprint: Annotated[
        str | None, typer.Option(help="Expected signing key fingerprint (spaces and case ignored).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON report on stdout.")] = False,
) -> None:
    """Check the signature, the fingerprint and every file of a bundle. Without --fingerprint the
    signer is not checked (any self-consistent bundle passes), and the output says so."""
    manifest_files = _listed_count(directory)
    reporter = make_reporter()
    with reporter.task(f"verify {directory}", manifest_files, unit="files") as advance:
        report = verifycore.verify_bundle(
            str(directory), trusted_fingerprint=fingerprint, on_file=lambda _path, _size: advance(1)
        )
    if as_json:
        _print_json(report.as_dict() | {"signer_checked": fingerprint is not None})
    else:
        for problem in report.problems:
            typer.echo(problem.message())
        if report.ok:
            # Without --fingerprint any self-consistent bundle passes, whoever signed it: say so.
            signer = (f"signed by {report.fingerprint}, the expected key" if fingerprint else
                      f"signed by {report.fingerprint}; the signer was NOT checked: pass --fingerprint with your key's")
            typer.echo(f"ok: {directory} ({report.files_checked} files, {human_bytes(report.bytes_checked)}, {signer})")
            if not fingerprint:
                typer.echo("warning: the signer was not checked (no --fingerprint): this only proves the bundle is "
                           "self-consistent", err=True)
        else:
            typer.echo(f"FAILED: {directory}: {len(report.problems)} problem(s)", err=True)
    if not report.ok:
        raise typer.Exit(1)


def _listed_count(directory: Path) -> int | None:
    try:
        manifest = json.loads((directory / verifycore.MANIFEST).read_text(encoding="utf-8"))
        return len(manifest["files"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
