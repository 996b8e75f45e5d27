"""Reachability probe for optional apt sources."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit


def release_url(uri: str, suite: str) -> str:
    """``<uri>/dists/<suite>/Release``, or ``<uri>/<suite>/Release`` for a flat repo (suite ends with '/')."""
    base = uri.rstrip("/")
    if suite.endswith("/"):
        path = suite.strip("/").removeprefix(".").strip("/")
        return f"{base}/{path}/Release" if path else f"{base}/Release"
    return f"{base}/dists/{suite}/Release"


def probe(url: str, timeout: float = 10.0) -> str | None:
    """None when ``url`` can be fetched, else a short reason."""
    parts = urlsplit(url)
    if parts.scheme == "file":
        return None if Path(parts.path).is_file() else f"{parts.path} not found"
    request = urllib.request.Request(url, headers={"User-Agent": "labctl-bundle-probe"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read(1)
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code} for {url}"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return f"{url} unreachable ({reason})"
    return None
