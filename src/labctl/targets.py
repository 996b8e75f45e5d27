"""The operating systems a bundle can be built for: the README's list, with what each release
ships that a bundle depends on. One table, read by the profile validation (a profile for another
OS is refused by name) and the wheel resolution (the manylinux tags the target's glibc runs).

Sources: each distribution's package of the version given (packages.ubuntu.com,
packages.debian.org): python3 (the interpreter the venvs use) and the other python3.X of the
archive (jammy's universe has python3.11: vLLM 0.32 and later require Python >= 3.11, jammy's
python3 is 3.10), libc6 (glibc), openssl, nodejs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OsRelease:
    os: str  # /etc/os-release ID
    release: str  # VERSION_ID
    codename: str  # VERSION_CODENAME
    name: str  # as the README writes it
    python: str  # python3's X.Y
    pythons: tuple[str, ...]  # every python3.X the archive has (X.Y); the first is python3
    glibc: str  # libc6's upstream version
    nodejs: str  # the distribution's nodejs (Prisma 5.17's CLI needs >= 16.13)
    nvidia_repo: str  # the directory of NVIDIA's CUDA repository for it
    prisma_platform: str  # Prisma's binary target (its OpenSSL)


SUPPORTED: dict[tuple[str, str], OsRelease] = {
    ("ubuntu", "24.04"): OsRelease(
        "ubuntu", "24.04", "noble", "Ubuntu 24.04", "3.12", ("3.12",), "2.39", "18.19", "ubuntu2404", "debian-openssl-3.0.x"
    ),
    ("ubuntu", "22.04"): OsRelease(
        "ubuntu", "22.04", "jammy", "Ubuntu 22.04", "3.10", ("3.10", "3.11"), "2.35", "12.22", "ubuntu2204", "debian-openssl-3.0.x"
    ),
    ("debian", "12"): OsRelease(
        "debian", "12", "bookworm", "Debian 12", "3.11", ("3.11",), "2.36", "18.19", "debian12", "debian-openssl-3.0.x"
    ),
}

# The full version of each python3.X the release ships (its package's upstream version; jammy's
# python3.11 from jammy-updates). pip judges a requirement's python_full_version marker by the
# interpreter pip runs on, not by --python-version: the wheel locker re-checks them with these.
PYTHON_FULL: dict[tuple[str, str, str], str] = {
    ("ubuntu", "24.04", "3.12"): "3.12.3",
    ("ubuntu", "22.04", "3.10"): "3.10.12",
    ("ubuntu", "22.04", "3.11"): "3.11.0",
    ("debian", "12", "3.11"): "3.11.2",
}


def python_full_version(os: str, release: str, python: str) -> str:
    """The full version of the target's pythonX.Y (``python``), for environment markers."""
    try:
        return PYTHON_FULL[(os, release, python)]
    except KeyError:
        raise UnsupportedTarget(f"{os} {release} ships no python{python} (it has {', '.join(os_release(os, release).pythons)})") from None


# dpkg architecture -> the machine name in wheel platform tags
_MACHINE = {"amd64": "x86_64", "arm64": "aarch64"}
# The legacy manylinux names (PEP 513, 571, 599) and the glibc each stands for (PEP 600).
_LEGACY = {"manylinux2014": (2, 17), "manylinux2010": (2, 12), "manylinux1": (2, 5)}


class UnsupportedTarget(ValueError):
    """An OS (or release) the README does not list."""


def supported_names() -> str:
    return ", ".join(entry.name for entry in SUPPORTED.values())


def os_release(os: str, release: str) -> OsRelease:
    try:
        return SUPPORTED[(os, release)]
    except KeyError:
        raise UnsupportedTarget(
            f"{os} {release} is not a supported OS; bundles are built for {supported_names()} (README)"
        ) from None


def manylinux_tags(glibc: str, arch: str) -> list[str]:
    """Every manylinux platform tag a target with this glibc runs, newest first (PEP 600: a
    manylinux_2_N wheel runs on glibc >= 2.N), with the legacy names of the older ones. pip does
    not widen an explicit --platform list, so a wheel built for an older glibc (the CUDA 12.9
    libraries are manylinux_2_27 only) needs its tag listed."""
    try:
        machine = _MACHINE[arch]
    except KeyError:
        raise UnsupportedTarget(f"architecture {arch!r}: wheels are resolved for {', '.join(_MACHINE)}") from None
    major, minor = (int(part) for part in glibc.split(".")[:2])
    if major != 2 or minor < 5:
        raise UnsupportedTarget(f"glibc {glibc}: manylinux needs glibc 2.5 or newer")
    tags = [f"manylinux_2_{n}_{machine}" for n in range(minor, 4, -1)]
    legacy = [f"{name}_{machine}" for name, (_, at) in _LEGACY.items() if at <= minor]
    if machine != "x86_64":  # manylinux1/2010 were x86 only
        legacy = [tag for tag in legacy if tag.startswith("manylinux2014")]
    return tags + legacy
