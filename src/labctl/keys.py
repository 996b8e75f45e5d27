"""Application keys for the gateway without a database: generated here, only their hashes leave.

The store is one JSON file in the inventory's secrets directory (``lab_app_keys_file``, 0600 in a
0700 directory, made 0700 again when found looser; add and revoke hold an flock on
``.app-keys.json.lock`` beside it across their load and save): per key its name, class (which
public model class it reaches, so its priority), limits, expiry, the sha256 of the key and when it
was created or revoked. The key itself is printed once by ``labctl keys add`` and kept nowhere.
The litellm role sends the hashes of the keys that are not revoked to the gateway hosts, where the
no-database auth hook enforces them.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import re
import secrets
import stat
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, time
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

CLASSES = ("interactive", "batch")
KEY_PREFIX = "sk-lab-"
NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
# A model a key may be limited to (lab_models: a model's name or served name, labctl.models.NAME).
MODEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
STORE_VERSION = 1


class KeyRefused(Exception):
    """A refused key operation; the message names the cause."""


@dataclass
class AppKey:
    name: str
    key_class: str
    sha256: str
    created: str
    rpm: int | None = None
    tpm: int | None = None
    # Requests in flight at once (the gateway's default when None: litellm_app_key_max_parallel_share).
    max_parallel: int | None = None
    expires: str | None = None
    revoked: str | None = None
    # Several models (lab_models): the models it may use (its class's names of those); None: every model.
    models: list[str] | None = None

    def status(self, now: datetime) -> str:
        if self.revoked:
            return "revoked"
        if self.expires and datetime.fromisoformat(self.expires) <= now:
            return "expired"
        return "active"

    def record(self) -> dict[str, Any]:
        data = asdict(self)
        data["class"] = data.pop("key_class")
        if data["models"] is None:
            del data["models"]
        return data

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> AppKey:
        fields = dict(data)
        fields["key_class"] = fields.pop("class")
        return cls(**fields)


def hash_key(key: str) -> str:
    """What the gateway compares: the sha256 of the key's text (LiteLLM hashes virtual keys alike)."""
    return hashlib.sha256(key.encode()).hexdigest()


def _live(keys: list[AppKey], name: str) -> list[AppKey]:
    """The records of ``name`` that are not revoked; refused, naming the live keys, when there is none."""
    live = [k for k in keys if k.name == name and not k.revoked]
    if not live:
        known = sorted({k.name for k in keys if not k.revoked})
        raise KeyRefused(f"no key named {name} that is not revoked" + (f" (keys: {', '.join(known)})" if known else ""))
    return live


def _check_models(models: list[str] | None) -> None:
    if models is not None and (not models or not all(MODEL.match(m) for m in models)):
        raise KeyRefused(f"--model {models}: model names (letters, digits, '.', '_', '-')")


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def parse_expiry(text: str, now: datetime) -> str:
    """YYYY-MM-DD (valid to the end of that day, UTC) or an ISO date-time with a zone; in the future."""
    try:
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
            when = datetime.combine(datetime.fromisoformat(text).date(), time(23, 59, 59), tzinfo=UTC)
        else:
            when = datetime.fromisoformat(text)
    except ValueError as exc:
        raise KeyRefused(f"--expires {text}: not a date (YYYY-MM-DD) or an ISO date-time") from exc
    if when.tzinfo is None:
        raise KeyRefused(f"--expires {text}: a date-time needs its time zone (e.g. {text}+00:00)")
    if when <= now:
        raise KeyRefused(f"--expires {text}: already past")
    return when.astimezone(UTC).isoformat()


_P = ParamSpec("_P")
_T = TypeVar("_T")


def _under_lock(method: Callable[Concatenate[KeyStore, _P], _T]) -> Callable[Concatenate[KeyStore, _P], _T]:
    """The whole method (its load, its save) under the store's lock."""
    @functools.wraps(method)
    def locked(self: KeyStore, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        with self.locked():
            return method(self, *args, **kwargs)
    return locked


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
            raise KeyRefused(f"{self.path}: not a labctl key store ({exc})") from exc

    def _private_dir(self) -> None:
        """The store's directory exists and is 0700, also when it existed looser (copied with cp -r)."""
        folder = self.path.parent
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            if stat.S_IMODE(folder.stat().st_mode) & 0o077:
                os.chmod(folder, 0o700)
        except OSError as exc:
            raise KeyRefused(f"{folder}: cannot make the secrets directory private (0700): {exc}") from exc

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Held across a load and its save, so two ``labctl keys add`` at once each keep their
        record: an flock on ``.<store>.lock`` beside the store (the kernel drops it whatever ends us)."""
        self._private_dir()
        fd = os.open(self.path.parent / f".{self.path.name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def save(self, keys: list[AppKey]) -> None:
        """Written whole to a temporary file beside it, then renamed: never half a store. Changes
        load and save under ``locked()`` (add and revoke do)."""
        self._private_dir()
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

    @_under_lock
    def add(self, name: str, key_class: str, *, rpm: int | None = None, tpm: int | None = None,
            max_parallel: int | None = None, expires: str | None = None, models: list[str] | None = None,
            now: datetime | None = None) -> tuple[AppKey, str]:
        """A new key: returns its record and the key (shown once, stored nowhere)."""
        now = now or datetime.now(UTC)
        if not NAME.match(name):
            raise KeyRefused(f"key name {name!r}: lowercase letters, digits, '.', '_' and '-' (1-63, a letter or digit first)")
        if key_class not in CLASSES:
            raise KeyRefused(f"--class {key_class}: no such key class (one of {', '.join(CLASSES)})")
        for label, value in (("--rpm", rpm), ("--tpm", tpm), ("--max-parallel", max_parallel)):
            if value is not None and value < 1:
                raise KeyRefused(f"{label} {value}: a limit is a positive number (leave it out for none)")
        _check_models(models)
        keys = self.load()
        if any(k.name == name and k.status(now) != "revoked" for k in keys):
            raise KeyRefused(f"key {name} exists (revoke it first, or pick another name)")
        key = new_key()
        record = AppKey(name=name, key_class=key_class, sha256=hash_key(key), created=now.isoformat(), rpm=rpm, tpm=tpm,
                        max_parallel=max_parallel, expires=parse_expiry(expires, now) if expires else None,
                        models=list(models) if models else None)
        self.save([*keys, record])
        return record, key

    @_under_lock
    def set_models(self, name: str, models: list[str] | None) -> AppKey:
        """The models a live key may use (None: every model of its class); the key itself stays."""
        _check_models(models)
        keys = self.load()
        live = _live(keys, name)
        for record in live:
            record.models = list(models) if models else None
        self.save(keys)
        return live[0]

    @_under_lock
    def revoke(self, name: str, now: datetime | None = None) -> AppKey:
        now = now or datetime.now(UTC)
        keys = self.load()
        live = _live(keys, name)
        for record in live:
            record.revoked = now.isoformat()
        self.save(keys)
        return live[0]
