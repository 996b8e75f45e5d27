"""Application keys for the gateway without a database: generated here, only their hashes leave.

The store is one JSON file in the inventory's secrets directory (``lab_app_keys_file``, 0600 in a
0700 directory, made 0700 again when found looser; add and revoke hold an flock on
``.app-keys.json.lock`` beside it across their load and save): per key its name, class (which
public model class it reaches, so its priority), limits, expiry, the sha256 of the key and when it
was created or revoked. The key itself is printed once by ``labctl keys add`` and kept nowhere.
The litellm role sends the hashes of the keys that are not revoked to the gateway hosts, where the
no-database auth hook enforces them. The models a key may be limited to are checked against the
lab's models here, before the store changes, with the rule the role applies when it sends them
(``key_models``); the role leaves a record that breaks it out, and names it, instead of failing the
whole push.
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
from collections.abc import Callable, Iterator, Mapping, Sequence
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


def public_names(lab_models: Sequence[Mapping[str, Any]] | None) -> list[dict[str, str]]:
    """The gateway's public model names of ``lab_models`` (parsed: labctl.models.parse, or the
    topology's models), as litellm_model_classes gives them: per model and served name, its
    interactive name and, when the model has the batch class, <name>-batch, each with the key class
    it serves and its model. None (one model, lab_models not set): []."""
    names: list[dict[str, str]] = []
    for model in lab_models or []:
        for served in model["served_names"]:
            if "interactive" in model["classes"]:
                names.append({"name": str(served), "key_class": "interactive", "model": str(model["name"])})
            if "batch" in model["classes"]:
                names.append({"name": f"{served}-batch", "key_class": "batch", "model": str(model["name"])})
    return names


def key_models(models: Any, key_class: Any, classes: Sequence[Mapping[str, Any]]) -> tuple[list[str], str]:
    """The public names a key of ``key_class`` limited to ``models`` reaches, and what is wrong with
    that limit ('' when nothing). ``classes``: the gateway's public names (litellm_model_classes, or
    public_names()): name, key_class and, with several models, the model that serves it. A model is
    given by its name or one of its public names; the key reaches its class's names of those
    models. Wrong: not a list of names, any model on a one-model lab (its class is all a key may be
    limited to), a model the lab does not serve (naming those it serves), a model whose names its
    class has none of. The one rule for `labctl keys add/models` and the litellm role."""
    if not isinstance(models, list) or not models or not all(isinstance(m, str) and m for m in models):
        return [], f"models must be a list of model names, got {models!r}"
    model_of = {str(c["name"]): str(c["model"]) for c in classes if c.get("model")}
    if not model_of:
        return [], (f"models {models}: the lab serves one model (lab_models is not set), a key's class is all it may be "
                    "limited to (no --model)")
    unknown = [m for m in models if m not in model_of and m not in model_of.values()]
    if unknown:
        return [], (f"models: {', '.join(unknown)} not served here (lab_models serves: {', '.join(sorted(set(model_of.values())))}; "
                    f"by their public names: {', '.join(sorted(model_of))})")
    allowed = {model_of.get(m, m) for m in models}
    names = [str(c["name"]) for c in classes if c.get("key_class") == key_class]
    reached = [n for n in names if model_of.get(n) in allowed]
    if not reached:
        return [], f"class {key_class} has no name of {', '.join(models)} (its names: {', '.join(names) or 'none'})"
    return reached, ""


def _check_models(name: str, key_class: str, models: list[str] | None, lab_models: Sequence[Mapping[str, Any]] | None) -> None:
    """``models`` (--model; None: every model of its class) checked against the lab's models
    (``lab_models`` parsed; None: a one-model lab), as the litellm role checks them when the keys are
    sent (key_models): refused here, before the store changes, so the store holds no key the
    gateway would leave out."""
    if models is None:
        return
    if not models or not all(MODEL.match(m) for m in models):
        raise KeyRefused(f"--model {models}: model names (letters, digits, '.', '_', '-')")
    _, problem = key_models(list(models), key_class, public_names(lab_models))
    if problem:
        raise KeyRefused(f"key {name}: {problem}")


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
            lab_models: Sequence[Mapping[str, Any]] | None = None, now: datetime | None = None) -> tuple[AppKey, str]:
        """A new key: returns its record and the key (shown once, stored nowhere). ``models`` must be
        models of ``lab_models`` (the inventory's, parsed; None: a one-model lab, which takes none)."""
        now = now or datetime.now(UTC)
        if not NAME.match(name):
            raise KeyRefused(f"key name {name!r}: lowercase letters, digits, '.', '_' and '-' (1-63, a letter or digit first)")
        if key_class not in CLASSES:
            raise KeyRefused(f"--class {key_class}: no such key class (one of {', '.join(CLASSES)})")
        for label, value in (("--rpm", rpm), ("--tpm", tpm), ("--max-parallel", max_parallel)):
            if value is not None and value < 1:
                raise KeyRefused(f"{label} {value}: a limit is a positive number (leave it out for none)")
        served = {n["key_class"] for n in public_names(lab_models)}
        if lab_models is not None and key_class not in served:
            raise KeyRefused(f"--class {key_class}: no model of lab_models has this class (their classes: {', '.join(sorted(served))})")
        _check_models(name, key_class, models, lab_models)
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
    def set_models(self, name: str, models: list[str] | None, lab_models: Sequence[Mapping[str, Any]] | None = None) -> AppKey:
        """The models a live key may use (None: every model of its class), models of ``lab_models``
        as for add; the key itself stays."""
        keys = self.load()
        live = _live(keys, name)
        for record in live:
            _check_models(name, record.key_class, models, lab_models)
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
