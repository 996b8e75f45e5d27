"""``labctl bundle build``: stage every component, sign, then replace the output dir."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from labctl import __version__
from labctl.bundle.apt_stage import BaseSpec, check_base, collect_apt
from labctl.bundle.aptrepo import write_repo
from labctl.bundle.errors import BuildError
from labctl.bundle.gpg import SigningKey
from labctl.bundle.models_stage import collect_models
from labctl.bundle.prisma_stage import collect_prisma
from labctl.bundle.staging import Staging
from labctl.bundle.tiktoken_stage import collect_tiktoken
from labctl.bundle.wheel_stage import collect_wheels
from labctl.module_utils import verifycore
from labctl.paths import private_dir
from labctl.profile import LoadedProfile
from labctl.progress import Reporter


@dataclass(frozen=True)
class BuildOptions:
    profile: LoadedProfile
    out: Path
    key_dir: Path
    cache_dir: Path
    base: BaseSpec


@dataclass(frozen=True)
class BuildResult:
    path: Path
    manifest: dict[str, Any]
    duration_s: float

    def summary(self) -> dict[str, Any]:
        components = self.manifest["components"]
        packages = components["apt"]["packages"]
        wheels = components["wheels"]["files"]
        tiktoken = components.get("tiktoken", {}).get("files", [])
        models = components.get("models", [])
        prisma = components.get("prisma") or {}
        prisma_files = prisma.get("files", [])
        files = self.manifest["files"]
        return {
            "path": str(self.path),
            "profile": self.manifest["profile"],
            "content_digest": self.manifest["content_digest"],
            "fingerprint": self.manifest["signing_key"]["fingerprint"],
            "counts": {
                "apt_packages": len(packages),
                "apt_local": sum(1 for p in packages if p.get("origin") == "local"),
                "wheels": len(wheels),
                "tiktoken": len(tiktoken),
                "models": len(models),
                "files": len(files),
            },
            "sizes": {
                "apt": sum(p["size"] for p in packages),
                "wheels": sum(w["size"] for w in wheels),
                "tiktoken": sum(t["size"] for t in tiktoken),
                "models": sum(m["bytes"] for m in models),
                "prisma": sum(f["size"] for f in prisma_files),
                "total": sum(f["size"] for f in files),
            },
            "skipped": components["apt"]["skipped"],
            "updates": [
                {
                    "status": host["status"],
                    "security": sum(1 for p in host["packages"] if p["reason"] == "security"),
                    "packages": len(host["packages"]),
                }
                for host in components["apt"].get("updates", [])
            ],
            "models": [
                {"name": m["name"], "revision": m["revision"], "files": m["files"], "bytes": m["bytes"]} for m in models
            ],
            # absent from bundles built before the prisma component existed
            "prisma": {
                "available": bool(prisma.get("available")),
                "reason": prisma.get("reason", "the bundle has no prisma component"),
                "files": len(prisma_files),
            },
            "duration_s": round(self.duration_s, 3),
        }


def source_date_epoch(mtimes: list[float]) -> int:
    """``SOURCE_DATE_EPOCH`` when set, else the newest input mtime (0 without inputs)."""
    env = os.environ.get("SOURCE_DATE_EPOCH")
    if env:
        try:
            return int(env)
        except ValueError as exc:
            raise BuildError(f"SOURCE_DATE_EPOCH={env!r} is not an integer") from exc
    return int(max(mtimes, default=0))


def _manifest(options: BuildOptions, key: SigningKey, components: dict[str, Any], files: list[Any]) -> dict[str, Any]:
    target = options.profile.spec.target
    return {
        "format_version": verifycore.FORMAT_VERSION,
        "profile": options.profile.name,
        "created_at": datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z"),
        "builder": {"name": "labctl", "version": __version__},
        "target": {
            "os": target.os,
            "release": target.release,
            "codename": target.codename,
            "arch": target.arch,
            "python": target.python,
            "python_abi": target.abi,
        },
        "signing_key": {"fingerprint": key.fingerprint},
        "components": components,
        "files": files,
        "content_digest": verifycore.content_digest(files),
    }


def build_bundle(options: BuildOptions, reporter: Reporter) -> BuildResult:
    started = time.monotonic()
    check_base(options.profile, options.base)
    cache = private_dir(options.cache_dir)
    key = SigningKey.ensure(options.key_dir)
    if key.created:
        reporter.info(f"generated the bundle signing key {key.fingerprint} in {key.home} (back it up)")
    try:
        staging = Staging.start(options.out, reporter)
        try:
            manifest = _stage(options, key, cache, staging)
            staging.commit()
        except BaseException:
            staging.abort()
            raise
    finally:
        key.close()
    return BuildResult(path=staging.out, manifest=manifest, duration_s=time.monotonic() - started)


def _stage(options: BuildOptions, key: SigningKey, cache: Path, staging: Staging) -> dict[str, Any]:
    profile = options.profile
    reporter = staging.reporter
    reporter.info(f"bundle {profile.name}: staging in {staging.root}")
    apt = collect_apt(profile, cache, options.base, staging)
    wheels = collect_wheels(profile, cache, staging)
    tiktoken = collect_tiktoken(profile, cache, staging)
    models = collect_models(profile, cache, staging)
    prisma = collect_prisma(profile, cache, staging)
    root = staging.root
    write_repo(
        root / "apt",
        apt.debs,
        profile.name,
        profile.spec.target.arch,
        source_date_epoch(staging.input_mtimes),
        key,
    )
    key.export_public(root / verifycore.KEYRING, root / "keys" / "bundle.asc")
    with reporter.task("hash bundle files", None, unit="files") as advance:
        files = staging.file_entries()
        advance(len(files))
    components = {
        "apt": apt.component(),
        "wheels": wheels.component(),
        "tiktoken": tiktoken.component(),
        "models": models.component(),
        # always present: {"available": false, "reason": "profile has no prisma section"} without one
        "prisma": prisma.component(),
    }
    manifest = _manifest(options, key, components, files)
    manifest_path = root / verifycore.MANIFEST
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    key.detach_sign(manifest_path, root / verifycore.SIGNATURE)
    signer, reason = verifycore.check_signature(str(root))
    if signer != key.fingerprint:
        raise BuildError(f"{verifycore.SIGNATURE}: self-check failed: {reason or f'signed by {signer}'}")
    return manifest
