"""The dpkg status of the pristine target, from a docker image or a copied file."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from labctl.bundle.errors import BuildError


def base_status(dest: Path, image: str | None, status_file: Path | None) -> str:
    """Write the base dpkg status to ``dest``; returns a description of where it came from."""
    if status_file is not None:
        if not status_file.is_file():
            raise BuildError(f"--base-status {status_file}: no such file")
        shutil.copyfile(status_file, dest)
        source = f"file:{status_file}"
    elif image is not None:
        cmd = ["docker", "run", "--rm", "--network", "none", image, "cat", "/var/lib/dpkg/status"]
        try:
            proc = subprocess.run(cmd, capture_output=True, check=False)
        except OSError as exc:
            raise BuildError(f"--base-image {image}: cannot run docker: {exc.strerror}") from exc
        if proc.returncode != 0:
            lines = proc.stderr.decode("utf-8", "replace").strip().splitlines()
            raise BuildError(f"--base-image {image}: {lines[-1] if lines else 'docker run failed'}")
        dest.write_bytes(proc.stdout)
        source = f"image:{image}"
    else:
        raise AssertionError("base_status needs an image or a file")
    if b"Package:" not in dest.read_bytes()[:65536]:
        raise BuildError(f"{source}: not a dpkg status file (no 'Package:' stanza)")
    return source
