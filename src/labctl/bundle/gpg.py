"""The bundle signing key: generated once on the control node, reused afterwards.

Only public material ever leaves the key dir (``gpg --export``); nothing here
prints or exports secret keys.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
from pathlib import Path

from labctl.bundle.errors import BuildError
from labctl.paths import private_dir

KEY_UID = "labctl bundle signing key"
_SOCKET_MAX = 100  # sun_path is 108 bytes; gpg adds "S.gpg-agent.browser" and a NUL


class SigningKey:
    def __init__(self, home: Path, fingerprint: str, created: bool = False) -> None:
        self.home = home
        self.fingerprint = fingerprint
        self.created = created

    @classmethod
    def ensure(cls, key_dir: Path) -> SigningKey:
        """Load the key from ``key_dir`` (0700), generating it the first time."""
        home = private_dir(key_dir)
        run_dir = Path(f"/run/user/{os.getuid()}")
        if not run_dir.is_dir() and len(str(home / "S.gpg-agent.browser")) > _SOCKET_MAX:
            raise BuildError(f"key dir {home}: path too long for gpg-agent sockets, use a shorter --key-dir")
        with (home / ".labctl.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            fingerprint = _secret_fingerprint(home)
            created = fingerprint is None
            if created:
                _gpg(home, "--quick-generate-key", KEY_UID, "ed25519", "sign", "never")
                fingerprint = _secret_fingerprint(home)
            if fingerprint is None:
                raise BuildError(f"key dir {home}: gpg generated no signing key")
        return cls(home, fingerprint, created)

    def export_public(self, binary: Path, armored: Path) -> None:
        binary.write_bytes(_gpg(self.home, "--export", self.fingerprint))
        armored.write_bytes(_gpg(self.home, "--armor", "--export", self.fingerprint))
        if not binary.stat().st_size:
            raise BuildError(f"key dir {self.home}: exporting {self.fingerprint} gave nothing")

    def detach_sign(self, src: Path, dst: Path, armor: bool = False) -> None:
        args = ["--local-user", self.fingerprint, "--detach-sign", "--output", str(dst)]
        _gpg(self.home, *(["--armor"] if armor else []), *args, str(src))

    def clearsign(self, src: Path, dst: Path) -> None:
        _gpg(self.home, "--local-user", self.fingerprint, "--clearsign", "--output", str(dst), str(src))

    def close(self) -> None:
        """Stop the gpg-agent this key dir started (no-op when none runs)."""
        subprocess.run(
            ["gpgconf", "--homedir", str(self.home), "--kill", "gpg-agent"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )


def _gpg(home: Path, *args: str) -> bytes:
    cmd = [
        "gpg",
        "--batch",
        "--no-tty",
        "--yes",
        "--homedir",
        str(home),
        "--pinentry-mode",
        "loopback",
        "--passphrase",
        "",
        *args,
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, check=False)
    except OSError as exc:
        raise BuildError(f"cannot run gpg: {exc.strerror} (install gnupg)") from exc
    if proc.returncode != 0:
        lines = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        reason = lines[-1] if lines else f"exit {proc.returncode}"
        raise BuildError(f"gpg {args[0]} in key dir {home} failed: {reason}")
    return proc.stdout


def _secret_fingerprint(home: Path) -> str | None:
    out = _gpg(home, "--with-colons", "--list-secret-keys").decode("utf-8", "replace")
    in_key = False
    for line in out.splitlines():
        fields = line.split(":")
        if fields[0] == "sec":
            in_key = True
        elif fields[0] == "fpr" and in_key:
            return fields[9].upper()
        elif fields[0] == "ssb":
            in_key = False
    return None
