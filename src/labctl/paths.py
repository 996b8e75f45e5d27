"""Well-known locations: the repository root, the profiles and the per-user dirs."""

from __future__ import annotations

import os
from pathlib import Path

KEY_DIR_ENV = "LABCTL_BUNDLE_KEY_DIR"
CACHE_DIR_ENV = "LABCTL_CACHE_DIR"


def repo_root() -> Path:
    """The checkout this package runs from: the parent of ``src/``."""
    return Path(__file__).resolve().parent.parent.parent


def profiles_dir() -> Path:
    return repo_root() / "profiles"


def default_key_dir() -> Path:
    return Path(os.environ.get(KEY_DIR_ENV) or "~/.local/share/labctl/bundle-key").expanduser()


def default_cache_dir() -> Path:
    return Path(os.environ.get(CACHE_DIR_ENV) or "~/.cache/labctl/bundle").expanduser()


def private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) and make it 0700; returns the absolute path."""
    path = path.expanduser().absolute()
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o700)
    return path
