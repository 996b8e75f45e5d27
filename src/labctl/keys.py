"""Application keys for the gateway without a database: generated here, only their hashes leave.

The store is one JSON file in the inventory's secrets directory (``lab_app_keys_file``, 0600 in a
0700 directory): per key its name, class (which public model class it reaches, so its priority),
limits, expiry, the sha256 of the key and when it was created or revoked. The key itself is
printed once by ``labctl keys add`` and kept nowhere. The litellm role sends the hashes of the
keys that are not revoked to the gateway hosts, where the no-database auth hook enforces them.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import tempfile
from dataclasses import asdict, dataclass
from datetime import datetime, time, timezone
from pathlib import Path
from typing import Any

CLASSES = ("interactive", "batch")
KEY_PREFIX = "sk-lab-"
NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
STORE_VERSION = 1


class KeyError_(Exception):
    """A refused key operation; the message names the cause."""


@dataclass
class AppKey:
    name: str
    key_class: str
    sha256: str
    created: str
    rpm: int | None = None
    tpm: int | None = None
    expires: str | None = None
    revoked: str | None = None

    def status(self, now: datetime) -> str:
        if self.revoked:
            return "revoked"
        if self.expires and datetime.fromisoformat(self.expires) <= now:
            return "expired"
        return "active"

    def record(self) -> dict[str, Any]:
        data = asdict(self)
        data["class"] = data.pop("key_class")
        return data

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> AppKey:
        fields = dict(data)
        fields["key_class"] = fields.pop("class")
        return cls(**fields)


def hash_key(key: str) -> str:
    """What the gateway compares: the sha256 of the key's text (LiteLLM hashes virtual keys alike)."""
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def parse_expiry(text: str, now: datetime) -> str:
    """YYYY-MM-DD (valid to the end of that day, UTC) or an ISO date-time with a zone; in the future."""
    try:
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
            when = datetime.combine(datetime.fromisoformat(text).date(), time(23, 59, 59), tzinfo=timezone.utc)
        else:
            when = datetime.fromisoformat(text)
    except ValueError as exc:
        raise KeyError_(f"--expires {text}: not a date (YYYY-MM-DD) or an ISO date-time") from exc
    if when.tzinfo is None:
        raise KeyError_(f"--expires {text}: a date-time needs its time zone (e.g. {text}+00:00)")
    if when <= now:
        raise KeyError_(f"--expires {text}: already past")
    return when.astimezone(timezone.utc).isoformat()


class KeyStore:
    """The control node's record of application keys (``path``: lab_app_keys_file)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> list[AppKey]:
        if not self.path.exists():
            return []
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            return [AppKey.from_record(item) for item in data["keys"]]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise KeyError_(f"{self.path}: not a labctl key store ({exc})") from exc

    def save(self, keys: list[AppKey]) -> None:
        """Written whole to a temporary file beside it, then renamed: never half a store."""
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        text = json.dumps({"version": STORE_VERSION, "keys": [k.record() for k in keys]}, indent=1) + "\n"
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".app-keys-")
        try:
            os.fchmod(fd, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def add(self, name: str, key_class: str, *, rpm: int | None = None, tpm: int | None = None,
            expires: str | None = None, now: datetime | None = None) -> tuple[AppKey, str]:
        """A new key: returns its record and the key (shown once, stored nowhere)."""
        now = now or datetime.now(timezone.utc)
        if not NAME.match(name):
            raise KeyError_(f"key name {name!r}: lowercase letters, digits, '.', '_' and '-' (1-63, a letter or digit first)")
        if key_class not in CLASSES:
            raise KeyError_(f"--class {key_class}: no such key class (one of {', '.join(CLASSES)})")
        for label, value in (("--rpm", rpm), ("--tpm", tpm)):
            if value is not None and value < 1:
                raise KeyError_(f"{label} {value}: a limit is a positive number (leave it out for none)")
        keys = self.load()
        if any(k.name == name and k.status(now) != "revoked" for k in keys):
            raise KeyError_(f"key {name} exists (revoke it first, or pick another name)")
        key = new_key()
        record = AppKey(name=name, key_class=key_class, sha256=hash_key(key), created=now.isoformat(), rpm=rpm, tpm=tpm,
                        expires=parse_expiry(expires, now) if expires else None)
        self.save([*keys, record])
        return record, key

    def revoke(self, name: str, now: datetime | None = None) -> AppKey:
        now = now or datetime.now(timezone.utc)
        keys = self.load()
        live = [k for k in keys if k.name == name and not k.revoked]
        if not live:
            known = sorted({k.name for k in keys if not k.revoked})
            raise KeyError_(f"no key named {name} that is not revoked" + (f" (keys: {', '.join(known)})" if known else ""))
        for record in live:
            record.revoked = now.isoformat()
        self.save(keys)
        return live[0]
